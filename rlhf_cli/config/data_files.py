"""A local prompt file's first rows, read before anything starts: it parses, and the prompt column is there.

Only the first rows are read (a dataset may be gigabytes), with the formats `datasets` reads the same files in:
JSON Lines, a JSON list of rows or mapping of columns, CSV with a header, Parquet (its schema, through pyarrow).
Whether every row parses is left to `datasets`; a file that fails on its first rows fails here, named by line.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROWS_READ = 20
WHOLE_JSON_LIMIT = 64 * 2**20  # a JSON file that is one document is parsed whole up to this size
CHUNK = 2**20
HEAD_LIMIT = 64 * 2**20  # the most read to find the first whole row
# The `datasets` builder that reads each local data file a recipe may name.
DATA_SUFFIXES = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}


class DataFileError(ValueError):
    """What is wrong with a data file, in a line that names it (and the row, where there is one)."""


def _head(path: Path) -> str | None:
    """The file's first MiB as text, cut after its last whole line, and at least its first line whole (up to
    HEAD_LIMIT: a first line longer than that is `datasets`' to read, None). A UTF-8 byte-order mark is not text."""
    with path.open("rb") as handle:
        head = handle.read(CHUNK)
        while b"\n" not in head.lstrip() and len(head) < HEAD_LIMIT and (more := handle.read(CHUNK)):
            head += more
        whole = not handle.read(1)
    if not whole:
        cut = head.rfind(b"\n")
        if cut < 0 or not head[:cut].strip():
            return None
        head = head[:cut + 1]
    try:
        return head.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = head.count(b"\n", 0, error.start) + 1
        raise DataFileError(f"{path}:{line}: not UTF-8 text; save the file as UTF-8") from None


def _json_rows(path: Path) -> tuple[list[str], list[tuple[int, Any]]]:
    """(columns, [(line, row)]) of a JSON Lines file, or of a JSON document holding rows or columns."""
    text = _head(path)
    if text is None:
        return [], []  # a first row longer than HEAD_LIMIT: `datasets` reads it
    if not text.strip():
        raise DataFileError(f"{path} is empty")
    if text.lstrip().startswith("["):
        return _json_document(path, 1, None)
    rows: list[tuple[int, Any]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if len(rows) == ROWS_READ:
            break
        if not line.strip():
            continue
        try:
            rows.append((number, json.loads(line)))
        except ValueError as error:
            if rows:
                raise DataFileError(f"{path}:{number}: not valid JSON ({error.args[0].split(':')[0]})") from None
            return _json_document(path, number, error)
    return _columns(path, rows), rows


def _json_document(path: Path, line: int, first_error: ValueError | None) -> tuple[list[str], list[tuple[int, Any]]]:
    """A .json file that is not JSON Lines: one document, a list of rows or a mapping of column -> values."""
    if path.stat().st_size > WHOLE_JSON_LIMIT:
        if first_error is None:
            return [], []  # a list too large to parse here: `datasets` reads it
        raise DataFileError(f"{path}:{line}: not valid JSON Lines ({first_error.args[0].split(':')[0]})")
    try:
        document = json.loads(path.read_bytes())
    except ValueError as error:
        raise DataFileError(f"{path}: not valid JSON ({error})") from None
    if isinstance(document, list):
        rows = [(1, row) for row in document[:ROWS_READ]]
    elif isinstance(document, dict) and document and all(isinstance(v, list) for v in document.values()):
        length = min(len(values) for values in document.values())
        rows = [(1, {key: values[i] for key, values in document.items()}) for i in range(min(length, ROWS_READ))]
    else:
        raise DataFileError(f"{path}: a JSON dataset is rows (one object per line, or a list of objects) or a "
                            "mapping of column -> list of values")
    if not rows:
        raise DataFileError(f"{path}: holds no rows")
    return _columns(path, rows), rows


def _columns(path: Path, rows: list[tuple[int, Any]]) -> list[str]:
    line, first = rows[0]
    if not isinstance(first, dict):
        raise DataFileError(f"{path}:{line}: a row is a JSON object of column -> value, got {type(first).__name__}")
    return list(first)


def _csv_rows(path: Path) -> tuple[list[str], list[tuple[int, Any]]]:
    text = _head(path)
    if text is None:
        return [], []
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if not header:
        raise DataFileError(f"{path} is empty")
    rows = [(number + 2, dict(zip(header, values, strict=False)))
            for number, values in zip(range(ROWS_READ), reader, strict=False)]
    if not rows:
        raise DataFileError(f"{path}: a header and no rows")
    return header, rows


def _parquet_rows(path: Path) -> tuple[list[str], list[tuple[int, Any]]]:
    """The schema only: a Parquet file's rows come in column chunks that may be large."""
    try:
        import pyarrow.parquet as parquet

        metadata = parquet.ParquetFile(path)
    except ImportError:
        return [], []  # datasets brings pyarrow; without it the ranks fail to load anyway, saying so
    except Exception as error:  # noqa: BLE001 - pyarrow's own errors: a damaged or foreign file
        raise DataFileError(f"{path}: not a readable Parquet file ({' '.join(str(error).split())})") from None
    if metadata.metadata.num_rows == 0:
        raise DataFileError(f"{path}: holds no rows")
    return metadata.schema_arrow.names, []


READERS = {".json": _json_rows, ".jsonl": _json_rows, ".csv": _csv_rows, ".parquet": _parquet_rows}


def first_rows(path: Path) -> tuple[list[str], list[tuple[int, Any]]]:
    """(columns, [(line, row)]) of a local data file's first rows (no rows for Parquet: its schema only); columns
    empty when they cannot be known without `datasets`. DataFileError when it does not parse."""
    try:
        return READERS[path.suffix](path)
    except OSError as error:
        raise DataFileError(f"{path}: cannot read it ({error.strerror or error})") from None


def _prompt_problem(prompt: Any) -> str | None:
    """A prompt is text, or a list of chat messages ({role, content})."""
    if isinstance(prompt, str):
        return None if prompt.strip() else "is empty"
    if isinstance(prompt, list) and prompt and all(isinstance(m, dict) and {"role", "content"} <= m.keys()
                                                     for m in prompt):
        return None
    return f"is {json.dumps(prompt)[:60]}; a prompt is text or a list of chat messages ({{role, content}})"


def check_prompts(path: Path, column: str, columns_kept: Iterable[str] | None = None, optional: bool = False) -> None:
    """Raise DataFileError when the file's first rows do not parse or lack a usable `column`. `optional`: a file
    without the column is taken (GRPO's environment then writes each prompt in `reset`)."""
    columns, rows = first_rows(path)
    if columns_kept is not None:
        columns = [name for name in columns if name in set(columns_kept)]
    if optional and columns and column not in columns:
        return
    if columns and column not in columns:
        shown = ", ".join(columns[:8]) + (", ..." if len(columns) > 8 else "")
        raise DataFileError(f"{path}: no `{column}` column (it has: {shown}); set `dataset_prompt_column` to the "
                            "column holding the prompts")
    for line, row in rows:
        problem = _prompt_problem(row.get(column)) if column in row else "is missing"
        if problem:
            raise DataFileError(f"{path}:{line}: `{column}` {problem}")
