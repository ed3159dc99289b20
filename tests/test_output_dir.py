"""Nothing a user wrote is ever replaced: not the run's inputs, not the files of an output dir rlhf did not write.

Runs go through the real CLI and launcher, with a stand-in for the ranks that writes what ranks write (the model,
a checkpoint, the trainer state) into the output dir; every input is compared byte for byte afterwards.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import shutil
import sys
from pathlib import Path

import pytest

from helpers import RECIPES, REPO
from rlhf_cli.launch import runner
from rlhf_cli.launch.command import Launch
from rlhf_cli.output.run_dir import RunDir

USER_RECIPE = "# my own recipe, with comments\nmax_steps: 2\n"
REWARD = "def score(prompts, completions, **kwargs):\n    return [0.0 for _ in completions]\n"
# What the ranks write: the model (same names as the policy's own files), a checkpoint, the trainer state; once the
# launcher opens the gate, as the launch supervisor waits for it.
RANK = """
import json, os, pathlib, sys
os.read(int(os.environ["RLHF_START_GATE_FD"]), 2)
out = pathlib.Path(sys.argv[1])
for name in ("config.json", "model.safetensors", "tokenizer_config.json", "trainer_state.json"):
    (out / name).write_text("trained")
saved = {"model.safetensors": "trained", "latest": "global_step2",  # and the 2 ranks' ZeRO-3 shards
         **{f"global_step2/zero_pp_rank_{rank}_mp_rank_00_{kind}_states.pt": kind for rank in (0, 1)
            for kind in ("model", "optim")}}
for name, text in saved.items():
    (out / "checkpoint-2" / name).parent.mkdir(parents=True, exist_ok=True)
    (out / "checkpoint-2" / name).write_text(text)
(out / "checkpoint-2" / "rlhf-manifest.json").write_text(json.dumps({"files": {
    name: len(text) for name, text in saved.items()}}))
"""


@pytest.fixture
def ranks_write_a_model(monkeypatch: pytest.MonkeyPatch, check_passes) -> None:
    monkeypatch.setattr(runner, "launch_command",
                        lambda run, verbosity="normal": Launch([sys.executable, "-c", RANK, str(run.output_dir)], {}))


def inputs(root: Path) -> dict[str, Path]:
    """Every kind of input a run reads, as a user keeps them: models, data, a reward file, the recipe."""
    shutil.copytree(RECIPES / "smoke" / "policy", root / "policy")
    shutil.copytree(RECIPES / "smoke" / "reward", root / "reward")
    (root / "data").mkdir()
    shutil.copy(RECIPES / "smoke" / "prompts.jsonl", root / "data" / "prompts.jsonl")
    (root / "code").mkdir()
    (root / "code" / "rewards.py").write_text(REWARD)
    (root / "recipes").mkdir()
    (root / "recipes" / "r.yaml").write_text(
        f"# the user's recipe\nmodel_name_or_path: {root}/policy\nreward_model_name_or_path: {root}/reward\n"
        f"dataset_name: {root}/data/prompts.jsonl\nreward_funcs: [{root}/code/rewards.py:score]\nnum_processes: 2\n"
        "max_steps: 2\nper_device_train_batch_size: 2\nnum_generations: 2\nmax_completion_length: 8\n"
        "report_to: none\n")
    (root / "mine").mkdir()
    (root / "mine" / "recipe.yaml").write_text(USER_RECIPE)  # a directory holding only the user's own recipe
    return {"policy": root / "policy", "reward": root / "reward", "data": root / "data",
            "dataset": root / "data" / "prompts.jsonl", "reward file": root / "code" / "rewards.py",
            "recipe": root / "recipes" / "r.yaml", "mine": root / "mine"}


def contents(root: Path) -> dict[str, str]:
    """Every user file under `root`, by digest (the run dirs under runs/ are rlhf's)."""
    return {str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(root.rglob("*")) if path.is_file() and "runs" not in path.relative_to(root).parts}


def test_an_output_dir_that_is_an_input_is_refused_and_the_model_is_unchanged(cli, tmp_path, ranks_write_a_model):
    paths = inputs(tmp_path)
    before = contents(tmp_path)
    result = cli("rloo", "-r", paths["recipe"], "-o", paths["policy"])
    assert result.exit_code == 2, result.output
    assert f"output dir {paths['policy']} is the run's `model_name_or_path`" in result.output
    assert contents(tmp_path) == before


def test_resume_auto_keeps_the_users_own_recipe_in_the_output_dir(cli, tmp_path, ranks_write_a_model):
    paths = inputs(tmp_path)
    for extra in ((), ("--resume", "auto"), ("--overwrite",), ("--resume", "auto", "--overwrite")):
        result = cli("rloo", "-r", paths["recipe"], "-o", paths["mine"], *extra)
        assert result.exit_code == 2, result.output
        assert "holds files rlhf did not write (recipe.yaml)" in " ".join(result.output.split())
        assert (paths["mine"] / "recipe.yaml").read_text() == USER_RECIPE


def test_overwrite_removes_only_what_the_earlier_run_wrote(cli, tmp_path, ranks_write_a_model):
    paths = inputs(tmp_path)
    out = tmp_path / "runs" / "a"
    assert cli("rloo", "-r", paths["recipe"], "-o", out).exit_code == 0
    written = json.loads(RunDir(out).written.read_text())
    assert written == {"entries": sorted(["accelerate_config.yaml", "checkpoint-2", "config.json", "launch.sh",
                                          "model.safetensors", "recipe.yaml", "rlhf-files.json", "run.json",
                                          "tokenizer_config.json", "trainer_state.json"]), "running": False}
    again = cli("rloo", "-r", paths["recipe"], "-o", out)
    assert again.exit_code == 2 and "already holds a run" in again.output and "finished" in again.output
    (out / "pytorch_model.bin").write_text("from the earlier run")
    (out / "checkpoint-9").mkdir()  # an earlier run's checkpoint; --overwrite must not leave it to be resumed
    written["entries"] += ["checkpoint-9", "pytorch_model.bin"]
    RunDir(out).written.write_text(json.dumps(written))
    assert cli("rloo", "-r", paths["recipe"], "-o", out, "--overwrite").exit_code == 0
    assert not (out / "pytorch_model.bin").exists() and not (out / "checkpoint-9").exists()
    (out / "notes.txt").write_text("mine")  # the user's, added after the run
    refused = cli("rloo", "-r", paths["recipe"], "-o", out, "--overwrite")
    assert refused.exit_code == 2 and "holds files rlhf did not write (notes.txt)" in refused.output
    assert (out / "notes.txt").read_text() == "mine"


def test_a_record_naming_what_no_run_writes_adopts_nothing(cli, tmp_path, ranks_write_a_model):
    """The record is anyone's to edit: `../victim`, a link to the user's files, a user's notes.txt stay where
    they are, and make the directory one a run refuses."""
    paths = inputs(tmp_path)
    out = tmp_path / "runs" / "a"
    assert cli("rloo", "-r", paths["recipe"], "-o", out).exit_code == 0
    (tmp_path / "victim").mkdir()
    (tmp_path / "victim" / "thesis.tex").write_text("mine")
    (out / "checkpoint-7").symlink_to(tmp_path / "victim")
    (out / "notes.txt").write_text("mine")
    written = json.loads(RunDir(out).written.read_text())
    for running in (False, True):  # a finished run's record, and a crashed one's (it never recorded its end)
        RunDir(out).written.write_text(json.dumps({"entries": [*written["entries"], "../victim", str(tmp_path),
                                                               "checkpoint-7", "notes.txt"], "running": running}))
        refused = cli("rloo", "-r", paths["recipe"], "-o", out, "--overwrite")
        assert refused.exit_code == 2, refused.output
        assert "holds files rlhf did not write (checkpoint-7, notes.txt)" in " ".join(refused.output.split())
    assert (tmp_path / "victim" / "thesis.tex").read_text() == "mine" and (out / "notes.txt").read_text() == "mine"
    (out / "checkpoint-7").unlink()
    (out / "notes.txt").unlink()
    assert cli("rloo", "-r", paths["recipe"], "-o", out, "--overwrite").exit_code == 0
    assert (tmp_path / "victim" / "thesis.tex").read_text() == "mine"


def test_a_file_the_user_adds_while_the_run_runs_stays_the_users(cli, tmp_path, monkeypatch, check_passes):
    """The run's end records what runs write, not whatever the directory then holds."""
    rank = RANK + "(out / 'notes.txt').write_text('mine')\n"
    monkeypatch.setattr(runner, "launch_command",
                        lambda run, verbosity="normal": Launch([sys.executable, "-c", rank, str(run.output_dir)], {}))
    paths = inputs(tmp_path)
    out = tmp_path / "runs" / "a"
    assert cli("rloo", "-r", paths["recipe"], "-o", out).exit_code == 0
    assert "notes.txt" not in json.loads(RunDir(out).written.read_text())["entries"]
    refused = cli("rloo", "-r", paths["recipe"], "-o", out, "--overwrite")
    assert refused.exit_code == 2 and "holds files rlhf did not write (notes.txt)" in refused.output


TRL_MODEL_CARD = "---\nlibrary_name: transformers\n---\n# Model Card for a\n\nIt has been trained using [TRL](https://github.com/huggingface/trl).\n"


def test_an_output_dir_of_an_rlhf_older_than_its_record_is_resumed_and_overwritten(cli, tmp_path, ranks_write_a_model):
    """Before rlhf-files.json, a run left rlhf's recipe.yaml and run.json: the names runs write are its, the rest
    stays the user's."""
    paths = inputs(tmp_path)
    out = tmp_path / "runs" / "old"
    assert cli("rloo", "-r", paths["recipe"], "-o", out).exit_code == 0
    RunDir(out).written.unlink()  # as an older rlhf left it
    (out / "README.md").write_text(TRL_MODEL_CARD)
    held = cli("rloo", "-r", paths["recipe"], "-o", out)
    assert held.exit_code == 2 and "already holds a run" in held.output and "finished" in held.output
    for name, text in (("notes.txt", "mine"), ("README.md", "# my notes\n")):
        kept = (out / name).read_text() if (out / name).exists() else None
        (out / name).write_text(text)
        refused = cli("rloo", "-r", paths["recipe"], "-o", out, "--overwrite")
        assert refused.exit_code == 2 and f"holds files rlhf did not write ({name})" in refused.output
        assert (out / name).read_text() == text
        (out / name).write_text(kept) if kept is not None else (out / name).unlink()

    (out / "checkpoint-2" / "trainer_state.json").write_text("{}")  # the stand-in ranks' checkpoint, made whole
    resumed = cli("rloo", "-r", paths["recipe"], "-o", out, "--resume", "auto")
    assert resumed.exit_code == 0, resumed.output
    assert "README.md" in json.loads(RunDir(out).written.read_text())["entries"]  # adopted by the new record

    RunDir(out).written.unlink()
    (out / "checkpoint-9").mkdir()
    assert cli("rloo", "-r", paths["recipe"], "-o", out, "--overwrite").exit_code == 0
    assert not (out / "checkpoint-9").exists() and not (out / "README.md").exists()
    assert json.loads(RunDir(out).written.read_text())["running"] is False


def test_a_directory_with_a_recipe_yaml_of_rlhfs_but_no_run_record_is_not_adopted(cli, tmp_path, nothing_launches):
    """The header alone could be copied by hand: without the launcher's run.json nothing there is rlhf's."""
    out = tmp_path / "copied"
    out.mkdir()
    (out / "recipe.yaml").write_text("# Resolved by rlhf from flags; a valid recipe for `rlhf rloo`.\nmax_steps: 2\n")
    (out / "run.json").write_text('{"mine": true}')
    result = cli("rloo", "-r", "rloo/smoke", "-o", out, "--overwrite")
    assert result.exit_code == 2 and "holds files rlhf did not write (recipe.yaml, run.json)" in result.output
    assert nothing_launches == []


def test_the_plot_rlhf_report_writes_into_a_run_is_the_runs(cli, tmp_path, ranks_write_a_model):
    paths = inputs(tmp_path)
    out = tmp_path / "runs" / "a"
    assert cli("rloo", "-r", paths["recipe"], "-o", out).exit_code == 0
    shutil.copy(REPO / "tests" / "fixtures" / "runs" / "rloo" / "trainer_state.json", out)
    assert cli("report", out).exit_code == 0
    assert "report.png" in json.loads(RunDir(out).written.read_text())["entries"]
    assert cli("rloo", "-r", paths["recipe"], "-o", out, "--overwrite").exit_code == 0
    assert not (out / "report.png").exists()


def test_resume_auto_does_not_train_a_finished_run_without_checkpoints_again(cli, tmp_path, ranks_write_a_model):
    paths = inputs(tmp_path)
    out = tmp_path / "runs" / "a"
    assert cli("rloo", "-r", paths["recipe"], "-o", out).exit_code == 0
    shutil.rmtree(out / "checkpoint-2")
    result = cli("rloo", "-r", paths["recipe"], "-o", out, "--resume", "auto")
    assert result.exit_code == 2, result.output
    assert "finished and left no checkpoint to continue from" in " ".join(result.output.split())


OUTPUT_DIRS = ("policy", "reward", "data", "dataset", "reward file", "recipe", "mine", "inside policy",
               "parent", "recipes dir", "new", "earlier run")
RESUMES = ("none", "auto", "checkpoint")


@pytest.mark.parametrize("output", OUTPUT_DIRS)
def test_no_combination_of_output_resume_and_overwrite_changes_an_input(output: str, cli, tmp_path,
                                                                        ranks_write_a_model):
    """Every -o a user might point at their inputs, with every --resume and --overwrite the CLI accepts."""
    paths = inputs(tmp_path)
    runs = tmp_path / "runs"
    targets = {**paths, "inside policy": paths["policy"] / "out", "parent": tmp_path,
               "recipes dir": paths["recipe"].parent, "new": runs / "new", "earlier run": runs / "earlier"}
    before = contents(tmp_path)
    for resume, overwrite in itertools.product(RESUMES, (False, True)):
        shutil.rmtree(runs, ignore_errors=True)
        assert cli("rloo", "-r", paths["recipe"], "-o", runs / "earlier").exit_code == 0
        args = ["rloo", "-r", paths["recipe"], "-o", targets[output]]
        args += {"none": [], "auto": ["--resume", "auto"],
                 "checkpoint": ["--resume", runs / "earlier" / "checkpoint-2"]}[resume]
        result = cli(*args, *(["--overwrite"] if overwrite else []))
        assert result.exit_code in (0, 2), result.output
        assert contents(tmp_path) == before, (output, resume, overwrite, result.output)
        if output in ("new", "earlier run") and result.exit_code == 0:
            assert (targets[output] / "model.safetensors").read_text() == "trained"


def test_an_output_dir_in_a_symlink_loop_is_one_line(cli, nothing_launches, tmp_path: Path) -> None:
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    result = cli("rloo", "-r", "rloo/smoke", "-o", tmp_path / "a")
    assert result.exit_code == 2 and result.output.count("Error:") == 1, result.output
    assert "Symlink loop" in result.output and nothing_launches == []

