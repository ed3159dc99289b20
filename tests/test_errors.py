"""The one error boundary: each exception type's lines and exit code, RLHF_DEBUG, text printed as text, and every
problem of a run reported together."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import typer

from helpers import RECIPES, write
from rlhf_cli.cli.errors import debug_enabled, exit_code_for
from rlhf_cli.errors import ConfigError, PlanError, RlhfError

pytestmark = pytest.mark.usefixtures("nothing_launches")


@pytest.mark.parametrize(("error", "lines", "code"), [
    (RlhfError("a user mistake"), ["Error: a user mistake"], 2),
    (ConfigError("first problem", "second problem"), ["Error: first problem", "Error: second problem"], 2),
    (PlanError("neither fits"), ["Error: neither fits"], 2),
    (typer.BadParameter("bad value"), ["Error: Invalid value: bad value (see `rlhf --help`)"], 2),
    (OSError(errno.ENAMETOOLONG, "File name too long", "runs/xxx"), ["Error: runs/xxx: File name too long"], 2),
    (PermissionError(errno.EACCES, "Permission denied", "/root/x", None, "/root/y"),
     ["Error: /root/x -> /root/y: Permission denied"], 2),
    (OSError("no file named"), ["Error: no file named"], 2),
    (KeyboardInterrupt(), ["Error: interrupted"], 130),
    (typer.Abort(), ["Error: interrupted"], 130),
    (ValueError("a bug\nover two lines"), ["Error: internal error (ValueError: a bug over two lines); rerun with "
                                           "RLHF_DEBUG=1 for the traceback and report it"], 1),
])
def test_each_error_type_has_its_lines_and_exit_code(error: BaseException, lines: list[str], code: int,
                                                     capsys: pytest.CaptureFixture) -> None:
    assert exit_code_for(error, environ={}) == code
    printed = capsys.readouterr()
    assert printed.err.splitlines() == lines and printed.out == ""


def test_system_exit_is_not_an_error_to_report() -> None:
    with pytest.raises(SystemExit):
        exit_code_for(SystemExit(0), environ={})


@pytest.mark.parametrize(("value", "on"), [("1", True), ("true", True), ("TRUE", True), ("Yes", True), (" yes ", True),
                                           ("0", False), ("false", False), ("no", False), ("", False),
                                           ("off", False), ("2", False)])
def test_rlhf_debug_is_on_for_1_true_yes_only(value: str, on: bool) -> None:
    assert debug_enabled({"RLHF_DEBUG": value}) is on
    assert debug_enabled({}) is False


@pytest.mark.parametrize(("value", "traceback"), [("1", True), ("yes", True), ("0", False), ("false", False)])
def test_rlhf_debug_shows_the_traceback_and_keeps_the_exit_code(cli, monkeypatch: pytest.MonkeyPatch, value: str,
                                                                traceback: bool) -> None:
    monkeypatch.setenv("RLHF_DEBUG", value)
    result = cli("rloo", "-r", "rloo/smoke", "--set", "max_steps=lots", "--dry-run")
    assert result.exit_code == 2
    assert ("Traceback" in result.output) is traceback
    assert "Error: --set max_steps: `max_steps`: expected an integer, got 'lots' (str)" in result.output


def test_a_usage_error_of_the_parser_is_one_line(cli) -> None:
    result = cli("rloo", "-r", "rloo/smoke", "--frobnicate")  # read as a TRL-style flag: a recipe key
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "Error: --frobnicate: unknown key `frobnicate` (nor an option: see `rlhf rloo --help`)"]


def test_a_bug_is_one_line_exit_1_without_a_traceback(cli, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlhf_cli.config import resolve

    def broken(*args, **kwargs):
        raise KeyError("settings")

    monkeypatch.setattr(resolve, "resolve", broken)
    result = cli("rloo", "-r", "rloo/smoke", "--dry-run")
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.strip().splitlines() == [
        "Error: internal error (KeyError: 'settings'); rerun with RLHF_DEBUG=1 for the traceback and report it"]


def test_text_from_the_user_is_printed_as_text_not_markup(cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A path holding `[/x]` (rich's closing tag) in an error, in the dry run's tables and in its launch line."""
    monkeypatch.setenv("COLUMNS", "250")  # the long temporary path stays on one line of the table
    missing = cli("rloo", "-r", "[/x]/r.yaml")
    assert missing.exit_code == 2
    assert missing.output.strip() == "Error: [/x]/r.yaml: recipe not found; give a YAML file or a bundled recipe " \
                                     "(see recipes/)"
    dry = cli("rloo", "-r", "rloo/smoke", "-o", "[red]/[/x]/out", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert f"'{tmp_path}/[red]/[/x]/out/recipe.yaml'" in dry.stdout  # the launch line
    assert "[red]" in dry.stdout.split("accelerate / DeepSpeed")[0]  # the output_dir row of the settings table


def test_every_planted_problem_is_reported_together(cli, nothing_launches, tmp_path: Path) -> None:
    """A recipe with five mistakes, two bad flags, a bad --set, a bad variable and a broken reward file: one line
    each, in one run, and nothing started."""
    write(tmp_path / "rewards.py", "def score(prompts completions):\n    return []\n")
    recipe = write(tmp_path / "r.yaml", f"""model_name_or_path: {RECIPES}/smoke/policy
reward_model_name_or_path: {RECIPES}/smoke/reward
dataset_name: {RECIPES}/smoke/prompts.jsonl
learning_rate: -1.0e-5
report_to: wandbb
save_strategy: no
vf_coef: 0.1
reward_funcs: [rewards.py:score]
""")
    import os

    os.environ["MASTER_ADDR"], os.environ["NODE_RANK"] = "10.0.0.1", "abc"
    try:
        result = cli("rloo", "-r", recipe, "--seed", "-1", "--max-steps", "0", "--set", "num_generations=1",
                     "-o", tmp_path / "out")
    finally:
        del os.environ["MASTER_ADDR"], os.environ["NODE_RANK"]
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and all(line.startswith("Error: ") for line in lines), result.output
    expected = ["`learning_rate`: must be at least 0", "`report_to`: expected one of", "`save_strategy`: expected one "
                "of no,", "`vf_coef` is a ppo key", "rewards.py:1: syntax error", "NODE_RANK=abc: `machine_rank`",
                "--seed: `seed`: must be at least 0", "--max-steps: `max_steps`: must be at least 1",
                "--set num_generations: `num_generations`: must be at least 2"]
    assert len(lines) == len(expected)
    for text in expected:
        assert sum(text in line for line in lines) == 1, (text, lines)
    assert nothing_launches == [] and not (tmp_path / "out").exists()


def test_an_unreadable_recipe_does_not_hide_the_command_lines_problems(cli, tmp_path: Path) -> None:
    recipe = write(tmp_path / "r.yaml", "model_name_or_path: [unclosed\n")
    result = cli("rloo", "-r", recipe, "--max-steps", "zero", "--gather", "--no-gather")
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2
    assert lines == ["Error: --gather and --no-gather contradict each other; keep one",
                     f"Error: {recipe}:2: not valid YAML (expected ',' or ']', but got '<stream end>')",
                     "Error: --max-steps: `max_steps`: expected an integer, got 'zero' (str)"]
