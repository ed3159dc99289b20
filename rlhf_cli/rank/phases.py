"""Where every run's optimizer steps go: seconds per step and peak memory in each phase, measured on every rank.

Phases (rlhf_cli/phases.StepPhase): `generation` inside TRL's generation context (rlhf_cli/rank/zero3.py) or
the engine's own generate (rlhf_cli/rank/engines/), `sync` a weight sync into the engine
(rlhf_cli/rank/engines/sync.py), `saving` a checkpoint's save (from the step that asks for it to transformers'
on_save, rlhf_cli/rank/lifecycle.py), and `train` the rest of the step. Phases nest: a sync inside generation
counts as sync, not twice. Loading before training and the final save after it are no step's.

Peak memory per phase: on CUDA torch's allocator peaks (reserved, plus what the device holds outside the
allocator), on CPU the process's resident high-water mark (Linux's VmHWM, restarted at each phase change by
writing 5 to /proc/self/clear_refs). Where that restart is refused only the run's overall peak is known, and the
record says so. The one PeakMeter of a rank is shared with the CUDA probe (rlhf_cli/rank/probes.PhaseMemory):
each reading restarts the peaks, so both take theirs from the same readings. The weight sync also takes its own:
how far memory rose above where it stood when the sync began (`PeakMeter.added`).
"""

from __future__ import annotations

import contextlib
import resource
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

from rlhf_cli.phases import StepPhase

CONSUMERS = ("steps", "probe", StepPhase.SYNC)  # StepPhases, PhaseMemory and the weight sync's own (`added`)
PEAK_KEY = "peak_bytes"
STATUS, CLEAR_REFS = Path("/proc/self/status"), Path("/proc/self/clear_refs")


class PeakMeter:
    """Peak memory since the last reading, for each consumer: every reading restarts the peaks and is folded
    into every consumer's account, so that consumers reading at different moments each see their own peaks."""

    shared: ClassVar[PeakMeter | None] = None

    def __init__(self, kind: str, read: Callable[[], dict[str, int]], restart: Callable[[], bool],
                 level: Callable[[], int | None] = lambda: None) -> None:
        self.kind = kind  # "cuda" | "rss"
        self.read, self.restart = read, restart
        self.level = level  # the memory held now, as PEAK_KEY counts it; None where it cannot be read
        self.per_phase = True  # every restart worked so far: peaks are per phase, not the run's overall one
        self.overall = 0
        self.accounts: dict[str, dict[str, int]] = {name: {} for name in CONSUMERS}

    @classmethod
    def current(cls) -> PeakMeter:
        """This rank's meter: CUDA's allocator when there is a GPU, else the process's resident set."""
        if cls.shared is None:
            import torch

            cls.shared = cls.of_cuda(torch.cuda) if torch.cuda.is_available() else cls.of_process()
        return cls.shared

    @classmethod
    def of_cuda(cls, cuda: Any) -> PeakMeter:
        def read() -> dict[str, int]:
            cuda.synchronize()
            free, total = cuda.mem_get_info()
            reserved = cuda.max_memory_reserved()
            outside = total - free - cuda.memory_reserved()
            return {"max_allocated_bytes": cuda.max_memory_allocated(), "max_reserved_bytes": reserved,
                    "outside_allocator_bytes": outside, PEAK_KEY: reserved + outside}

        def restart() -> bool:
            cuda.reset_peak_memory_stats()
            return True

        def level() -> int:
            free, total = cuda.mem_get_info()
            return total - free

        return cls("cuda", read, restart, level)

    @classmethod
    def of_process(cls, status: Path = STATUS, clear_refs: Path = CLEAR_REFS) -> PeakMeter:
        def read() -> dict[str, int]:
            try:
                line = next(line for line in status.read_text().splitlines() if line.startswith("VmHWM:"))
                return {PEAK_KEY: int(line.split()[1]) * 1024}
            except (OSError, StopIteration, ValueError, IndexError):  # not Linux: the process's peak, in KiB
                return {PEAK_KEY: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}

        def restart() -> bool:
            try:
                clear_refs.write_text("5")
                return True
            except OSError:
                return False

        def level() -> int | None:
            try:
                return int(next(line for line in status.read_text().splitlines()
                                if line.startswith("VmRSS:")).split()[1]) * 1024
            except (OSError, StopIteration, ValueError, IndexError):
                return None

        return cls("rss", read, restart, level)

    def take(self, consumer: str) -> dict[str, int]:
        """The peaks since `consumer` last took them."""
        reading = self.read()
        self.overall = max(self.overall, reading.get(PEAK_KEY, 0))
        self.per_phase = self.restart() and self.per_phase
        for account in self.accounts.values():
            for key, value in reading.items():
                account[key] = max(account.get(key, 0), value)
        taken, self.accounts[consumer] = self.accounts[consumer], {}
        return taken


    @contextlib.contextmanager
    def added(self, consumer: str) -> Iterator[dict[str, int | None]]:
        """The block's peak (`peak_memory_bytes`) and how far it rose above what was held when the block began
        (`added_peak_bytes`), filled in when the block ends; None where the peak cannot be restarted (it would be an
        earlier one's) or the level cannot be read."""
        self.take(consumer)  # the peak restarts here: what the block's own reading shows is the block's
        start = self.level()
        found: dict[str, int | None] = {}
        yield found
        peak = self.take(consumer).get(PEAK_KEY)
        usable = self.per_phase and start is not None and peak is not None
        found["peak_memory_bytes"] = peak if self.per_phase else None
        found["added_peak_bytes"] = max(0, peak - start) if usable else None


class StepPhases:
    """Seconds and peak memory of each phase of this rank's optimizer steps; the innermost open phase is the one
    the clock runs for."""

    active: ClassVar[StepPhases | None] = None

    def __init__(self, meter: PeakMeter, clock: Callable[[], float] = time.perf_counter) -> None:
        self.meter, self.clock = meter, clock
        self.seconds = dict.fromkeys(StepPhase, 0.0)
        self.peaks = dict.fromkeys(StepPhase, 0)
        self.open: list[StepPhase] = []  # innermost last; empty: outside training
        self.mark = clock()

    @classmethod
    def current(cls) -> StepPhases:
        if cls.active is None:
            cls.active = cls(PeakMeter.current())
        return cls.active

    def _switch(self) -> None:
        """Charge the time and peak since the last change to the innermost open phase."""
        now, peaks = self.clock(), self.meter.take("steps")
        if self.open:
            phase = self.open[-1]
            self.seconds[phase] += now - self.mark
            self.peaks[phase] = max(self.peaks[phase], peaks.get(PEAK_KEY, 0))
        self.mark = now

    def begin(self, phase: StepPhase) -> None:
        self._switch()
        self.open.append(phase)

    def end(self, phase: StepPhase) -> None:
        """Close `phase` (a phase not open is ignored: a save asked for outside a step)."""
        if phase in self.open:
            self._switch()
            del self.open[len(self.open) - 1 - self.open[::-1].index(phase)]

    @contextlib.contextmanager
    def during(self, phase: StepPhase) -> Iterator[None]:
        self.begin(phase)
        try:
            yield
        finally:
            self.end(phase)

    def snapshot(self) -> dict[str, float]:
        """Seconds charged to each phase so far, the open one up to now."""
        self._switch()
        return dict(self.seconds)

    def record(self, steps: int) -> dict[str, Any]:
        """What `ranks/rank-N.json` and summary.json carry: each phase's seconds per optimizer step (`steps` run
        by this launch) and peak bytes (None where only the overall peak is known), and how memory was read."""
        self._switch()
        per_phase = self.meter.per_phase
        return {
            "phases": {phase: {"seconds_per_step": self.seconds[phase] / steps if steps else None,
                               PEAK_KEY: self.peaks[phase] if per_phase else None} for phase in StepPhase},
            "memory": {"kind": self.meter.kind, "per_phase": per_phase, "overall_peak_bytes": self.meter.overall,
                       "note": None if per_phase else
                       "the peak could not be restarted between phases (/proc/self/clear_refs): overall peak only"},
        }


def merged(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The ranks' records as one: per phase the slowest rank's seconds and the largest peak (what a GPU must
    hold); memory per phase only when every rank measured it so."""
    records = [record for record in records if record]
    if not records:
        return {}
    phases = {}
    for phase in StepPhase:
        values = [record["phases"][phase] for record in records]
        seconds = [value["seconds_per_step"] for value in values if value["seconds_per_step"] is not None]
        peaks = [value[PEAK_KEY] for value in values if value[PEAK_KEY] is not None]
        phases[phase] = {"seconds_per_step": max(seconds) if seconds else None,
                         PEAK_KEY: max(peaks) if len(peaks) == len(values) else None}
    memories = [record["memory"] for record in records]
    per_phase = all(memory["per_phase"] for memory in memories)
    return {"phases": phases, "memory": {
        "kind": memories[0]["kind"], "per_phase": per_phase,
        "overall_peak_bytes": max(memory["overall_peak_bytes"] for memory in memories),
        "note": next((memory["note"] for memory in memories if memory["note"]), None), "ranks": len(records)}}
