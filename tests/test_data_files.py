"""Local prompt files that `datasets` loads are accepted before launch, read only as far as their first rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlhf_cli.config.data_files import CHUNK, DataFileError, check_prompts


def test_a_first_row_longer_than_the_first_read_is_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps({"prompt": "x" * (3 * CHUNK)}) + "\n" + json.dumps({"prompt": "b"}) + "\n")
    check_prompts(path, "prompt")  # its first row is whole: the prompt is there
    path.write_text(json.dumps({"question": "x" * (2 * CHUNK)}) + "\n")
    with pytest.raises(DataFileError, match="no `prompt` column"):
        check_prompts(path, "prompt")


def test_a_byte_order_mark_is_not_part_of_the_first_row(tmp_path: Path) -> None:
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + b'{"prompt": "a"}\n{"prompt": "b"}\n')
    check_prompts(path, "prompt")
    path.write_bytes(b"\xef\xbb\xbf" + b'{"prompt": "a"}\n{"prompt": \n')
    with pytest.raises(DataFileError, match="bom.jsonl:2: not valid JSON"):
        check_prompts(path, "prompt")
    csv = tmp_path / "bom.csv"
    csv.write_bytes(b"\xef\xbb\xbfprompt,other\nhello,1\n")
    check_prompts(csv, "prompt")


def test_both_are_accepted_by_a_run(cli, nothing_launches, tmp_path: Path) -> None:
    for name, content in (("long.jsonl", (json.dumps({"prompt": "y" * (CHUNK + 10)}) + "\n").encode()),
                          ("bom.jsonl", b'\xef\xbb\xbf{"prompt": "a"}\n')):
        (tmp_path / name).write_bytes(content)
        result = cli("rloo", "-r", "rloo/smoke", "--dataset", tmp_path / name, "-o", tmp_path / name.split(".")[0])
        assert result.exit_code == 0, result.output
    assert len(nothing_launches) == 2
