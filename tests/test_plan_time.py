"""The time plan: the GPU table and its flags, seconds per phase for every configuration, `gather: auto` taking
the fastest that fits, and vLLM's sync bucket left to the plan when no gather choice is given."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from helpers import RECIPES, SEED, SEED_HARDWARE, cache_model, write
from rlhf_cli.config.engines.vllm import SYNC_DEFAULT_SOURCE
from rlhf_cli.config.resolve import RunRequest, resolve
from rlhf_cli.errors import ConfigError
from rlhf_cli.generation.budget import Budget
from rlhf_cli.generation.choice import Engine, Gather, Generation
from rlhf_cli.generation.sync_buckets import PER_UNIT, WHOLE, bucket_limit, bucket_sizes, buckets
from rlhf_cli.machine import gpus
from rlhf_cli.phases import Phase
from rlhf_cli.plan import fixed_costs, rates, time
from rlhf_cli.plan.columns import Candidate
from rlhf_cli.plan.estimate import components, plan_run, planned
from rlhf_cli.plan.inputs import read_inputs
from rlhf_cli.plan.summary import time_lines

pytestmark = pytest.mark.usefixtures("nothing_launches")  # no test here starts ranks


@pytest.fixture(autouse=True)
def timed_models(seed_models) -> None:
    cache_model("Qwen/Qwen2.5-7B", "qwen2.5-7b")


def timed_seed_run(gpu: str = "rtx3090", *sets: str, **flags):
    hardware = {**SEED_HARDWARE, "gpu": ("--gpu", gpu), **flags}
    return resolve(RunRequest("ppo", str(SEED), hardware, sets, planning=True), cuda=True)


def qwen_run(*sets: str, gpu: str = "h100", recipe: Path = RECIPES / "rloo" / "pythia-12b-descriptiveness.yaml",
             **flags):
    """RLOO of Qwen2.5-7B on 8 GPUs of 80 GB: the shape of a published GRPO/RLOO run."""
    hardware = {"gpu_memory": ("--gpu-memory", "80GiB"), "num_gpus": ("--num-gpus", 8), "gpu": ("--gpu", gpu),
                **flags}
    return resolve(RunRequest("rloo", str(recipe), hardware, ("model_name_or_path=Qwen/Qwen2.5-7B", *sets),
                              planning=True), cuda=True)


# -- the GPU table ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("smi", "memory_gib", "key"), [
    ("NVIDIA GeForce RTX 3090", 24, "rtx3090"), ("NVIDIA GeForce RTX 4090", 24, "rtx4090"),
    ("NVIDIA A100-SXM4-40GB", 40, "a100-40gb"), ("NVIDIA A100-SXM4-80GB", 80, "a100-80gb"),
    ("NVIDIA A100 80GB PCIe", 80, "a100-pcie"), ("NVIDIA H100 80GB HBM3", 80, "h100"),
    ("NVIDIA H100 PCIe", 80, "h100-pcie"), ("NVIDIA H200", 141, "h200"), ("NVIDIA B200", 180, "b200"),
    ("NVIDIA A10", 24, "a10"), ("NVIDIA L4", 23, "l4"), ("NVIDIA L40S", 46, "l40s"),
])
def test_nvidia_smi_names_find_their_gpu(smi: str, memory_gib: int, key: str) -> None:
    assert gpus.from_smi_name(smi, memory_gib * 2**30) == gpus.GPUS[key]
    assert gpus.from_smi_name("NVIDIA T4", 16 * 2**30) is None


def test_table_rates_are_dense_bf16_and_links_as_sold() -> None:
    h100, rtx = gpus.GPUS["h100"], gpus.GPUS["rtx3090"]
    assert h100.bf16_flops == 989e12 and h100.interconnect == "nvlink" and h100.interconnect_bandwidth == 450e9
    # GeForce cards have no peer-to-peer: NCCL crosses PCIe twice, through host memory
    assert rtx.interconnect == "pcie" and rtx.interconnect_bandwidth == rtx.host_bandwidth / 2
    assert gpus.named("RTX 3090") == gpus.named("3090") == rtx and gpus.named("a100") == gpus.GPUS["a100-80gb"]
    assert gpus.with_interconnect(rtx, "56GB").interconnect_bandwidth == 56e9
    assert gpus.with_interconnect(h100, "pcie").interconnect_bandwidth == h100.host_bandwidth
    with pytest.raises(gpus.HardwareError, match="no NVLink rate"):
        gpus.with_interconnect(rtx, "nvlink")


def test_bad_gpu_interconnect_and_hardware_file_are_one_line_each(cli, tmp_path: Path) -> None:
    result = cli("plan", "ppo", "-r", SEED, "--gpu", "rtx9090", "--interconnect", "fast",
                 "--hardware", tmp_path / "none.yaml")
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    assert "`gpu`: unknown GPU 'rtx9090'; known: a10, l4" in text
    assert "`interconnect`: --interconnect 'fast': write nvlink, pcie, or a rate" in text
    assert "`hardware_file`: --hardware" in text and "cannot be read" in text
    assert "`gpu` and `hardware_file` both name the GPU; keep one" in text


def test_a_hardware_file_describes_a_gpu_the_table_lacks(tmp_path: Path) -> None:
    spec = write(tmp_path / "t4.yaml", "name: T4\nbf16_tflops: 65\nmemory_bandwidth_gbs: 320\n"
                                       "interconnect: pcie\ninterconnect_gbs: 15.75\nhost_gbs: 15.75\n")
    plan = plan_run(resolve(RunRequest("ppo", str(SEED), {**SEED_HARDWARE, "hardware_file": ("--hardware", str(spec))},
                                       planning=True), cuda=True))
    assert plan.hardware.gpu == gpus.Gpu("T4", 65e12, 320e9, "pcie", 15.75e9, 15.75e9)
    with pytest.raises(gpus.HardwareError, match="missing host_gbs; unknown speed"):
        gpus.from_file(write(tmp_path / "bad.yaml", "name: X\nbf16_tflops: 1\nmemory_bandwidth_gbs: 1\n"
                                                    "interconnect: pcie\ninterconnect_gbs: 1\nspeed: 3\n"))


# -- seconds per phase -----------------------------------------------------------------------------------------

def test_the_seed_plan_times_every_configuration_and_names_the_fastest(cli) -> None:
    """4 x RTX 3090 over PCIe: generating from shards fetches the whole policy over PCIe for every token, so
    no-gather's generation is many times gathering's; the plan names the fastest configuration that fits."""
    args = ("plan", "ppo", "-r", SEED, "--gpu-memory", "23.7GiB", "--num-gpus", "4", "--gpu", "rtx3090")
    data = json.loads(cli(*args, "--json").stdout)
    for column in data["configurations"]:
        assert list(column["time"]) == list(Phase)
        assert column["step_seconds"] == pytest.approx(sum(column["time"].values()), rel=1e-4)
        assert column["time"]["waiting"] == 0
    by_label = {column["label"]: column for column in data["configurations"]}
    gathered, sharded = by_label["gather, optimizer->cpu"], by_label["no-gather, optimizer->cpu"]
    assert sharded["time"]["generation"] > 5 * gathered["time"]["generation"]
    # the gather choice is generation's, but for the persistent modules a gather releases: fetched again in training
    assert 0 < gathered["time"]["training"] - sharded["time"]["training"] < 1e-3 * sharded["time"]["training"]
    assert gathered["time"]["weight_sync"] == 0 and by_label["vLLM 0.3 TP1, sync gather, no offload"][
        "time"]["weight_sync"] > 0
    fitting = [column for column in data["configurations"] if column["fits"]]
    fastest = min(fitting, key=lambda column: column["step_seconds"])
    assert data["fastest"] == fastest["label"] and data["gpu"]["name"] == "RTX 3090"
    assert data["smallest"] == min(fitting, key=lambda column: column["peak_gpu"])["label"]
    table = " ".join(cli(*args).stdout.split())
    assert f"fastest that fits: {fastest['label']}:" in table and "per 100 steps" in table
    assert "smallest that fits: no-gather, opt+params->cpu" in table and "s per step" in table


def test_without_a_gpu_the_plan_says_how_to_get_seconds(monkeypatch) -> None:
    monkeypatch.setattr(gpus, "nvidia_smi", lambda fields: [])
    plan = plan_run(resolve(RunRequest("ppo", str(SEED), dict(SEED_HARDWARE), planning=True), cuda=True))
    assert plan.hardware.gpu is None and all(column.seconds is None for column in plan.columns)
    assert plan.as_dict()["fastest"] is None and plan.as_dict()["configurations"][0]["time"] is None
    (line,) = time_lines(plan)
    assert "rlhf doctor --calibrate" in line and "--gpu NAME" in line
    assert time.final_save_seconds(plan) is None  # the running job's ETA then counts no save until it measures one


def test_the_final_save_a_running_jobs_eta_counts_is_the_policys_weights_and_a_saves_fixed_calls() -> None:
    run = timed_seed_run("h100", "max_steps=100")
    inputs = read_inputs(run)
    weights = inputs.roles[0].size.params * inputs.work.element_bytes
    expected = weights / time.DISK_BANDWIDTH + fixed_costs.SAVE_CALLS * rates.CALL_LATENCY
    assert time.final_save_seconds(plan_run(run)) == pytest.approx(expected)


def test_a_running_jobs_eta_starts_from_the_plans_step_only_when_the_plan_timed_this_machine(monkeypatch) -> None:
    """Calibrated here: the chosen configuration's seconds by step phase (training's phases summed as the ranks
    measure them), handed to the ranks as JSON; a GPU named for another machine gives the ETA nothing."""
    from rlhf_cli.launch.faults import PlanNeeds
    from rlhf_cli.launch.runner import _plan_env
    from rlhf_cli.machine import calibration
    from rlhf_cli.output.run_dir import PLANNED_STEP_ENV

    measured = calibration.Calibration("cpu", 240e9, 87.5e9, 0.4e9, 0.5e-3, "gloo", 0.0, "here", 5e-6)
    monkeypatch.setattr("rlhf_cli.plan.hardware.remembered", lambda: measured)
    monkeypatch.setattr("rlhf_cli.plan.hardware.detected", lambda: (None, ""))
    plan = plan_run(resolve(RunRequest("rloo", "rloo/smoke", {}, planning=True), cuda=False))
    steps = time.planned_step_seconds(plan)
    seconds = plan.chosen.seconds
    assert steps == pytest.approx({"generation": seconds["generation"], "sync": seconds["weight_sync"],
                                   "train": seconds["scoring"] + seconds["training"] + seconds["optimizer_step"]})
    assert json.loads(_plan_env(PlanNeeds(step_seconds=steps))[PLANNED_STEP_ENV]) == steps
    assert PLANNED_STEP_ENV not in _plan_env(PlanNeeds())
    assert time.planned_step_seconds(plan_run(timed_seed_run("h100"))) is None


def _seconds(run, candidate_of) -> dict[str, float]:
    inputs = read_inputs(run)
    plan = plan_run(run)
    candidate = candidate_of(plan.chosen.candidate)
    return time.step_time(inputs, candidate, inputs.hardware.gpu, plan.checkpoint_bytes)


def test_decode_is_bandwidth_bound_and_fetches_ride_the_interconnect() -> None:
    """Gathered, HF generation is bound by memory bandwidth (and launch overhead); from shards, by the link the
    whole policy crosses every token: NVLink makes no-gather an order of magnitude faster than PCIe."""
    run = timed_seed_run("rtx3090", "gather=true")
    gathered = _seconds(run, lambda c: c)["generation"]
    sharded_pcie = _seconds(run, lambda c: replace(c, generation=Generation(Gather.shards)))["generation"]
    nvlink = timed_seed_run("rtx3090", "gather=true", interconnect=("--interconnect", "300GB"))
    sharded_nvlink = _seconds(nvlink, lambda c: replace(c, generation=Generation(Gather.shards)))["generation"]
    assert sharded_pcie > 5 * sharded_nvlink and sharded_nvlink > gathered
    budget = _seconds(run, lambda c: replace(c, generation=Generation(Gather.of(Budget(fraction=0.5)))))
    assert gathered < budget["generation"] < sharded_pcie
    faster_memory = _seconds(timed_seed_run("a100-80gb", "gather=true"), lambda c: c)["generation"]
    assert faster_memory < gathered  # 2039 GB/s against 936


def test_overlap_comm_false_puts_zero3s_fetches_after_the_compute_instead_of_beside_it() -> None:
    """`overlap_comm: false` (ms-swift's ZeRO-3 configs set it): DeepSpeed fetches on the compute stream, so the
    plan adds each forward's fetch to its compute where it otherwise takes the larger; generating from the shards
    and training both slow down, and the key reaches the DeepSpeed config's zero_optimization section."""
    from rlhf_cli.rank.zero3 import apply_zero3_settings

    default, exposed = (timed_seed_run("rtx3090", "gather=false", *given) for given in ((), ("overlap_comm=false",)))
    assert exposed.group("zero3") == {"overlap_comm": False} and default.group("zero3") == {}
    before, after = (_seconds(run, lambda c: c) for run in (default, exposed))
    assert after["generation"] > before["generation"] and after["training"] > before["training"]
    assert after["optimizer_step"] == before["optimizer_step"]
    inputs = read_inputs(exposed)
    assert time.overlapped(inputs, 2.0, 3.0) == 5.0 and time.overlapped(read_inputs(default), 2.0, 3.0) == 3.0

    class Config:
        deepspeed_plugin = type("Plugin", (), {"deepspeed_config": {"zero_optimization": {"stage": 3}}})()

    apply_zero3_settings(Config, exposed.group("zero3"))
    assert Config.deepspeed_plugin.deepspeed_config["zero_optimization"] == {"stage": 3, "overlap_comm": False}


def test_a_frozen_model_offloaded_on_its_own_fetches_its_shards_from_host_memory_every_forward() -> None:
    """A reward (or distillation teacher) under a DeepSpeed config of its own with its parameters offloaded: each of
    its forwards first brings every GPU's shard over the host link; nothing else changes, and its shard leaves the
    GPU for host memory. Short sequences of a 14B model: the fetch, not the matmuls, bounds each forward."""
    cache_model("Qwen/Qwen2.5-14B-Instruct", "qwen2.5-14b")
    run = qwen_run("reward_model_name_or_path=Qwen/Qwen2.5-14B-Instruct", gpu="a100-80gb")
    inputs, plan = read_inputs(run), plan_run(run)
    candidate, gpu = plan.chosen.candidate, inputs.hardware.gpu
    offloaded = replace(inputs, roles=[replace(role, offloaded=role.name == "reward") for role in inputs.roles])
    kept, moved = (time.step_time(i, candidate, gpu, plan.checkpoint_bytes) for i in (inputs, offloaded))
    work, reward = inputs.work, inputs.role("reward").size
    forwards = run.value("per_device_train_batch_size") * run.value("gradient_accumulation_steps") / work.score_batch
    over_host = forwards * reward.params * work.element_bytes / inputs.hardware.total_gpus / gpu.host_bandwidth
    assert moved["scoring"] - kept["scoring"] == pytest.approx(over_host, rel=1e-6) and over_host > 0.5
    assert {phase: s for phase, s in moved.items() if phase != "scoring"} == \
        {phase: s for phase, s in kept.items() if phase != "scoring"}
    shard = {i is offloaded: next(row for row in components(i, candidate) if row.name == "reward shard")
             for i in (inputs, offloaded)}
    assert shard[False].gpu > 0 and shard[False].cpu == 0 and shard[True].gpu == 0 and shard[True].cpu > 0


def test_offloading_the_optimizer_moves_adam_to_the_cpu_and_nvme_is_slower_still() -> None:
    run = timed_seed_run("a100-80gb", "gather=true")
    on = {device: _seconds(run, lambda c, d=device: replace(c, offload_optimizer=d))["optimizer_step"]
          for device in ("none", "cpu", "nvme")}
    assert on["none"] < on["cpu"] < on["nvme"]


def test_saving_is_the_checkpoints_the_run_writes_and_its_final_model_over_its_steps() -> None:
    """100 steps: a checkpoint every 10 steps is 10 checkpoints, every 100 one, none without saving; the final
    model's weights are written whatever the strategy. Spread over the steps at the disk's rate."""
    def saving(*sets: str) -> float:
        return _seconds(timed_seed_run("h100", "max_steps=100", *sets), lambda c: c)["saving"]

    every_ten, every_hundred, never = saving("save_steps=10"), saving("save_steps=100"), saving("save_strategy='no'")
    assert never > 0 and every_ten - never == pytest.approx(10 * (every_hundred - never))
    inputs = read_inputs(timed_seed_run("h100", "max_steps=100"))
    final = inputs.roles[0].size.params * inputs.work.element_bytes
    per_save = fixed_costs.SAVE_CALLS * rates.CALL_LATENCY  # each save's fixed cost, its bytes aside
    assert never == pytest.approx((final / time.DISK_BANDWIDTH + per_save) / 100)


def test_fixed_costs_follow_the_calibrated_call_and_dominate_a_tiny_model_not_a_large_one(monkeypatch) -> None:
    """Eager PyTorch's fixed costs are counted in module calls: twice the calibrated call, about twice the smoke
    recipe's gathered generation and optimizer step (its 2-layer models are almost all fixed cost), while a 7B
    model's step on H100s moves by under a tenth."""
    from rlhf_cli.machine import calibration

    def smoke(call: float) -> dict[str, float]:
        measured = calibration.Calibration("cpu", 240e9, 87.5e9, 0.4e9, 0.5e-3, "gloo", 0.0, "here", call)  # 2 cores
        monkeypatch.setattr("rlhf_cli.plan.hardware.remembered", lambda: measured)
        monkeypatch.setattr("rlhf_cli.plan.hardware.detected", lambda: (None, ""))
        run = resolve(RunRequest("rloo", "rloo/smoke", {}, planning=True), cuda=False)
        return _seconds(run, lambda c: c)

    fast, slow = smoke(5e-6), smoke(10e-6)
    for phase in ("generation", "optimizer_step"):  # the gathered policy's generate; the step's own work
        assert 1.6 < slow[phase] / fast[phase] <= 2.0, phase
    assert slow["scoring"] > fast["scoring"] and slow["training"] > fast["training"]  # beside ZeRO-3's fetches
    big = qwen_run("gather=true")
    default = sum(_seconds(big, lambda c: c).values())
    monkeypatch.setattr(rates, "CALL_LATENCY", 2 * rates.CALL_LATENCY)
    monkeypatch.setattr(rates.Rates, "call", 2 * rates.CALL_LATENCY)
    assert default < sum(_seconds(big, lambda c: c).values()) < 1.1 * default  # HF decode's launches, mostly


def test_vllm_generates_faster_than_hf_and_larger_sync_buckets_sync_faster() -> None:
    run = qwen_run("use_vllm=true", "gather=true")
    vllm_seconds = _seconds(run, lambda c: c)
    hf_seconds = _seconds(run, lambda c: replace(c, generation=Generation(Gather.whole), engine_settings=None))
    assert vllm_seconds["generation"] < hf_seconds["generation"] and hf_seconds["weight_sync"] == 0
    per_unit = _seconds(run, lambda c: replace(c, generation=Generation(Gather.shards, Engine.colocate)))
    assert per_unit["weight_sync"] > vllm_seconds["weight_sync"] > 0


@pytest.mark.parametrize(("sets", "served"), [((), True), (("use_dora=true",), False)], ids=["lora", "dora"])
def test_a_lora_columns_colocated_vllm_that_serves_the_adapters_syncs_them_alone(sets: tuple[str, ...],
                                                                                 served: bool) -> None:
    """vLLM's LoRA serves plain LoRA: after the first sync only the adapters go (the candidate's buckets counted
    over the adapters alone), a sync far faster than of the merged policy, colocated or to a server (`rlhf
    vllm-serve --lora`); DoRA it cannot serve."""
    run = qwen_run("use_vllm=true", "gather=true", "use_peft=true", *sets)
    inputs, plan = read_inputs(run), plan_run(run)
    assert plan.chosen.candidate.engine_settings.serves_adapters is served

    def sync(adapters_served: bool, engine: Engine = Engine.colocate) -> float:
        chosen = plan.chosen.candidate
        candidate = replace(chosen, lora=True, generation=Generation(Gather.whole, engine),
                            engine_settings=replace(chosen.engine_settings, serves_adapters=adapters_served))
        return time.step_time(inputs, candidate, inputs.hardware.gpu, plan.checkpoint_bytes)["weight_sync"]

    assert sync(True) < sync(False) and sync(True, Engine.server) < sync(False, Engine.server)
    alone = inputs.sync_buckets(Gather.whole, True, adapters_alone=True)
    # spread over the units by their share of the policy, as the merged count spreads them
    assert sum(numel * alike for numel, _, alike in alone) == pytest.approx(inputs.roles[0].adapter.params, rel=1e-4)
    assert inputs.roles[0].adapter.params < inputs.roles[0].size.params / 50


def test_one_bucket_packing_for_the_plan_and_the_ranks() -> None:
    assert bucket_limit(Gather.whole, 100, 2) is WHOLE and bucket_limit(Gather.shards, 100, 2) == PER_UNIT
    assert bucket_limit(Gather.of(Budget(fraction=0.5)), 100, 2) == 50
    assert bucket_limit(Gather.of(Budget(size=60)), 100, 2) == 30
    with pytest.raises(ValueError, match="settles it"):
        bucket_limit(Gather.auto, 100, 2)
    assert buckets([10, 10, 10, 40], WHOLE) == [[0, 1, 2, 3]]
    assert buckets([10, 10, 10, 40], PER_UNIT) == [[0], [1], [2], [3]]
    assert buckets([10, 10, 10, 40], 25) == [[0, 1], [2], [3]]  # a unit is never split


@pytest.mark.parametrize("limit", [WHOLE, PER_UNIT, 1, 25, 30, 45, 100, 1000])
def test_buckets_counted_by_stretches_are_the_ranks_buckets(limit) -> None:
    """The plan counts buckets over stretches of alike units (a cost that does not grow with the depth); what it
    counts must be what the ranks pack unit by unit, whatever the limit, zero-element units included."""
    import random

    rng = random.Random(limit)
    for _ in range(200):
        parts = [(rng.choice([0, 5, 10, 25, 40, 60]), rng.randint(1, 9), rng.randint(1, 12))
                 for _ in range(rng.randint(1, 5))]
        numels = [numel for numel, _, count in parts for _ in range(count)]
        modules = [each for _, each, count in parts for _ in range(count)]
        packed = [(sum(numels[i] for i in bucket), sum(modules[i] for i in bucket))
                  for bucket in buckets(numels, limit)]
        counted = [(numel, each) for numel, each, alike in bucket_sizes(parts, limit) for _ in range(alike)]
        assert counted == packed, (parts, limit)


# -- the choice ------------------------------------------------------------------------------------------------

def test_gather_auto_takes_the_fastest_that_fits() -> None:
    run, plan = planned(timed_seed_run("rtx3090", "gather=auto"))
    chosen = plan.chosen
    same = [column for column in plan.columns if column.fits and not column.candidate.lora
            and column.candidate.generation.engine == Engine.hf
            and (column.candidate.offload_optimizer, column.candidate.offload_params) == ("cpu", "none")]
    assert chosen.fits and chosen.step_seconds == min(column.step_seconds for column in same)
    assert run.generation == chosen.candidate.generation and run.generation.gather.budget is not None
    assert "the fastest that fits:" in run.settings["ds3_gather_for_generation"].source


def ungathered_recipe(folder: Path) -> Path:
    """The RLOO seed recipe with no gather choice of its own."""
    text = (RECIPES / "rloo" / "pythia-12b-descriptiveness.yaml").read_text()
    return write(folder / "rloo.yaml", "\n".join(line for line in text.splitlines() if not line.startswith("gather:")))


def test_vllm_without_a_gather_choice_leaves_the_sync_bucket_to_the_plan(cli, tmp_path: Path) -> None:
    recipe = ungathered_recipe(tmp_path)
    run = qwen_run("use_vllm=true", recipe=recipe)
    assert run.generation.gather == Gather.auto
    assert run.settings["ds3_gather_for_generation"].source == SYNC_DEFAULT_SOURCE
    settled, plan = planned(run)
    assert settled.generation.engine == Engine.colocate and settled.generation.gather != Gather.auto
    assert "no gather choice given with vLLM: the plan's" in settled.settings["ds3_gather_for_generation"].source
    given = qwen_run("use_vllm=true", "gather=false", recipe=recipe)
    assert given.generation.gather == Gather.shards  # a choice any source gives stands
    assert qwen_run(recipe=recipe).generation.gather == Gather.whole  # without vLLM, TRL's default


def test_without_a_plan_vllm_syncs_the_whole_policy_instead_of_failing(tmp_path: Path) -> None:
    run = resolve(RunRequest("rloo", str(ungathered_recipe(tmp_path)),
                             {"use_vllm": ("--vllm", True)}, ("model_name_or_path=nobody/unsized",),
                             planning=True), cuda=True)
    settled, plan = planned(run)
    assert not plan.known and settled.generation.gather == Gather.whole
    assert settled.settings["ds3_gather_for_generation"].source.startswith("default: no plan")


def test_candidates_carry_a_generation() -> None:
    plan = plan_run(qwen_run("use_vllm=true", "gather=true"))
    for column in plan.columns:
        candidate: Candidate = column.candidate
        assert isinstance(candidate.generation, Generation)
        assert (candidate.engine_settings is not None) == candidate.generation.engine.separate


def test_an_unknown_gpu_name_stops_resolution() -> None:
    with pytest.raises(ConfigError, match="unknown GPU"):
        timed_seed_run("rtx9090")


def test_published_times_keep_their_orderings(tmp_path: Path, monkeypatch) -> None:
    """benchmarks/published_times.py: vLLM colocated and a server both faster than either HF-generating run, the
    server faster than colocated, and HF generation of the student alone faster than with the teacher generating
    too (ms-swift's GKD),
    2 GiB sync buckets faster than tensor by tensor (the Megatron-LM bridge), an H200 faster than an A100
    (DeepScaleR in verl); each of at least 15 times predicted, the errors counted."""
    from helpers import REPO

    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import published_times
    from _common import cache_model_configs
    from plan_published import HUB_MODELS

    hub = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    cache_model_configs(hub, HUB_MODELS)
    _, rows, orderings, summary = published_times.replay(tmp_path)
    assert len(rows) == len(published_times.ROWS) >= 15 and all(row[3] != "-" for row in rows)
    assert len(orderings) == len(published_times.ORDERINGS) and f"of {len(rows)} times within 30 %" in summary
    right = [line for line in orderings if line.startswith("right")]
    assert any("2 GiB buckets faster" in line for line in right)
    hf = ("faster than GKD Qwen2.5-7B", "faster than the same without vLLM")  # ms-swift's two HF-generating runs
    assert sum(any(slower in line for slower in hf) for line in right) == 5
    assert any(line.startswith("right: the same, a vLLM server") and "than the same without `seq_kd`, vLLM colocated"
               in line for line in right)
    assert any("8 x H200" in line.split(" faster than ")[0] for line in right)


# -- the inputs ------------------------------------------------------------------------------------------------

def test_a_named_gpu_brings_its_memory_unless_gpu_memory_says_otherwise() -> None:
    def hardware(**flags):
        return read_inputs(resolve(RunRequest("rloo", "rloo/smoke", flags, planning=True), cuda=False)).hardware

    named = hardware(gpu=("--gpu", "rtx3090"))
    assert named.gpu_memory == 24 * 10**9 and "--gpu rtx3090" in named.source
    assert hardware(gpu=("--gpu", "rtx3090"), gpu_memory=("--gpu-memory", "10GiB")).gpu_memory == 10 * 2**30


def test_a_plan_across_machines_needs_no_address_and_its_network_rate_is_a_flag(cli) -> None:
    """`rlhf plan` starts nothing: two machines plan without --main-process-ip (a launch still asks for it); the
    link between them is the GPU class's default, with its source, unless --network gives it."""
    def training(*network: str) -> tuple[float, str]:
        flags = {"gpu": ("--gpu", "h100"), "num_machines": ("--num-machines", 2), "num_gpus": ("--num-gpus", 8),
                 **({"network": ("--network", network[0])} if network else {})}
        run = resolve(RunRequest("rloo", "rloo/smoke", flags, planning=True), cuda=True)
        gpu = read_inputs(run).hardware.gpu
        return _seconds(run, lambda c: c)["training"], gpu.network_source

    default, source = training()
    slow, given = training("1GB")
    assert "400 Gb/s" in source and given == "given: --network 1GB" and slow > default
    launch = cli("rloo", "-r", "rloo/smoke", "--num-machines", "2", "--dry-run")
    assert launch.exit_code == 2 and "--main-process-ip" in launch.output
    assert cli("plan", "rloo", "-r", "rloo/smoke", "--num-machines", "2", "--gpu", "h100").exit_code == 0
    bad = cli("plan", "rloo", "-r", "rloo/smoke", "--network", "fast")
    assert bad.exit_code == 2 and "--network 'fast'" in bad.output


def test_a_sleeping_vllm_pays_its_wake_and_level_1_its_weights_over_the_host_link() -> None:
    awake = qwen_run("use_vllm=true", "vllm_mode=colocate", "gather=true")
    asleep = qwen_run("use_vllm=true", "vllm_mode=colocate", "gather=true", "vllm_enable_sleep_mode=true")
    seconds = [_seconds(run, lambda c: c) for run in (awake, asleep)]
    seconds.append(_seconds(asleep, lambda c: replace(c, engine_settings=replace(c.engine_settings, sleep_level=1))))
    assert seconds[0]["generation"] < seconds[1]["generation"]  # the KV cache re-allocated
    assert seconds[0]["weight_sync"] < seconds[1]["weight_sync"] < seconds[2]["weight_sync"]


# -- this machine, calibrated ----------------------------------------------------------------------------------

def test_a_remembered_calibration_times_every_configuration_and_says_how_old_it_is(cli, monkeypatch) -> None:
    """No GPU here and none named: the calibration `rlhf doctor --calibrate` kept gives every configuration its
    seconds per phase, on the CPU's rates shared by the processes; without one, no seconds and the way to them."""
    import os
    import time as clock

    from rlhf_cli.machine import calibration

    monkeypatch.setattr("rlhf_cli.machine.gpus.nvidia_smi", lambda query: [])
    bare = json.loads(cli("plan", "rloo", "-r", "rloo/smoke", "--json").stdout)
    assert all(column["time"] is None for column in bare["configurations"])
    measured = calibration.Calibration("cpu", 20e9, 4e9, 1e9, 1e-3, "gloo", clock.time() - 7200, "here")
    write(calibration.cache_dir() / calibration.FILE_NAME, json.dumps(measured.__dict__))
    plan = json.loads(cli("plan", "rloo", "-r", "rloo/smoke", "--json").stdout)
    assert plan["gpu"]["source"].startswith("calibrated here (cpu, 2 hours old)")
    assert "no module call measured (`rlhf doctor --calibrate` again)" in plan["gpu"]["source"]  # an older one's
    assert plan["gpu"]["bf16_flops"] == 20e9 / 2 and plan["gpu"]["fetch_latency"] == 1e-3  # 2 processes share it
    assert all(column["time"] and column["step_seconds"] > 0 for column in plan["configurations"])
    assert os.environ["RLHF_CACHE"] in str(calibration.cache_dir())
