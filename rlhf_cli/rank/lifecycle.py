"""How a rank ends: preempted with a checkpoint, failed with its error recorded once, or finished.

Preemption: SLURM (and `kill`) send SIGTERM or SIGUSR1 before killing a job. A rank that gets one
only notes it; at the end of the step every rank learns whether any rank got one (one all-reduce), so
they all save the same checkpoint and stop together, then rank 0 leaves `preempted.json` for the launcher.

Failure: the first rank to fail writes its traceback to `ranks/rank-N.error.json` and prints it; ranks
that fail because of it (a peer gone mid-collective) record their error quietly and exit at once.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from rlhf_cli.checkpoints import write_manifest
from rlhf_cli.run_dir import RunDir

PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


def global_rank() -> int:
    return int(os.environ.get("RANK", "0"))


class StopRequest:
    """Set by a preemption signal on this rank; read once per step by `CheckpointAndStop`."""

    def __init__(self, output_dir: Path) -> None:
        self.output_dir = output_dir
        self.signal_name: str | None = None

    def install(self) -> None:
        for sig in PREEMPTION_SIGNALS:
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if RunDir(self.output_dir).first_failure.exists():
            os._exit(1)  # another rank failed and the launcher is stopping us: nothing left to save
        if self.signal_name is None and global_rank() == 0:
            print(f"rlhf: {signal.Signals(signum).name} received: saving a checkpoint after this step, then stopping",
                  file=sys.stderr, flush=True)
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
    """Once every rank has written a checkpoint, rank 0 adds the manifest that marks it whole."""

    def __init__(self, accelerator: Any) -> None:
        self.accelerator = accelerator

    def on_save(self, args: Any, state: Any, control: Any, **_: Any) -> Any:
        self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            write_manifest(RunDir(Path(args.output_dir)).checkpoint(state.global_step))
        self.accelerator.wait_for_everyone()
        return control


def write_preempted(output_dir: Path, step: int, signal_name: str | None) -> None:
    run_dir = RunDir(output_dir)
    record = {"step": step, "checkpoint": str(run_dir.checkpoint(step)), "signal": signal_name,
              "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    run_dir.preempted.write_text(json.dumps(record, indent=2) + "\n")


def _claim_first_failure(output_dir: Path) -> bool:
    """True for exactly one failing rank: the first to create the marker (O_EXCL)."""
    marker = RunDir(output_dir).first_failure
    marker.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def _stop_when_another_rank_fails(output_dir: Path, interval_s: float) -> None:
    """A rank blocked in a collective whose peer died may wait for NCCL's timeout (30 minutes by default),
    on another machine too. The first failure's marker sits in the shared output dir: seeing it, exit."""
    marker = RunDir(output_dir).first_failure

    def watch() -> None:
        while not marker.exists():
            time.sleep(interval_s)
        time.sleep(interval_s)  # the failing rank writes its record and exits first
        os._exit(1)

    threading.Thread(target=watch, name="rlhf-failure-watch", daemon=True).start()


@contextmanager
def failures_recorded(output_dir: Path, watch_interval_s: float = 2.0) -> Iterator[None]:
    """Turn an exception on this rank into an error record, one printed traceback per job, and exit 1.
    Also ends this rank within a few seconds of any other rank's failure."""
    _stop_when_another_rank_fails(output_dir, watch_interval_s)
    try:
        yield
    except Exception as error:  # noqa: BLE001 - every failure of a rank ends the job the same way
        rank = global_rank()
        first = _claim_first_failure(output_dir)
        text = traceback.format_exc()
        record = {"rank": rank, "hostname": socket.gethostname(), "first": first,
                  "type": type(error).__name__, "message": str(error).strip().splitlines()[0] if str(error) else "",
                  "traceback": text, "time": time.time()}
        RunDir(output_dir).rank_error(rank).write_text(json.dumps(record, indent=2) + "\n")
        if first:
            print(f"rank {rank} on {record['hostname']} failed:\n{text}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)  # skip interpreter teardown: it can block in collectives whose peers are gone
