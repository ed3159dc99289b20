"""`rlhf init`: a starter recipe that is valid as written, and never silently overwrites."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from rlhf_cli.algorithms import ALGORITHMS
from rlhf_cli.config.fields import ALIASES, catalogue, coerce
from rlhf_cli.config.starter import entry_value, sections, starter_recipe

COMMANDS = [entry.command for entry in ALGORITHMS.values()]
LIKELY_KEYS = {"model_name_or_path", "reward_model_name_or_path", "reward_funcs", "dataset_name",
               "dataset_prompt_column", "gather", "offload_optimizer", "offload_params", "num_processes",
               "per_device_train_batch_size", "gradient_accumulation_steps", "learning_rate", "output_dir",
               "logging_steps", "save_strategy"}
PER_ALGORITHM = {"ppo": {"kl_coef", "response_length", "total_episodes"},
                 "rloo": {"beta", "num_generations", "max_completion_length"},
                 "online-dpo": {"beta", "max_new_tokens", "max_length"},
                 "grpo": {"beta", "num_generations", "max_completion_length", "loss_type"}}


@pytest.mark.parametrize("command", COMMANDS)
def test_the_written_recipe_passes_dry_run(cli, command: str, tmp_path: Path) -> None:
    written = cli("init", command, "--out", "starter.yaml")
    assert written.exit_code == 0, written.output
    assert f"rlhf {command} -r starter.yaml --dry-run" in written.stderr
    result = cli(command, "-r", "starter.yaml", "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    recipe = yaml.safe_load((tmp_path / "starter.yaml").read_text())
    assert {key for key, source in plan["sources"].items() if source == "recipe"} >= set(recipe) - {"gather"}
    assert plan["trainer"]["ds3_gather_for_generation"] is recipe["gather"]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_field_has_a_comment_and_a_valid_value_even_when_commented_out(command: str) -> None:
    algorithm = command.replace("-", "_")
    text = starter_recipe(algorithm)
    keys = set()
    for line in text.splitlines():
        body, _, comment = line.removeprefix("# ").partition("  # ")
        key, sep, value = body.partition(": ")
        field = catalogue(algorithm).get(ALIASES.get(key, key)) if sep else None
        if field is not None:
            keys.add(key)
            assert comment.strip(), line
            coerce(field, yaml.safe_load(value))  # raises if the value does not fit
    assert keys >= LIKELY_KEYS | PER_ALGORITHM[command]
    assert keys == {entry.key for _, entries in sections(algorithm) for entry in entries}
    assert max(map(len, text.splitlines())) <= 120


def test_unset_values_come_from_the_field_defaults() -> None:
    entries = {entry.key: entry for _, group in sections("rloo") for entry in group}
    assert entry_value("rloo", entries["learning_rate"]) == catalogue("rloo")["learning_rate"].default


def test_without_out_it_prints_and_writes_nothing(cli, tmp_path: Path) -> None:
    result = cli("init", "rloo")
    assert result.exit_code == 0
    assert result.stdout == starter_recipe("rloo")
    assert list(tmp_path.iterdir()) == []


def test_an_existing_file_is_kept_unless_forced(cli, tmp_path: Path) -> None:
    (tmp_path / "mine.yaml").write_text("precious: true\n")
    refused = cli("init", "ppo", "--out", "mine.yaml")
    assert refused.exit_code == 2
    assert refused.stderr.strip() == "Error: mine.yaml already exists; choose another --out or pass --force to " \
                                     "overwrite it"
    assert (tmp_path / "mine.yaml").read_text() == "precious: true\n"
    forced = cli("init", "ppo", "--out", "mine.yaml", "--force")
    assert forced.exit_code == 0 and "total_episodes:" in (tmp_path / "mine.yaml").read_text()


@pytest.mark.parametrize("link", ["symbolic", "hard", "dangling"])
def test_a_link_is_replaced_itself_and_what_it_points_to_is_never_written(cli, tmp_path: Path, link: str) -> None:
    target = tmp_path / "theirs.yaml"
    target.write_text("precious: true\n")
    if link == "hard":
        os.link(target, tmp_path / "mine.yaml")
    else:
        (tmp_path / "mine.yaml").symlink_to(target if link == "symbolic" else tmp_path / "gone.yaml")
    refused = cli("init", "ppo", "--out", "mine.yaml")
    assert refused.exit_code == 2 and "already exists" in refused.stderr
    forced = cli("init", "ppo", "--out", "mine.yaml", "--force")
    assert forced.exit_code == 0, forced.output
    mine = tmp_path / "mine.yaml"
    assert not mine.is_symlink() and "total_episodes:" in mine.read_text()
    assert target.read_text() == "precious: true\n" and not (tmp_path / "gone.yaml").exists()


def test_an_unknown_algorithm_is_refused(cli) -> None:
    result = cli("init", "sft")
    assert result.exit_code == 2 and "'sft' is not one of" in result.output
