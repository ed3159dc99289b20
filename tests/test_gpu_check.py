"""The GPU check without a GPU: `benchmarks/gpu.py --dry-run` builds and checks every command, its checks catch a
run that is not the one asked for, its report reads rank records, and the ranks' phase-memory probe
(`RLHF_PROBE_CUDA_MEMORY`) puts each allocator peak in the phase it happened in."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers import REPO
from rlhf_cli.output.run_dir import PROBE_CUDA_MEMORY_ENV as PHASE_MEMORY_ENV
from rlhf_cli.rank.probes import PhaseMemory
from rlhf_cli.rank.record import write_rank_record

BENCHMARKS = REPO / "benchmarks"
PYTHIA_1B_PARAMETERS = 1_011_781_632  # EleutherAI/pythia-1b, as published


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch):
    """benchmarks/gpu.py as a module (it imports its neighbour _common by name)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import gpu as module

    return module


@pytest.fixture
def setup(gpu, tmp_path: Path):
    return gpu.Setup(gpu.write_config(gpu.POLICY, tmp_path / "policy"),
                     gpu.write_config(gpu.REWARD, tmp_path / "reward"), tmp_path / "runs", steps=3, completion=32,
                     prompt_length=gpu.longest_prompt_tokens(), gpu_memory=gpu.parse_size(gpu.H200_MEMORY))


# -- the dry mode -------------------------------------------------------------------------------------

def test_dry_mode_checks_every_run_without_importing_torch(tmp_path: Path) -> None:
    script = (f"import sys; sys.path.insert(0, {str(BENCHMARKS)!r}); import gpu; "
              f"code = gpu.main(['--dry-run', '--work-dir', {str(tmp_path)!r}]); "
              f"assert 'torch' not in sys.modules, 'the dry mode imported torch'; sys.exit(code)")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if " -m rlhf_cli " in line]
    commands = [line for line in lines if "--rehearse" not in line]
    rehearsal = [line for line in lines if "--rehearse" in line]
    assert len(rehearsal) == 1 and rehearsal[0].startswith(commands[0])  # the first run, rehearsed before all
    for algorithm in ("ppo", "rloo", "online-dpo"):
        for mode in ("--gather -o", "--no-gather --set stage3_max_live_parameters"):
            assert any(f" -m rlhf_cli {algorithm} " in line and mode in line for line in commands), (algorithm, mode)
    assert any(" ppo " in line and "--offload-optimizer cpu" in line for line in commands)
    assert all("--set bf16=true" in line and "--num-processes 1" in line for line in commands)
    grpo_ran = any(" -m rlhf_cli grpo " in line for line in commands)
    assert grpo_ran or "left out: grpo:" in done.stdout  # before and after `rlhf grpo` exists
    assert f"{len(commands)} runs checked" in done.stdout
    config = json.loads((tmp_path / "pythia-1b-shape" / "config.json").read_text())
    assert config["architectures"] == ["GPTNeoXForCausalLM"] and config["dtype"] == "bfloat16"


def test_the_plan_sizes_the_policy_as_pythia_1b_in_bf16(gpu, setup) -> None:
    planned = gpu.plan_and_check(gpu.Run(gpu.ALGORITHMS[1], gpu.GATHER), setup, on_gpu=False)
    assert planned.problems == []
    assert planned.plan["models"]["policy"]["params"] == PYTHIA_1B_PARAMETERS
    assert planned.plan["workload"]["element_bytes"] == 2
    assert planned.plan["workload"]["generation_batch"] == 8


def test_checks_catch_a_run_that_is_not_the_one_asked_for(gpu, setup) -> None:
    run = gpu.Run(gpu.ALGORITHMS[0], gpu.NO_GATHER)
    planned = gpu.plan_and_check(run, setup, on_gpu=False)
    assert planned.problems == []

    resolved = copy.deepcopy(planned.resolved)
    resolved["trainer"]["bf16"] = False
    resolved["trainer"]["ds3_gather_for_generation"] = True
    resolved["zero3"]["stage3_max_live_parameters"] = 1_000_000_000
    del resolved["sources"]["plan_prompt_length"]
    problems = gpu.check_resolved(run, resolved, setup, on_gpu=False)
    for key in ("bf16 on", "ds3_gather_for_generation", "stage3_max_live_parameters", "plan_prompt_length"):
        assert any(f": {key} is " in problem for problem in problems), (key, problems)

    # Resolved here, without a GPU, the run takes DeepSpeed's CPU path: on a GPU machine that is an error.
    on_gpu = gpu.check_resolved(run, planned.resolved, setup, on_gpu=True)
    assert {problem.split(": ")[1].split(" is ")[0] for problem in on_gpu} == {"use_cpu", "mixed_precision",
                                                                                  "DS_ACCELERATOR"}
    plan = copy.deepcopy(planned.plan)
    plan["workload"]["element_bytes"] = 4
    assert gpu.check_plan(run, plan, setup) == [f"{run.name}: the plan's bytes per element (bf16) is 4, expected 2"]
    gpu.chosen_column(plan)["phases"]["static"] += 1  # phases that no longer add up to the peak
    assert any("do not add up" in problem for problem in gpu.check_plan(run, plan, setup))


# -- the report ---------------------------------------------------------------------------------------

GIB = 2**30


def phase(allocated: float, reserved: float, outside: float = 0.5) -> dict[str, int]:
    return {"max_allocated_bytes": int(allocated * GIB), "max_reserved_bytes": int(reserved * GIB),
            "outside_allocator_bytes": int(outside * GIB)}


def test_report_reads_rank_records(gpu, setup, tmp_path: Path) -> None:
    plan = {"known": True, "workload": {"generation_batch": 8, "completion_length": 32},
            "configurations": [{"chosen": True, "fits": True, "peak_gpu": 24 * GIB,
                                "components": {"policy states": 19 * GIB, "CUDA + buffers": 1 * GIB,
                                               "gen weights": 2 * GIB, "gen KV cache": 1 * GIB,
                                               "train activations": 4 * GIB},
                                "phases": {"static": 20 * GIB, "generation": 3 * GIB, "training": 4 * GIB,
                                           "step": 1 * GIB}}]}
    planned = gpu.Planned(gpu.Run(gpu.ALGORITHMS[1], gpu.GATHER), setup, {}, plan, [])
    calls = [{"started_s": started, "seconds": 1.0} for started in (10.0, 13.0, 15.5)]
    record = {"global_step": 3, "phase_memory": {"cuda": True, "generation_calls": calls, "phases": {
        "load": phase(19, 20), "generation": phase(21, 22.5), "train": phase(23, 24.5)}}}
    measured = gpu.Measured(planned, "ok", 40.0, record)
    assert measured.seconds_per_step() == pytest.approx(2.75)  # median of 3.0 and 2.5
    assert measured.generation_seconds() == 1.0
    assert gpu.time_row(measured) == ["rloo/gather", "ok", "3", "40", "2.75", "1.00", "256"]
    row = gpu.memory_row(measured)
    # plan gen = static 20 + gen 3 = 23 vs 22.5 + 0.5; plan train = 24 vs 24.5 + 0.5; peak 24 vs 25
    assert row[gpu.MEMORY_COLUMNS.index("plan gen GiB")] == "23.00"
    assert row[gpu.MEMORY_COLUMNS.index("measured peak GiB")] == "25.00"
    assert row[gpu.MEMORY_COLUMNS.index("gen error %")] == "+0.0"
    assert row[gpu.MEMORY_COLUMNS.index("train error %")] == "-4.0"
    assert row[gpu.MEMORY_COLUMNS.index("plan error %")] == "-4.0"

    failed = gpu.Measured(gpu.Planned(gpu.Run(gpu.ALGORITHMS[0], gpu.NO_GATHER), setup, {}, plan, []), "failed",
                          error="... exited 1:\nError: rank 0 on host failed: OutOfMemoryError: CUDA out of memory")
    env = {"gpu": "NVIDIA H200 (143771 MiB)", "python": "3.12.3", "torch": "2.11.0 (CUDA 13.0)", "packages": ["x 1"],
           "models": "policy: 1011.8M parameters"}
    gpu.report(tmp_path / "out", setup, env, [measured, failed], ["grpo: no bundled recipe grpo/smoke"])
    page = (tmp_path / "out" / "gpu.md").read_text()
    assert "| rloo/gather | ok | 3 | 40 | 2.75 | 1.00 | 256 |" in page
    assert "- `ppo/no-gather`: failed: Error: rank 0 on host failed: OutOfMemoryError: CUDA out of memory" in page
    assert "Left out: grpo: no bundled recipe grpo/smoke." in page
    raw = json.loads((tmp_path / "out" / "gpu.json").read_text())
    assert [run["status"] for run in raw["runs"]] == ["ok", "failed"]


# -- the ranks' probe ---------------------------------------------------------------------------------

class FakeCuda:
    """torch.cuda's memory statistics for a device of 100 bytes with a 7-byte context, driven by `use`."""

    def __init__(self) -> None:
        self.allocated = self.reserved = self.peak_allocated = self.peak_reserved = 0
        self.resets = 0

    def use(self, allocated: int, reserved: int) -> None:
        self.allocated, self.reserved = allocated, reserved
        self.peak_allocated, self.peak_reserved = max(self.peak_allocated, allocated), max(self.peak_reserved, reserved)

    def max_memory_allocated(self) -> int:
        return self.peak_allocated

    def max_memory_reserved(self) -> int:
        return self.peak_reserved

    def memory_reserved(self) -> int:
        return self.reserved

    def mem_get_info(self) -> tuple[int, int]:
        return 100 - self.reserved - 7, 100

    def reset_peak_memory_stats(self) -> None:  # as torch: the peaks restart from what is in use now
        self.peak_allocated, self.peak_reserved = self.allocated, self.reserved
        self.resets += 1

    def synchronize(self) -> None:
        pass


def test_phase_memory_puts_each_peak_in_its_phase() -> None:
    cuda, now = FakeCuda(), iter([0.0, 5.0, 7.0, 9.0, 10.0])
    cuda.use(10, 12)  # loading the models
    phases = PhaseMemory(cuda, clock=lambda: next(now))
    with phases.generating():
        cuda.use(30, 40)
        cuda.use(15, 40)  # generation releases the gathered weights
    cuda.use(20, 40)  # training
    cuda.use(18, 40)
    with phases.generating():
        cuda.use(25, 40)
    cuda.use(5, 40)
    record = phases.record()

    assert record["cuda"] is True
    assert record["phases"] == {
        "load": {"max_allocated_bytes": 10, "max_reserved_bytes": 12, "outside_allocator_bytes": 7},
        "generation": {"max_allocated_bytes": 30, "max_reserved_bytes": 40, "outside_allocator_bytes": 7},
        # the second call's 25 bytes were still allocated when training resumed
        "train": {"max_allocated_bytes": 25, "max_reserved_bytes": 40, "outside_allocator_bytes": 7}}
    assert [(call["started_s"], call["seconds"], call["max_allocated_bytes"]) for call in record["generation_calls"]] \
        == [(5.0, 2.0, 30), (9.0, 1.0, 25)]
    assert cuda.resets == 5  # at each phase change and at the end


def test_without_cuda_only_the_generation_calls_are_timed() -> None:
    now = iter([0.0, 1.0, 3.5])
    phases = PhaseMemory(None, clock=lambda: next(now))
    with phases.generating():
        pass
    assert phases.record() == {"cuda": False, "phases": {},
                               "generation_calls": [{"started_s": 1.0, "seconds": 2.5}]}


def test_the_rank_record_carries_the_probe_only_when_asked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    trainer = SimpleNamespace(
        accelerator=SimpleNamespace(process_index=0, local_process_index=0, num_processes=1),
        args=SimpleNamespace(ds3_gather_for_generation=True, output_dir=str(tmp_path)),
        state=SimpleNamespace(global_step=3))
    monkeypatch.setattr(PhaseMemory, "active", None)
    monkeypatch.delenv(PHASE_MEMORY_ENV, raising=False)
    assert PhaseMemory.current() is None
    assert json.loads(write_rank_record(trainer).read_text())["phase_memory"] is None

    monkeypatch.setenv(PHASE_MEMORY_ENV, "1")
    phases = PhaseMemory.current()
    assert phases is PhaseMemory.current() and phases.cuda is None  # one per rank; this machine has no CUDA
    with phases.generating():
        pass
    record = json.loads(write_rank_record(trainer).read_text())["phase_memory"]
    assert record["cuda"] is False and len(record["generation_calls"]) == 1


def test_on_a_gpu_machine_the_run_resolves_to_cuda_and_bf16(gpu, setup, cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks that only a GPU machine runs pass for what rlhf resolves there (CUDA seen without a GPU here)."""
    from rlhf_cli.config import resolve

    monkeypatch.setattr(resolve, "cuda_present", lambda: True)
    for run in gpu.all_runs(gpu.ALGORITHMS[:3]):
        result = cli(run.algorithm.command, *run.flags(setup), "--dry-run", "--json")
        assert result.exit_code == 0, result.output
        resolved = gpu.json_output(result.stdout)
        assert gpu.check_resolved(run, resolved, setup, on_gpu=True) == []
