"""What a rank reads from the resolved recipe: groups, prompts from local files, reward functions."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from helpers import RECIPES, write
from rlhf_cli.config.resolve import RunRequest, resolve
from rlhf_cli.rank.inputs import RankInputs, load_prompts, reward_funcs


def inputs_for(tmp_path: Path, **sets: str) -> RankInputs:
    run = resolve(RunRequest("rloo", str(RECIPES / "rloo" / "smoke.yaml"),
                             sets=tuple(f"{k}={v}" for k, v in sets.items())), cwd=tmp_path, cuda=False)
    path = write(tmp_path / "resolved.yaml", yaml.safe_dump(run.recipe_values()))
    return RankInputs.read("rloo", path)


def test_resolved_recipe_splits_into_the_groups_each_consumer_takes(tmp_path: Path) -> None:
    inputs = inputs_for(tmp_path, stage3_prefetch_bucket_size="2000", dtype="bfloat16")
    assert inputs.trainer["max_steps"] == 4 and "model_name_or_path" not in inputs.trainer
    assert "offload_optimizer" not in inputs.trainer  # launch keys stay with the launcher
    assert inputs.zero3 == {"stage3_prefetch_bucket_size": 2000}
    assert inputs.model_init_kwargs()["dtype"] == "bfloat16"


def test_prompts_from_a_csv_with_another_column_name(tmp_path: Path) -> None:
    data = write(tmp_path / "q.csv", "question,answer\nWhy is the sky blue?,x\nName a tree.,y\n")
    train, evaluation = load_prompts(inputs_for(tmp_path, dataset_name=str(data), dataset_prompt_column="question"))
    assert train["prompt"] == ["Why is the sky blue?", "Name a tree."] and evaluation is None


def test_conversational_prompts_from_jsonl(tmp_path: Path) -> None:
    rows = [{"prompt": [{"role": "user", "content": "Describe a lake."}]}]
    data = write(tmp_path / "chat.jsonl", "".join(json.dumps(row) + "\n" for row in rows))
    train, _ = load_prompts(inputs_for(tmp_path, dataset_name=str(data)))
    assert train[0]["prompt"] == rows[0]["prompt"]


def test_reward_model_and_functions_from_files_modules_and_trl(tmp_path: Path, monkeypatch) -> None:
    write(tmp_path / "scores.py",
          "def length(completions, **kwargs):\n    return [float(len(c)) for c in completions]\n")
    write(tmp_path / "mypkg" / "__init__.py", "")
    write(tmp_path / "mypkg" / "rewards.py", "def one(completions, **kwargs):\n    return [1.0] * len(completions)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    funcs = reward_funcs(inputs_for(tmp_path, reward_funcs=f"[{tmp_path}/scores.py:length, mypkg.rewards:one, "
                                                           "think_format_reward, get_soft_overlong_punishment]"))
    assert funcs[0] == str(RECIPES / "smoke" / "reward")
    assert funcs[1](["ab", "abcd"]) == [2.0, 4.0]
    assert funcs[2](["x"]) == [1.0]
    assert funcs[3].__name__ == "think_format_reward"
    # built as TRL's scripts build it: max_completion_len 1280, soft_punish_cache 256 (no penalty up to 1024 tokens)
    assert funcs[4](completion_ids=[[1] * 1024, [1] * 1100]) == [0.0, -(1100 - 1024) / 256]
