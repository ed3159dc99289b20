"""What every rank would die of, found before launch from files and headers alone (rlhf_cli/config/file_checks.py)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path


from helpers import RECIPES
from rlhf_cli.config import file_checks


def test_whole_weights_pass_and_a_cut_shard_is_named(tmp_path: Path) -> None:
    assert file_checks.model_files_problem(RECIPES / "smoke" / "policy", needs_tokenizer=True) is None
    model = Path(shutil.copytree(RECIPES / "smoke" / "policy", tmp_path / "m"))
    whole = (model / "model.safetensors").read_bytes()
    (model / "model.safetensors").rename(model / "model-1.safetensors")
    (model / "model-2.safetensors").write_bytes(whole)
    (model / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model-1.safetensors", "b": "model-2.safetensors"}}))
    assert file_checks.weights_problem(model) is None  # sharded, every shard whole
    (model / "model-2.safetensors").write_bytes(whole[:-1])
    assert file_checks.weights_problem(model) == \
        f"{model / 'model-2.safetensors'} is truncated ({len(whole) - 1} of {len(whole)} bytes)"
    (model / "model-2.safetensors").write_bytes(whole[:5])
    assert "is truncated or not a safetensors file (5 bytes)" in file_checks.weights_problem(model)


def test_a_checkpoint_of_this_run_resumes(tmp_path: Path) -> None:
    checkpoint = tmp_path / "run" / "checkpoint-2"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text("{}")
    shutil.copy(RECIPES / "smoke" / "policy" / "config.json", checkpoint / "config.json")
    (tmp_path / "run" / "recipe.yaml").write_text("# Resolved by rlhf from x; a valid recipe for `rlhf online-dpo`.\n")
    policy = str(RECIPES / "smoke" / "policy")
    assert file_checks.checkpoint_problem(checkpoint, False, policy, "online_dpo") is None
    assert "not of rloo" in file_checks.checkpoint_problem(checkpoint, False, policy, "rloo")


def test_path_keeping_the_tools_is_accepted() -> None:
    assert file_checks.environment_problems({"PATH": "/opt/mine:" + os.environ["PATH"]}, "r.yaml:2", cuda=False) == []
    assert file_checks.environment_problems({"MASTER_PORT": "29500", "DS_ACCELERATOR": "cpu"}, "r.yaml:2", False) == []
