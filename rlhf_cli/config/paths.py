"""Questions about the local paths a user gave, answered without raising.

A name longer than the system allows, a path through a file, a directory nobody may write: each is a problem to
report beside every other one, in words that say what to change, never a traceback.
"""

from __future__ import annotations

import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PathState:
    kind: str  # file | dir | missing | other (a socket, a device) | error
    reason: str = ""  # kind `error`: the system's words (File name too long); `missing`: which parent is a file

    @property
    def exists(self) -> bool:
        return self.kind in ("file", "dir", "other")


def path_state(path: Path) -> PathState:
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return PathState("missing")
    except NotADirectoryError:
        return PathState("missing", _file_on_the_way(path))
    except OSError as error:
        return PathState("error", error.strerror or str(error))
    return PathState("dir" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode) else "other")


def _file_on_the_way(path: Path) -> str:
    parent = next((p for p in path.parents if path_state(p).kind == "file"), None)
    return f"{parent} is a file, not a directory" if parent else "a parent is not a directory"


def describe(path: Path | str, state: PathState, wanted: str) -> str:
    """What is wrong with a path that should be a `wanted` (file, directory, YAML file), or was not found."""
    if state.kind == "error":
        return f"{path}: {state.reason}"
    if state.kind == "missing":
        return f"{path}: {state.reason}" if state.reason else f"{wanted} {path} not found"
    kind = {"file": "a file", "dir": "a directory"}.get(state.kind, "neither a file nor a directory")
    return f"{path} is {kind}, not a {wanted}"


def _probe_write(directory: Path) -> str | None:
    """Create and remove a file in `directory`: the one test a read-only mount or /proc cannot fool."""
    try:
        handle, name = tempfile.mkstemp(prefix=".rlhf-write-test-", dir=directory)
    except OSError as error:
        return error.strerror or str(error)
    os.close(handle)
    os.unlink(name)
    return None


def writable_dir_problem(path: Path, *, may_create: bool) -> str | None:
    """Why `path` cannot be a directory rlhf writes into (creating it if `may_create`), or None."""
    state = path_state(path)
    if state.kind == "dir":
        reason = _probe_write(path)
        return f"{path} is not writable ({reason})" if reason else None
    if state.kind != "missing" or state.reason or not may_create:
        return describe(path, state, "directory")
    ancestor = next(parent for parent in path.parents if path_state(parent).exists)
    if path_state(ancestor).kind != "dir":
        return f"{path} cannot be created: {ancestor} is not a directory"
    reason = _probe_write(ancestor)
    return f"{path} cannot be created in {ancestor} ({reason})" if reason else None
