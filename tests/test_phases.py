"""Every run's step phases (rlhf_cli/rank/phases.py): seconds per step and peak memory in generation, sync, saving
and train, kept with a fake clock and a fake meter; the process meter's high-water mark and its restart."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

from helpers import REPO, docstring_lines
from rlhf_cli.phases import MemoryPhase, Phase, StepPhase
from rlhf_cli.plan.measured import phase_rows
from rlhf_cli.rank.phases import PeakMeter, StepPhases, merged


class FakeMemory:
    """A process whose high-water mark restarts from what it holds now, as Linux's clear_refs 5 does."""

    def __init__(self) -> None:
        self.now = self.peak = 0

    def use(self, held: int) -> None:
        self.now, self.peak = held, max(self.peak, held)

    def meter(self) -> PeakMeter:
        def restart() -> bool:
            self.peak = self.now
            return True

        return PeakMeter("rss", lambda: {"peak_bytes": self.peak}, restart)


def test_each_phase_gets_its_own_seconds_and_peak_and_nested_ones_count_once() -> None:
    memory, now = FakeMemory(), iter([0.0, 1.0, 3.0, 3.5, 4.0, 6.0, 6.5, 9.0, 10.0, 12.0, 12.0])
    phases = StepPhases(memory.meter(), clock=lambda: next(now))
    phases.begin("train")  # 1.0
    memory.use(100)
    with phases.during("generation"):  # 3.0 .. 6.0, a sync inside it from 3.5 to 4.0
        memory.use(300)
        with phases.during("sync"):
            memory.use(500)
            memory.use(250)  # the sync's buckets freed
        memory.use(200)
    memory.use(150)
    phases.begin("saving")  # 6.5 .. 9.0
    memory.use(400)
    phases.end("saving")
    memory.use(120)
    phases.end("train")  # 10.0
    record = phases.record(steps=2)  # 12.0: after training, no phase's
    seconds = {name: value["seconds_per_step"] for name, value in record["phases"].items()}
    assert seconds == {"train": (2.0 + 0.5 + 1.0) / 2, "generation": (0.5 + 2.0) / 2, "sync": 0.5 / 2,
                       "saving": 2.5 / 2}
    peaks = {name: value["peak_bytes"] for name, value in record["phases"].items()}
    assert peaks == {"train": 400, "generation": 300, "sync": 500, "saving": 400}  # saving's 400 held into train
    assert record["memory"] == {"kind": "rss", "per_phase": True, "overall_peak_bytes": 500, "note": None}


def test_a_phase_not_open_ends_nothing() -> None:
    memory, now = FakeMemory(), iter([0.0, 1.0, 2.0, 3.0])
    phases = StepPhases(memory.meter(), clock=lambda: next(now))
    phases.begin("train")
    phases.end("saving")  # transformers' on_save after a save asked for outside a step
    assert phases.open == ["train"]


def test_the_process_meter_reads_the_high_water_mark_and_says_when_it_cannot_restart_it(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmHWM:\t    2048 kB\nVmRSS:\t    1024 kB\n")
    restartable = PeakMeter.of_process(status, tmp_path / "clear_refs")
    assert restartable.take("steps") == {"peak_bytes": 2048 * 1024}
    assert (tmp_path / "clear_refs").read_text() == "5" and restartable.per_phase
    refused = PeakMeter.of_process(status, tmp_path / "missing" / "clear_refs")
    phases = StepPhases(refused, clock=iter([0.0, 1.0, 2.0, 3.0]).__next__)
    phases.begin("train")
    record = phases.record(steps=1)
    assert record["phases"]["train"] == {"seconds_per_step": 1.0, "peak_bytes": None}
    assert record["memory"]["per_phase"] is False and record["memory"]["overall_peak_bytes"] == 2048 * 1024
    assert "overall peak only" in record["memory"]["note"]


def test_two_consumers_of_one_meter_each_see_the_peaks_since_they_last_looked() -> None:
    memory = FakeMemory()
    meter = memory.meter()
    memory.use(50)
    meter.take("steps")
    memory.use(70)
    memory.use(10)
    assert meter.take("steps") == {"peak_bytes": 70}
    assert meter.take("probe") == {"peak_bytes": 70}  # the steps' restart did not lose the probe's peak
    assert meter.take("steps") == {"peak_bytes": 10}


def test_the_summary_takes_the_slowest_rank_and_the_largest_peak() -> None:
    def rank(seconds: float, peak: int | None) -> dict:
        phase = {"seconds_per_step": seconds, "peak_bytes": peak}
        return {"phases": {name: dict(phase) for name in ("generation", "sync", "saving", "train")},
                "memory": {"kind": "rss", "per_phase": peak is not None, "overall_peak_bytes": peak or 9, "note": None}}

    both = merged([rank(1.0, 10), rank(2.0, 30)])
    assert both["phases"]["train"] == {"seconds_per_step": 2.0, "peak_bytes": 30}
    assert both["memory"]["ranks"] == 2 and both["memory"]["per_phase"]
    assert merged([rank(1.0, 10), rank(2.0, None)])["phases"]["train"]["peak_bytes"] is None
    assert merged([{}, {}]) == {}


def test_measured_phases_sit_beside_the_plans_own_prediction() -> None:
    seconds = {"generation": 1.0, "weight_sync": 0.0, "scoring": 0.5, "training": 2.0, "optimizer_step": 0.25,
               "saving": 0.1, "waiting": 0.0}
    plan = SimpleNamespace(known=True, chosen=SimpleNamespace(seconds=seconds))
    summary = {"phases": {"generation": {"seconds_per_step": 3.0, "peak_bytes": 5},
                          "train": {"seconds_per_step": 4.0, "peak_bytes": 6}}}
    rows = {row.phase: row for row in phase_rows(summary, plan)}
    assert rows["train"].planned_seconds == 2.75 and rows["generation"].planned_seconds == 1.0
    assert list(rows) == ["generation", "train"] and rows["train"].seconds == 4.0
    assert phase_rows({}, plan) == []


def test_the_sync_records_what_it_added_above_where_memory_stood(tmp_path: Path) -> None:
    """The sync's own memory: its peak less the resident set when it began (a process at 1 MiB peaking at 3 MiB
    added 2); unknown where the high-water mark cannot be restarted (it would be an earlier phase's)."""
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmHWM:\t    1024 kB\nVmRSS:\t    1024 kB\n")
    meter = PeakMeter.of_process(status, tmp_path / "clear_refs")
    with meter.added("sync") as memory:
        status.write_text("Name:\tpython\nVmHWM:\t    3072 kB\nVmRSS:\t    1536 kB\n")
    assert memory == {"peak_memory_bytes": 3072 * 1024, "added_peak_bytes": 2048 * 1024}
    refused = PeakMeter.of_process(status, tmp_path / "missing" / "clear_refs")
    with refused.added("sync") as memory:
        pass
    assert memory == {"peak_memory_bytes": None, "added_peak_bytes": None}


# The one vocabulary (rlhf_cli/phases.py): a phase's name is spelled there and nowhere else in rlhf_cli's code.
PHASE_NAMES = {str(phase) for vocabulary in (Phase, MemoryPhase, StepPhase) for phase in vocabulary}
# String literals spelled like a phase that name something else, by module
NOT_PHASES = {
    "cli/report.py": {"step"}, "report/metrics.py": {"step"}, "report/plot.py": {"step"},  # the metrics' step
    "rank/lifecycle.py": {"step"},  # the preempted step in preempted.json
    "config/fields.py": {"generation"},  # the catalogue's group of generation_kwargs
    "plan/columns.py": {"generation"},  # the plan JSON's generation choice, in words
    "rank/inputs.py": {"train"},  # a dataset's split
    "rank/progress.py": {"train"},  # the progress bar's task
    "rank/watch.py": {"training", "saving"},  # a rank's state, for the stall watch
}


def phase_names_spelled(text: str) -> set[str]:
    """The phase names a module spells as string literals in its code (not in its docstrings)."""
    tree = ast.parse(text)
    skip = docstring_lines(tree)
    return {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
            and node.value in PHASE_NAMES and node.lineno not in skip}


def test_phase_names_are_spelled_only_in_the_vocabulary() -> None:
    package = REPO / "rlhf_cli"
    found = {}
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).as_posix()
        spelled = phase_names_spelled(path.read_text()) - NOT_PHASES.get(relative, set())
        if relative != "phases.py" and spelled:
            found[relative] = sorted(spelled)
    assert found == {}, "a phase named outside rlhf_cli/phases.py: use its Phase, MemoryPhase or StepPhase member"


def test_what_is_not_a_phase_is_still_spelled_where_it_is_said_to_be() -> None:
    """Each allowance is in use (the scan sees literals); a stale one would let a phase name in unseen."""
    package = REPO / "rlhf_cli"
    assert {module: phase_names_spelled((package / module).read_text()) & names
            for module, names in NOT_PHASES.items()} == NOT_PHASES
    assert phase_names_spelled('"""generation in a docstring."""\nKEY = "sync"\n') == {"sync"}
