"""The memory plan: parameter counts, DeepSpeed's formulas, GPU detection, `rlhf plan` and `--gather auto`."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import pytest

from conftest import RECIPES, REPO, write
from rlhf_cli.config.resolve import RunRequest, resolve
from rlhf_cli.errors import ConfigError
from rlhf_cli.plan import memory
from rlhf_cli.plan.estimate import choose_gather, plan_run
from rlhf_cli.plan.gpus import SizeError, available_ram, detect_hardware, parse_size
from rlhf_cli.plan.models import ModelConfigUnavailable, find_config, model_size, read_config

FIXTURES = REPO / "tests" / "fixtures" / "models"
SEED = RECIPES / "ppo" / "pythia-12b-descriptiveness.yaml"
SEED_HARDWARE = {"gpu_memory": ("--gpu-memory", "23.7GiB"), "num_gpus": ("--num-gpus", 4)}
COMMIT = "a" * 40
pytestmark = pytest.mark.usefixtures("nothing_launches")  # no test here starts ranks


def cache_model(repo_id: str, fixture: str, commit: str = COMMIT, ref: str = "main") -> Path:
    """Put a fixture's config.json into the hub cache of this test's HF_HOME, as `hf download` lays it out."""
    repo = Path(os.environ["HF_HOME"]) / "hub" / f"models--{repo_id.replace('/', '--')}"
    write(repo / "refs" / ref, commit)
    snapshot = write(repo / "snapshots" / commit / "config.json", (FIXTURES / fixture / "config.json").read_text())
    return snapshot


@pytest.fixture
def seed_models() -> None:
    cache_model("EleutherAI/pythia-12b", "pythia-12b")
    cache_model("EleutherAI/pythia-70m", "pythia-70m")


def seed_run(**flags):
    return resolve(RunRequest("ppo", str(SEED), {**SEED_HARDWARE, **flags}), cuda=True)


# -- parameter counts --------------------------------------------------------------------------------------

TINY = {"vocab_size": 320, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "max_position_embeddings": 128}
ARCHITECTURES = {
    "pythia-12b": json.loads((FIXTURES / "pythia-12b" / "config.json").read_text()),
    "pythia-70m": json.loads((FIXTURES / "pythia-70m" / "config.json").read_text()),
    "llama-gqa": {**TINY, "model_type": "llama", "num_key_value_heads": 2},
    "llama-tied-bias": {**TINY, "model_type": "llama", "tie_word_embeddings": True, "attention_bias": True,
                        "mlp_bias": True},
    "mistral": {**TINY, "model_type": "mistral", "num_key_value_heads": 1, "head_dim": 32},
    "qwen2": {**TINY, "model_type": "qwen2", "num_key_value_heads": 2},
    "qwen3": {**TINY, "model_type": "qwen3", "num_key_value_heads": 2, "head_dim": 24},
    "gpt2": {"model_type": "gpt2", "vocab_size": 320, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 96},
}


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


# -- DeepSpeed's own estimator -------------------------------------------------------------------------------

def test_model_states_equal_deepspeeds_estimator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

    sizes = [model_size(ARCHITECTURES[name]) for name in ("pythia-12b", "pythia-70m")]
    for size, gpus, machines, optimizer, params, zero_init in itertools.product(
            sizes, (1, 4, 8), (1, 3), (True, False), (True, False), (True, False)):
        theirs = estimate_zero3_model_states_mem_needs(
            size.params, size.largest_layer, num_gpus_per_node=gpus, num_nodes=machines, cpu_offload=optimizer,
            cpu_offload_params=params, zero_init=zero_init)
        ours = memory.zero3_model_states(size.params, size.largest_layer, gpus, machines, offload_optimizer=optimizer,
                                         offload_params=params, zero_init=zero_init)
        assert ours == theirs[:2], (size.params, gpus, machines, optimizer, params, zero_init)


# -- the formulas ------------------------------------------------------------------------------------------

def test_generation_weights_without_gathering_are_bounded_by_what_zero3_keeps_live() -> None:
    big, small = 12_000_000_000, 70_000_000
    assert memory.generation_weights(big, 2, True, 10**9, 5 * 10**7) == 2 * big
    assert memory.generation_weights(big, 2, False, 10**9, 5 * 10**7) == 2 * (10**9 + 5 * 10**7)
    # below stage3_max_live_parameters nothing is released: no-gather holds the whole model, as gather does
    assert memory.generation_weights(small, 2, False, 10**9, 5 * 10**7) == memory.generation_weights(
        small, 2, True, 10**9, 5 * 10**7)


def test_gradient_checkpointing_shrinks_activations_and_the_peak_takes_the_larger_phase() -> None:
    size = model_size(ARCHITECTURES["pythia-12b"])
    full = memory.activations(size, 2, 512, 2, checkpointing=False)
    assert memory.activations(size, 2, 512, 2, checkpointing=True) < full / 5
    assert memory.activations(size, 4, 512, 2, checkpointing=False) == 2 * full
    rows = [memory.Component("a", memory.STATIC, 10), memory.Component("b", memory.GENERATION, 5),
            memory.Component("c", memory.GENERATION, 4), memory.Component("d", memory.TRAINING, 7)]
    assert memory.peak(rows) == 10 + 9


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
    gather, no_gather = plan.column(True, "cpu", "none"), plan.column(False, "cpu", "none")
    assert gather.chosen and not gather.fits
    assert no_gather.fits and not no_gather.chosen
    assert gather.peak - no_gather.peak > 19 * 2**30  # 22.1 GiB gathered vs 2.3 GiB (1e9 live + the embedding)
    assert {role.name for role in plan.roles} == {"policy", "reference", "reward", "value"}
    assert plan.work.prompt_length == 64 and plan.work.completion_length == 53 and plan.work.train_batch == 1
    assert any(s.startswith("no-gather, optimizer->cpu fits") for s in plan.suggestions)


def test_seed_case_gather_auto_picks_no_gather(seed_models) -> None:
    run = seed_run(ds3_gather_for_generation=("--gather auto", "auto"))
    setting = run.settings["ds3_gather_for_generation"]
    assert setting.value is False
    assert setting.source.startswith("rlhf plan: gathering needs") and "of 23.7 GiB" in setting.source
    assert any(note.startswith("gather: auto -> no-gather") for note in run.notes)


def test_gather_auto_with_nothing_that_fits_says_what_would(seed_models) -> None:
    with pytest.raises(ConfigError) as caught:
        seed_run(ds3_gather_for_generation=("--gather auto", "auto"), gpu_memory=("--gpu-memory", "12GiB"))
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
                 "does not fit"):
        assert text in table.stdout, text
    data = json.loads(cli(*args, "--json").stdout)
    chosen = [c for c in data["configurations"] if c["chosen"]]
    assert len(data["configurations"]) == 6 and len(chosen) == 1 and chosen[0]["label"] == "gather, optimizer->cpu"
    assert chosen[0]["fits"] is False and data["models"]["policy"]["params"] == 11_846_072_320
    assert sum(chosen[0]["components"].values()) >= chosen[0]["peak_gpu"]


def test_plan_commands_take_exactly_the_training_flags(cli) -> None:
    def options(*command: str) -> set[str]:
        return {word.strip(",") for word in cli(*command, "--help").output.split() if word.startswith("--")}

    assert {"ppo", "rloo", "online-dpo"} <= set(cli("plan", "--help").output.split())
    for command in ("ppo", "rloo", "online-dpo"):
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
    assert launched.exit_code == 0 and "plan       gathering (gather, no offload) needs" in launched.stderr
    dry = cli("rloo", "-r", "rloo/smoke", "--no-gather", "--dry-run")
    assert dry.stderr.startswith("plan: generating from shards") and "plan:" not in dry.stdout


@pytest.mark.parametrize(("args", "message"), [
    (["auto"], "unexpected argument 'auto'; did you mean --gather auto?"),
    (["--no-gather", "auto"], "unexpected argument 'auto'; did you mean --gather auto?"),
    (["--gather", "always"], "--gather takes no value but auto, got 'always'"),
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
    assert roles("ppo", "reward_model_name_or_path=null", "reward_funcs=[tests.fixtures.rewards:letter_e]")["value"] \
        == "EleutherAI/pythia-12b"


def test_choose_gather_on_a_non_zero3_config_names_the_fix(tmp_path: Path) -> None:
    config = write(tmp_path / "ddp.yaml", "distributed_type: MULTI_GPU\nnum_processes: 2\n")
    run = resolve(RunRequest("rloo", "rloo/smoke", {"accelerate_config": ("--accelerate-config", str(config))}))
    assert not plan_run(run).known
    with pytest.raises(ConfigError, match="not DeepSpeed ZeRO-3.*pass --gather or --no-gather"):
        choose_gather(run)


def test_gather_auto_in_a_recipe(tmp_path: Path) -> None:
    recipe = write(tmp_path / "auto.yaml", (RECIPES / "rloo" / "smoke.yaml").read_text().replace(
        "gather: true", "gather: auto").replace("../smoke/", f"{RECIPES}/smoke/"))
    run = resolve(RunRequest("rloo", str(recipe), {"gpu_memory": ("--gpu-memory", "24GiB")}))
    assert run.value("ds3_gather_for_generation") is True
    source = run.settings["ds3_gather_for_generation"].source
    assert source.startswith("rlhf plan: gathering needs") and source.endswith("of 24.0 GiB")


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
