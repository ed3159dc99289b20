"""The metrics a run logged (`trainer_state.json`), grouped into the curves worth plotting."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from rlhf_cli.errors import RlhfError
from rlhf_cli.output.run_dir import TRAINER_STATE, RunDir


@dataclass(frozen=True)
class Panel:
    title: str
    names: tuple[str, ...]  # the names the algorithms log this quantity under
    non_negative: bool = False  # the y axis starts at 0


# RLOO logs `reward`, PPO and online DPO `objective/scores`, ... Every name present in a run is drawn in its
# panel; panels with none are left out.
PANELS = (
    Panel("Reward", ("reward", "objective/scores", "objective/rlhf_reward")),
    Panel("KL to the reference", ("kl", "objective/kl")),
    Panel("Loss", ("loss", "loss/policy_avg")),
    Panel("Value loss", ("loss/value_avg",), non_negative=True),
    Panel("Clip fraction", ("policy/clipfrac_avg", "val/clipfrac_avg"), non_negative=True),
    # GRPO with tools: calls per completion, failed calls per call
    Panel("Tool calls", ("tools/call_frequency", "tools/failure_frequency"), non_negative=True),
)


@dataclass(frozen=True)
class RunMetrics:
    source: Path  # the trainer_state.json read
    steps: list[int]
    series: dict[str, list[float | None]]  # metric -> its value at each step, None where it was not logged
    panels: list[tuple[Panel, list[str]]]  # (panel, its metrics present), in PANELS order


def find_state(run_dir: Path) -> Path:
    """The run's own trainer_state.json, else the one of its newest checkpoint."""
    if not run_dir.is_dir():
        raise RlhfError(f"{run_dir}: no such run directory")
    layout = RunDir(run_dir)
    found = [layout.trainer_state, *(checkpoint / TRAINER_STATE for _, checkpoint in layout.checkpoints())]
    state = next((path for path in found if path.is_file()), None)
    if state is None:
        raise RlhfError(f"{run_dir}: no {TRAINER_STATE} here or in a checkpoint-*/ directory; it is written when a "
                        "run ends or saves a checkpoint")
    return state


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def load_metrics(run_dir: Path) -> RunMetrics:
    source = find_state(run_dir)
    try:
        history = json.loads(source.read_text()).get("log_history", [])
    except (OSError, ValueError, AttributeError) as error:
        raise RlhfError(f"{source}: not a readable trainer state ({error})") from None
    names = [name for panel in PANELS for name in panel.names]
    entries = [entry for entry in history if isinstance(entry, dict) and "step" in entry
               and any(_number(entry.get(name)) is not None for name in names)]
    if not entries:
        raise RlhfError(f"{source}: no training metrics logged ({', '.join(names[:4])}, ...); "
                        "set logging_steps to log them")
    steps = [_step(source, entry["step"]) for entry in entries]
    series = {name: [_number(entry.get(name)) for entry in entries] for name in names}
    series = {name: values for name, values in series.items() if any(v is not None for v in values)}
    panels = [(panel, [name for name in panel.names if name in series]) for panel in PANELS]
    return RunMetrics(source, steps, series, [(panel, present) for panel, present in panels if present])


STEPS = 2**63  # a trainer counts its steps in 64 bits


def _step(source: Path, value: object) -> int:
    """A logged entry's step: a whole number from 0 up (the trainer writes ints; a hand-edited file may not)."""
    number = _number(value)
    if number is None or not math.isfinite(number) or number != int(number) or not 0 <= number < STEPS:
        raise RlhfError(f"{source}: a logged `step` is {value!r}, not a step number (0, 1, 2, ...); the file was "
                        "changed after the run wrote it: restore it, or remove that entry of log_history")
    return int(number)


def sample_rows(count: int, most: int) -> list[int]:
    """Indices of at most `most` rows spread evenly over `count`, always the first and the last."""
    if count <= most:
        return list(range(count))
    return sorted({round(i * (count - 1) / (most - 1)) for i in range(most)})
