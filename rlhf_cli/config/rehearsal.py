"""`--rehearse`: the resolved run as one step at the worst case it will meet, in a folder of its own.

The rehearsal writes into `<output_dir>.rehearsal/`, a run's output dir like any other: checked as one (locked by
another run, a link, files rlhf did not write: refused in one line), and the launcher, once it holds the lock,
replaces only what an earlier rehearsal wrote there (as `--overwrite` does). Nothing of the run's own output dir is
touched. It runs `max_steps: 1` and saves a checkpoint at it (`save_steps: 1`), reads the longest prompts of a
local dataset file (by characters; a hub dataset is used as it is, not scanned) into rlhf's cache, named by their
content, and generates every completion to its full length: `min_new_tokens` (HF generate) or `min_tokens` (vLLM)
in `generation_kwargs`, which TRL 1.16 hands to GenerationConfig and to vLLM's SamplingParams as they are.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from rlhf_cli.config.data_files import DATA_SUFFIXES
from rlhf_cli.config.output_dir import OutputDirCheck
from rlhf_cli.config.paths import writable_dir_problem
from rlhf_cli.config.prompts import longest_prompt_rows
from rlhf_cli.config.run import ResolvedRun, Setting
from rlhf_cli.errors import ConfigError
from rlhf_cli.machine.cache import cache_dir
from rlhf_cli.output.files import write_atomic

SOURCE = "--rehearse"
PROMPTS_DIR = "rehearsal-prompts"  # in rlhf's cache: one file per set of longest prompts, named by its content


def rehearsal_dir(output_dir: Path) -> Path:
    return output_dir.with_name(output_dir.name + ".rehearsal")


def step_prompts(run: ResolvedRun) -> int:
    """The prompts one optimizer step draws: the global batch over the completions generated per prompt."""
    processes = int(run.accelerate.get("num_processes") or 1)
    rows = (run.value("per_device_train_batch_size") or 1) * (run.value("gradient_accumulation_steps") or 1)
    generations = run.value("num_generations") if _has(run, "num_generations") else 1
    return max(1, math.ceil(rows * processes / max(int(generations or 1), 1)))


def _has(run: ResolvedRun, name: str) -> bool:
    from rlhf_cli.config.fields import catalogue

    return name in catalogue(run.algorithm)


def _rows(path: Path) -> Iterator[dict[str, Any]]:
    """Every row of a local data file, in the formats `datasets` reads (rlhf_cli/config/data_files.py). The file
    check read its first rows only: a row past them that `datasets` would refuse is one line here (ConfigError)."""
    try:
        yield from _read_rows(path)
    except (OSError, ValueError, UnicodeDecodeError, csv.Error) as error:
        raise ConfigError(f"--rehearse: {path}: {error}; fix the file (the run would stop on it too)") from None


def _read_rows(path: Path) -> Iterator[dict[str, Any]]:
    suffix = path.suffix.lower()
    if suffix == ".csv":
        limit = csv.field_size_limit()
        csv.field_size_limit(2**31 - 1)  # `datasets` reads CSV with pandas, which has no field limit
        try:
            with path.open(newline="") as handle:
                yield from csv.DictReader(handle)
        finally:
            csv.field_size_limit(limit)
    elif suffix == ".parquet":
        import pyarrow.parquet as parquet  # the file check reads its schema the same way

        yield from parquet.read_table(path).to_pylist()
    else:
        text = path.read_text()
        try:
            document = json.loads(text)
        except ValueError:
            for number, line in enumerate(text.splitlines(), start=1):
                if line.strip():
                    yield _row(_json_line(line, number), f"line {number}")
            return
        if isinstance(document, dict):  # a mapping of columns
            yield from (dict(zip(document, values, strict=True)) for values in zip(*document.values(), strict=True))
        else:
            rows = document if isinstance(document, list) else [document]
            yield from (_row(row, f"row {number}") for number, row in enumerate(rows, start=1))


def _json_line(line: str, number: int) -> Any:
    try:
        return json.loads(line)
    except ValueError as error:
        raise ValueError(f"line {number} is not JSON ({error})") from None


def _row(row: Any, where: str) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise ValueError(f"{where} is a JSON {type(row).__name__}, not an object of columns")
    return row


def longest_prompts(source: Path, column: str, count: int) -> tuple[str, int, int]:
    """The `count` rows of `source` with the longest prompts in `column` in characters (no tokenizer needed),
    longest first, as JSON Lines; with the rows read and the longest prompt's characters."""
    ranked, read = longest_prompt_rows(enumerate(_rows(source), start=1), column, count, len)
    return "".join(json.dumps(row, default=str) + "\n" for _, _, row in ranked), read, ranked[0][0] if ranked else 0


def kept_prompts(text: str) -> Path:
    """`text` in rlhf's cache under a name its content decides: two rehearsals of one dataset share one file, and
    nothing is ever written into a folder before its run holds it."""
    path = cache_dir() / PROMPTS_DIR / f"{hashlib.sha256(text.encode()).hexdigest()[:16]}.jsonl"
    try:
        write_atomic(path, text)
    except OSError as error:
        raise ConfigError(f"--rehearse: cannot keep the longest prompts in {path.parent}: "
                          f"{(error.strerror or str(error)).lower()}; set RLHF_CACHE to a writable folder") from None
    return path


def checked_folder(folder: Path) -> tuple[str, ...]:
    """What the rehearsal's folder holds now, once it is known to be one a rehearsal may write into as any run
    into its output dir: not a link, writable, held by no run (a stale or another host's lock included), holding
    nothing rlhf did not write. Its earlier rehearsal's files are the launcher's to replace, after the lock."""
    if folder.is_symlink():
        raise ConfigError(f"--rehearse: {folder} is a symbolic link; a rehearsal writes only into a folder of its own: "
                          "remove the link or choose another --output-dir")
    problem = writable_dir_problem(folder, may_create=True)
    if problem:
        raise ConfigError(f"--rehearse: {problem}; choose another --output-dir")
    check = OutputDirCheck(folder, "--rehearse", overwrite=True)
    problems = check.check((), resume_found=False)
    if problems:
        raise ConfigError(problems[0])
    return check.entries


def _full_length(run: ResolvedRun) -> tuple[dict[str, Setting], str]:
    """`generation_kwargs` that generate every completion to its full length, and the note that says so."""
    if not _has(run, "generation_kwargs"):  # our PPO: no generation_kwargs to force a length with
        return {}, "completions: this trainer takes no generation_kwargs; they stop where the model stops"
    length = run.value("max_completion_length")
    key = run.generation.engine.spec.forced_length_key
    kwargs = {**(run.value("generation_kwargs") or {}), key: length}
    return {"generation_kwargs": Setting(kwargs, SOURCE)}, f"completions: {key}={length}, every one full length"


def rehearsal_run(run: ResolvedRun) -> ResolvedRun:
    """The rehearsal of `run`: its folder checked, the longest prompts kept, and the settings of one worst-case step
    with a checkpoint saved. Nothing is written into the folder here: the launcher does, once it holds it."""
    folder = rehearsal_dir(run.output_dir)
    entries = checked_folder(folder)
    settings = {"output_dir": Setting(str(folder), SOURCE), "max_steps": Setting(1, SOURCE),
                "save_strategy": Setting("steps", SOURCE), "save_steps": Setting(1, SOURCE)}
    notes = [f"rehearsal: one step into {folder}, a checkpoint saved"]
    dataset = run.value("dataset_name")
    path = Path(str(dataset)) if dataset else None
    if path is not None and path.is_file() and path.suffix.lower() in DATA_SUFFIXES:
        count = step_prompts(run)
        column = (run.value("dataset_prompt_column") if _has(run, "dataset_prompt_column") else None) or "prompt"
        text, read, longest = longest_prompts(path, column, count)
        kept = kept_prompts(text)
        settings["dataset_name"] = Setting(str(kept), SOURCE)
        notes.append(f"rehearsal: {read} rows of {path} read; the {count} longest prompts ({column!r}) kept in "
                     f"{kept}, the longest {longest} characters")
    else:
        notes.append(f"rehearsal: dataset {dataset} is not a local file: not scanned, used as it is")
    forced, said = _full_length(run)
    settings.update(forced)
    kept_settings = {name: setting for name, setting in run.settings.items() if name != "resume_from_checkpoint"}
    return replace(run, settings={**kept_settings, **settings}, notes=(*run.notes, *notes, f"rehearsal: {said}"),
                   output_dir_entries=entries)
