"""Which entries of an output directory a run wrote, so that nothing rlhf did not write is ever replaced.

The launcher writes `rlhf-files.json` (RunDir.written) before any rank starts, marking the attempt as running,
and once the ranks have ended it records every top-level entry the directory then holds as the run's: a run only
starts in a directory that holds nothing but an earlier run's files, so whatever appeared since is its own. An
attempt that never recorded its end (the launcher was killed) leaves `running`, and every entry counts as the
run's. `--overwrite` removes exactly the recorded entries; anything else makes the directory one a run refuses.
A directory an rlhf older than the record wrote (rlhf's recipe.yaml and run.json, no record) is the run's by the
names runs write (`EARLIER_RUN_ENTRIES`); anything else there stays the user's.
Pure Python: the config layer reads it, the launcher writes it.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from rlhf_cli.output.files import read_json, write_atomic
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
        return () if self.running else tuple(name for name in self.entries if name not in self.owned)

    @property
    def holds_run(self) -> bool:
        return bool(self.owned) or self.running


def listing(names: tuple[str, ...] | list[str]) -> str:
    """`a, b, c and 2 more`: enough to recognise a directory's contents in one line."""
    shown = ", ".join(names[:LISTED])
    return f"{shown} and {len(names) - LISTED} more" if len(names) > LISTED else shown


def holdings(path: Path) -> Holdings:
    """What `path` holds (nothing when it is missing or unreadable: the writability check says why)."""
    try:
        entries = tuple(sorted(entry.name for entry in path.iterdir()))
    except OSError:
        return Holdings((), frozenset(), False, None)
    run_dir = RunDir(path)
    if run_dir.written.exists() or run_dir.written.is_symlink():
        record = read_json(run_dir.written) or {}
        owned = record.get("entries")
        owned = frozenset(name for name in owned if isinstance(name, str)) if isinstance(owned, list) else frozenset()
    else:
        record, owned = {}, earlier_run_entries(run_dir, entries)
    status = (read_json(run_dir.run_record) or {}).get("status") if owned else None
    return Holdings(entries, owned, bool(record.get("running")) and bool(owned), status
                    if isinstance(status, str) else None)


# What runs of rlhf write at the top of an output dir, by name: the launcher's files, the ranks' records and
# checkpoints, `rlhf report`'s plot, and the trained model as transformers, PEFT and TRL save it.
EARLIER_RUN_ENTRIES = re.compile(
    r"recipe\.yaml|accelerate_config\.yaml|launch\.sh|run\.json|machines|ranks|summary\.json|preempted\.json"
    r"|trainer_state\.json|checkpoint-\d+|merged|report\.png|training_args\.bin|config\.json|generation_config\.json"
    r"|(model|pytorch_model|adapter_model)(-\d+-of-\d+)?\.(safetensors|bin)|(model\.safetensors|pytorch_model\.bin)"
    r"\.index\.json|adapter_config\.json|tokenizer(_config)?\.json|tokenizer\.model|special_tokens_map\.json"
    r"|added_tokens\.json|vocab\.(json|txt)|merges\.txt|chat_template\.(jinja|json)")
MODEL_CARD = ("README.md", "It has been trained using [TRL]")  # TRL's model card, not a README of the user's


def earlier_run_entries(run_dir: RunDir, entries: tuple[str, ...]) -> frozenset[str]:
    """The entries an rlhf from before `rlhf-files.json` wrote, if `run_dir` is such a run's: its recipe.yaml begins
    with the launcher's header and its run.json is the launcher's record. None otherwise."""
    record = read_json(run_dir.run_record)
    if not (isinstance(record, dict) and {"command", "versions"} <= record.keys()
            and _starts_with(run_dir.recipe, RECIPE_HEADER)):
        return frozenset()
    return frozenset(name for name in entries if EARLIER_RUN_ENTRIES.fullmatch(name)
                     or name == MODEL_CARD[0] and MODEL_CARD[1] in _head(run_dir.path / name))


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
    """After the ranks ended: every entry is the run's (it started with nothing foreign there)."""
    _write(run_dir, set(holdings(run_dir.path).entries) | {run_dir.written.name}, running=False)


def record_added(run_dir: RunDir, name: str) -> None:
    """A new entry rlhf wrote into a recorded run's directory afterwards (`rlhf report`'s plot): the run's too, so
    that --resume and --overwrite do not take it for the user's."""
    record = read_json(run_dir.written)
    entries = record.get("entries") if isinstance(record, dict) else None
    if isinstance(entries, list) and name not in entries:
        _write(run_dir, {entry for entry in entries if isinstance(entry, str)} | {name}, bool(record.get("running")))


def remove_owned(run_dir: RunDir, keep: tuple[str, ...] = ()) -> None:
    """`--overwrite`: remove what earlier runs wrote, and nothing else."""
    for name in sorted(holdings(run_dir.path).owned - {run_dir.written.name, *keep}):
        path = run_dir.path / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()


def _write(run_dir: RunDir, names: set[str], running: bool) -> None:
    write_atomic(run_dir.written, json.dumps({"entries": sorted(names), "running": running}, indent=1) + "\n")
