"""What every rank would die of, found before launch from files and headers alone (rlhf_cli/config/file_checks.py)."""

from __future__ import annotations

import json
import math
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
    assert file_checks.checkpoint_problem(checkpoint, False, policy, "online_dpo", deepspeed=False) is None
    assert "not of rloo" in file_checks.checkpoint_problem(checkpoint, False, policy, "rloo", deepspeed=False)


POLICY = RECIPES / "smoke" / "policy"


def header_only(shapes: dict[str, list[int]]) -> bytes:
    """A safetensors file's header (what the check reads) for tensors of these shapes."""
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = 4 * math.prod(shape)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header).encode()
    return len(text).to_bytes(8, "little") + text


def policy_shapes() -> dict[str, list[int]]:
    header, _ = file_checks.safetensors_header(POLICY / "model.safetensors")
    return {name: entry["shape"] for name, entry in header.items() if name != "__metadata__"}


def saved_with(tmp_path: Path, shapes: dict[str, list[int]]) -> Path:
    checkpoint = tmp_path / "checkpoint-2"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text("{}")
    shutil.copy(POLICY / "config.json", checkpoint / "config.json")  # the four sizes agree in every case
    (checkpoint / "model.safetensors").write_bytes(header_only(shapes))
    return checkpoint


def test_a_checkpoint_of_a_model_with_another_shape_is_refused_by_every_parameter(tmp_path: Path) -> None:
    """One KV head instead of two (Llama 3's grouped queries), q/k/v biases (Qwen2's), a vocabulary grown by a pad
    token (accepted: the run adds it again), a tied head saved once (GPT-2's)."""
    shapes = policy_shapes()
    one_kv_head = {**shapes, "model.layers.0.self_attn.k_proj.weight": [32, 64]}
    problem = file_checks.checkpoint_problem(saved_with(tmp_path / "a", one_kv_head), False, str(POLICY), "rloo",
                                             deepspeed=False)
    assert problem == f"{tmp_path / 'a' / 'checkpoint-2'} is of another model: model.layers.0.self_attn.k_proj." \
                      f"weight is [32, 64] there and [64, 64] in the policy {POLICY}; resume a checkpoint of this model"
    biases = {**shapes, "model.layers.0.self_attn.q_proj.bias": [64]}
    assert "the checkpoint has a parameter model.layers.0.self_attn.q_proj.bias and the policy" in \
        file_checks.checkpoint_problem(saved_with(tmp_path / "b", biases), False, str(POLICY), "rloo", deepspeed=False)
    grown = {**shapes, "model.embed_tokens.weight": [501, 64], "lm_head.weight": [501, 64]}
    tied = {name: shape for name, shape in shapes.items() if name != "lm_head.weight"}
    for index, saved in enumerate((grown, tied)):
        assert file_checks.checkpoint_problem(saved_with(tmp_path / str(index), saved), False, str(POLICY), "rloo",
                                              deepspeed=False) is None


def test_a_checkpoint_needs_the_deepspeed_shards_of_every_rank_that_saved_it(tmp_path: Path) -> None:
    checkpoint = saved_with(tmp_path, policy_shapes())
    assert "has no DeepSpeed state" in file_checks.checkpoint_problem(checkpoint, False, str(POLICY), "rloo", True)
    (checkpoint / "latest").write_text("global_step4")
    (checkpoint / "global_step4").mkdir()
    for rank in (0, 1):
        (checkpoint / "global_step4" / f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt").write_text("m")
    (checkpoint / "global_step4" / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt").write_text("o")
    assert file_checks.checkpoint_problem(checkpoint, False, str(POLICY), "rloo", True) == \
        f"{checkpoint / 'global_step4'} lacks the DeepSpeed optim shards of rank 1 (of 2); copy the whole " \
        "checkpoint, or pass an earlier one"
    (checkpoint / "global_step4" / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt").write_text("o")
    assert file_checks.checkpoint_problem(checkpoint, False, str(POLICY), "rloo", True) is None
    assert "was saved under DeepSpeed and this run does not use it" in \
        file_checks.checkpoint_problem(checkpoint, False, str(POLICY), "rloo", False)


def test_path_keeping_the_tools_is_accepted() -> None:
    assert file_checks.environment_problems({"PATH": "/opt/mine:" + os.environ["PATH"]}, "r.yaml:2", cuda=False) == []
    assert file_checks.environment_problems({"MASTER_PORT": "29500", "DS_ACCELERATOR": "cpu"}, "r.yaml:2", False) == []
