"""Heartbeats, and the watch that stops a job within `stall_timeout` when its ranks stop moving or one is lost.

Without it, the ranks whose peer hangs or dies wait in a collective until the collective's timeout (NCCL's is 30
minutes), and nobody learns where it hung. Each rank runs a thread, the watch, that wakes every few seconds. It
writes `ranks/rank-N.heartbeat.json` into the output dir, which every machine of a job shares already (the
first-failure marker lives there): nothing to open or connect, and it outlives any one machine, where the
rendezvous store dies with machine 0. It reads the other ranks' heartbeats only while its own rank is not moving,
so a healthy job costs one small write per rank per beat.

The definitions (the README's "Crashes" says the same to users):
- moving: the main thread entered a collective, ran a module's forward (each generated token is one), or the
  trainer began or ended a step, logged or saved. The main thread bumps counters; the watch notes when they last
  changed. The watch is a thread, so it beats while the main thread is busy in C code (GIL released).
- busy: loading (until training begins: models, DeepSpeed's engine and its op builds, a checkpoint to resume) and
  saving (a checkpoint, the final model). Long stretches without moving, legitimately: while any rank is busy,
  nothing counts as stalled.
- stalled: no rank has moved for stall_timeout, and none is busy. Named: the ranks behind the others in
  collectives entered, which the others wait for inside the next one; every rank when none is behind.
- silent: a rank whose last heartbeat is stall_timeout old, busy or not: its machine died or its process froze.
- gone: a rank whose process this one can see (same machine, same pid namespace) and that has ended without a word
  (killed).
A slow step is not a stall: generation moves at every token, training at every collective.
"""

from __future__ import annotations

import faulthandler
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NoReturn

from rlhf_cli.machine.probe import process_stat
from rlhf_cli.output.files import claim, marker_says, read_json, try_write_json
from rlhf_cli.output.run_dir import FAILED, STALLED, RunDir

BEAT_SECONDS = 2.0
LOADING, TRAINING, SAVING, DONE = "loading", "training", "saving", "done"
BUSY = (LOADING, SAVING)
GONE, SILENT, STALL = "gone", "silent", "stalled"


def global_rank() -> int:
    return int(os.environ.get("RANK", "0"))


class Progress:
    """What this rank's main thread has done so far: bumped by it (one addition), read by the watch."""

    def __init__(self) -> None:
        self.moves = 0
        self.collectives = 0
        self.phase = LOADING

    def move(self, *_: Any) -> None:
        self.moves += 1

    def enter_collective(self) -> None:
        self.collectives += 1
        self.moves += 1


PROGRESS = Progress()
_counting = False


def count_progress() -> None:
    """Bump PROGRESS at every module forward and every collective this process starts, whoever starts it."""
    global _counting
    if _counting:
        return
    from torch.nn.modules.module import register_module_forward_pre_hook

    from rlhf_cli import compat

    register_module_forward_pre_hook(PROGRESS.move)
    compat.count_collectives(PROGRESS.enter_collective)
    _counting = True


def pid_space() -> str | None:
    """Which processes' pids this process can see: its machine's boot and its pid namespace. Hostnames are no
    proof: containers on two machines may share one, and two containers on one machine may not see each other."""
    try:
        return f"{Path('/proc/sys/kernel/random/boot_id').read_text().strip()}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return None


def process_alive(pid: int, started: int | None) -> bool:
    """Whether process `pid`, started at `started`, still runs (a reused pid has another start time). Where there
    is no /proc, it cannot tell and says yes."""
    if not Path("/proc/self/stat").exists():
        return True
    state = process_stat(pid)
    return state is not None and state[0] not in ("Z", "X") and (started is None or state[1] == started)


@dataclass(frozen=True)
class Beat:
    """One rank's heartbeat."""

    rank: int
    host: str
    pid: int
    pids: str | None  # where the pid means something (pid_space)
    started: int | None  # the process's start time (clock ticks since boot): tells a reused pid apart
    time: float  # wall clock of this beat
    moved: float  # wall clock when its main thread was last seen moving
    collectives: int  # collectives its main thread has entered
    phase: str  # loading | training | saving | done

    @classmethod
    def read(cls, path: Path) -> Beat | None:
        data = read_json(path)
        try:
            return cls(**data) if data else None
        except TypeError:
            return None


@dataclass(frozen=True)
class Verdict:
    kind: str  # gone | silent | stalled
    ranks: tuple[Beat, ...]  # the ranks it names
    behind: bool  # stalled: the named ranks are behind the others in collectives (not simply every rank)

    def seconds(self, beat: Beat, now: float) -> float:
        """How long `beat`'s rank has been silent, or without moving."""
        return now - (beat.time if self.kind == SILENT else beat.moved)


def _gone(live: list[Beat], pids: str | None, alive: Callable[[int, int | None], bool]) -> tuple[Beat, ...]:
    return tuple(beat for beat in live if pids and beat.pids == pids and not alive(beat.pid, beat.started))


def judge(beats: list[Beat], pids: str | None, now: float, stall_timeout: float,
          alive: Callable[[int, int | None], bool] = process_alive) -> Verdict | None:
    """Whether the job must stop, from every rank's heartbeat, judged by a rank whose pids are `pids`; None while
    it may go on. The definitions are in this module's docstring."""
    live = [beat for beat in beats if beat.phase != DONE]
    gone = _gone(live, pids, alive)
    if gone:
        return Verdict(GONE, gone, False)
    silent = tuple(beat for beat in live if now - beat.time >= stall_timeout)
    if silent:
        return Verdict(SILENT, silent, False)
    if not live or any(beat.phase in BUSY for beat in live) or min(now - beat.moved for beat in live) < stall_timeout:
        return None
    fewest = min(beat.collectives for beat in live)
    behind = tuple(beat for beat in live if beat.collectives == fewest)
    return Verdict(STALL, behind, len(behind) < len(live))


def read_beats(run_dir: RunDir) -> list[Beat]:
    found = (Beat.read(run_dir.heartbeat(rank)) for rank in range(int(os.environ.get("WORLD_SIZE", "1"))))
    return [beat for beat in found if beat is not None]


def lost_a_rank(run_dir: RunDir) -> bool:
    """Whether a rank of this machine ended without finishing (killed): torch's agent then stops the others with
    SIGTERM, which is no preemption."""
    return bool(_gone([beat for beat in read_beats(run_dir) if beat.phase != DONE], pid_space(), process_alive))


def exit_now(code: int) -> NoReturn:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown: it can block in collectives whose peers are gone


def leave_finished(code: int) -> NoReturn:
    """A rank whose work is done and recorded: Python's exit handlers run, the native teardown does not (gloo's and
    DeepSpeed's CPU-comm threads abort it there now and then, and the launcher would report a finished run failed)."""
    from rlhf_cli import compat

    compat.run_exit_handlers()
    exit_now(code)


def write_stack(run_dir: RunDir, rank: int) -> None:
    """Every thread's Python stack into `ranks/rank-N.stack.txt`, whatever the main thread is blocked in. The first
    one stands: a rank that writes it again (stopped by a signal while its collective fails) is no longer where it
    stalled."""
    main = threading.main_thread().ident or 0
    try:
        with open(run_dir.stack(rank), "x") as file:
            file.write(f"rank {rank} on {socket.gethostname()} (pid {os.getpid()}) when the job stalled; the main "
                       f"thread, the one training, is Thread 0x{main:016x}\n\n")
            file.flush()
            faulthandler.dump_traceback(file=file, all_threads=True)
    except OSError:
        pass  # written already, or a full disk: the error line still names the rank


def stop_for_another_rank(run_dir: RunDir, pause: float = 0.0) -> NoReturn:
    """Another rank failed or found the job stalled (the marker says which): stop this rank, after writing its
    stack on a stall, and after `pause` (the rank that raised the marker records why and exits first)."""
    if marker_says(run_dir.first_failure) == STALLED:
        write_stack(run_dir, global_rank())
    time.sleep(pause)
    exit_now(1)


class Watch:
    """The thread that beats for this rank, and stops it when another rank failed, the job stalled or a rank is
    lost. Start it before loading anything; `finish` it when the rank is done."""

    def __init__(self, run_dir: RunDir, stall_timeout: float, beat_seconds: float = BEAT_SECONDS) -> None:
        self.run_dir = run_dir
        self.stall_timeout = stall_timeout
        self.interval = min(beat_seconds, stall_timeout / 4)
        self.rank = global_rank()
        self.host = socket.gethostname()
        self.pids = pid_space()
        state = process_stat(os.getpid())
        self.started = state[1] if state else None
        self.seen_moves = -1
        self.moved = time.time()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="rlhf-watch", daemon=True)

    def start(self) -> Watch:
        self.thread.start()
        return self

    def finish(self) -> None:
        """This rank is done: the others no longer wait for it, nor take its end for a death."""
        self.stopped.set()
        self.thread.join()
        PROGRESS.phase = DONE
        self._beat(time.time())

    def _beat(self, now: float) -> None:
        beat = Beat(self.rank, self.host, os.getpid(), self.pids, self.started, now, self.moved,
                    PROGRESS.collectives, PROGRESS.phase)
        try_write_json(self.run_dir.heartbeat(self.rank), asdict(beat))

    def _run(self) -> None:
        while not self.stopped.wait(self.interval):
            now = time.time()
            moving = PROGRESS.moves != self.seen_moves
            if moving:
                self.seen_moves, self.moved = PROGRESS.moves, now
            self._beat(now)
            if marker_says(self.run_dir.first_failure) is not None:
                stop_for_another_rank(self.run_dir, pause=self.interval)
            if not moving:
                beats = read_beats(self.run_dir)
                verdict = judge(beats, self.pids, now, self.stall_timeout)
                if verdict is not None:
                    self._stop_job(verdict, beats, now)

    def _stop_job(self, verdict: Verdict, beats: list[Beat], now: float) -> NoReturn:
        """Stop the job: the first rank to judge so records the verdict; on a stall or a silent rank every rank
        writes its stack, and the first waits for theirs before it exits (its exit would break their collectives
        into errors, and the launch supervisor would stop them, before they could)."""
        stalled = verdict.kind != GONE
        if not claim(self.run_dir.first_failure, STALLED if stalled else FAILED):
            stop_for_another_rank(self.run_dir)
        record = {"rank": self.rank, "hostname": self.host, "first": True, "kind": verdict.kind, "time": now,
                  "stall_timeout": self.stall_timeout, "behind": verdict.behind,
                  "named": [{"rank": beat.rank, "host": beat.host, "seconds": round(verdict.seconds(beat, now))}
                            for beat in verdict.ranks]}
        try_write_json(self.run_dir.rank_error(self.rank), record)
        if stalled:
            write_stack(self.run_dir, self.rank)
            silent = {beat.rank for beat in verdict.ranks} if verdict.kind == SILENT else set()
            others = [beat.rank for beat in beats if beat.phase != DONE and beat.rank not in silent | {self.rank}]
            deadline = time.monotonic() + 3 * self.interval + 1
            while time.monotonic() < deadline and not all(self.run_dir.stack(rank).exists() for rank in others):
                time.sleep(0.1)
        exit_now(1)
