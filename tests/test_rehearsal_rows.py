"""The rehearsal reads every row of a local data file, where the file check before it read only the first ones: a
row there that `datasets` would refuse is one line, a long field is read, and the run's prompt column is the one
measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import RECIPES
from rlhf_cli.config.rehearsal import rehearsal_run
from rlhf_cli.config.resolve import RunRequest, resolve
from rlhf_cli.errors import ConfigError

GOOD_ROWS = "".join(json.dumps({"prompt": "x" * n, "question": "q" * (40 - n)}) + "\n" for n in range(1, 30))


def _rehearsed(tmp_path: Path, data: Path, *sets: str):
    flags = {"output_dir": ("--output-dir", str(tmp_path / data.stem)), "dataset_name": ("--dataset", str(data))}
    return rehearsal_run(resolve(RunRequest("rloo", str(RECIPES / "rloo" / "smoke.yaml"), flags, sets),
                                 cwd=tmp_path, cuda=False))


def test_a_bad_row_past_those_the_file_check_reads_is_one_line(tmp_path: Path) -> None:
    for name, tail, said in (("broken.jsonl", '{"prompt": "a"\n', "line 30 is not JSON"),
                             ("listed.jsonl", '["a", "b"]\n', "line 30 is a JSON list, not an object of columns")):
        data = tmp_path / name
        data.write_text(GOOD_ROWS + tail)
        with pytest.raises(ConfigError) as raised:
            _rehearsed(tmp_path, data)
        assert str(raised.value) == f"--rehearse: {data}: {said}" + str(raised.value).split(said, 1)[1]
        assert "\n" not in str(raised.value) and "fix the file" in str(raised.value)


def test_a_long_field_is_read_and_the_run_s_prompt_column_is_measured(tmp_path: Path) -> None:
    data = tmp_path / "long.csv"
    data.write_text("prompt,question\n" + "short,q\n" * 40 + f"{'p' * 200_000},qq\n")
    rehearsal = _rehearsed(tmp_path, data)
    assert any("41 rows" in note and "the longest 200000 characters" in note for note in rehearsal.notes)
    data = tmp_path / "questions.jsonl"
    data.write_text(GOOD_ROWS)
    rehearsal = _rehearsed(tmp_path, data, "dataset_prompt_column=question")
    kept = [json.loads(line) for line in Path(rehearsal.value("dataset_name")).read_text().splitlines()]
    assert any("the longest 39 characters" in note for note in rehearsal.notes), rehearsal.notes
    assert len(kept[0]["question"]) == 39
