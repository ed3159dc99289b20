"""How a rank ends: preempted with a checkpoint, failed with its error recorded once, or finished.

Preemption: SLURM (and `kill`) send SIGTERM or SIGUSR1 before killing a job. A rank that gets one
only notes it; at the end of the step every rank learns whether any rank got one (one all-reduce), so
they all save the same checkpoint and stop together, then rank 0 leaves `preempted.json` for the launcher.

Failure: a rank that raises writes its error and traceback to `ranks/rank-N.error.json`, raises the first-failure
marker (the first to do so is the first failure) and exits; the launcher, which learns how every rank ended,
prints the traceback of the one that caused it. Every other rank stops on seeing the marker (rlhf_cli.rank.watch).
"""

from __future__ import annotations

import errno
import json
import signal
import socket
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from rlhf_cli.output.checkpoints import SavedBy, write_manifest
from rlhf_cli.output.files import claim, marker_says, try_write_json, unwritable
from rlhf_cli.output.run_dir import FAILED, RunDir
from rlhf_cli.phases import StepPhase
from rlhf_cli.rank import terminal
from rlhf_cli.rank.phases import StepPhases
from rlhf_cli.rank.watch import PROGRESS, SAVING, TRAINING, exit_now, global_rank, lost_a_rank, stop_for_another_rank

PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
# A failed write into the output dir, as the error says it: errno, or the text of libraries that keep no errno.
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)
DISK_TEXTS = {"No space left on device": "no space left on device", "os error 28": "no space left on device",
              "Disk quota exceeded": "disk quota exceeded", "Read-only file system": "read-only file system"}


class StopRequest:
    """Set by a preemption signal on this rank; read once per step by `CheckpointAndStop`."""

    def __init__(self, output_dir: Path) -> None:
        self.output_dir = output_dir
        self.signal_name: str | None = None

    def install(self) -> None:
        for sig in PREEMPTION_SIGNALS:
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        run_dir = RunDir(self.output_dir)
        if marker_says(run_dir.first_failure) is not None or lost_a_rank(run_dir):
            stop_for_another_rank(run_dir)  # stopped after a failure, not preempted: nothing left to save
        if self.signal_name is None and global_rank() == 0:
            print(f"rlhf: {signal.Signals(signum).name} received: saving a checkpoint after this step, then stopping",
                  file=terminal.stderr(), flush=True)
        self.signal_name = signal.Signals(signum).name


class CheckpointAndStop(TrainerCallback):
    """After each step: if any rank was asked to stop, every rank saves a checkpoint and training ends."""

    def __init__(self, request: StopRequest, accelerator: Any) -> None:
        self.request = request
        self.accelerator = accelerator
        self.stopped_at: int | None = None

    def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> Any:
        import torch

        asked = torch.tensor([1.0 if self.request.signal_name else 0.0], device=self.accelerator.device)
        if self.accelerator.reduce(asked, reduction="sum").item() > 0:
            control.should_save = True
            control.should_training_stop = True
            self.stopped_at = state.global_step
        return control


class CompleteCheckpoints(TrainerCallback):
    """Once every rank has written a checkpoint, rank 0 adds the manifest that marks it whole, with what resuming
    it needs to know: the algorithm, and the processes and batch layout that saved it."""

    def __init__(self, accelerator: Any, algorithm: str) -> None:
        self.accelerator = accelerator
        self.algorithm = algorithm.replace("-", "_")

    def on_save(self, args: Any, state: Any, control: Any, **_: Any) -> Any:
        self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            saved_by = SavedBy(self.algorithm, self.accelerator.num_processes, args.per_device_train_batch_size,
                               args.gradient_accumulation_steps)
            write_manifest(RunDir(Path(args.output_dir)).checkpoint(state.global_step), saved_by)
        self.accelerator.wait_for_everyone()
        return control


def write_preempted(output_dir: Path, step: int, signal_name: str | None) -> None:
    run_dir = RunDir(output_dir)
    record = {"step": step, "checkpoint": str(run_dir.checkpoint(step)), "signal": signal_name,
              "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    run_dir.preempted.write_text(json.dumps(record, indent=2) + "\n")


class MovesAndPhases(TrainerCallback):
    """Tells the watch what the trainer does: each step, log and save is a move; a save is busy (rlhf_cli.rank.watch).
    Times the step phases too (rlhf_cli/rank/phases.py): training from its first step to its end, a save from the
    step that asks for it to transformers' on_save. Added last, so that it sees a save asked for by any callback
    before it."""

    def __init__(self) -> None:
        self.phases = StepPhases.current()
        self.first_step = 0

    def on_train_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        PROGRESS.phase = TRAINING
        PROGRESS.move()
        self.first_step = state.global_step  # a resumed run's steps per second count this launch's
        self.phases.begin(StepPhase.TRAIN)

    def on_step_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        PROGRESS.move()

    def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        PROGRESS.move()
        if control.should_save:
            PROGRESS.phase = SAVING
            self.phases.begin(StepPhase.SAVING)

    def on_epoch_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        if control.should_save and StepPhase.SAVING not in self.phases.open:
            PROGRESS.phase = SAVING
            self.phases.begin(StepPhase.SAVING)

    def on_log(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        PROGRESS.move()

    def on_save(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        PROGRESS.phase = TRAINING
        PROGRESS.move()
        self.phases.end(StepPhase.SAVING)

    def on_train_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        PROGRESS.phase = SAVING  # the final model and state, then the last barrier
        self.phases.end(StepPhase.SAVING)
        self.phases.end(StepPhase.TRAIN)

    def record(self, state: Any) -> dict[str, Any]:
        """The step phases of this launch's steps (rlhf_cli/rank/phases.StepPhases.record)."""
        return self.phases.record(state.global_step - self.first_step)


def disk_error(error: BaseException, output_dir: Path) -> str | None:
    """Why writing failed, when `error` (or one it came from) says the disk is full or read-only, or when the output
    dir takes no more writes: torch.save on a full disk says only "iostream error" or "unexpected pos"."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in DISK_ERRNOS:
            return (seen.strerror or str(seen)).lower()
        found = next((what for text, what in DISK_TEXTS.items() if text in str(seen)), None)
        if found:
            return found
        seen = seen.__cause__ or seen.__context__
    return unwritable(output_dir)


@contextmanager
def failures_recorded(output_dir: Path) -> Iterator[None]:
    """Turn an exception on this rank into its error record and the first-failure marker, and exit 1. The
    launcher prints the traceback of the rank that caused the failure; a rank prints its own only when it could
    not record it (and not for a full disk, which the launcher's line explains)."""
    try:
        yield
    except Exception as error:  # noqa: BLE001 - every failure of a rank ends the job the same way
        rank = global_rank()
        run_dir = RunDir(output_dir)
        text = traceback.format_exc()
        message = str(error).strip()
        record = {"rank": rank, "hostname": socket.gethostname(), "first": claim(run_dir.first_failure, FAILED),
                  "kind": "error", "type": type(error).__name__, "message": message.splitlines()[0] if message else "",
                  "disk": disk_error(error, output_dir), "traceback": text, "time": time.time()}
        if not try_write_json(run_dir.rank_error(rank), record) and not record["disk"]:
            print(f"rank {rank} on {record['hostname']} failed:\n{text}", file=terminal.stderr(), flush=True)
        exit_now(1)
