"""The output dir's small files, written so that a reader never sees half of one, and so that a full disk or an
unwritable dir costs the file, never a second traceback: run.json, the ranks' records, their heartbeats, what the
launch supervisor saw, and the first-failure marker. Pure Python: the CLI, the launch supervisor and the ranks use it.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

from rlhf_cli.output.run_dir import FAILED

PROBE_BYTES = 2**16  # a write that fails on a disk as full as a failed save leaves it


def write_atomic(path: Path, text: str) -> None:
    """Machines of one job may write the same file at once: each writes its own temporary, then renames."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}.tmp")
    try:
        temporary.write_text(text)
        os.replace(temporary, path)
    except OSError:
        temporary.unlink(missing_ok=True)
        raise


def try_write_json(path: Path, data: dict[str, Any]) -> bool:
    """Write `data`; False when the disk is full or the dir unwritable (the caller goes on without it)."""
    try:
        write_atomic(path, json.dumps(data, indent=2) + "\n")
    except OSError:
        return False
    return True


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def claim(marker: Path, what: str) -> bool:
    """True for exactly one caller, the first to create `marker` (O_EXCL holds on a shared filesystem too); the
    marker then says `what`. A full disk may leave it empty, which reads as FAILED."""
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except OSError:  # taken already, or nothing can be created there
        return False
    try:
        os.write(descriptor, what.encode())
    except OSError:
        pass
    finally:
        os.close(descriptor)
    return True


def marker_says(marker: Path) -> str | None:
    """What the first-failure marker holds; None while there is none."""
    try:
        return marker.read_text().strip() or FAILED
    except FileNotFoundError:
        return None
    except OSError:
        return FAILED


def unwritable(directory: Path) -> str | None:
    """Why nothing can be written into `directory` (no space left, read-only, ...), or None when it can."""
    probe = directory / f".rlhf-probe-{socket.gethostname()}-{os.getpid()}"
    try:
        with open(probe, "wb") as file:
            file.write(bytes(PROBE_BYTES))
            file.flush()
            os.fsync(file.fileno())
    except OSError as error:
        return (error.strerror or str(error)).lower()
    finally:
        try:
            probe.unlink(missing_ok=True)
        except OSError:
            pass
    return None
