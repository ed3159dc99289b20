"""The output dir's lock: one run at a time writes into a directory.

Machine rank 0's launcher creates `rlhf.lock` (O_EXCL, which holds on a shared filesystem too) before it writes
anything and removes it once the run has ended; the other machines of the job and the ranks never take it. The
lock names its holder (host, pid, when it started), so that a second launch says whose run holds the directory,
and a lock left by a launcher that was killed is told apart from a live one (on the same host; another host's
lock is taken as live, since its process cannot be seen from here). Pure Python: the config layer reads it.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from rlhf_cli.machine.probe import process_stat

LOCK = "rlhf.lock"


@dataclass(frozen=True)
class Holder:
    """Who holds an output dir, as its lock file says."""

    path: Path
    host: str
    pid: int
    started: str  # the holder's local time, for the message
    process_start: str | None  # the kernel's start time of the pid, to tell a reused pid from the holder

    @property
    def alive(self) -> bool | None:
        """Whether the holder still runs: None when it is on another host, which cannot be seen from here."""
        if self.host != socket.gethostname() or self.pid <= 0:
            return None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass  # another user's process: alive
        return self.process_start is None or _process_start(self.pid) in (None, self.process_start)

    def problem(self, flag: str) -> str:
        """One line for a second launch into the held directory."""
        who = f"pid {self.pid} on {self.host}, since {self.started}"
        if self.alive is False:
            return (f"{flag}: output dir {self.path.parent} is locked by a run that is no longer running ({who}): "
                    f"it was killed before it could unlock; if no rlhf runs there, remove {self.path} and run again")
        where = "" if self.alive else f" (if that run is gone, remove {self.path})"
        return (f"{flag}: output dir {self.path.parent} is in use by another rlhf run ({who}){where}; wait for it "
                "to end, or choose another --output-dir")


class LockHeld(Exception):
    """The directory is held already."""

    def __init__(self, holder: Holder) -> None:
        super().__init__(holder.problem("--output-dir"))
        self.holder = holder


def holder(directory: Path) -> Holder | None:
    """Who holds `directory`, or None when no lock is there. A lock that cannot be read (being written, or
    damaged) names pid 0, whose liveness is unknown."""
    path = directory / LOCK
    if not (path.exists() or path.is_symlink()):
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    data = data if isinstance(data, dict) else {}
    pid = data.get("pid")
    return Holder(path, str(data.get("host", "an unknown host")), pid if isinstance(pid, int) else 0,
                  str(data.get("started", "an unknown time")), data.get("process_start"))


def acquire(directory: Path) -> Path:
    """Create the lock for this process; LockHeld when another run holds the directory (a stale lock included:
    only the user may judge that no run writes there). OSError when the directory cannot be written."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / LOCK
    try:
        descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        found = holder(directory)
        raise LockHeld(found or Holder(path, "an unknown host", 0, "an unknown time", None)) from None
    record = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "process_start": _process_start(os.getpid())}
    try:
        os.write(descriptor, (json.dumps(record) + "\n").encode())
    finally:
        os.close(descriptor)
    return path


def release(lock: Path) -> None:
    """Remove the lock this process took (not one another run took since: it is checked to be ours)."""
    found = holder(lock.parent)
    if found is not None and found.pid == os.getpid() and found.host == socket.gethostname():
        try:
            lock.unlink()
        except OSError:
            pass  # left behind: the next launch names it as stale


def _process_start(pid: int) -> str | None:
    """The kernel's start time of `pid` (Linux), which a reused pid does not share."""
    found = process_stat(pid)
    return str(found[1]) if found else None
