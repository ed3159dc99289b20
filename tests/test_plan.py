"""The memory plan: parameter counts, DeepSpeed's formulas, GPU detection, `rlhf plan` and `--gather auto`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from helpers import (
    ARCHITECTURES,
    RECIPES,
    REPO,
    SEED,
    SEED_HARDWARE,
    TINY,
    cache_model,
    free_port,
    saved_by_one_layer,
    seed_run,
    write,
)
from rlhf_cli.algorithms import ALGORITHMS
from rlhf_cli.config.resolve import RunRequest, resolve
from rlhf_cli.errors import ConfigError, PlanError
from rlhf_cli.generation.choice import Engine, Gather, Generation
from rlhf_cli.machine.probe import available_ram
from rlhf_cli.models.hub import ModelConfigUnavailable, find_config, read_config
from rlhf_cli.phases import MemoryPhase
from rlhf_cli.plan import memory
from rlhf_cli.plan.engines import vllm, vllm_plan
from rlhf_cli.plan.estimate import plan_run, planned
from rlhf_cli.plan.hardware import detect_hardware
from rlhf_cli.plan.model_sizes import model_size
from rlhf_cli.sizes import SizeError, parse_size

WHOLE, SHARDS = Generation(Gather.whole), Generation(Gather.shards)

pytestmark = pytest.mark.usefixtures("nothing_launches")  # no test here starts ranks


# -- parameter counts --------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ARCHITECTURES)
def test_parameter_counts_equal_transformers_on_the_meta_device(name: str) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

    config = ARCHITECTURES[name]
    for auto_class, classifier in ((AutoModelForCausalLM, False), (AutoModelForSequenceClassification, True)):
        hf_config = AutoConfig.for_model(**config, num_labels=1)
        with torch.device("meta"):
            model = auto_class.from_config(hf_config)
        largest = max(sum(p.numel() for p in module.parameters(recurse=False)) for module in model.modules())
        size = model_size(config, sequence_classifier=classifier)
        assert (size.params, size.largest_layer) == (sum(p.numel() for p in model.parameters()), largest), \
            (name, auto_class.__name__)
        assert not size.approximate


def test_an_unknown_architecture_is_counted_as_a_llama_like_decoder() -> None:
    size = model_size({**TINY, "model_type": "brand-new"})
    llama = model_size({**TINY, "model_type": "llama", "tie_word_embeddings": True})
    assert size.approximate and size.params == llama.params


def test_a_config_without_sizes_is_refused_with_what_it_lacks() -> None:
    with pytest.raises(ModelConfigUnavailable, match="lacks 'hidden_size'"):
        model_size({"model_type": "llama"})


# -- model states: what DeepSpeed's ZeRO-3 optimizer allocates ---------------------------------------------

ZERO3_PROBE = """
import json, os, sys
import torch, deepspeed
from transformers import AutoConfig, AutoModelForCausalLM

deepspeed.init_distributed(dist_backend="gloo")
found = {}
for name, bf16, offload in (("bf16", True, False), ("bf16 offload", True, True), ("fp32", False, False)):
    config = AutoConfig.for_model(model_type="llama", vocab_size=320, hidden_size=64, intermediate_size=96,
                                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    model = AutoModelForCausalLM.from_config(config)
    params = sum(p.numel() for p in model.parameters())
    zero = {"stage": 3, "offload_optimizer": {"device": "cpu" if offload else "none"}}
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters()), config={
        "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": bf16}, "zero_optimization": zero,
        "zero_force_ds_cpu_optimizer": False})
    optimizer = engine.optimizer
    step_gradients = []
    prepare = optimizer._prepare_fp32_grad_for_sub_group
    def recording(sub_group, prepare=prepare, optimizer=optimizer):
        prepare(sub_group)
        gradient = optimizer.fp32_partitioned_groups_flat[sub_group].grad
        step_gradients.append(gradient.numel() * gradient.element_size())
    optimizer._prepare_fp32_grad_for_sub_group = recording
    ids = torch.randint(0, 320, (1, 8))
    engine.backward(engine(input_ids=ids, labels=ids).loss)
    engine.step()
    def size(tensors):
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)
    masters = [t for t in optimizer.fp32_partitioned_groups_flat
               if all(t.data_ptr() != p.data_ptr() for p in optimizer.fp16_partitioned_groups_flat)]
    found[name] = {"params": params, "parameter": size(optimizer.fp16_partitioned_groups_flat),
                   "optimizer": size([optimizer.grad_partitions_flat_buffer, *masters,
                                      *[v for s in optimizer.optimizer.state.values() for v in s.values()
                                        if torch.is_tensor(v) and v.numel() > 1],
                                      *(t.grad for t in optimizer.fp32_partitioned_groups_flat if offload)]),
                   "step": max(step_gradients, default=0)}
print(json.dumps(found))
"""


def test_model_states_are_what_deepspeeds_zero3_optimizer_allocates(tmp_path: Path) -> None:
    """One process, DeepSpeed's CPU accelerator: the partitions, master weights, Adam's moments and gradient
    buffers it really creates, against the plan's bytes per parameter (one GPU: the shard is the model)."""
    probe = write(tmp_path / "probe.py", ZERO3_PROBE)
    environment = {**os.environ, "DS_ACCELERATOR": "cpu", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
                   "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}
    done = subprocess.run([sys.executable, str(probe)], env=environment, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    for name, element_bytes, offload in (("bf16", 2, False), ("bf16 offload", 2, True), ("fp32", 4, False)):
        measured = found[name]
        params = measured["params"]
        cpu, gpu = memory.zero3_model_states(params, element_bytes, 1, 1, offload_optimizer=offload,
                                             offload_params=False)
        allocated = measured["parameter"] + measured["optimizer"]
        assert (gpu + cpu, gpu) == (allocated, allocated - measured["optimizer"] if offload else allocated), name
        assert memory.optimizer_step(params, 0, element_bytes, 1, offload) == measured["step"] * (
            1 + element_bytes / 4 if element_bytes < 4 else 1), name
    assert memory.zero3_model_states(10**9, 2, 8, 1, offload_optimizer=False, offload_params=False)[1] == 2 * 10**9


# -- the formulas ------------------------------------------------------------------------------------------

def test_generation_weights_without_gathering_are_bounded_by_what_zero3_keeps_live() -> None:
    big, small = 12_000_000_000, 70_000_000
    assert memory.generation_weights(big, 2, True, 10**9, 5 * 10**7) == 2 * big
    assert memory.generation_weights(big, 2, False, 10**9, 5 * 10**7) == 2 * (10**9 + 5 * 10**7)
    # below stage3_max_live_parameters nothing is released: no-gather holds the whole model, as gather does
    assert memory.generation_weights(small, 2, False, 10**9, 5 * 10**7) == memory.generation_weights(
        small, 2, True, 10**9, 5 * 10**7)


def test_gradient_checkpointing_shrinks_activations_and_the_peak_takes_the_largest_phase() -> None:
    size = model_size(ARCHITECTURES["pythia-12b"])
    full = memory.activations(size, 2, 512, 2, checkpointing=False)
    assert memory.activations(size, 2, 512, 2, checkpointing=True) < full / 5
    assert memory.activations(size, 4, 512, 2, checkpointing=False) == 2 * full
    rows = [memory.Component("a", MemoryPhase.STATIC, 10), memory.Component("b", MemoryPhase.GENERATION, 5),
            memory.Component("c", MemoryPhase.GENERATION, 4), memory.Component("d", MemoryPhase.TRAINING, 7),
            memory.Component("e", MemoryPhase.STEP, 11)]
    assert memory.peak(rows) == 10 + 11
    assert memory.peak(rows[:4]) == 10 + 9


LAYER_SHAPE = {"vocab_size": 128, "hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 1,
               "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 4096}
LAYERS = {"llama": {**LAYER_SHAPE, "model_type": "llama"}, "qwen2": {**LAYER_SHAPE, "model_type": "qwen2"},
          "qwen3": {**LAYER_SHAPE, "model_type": "qwen3", "head_dim": 32},
          "gpt_neox": {**LAYER_SHAPE, "model_type": "gpt_neox", "num_key_value_heads": 4, "rotary_pct": 0.25,
                       "intermediate_size": 256}}


@pytest.mark.parametrize("attention", [memory.FLASH_ATTENTION, memory.SDPA, memory.EAGER])
@pytest.mark.parametrize("name", LAYERS)
def test_layer_activations_are_what_autograd_keeps(name: str, attention: str) -> None:
    for dtype_name, element_bytes in (("bfloat16", 2), ("float32", 4)):
        size = model_size(LAYERS[name])
        expected = memory.layer_activations(size, 64, element_bytes, attention, liger=False)
        assert expected == saved_by_one_layer(LAYERS[name], attention, dtype_name), (name, attention, dtype_name)


# -- sizes and GPUs ----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "expected"), [("24GiB", 24 * 2**30), ("24GB", 24 * 10**9), ("24576MiB", 24 * 2**30),
                                                ("23.7 GiB", int(23.7 * 2**30)), ("1000", 1000), (4096, 4096),
                                                ("2tib", 2 * 2**40)])
def test_memory_sizes(text, expected) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["24 gigs", "GiB", "-3GB", "23.7", "0", "", True])
def test_bad_memory_sizes_say_what_is_expected(text) -> None:
    with pytest.raises(SizeError, match="memory size|whole|positive"):
        parse_size(text)


def fake_nvidia_smi(directory: Path, monkeypatch: pytest.MonkeyPatch, output: str) -> None:
    script = write(directory / "nvidia-smi", f"#!/bin/sh\nprintf '{output}'\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", str(directory))


def test_gpu_memory_is_asked_of_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_nvidia_smi(tmp_path, monkeypatch, "24576\\n81920\\n")
    hardware = detect_hardware(None, processes=8, machines=2)
    assert hardware.gpu_memory == 24 * 2**30 and hardware.gpus_per_machine == 4 and hardware.total_gpus == 8
    assert "nvidia-smi" in hardware.source


def test_without_a_gpu_the_plan_shares_this_machines_ram(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    hardware = detect_hardware(None, processes=2, machines=1)
    ram = available_ram()
    assert ram is not None and abs(hardware.gpu_memory - ram // 2) < 2**30  # RAM moves a little between reads
    assert "no GPU here" in hardware.source and "2 process" in hardware.source
    given = detect_hardware(parse_size("24GiB"), processes=2, machines=1)
    assert given.gpu_memory == 24 * 2**30 and given.source.startswith("given")


def test_num_gpus_sets_num_processes_and_must_agree_with_it() -> None:
    # the flag outranks the recipe's num_processes (2)
    run = resolve(RunRequest("rloo", "rloo/smoke", {"num_gpus": ("--num-gpus", 4), "num_machines": (
        "--num-machines", 2), "main_process_ip": ("--main-process-ip", "10.0.0.1")}))
    assert run.accelerate["num_processes"] == 8 and run.value("num_processes") == 8
    with pytest.raises(ConfigError, match=r"--num-processes 6 disagrees with --num-gpus 4 x 1 machine\(s\) = 4"):
        resolve(RunRequest("rloo", "rloo/smoke", {"num_gpus": ("--num-gpus", 4), "num_processes": (
            "--num-processes", 6)}))


# -- finding config.json -----------------------------------------------------------------------------------

def test_hub_ids_are_read_from_the_hub_cache_at_the_runs_revision() -> None:
    cache_model("org/model", "pythia-70m", commit="b" * 40, ref="v1")
    assert find_config("org/model", "v1").parent.name == "b" * 40
    assert read_config("org/model", "b" * 40)["hidden_size"] == 512
    with pytest.raises(ModelConfigUnavailable, match="org/model@main is not in the hub cache"):
        find_config("org/model")
    assert find_config(str(RECIPES / "smoke" / "policy")) == RECIPES / "smoke" / "policy" / "config.json"


# -- the seed's case ---------------------------------------------------------------------------------------

def test_seed_case_gather_does_not_fit_no_gather_does(seed_models) -> None:
    plan = plan_run(seed_run())
    assert plan.known and plan.hardware.gpu_memory == int(23.7 * 2**30) and plan.hardware.total_gpus == 4
    gather, no_gather = plan.column(WHOLE, "cpu", "none"), plan.column(SHARDS, "cpu", "none")
    assert gather.chosen and not gather.fits
    assert no_gather.fits and not no_gather.chosen
    assert gather.peak - no_gather.peak > 19 * 2**30  # 22.1 GiB gathered vs 2.3 GiB (1e9 live + the embedding)
    assert {role.name for role in plan.roles} == {"policy", "reference", "reward", "value"}
    assert plan.work.prompt_length == 64 and plan.work.completion_length == 53 and plan.work.train_batch == 1
    assert any(s.startswith("no-gather, optimizer->cpu fits") for s in plan.suggestions)


def test_seed_case_gather_auto_spends_only_the_headroom_that_training_leaves(seed_models) -> None:
    """With just enough memory for no-gather, the seed's peak is its training phase: auto buys the units that
    fit under it, and the peak does not grow."""
    no_checkpointing = {"gradient_checkpointing": ("--set gradient_checkpointing", False)}  # TRL 1.12 turns it on
    sharded = plan_run(seed_run(ds3_gather_for_generation=("--no-gather", False), **no_checkpointing)).chosen
    just_enough = -(-sharded.peak * 10 // 9)  # no-gather fits in 90% of it, not a byte more
    run, plan = planned(seed_run(ds3_gather_for_generation=("--gather auto", "auto"),
                                 gpu_memory=("--gpu-memory", str(just_enough)), **no_checkpointing))
    setting = run.settings["ds3_gather_for_generation"]
    assert setting.value is False and 0 < run.value("gather_budget") < 0.1
    assert setting.source.startswith("rlhf plan: gathering needs") and "of the policy needs" in setting.source
    assert any(note.startswith("gather: auto -> budget") for note in run.notes)
    assert plan.chosen.fits and plan.chosen.peak == sharded.peak
    assert plan.chosen.candidate.generation.gather.budget is not None


def test_gather_auto_with_nothing_that_fits_says_what_would(seed_models) -> None:
    with pytest.raises(PlanError) as caught:
        planned(seed_run(ds3_gather_for_generation=("--gather auto", "auto"), gpu_memory=("--gpu-memory", "12GiB")))
    message = str(caught.value)
    assert "neither fits" in message and "no-gather, opt+params->cpu fits" in message
    assert "no-gather, optimizer->cpu fits on" in message and "GPUs" in message


def test_a_suggested_completion_length_really_fits(seed_models) -> None:
    squeeze = {"gpu_memory": ("--gpu-memory", "20GiB")}
    run = resolve(RunRequest("ppo", str(SEED), {**SEED_HARDWARE, **squeeze}, ("gather=false", "response_length=900")),
                  cuda=True)
    plan = plan_run(run)
    assert not plan.chosen.fits
    line = next(s for s in plan.suggestions if "response_length" in s)
    length = int(line.split("response_length ")[1].split()[0])
    for value, fits in ((length, True), (length + 1, False)):
        again = resolve(RunRequest("ppo", str(SEED), {**SEED_HARDWARE, **squeeze},
                                   ("gather=false", f"response_length={value}")), cuda=True)
        assert plan_run(again).chosen.fits is fits


@pytest.mark.parametrize("flags", [[], ["--gpu-memory", "24GiB"]], ids=["this machine", "24GiB"])
def test_smoke_recipe_gather_auto_picks_gather(cli, flags, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi: plan against this machine's RAM unless given
    result = cli("ppo", "-r", "ppo/smoke", "--gather", "auto", *flags, "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["trainer"]["ds3_gather_for_generation"] is True
    assert data["sources"]["ds3_gather_for_generation"].startswith("rlhf plan: gathering needs")
    assert ("no GPU here" in data["plan"]["hardware_source"]) is (not flags)


def test_rlhf_plan_prints_the_table_and_json(cli, seed_models) -> None:
    args = ("plan", "ppo", "-r", SEED, "--gpu-memory", "23.7GiB", "--num-gpus", "4")
    table = cli(*args)
    assert table.exit_code == 0, table.output
    for text in ("gather", "no-gather", "opt *", "policy states", "gen weights", "peak per GPU", "fits in 21.3",
                 "does not fit", "with --lora (rank 16, PEFT default targets)", "policy shard",
                 "with vLLM (--vllm colocate, vllm_gpu_memory_utilization 0.3", "sync bucket",
                 "vLLM: vLLM fits colocated with vllm_tensor_parallel_size 2"):
        assert text in table.stdout, text
    data = json.loads(cli(*args, "--json").stdout)
    chosen = [c for c in data["configurations"] if c["chosen"]]
    assert [(c["lora"], c["engine"]) for c in data["configurations"]] == \
        [(False, "hf")] * 6 + [(True, "hf")] * 4 + [(False, "vllm")] * 6 + [(False, "hf")]
    assert data["configurations"][-1]["label"] == "budget 0.212, optimizer->cpu"  # what gather: auto would take
    assert len(chosen) == 1 and chosen[0]["label"] == "gather, optimizer->cpu"
    assert chosen[0]["fits"] is False and data["models"]["policy"]["params"] == 11_846_072_320
    assert sum(chosen[0]["components"].values()) >= chosen[0]["peak_gpu"]


def test_plan_commands_take_exactly_the_training_flags(cli) -> None:
    def options(*command: str) -> set[str]:
        return {word.strip(",") for word in cli(*command, "--help").output.split() if word.startswith("--")}

    commands = [entry.command for entry in ALGORITHMS.values()]
    assert set(commands) <= set(cli("plan", "--help").output.split())
    for command in commands:
        assert options("plan", command) == options(command)
        assert {"--gpu-memory", "--num-gpus", "--gather", "--no-gather", "--json"} <= options(command)


def test_an_unknown_plan_never_blocks_a_run_unless_gather_is_auto(cli, nothing_launches, tmp_path: Path) -> None:
    result = cli("rloo", "-r", "rloo/pythia-12b-descriptiveness", "-o", tmp_path / "out")  # nothing in the hub cache
    assert result.exit_code == 0, result.output
    assert "plan       unknown: config.json of" in result.stderr  # the run header's plan row
    assert len(nothing_launches) == 1
    auto = cli("rloo", "-r", "rloo/pythia-12b-descriptiveness", "--gather", "auto", "--dry-run")
    assert auto.exit_code == 2
    assert "pass --gather or --no-gather, or make config.json available" in " ".join(auto.output.split())


def test_the_plan_is_printed_before_a_launch_and_in_dry_runs(cli, nothing_launches, tmp_path: Path) -> None:
    launched = cli("rloo", "-r", "rloo/smoke", "-o", tmp_path / "out")
    assert launched.exit_code == 0 and "plan       gather to generate (gather, no offload) needs" in launched.stderr
    dry = cli("rloo", "-r", "rloo/smoke", "--no-gather", "--dry-run")
    assert dry.stderr.startswith("plan: generate from shards") and "plan:" not in dry.stdout


@pytest.mark.parametrize(("args", "message"), [
    (["auto"], "unexpected argument 'auto'; did you mean --gather auto?"),
    (["--no-gather", "auto"], "unexpected argument 'auto'; did you mean --gather auto?"),
    (["--gather", "always"], "unexpected argument 'always'"),
    (["--dry-run", "stray"], "unexpected argument 'stray'"),
    (["--set", "gather=sometimes"], "expected one of true, false, auto, got 'sometimes'"),
    (["--gpu-memory", "lots"], "Error: --gpu-memory: `gpu_memory`: 'lots' is not a memory size"),
])
def test_bad_gather_and_memory_values_are_one_line_errors(cli, args, message) -> None:
    result = cli("rloo", "-r", "rloo/smoke", *args, "--dry-run")
    assert result.exit_code == 2
    assert message in " ".join(result.output.replace("│", " ").split()), result.output


def test_which_models_each_algorithm_holds(seed_models) -> None:
    def roles(algorithm: str, *sets: str) -> dict[str, str]:
        recipe = RECIPES / algorithm / "pythia-12b-descriptiveness.yaml"
        run = resolve(RunRequest(algorithm, str(recipe), dict(SEED_HARDWARE), sets), cuda=True)
        return {role.name: role.path for role in plan_run(run).roles}

    assert roles("rloo") == {"policy": "EleutherAI/pythia-12b", "reference": "EleutherAI/pythia-12b",
                             "reward": "EleutherAI/pythia-70m"}
    assert "reference" not in roles("rloo", "beta=0")
    assert set(roles("online_dpo")) == {"policy", "reference", "reward"}
    assert set(roles("grpo")) == {"policy", "reward"}  # TRL's default beta 0: no reference model
    assert set(roles("grpo", "beta=0.04")) == {"policy", "reference", "reward"}
    assert roles("ppo", "reward_model_name_or_path=null", "reward_funcs=[tests.fixtures.rewards:letter_e]")["value"] \
        == "EleutherAI/pythia-12b"


def test_gather_auto_on_a_non_zero3_config_names_the_fix(tmp_path: Path) -> None:
    config = write(tmp_path / "ddp.yaml", "distributed_type: MULTI_GPU\nnum_processes: 2\n")
    run = resolve(RunRequest("rloo", "rloo/smoke", {"accelerate_config": ("--accelerate-config", str(config))},
                             ("gather=auto",)))
    assert not plan_run(run).known
    with pytest.raises(PlanError, match="not DeepSpeed ZeRO-3.*pass --gather or --no-gather"):
        planned(run)


def test_gather_auto_in_a_recipe(tmp_path: Path) -> None:
    recipe = write(tmp_path / "auto.yaml", (RECIPES / "rloo" / "smoke.yaml").read_text().replace(
        "gather: true", "gather: auto").replace("../smoke/", f"{RECIPES}/smoke/"))
    run, _ = planned(resolve(RunRequest("rloo", str(recipe), {"gpu_memory": ("--gpu-memory", "24GiB")})))
    assert run.value("ds3_gather_for_generation") is True
    source = run.settings["ds3_gather_for_generation"].source
    assert source.startswith("rlhf plan: gathering needs") and source.endswith("of 24.0 GiB")


# -- what each trainer computes ------------------------------------------------------------------------------

QWEN = ("model_name_or_path=Qwen/Qwen2.5-7B", "reward_model_name_or_path=null",
        "reward_funcs=[think_format_reward]")


def rows_of(algorithm: str, *sets: str, gather: bool = False) -> dict[str, int]:
    """GPU bytes of each row of the seed recipe's no-offload column, with Qwen2.5-7B as the policy."""
    cache_model("Qwen/Qwen2.5-7B", "qwen2.5-7b")
    recipe = RECIPES / algorithm / "pythia-12b-descriptiveness.yaml"
    run = resolve(RunRequest(algorithm, str(recipe), dict(SEED_HARDWARE), (*QWEN, *sets)), cuda=True)
    column = plan_run(run).column(WHOLE if gather else SHARDS, "none", "none")
    return {part.name: part.gpu for part in column.components}


def test_attention_scores_are_counted_only_with_eager_attention() -> None:
    def activations(attention: str, length: int) -> int:
        return rows_of("rloo", f"attn_implementation={attention}", f"plan_prompt_length={length}",
                       "max_completion_length=64")["train activations"]

    def scores(length: int) -> int:
        return activations("eager", length - 64) - activations("flash_attention_2", length - 64)

    # FlashAttention keeps nothing per pair of tokens: twice the tokens, twice the bytes
    assert activations("flash_attention_2", 2048 - 64) == 2 * activations("flash_attention_2", 1024 - 64)
    assert scores(2048) > 3.5 * scores(1024) > 0  # eager keeps scores: they grow with the square of the length
    assert activations("sdpa", 1024 - 64) < 1.2 * activations("flash_attention_2", 1024 - 64)


def test_rloo_scores_completion_tokens_only_and_ppo_every_position() -> None:
    def logits(algorithm: str, prompt: int) -> int:
        return rows_of(algorithm, f"plan_prompt_length={prompt}")["train logits"]

    # TRL's fused LM head: tiles and the head's fp32 weight gradient, whatever the prompt
    assert logits("rloo", 64) == logits("rloo", 1024)
    vocab, hidden = 152064, 3584
    assert 4 * vocab * hidden < logits("rloo", 64) < 4 * vocab * hidden + 2**30
    # PPO's policy returns logits for every position: they grow with the prompt
    assert logits("ppo", 1024) - logits("ppo", 64) == 2 * 16 * (1024 - 64) * vocab * 2


def test_liger_kernels_shrink_activations_not_the_logits_of_a_forward_without_labels() -> None:
    plain, liger = rows_of("ppo"), rows_of("ppo", "use_liger_kernel=true")
    assert liger["train activations"] < 0.8 * plain["train activations"]
    assert liger["train logits"] == plain["train logits"]  # Liger's fused cross-entropy needs labels


def test_gathered_generation_counts_the_policy_once(seed_models) -> None:
    plan = plan_run(seed_run())
    gather = plan.column(WHOLE, "cpu", "none")
    rows = {part.name: part for part in gather.components}
    policy = plan.roles[0].size
    assert rows["policy states"].gpu == 2 * policy.params // 4  # the 16-bit shard, no largest layer on top
    static = sum(part.gpu for part in gather.components if part.phase == MemoryPhase.STATIC)
    assert gather.peak == static + rows["gen weights"].gpu + rows["gen KV cache"].gpu
    assert rows["gen weights"].gpu == 2 * (policy.params + plan.roles[3].size.params)
    assert rows["step fp32 grads"].gpu == 0  # the optimizer steps in CPU memory


def test_the_plan_table_never_cuts_a_number_off(cli, seed_models) -> None:
    """Seven columns are wider than 80: the table is printed whole instead of shortening numbers to `19…`."""
    result = cli("plan", "ppo", "-r", SEED, "--gpu-memory", "23.7GiB", "--num-gpus", "4", "--gather", "auto")
    assert result.exit_code == 0, result.output
    assert "…" not in result.stdout
    data = json.loads(cli("plan", "ppo", "-r", SEED, "--gpu-memory", "23.7GiB", "--num-gpus", "4", "--gather", "auto",
                          "--json").stdout)
    for column in data["configurations"]:
        assert f"{column['cpu_per_machine'] / 2**30:.1f}" in result.stdout


def test_ppo_rollouts_per_process_are_per_device_times_accumulation() -> None:
    """As in TRL 1.12: num_mini_batches splits the rollouts of a process; it does not multiply them."""
    from rlhf_cli.plan.workload import workload

    values = {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 4, "num_mini_batches": 2,
              "local_rollout_forward_batch_size": 64, "response_length": 53, "plan_prompt_length": 64,
              "gradient_checkpointing": False, "bf16": True, "fp16": False, "dtype": "bfloat16"}
    planned = workload("ppo", values.get, num_processes=4)
    assert (planned.generation_batch, planned.train_batch, planned.score_batch) == (16, 4, 16)
    assert not planned.gradient_checkpointing
    for name in ("gradient_checkpointing", "activation_checkpointing"):  # PPO honours both names
        assert workload("ppo", {**values, name: True}.get, num_processes=4).gradient_checkpointing


# -- vLLM ----------------------------------------------------------------------------------------------------

QWEN_HARDWARE = {"gpu_memory": ("--gpu-memory", "80GiB"), "num_gpus": ("--num-gpus", 4)}


def qwen_plan(*sets: str, hardware: dict | None = None, gather: str = "true"):
    """RLOO of Qwen2.5-7B with the seed recipe's trainer fields and the given vLLM keys, on 4 x 80 GiB."""
    cache_model("Qwen/Qwen2.5-7B", "qwen2.5-7b")
    recipe = RECIPES / "rloo" / "pythia-12b-descriptiveness.yaml"
    return resolve(RunRequest("rloo", str(recipe), dict(hardware or QWEN_HARDWARE),
                              (*QWEN, f"gather={gather}", *sets), planning=True), cuda=True)


def vllm_rows(plan, gather: bool, offload: str = "none") -> dict[str, int]:
    column = next(c for c in plan.columns if c.candidate.engine_settings is not None
                  and (c.candidate.generation.gather == Gather.whole) is gather
                  and c.candidate.offload_optimizer == offload and c.candidate.offload_params == "none")
    return {part.name: part.gpu for part in column.components}


def test_colocated_vllm_takes_its_share_of_the_total_memory_and_the_sync_its_bucket() -> None:
    plan = plan_run(qwen_plan("use_vllm=true"))
    policy, gpu = plan.roles[0].size, 80 * 2**30
    gathered, sharded = vllm_rows(plan, True), vllm_rows(plan, False)
    assert gathered["vLLM"] == int(0.3 * gpu) + vllm.CUDA_GRAPHS  # TRL's default share, of the total
    assert gathered["gen weights"] == gathered["gen KV cache"] == gathered["vLLM awake"] == 0
    assert gathered["sync bucket"] == policy.params * 2
    assert sharded["sync bucket"] == max(unit.numel for unit in policy.units) * 2 == policy.largest_layer * 2
    training = sum(value for name, value in sharded.items() if name.startswith("train "))
    assert sharded["sync: train reserve"] == training and sharded["sync: vLLM weights"] == 0
    # the copies vLLM holds while it takes a sync do not depend on the bucket: the largest module's (Qwen2.5's
    # vocabulary, 151936 rows, is a multiple of 64: vLLM pads nothing)
    assert gathered["sync: vLLM copies"] == sharded["sync: vLLM copies"] == policy.largest_layer * 2
    assert vllm.sync_copies(100, vocab=50257, hidden=8, element_bytes=4) == (100 + 2 * 50257 * 8) * 4  # padded
    hf = {part.name: part.gpu for part in plan.column(WHOLE, "none", "none").components}
    assert hf["gen weights"] == policy.params * 2 and hf["vLLM"] == hf["sync bucket"] == 0
    assert plan.chosen.candidate.engine_settings is not None and plan.chosen.candidate.generation.gather == Gather.whole


def test_sleep_frees_vllm_while_training_and_tensor_parallelism_splits_its_weights() -> None:
    plan = plan_run(qwen_plan("use_vllm=true", "vllm_enable_sleep_mode=true", "vllm_tensor_parallel_size=4",
                              "vllm_gpu_memory_utilization=0.2"))
    rows, params = vllm_rows(plan, False), plan.roles[0].size.params
    assert rows["vLLM"] == vllm.SLEEP_RESIDUAL
    assert rows["vLLM awake"] == int(0.2 * 80 * 2**30) + vllm.CUDA_GRAPHS - vllm.SLEEP_RESIDUAL
    assert rows["sync: vLLM weights"] == -(-params * 2 // 4) and rows["sync: train reserve"] == 0
    awake = plan_run(qwen_plan("use_vllm=true", "vllm_tensor_parallel_size=4", "vllm_gpu_memory_utilization=0.2"))
    assert vllm_rows(awake, False)["vLLM"] - rows["vLLM"] == rows["vLLM awake"]
    settings = vllm.VllmSettings(sleep=True, sleep_level=1, tensor_parallel_size=2)
    assert vllm.host_weights(settings, params, 2, 4) == 4 * -(-params * 2 // 2)
    assert vllm.host_weights(replace(settings, sleep_level=2), params, 2, 4) == 0  # TRL's level discards them
    assert vllm.cuda_graphs(replace(settings, enforce_eager=True)) == 0


def test_a_vllm_server_holds_nothing_on_the_training_gpus_but_the_sync() -> None:
    plan = plan_run(qwen_plan("use_vllm=true", "vllm_mode=server"))
    rows = vllm_rows(plan, True)
    assert rows["vLLM"] == rows["vLLM awake"] == 0 and rows["sync bucket"] == plan.roles[0].size.params * 2
    assert any("--vllm server" in line and "not counted here" in line for line in plan.engine_findings)


def test_a_vllm_share_below_its_weights_cannot_start() -> None:
    plan = plan_run(qwen_plan("use_vllm=true", "vllm_gpu_memory_utilization=0.1"))  # 8 GiB < 14.2 GiB
    assert not plan.chosen.fits and plan.chosen.peak < 0.9 * 80 * 2**30
    assert any("it cannot start" in line for line in plan.engine_findings)


def test_vllm_needs_room_for_one_sequence_of_its_model_length() -> None:
    """Qwen2.5-7B's 131072 positions take 7 GiB of KV cache; 0.2 of 80 GiB leaves 1.8 GiB after the weights."""
    plan = plan_run(qwen_plan("use_vllm=true", "vllm_gpu_memory_utilization=0.2"))
    assert not plan.chosen.fits and any("one sequence of its model length (131072" in line
                                        for line in plan.engine_findings)
    assert plan_run(qwen_plan("use_vllm=true", "vllm_gpu_memory_utilization=0.2",
                              "vllm_max_model_length=1024")).chosen.fits


def test_seed_case_colocated_vllm_fits_with_parameters_offloaded_and_says_what_its_own_offload_needs(
        seed_models) -> None:
    plan = plan_run(seed_run())
    meaning, *_, found = plan.engine_findings
    assert "as much as gathering holds (22.1 GiB)" in meaning and "makes generation faster, not smaller" in meaning
    assert found.startswith("vLLM fits colocated with vllm_tensor_parallel_size 2") and "offload opt+par:" in found
    own = found.split("with the run's own offload (opt) the least, ")[1]
    assert own.startswith("vLLM 0.33 TP4 sleep, sync no-gather, optimizer->cpu, needs 21.5 GiB of the 21.3 GiB")
    assert not any(c.fits for c in plan.columns if c.candidate.engine_settings and c.candidate.offload_params == "none")
    fit = plan_run(seed_run(offload_params=("--offload-params", "cpu")))
    assert "offload opt+par:" in fit.engine_findings[-1] and "the run's own offload" not in fit.engine_findings[-1]


def test_gather_auto_with_vllm_sizes_the_sync() -> None:
    run, plan = planned(qwen_plan("use_vllm=true", gather="auto"))
    assert run.value("ds3_gather_for_generation") is True and plan.chosen.candidate.engine_settings is not None
    assert run.settings["ds3_gather_for_generation"].source.startswith("rlhf plan: syncing vLLM the whole policy")


@pytest.mark.parametrize("installed", [True, False], ids=["vllm installed", "no vllm"])
def test_gather_auto_takes_vllm_where_left_open_and_installed(installed: bool, monkeypatch) -> None:
    monkeypatch.setattr(vllm_plan, "installed", lambda spec: ("vllm", "0.30.0") if installed else None)
    sets = ("vllm_enable_sleep_mode=true", "vllm_tensor_parallel_size=4", "vllm_gpu_memory_utilization=0.25",
            "vllm_max_model_length=1024")
    small = {**QWEN_HARDWARE, "gpu_memory": ("--gpu-memory", "24GiB"),
             "offload_optimizer": ("--offload-optimizer", "cpu")}
    plan = plan_run(qwen_plan(*sets, hardware=small))
    assert not plan.column(WHOLE, "cpu", "none").fits  # gathering to generate does not fit
    run, plan = planned(qwen_plan(*sets, hardware=small, gather="auto"))
    if installed:
        assert run.value("use_vllm") is True and plan.chosen.candidate.engine_settings is not None and plan.chosen.fits
        assert "the engine left open" in run.settings["use_vllm"].source
        assert run.generation.engine == Engine.colocate and run.value("vllm_mode") == "colocate"
    else:
        assert run.value("use_vllm") is False and plan.chosen.candidate.engine_settings is None
        assert run.generation.engine == Engine.hf
    asked = planned(qwen_plan(*sets, "use_vllm=false", hardware=small, gather="auto"))[1]
    assert asked.chosen.candidate.engine_settings is None  # a run that says no to vLLM never gets it


def test_published_runs_get_their_verdicts(tmp_path: Path, monkeypatch) -> None:
    """benchmarks/plan_published.py: every published run's verdict, and its vLLM figures within 15%."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import plan_published
    from _common import cache_model_configs

    cache_model_configs(tmp_path / "hub", plan_published.HUB_MODELS)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    replays = [plan_published.replay(row, tmp_path / f"row-{index}.yaml")
               for index, row in enumerate(plan_published.ROWS)]
    assert [r.fits for r in replays] == [r.row.ran for r in replays]
    vllm_rows_measured = [r for r in replays if "vLLM" in r.row.setup and r.row.published_gib]
    assert len(vllm_rows_measured) == 2
    for replayed in vllm_rows_measured:
        assert abs(replayed.predicted / 2**30 - replayed.row.published_gib) <= 0.15 * replayed.row.published_gib


def test_rlhf_plan_plans_the_seed_with_vllm_keys(cli, seed_models) -> None:
    """The seed through RLOO's vLLM keys (PPO's config has none yet), TP 4, sleep and the parameters offloaded."""
    args = ("plan", "rloo", "-r", RECIPES / "rloo" / "pythia-12b-descriptiveness.yaml", "--gpu-memory", "23.7GiB",
            "--num-gpus", "4", "--no-gather", "--offload-params", "cpu", "--set", "use_vllm=true",
            "--set", "vllm_tensor_parallel_size=4", "--set", "vllm_enable_sleep_mode=true",
            "--set", "vllm_gpu_memory_utilization=0.33", "--json")
    result = cli(*map(str, args))
    assert result.exit_code == 0, result.output
    chosen = next(c for c in json.loads(result.stdout)["configurations"] if c["chosen"])
    assert chosen["engine"] == "vllm" and chosen["fits"] and chosen["vllm"]["tensor_parallel_size"] == 4
    assert chosen["components"]["vLLM"] == vllm.SLEEP_RESIDUAL and chosen["components"]["gen weights"] == 0

def test_a_run_with_tools_is_planned_as_prompt_plus_completion_and_says_so() -> None:
    """TRL appends tool results to the completion and caps both at max_completion_length: the sequence the plan
    counts is still prompt + completion, and a note says what the two hold; without tools, no note."""
    agent = plan_run(resolve(RunRequest("grpo", "grpo/agent-smoke", {"gpu_memory": ("--gpu-memory", "8GiB")}),
                             cuda=False))
    assert (agent.work.prompt_length, agent.work.completion_length, agent.work.train_sequence) == (256, 64, 320)
    assert "tools: sequences counted as prompt (256 tokens, tools' schemas included) + completion (64 tokens: " \
           "generated text and tool results together, as TRL caps them)" in agent.notes
    unset = plan_run(resolve(RunRequest("grpo", "grpo/agent-smoke", {"gpu_memory": ("--gpu-memory", "8GiB")},
                                        ("plan_prompt_length=null",)), cuda=False))
    assert any("the default: set plan_prompt_length to the prompt as rendered" in note for note in unset.notes)
    plain = plan_run(resolve(RunRequest("grpo", "grpo/smoke", {"gpu_memory": ("--gpu-memory", "8GiB")}), cuda=False))
    assert not any(note.startswith("tools:") for note in plain.notes)

def test_the_plan_of_any_depth_handles_alike_layers_once() -> None:
    """100,000 decoder layers adapted alike are one group (the plan stays under a second: benchmarks/plan_depth.py);
    a pattern naming one layer splits them, with the same totals as counting layer by layer."""
    from rlhf_cli.plan.model_sizes import LoraSettings, adapter_size

    config = {**json.loads((RECIPES / "smoke" / "policy" / "config.json").read_text()), "num_hidden_layers": 100_000}
    deep = adapter_size(config, LoraSettings(rank=8, targets=["q_proj", "v_proj"]))
    assert [(tuple(m.name for m in modules), count) for modules, count in deep.layers] == \
        [(("q_proj", "v_proj"), 100_000)]
    one = adapter_size({**config, "num_hidden_layers": 3},
                       LoraSettings(rank=8, targets=r"model\.layers\.1\.self_attn\.(q|v)_proj"))
    assert sorted((len(modules), count) for modules, count in one.layers) == [(0, 2), (2, 1)]
    assert one.params * 100_000 == deep.params  # two adapters in one layer, against two in each of 100,000


def test_a_20000_layer_plan_is_not_quadratic_in_the_depth(tmp_path: Path) -> None:
    """Every dry run and launch plans: the plan of 20,000 decoder layers, vLLM and gather budgets timed on a GPU,
    takes seconds, not minutes (it took 258 s when every budget re-counted every layer). The bound is generous
    for a loaded machine; benchmarks/plan_depth.py measures the real time."""
    import time as clock

    config = {**json.loads((RECIPES / "smoke" / "policy" / "config.json").read_text()), "num_hidden_layers": 20_000}
    write(tmp_path / "deep" / "config.json", json.dumps(config))
    flags = {"model_name_or_path": ("--model", str(tmp_path / "deep")), "gpu": ("--gpu", "h100"),
             "gpu_memory": ("--gpu-memory", "160GB")}
    started = clock.perf_counter()
    _, plan = planned(resolve(RunRequest("rloo", "rloo/smoke", flags, ("gather=auto",), planning=True), cuda=False))
    elapsed = clock.perf_counter() - started
    assert plan.known and plan.chosen is not None and plan.chosen.step_seconds is not None
    assert elapsed < 15, f"planning 20,000 layers took {elapsed:.1f} s"


def test_the_recipes_env_block_names_the_hub_cache_the_plan_reads(tmp_path: Path) -> None:
    cache_model("org/model", "pythia-70m")
    moved = Path(os.environ["HF_HOME"]) / "hub"
    elsewhere = tmp_path / "elsewhere"
    moved.rename(elsewhere)  # the model is only in the cache the ranks will use
    path = write(tmp_path / "r.yaml", f"model_name_or_path: org/model\nreward_model_name_or_path: org/model\n"
                                      f"dataset_name: {RECIPES}/smoke/prompts.jsonl\n"
                                      f"env:\n  HF_HUB_CACHE: {elsewhere}\n")
    run = resolve(RunRequest("rloo", str(path), planning=True), cwd=tmp_path, cuda=False)
    policy = next(role for role in plan_run(run).roles if role.name == "policy")
    assert policy.size.params > 0 and policy.path == "org/model"
