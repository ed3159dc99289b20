"""Why a run failed, in one line, from what its processes left behind: the launch supervisors' record of how each failed
rank ended (a signal only they see), the ranks' own records (an error, a stall, a lost rank), and the output dir
itself (full, unwritable). The rules, in order:

1. A rank killed by a signal (not torch's SIGTERM to the survivors, not an abort) among the first to end on its
   machine: the cause, whatever the survivors then recorded ("Connection reset by peer" is their consequence).
2. The first record a rank wrote: its error, or the watch's verdict (stalled, silent, gone); a failed write into
   the output dir (no space, read-only) becomes the disk line.
3. A rank that aborted (SIGABRT: often a library's reaction to another failure).
4. Nothing recorded, and the output dir cannot be written to: the disk line.
"""

from __future__ import annotations

import re
import signal
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlhf_cli.machine.probe import existing, free_space, meminfo
from rlhf_cli.output.checkpoints import newest_complete_checkpoint
from rlhf_cli.output.files import read_json, unwritable
from rlhf_cli.output.run_dir import RunDir
from rlhf_cli.sizes import readable

HINTS = {
    signal.SIGKILL: "often the out-of-memory killer",
    signal.SIGSEGV: "a crash in native code: torch, CUDA, NCCL or an extension",
    signal.SIGBUS: "a crash in native code, or a full /dev/shm",
    signal.SIGABRT: "an abort in native code, often after another failure",
}


@dataclass(frozen=True)
class PlanNeeds:
    """What the memory plan expects, handed down by the CLI (launch does not import plan); None: unknown."""

    cpu_per_machine: int | None = None  # bytes of CPU memory each machine needs for offloaded states (0: none)
    checkpoint_bytes: int | None = None  # bytes of one checkpoint: model weights and optimizer states
    save_seconds: float | None = None  # seconds of the final model's save (the running job's ETA counts it)
    step_seconds: dict[str, float] | None = None  # seconds per step by step phase, when the plan timed this machine


@dataclass(frozen=True)
class Failure:
    line: str  # one line, shown after `Error:`
    traceback: str | None = None  # the failed rank's traceback, shown above it


def machine_memory() -> int | None:
    """Bytes of memory this machine's processes may use: MemTotal, or their cgroup's limit where that is lower."""
    total = meminfo("MemTotal")
    try:
        group = Path("/proc/self/cgroup").read_text().splitlines()[0].rpartition(":")[2]
        limit = int(Path(f"/sys/fs/cgroup{group}/memory.max").read_text())
    except (OSError, ValueError, IndexError):  # no cgroup v2, or no limit ("max")
        return total
    return min(total, limit) if total else limit


def space_warning(output_dir: Path, checkpoint_bytes: int | None) -> str | None:
    """A warning when the output dir has less free space than one checkpoint of this run needs."""
    free = free_space(output_dir)
    if checkpoint_bytes is None or free is None or free >= checkpoint_bytes:
        return None
    return (f"warning: {existing(output_dir)} has {readable(free)} free, and one checkpoint of this run takes "
            f"about {readable(checkpoint_bytes)} (model weights and optimizer states): saving it will fail")


def disk_line(run_dir: RunDir, what: str) -> str:
    """Writing into the output dir failed: where, why, how much space is left, and how to go on."""
    free = free_space(run_dir.path)
    point = newest_complete_checkpoint(run_dir.path).checkpoint
    resume = f"the newest complete checkpoint is {point}" if point else "there is no complete checkpoint yet"
    return (f"writing to {run_dir.path} failed ({what}); {readable(free) if free is not None else 'unknown'} free; "
            f"{resume}: make room, then run again with --resume auto --output-dir {run_dir.path}")


def _who(named: list[dict[str, Any]]) -> str:
    """`rank 1 on a`, `ranks 2, 3 on b`, `ranks 0 on a, 2 on b`."""
    hosts: dict[str, list[str]] = {}
    for entry in named:
        hosts.setdefault(entry["host"], []).append(str(entry["rank"]))
    places = ", ".join(f"{', '.join(ranks)} on {host}" for host, ranks in hosts.items())
    return f"rank{'s' if len(named) > 1 else ''} {places}"


def _stacks(run_dir: RunDir, rank: int) -> str:
    return f"{run_dir.stack(rank)} (every rank's beside it)"


# A frame of GRPO's tool loop in a stack faulthandler wrote: TRL's, or rlhf's around it (rank/agent_turns.py)
TOOL_LOOP_FRAME = re.compile(r"line \d+ in _?tool_call_loop$", re.MULTILINE)


def tool_loop_note(run_dir: RunDir) -> str:
    """'; rank N was in GRPO's tool-calling loop ...' when a stalled rank's stack holds it, else ''."""
    ranks = sorted(int(path.name.split("-")[1].split(".")[0]) for path in run_dir.ranks.glob("rank-*.stack.txt")
                   if TOOL_LOOP_FRAME.search(path.read_text(errors="replace")))
    if not ranks:
        return ""
    who = f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
    return (f"; {who} stalled in GRPO's tool-calling loop (TRL's _tool_call_loop): a tool that never returns "
            "stops every rank, so give slow tools a `tool_timeout`")


def _watch_line(run_dir: RunDir, record: dict[str, Any]) -> str:
    """The line for the watch's verdicts (rlhf_cli.rank.watch): stalled, silent, gone."""
    line = _verdict_line(run_dir, record)
    return line if record["kind"] == "gone" else line + tool_loop_note(run_dir)


def _verdict_line(run_dir: RunDir, record: dict[str, Any]) -> str:
    named, timeout = record["named"], record["stall_timeout"]
    who, seconds, first = _who(named), named[0]["seconds"], named[0]["rank"]
    if record["kind"] == "gone":
        return f"{who} ended without a word (its process is gone: killed?); the other ranks stopped"
    if record["kind"] == "silent":
        return (f"{who} went silent: no heartbeat for {seconds} s (its machine is down, or the process froze); the "
                f"others stopped after stall_timeout ({timeout:g} s); their Python stacks: {_stacks(run_dir, first)}")
    if record["behind"]:
        return (f"{who} stalled: no progress for {seconds} s while the other ranks waited for "
                f"{'it' if len(named) == 1 else 'them'} in a collective (stall_timeout {timeout:g} s); Python stack: "
                f"{_stacks(run_dir, first)}")
    return (f"the job stalled: no rank made progress for {seconds} s, and none is behind the others (stall_timeout "
            f"{timeout:g} s); Python stacks: {_stacks(run_dir, first)}")


def _record_failure(run_dir: RunDir, record: dict[str, Any]) -> Failure:
    if record.get("kind", "error") != "error":
        return Failure(_watch_line(run_dir, record))
    if record.get("disk"):
        return Failure(disk_line(run_dir, record["disk"]))
    return Failure(f"rank {record['rank']} on {record['hostname']} failed: {record['type']}: {record['message']} "
                   f"(traceback above and in {run_dir.rank_error(record['rank'])})", record.get("traceback"))


def _killed_line(death: dict[str, Any], machine: dict[str, Any], needs: PlanNeeds) -> str:
    number = -death["exitcode"]
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    host = machine.get("host", "?")
    line = f"rank {death['rank']} on {host} was killed by {name}"
    hint = HINTS.get(number)
    if number == signal.SIGKILL:
        where = "this machine" if host == socket.gethostname() else host
        facts = ([f"{where} has {readable(machine['memory'])}"] if machine.get("memory") else []) + \
            ([f"the plan needs {readable(needs.cpu_per_machine)} of CPU memory per machine"] if needs.cpu_per_machine
             else [])
        hint = ": ".join([hint, ", ".join(facts)]) if facts else hint
    return f"{line} ({hint})" if hint else line


def _signal_deaths(run_dir: RunDir) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(exit, machine) of the ranks killed by a signal among the first to end on their machine, aborts last. Later
    ends are the supervisor's doing: it stops the survivors with SIGTERM, then SIGKILL 30 s later."""
    found = []
    for path in run_dir.rank_exits_files():
        machine = read_json(path) or {}
        exits = machine.get("exits") or []
        first = min((death["time"] for death in exits), default=0)
        found += [(death, machine) for death in exits
                  if death["exitcode"] < 0 and -death["exitcode"] != signal.SIGTERM and death["time"] <= first + 1]
    return sorted(found, key=lambda pair: (pair[0]["exitcode"] == -signal.SIGABRT, pair[0]["time"], pair[0]["rank"]))


def first_record(run_dir: RunDir) -> dict[str, Any] | None:
    """The record of the rank that claimed the first-failure marker, else the earliest."""
    records = [record for path in run_dir.rank_errors() if (record := read_json(path))]
    return min(records, key=lambda record: (not record.get("first"), record.get("time", 0)), default=None)


def explain(run_dir: RunDir, needs: PlanNeeds) -> Failure | None:
    """Why the ranks failed (this module's rules); None when they left nothing to tell."""
    deaths = _signal_deaths(run_dir)
    if deaths and deaths[0][0]["exitcode"] != -signal.SIGABRT:
        return Failure(_killed_line(*deaths[0], needs))
    record = first_record(run_dir)
    if record is not None:
        return _record_failure(run_dir, record)
    if deaths:
        return Failure(_killed_line(*deaths[0], needs))
    problem = unwritable(run_dir.path)
    return Failure(disk_line(run_dir, problem)) if problem else None
