"""How the launcher explains a failure, from what the launch supervisors and the ranks left behind; printed as
text, never markup. No launch: the records are written here as the supervisor and the ranks write them."""

from __future__ import annotations

import errno
import io
import json
import signal
import socket
from pathlib import Path

import pytest
from fixtures.rewards import MARKUP
from rich.console import Console

from helpers import RECIPES
from rlhf_cli.cli import output
from rlhf_cli.config.resolve import RunRequest, resolve
from rlhf_cli.errors import OutputDirError
from rlhf_cli.launch import faults, runner
from rlhf_cli.launch.faults import Failure, PlanNeeds, explain, space_warning
from rlhf_cli.launch.supervisor import record_exits
from rlhf_cli.output.checkpoints import SavedBy, write_manifest
from rlhf_cli.output.run_dir import FAILED, RUN_DIR_ENV, RunDir

HOST = socket.gethostname()
GIB = 2**30


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def exits(run_dir: RunDir, *ends: tuple[int, int, int], memory: int = 16 * GIB, machine: int = 0,
          host: str = HOST) -> None:
    """The supervisor's record: (rank, exit code or -signal, time) per failed rank."""
    write_json(run_dir.rank_exits(machine), {"machine_rank": machine, "host": host, "memory": memory, "exits": [
        {"rank": rank, "local_rank": rank, "pid": 100 + rank, "exitcode": code, "time": when}
        for rank, code, when in ends]})


def error_record(run_dir: RunDir, rank: int, message: str, first: bool = True, when: float = 1000.5,
                 disk: str | None = None) -> None:
    write_json(run_dir.rank_error(rank), {
        "rank": rank, "hostname": HOST, "first": first, "kind": "error", "type": "RuntimeError", "message": message,
        "disk": disk, "traceback": f"Traceback (most recent call last):\nRuntimeError: {message}\n", "time": when})


def test_a_killed_rank_is_blamed_not_the_survivor_that_recorded_the_broken_connection(tmp_path: Path) -> None:
    run_dir = RunDir(tmp_path)
    error_record(run_dir, 0, "[/__w/pytorch/third_party/gloo/pair.cc:545] Connection reset by peer")
    exits(run_dir, (0, 1, 1000), (1, -signal.SIGKILL, 1000))
    failure = explain(run_dir, PlanNeeds(cpu_per_machine=int(265.8 * GIB)))
    assert failure == Failure(f"rank 1 on {HOST} was killed by SIGKILL (often the out-of-memory killer: this machine "
                              "has 16.0 GiB, the plan needs 265.8 GiB of CPU memory per machine)")
    exits(run_dir, (3, -signal.SIGKILL, 1000), memory=0, machine=1, host="node-b")
    run_dir.rank_exits(0).unlink()
    assert explain(run_dir, PlanNeeds()).line == \
        "rank 3 on node-b was killed by SIGKILL (often the out-of-memory killer)"


def test_torchs_own_signals_to_survivors_blame_no_one(tmp_path: Path) -> None:
    """torch's agent stops the survivors with SIGTERM, then SIGKILL 30 s later: the cause is the rank that raised."""
    run_dir = RunDir(tmp_path)
    error_record(run_dir, 1, "reward server returned 503")
    exits(run_dir, (1, 1, 1000), (0, -signal.SIGTERM, 1000), (2, -signal.SIGKILL, 1030))
    failure = explain(run_dir, PlanNeeds())
    assert failure.line.startswith(f"rank 1 on {HOST} failed: RuntimeError: reward server returned 503 (traceback")
    assert failure.traceback.endswith("RuntimeError: reward server returned 503\n")


def test_an_abort_is_named_only_when_nothing_else_explains_the_failure(tmp_path: Path) -> None:
    """Gloo's threads abort a rank whose peer is gone: often a consequence, so a recorded error comes first."""
    run_dir = RunDir(tmp_path)
    exits(run_dir, (0, 1, 1000), (1, -signal.SIGABRT, 1000))
    assert explain(run_dir, PlanNeeds()).line == \
        f"rank 1 on {HOST} was killed by SIGABRT (an abort in native code, often after another failure)"
    error_record(run_dir, 0, "CUDA error: an illegal memory access was encountered")
    assert "rank 0" in explain(run_dir, PlanNeeds()).line


def watch_record(run_dir: RunDir, kind: str, named: list[tuple[int, str, int]], behind: bool = True) -> None:
    write_json(run_dir.rank_error(0), {"rank": 0, "hostname": HOST, "first": True, "kind": kind, "time": 1000.0,
                                       "stall_timeout": 120.0, "behind": behind,
                                       "named": [{"rank": r, "host": h, "seconds": s} for r, h, s in named]})


def test_the_watch_verdicts_read_as_one_line(tmp_path: Path) -> None:
    run_dir = RunDir(tmp_path)
    stacks = f"{run_dir.stack(1)} (every rank's beside it)"
    error_record(run_dir, 0, "Connection closed by peer", first=False, when=1001.0)  # the stall's consequence
    watch_record(run_dir, "stalled", [(1, "a", 124)])
    assert explain(run_dir, PlanNeeds()).line == (
        "rank 1 on a stalled: no progress for 124 s while the other ranks waited for it in a collective "
        f"(stall_timeout 120 s); Python stack: {stacks}")
    watch_record(run_dir, "stalled", [(0, "a", 130), (1, "a", 130)], behind=False)
    assert explain(run_dir, PlanNeeds()).line.startswith(
        "the job stalled: no rank made progress for 130 s, and none is behind the others (stall_timeout 120 s)")
    watch_record(run_dir, "silent", [(2, "b", 125), (3, "b", 125)])
    assert explain(run_dir, PlanNeeds()).line.startswith(
        "ranks 2, 3 on b went silent: no heartbeat for 125 s (its machine is down, or the process froze)")
    watch_record(run_dir, "gone", [(1, "a", 0)])
    assert explain(run_dir, PlanNeeds()).line == \
        "rank 1 on a ended without a word (its process is gone: killed?); the other ranks stopped"


def test_a_full_disk_is_one_line_with_the_free_space_and_the_checkpoint_to_resume(tmp_path: Path, monkeypatch) -> None:
    run_dir = RunDir(tmp_path)
    for step in (2, 4, 6):
        (run_dir.checkpoint(step) / "model.safetensors").parent.mkdir(parents=True)
        (run_dir.checkpoint(step) / "model.safetensors").write_text("weights")
    write_manifest(run_dir.checkpoint(2), SavedBy("rloo", 2, 2, 1))
    write_manifest(run_dir.checkpoint(4), SavedBy("rloo", 2, 2, 1))  # checkpoint-6's save never finished
    error_record(run_dir, 0, "basic_ios::clear: iostream error", disk="no space left on device")
    monkeypatch.setattr(faults, "free_space", lambda path: 12 * 2**10)
    expected = (f"writing to {tmp_path} failed (no space left on device); 12.0 KiB free; the newest complete "
                f"checkpoint is {run_dir.checkpoint(4)}: make room, then run again with --resume auto --output-dir "
                f"{tmp_path}")
    assert explain(run_dir, PlanNeeds()) == Failure(expected)
    run_dir.rank_error(0).unlink()  # the rank could not even write its record: the launcher tries the dir itself
    assert explain(run_dir, PlanNeeds()) is None  # this dir takes writes: nothing to tell
    monkeypatch.setattr(faults, "unwritable", lambda directory: "no space left on device")
    assert explain(run_dir, PlanNeeds()) == Failure(expected)


def test_run_json_lists_the_rank_records_and_a_new_attempt_forgets_the_last_ones_ending(tmp_path: Path) -> None:
    run_dir = RunDir(tmp_path)
    for name in ("rank-0.json", "rank-1.json", "rank-1.error.json", "rank-0.heartbeat.json", "rank-1.stack.txt",
                 "machine-1.exits.json", "first-failure"):
        write_json(run_dir.ranks / name, {})
    assert run_dir.rank_records() == [run_dir.rank_record(0), run_dir.rank_record(1)]
    runner._clear_previous_outcome(run_dir)
    assert sorted(path.name for path in run_dir.ranks.iterdir()) == ["rank-0.json", "rank-1.json"]


def test_too_little_space_for_one_checkpoint_is_a_warning_before_launch(tmp_path: Path) -> None:
    free = faults.free_space(tmp_path)
    assert space_warning(tmp_path / "not-yet" / "run", free // 2) is None
    warning = space_warning(tmp_path / "not-yet" / "run", free * 2)
    assert warning.startswith(f"warning: {tmp_path} has ") and "one checkpoint of this run takes about" in warning


def test_an_output_dir_full_before_launch_is_a_one_line_error(tmp_path: Path, monkeypatch, check_passes) -> None:
    """Resolution checks that the dir may be written; a full disk says so only when a write fails."""
    def full(path: Path, text: str) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(runner, "write_atomic", full)
    run = resolve(RunRequest("rloo", str(RECIPES / "rloo" / "smoke.yaml"),
                             flags={"output_dir": ("-o", str(tmp_path / "run"))}), cwd=tmp_path, cuda=False)
    with pytest.raises(OutputDirError, match=rf"^cannot write to the output dir {tmp_path}/run: no space left on "
                                             r"device \([\d.]+ [KMGT]iB free\); choose another --output-dir, or make "
                                             "room$"):
        runner.launch(run)


def test_the_supervisor_records_how_its_ranks_ended_and_stops_the_other_machines(tmp_path: Path, monkeypatch) -> None:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from rlhf_cli.compat import launcher

    failed = ChildFailedError("rlhf_cli.rank", {
        4: ProcessFailure(local_rank=0, pid=11, exitcode=1, error_file="<N/A>"),
        5: ProcessFailure(local_rank=1, pid=12, exitcode=-9, error_file="<N/A>")})
    monkeypatch.setenv(RUN_DIR_ENV, str(tmp_path))
    record_exits(2, launcher.rank_exits(failed))
    run_dir = RunDir(tmp_path)
    record = json.loads(run_dir.rank_exits(2).read_text())
    assert record["host"] == HOST and record["memory"] > 0
    assert [(e["rank"], e["local_rank"], e["pid"], e["exitcode"]) for e in record["exits"]] == \
        [(4, 0, 11, 1), (5, 1, 12, -9)]
    assert run_dir.first_failure.read_text() == FAILED
    assert explain(run_dir, PlanNeeds()).line.startswith(f"rank 5 on {HOST} was killed by SIGKILL")


def test_text_from_ranks_and_libraries_is_printed_literally(tmp_path: Path, monkeypatch) -> None:
    captured = io.StringIO()
    monkeypatch.setattr(output, "stderr", Console(file=captured, width=400))
    run = resolve(RunRequest("rloo", str(RECIPES / "rloo" / "smoke.yaml"),
                             flags={"output_dir": ("-o", str(tmp_path / "[bold]out"))}), cwd=tmp_path, cuda=False)
    failure = Failure(f"rank 1 on vm failed: ValueError: 503 {MARKUP}", f"Traceback (most recent call last):\n"
                      f'  File "/__w/[/x]/rewards.py", line 3\nValueError: 503 {MARKUP}\n')
    output.print_outcome(runner.Outcome(1, "failed", failure=failure), run, quiet=False)
    assert captured.getvalue() == f"{failure.traceback}Error: {failure.line}\n"
    captured.truncate(0)
    summary = {"algorithm": "rloo", "global_step": 4, "max_steps": 4, "final_metrics": {}, "saved": f"/runs/{MARKUP}"}
    output.print_outcome(runner.Outcome(0, "finished", summary=summary), run, quiet=False)
    assert MARKUP in captured.getvalue()


def test_a_stall_inside_grpos_tool_loop_says_so(tmp_path: Path) -> None:
    """faulthandler's frames as a rank writes them: the stalled rank's main thread in TRL's tool loop (a tool that
    never returned), the other's in a collective."""
    run_dir = RunDir(tmp_path)
    watch_record(run_dir, "stalled", [(1, "a", 124)])
    in_loop = ('Thread 0x00007f (most recent call first):\n  File "/x/calc.py", line 9 in calculate\n'
               '  File "/x/trl/trainer/grpo_trainer.py", line 1978 in _tool_call_loop\n'
               '  File "/x/rlhf_cli/rank/agent_turns.py", line 41 in tool_call_loop\n')
    run_dir.stack(1).parent.mkdir(parents=True, exist_ok=True)
    run_dir.stack(1).write_text(in_loop)
    run_dir.stack(0).write_text('  File "/x/torch/distributed/distributed_c10d.py", line 2 in all_reduce\n')
    assert explain(run_dir, PlanNeeds()).line.endswith(
        "; rank 1 stalled in GRPO's tool-calling loop (TRL's _tool_call_loop): a tool that never returns stops every "
        "rank, so give slow tools a `tool_timeout`")
    run_dir.stack(1).write_text(run_dir.stack(0).read_text())
    assert "tool-calling" not in explain(run_dir, PlanNeeds()).line
