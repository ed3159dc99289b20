"""The time plan in words: the fastest and the smallest configurations that fit, and what each costs in time and
memory, for `rlhf plan` and the line before a run."""

from __future__ import annotations

from rlhf_cli.phases import Phase
from rlhf_cli.plan import memory
from rlhf_cli.plan.columns import Column, Plan
from rlhf_cli.sizes import gib

STEPS = 100  # the plan speaks of time per this many optimizer steps


def duration(seconds: float) -> str:
    """3 h 10 min, 11 min, 42 s."""
    if seconds < 60:
        return f"{seconds:.2g} s" if seconds < 10 else f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60} min" if minutes >= 60 else f"{minutes} min"


def _spare(column: Column, gpu_memory: int) -> str:
    left = int((1 - memory.MARGIN) * gpu_memory) - column.peak
    return f"{gib(left)} to spare" if left >= 0 else f"{gib(-left)} over"


def _cost(column: Column, gpu_memory: int) -> str:
    assert column.step_seconds is not None and column.seconds is not None
    slowest = max(column.seconds, key=lambda phase: column.seconds[phase] if column.seconds else 0.0)
    share = column.seconds[slowest] / column.step_seconds if column.step_seconds else 0.0
    return (f"{column.candidate.label}: {duration(STEPS * column.step_seconds)} per {STEPS} steps "
            f"({slowest} {share:.0%}), {gib(column.peak)} per GPU, {_spare(column, gpu_memory)}")


def _generation_ratio(slow: Column, fast: Column) -> str:
    """`generates about 40x slower than the fastest`, when generation is what differs."""
    if not slow.seconds or not fast.seconds or not fast.seconds[Phase.GENERATION]:
        return ""
    ratio = slow.seconds[Phase.GENERATION] / fast.seconds[Phase.GENERATION]
    return f"; generates about {ratio:.2g}x slower than the fastest" if ratio >= 1.5 else ""


def time_lines(plan: Plan) -> list[str]:
    """What the plan predicts for time: on which GPU, the fastest and the smallest configurations that fit, and
    the run's own beside them."""
    if not plan.known or plan.hardware is None:
        return []
    gpu = plan.hardware.gpu
    if gpu is None:
        return [f"time: no GPU known ({plan.hardware.gpu_source}) and this machine not calibrated; run "
                "`rlhf doctor --calibrate` (about 10 s, remembered) or pass --gpu NAME or --hardware FILE for seconds "
                "per step"]
    memory_bytes = plan.hardware.gpu_memory
    lines = [f"time: {gpu.name} ({plan.hardware.gpu_source}; {gpu.interconnect} "
             f"{gpu.interconnect_bandwidth / 1e9:.3g} GB/s each way), seconds per optimizer step per GPU at assumed "
             "utilisations (rlhf_cli/plan/time.py)"]
    fastest, smallest, chosen = plan.fastest, plan.smallest, plan.chosen
    if fastest is None or smallest is None:
        return [*lines, "time: no configuration fits"]
    lines.append(f"fastest that fits: {_cost(fastest, memory_bytes)}")
    if smallest is not fastest:
        lines.append(f"smallest that fits: {_cost(smallest, memory_bytes)}{_generation_ratio(smallest, fastest)}")
    if chosen is not None and chosen not in (fastest, smallest) and chosen.step_seconds is not None:
        verdict = "fits" if chosen.fits else "does not fit"
        lines.append(f"the run's own ({verdict}): {_cost(chosen, memory_bytes)}{_generation_ratio(chosen, fastest)}")
    return lines
