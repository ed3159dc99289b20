"""Which checkpoints are whole: a manifest written after every rank has saved, checked before resuming.

The trainers write `checkpoint-N/` in place, file by file, on every rank. A job killed while saving
leaves a directory that looks like a checkpoint and is not one. So once all ranks are done, rank 0
writes `rlhf-manifest.json` (every file and its size) into it, last; a directory without a manifest,
or whose files no longer match it, is not resumed from. Pure Python: the CLI reads this too.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from rlhf_cli.output.run_dir import MANIFEST, RunDir


def write_manifest(checkpoint: Path) -> Path:
    """Record every file of a finished checkpoint; written to a temporary name, then renamed."""
    files = {str(path.relative_to(checkpoint)): path.stat().st_size
             for path in sorted(checkpoint.rglob("*")) if path.is_file() and path.name != MANIFEST}
    temporary = checkpoint / f".{MANIFEST}.tmp"
    temporary.write_text(json.dumps({"files": files}, indent=1) + "\n")
    os.replace(temporary, checkpoint / MANIFEST)
    return checkpoint / MANIFEST


def incomplete_reason(checkpoint: Path) -> str | None:
    """Why `checkpoint` cannot be resumed from, or None when it is whole."""
    manifest = checkpoint / MANIFEST
    if not manifest.is_file():
        return f"no {MANIFEST} (the save did not finish)"
    try:
        files = json.loads(manifest.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"unreadable {MANIFEST}"
    for name, size in files.items():
        path = checkpoint / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} is truncated ({path.stat().st_size} of {size} bytes)"
    return None


@dataclass(frozen=True)
class ResumePoint:
    checkpoint: Path | None  # the newest whole checkpoint, or None
    skipped: tuple[str, ...]  # one line per newer checkpoint that is not whole, and why


def newest_complete_checkpoint(output_dir: Path) -> ResumePoint:
    """The highest-step `checkpoint-N` whose files match its manifest, and the newer ones passed over."""
    skipped = []
    for _, path in RunDir(output_dir).checkpoints():
        reason = incomplete_reason(path)
        if reason is None:
            return ResumePoint(path, tuple(skipped))
        skipped.append(f"{path.name}: {reason}")
    return ResumePoint(None, tuple(skipped))
