"""What runs measured on this machine, against what the plan predicted, and the one model of a run's time that the
rehearsal, the progress line and the next plan share.

A run's time is its steps' phases (generation, sync, train: seconds per step) times its steps, plus its saves
(seconds per save times the saves it makes, the final model's among them). Fed by the plan it is the plan's ETA;
fed by a run's own measured phases it is that run's: the rehearsal's prediction of the whole run, and a running
job's ETA (rlhf_cli/rank/progress.py) from the steps it has done, not a straight line through its start-up,
weighed against the plan's while those steps are few (`weighed`).

The rehearsal keeps, per machine (the GPU the plan timed), how far each measured phase was from the plan, in rlhf's
cache dir (corrections.json); the next plan on that machine multiplies its seconds by them. No torch.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path

from rlhf_cli.machine.cache import cache_dir
from rlhf_cli.phases import EVERY_STEP

FILE_NAME = "corrections.json"


def run_seconds(per_step: Mapping[str, float | None], steps: float, saves: int, save_seconds: float) -> float:
    """The model: each step's phases times `steps`, plus `saves` writes of `save_seconds` each."""
    step = sum(per_step.get(phase) or 0.0 for phase in EVERY_STEP)
    return step * max(0.0, steps) + saves * save_seconds


# A plan timed on this machine counts as one more steady step beside those a run has measured: at step 3 of a smoke
# run its one steady step is off by up to a fifth either way (steps still warming, a busy machine), and the
# calibrated plan by about as much (benchmarks/plan_vs_measured.py); at 20 steady steps the plan carries a
# twenty-first of the rate.
PLAN_WEIGHT_STEPS = 1
# The plan is believed while the steps measured agree with it this closely (what it holds against measured phases
# here): a machine that has since slowed or sped up (a shared host, another job; the smoke steps took 45 % longer
# in one set of runs minutes after a calibration) makes it stale, and then the run's own steps alone give the rate.
PLAN_AGREES = 0.30


def weighed(measured: Mapping[str, float], steps: int, planned: Mapping[str, float] | None) -> dict[str, float]:
    """Each step phase's seconds per step: the mean of `steps` measured steady steps and the plan's (when it timed
    this machine and the steps agree with it within PLAN_AGREES) counted as PLAN_WEIGHT_STEPS more, so that one
    slow or quick step cannot carry the rate alone; the plan's alone before a steady step, the measured alone
    without a plan (one of the two is needed)."""
    weight = PLAN_WEIGHT_STEPS if planned and (not steps or _agrees(measured, planned)) else 0
    return {phase: (measured.get(phase, 0.0) * steps + (planned or {}).get(phase, 0.0) * weight) / (steps + weight)
            for phase in EVERY_STEP}


def _agrees(measured: Mapping[str, float], planned: Mapping[str, float]) -> bool:
    """Whether a measured step's seconds are within PLAN_AGREES of the plan's."""
    step, plan = (sum(phases.get(phase, 0.0) for phase in EVERY_STEP) for phases in (measured, planned))
    return abs(step - plan) <= PLAN_AGREES * plan


def saves_left(done: int, max_steps: int, save_steps: int | None) -> int:
    """Checkpoints after step `done` (every `save_steps`, None: none), and the final model's save."""
    every = [step for step in range(done + 1, max_steps + 1) if save_steps and step % save_steps == 0]
    return len(every) + (0 if max_steps in every else 1)


def remember(machine: str, factors: Mapping[str, float], cache: Path | None = None) -> None:
    """Keep `factors` (measured / planned, per plan phase) for `machine`, beside other machines'."""
    path = (cache or cache_dir()) / FILE_NAME
    kept = _read(path)
    kept[machine] = {"factors": dict(factors), "measured_at": time.time()}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(kept, indent=1))


def remembered(machine: str, cache: Path | None = None) -> dict[str, float]:
    """The factors last kept for `machine`; empty when none."""
    entry = _read((cache or cache_dir()) / FILE_NAME).get(machine) or {}
    factors = entry.get("factors") if isinstance(entry, dict) else None
    return {phase: float(value) for phase, value in (factors or {}).items() if isinstance(value, (int, float))}


def _read(path: Path) -> dict:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}
