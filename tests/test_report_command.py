"""`rlhf report`: curves as a PNG and the same numbers as a table, from the metrics real smoke runs logged.

The fixtures are the trainer_state.json files of `rlhf ALGO -r ALGO/smoke` runs of 24 steps (grpo_agent:
`rlhf grpo -r grpo/agent-smoke --max-steps 24`).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from PIL import Image

from helpers import REPO, write
from rlhf_cli.report.metrics import sample_rows
from rlhf_cli.report.plot import figure_pixels

RUNS = REPO / "tests" / "fixtures" / "runs"
EXPECTED = {  # algorithm -> (panels drawn, table columns after `step`)
    "rloo": (3, ["reward", "kl", "loss"]),
    "ppo": (5, ["objective/scores", "objective/rlhf_reward", "objective/kl", "loss/policy_avg", "loss/value_avg",
                "policy/clipfrac_avg", "val/clipfrac_avg"]),
    "online_dpo": (3, ["objective/scores", "objective/rlhf_reward", "objective/kl", "loss"]),
    "grpo": (2, ["reward", "loss"]),  # beta 0: no reference, no KL
    # `rlhf grpo -r grpo/agent-smoke`: how often completions called a tool, and how often a call failed
    "grpo_agent": (3, ["reward", "loss", "tools/call_frequency", "tools/failure_frequency"]),
}


def _table(output: str) -> tuple[list[str], list[list[str]]]:
    """Column names (headers may span lines) and body rows of the rich table in `output`."""
    lines = output.splitlines()
    top = next(i for i, line in enumerate(lines) if line.startswith("┏"))
    rule = next(i for i, line in enumerate(lines) if line.startswith("┡"))
    bottom = next(i for i, line in enumerate(lines) if line.startswith("└"))
    cells = [[cell.strip() for cell in line.strip("┃").split("┃")] for line in lines[top + 1:rule]]
    names = ["".join(parts) for parts in zip(*cells, strict=False)]
    rows = [[cell.strip() for cell in line.strip("│").split("│")] for line in lines[rule + 1:bottom]]
    return names, rows


def _logged(state: Path) -> list[dict]:
    return [entry for entry in json.loads(state.read_text())["log_history"] if "train_runtime" not in entry]


@pytest.mark.parametrize("algorithm", EXPECTED)
def test_report_draws_the_curves_and_prints_the_numbers(cli, algorithm: str, tmp_path: Path) -> None:
    run = tmp_path / f"{algorithm}-run"
    shutil.copytree(RUNS / algorithm, run)
    result = cli("report", run)
    assert result.exit_code == 0, result.output
    assert result.stderr.strip() == f"Wrote {run / 'report.png'}"

    panels, columns = EXPECTED[algorithm]
    with Image.open(run / "report.png") as image:
        assert image.size == figure_pixels(panels)
        pixels = image.convert("RGB")
        colours = pixels.getcolors(maxcolors=1 << 20)
        inked = sum(count for count, colour in colours if colour != (255, 255, 255))
    assert len(colours) > 50  # curves, text and grid, not a blank canvas
    assert 0.02 < inked / (pixels.width * pixels.height) < 0.5

    names, rows = _table(result.stdout)
    assert names == ["step", *columns]
    logged = _logged(run / "trainer_state.json")
    assert len(logged) > 20 and len(rows) == 20  # sampled
    for row, entry in ((rows[0], logged[0]), (rows[-1], logged[-1])):
        assert row[0] == str(entry["step"])
        assert [float(cell) for cell in row[1:]] == pytest.approx([entry[name] for name in columns], rel=1e-3,
                                                                  abs=1e-12)


def test_without_a_final_state_the_newest_checkpoint_is_read(cli, tmp_path: Path) -> None:
    history = _logged(RUNS / "rloo" / "trainer_state.json")
    for step in (2, 10):
        write(tmp_path / "run" / f"checkpoint-{step}" / "trainer_state.json",
              json.dumps({"log_history": history[:step]}))
    result = cli("report", tmp_path / "run", "--out", tmp_path / "plots" / "curves.png")
    assert result.exit_code == 0, result.output
    names, rows = _table(result.stdout)
    assert [row[0] for row in rows] == [str(step) for step in range(1, 11)]
    assert (tmp_path / "plots" / "curves.png").is_file() and not (tmp_path / "run" / "report.png").exists()


@pytest.mark.parametrize(("setup", "message"), [
    (lambda run: run.mkdir(), "no trainer_state.json here or in a checkpoint-*/ directory"),
    (lambda run: None, "no such run directory"),
    (lambda run: write(run / "trainer_state.json", '{"log_history": [{"step": 1, "epoch": 0.1}]}'),
     "no training metrics logged"),
])
def test_a_directory_without_metrics_is_one_line_exit_2(cli, tmp_path: Path, setup, message: str) -> None:
    setup(tmp_path / "run")
    result = cli("report", tmp_path / "run")
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("Error: ") and message in result.stderr


def test_values_too_large_to_draw_are_left_out_of_the_curves_and_kept_in_the_table(cli, tmp_path: Path) -> None:
    """A diverged run's 1e308 or inf: matplotlib's axes overflow near float's limit, so only the table shows it."""
    write(tmp_path / "run" / "trainer_state.json", '{"log_history": [{"step": 1, "loss": 1.0}, {"step": 2, "kl": '
          '1e308}, {"step": 3, "loss": Infinity, "kl": 0.5}, {"step": 4, "loss": -1.7e308}]}')
    result = cli("report", tmp_path / "run")
    assert result.exit_code == 0, result.output
    names, rows = _table(result.stdout)
    assert names == ["step", "kl", "loss"]
    assert rows == [["1", "-", "1"], ["2", "1e+308", "-"], ["3", "0.5", "inf"], ["4", "-", "-1.7e+308"]]
    assert (tmp_path / "run" / "report.png").is_file()


def test_sampled_rows_are_spread_and_keep_both_ends() -> None:
    assert sample_rows(5, 20) == [0, 1, 2, 3, 4]
    rows = sample_rows(1000, 20)
    assert len(rows) == 20 and rows[0] == 0 and rows[-1] == 999
    gaps = {b - a for a, b in zip(rows, rows[1:], strict=False)}
    assert max(gaps) - min(gaps) <= 1


def test_the_plot_replaces_only_the_runs_own_file_and_never_writes_through_a_link(cli, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(RUNS / "rloo", run)
    mine = write(tmp_path / "mine.png", "my own picture")
    (run / "report.png").symlink_to(mine)
    refused = cli("report", run)
    assert refused.exit_code == 2 and "report.png exists and is a link, which may be yours; pass --force" in \
        " ".join(refused.stderr.split())
    forced = cli("report", run, "--force")
    assert forced.exit_code == 0, forced.output
    assert mine.read_text() == "my own picture" and not (run / "report.png").is_symlink()
    assert (run / "report.png").read_bytes().startswith(b"\x89PNG")
    again = cli("report", run)  # no record lists the file: forced once, it is still not known to be rlhf's
    assert again.exit_code == 2 and "a file no run record lists as rlhf's" in " ".join(again.stderr.split())
    write(run / "rlhf-files.json", json.dumps({"entries": ["report.png", "rlhf-files.json"], "running": False}))
    assert cli("report", run).exit_code == 0  # the run's own plot, replaced without --force


def test_report_out_refuses_an_existing_file_without_force(cli, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(RUNS / "grpo", run)
    mine = write(tmp_path / "curves.png", "my own picture")
    refused = cli("report", run, "--out", mine)
    assert refused.exit_code == 2 and mine.read_text() == "my own picture"
    assert cli("report", run, "--out", mine, "--force").exit_code == 0
    assert mine.read_bytes().startswith(b"\x89PNG") and not list(tmp_path.glob(".curves.png.*"))
    theirs = write(tmp_path / "theirs.png", "a hard link's other name")
    os.link(theirs, tmp_path / "linked.png")
    planted = tmp_path / f".linked.png.{os.getpid()}.tmp"  # where a plot's temporary once went, a link laid there
    planted.symlink_to(theirs)
    assert cli("report", run, "--out", tmp_path / "linked.png", "--force").exit_code == 0
    assert theirs.read_text() == "a hard link's other name"  # the name replaced, not the file both named
    assert (tmp_path / "linked.png").read_bytes().startswith(b"\x89PNG")
    (tmp_path / "dir.png").mkdir()
    assert "is a directory" in cli("report", run, "--out", tmp_path / "dir.png", "--force").stderr
