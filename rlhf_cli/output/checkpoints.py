"""Which checkpoints are whole: a manifest written after every rank has saved, checked before resuming.

The trainers write `checkpoint-N/` in place, file by file, on every rank. A job killed while saving
leaves a directory that looks like a checkpoint and is not one. So once all ranks are done, rank 0
writes `rlhf-manifest.json` into it, last: every file with its size and a checksum of its content, and the run
that saved it (algorithm, processes, batch layout), which a copy taken out of its run dir keeps. A directory
without a manifest, or whose files no longer match it, is not resumed from. Pure Python: the CLI reads this too.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rlhf_cli.output.run_dir import MANIFEST, RunDir

# How a file's content is checked, chosen for checkpoints of 100 GB and more, which are read again at every
# resume (a requeued job resumes often): hashing all of it reads the whole checkpoint at disk speed, minutes
# on a shared filesystem, before anything starts. The files whose bytes can change without their size changing
# are the small ones (trainer_state.json, the RNG states, the scheduler, configs, DeepSpeed's `latest`): hashed
# whole. A larger file is a torch zip archive (DeepSpeed's shards) or a safetensors file: its first and last
# MiB hold what identifies its content (a safetensors header, every tensor's name, dtype, shape and offsets; a
# zip's central directory, every record's name and CRC-32), so those with the size catch a file truncated,
# extended, or replaced by another save; a flipped bit inside tensor data is not caught before launch.
WHOLE_FILE_LIMIT = 64 * 2**20
END_BYTES = 2**20
MANIFEST_VERSION = 2
_SHARD = re.compile(r"(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_\d+_(model|optim)_states\.pt")


@dataclass(frozen=True)
class SavedBy:
    """The run that saved a checkpoint: what resuming it needs to know about it."""

    algorithm: str  # rloo, ppo, grpo, online_dpo
    processes: int
    per_device_train_batch_size: int
    gradient_accumulation_steps: int

    @property
    def global_batch(self) -> int:
        return self.processes * self.per_device_train_batch_size * self.gradient_accumulation_steps


def content_digest(path: Path, size: int) -> str:
    """blake2b of the file, whole up to WHOLE_FILE_LIMIT, else of its first and last END_BYTES (see above)."""
    digest = hashlib.blake2b(digest_size=16)
    with path.open("rb") as handle:
        if size <= WHOLE_FILE_LIMIT:
            while chunk := handle.read(2**20):
                digest.update(chunk)
        else:
            digest.update(handle.read(END_BYTES))
            handle.seek(size - END_BYTES)
            digest.update(handle.read(END_BYTES))
    return digest.hexdigest()


def write_manifest(checkpoint: Path, saved_by: SavedBy) -> Path:
    """Record every file of a finished checkpoint; written to a temporary name, then renamed."""
    files = {}
    for path in sorted(checkpoint.rglob("*")):
        if path.is_file() and path.name != MANIFEST:
            size = path.stat().st_size
            files[str(path.relative_to(checkpoint))] = {"size": size, "blake2b": content_digest(path, size)}
    temporary = checkpoint / f".{MANIFEST}.tmp"
    record = {"version": MANIFEST_VERSION, "saved_by": asdict(saved_by), "files": files}
    temporary.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(temporary, checkpoint / MANIFEST)
    return checkpoint / MANIFEST


def _manifest(checkpoint: Path) -> dict[str, Any] | None:
    try:
        record = json.loads((checkpoint / MANIFEST).read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("files"), dict) else None


def incomplete_reason(checkpoint: Path) -> str | None:
    """Why `checkpoint` cannot be resumed from, or None when it is whole. A manifest of an older rlhf records
    sizes only."""
    if not (checkpoint / MANIFEST).is_file():
        return f"no {MANIFEST} (the save did not finish)"
    record = _manifest(checkpoint)
    if record is None:
        return f"unreadable {MANIFEST}"
    if "saved_by" in record and saved_by(checkpoint) is None:
        return f"{MANIFEST} is damaged (its saved_by is not a record rlhf writes)"
    for name, entry in record["files"].items():
        size, digest = (entry, None) if isinstance(entry, int) else \
            (entry.get("size"), entry.get("blake2b")) if isinstance(entry, dict) else (None, None)
        if not _recorded(name, size, digest):
            return f"{MANIFEST} is damaged (its entry for {name!r} is not one rlhf writes)"
        path = checkpoint / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} is truncated ({path.stat().st_size} of {size} bytes)" if path.stat().st_size < size \
                else f"{name} has changed ({path.stat().st_size} bytes, {size} when saved)"
        if digest is not None and content_digest(path, size) != digest:
            return f"{name} has changed since it was saved (its checksum differs)"
    return None


def _recorded(name: str, size: Any, digest: Any) -> bool:
    """A manifest entry as rlhf writes it: a file inside the checkpoint, its size, maybe its digest (a string)."""
    inside = bool(name) and not Path(name).is_absolute() and ".." not in Path(name).parts
    return inside and type(size) is int and size >= 0 and (digest is None or isinstance(digest, str))


def saved_by(checkpoint: Path) -> SavedBy | None:
    """The run that saved `checkpoint`, as its manifest records it; None for a manifest of an older rlhf, or one
    whose record was edited into something no run saves (a count below 1, an algorithm that is no name)."""
    record = _manifest(checkpoint)
    entry = record.get("saved_by") if record else None
    try:
        found = SavedBy(**entry) if isinstance(entry, dict) else None
    except TypeError:
        return None
    counts = (found.processes, found.per_device_train_batch_size, found.gradient_accumulation_steps) if found else ()
    if found and isinstance(found.algorithm, str) and found.algorithm.isidentifier() and \
            all(type(count) is int and count >= 1 for count in counts):
        return found
    return None


def deepspeed_tag(checkpoint: Path) -> str | None:
    """The folder of DeepSpeed's shards in a checkpoint (`global_stepN`, as its `latest` file names it), or None
    when the checkpoint holds no DeepSpeed state."""
    try:
        tag = (checkpoint / "latest").read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return tag or None


def deepspeed_shards(checkpoint: Path, tag: str) -> dict[str, set[int]]:
    """The ranks whose model and optimizer shards are in `checkpoint/tag`: {"model": {0, 1}, "optim": {0, 1}}."""
    found: dict[str, set[int]] = {"model": set(), "optim": set()}
    folder = checkpoint / tag
    for path in folder.iterdir() if folder.is_dir() else ():
        match = _SHARD.fullmatch(path.name)
        if match and path.is_file():
            found[match.group(2)].add(int(match.group(1)))
    return found


def saved_processes(checkpoint: Path) -> int | None:
    """How many processes saved `checkpoint`: its manifest says, else its DeepSpeed shards, else its RNG states
    (one per process, or one `rng_state.pth` for a single process)."""
    recorded = saved_by(checkpoint)
    if recorded is not None:
        return recorded.processes
    tag = deepspeed_tag(checkpoint)
    if tag is not None and (ranks := deepspeed_shards(checkpoint, tag)["model"]):
        return len(ranks)
    states = list(checkpoint.glob("rng_state_*.pth"))
    return len(states) or (1 if (checkpoint / "rng_state.pth").is_file() else None)


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
