"""LoRA without launching: the modules it adapts per architecture against transformers and PEFT, the adapter config
the ranks build, the checks before launch, and the activations the plan counts against autograd."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from helpers import RECIPES, REPO, TINY, cache_model, saved_by_one_layer, write
from rlhf_cli.generation.choice import Gather, Generation
from rlhf_cli.models.architectures import architecture, peft_targets, targeted
from rlhf_cli.plan import memory
from rlhf_cli.plan.model_sizes import LoraSettings, adapter_size, model_size

WHOLE, SHARDS = Generation(Gather.whole), Generation(Gather.shards)

pytestmark = pytest.mark.usefixtures("nothing_launches")  # no test here starts ranks

CONFIGS = {
    "llama": {**TINY, "model_type": "llama", "num_key_value_heads": 2},
    "qwen2": {**TINY, "model_type": "qwen2", "num_key_value_heads": 2},
    "qwen3": {**TINY, "model_type": "qwen3", "num_key_value_heads": 2, "head_dim": 24},
    "gpt_neox": {**TINY, "model_type": "gpt_neox"},
    "gpt2": {"model_type": "gpt2", "vocab_size": 320, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 96},
}
# Every form `lora_target_modules` takes: unset (PEFT's default), all-linear, a pattern over whole paths, names.
TARGETS = {"default": None, "all-linear": ["all-linear"], "pattern": [r".*\.1\..*(q_proj|query_key_value|c_attn)"],
           "names": ["q_proj", "down_proj", "dense_4h_to_h", "c_fc", "lm_head", "embed_tokens", "wte"]}
SMOKE = str(RECIPES / "smoke" / "policy")


def hf_model(config: dict, classifier: bool = False, meta: bool = True):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

    hf_config = AutoConfig.for_model(**config, num_labels=1)
    auto = AutoModelForSequenceClassification if classifier else AutoModelForCausalLM
    if not meta:
        return auto.from_config(hf_config)
    with torch.device("meta"):
        return auto.from_config(hf_config)


def peft_model(config: dict, targets: list[str] | None, classifier: bool = False, **lora):
    from peft import LoraConfig, get_peft_model

    return get_peft_model(hf_model(config, classifier, meta=False), LoraConfig(
        r=4, target_modules=peft_targets(targets), task_type="SEQ_CLS" if classifier else "CAUSAL_LM", **lora))


# -- the modules of each architecture ------------------------------------------------------------------------------

@pytest.mark.parametrize("classifier", [False, True], ids=["causal-lm", "classifier"])
@pytest.mark.parametrize("name", CONFIGS)
def test_adaptable_modules_are_the_linear_and_embedding_modules_transformers_builds(name: str,
                                                                                   classifier: bool) -> None:
    import torch
    from transformers.pytorch_utils import Conv1D

    model = hf_model(CONFIGS[name], classifier)
    built = {path: (module.weight.shape[1], module.weight.shape[0]) if isinstance(module, torch.nn.Linear) else
             (module.num_embeddings, module.embedding_dim) if isinstance(module, torch.nn.Embedding) else
             tuple(module.weight.shape) for path, module in model.named_modules()
             if isinstance(module, (torch.nn.Linear, torch.nn.Embedding, Conv1D))}
    arch = architecture(CONFIGS[name], sequence_classifier=classifier)
    listed = {path: (module.in_features, module.out_features)
              for module in arch.modules for path in module.paths(arch.layers)}
    assert listed == built


@pytest.mark.parametrize("targets", TARGETS)
@pytest.mark.parametrize("name", CONFIGS)
def test_target_modules_select_what_peft_adapts(name: str, targets: str) -> None:
    from peft.tuners.tuners_utils import BaseTunerLayer

    arch = architecture(CONFIGS[name])
    given = peft_targets(TARGETS[targets])
    ours = {module.path.format(layer) if layer is not None else module.path
            for module, layer in targeted(arch, given if given is not None else ["q_proj", "v_proj",
                                                                                 "query_key_value", "c_attn"])}
    if not ours:
        with pytest.raises(ValueError, match="not found|No modules were targeted"):
            peft_model(CONFIGS[name], TARGETS[targets])
        return
    adapted = peft_model(CONFIGS[name], TARGETS[targets]).base_model.model
    assert ours == {path for path, module in adapted.named_modules() if isinstance(module, BaseTunerLayer)}


@pytest.mark.parametrize("dora", [False, True], ids=["lora", "dora"])
@pytest.mark.parametrize("targets", TARGETS)
@pytest.mark.parametrize("name", CONFIGS)
def test_adapter_sizes_are_the_parameters_peft_trains(name: str, targets: str, dora: bool) -> None:
    for classifier, saved in ((False, ()), (False, ("lm_head",)), (True, ())):
        arch = architecture(CONFIGS[name], sequence_classifier=classifier)
        if not any(module.name not in saved for module, _ in targeted(arch, peft_targets(TARGETS[targets]) or
                                                                            ["q_proj", "query_key_value", "c_attn"])):
            continue  # PEFT refuses a config that adapts nothing (checked above)
        model = peft_model(CONFIGS[name], TARGETS[targets], classifier, use_dora=dora,
                           modules_to_save=list(saved) or None)
        trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
        largest = max(sum(p.numel() for p in module.parameters(recurse=False) if p.requires_grad)
                      for module in model.modules())
        size = adapter_size(CONFIGS[name], LoraSettings(4, peft_targets(TARGETS[targets]), saved, dora=dora),
                            sequence_classifier=classifier)
        assert (size.params, size.largest) == (trained, largest), (classifier, saved)


# -- the adapter config the ranks build ----------------------------------------------------------------------------

def rank_inputs(**model):
    from rlhf_cli.rank.inputs import RankInputs

    return RankInputs("rloo", {}, {"model_name_or_path": SMOKE, **model}, {}, {}, {})


def test_lora_keys_become_peft_config_and_one_module_name_is_not_read_as_a_pattern() -> None:
    """TRL's ModelConfig passes `[q_proj]` on as the string "q_proj", which PEFT matches against whole paths
    (model.layers.0.self_attn.q_proj): nothing. The ranks keep a plain name a list."""
    from peft import get_peft_model
    from trl import ModelConfig, get_peft_config

    from rlhf_cli.rank.lora import peft_config

    assert peft_config(rank_inputs(lora_r=8)) is None  # use_peft unset: no adapters, as in TRL
    config = peft_config(rank_inputs(use_peft=True, lora_r=8, lora_alpha=16, lora_dropout=0.0, use_rslora=True,
                                     lora_target_modules=["q_proj"], lora_modules_to_save=["lm_head"]))
    assert (config.r, config.lora_alpha, config.lora_dropout, config.use_rslora) == (8, 16, 0.0, True)
    assert config.target_modules == {"q_proj"} and config.modules_to_save == ["lm_head"]
    model = get_peft_model(hf_model(json.loads(Path(SMOKE, "config.json").read_text()), meta=False), config)
    assert model.get_nb_trainable_parameters()[0] > 0
    with pytest.raises(ValueError, match="Target modules q_proj not found"):  # TRL's own path
        get_peft_model(hf_model(json.loads(Path(SMOKE, "config.json").read_text()), meta=False),
                       get_peft_config(ModelConfig(use_peft=True, lora_target_modules=["q_proj"])))
    assert peft_config(rank_inputs(use_peft=True, lora_target_modules=["all-linear"])).target_modules == "all-linear"


# -- checks before launch ------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("args", "message"), [
    (("--lora", "--lora-r", "0"), "`lora_r`: must be at least 1, got 0"),
    (("--lora", "--set", "lora_dropout=1.0"), "`lora_dropout`: must be at least 0 and below 1"),
    (("--lora", "--set", "lora_task_type=SEQ_CLS"), "`lora_task_type`: the policy is a causal LM, so CAUSAL_LM"),
    (("--lora", "--set", "lora_target_modules=[qproj, v_proj]"),
     "`qproj` is no module of the policy's llama (" + SMOKE + "); did you mean `q_proj`? LoRA can adapt: "
     "embed_tokens, q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, lm_head, or all-linear"),
    (("--lora", "--set", "lora_target_modules=.*\\.attn\\..*"), "`.*\\.attn\\..*` matches no module"),
    (("--lora", "--set", "lora_target_modules=[q_proj(]"), "'q_proj(' is not a regular expression"),
    (("--lora", "--set", "lora_target_modules=[q_proj, lm_head]"),
     "rloo scores tokens with `lm_head.weight` directly (TRL's fused LM head)"),
    (("--lora", "--no-gather", "--set", "use_dora=true"), "`use_dora`: generating from ZeRO-3 shards"),
    (("--lora", "--gather", "auto", "--set", "use_dora=true"), "`use_dora`: generating from ZeRO-3 shards"),
])
def test_lora_mistakes_are_one_line_errors_before_launch(cli, nothing_launches, args, message) -> None:
    result = cli("rloo", "-r", "rloo/smoke", *args)
    assert result.exit_code == 2 and message in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1 and nothing_launches == []


@pytest.mark.parametrize("args", [
    ("--lora", "--set", "lora_target_modules=[q_proj]"),  # one plain name: a module name, not a pattern
    ("--lora", "--set", "lora_target_modules=all-linear", "--set", "use_dora=true", "--gather"),
    ("--lora", "--set", r"lora_target_modules=model\.layers\.1\.self_attn\.(q|v)_proj"),
    ("--no-lora", "--set", "lora_target_modules=[nothing_like_it]"),  # LoRA off: its modules are not looked for
])
def test_good_lora_settings_launch(cli, nothing_launches, args) -> None:
    result = cli("rloo", "-r", "rloo/smoke", *args)
    assert result.exit_code == 0, result.output
    assert len(nothing_launches) == 1


def test_lora_flags_set_trls_keys_and_say_so(cli, nothing_launches) -> None:
    cli("ppo", "-r", "ppo/smoke", "--lora", "--lora-r", "8", "--merge-adapter")
    run = nothing_launches[0]
    assert (run.value("use_peft"), run.value("lora_r"), run.value("merge_adapter")) == (True, 8, True)
    assert run.settings["use_peft"].source == "flag --lora" and run.settings["lora_r"].source == "flag --lora-r"
    result = cli("ppo", "-r", "ppo/smoke", "--lora", "--set", "use_peft=false")
    assert result.exit_code == 2 and "`use_peft` is set again" in result.output


def test_ppo_checks_the_value_models_modules_too(cli, tmp_path: Path) -> None:
    """PPO adapts its value model as well; a reward model of another architecture has other module names."""
    classifier = {**CONFIGS["gpt_neox"], "architectures": ["GPTNeoXForSequenceClassification"]}
    reward = write(tmp_path / "neox" / "config.json", json.dumps(classifier))
    result = cli("ppo", "-r", "ppo/smoke", "--lora", "--reward-model", str(reward.parent),
                 "--set", "lora_target_modules=[q_proj, v_proj]")
    assert result.exit_code == 2 and "selects no module of the value model's gpt_neox" in result.output
    assert "dense_h_to_4h" in result.output  # what it has instead
    result = cli("ppo", "-r", "ppo/smoke", "--lora", "--set", "lora_target_modules=[q_proj, lm_head]")
    assert result.exit_code == 0, result.output  # the value model has no lm_head: PEFT skips it there


@pytest.mark.parametrize("model_type", ["granite", "cohere", "olmo2", "smollm3", "stablelm"])
def test_a_family_peft_has_no_default_targets_for_is_told_to_name_them(cli, nothing_launches, tmp_path: Path,
                                                                      model_type: str) -> None:
    """PEFT adapts Granite, Cohere, OLMo-2 and SmolLM3 only with named targets (it stops every rank after loading
    otherwise): refused before launch though rlhf does not lay out their modules. StableLM has defaults."""
    model = Path(shutil.copytree(SMOKE, tmp_path / model_type))  # a llama: its layout under another model type
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "model_type": model_type}))
    result = cli("rloo", "-r", "rloo/smoke", "--lora", "--model", str(model))
    if model_type == "stablelm":
        assert result.exit_code == 0 and len(nothing_launches) == 1, result.output
        return
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert f"PEFT has no default for {model_type} (policy {model}); name the modules to adapt" in result.output
    named = cli("rloo", "-r", "rloo/smoke", "--lora", "--model", str(model), "--set", "lora_target_modules=all-linear")
    assert named.exit_code == 0, named.output


def test_peft_default_targets_are_known_for_the_model_types_peft_has_them_for() -> None:
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING

    from rlhf_cli.models.architectures import PEFT_DEFAULT_TARGETS, PEFT_DEFAULTED_MODEL_TYPES

    assert PEFT_DEFAULTED_MODEL_TYPES == set(TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING)
    for model_type, targets in PEFT_DEFAULT_TARGETS.items():
        assert list(targets) == TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING[model_type]


def test_a_hub_model_not_downloaded_is_checked_when_it_loads(cli, nothing_launches) -> None:
    result = cli("rloo", "-r", "rloo/smoke", "--lora", "--model", "org/not-cached",
                 "--set", "lora_target_modules=[anything]")
    assert result.exit_code == 0, result.output


# -- activations: what a frozen layer and its adapters keep, against autograd --------------------------------------

LAYER_SHAPE = {"vocab_size": 320, "hidden_size": 128, "intermediate_size": 352, "num_hidden_layers": 1,
               "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256}
LAYERS = {"llama": {**LAYER_SHAPE, "model_type": "llama"},
          "qwen3": {**LAYER_SHAPE, "model_type": "qwen3", "head_dim": 32},
          "gpt_neox": {**LAYER_SHAPE, "model_type": "gpt_neox", "num_key_value_heads": 4, "rotary_pct": 0.25,
                       "intermediate_size": 256}}


@pytest.mark.parametrize("attention", [memory.FLASH_ATTENTION, memory.SDPA, memory.EAGER])
@pytest.mark.parametrize("name", LAYERS)
def test_lora_layer_activations_are_what_autograd_keeps(name: str, attention: str) -> None:
    """Measured on the CPU, whose dropout keeps its mask in the model's dtype (CUDA's is bool: mask_bytes 1)."""
    size = model_size(LAYERS[name])
    for dtype_name, element_bytes in (("bfloat16", 2), ("float32", 4)):
        for targets in (None, ["all-linear"], ["o_proj", "dense"]):
            for dropout in (0.0, 0.05):
                lora = LoraSettings(8, peft_targets(targets), dropout=dropout > 0)
                adapter = adapter_size(LAYERS[name], lora)
                expected = (memory.layer_activations(size, 64, element_bytes, attention, liger=False, frozen=True)
                            + memory.adapter_activations(size, adapter.layers[0][0], 8, element_bytes, attention,
                                                         dropout > 0, mask_bytes=element_bytes))
                measured = saved_by_one_layer(LAYERS[name], attention, dtype_name,
                                              lora={"r": 8, "target_modules": peft_targets(targets),
                                                    "lora_dropout": dropout})
                assert expected == measured, (dtype_name, targets, dropout)


# -- the plan ---------------------------------------------------------------------------------------------------

FIXTURES = REPO / "tests" / "fixtures" / "models"


# -- builders: TRL's peft_config path, and no reference model --------------------------------------------------------

def test_the_value_models_score_head_stays_out_of_the_policys_modules_to_save() -> None:
    """Before: both configs shared the recipe's modules_to_save list, and PEFT's SEQ_CLS wrapper extended it with the
    value model's score head, so the policy's saved adapter config listed `score` too."""
    from rlhf_cli.rank.lora import SEQUENCE_CLASSIFIER, adapt_ppo_models

    inputs = rank_inputs(use_peft=True, lora_r=4, lora_modules_to_save=["lm_head"])
    policy, value = adapt_ppo_models(hf_model(CONFIGS["llama"], meta=False),
                                     hf_model(CONFIGS["llama"], classifier=True, meta=False), inputs)
    assert value.peft_config["default"].task_type == SEQUENCE_CLASSIFIER
    assert "score" in value.peft_config["default"].modules_to_save
    assert list(policy.peft_config["default"].modules_to_save) == ["lm_head"]
    assert inputs.model["lora_modules_to_save"] == ["lm_head"]


@pytest.fixture
def loaded(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name or path of every model loaded through AutoModelForCausalLM.from_pretrained, in order."""
    from transformers import AutoModelForCausalLM

    names: list[str] = []
    load = AutoModelForCausalLM.from_pretrained.__func__

    def counted(cls, *args, **kwargs):
        names.append(str(args[0]))
        return load(cls, *args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", classmethod(counted))
    return names


TRAINER = {"per_device_train_batch_size": 2, "max_steps": 1, "report_to": "none", "bf16": False, "use_cpu": True,
           "dataloader_pin_memory": False, "save_strategy": "no", "beta": 0.05}
SCRIPT = {"dataset_name": str(RECIPES / "smoke" / "prompts.jsonl"),
          "reward_model_name_or_path": str(RECIPES / "smoke" / "reward")}


@pytest.mark.parametrize(("name", "extra"), [("rloo", {"num_generations": 2, "max_completion_length": 4}),
                                            ("grpo", {"num_generations": 2, "max_completion_length": 4}),
                                            ("online_dpo", {"max_new_tokens": 4, "beta": [0.05]})])
def test_trl_trainers_get_the_adapters_and_no_reference_model(name: str, extra: dict, tmp_path: Path,
                                                              loaded: list[str]) -> None:
    """Before: the LoRA keys were accepted and ignored, and online DPO loaded a second policy as reference."""
    from peft import PeftModel

    from rlhf_cli.algorithms import algorithm
    from rlhf_cli.algorithms.spec import load_object
    from rlhf_cli.rank.inputs import RankInputs

    inputs = RankInputs(name, SCRIPT, {"model_name_or_path": SMOKE, "use_peft": True, "lora_r": 4},
                        {**TRAINER, **extra, "output_dir": str(tmp_path)}, {}, {})
    trainer = load_object(algorithm(name).builder)(inputs)
    assert isinstance(trainer.model, PeftModel) and trainer.model.peft_config["default"].r == 4
    assert trainer.ref_model is None and len(loaded) <= 1  # at most the policy itself, loaded once


def test_online_dpo_ranks_sample_their_own_random_numbers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: TRL's OnlineDPOTrainer only called set_seed(args.seed), so every rank drew the same numbers (99.3% of
    sampled tokens equal across ranks on different prompts); RLOO and GRPO reseed per rank, and so does it now."""
    import torch
    from accelerate.state import AcceleratorState

    from rlhf_cli.rank.builders import build_online_dpo
    from rlhf_cli.rank.inputs import RankInputs

    draws = []
    for rank in (0, 1):
        monkeypatch.setattr(AcceleratorState, "process_index", property(lambda self, rank=rank: rank), raising=False)
        inputs = RankInputs("online_dpo", SCRIPT, {"model_name_or_path": SMOKE, "use_peft": True, "lora_r": 4},
                            {**TRAINER, "max_new_tokens": 4, "beta": [0.05], "output_dir": str(tmp_path / str(rank))},
                            {}, {})
        build_online_dpo(inputs)
        draws.append(torch.rand(8))
    assert not torch.equal(*draws)


@pytest.fixture
def big_models() -> None:
    for repo_id, fixture in (("EleutherAI/pythia-12b", "pythia-12b"), ("EleutherAI/pythia-70m", "pythia-70m"),
                             ("meta-llama/Meta-Llama-3-70B", "llama-3-70b"),
                             ("meta-llama/Llama-3.1-8B", "llama-3.1-8b")):
        cache_model(repo_id, fixture)


def seed_plan(*flags: str, gpus: int = 4, memory_per_gpu: str = "23.7GiB", **values):
    from rlhf_cli.config.resolve import RunRequest, resolve
    from rlhf_cli.plan.estimate import planned

    recipe = RECIPES / "ppo" / "pythia-12b-descriptiveness.yaml"
    given = {"gpu_memory": ("--gpu-memory", memory_per_gpu), "num_gpus": ("--num-gpus", gpus), **values}
    return planned(resolve(RunRequest("ppo", str(recipe), given, flags), cuda=True))


def test_lora_columns_hold_frozen_shards_adapter_states_and_no_reference(big_models) -> None:
    _, plan = seed_plan()
    policy, reference, reward, value = plan.roles
    assert reference.name == "reference" and policy.adapter and value.adapter and reward.adapter is None
    full, lora = plan.column(WHOLE, "none", "none"), plan.column(WHOLE, "none", "none", lora=True)
    rows, full_rows = ({part.name: part.gpu for part in column.components} for column in (lora, full))
    assert rows["policy shard"] == memory.frozen_shard(policy.size.params, 2, 4) == full_rows["reference shard"]
    assert rows["reference shard"] == 0 and full_rows["policy shard"] == 0
    assert rows["policy states"] == 16 * policy.adapter.params // 4  # 16 bytes a trained parameter, over 4 GPUs
    assert rows["value states"] == 16 * value.adapter.params // 4 and rows["value shard"] > 0
    adapters = policy.adapter.params + value.adapter.params  # PPO gathers the policy and value engine whole
    assert rows["gen weights"] == full_rows["gen weights"] + 2 * adapters
    largest = max(policy.adapter.largest, value.adapter.largest)
    assert rows["step fp32 grads"] == memory.optimizer_step(adapters, largest, 2, 4, False)  # the adapters' only
    assert policy.adapter.params == 36 * 16 * (5120 + 3 * 5120)  # pythia-12b: query_key_value in 36 layers, rank 16


def test_gather_auto_decides_among_the_lora_columns(big_models) -> None:
    run, plan = seed_plan("use_peft=true", gather=("--gather auto", "auto"))
    gathered = plan.column(WHOLE, "cpu", "none", lora=True)  # the recipe offloads the optimizer: the run's own
    assert gathered is not None and not gathered.fits and run.value("ds3_gather_for_generation") is False
    assert run.settings["ds3_gather_for_generation"].source.startswith(f"rlhf plan: gathering needs "
                                                                       f"{gathered.peak / 2**30:.1f} GiB")
    run, _ = seed_plan("use_peft=true", gather=("--gather auto", "auto"), memory_per_gpu="80GiB")
    assert run.value("ds3_gather_for_generation") is True


def test_when_nothing_else_fits_the_plan_says_lora_does(big_models) -> None:
    # Without gradient checkpointing (TRL 1.12's PPO turns it on), where full fine-tuning's activations do not fit
    _, plan = seed_plan("gradient_checkpointing=false", memory_per_gpu="6GiB")
    lora = plan.column(SHARDS, "cpu", "cpu", lora=True)
    assert not any(column.fits for column in plan.columns if not column.candidate.lora) and lora.fits
    assert f"--lora fits ({lora.peak / 2**30:.1f} GiB): LoRA, no-gather, opt+params->cpu" in plan.suggestions
    _, plan = seed_plan()  # no-gather with the optimizer offloaded fits: no word of LoRA
    assert not any("--lora" in line for line in plan.suggestions)


def test_seventy_b_on_eight_gpus(big_models) -> None:
    """Llama-3-70B PPO with a Llama-3.1-8B reward and value model: fully fine-tuned it fits only with the optimizer
    in host memory (over a TiB per machine); with LoRA it generates from shards with nothing offloaded on 80 GiB
    GPUs, and on 24 GiB GPUs with the frozen weights in host memory, a tenth of full fine-tuning's."""
    models = {"model_name_or_path": ("--model", "meta-llama/Meta-Llama-3-70B"),
              "reward_model_name_or_path": ("--reward-model", "meta-llama/Llama-3.1-8B")}
    _, plan = seed_plan(gpus=8, memory_per_gpu="80GiB", **models)
    assert all(column.cpu_per_machine > 2**40 for column in plan.columns if column.fits and not column.candidate.lora)
    assert plan.column(SHARDS, "none", "none", lora=True).fits
    _, plan = seed_plan(gpus=8, memory_per_gpu="24GiB", **models)
    full = [column for column in plan.columns if column.fits and not column.candidate.lora]
    lora = [column for column in plan.columns if column.fits and column.candidate.lora]
    assert [column.candidate.label for column in lora] == ["LoRA, no-gather, opt+params->cpu"]
    assert lora[0].cpu_per_machine * 9 < min(column.cpu_per_machine for column in full)


PPO = {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 1, "num_mini_batches": 1, "num_ppo_epochs": 1,
       "local_rollout_forward_batch_size": 2, "response_length": 6, "total_episodes": 4, "learning_rate": 1e-2,
       "temperature": 1.0, "logging_steps": 1, "save_strategy": "no", "report_to": "none", "seed": 3, "bf16": False,
       "use_cpu": True, "dataloader_pin_memory": False}


def test_ppo_with_lora_loads_no_reference_and_starts_at_kl_zero(tmp_path: Path, loaded: list[str]) -> None:
    """One process, no DeepSpeed: the policy is loaded once; the reference is that policy with its adapters off,
    exactly the policy until the first update (B starts at zero), then apart from it."""
    from peft import PeftModel

    from rlhf_cli.rank.builders import build_ppo
    from rlhf_cli.rank.inputs import RankInputs

    script = {**SCRIPT, "reward_model_name_or_path": None,
              "reward_funcs": [f"{REPO}/tests/fixtures/rewards.py:letter_e"]}
    inputs = RankInputs("ppo", script, {"model_name_or_path": SMOKE, "use_peft": True, "lora_r": 4},
                        {**PPO, "output_dir": str(tmp_path)}, {}, {})
    trainer = build_ppo(inputs)
    assert loaded == [SMOKE] and trainer.ref_policy is None
    assert isinstance(trainer.policy_and_value.policy, PeftModel)
    assert isinstance(trainer.policy_and_value.value_model, PeftModel)  # with its score head trained whole
    trainer.train()
    kl = [entry["objective/kl"] for entry in trainer.state.log_history]
    assert kl[0] == 0.0 and kl[1] != 0.0
    trainer.save_model(str(tmp_path))
    assert (tmp_path / "adapter_config.json").is_file() and not (tmp_path / "model.safetensors").exists()
