"""The stall watch: what counts as stalled, silent or gone, and how a rank stops (no launch: processes without torch
that beat as ranks do)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlhf_cli.machine.probe import process_stat
from rlhf_cli.output.run_dir import FAILED, STALLED, RunDir
from rlhf_cli.rank.watch import (
    GONE,
    LOADING,
    SAVING,
    SILENT,
    STALL,
    TRAINING,
    Beat,
    judge,
    process_alive,
)

NOW, TIMEOUT = 1000.0, 120.0
HERE = "boot-a/pid:[1]"  # the pids that the judging rank sees: those of host a's ranks


def beat(rank: int, moved_ago: float = 0.0, collectives: int = 10, phase: str = TRAINING, beat_ago: float = 1.0,
         host: str = "a", pid: int = 0) -> Beat:
    return Beat(rank, host, pid, f"boot-{host}/pid:[1]", None, NOW - beat_ago, NOW - moved_ago, collectives, phase)


def alive(_pid: int, _started: int | None) -> bool:
    return True


def test_a_rank_that_moves_keeps_the_job_alive_while_the_others_wait() -> None:
    """Rank 1 generates long (a forward per token) while rank 0 waits in the next collective: not a stall."""
    beats = [beat(0, moved_ago=600, collectives=11), beat(1, moved_ago=1)]
    assert judge(beats, HERE, NOW, TIMEOUT, alive) is None


@pytest.mark.parametrize("busy", [LOADING, SAVING])
def test_a_busy_rank_is_no_stall_however_long(busy: str) -> None:
    """Loading a 12B model, building DeepSpeed's ops or saving a checkpoint: no moves for long, legitimately."""
    beats = [beat(0, moved_ago=3000, collectives=11), beat(1, moved_ago=3000, phase=busy)]
    assert judge(beats, HERE, NOW, TIMEOUT, alive) is None


def test_no_rank_moving_for_the_timeout_names_the_rank_behind_in_collectives() -> None:
    beats = [beat(0, moved_ago=130, collectives=11), beat(1, moved_ago=135), beat(2, moved_ago=131, collectives=11)]
    verdict = judge(beats, HERE, NOW, TIMEOUT, alive)
    assert verdict.kind == STALL and [b.rank for b in verdict.ranks] == [1] and verdict.behind
    assert verdict.seconds(verdict.ranks[0], NOW) == 135
    assert judge(beats, HERE, NOW - 11, TIMEOUT, alive) is None  # the most recent move is 120 s old only now


def test_a_stall_with_no_rank_behind_names_every_rank() -> None:
    verdict = judge([beat(0, moved_ago=200), beat(1, moved_ago=200)], HERE, NOW, TIMEOUT, alive)
    assert verdict.kind == STALL and len(verdict.ranks) == 2 and not verdict.behind


def test_a_silent_rank_is_named_even_while_others_load() -> None:
    """A dead machine stops beating: its ranks are named after the timeout, busy or not."""
    beats = [beat(0, phase=LOADING), beat(1, beat_ago=121, host="b")]
    verdict = judge(beats, HERE, NOW, TIMEOUT, alive)
    assert verdict.kind == SILENT and [(b.rank, b.host) for b in verdict.ranks] == [(1, "b")]


def test_a_rank_whose_process_is_gone_is_named_at_once_where_its_pid_is_visible() -> None:
    beats = [beat(0), beat(1, pid=41), beat(2, pid=42, host="b")]
    dead = {41, 42}
    verdict = judge(beats, HERE, NOW, TIMEOUT, lambda pid, _: pid not in dead)
    assert verdict.kind == GONE and [b.rank for b in verdict.ranks] == [1]  # rank 2's pid means nothing here
    done = [beat(0), Beat(1, "a", 41, HERE, None, NOW, NOW, 10, "done")]
    assert judge(done, HERE, NOW, TIMEOUT, lambda pid, _: pid not in dead) is None  # it finished: not a death


def test_process_alive_tells_a_finished_or_reused_pid() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    started = process_stat(child.pid)[1]
    child.wait()
    assert not process_alive(child.pid, started)
    me = os.getpid()
    assert process_alive(me, process_stat(me)[1]) and not process_alive(me, process_stat(me)[1] + 1)
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    started = process_stat(zombie.pid)[1]
    time.sleep(0.5)  # exited, not reaped yet
    assert not process_alive(zombie.pid, started)
    zombie.wait()


# A rank as the watch sees it, without torch: it beats, enters collectives, and blocks where the test says.
RANK = """
import sys, threading
from pathlib import Path
from rlhf_cli.rank.watch import PROGRESS, TRAINING, Watch
from rlhf_cli.output.run_dir import RunDir

def waits_in_a_collective():
    PROGRESS.enter_collective()
    threading.Event().wait()

def blocks_outside_collectives():
    threading.Event().wait()

Watch(RunDir(Path(sys.argv[1])), stall_timeout=float(sys.argv[2]), beat_seconds=0.2).start()
PROGRESS.phase = TRAINING
PROGRESS.enter_collective()
print("training", flush=True)
globals()[sys.argv[3]]()
"""


def start_rank(run_dir: RunDir, rank: int, world: int, blocks: str, stall_timeout: float = 1.0) -> subprocess.Popen:
    env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world)}
    process = subprocess.Popen([sys.executable, "-c", RANK, str(run_dir.path), str(stall_timeout), blocks], env=env,
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline() == "training\n"
    return process


def test_a_stalled_job_stops_names_the_rank_behind_and_every_rank_writes_its_stack(tmp_path: Path) -> None:
    run_dir = RunDir(tmp_path)
    started = time.monotonic()
    ranks = [start_rank(run_dir, 0, 2, "waits_in_a_collective"),
             start_rank(run_dir, 1, 2, "blocks_outside_collectives")]
    assert [rank.wait(timeout=30) for rank in ranks] == [1, 1]
    assert time.monotonic() - started < 10
    assert run_dir.first_failure.read_text() == STALLED
    record = next(json.loads(path.read_text()) for path in run_dir.rank_errors())
    assert record["kind"] == STALL and record["behind"] and [n["rank"] for n in record["named"]] == [1]
    assert "in blocks_outside_collectives" in run_dir.stack(1).read_text()
    assert "in waits_in_a_collective" in run_dir.stack(0).read_text()


def test_a_killed_rank_stops_its_peer_on_the_same_machine_within_seconds(tmp_path: Path) -> None:
    """As a rank blocked in an NCCL collective whose peer the kernel killed: no error ever reaches it."""
    run_dir = RunDir(tmp_path)
    waiting = start_rank(run_dir, 0, 2, "waits_in_a_collective", stall_timeout=600)
    killed = start_rank(run_dir, 1, 2, "blocks_outside_collectives", stall_timeout=600)
    while not run_dir.heartbeat(1).exists():
        time.sleep(0.1)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    started = time.monotonic()
    assert waiting.wait(timeout=30) == 1
    assert time.monotonic() - started < 5
    record = json.loads(run_dir.rank_error(0).read_text())
    assert record["kind"] == GONE and [n["rank"] for n in record["named"]] == [1]
    assert run_dir.first_failure.read_text() == FAILED and not run_dir.stack(0).exists()


@pytest.mark.parametrize(("what", "stack"), [(FAILED, False), (STALLED, True)])
def test_a_rank_stops_soon_after_another_raises_the_marker(tmp_path: Path, what: str, stack: bool) -> None:
    """What the first failing rank, on any machine, leaves in the shared output dir; on a stall, a stack first."""
    run_dir = RunDir(tmp_path)
    rank = start_rank(run_dir, 0, 1, "waits_in_a_collective", stall_timeout=600)
    time.sleep(0.5)
    assert rank.poll() is None  # nothing wrong anywhere: it keeps waiting
    run_dir.first_failure.write_text(what)
    started = time.monotonic()
    assert rank.wait(timeout=30) == 1
    assert time.monotonic() - started < 5
    assert run_dir.stack(0).exists() == stack


def test_a_finished_rank_runs_pythons_exit_handlers_then_leaves_with_its_code(tmp_path: Path) -> None:
    """What a logger finishes at exit (wandb's run) is finished; the code is the rank's; a non-daemon thread still
    running, which interpreter teardown would wait for (or, in native code, abort on), is not waited for."""
    marker = tmp_path / "handled"
    script = (f"import atexit, pathlib, threading, time\n"
              f"atexit.register(lambda: pathlib.Path({str(marker)!r}).write_text('ran'))\n"
              "threading.Thread(target=time.sleep, args=(600,)).start()\n"
              "from rlhf_cli.rank.watch import leave_finished\n"
              "leave_finished(75)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 75, done.stderr
    assert marker.read_text() == "ran"
