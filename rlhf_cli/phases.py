"""The phases of an optimizer step: one vocabulary for what the plan predicts, what the ranks measure, and what the
rehearsal, the progress line and a run's summary show beside each other.

Each name is its JSON key (the plan's `time` and `phases`, a rank record's and summary.json's `phases`), so it
prints, formats and compares as that text. The plan times seven phases (`Phase`) and sizes memory at four moments
beside what every moment holds (`MemoryPhase`); a rank's clock tells four apart (`StepPhase`), each one or more of
the plan's: `train` is scoring, training, the optimizer step and waiting, which one clock cannot separate.
A leaf: nothing here imports rlhf or a library.
"""

from __future__ import annotations

from enum import Enum


class _Name(str, Enum):
    """A phase named by its JSON key: `str()`, f-strings and `==` see that text, not `Class.MEMBER`."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class Phase(_Name):
    """What the plan predicts seconds for, per optimizer step (rlhf_cli/plan/time.py), in the plan JSON's order."""

    GENERATION = "generation"  # sampling the rollouts: HF generate or a separate engine
    WEIGHT_SYNC = "weight_sync"  # refreshing a separate engine's weights
    SCORING = "scoring"  # no-grad forwards: reference, reward, value, old log-probs
    TRAINING = "training"  # forward and backward
    OPTIMIZER_STEP = "optimizer_step"
    SAVING = "saving"  # a checkpoint's write, amortised over the steps between saves
    WAITING = "waiting"  # on other ranks


class MemoryPhase(_Name):
    """When the memory plan's components are on a GPU (rlhf_cli/plan/memory.py): `static` throughout, each other one
    only during its phase; the peak is `static` plus the largest of the others."""

    STATIC = "static"
    GENERATION = "generation"
    TRAINING = "training"
    STEP = "step"  # the optimizer step
    SYNC = "sync"  # refreshing a separate engine's weights


class StepPhase(_Name):
    """What each rank's clock charges a step's time to (rlhf_cli/rank/phases.py), in the records' order."""

    GENERATION = "generation"
    SYNC = "sync"
    SAVING = "saving"
    TRAIN = "train"  # the rest of the step

    @property
    def planned(self) -> tuple[Phase, ...]:
        """The plan's phases this one measures."""
        return _PLANNED[self]


_PLANNED = {StepPhase.GENERATION: (Phase.GENERATION,), StepPhase.SYNC: (Phase.WEIGHT_SYNC,),
            StepPhase.SAVING: (Phase.SAVING,),
            StepPhase.TRAIN: (Phase.SCORING, Phase.TRAINING, Phase.OPTIMIZER_STEP, Phase.WAITING)}
# The phases every step spends; saving is counted per save, not per step (rlhf_cli/machine/corrections.py)
EVERY_STEP = (StepPhase.GENERATION, StepPhase.SYNC, StepPhase.TRAIN)
