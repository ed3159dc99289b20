"""Which entries of an output directory a run wrote, so that nothing rlhf did not write is ever replaced.

The launcher writes `rlhf-files.json` (RunDir.written) before any rank starts, marking the attempt as running,
and once the ranks have ended it records the top-level entries the directory then holds of names runs write
(`RUN_ENTRIES`) as the run's: a run only starts in a directory that holds nothing but an earlier run's files. An
attempt that never recorded its end (the launcher was killed) leaves `running`, and every entry of such a name
counts as the run's. The record is never trusted alone: an entry is the run's only if it is also of a name runs
write, a plain file or directory right inside the output dir (`../victim`, a link, a user's notes.txt never are).
`--overwrite` removes exactly those; anything else makes the directory one a run refuses. A directory an rlhf
older than the record wrote (rlhf's recipe.yaml and run.json, no record) is the run's by the names alone.
Pure Python: the config layer reads it, the launcher writes it.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from rlhf_cli.output.files import read_json, write_atomic
from rlhf_cli.output.lock import LOCK
from rlhf_cli.output.run_dir import RECIPE_HEADER, RunDir

LISTED = 4  # entries a message names before "and N more"


@dataclass(frozen=True)
class Holdings:
    """What an output directory holds now, and whose it is."""

    entries: tuple[str, ...]  # top-level names, sorted
    owned: frozenset[str]  # written by an earlier run of rlhf
    running: bool  # an attempt started and never recorded its end
    status: str | None  # how the last attempt ended (run.json): finished, failed, preempted, ...

    @property
    def foreign(self) -> tuple[str, ...]:
        """Entries no run wrote: the user's own files, which a run must never replace."""
        return tuple(name for name in self.entries if name not in self.owned)

    @property
    def holds_run(self) -> bool:
        return bool(self.owned) or self.running


def listing(names: tuple[str, ...] | list[str]) -> str:
    """`a, b, c and 2 more`: enough to recognise a directory's contents in one line."""
    shown = ", ".join(names[:LISTED])
    return f"{shown} and {len(names) - LISTED} more" if len(names) > LISTED else shown


def holdings(path: Path) -> Holdings:
    """What `path` holds (nothing when it is missing or unreadable: the writability check says why). An entry is
    the run's only when a run writes such an entry (`run_writes`) and the record lists it, or the record says
    the run never ended: the record alone is never trusted, since anyone may have written it."""
    try:
        entries = tuple(sorted(entry.name for entry in path.iterdir() if entry.name != LOCK))
    except OSError:
        return Holdings((), frozenset(), False, None)
    run_dir = RunDir(path)
    if run_dir.written.exists() or run_dir.written.is_symlink():
        record = read_json(run_dir.written)
        record = record if isinstance(record, dict) else {}
        listed = record.get("entries")
        running = record.get("running") is True
        listed = {name for name in listed if isinstance(name, str)} if isinstance(listed, list) else set()
        owned = frozenset(name for name in entries if (name in listed or running) and run_writes(run_dir, name))
    else:
        running, owned = False, earlier_run_entries(run_dir, entries)
    status = (read_json(run_dir.run_record) or {}).get("status") if owned else None
    return Holdings(entries, owned, running and bool(owned), status if isinstance(status, str) else None)


# What runs of rlhf write at the top of an output dir, by name: the launcher's files (and their temporaries), the
# ranks' records and checkpoints, `rlhf report`'s plot, what the trainers log (TensorBoard's runs/, GRPO's
# completions/), and the trained model as transformers, PEFT and TRL save it.
RUN_ENTRIES = re.compile(
    r"recipe\.yaml|accelerate_config\.yaml|launch\.sh|run\.json|rlhf-files\.json|machines|ranks|summary\.json"
    r"|preempted\.json|trainer_state\.json|checkpoint-\d+|merged|report\.png|training_args\.bin|config\.json"
    r"|generation_config\.json|runs|completions|(train|eval|all)_results\.json|\.[^/]+\.\d+\.tmp"
    r"|(model|pytorch_model|adapter_model)(-\d+-of-\d+)?\.(safetensors|bin)|(model\.safetensors|pytorch_model\.bin)"
    r"\.index\.json|adapter_config\.json|tokenizer(_config)?\.json|tokenizer\.model|spiece\.model"
    r"|special_tokens_map\.json|added_tokens\.json|vocab\.(json|txt)|merges\.txt|chat_template\.(jinja|json)")
MODEL_CARD = ("README.md", "It has been trained using [TRL]")  # TRL's model card, not a README of the user's
_WRITTEN_DIRS = ("machines", "ranks", "merged", "runs", "completions")


def run_writes(run_dir: RunDir, name: str) -> bool:
    """Whether `name`, a top-level entry of `run_dir`, is one a run writes: a plain file or directory (never a
    link, which a run never makes) of a name runs write; anything else is the user's whatever a record says."""
    path = run_dir.path / name
    if "/" in name or name in ("", ".", "..") or path.is_symlink():
        return False
    if name == MODEL_CARD[0]:
        return path.is_file() and MODEL_CARD[1] in _head(path)
    if not RUN_ENTRIES.fullmatch(name):
        return False
    wants_dir = name in _WRITTEN_DIRS or name.startswith("checkpoint-")
    return path.is_dir() if wants_dir else path.is_file()


def earlier_run_entries(run_dir: RunDir, entries: tuple[str, ...]) -> frozenset[str]:
    """The entries an rlhf from before `rlhf-files.json` wrote, if `run_dir` is such a run's: its recipe.yaml begins
    with the launcher's header and its run.json is the launcher's record. None otherwise."""
    record = read_json(run_dir.run_record)
    if not (isinstance(record, dict) and {"command", "versions"} <= record.keys()
            and _starts_with(run_dir.recipe, RECIPE_HEADER)):
        return frozenset()
    return frozenset(name for name in entries if run_writes(run_dir, name))


def _head(path: Path, size: int = 4096) -> str:
    try:
        with path.open("rb") as file:
            return file.read(size).decode("utf-8", errors="replace")
    except OSError:
        return ""


def _starts_with(path: Path, text: str) -> bool:
    return path.is_file() and _head(path, len(text.encode())) == text


def record_start(run_dir: RunDir, launcher_files: list[Path]) -> None:
    """Before any rank starts: the earlier runs' entries, the launcher's own files, and `running`."""
    before = holdings(run_dir.path)
    names = set(before.owned) | {path.relative_to(run_dir.path).parts[0] for path in launcher_files}
    _write(run_dir, names | {run_dir.written.name}, running=True)


def record_end(run_dir: RunDir) -> None:
    """After the ranks ended: every entry of a name runs write is the run's (it started with nothing foreign there);
    what else appeared meanwhile stays the user's."""
    entries = holdings(run_dir.path).entries
    _write(run_dir, {name for name in entries if run_writes(run_dir, name)} | {run_dir.written.name}, running=False)


def record_added(run_dir: RunDir, name: str) -> None:
    """A new entry rlhf wrote into a recorded run's directory afterwards (`rlhf report`'s plot): the run's too, so
    that --resume and --overwrite do not take it for the user's."""
    record = read_json(run_dir.written)
    entries = record.get("entries") if isinstance(record, dict) else None
    if isinstance(entries, list) and name not in entries:
        _write(run_dir, {entry for entry in entries if isinstance(entry, str)} | {name}, bool(record.get("running")))


def remove_owned(run_dir: RunDir, keep: tuple[str, ...] = ()) -> None:
    """`--overwrite`: remove what earlier runs wrote, and nothing else: entries directly inside the output dir, of
    names runs write, never a link (holdings judges each)."""
    for name in sorted(holdings(run_dir.path).owned - {run_dir.written.name, *keep}):
        path = run_dir.path / name
        if path.is_symlink():
            continue
        if path.is_dir():
            shutil.rmtree(path)
        elif path.is_file():
            path.unlink()


def _write(run_dir: RunDir, names: set[str], running: bool) -> None:
    write_atomic(run_dir.written, json.dumps({"entries": sorted(names), "running": running}, indent=1) + "\n")
