"""How a rank that raises ends: its error recorded for the launcher, once, and never a second traceback."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
from pathlib import Path

from rlhf_cli.output.run_dir import FAILED, RunDir
from rlhf_cli.rank.lifecycle import disk_error

RAISING_RANK = """
import sys
from pathlib import Path
from rlhf_cli.rank.lifecycle import failures_recorded
with failures_recorded(Path(sys.argv[1])):
    raise ValueError("reward server returned 503")
"""


def run_raising_ranks(*output_dirs: Path) -> list[subprocess.CompletedProcess]:
    """One raising rank per output dir, side by side (each spends seconds importing transformers)."""
    ranks = [subprocess.Popen([sys.executable, "-c", RAISING_RANK, str(output_dir)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for output_dir in output_dirs]
    outputs = [rank.communicate(timeout=300) for rank in ranks]  # imports torch: slow on a loaded machine
    return [subprocess.CompletedProcess(rank.args, rank.returncode, *output)
            for rank, output in zip(ranks, outputs, strict=True)]


def test_a_raising_rank_records_its_error_and_prints_it_only_when_it_cannot(tmp_path: Path) -> None:
    recorded, unrecorded = tmp_path / "recorded", tmp_path / "unrecorded"
    unrecorded.mkdir()
    (unrecorded / "ranks").write_text("not a directory")  # no record can be written there, whoever runs the test
    done, cannot = run_raising_ranks(recorded, unrecorded)
    assert done.returncode == 1 and done.stderr == ""  # the launcher prints the traceback of the rank to blame
    record = json.loads(RunDir(recorded).rank_error(0).read_text())
    assert (record["kind"], record["type"], record["message"], record["first"], record["disk"]) == \
        ("error", "ValueError", "reward server returned 503", True, None)
    assert record["traceback"].startswith("Traceback") and "line 6, in <module>" in record["traceback"]
    assert RunDir(recorded).first_failure.read_text() == FAILED
    assert cannot.returncode == 1
    assert cannot.stderr.count("Traceback (most recent call last)") == 1
    assert "ValueError: reward server returned 503" in cannot.stderr and "During handling" not in cannot.stderr


def test_a_full_or_read_only_disk_is_recognised_in_the_errors_it_caused(tmp_path: Path) -> None:
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as full:
            raise RuntimeError("saving checkpoint-6 failed") from full
    except RuntimeError as error:
        assert disk_error(error, tmp_path) == "no space left on device"
    assert disk_error(RuntimeError('IoError(Os { code: 28, kind: StorageFull, .. }) (os error 28)'), tmp_path) == \
        "no space left on device"
    assert disk_error(OSError(errno.EROFS, "Read-only file system"), tmp_path) == "read-only file system"
    assert disk_error(ValueError("reward server returned 503"), tmp_path) is None  # the dir takes writes
    assert disk_error(RuntimeError("basic_ios::clear: iostream error"), tmp_path / "missing") is not None


class RecordingAccelerator:
    """The calls the end of a rank makes on accelerate, in order, into `events`."""

    def __init__(self, events: list[str], is_main_process: bool) -> None:
        self.events, self.is_main_process = events, is_main_process

    def wait_for_everyone(self) -> None:
        self.events.append("barrier")

    def end_training(self) -> None:
        self.events.append("process group destroyed")


class FinishedTrainer:
    def __init__(self, events: list[str], output_dir: Path, is_main_process: bool) -> None:
        from types import SimpleNamespace

        self.events = events
        self.args = SimpleNamespace(output_dir=str(output_dir))
        self.accelerator = RecordingAccelerator(events, is_main_process)

    def save_model(self, output_dir: str) -> None:
        self.events.append("model saved")

    def save_state(self) -> None:
        self.events.append("state saved")


def test_the_adapter_merges_after_the_ranks_part_so_no_barrier_waits_for_it(tmp_path: Path, monkeypatch) -> None:
    """Before: rank 0 merged while the others waited in a barrier bounded by ddp_timeout (5 x stall_timeout), and a
    slow merge (a large base model loaded whole) failed the run at its very end."""
    from rlhf_cli.rank import lora, record
    from rlhf_cli.rank.__main__ import finish

    from types import SimpleNamespace

    from rlhf_cli.generation.choice import Engine, Gather, Generation

    events: list[str] = []
    monkeypatch.setattr(lora, "save_merged_model", lambda inputs, output_dir: events.append("merged"))
    monkeypatch.setattr(record, "write_summary", lambda *args: events.append("summary"))
    inputs = SimpleNamespace(generation=lambda: Generation(Gather.whole, Engine.server))
    for is_main_process in (True, False):
        events.clear()
        (tmp_path / "vllm-weights").mkdir(exist_ok=True)  # the server's weight files, which rank 0 removes
        assert finish(FinishedTrainer(events, tmp_path, is_main_process), inputs, "ppo", None, None, 0.0) == 0
        parted = ["model saved", "state saved", "summary", "barrier", "process group destroyed"]
        assert events == parted + (["merged"] if is_main_process else [])
        assert (tmp_path / "vllm-weights").exists() != is_main_process
