"""The benchmarks' shared helpers (benchmarks/_common.py): reading the ranks' probe records, running and serving."""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest

from helpers import REPO, write


def load_common():
    spec = importlib.util.spec_from_file_location("benchmarks_common", REPO / "benchmarks" / "_common.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def call(seconds: float, all_gathers: int, peak_bytes: int, rss_rise: int) -> dict:
    return {"gather": False, "full_numel": 1000, "peak_numel": peak_bytes // 4, "peak_fraction": peak_bytes / 4000,
            "peak_bytes": peak_bytes, "full_bytes": 4000, "all_gathers": all_gathers, "seconds": seconds,
            "rss_start_bytes": 10_000, "rss_peak_bytes": 10_000 + rss_rise, "rss_peak_delta_bytes": rss_rise}


def write_run(run: Path, rank: int, steps: int, calls: list[dict]) -> None:
    record = {"rank": rank, "world_size": 2, "global_step": steps,
              "generation_probe": {"calls": len(calls), "per_call": calls}}
    write(run / "ranks" / f"rank-{rank}.json", json.dumps(record))


def test_runs_of_one_mode_are_pooled_per_rank(tmp_path: Path) -> None:
    common = load_common()
    first, second = tmp_path / "first", tmp_path / "second"
    write_run(first, 1, 2, [call(1.0, 10, 400, 50), call(2.0, 30, 800, 20)])
    write_run(first, 0, 2, [call(1.5, 12, 400, 60), call(1.5, 12, 400, 60)])
    write_run(second, 1, 1, [call(3.0, 20, 1200, 10)])
    write(second / "ranks" / "rank-1.heartbeat.json", json.dumps({"rank": 1, "phase": "done"}))  # not a record

    ranks = common.rank_generations([first, second])

    assert [r.rank for r in ranks] == [0, 1]
    pooled = ranks[1]
    assert (pooled.steps, pooled.calls) == (3, 3)
    assert pooled.seconds_per_step == pytest.approx(2.0)  # 6 s of generation over 3 steps
    assert pooled.all_gathers_per_call == 20  # the median call
    assert (pooled.gathered_peak_bytes, pooled.gathered_peak_share) == (1200, 0.3)
    assert (pooled.rss_peak_delta_bytes, pooled.rss_peak_bytes) == (50, 10_050)
    assert ranks[0].seconds_per_step == pytest.approx(1.5)


def test_a_run_without_the_probe_is_refused(tmp_path: Path) -> None:
    write_run(tmp_path, 0, 4, [])
    with pytest.raises(ValueError, match="RLHF_PROBE_GENERATION=1"):
        load_common().rank_generations([tmp_path])


def test_a_command_past_its_timeout_is_killed_with_what_it_started() -> None:
    """A benchmark's timed-out run must not leave its ranks behind, holding memory (or a GPU) during the next run."""
    common = load_common()
    starts_a_child = ("import subprocess, sys, time; "
                      "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
                      "print(child.pid, flush=True); time.sleep(120)")
    with pytest.raises(common.CommandTimedOut, match="ran past 3 s") as raised:
        common.run_timed([sys.executable, "-c", starts_a_child], timeout=3)
    child = int(str(raised.value).split("\n")[1])
    status = Path(f"/proc/{child}/status")
    deadline = time.monotonic() + 10
    while status.exists() and "zombie" not in status.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not status.exists() or "zombie" in status.read_text(), "the command's child outlived it"


def test_a_vllm_server_that_exits_before_answering_says_why(tmp_path: Path) -> None:
    """The benchmarks' server is given up as soon as it exits, with its own error, not after its whole wait."""
    common = load_common()
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="rlhf vllm-serve exited:\n.*no-such-recipe.yaml: recipe not found"):
        with common.vllm_server(tmp_path / "server.log", "grpo", "-r", "no-such-recipe.yaml", timeout=120):
            pytest.fail("a server that exited was taken for one that answers")
    assert time.monotonic() - started < 60


def test_the_plans_ordering_is_judged_pair_by_pair_with_overlapping_runs_a_tie(monkeypatch) -> None:
    """benchmarks/plan_vs_measured.py: a pair whose per-run sums overlap has no measured order (a tie, said as
    one); every other pair is right when the plan puts the measured faster one first, and a wrong one is named."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import plan_vs_measured

    runs = {"gather": [{"generation": 0.04, "train": 0.10}, {"generation": 0.05, "train": 0.10}],
            "budget": [{"generation": 0.07, "train": 0.10}, {"generation": 0.08, "train": 0.10}],
            "no-gather": [{"generation": 0.075, "train": 0.10}, {"generation": 0.11, "train": 0.10}]}
    plans = {"gather": {"generation": 0.04, "train": 0.09}, "budget": {"generation": 0.09, "train": 0.09},
             "no-gather": {"generation": 0.08, "train": 0.09}}
    verdict = plan_vs_measured.ordering(runs, plans)
    assert verdict.startswith("measured gather, budget, no-gather; planned gather, no-gather, budget")
    assert "2 of 2 measured pairs right" in verdict and "ties (their runs overlap): budget ~ no-gather" in verdict
    plans["gather"]["generation"] = 0.2  # now the plan puts gather last: both of its measured pairs are wrong
    verdict = plan_vs_measured.ordering(runs, plans)
    assert "0 of 2 measured pairs right, wrong: gather < budget; gather < no-gather" in verdict
