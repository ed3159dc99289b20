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
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from rlhf_cli.machine.probe import process_stat

LOCK = "rlhf.lock"
MAX_LOCK_BYTES = 4096  # a lock rlhf wrote is one short line; more is not one
MAX_PID = 2**22  # Linux's largest pid_max


@dataclass(frozen=True)
class Holder:
    """Who holds an output dir, as its lock file says."""

    path: Path
    host: str
    pid: int
    started: str  # the holder's local time, for the message
    process_start: str | None  # the kernel's start time of the pid, to tell a reused pid from the holder
    damaged: str = ""  # why the lock names no holder (a directory, not JSON, empty), "" when it names one

    @property
    def alive(self) -> bool | None:
        """Whether the holder still runs: None when it is on another host, which cannot be seen from here."""
        if self.damaged or self.host != socket.gethostname() or not 0 < self.pid <= MAX_PID:
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
        if self.damaged:
            return (f"{flag}: output dir {self.path.parent} has a damaged lock {self.path} ({self.damaged}), which "
                    "names no run; if no rlhf run is starting there, remove it and run again")
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
    """Who holds `directory`, or None when no lock is there. A lock that names no holder (a directory, a link, a
    pipe, not JSON, empty: damaged, or being written this instant) is one too, said so."""
    path = directory / LOCK
    data, damaged = _lock_record(path)
    if data is None and not damaged:
        return None
    data = data or {}
    pid, host = data.get("pid"), data.get("host")
    if not damaged and not (isinstance(pid, int) and 0 < pid <= MAX_PID and isinstance(host, str) and host):
        damaged = f"pid {pid!r} on host {host!r} is no process"
    return Holder(path, str(host or "an unknown host"), pid if isinstance(pid, int) else 0,
                  str(data.get("started", "an unknown time")), data.get("process_start"), damaged)


def _lock_record(path: Path) -> tuple[dict | None, str]:
    """(what the lock file says, why it is damaged): (None, "") when there is no lock. Read without following a
    link or opening anything but a plain file (a pipe would block, a device never end)."""
    try:
        found = path.lstat()
    except FileNotFoundError:
        return None, ""
    except OSError as error:
        return {}, f"unreadable: {error.strerror}"
    if not stat.S_ISREG(found.st_mode):
        kind = "a directory" if stat.S_ISDIR(found.st_mode) else "a link" if stat.S_ISLNK(found.st_mode) else \
            "not a plain file"
        return {}, kind
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            text = os.read(descriptor, MAX_LOCK_BYTES + 1)
        finally:
            os.close(descriptor)
    except OSError as error:
        return {}, f"unreadable: {error.strerror}"
    if not text.strip():
        return {}, "empty"
    try:
        data = json.loads(text) if len(text) <= MAX_LOCK_BYTES else None
    except ValueError:
        data = None
    return (data, "") if isinstance(data, dict) else ({}, "not the JSON record rlhf writes")


def acquire(directory: Path) -> Path:
    """Create the lock for this process; LockHeld when another run holds the directory (a stale lock included:
    only the user may judge that no run writes there). OSError when the directory cannot be written."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / LOCK
    try:
        descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        found = holder(directory)
        raise LockHeld(found or Holder(path, "an unknown host", 0, "an unknown time", None, "gone again")) from None
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
