"""What rank 0 shows while training: a live bar in a terminal, one plain line per logging step in a log.

It replaces transformers' tqdm bar and dict printing. The few numbers that matter per algorithm are
picked from the logged metrics; everything is still in trainer_state.json and the configured loggers.
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import time
from typing import Any

from transformers import TrainerCallback

from rlhf_cli.algorithms import algorithm
from rlhf_cli.algorithms.trl_generating import micro_batches_per_round
from rlhf_cli.machine.corrections import run_seconds, saves_left, weighed
from rlhf_cli.output.run_dir import PLANNED_SAVE_ENV, PLANNED_STEP_ENV
from rlhf_cli.phases import EVERY_STEP, StepPhase
from rlhf_cli.rank import terminal
from rlhf_cli.rank.engines.sync_log import SYNC_LOG
from rlhf_cli.rank.phases import StepPhases
from rlhf_cli.rank.terminal import PHASES, output_mode
from rlhf_cli.rank.zero3 import GenerationClock


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def _eta_clock(seconds: float) -> str:
    """The ETA rounded, not cut; under a minute to a tenth of a second (a short run's whole seconds would be its
    error)."""
    if seconds < 59.95:
        return f"0:00:{seconds:04.1f}"
    return _clock(round(seconds))


def _planned_save() -> float:
    """Seconds of one save as the plan put them (the launcher hands them down); 0 when it did not."""
    try:
        return max(0.0, float(os.environ.get(PLANNED_SAVE_ENV, "")))
    except ValueError:
        return 0.0


def _planned_steps() -> dict[str, float] | None:
    """The plan's seconds per step by step phase (the launcher hands them down when the plan timed this machine);
    None when it did not, or they cannot be read."""
    try:
        found = json.loads(os.environ.get(PLANNED_STEP_ENV, ""))
    except ValueError:
        return None
    if not isinstance(found, dict):
        return None
    return {phase: float(seconds) for phase, seconds in found.items()
            if isinstance(seconds, (int, float)) and seconds >= 0}


def _generation_period(args: Any) -> int:
    """Optimizer steps per generation round: TRL's RLOO and GRPO generate every `micro_batches_per_round`; the other
    trainers (without those fields) every step."""
    accumulation = getattr(args, "gradient_accumulation_steps", None) or 1
    return max(1, micro_batches_per_round(lambda key: getattr(args, key, None)) // accumulation)


def _without_one_off(steps: list[tuple[int, dict[str, float]]], period: int) -> list[tuple[int, dict[str, float]]]:
    """The window's steps (how many, their phases' seconds) less one that took ONE_OFF times the others' median (an
    engine's compile at its first new shape, a self-check): it happens once, and a short window's mean would carry
    it for as many steps as the window is long. Kept where generation comes every `period` > 1 steps: there a slow
    step is the round's generation, which comes again."""
    if period > 1 or len(steps) < 3:
        return steps
    seconds = [sum(phases.values()) / count for count, phases in steps]
    slowest = max(range(len(steps)), key=seconds.__getitem__)
    median = statistics.median(seconds[:slowest] + seconds[slowest + 1:])
    return steps[:slowest] + steps[slowest + 1:] if seconds[slowest] > ONE_OFF * median else steps


ONE_OFF = 3  # a step this many times the window's median is a one-off, left out of the rate
MARKS_KEPT = 401  # step marks the ETA keeps: its rate spans at most the last 200 steps, and a long run holds 401


class TrainingProgress(TrainerCallback):
    """Rank 0's view of training; `live` redraws a bar, otherwise each log is one line."""

    def __init__(self, name: str, console: Any = None) -> None:
        from rich.console import Console

        self.algorithm = algorithm(name)
        self.console = console or Console(file=terminal.stdout())
        self.live = self.console.is_terminal
        self.progress: Any = None
        self.task: Any = None
        self.started = time.monotonic()
        self.first_step = 0
        self.logged_step = 0
        self.marks: list[tuple[int, dict[str, float]]] = []  # (step, phases so far) at each step's end from the first
        self.period = 1  # optimizer steps per generation round (`_generation_period`)
        self.saves = 0

    def on_train_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        self.started = time.monotonic()
        self.first_step = self.logged_step = state.global_step  # a resumed run's ETA counts the steps done now
        self.period = _generation_period(args)
        PHASES.stop()
        first = "generating the first completions"
        if not self.live:
            self.console.print(f"{first}  elapsed {_clock(time.monotonic() - PHASES.started)}", markup=False,
                               highlight=False, soft_wrap=True)
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.progress = Progress(
            TextColumn(f"[bold]{self.algorithm.command}"), BarColumn(bar_width=24), MofNCompleteColumn(),
            TimeElapsedColumn(), TextColumn("eta {task.fields[eta]}"), TextColumn("{task.fields[metrics]}"),
            console=self.console,
        )
        self.task = self.progress.add_task("train", total=state.max_steps, completed=state.global_step, metrics=first,
                                           eta="-:--:--")
        self.progress.start()

    def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        if not self.marks or state.global_step > self.marks[-1][0]:
            self.marks.append((state.global_step, StepPhases.current().snapshot()))
            if len(self.marks) > MARKS_KEPT:  # a long run: the rate spans the last MARKS_KEPT // 2 steps
                del self.marks[0]
        if self.progress is not None:
            self.progress.update(self.task, completed=state.global_step, eta=_eta_clock(self.eta(args, state)))

    def on_save(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        self.saves += 1

    def eta(self, args: Any, state: Any) -> float:
        """The rest of the run from its own measured phases (rlhf_cli/machine/corrections.py's model): each
        phase's seconds per step over the later half of the steps since the first (`steady_phases`), times the
        steps left, plus the saves left, the final model's among them, at the seconds its saves took (none yet:
        at the plan's seconds of a save, when the launcher handed them down). The steady steps are weighed against
        the plan's, when it timed this machine (`weighed`); without it, a straight line through elapsed time until a
        second step is done."""
        steady, planned = self.steady_phases(), _planned_steps()
        if steady is None and planned is None:
            done = state.global_step - self.first_step
            elapsed = time.monotonic() - self.started
            return elapsed / done * (state.max_steps - state.global_step) if done else 0.0
        per_step = weighed(*(steady or ({}, 0)), planned)
        saving = StepPhases.current().snapshot()[StepPhase.SAVING] / self.saves if self.saves else _planned_save()
        saving_by_steps = str(getattr(args, "save_strategy", "no")).lower().endswith("steps")
        save_steps = getattr(args, "save_steps", None) if saving_by_steps else None
        left = saves_left(state.global_step, state.max_steps, int(save_steps) if save_steps else None)
        return run_seconds(per_step, state.max_steps - state.global_step, left, saving)

    def steady_phases(self) -> tuple[dict[str, float], int] | None:
        """Each step phase's seconds per step over the later half of the steps after the first (the first carries
        the start-up; the next few still warm up: at step 3 of a smoke run steps 2 and 3 took a quarter more than
        the rest), so that the rate follows the run's steady steps as they come (in a long run, its last 200 steps),
        less a one-off slow step (`_without_one_off`), and how many steps that is; None before a second step."""
        if len(self.marks) < 2:
            return None
        window = self.marks[(len(self.marks) - 1) // 2:]
        steps = _without_one_off([(step - since, {phase: now[phase] - before[phase] for phase in EVERY_STEP})
                                  for (since, before), (step, now) in itertools.pairwise(window)], self.period)
        count = sum(number for number, _ in steps)
        return {phase: sum(phases[phase] for _, phases in steps) / count for phase in EVERY_STEP}, count

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **_: Any) -> None:
        metrics = self.algorithm.format_metrics(logs or {})
        if not metrics:
            return  # the end-of-training summary log; the launcher prints the summary
        generating, steps = GenerationClock.take(), state.global_step - self.logged_step
        self.logged_step = state.global_step
        if generating and steps > 0:
            metrics += f"  gen {generating / steps:.3g} s/step"
        metrics += SYNC_LOG.progress_text()
        if self.progress is not None:
            self.progress.update(self.task, completed=state.global_step, metrics=metrics)
            return
        elapsed = time.monotonic() - self.started
        self.console.print(f"step {state.global_step}/{state.max_steps}  {metrics}  elapsed {_clock(elapsed)}  "
                           f"eta {_eta_clock(self.eta(args, state))}", markup=False, highlight=False, soft_wrap=True)

    def on_train_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


def quiet_libraries(mode: str, is_rank_zero: bool) -> None:
    """Library chatter: rank 0 keeps warnings, other ranks (and --quiet) keep errors; --verbose keeps all."""
    if mode == "verbose":
        return
    import logging
    import warnings

    import datasets
    import transformers

    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    transformers.utils.logging.disable_progress_bar()  # per-file save bars; our progress is the one bar
    # Deprecation notices inside torch, transformers and TRL are for their developers, not for a run's log.
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("once", category=UserWarning)
    if mode == "quiet" or not is_rank_zero:
        transformers.logging.set_verbosity_error()
        datasets.logging.set_verbosity_error()
        logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
        warnings.filterwarnings("ignore")


def use_progress(trainer: Any, name: str) -> None:
    """Swap transformers' progress printing for ours (rank 0, unless --quiet)."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(ProgressCallback)
    trainer.remove_callback(PrinterCallback)
    if trainer.accelerator.is_main_process and output_mode() != "quiet":
        trainer.add_callback(TrainingProgress(name))
