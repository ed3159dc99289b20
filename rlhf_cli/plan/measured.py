"""A run's measured step phases (summary.json's `phases`, rlhf_cli/rank/phases.py) beside what the plan predicted,
and the rehearsal's verdict: did the measured peak fit the memory the plan planned against?

The ranks measure four phases; the plan predicts seven (rlhf_cli/phases.py: `StepPhase.planned` says which of the
plan's each one measures).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlhf_cli.machine.corrections import run_seconds, saves_left
from rlhf_cli.phases import EVERY_STEP, StepPhase
from rlhf_cli.plan import memory
from rlhf_cli.plan.columns import Plan
from rlhf_cli.sizes import readable


@dataclass(frozen=True)
class PhaseRow:
    """One measured phase beside the plan: seconds per step measured and planned (None: no prediction, the plan
    knows no GPU), and the peak bytes measured (None: only the run's overall peak is known)."""

    phase: StepPhase
    seconds: float | None
    planned_seconds: float | None
    peak_bytes: int | None


def phase_rows(summary: dict[str, Any], plan: Plan | None) -> list[PhaseRow]:
    """The phases the run measured, in order; empty when summary.json has none (a run before phases were kept)."""
    phases = summary.get("phases") or {}
    chosen = plan.chosen if plan is not None and plan.known else None
    predicted = chosen.seconds if chosen is not None else None
    return [PhaseRow(phase, phases[phase].get("seconds_per_step"),
                     sum(predicted[name] for name in phase.planned) if predicted else None,
                     phases[phase].get("peak_bytes"))
            for phase in StepPhase if phase in phases]


@dataclass(frozen=True)
class Verdict:
    fits: bool
    line: str


def usable_memory(plan: Plan) -> int | None:
    """The bytes a configuration may peak at to fit, as the plan judges: the memory less its margin."""
    if not plan.known or plan.hardware is None:
        return None
    return int(plan.hardware.gpu_memory * (1 - memory.MARGIN))


def verdict(summary: dict[str, Any], plan: Plan) -> Verdict:
    """Whether the rehearsal's measured peak fits what the plan planned against; over: the phase that went over
    (the largest peak), and what the plan says would fit."""
    usable = usable_memory(plan)
    rows = phase_rows(summary, plan)
    measured = [row for row in rows if row.peak_bytes is not None]
    overall = (summary.get("memory") or {}).get("overall_peak_bytes")
    if usable is None or not (measured or overall):
        return Verdict(True, "memory not judged: " + ("no plan" if usable is None else "no peak measured"))
    assert plan.hardware is not None
    of = f"{readable(usable)} usable of {readable(plan.hardware.gpu_memory)} per GPU"
    if not measured:
        phase, peak = "the run (overall peak only)", int(overall or 0)
    else:
        top = max(measured, key=lambda row: row.peak_bytes or 0)
        phase, peak = top.phase, int(top.peak_bytes or 0)
    if peak <= usable:
        return Verdict(True, f"fits: the largest peak, {phase} at {readable(peak)}, within {of}")
    smallest = plan.smallest
    instead = (f"the plan's smallest configuration that fits: {smallest.candidate.label} "
               f"({readable(smallest.peak)} per GPU)" if smallest is not None
               else f"the plan finds no configuration that fits in {readable(plan.hardware.gpu_memory)}")
    return Verdict(False, f"rehearsal: {phase} peaked at {readable(peak)}, over the {of}; {instead}")


def corrected_factors(summary: dict[str, Any], plan: Plan) -> dict[str, float]:
    """Per plan phase, measured / planned of the phase the ranks measured it in (times the factors the plan already
    applied): what the next plan on this machine multiplies its seconds by. Saving is left out (a rehearsal's one
    save is no rate)."""
    kept = plan.hardware.corrections if plan.known and plan.hardware is not None else {}
    factors = {}
    for row in phase_rows(summary, plan):
        if row.phase == StepPhase.SAVING or not row.seconds or not row.planned_seconds:
            continue
        for name in row.phase.planned:
            factors[name] = kept.get(name, 1.0) * row.seconds / row.planned_seconds
    return factors


def whole_run(summary: dict[str, Any], plan: Plan, steps: int, save_steps: int | None) -> tuple[float, float | None]:
    """(seconds from the rehearsal's measured phases, seconds the plan predicts) for a run of `steps` saving every
    `save_steps` (None: only the final model); rlhf_cli/machine/corrections.py's model for the first."""
    phases = summary.get("phases") or {}
    per_step = {name: (phases.get(name) or {}).get("seconds_per_step") for name in EVERY_STEP}
    save = (phases.get(StepPhase.SAVING) or {}).get("seconds_per_step") or 0.0
    measured = run_seconds(per_step, steps, saves_left(0, steps, save_steps), save)
    chosen = plan.chosen if plan.known else None
    planned = chosen.step_seconds * steps if chosen is not None and chosen.step_seconds is not None else None
    return measured, planned
