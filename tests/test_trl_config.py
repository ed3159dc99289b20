"""A config written for TRL's own CLI (`trl rloo --config file.yaml`) runs unchanged: its `env:` block reaches every
rank, its `datasets:` mixture is loaded, TRL's bundled accelerate configs are found by name."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import yaml

from helpers import RECIPES, trl_config, write
from rlhf_cli.config.resolve import RunRequest, resolve
from rlhf_cli.launch import runner
from rlhf_cli.launch.command import launch_command


def test_the_env_block_travels_in_the_resolved_recipe_and_the_launch_files(tmp_path: Path) -> None:
    run = resolve(RunRequest("rloo", str(trl_config(tmp_path)), {"output_dir": ("-o", str(tmp_path / "out"))}),
                  cwd=tmp_path, cuda=False)
    assert run.value("env") == {"RLHF_GREETING": "hello from env", "RLHF_PROBE_DIR": str(tmp_path),
                                "RLHF_STEPS": "2"}  # as TRL's parser sets them: str(value)
    assert run.value("datasets") == [{"path": "json", "data_files": str(tmp_path / "data" / "prompts.jsonl")}]
    launch = launch_command(run)
    assert launch.env["RLHF_GREETING"] == "hello from env" and launch.env["RLHF_OUTPUT"] == "normal"
    runner.write_run_files(run, run.accelerate)
    written = yaml.safe_load((tmp_path / "out" / "recipe.yaml").read_text())
    assert written["env"] == run.value("env")  # another machine's launcher resolves the same
    assert f"export RLHF_GREETING={shlex.quote('hello from env')}" in (tmp_path / "out" / "launch.sh").read_text()


def test_the_dry_run_shows_the_env_block(cli, tmp_path: Path) -> None:
    result = cli("rloo", "-r", trl_config(tmp_path), "--dry-run")
    assert result.exit_code == 0, result.output
    assert any(line.split("│")[1].strip() == "env" for line in result.stdout.splitlines() if "│" in line)
    assert "RLHF_GREETING='hello from env'" in result.stdout  # in the launch line


def test_the_env_block_wins_over_the_callers_environment_and_rlhfs_defaults(tmp_path: Path) -> None:
    recipe = write(tmp_path / "r.yaml", (RECIPES / "rloo" / "smoke.yaml").read_text().replace(
        "../smoke/", f"{RECIPES}/smoke/") + "env:\n  TOKENIZERS_PARALLELISM: 'true'\n  RLHF_OUTPUT: quiet\n")
    launch = launch_command(resolve(RunRequest("rloo", str(recipe)), cwd=tmp_path, cuda=False), verbosity="normal")
    assert launch.env["TOKENIZERS_PARALLELISM"] == "true"
    assert launch.env["RLHF_OUTPUT"] == "normal"  # rlhf's contract with its ranks stays rlhf's


def test_trls_bundled_accelerate_configs_are_found_by_name(tmp_path: Path) -> None:
    run = resolve(RunRequest("rloo", "rloo/smoke", sets=("accelerate_config=zero2",)), cwd=tmp_path, cuda=True)
    assert Path(run.value("accelerate_config")).parts[-2:] == ("accelerate_configs", "zero2.yaml")
    assert run.accelerate["deepspeed_config"]["zero_stage"] == 2
    assert any("`accelerate_config: zero2` is TRL's bundled" in note for note in run.notes)



# A command line as TRL's GRPO docs write it (`trl grpo ...`), with the smoke models for the hub ids.
TRL_DOCS_LINE = (f"--model_name_or_path {RECIPES}/smoke/policy --dataset_name {RECIPES}/smoke/prompts.jsonl "
                 f"--reward_model_name_or_path={RECIPES}/smoke/reward --reward_funcs think_format_reward "
                 "--learning_rate 1e-6 --per_device_train_batch_size=2 --num_generations 2 --max_completion_length 8 "
                 "--scale_rewards none --loss_type dr_grpo --gradient_checkpointing --bf16 false --num_processes 2")


def test_a_trl_command_line_pastes_unchanged_after_the_command(cli, tmp_path: Path) -> None:
    result = cli("grpo", *shlex.split(TRL_DOCS_LINE), "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    trainer, sources = shown["trainer"], shown["sources"]
    assert trainer["learning_rate"] == 1e-6 and sources["learning_rate"] == "flag --learning_rate"
    assert trainer["per_device_train_batch_size"] == 2
    assert sources["per_device_train_batch_size"] == "flag --per_device_train_batch_size"
    assert trainer["gradient_checkpointing"] is True  # a boolean flag without a value
    assert sources["gradient_checkpointing"] == "flag --gradient_checkpointing"
    assert trainer["bf16"] is False and trainer["scale_rewards"] == "none" and trainer["loss_type"] == "dr_grpo"
    assert shown["model"]["model_name_or_path"] == str(RECIPES / "smoke" / "policy")
    assert shown["script"]["reward_funcs"] == ["think_format_reward"]


def test_trl_style_flags_get_the_checks_of_set(cli) -> None:
    result = cli("grpo", "-r", "grpo/smoke", "--learning_rate", "1e-6", "--learning_rate=2e-6", "--lerning_rate",
                 "3", "--max_steps", "many", "--dry-run")
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert lines == ["Error: --learning_rate: `learning_rate` is set again (already set by --learning_rate); keep one",
                     "Error: --lerning_rate: unknown key `lerning_rate`; did you mean `learning_rate`? (nor an "
                     "option: see `rlhf grpo --help`)",
                     "Error: --max_steps: `max_steps`: expected an integer, got 'many' (str)"], result.output
