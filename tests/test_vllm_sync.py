"""The weight sync into a colocated vLLM (rlhf_cli/rank/vllm/sync.py): how the gather choice becomes buckets, the
names vLLM loads, and, where vLLM is installed, that vLLM generates with the trained policy's logprobs after a
sync with every bucket size, LoRA merged a layer at a time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import RECIPES, REPO, free_port, needs_vllm
from rlhf_cli.generation.budget import Budget
from rlhf_cli.rank.vllm.sync import PER_UNIT, WHOLE, SyncLimit, buckets, training_dtype, vllm_name



def test_buckets_pack_whole_units_in_order_within_the_limit() -> None:
    assert buckets([5, 5, 5, 5], WHOLE) == [[0, 1, 2, 3]]
    assert buckets([5, 5, 5, 5], PER_UNIT) == [[0], [1], [2], [3]]
    assert buckets([5, 5, 5, 5], 10) == [[0, 1], [2, 3]]
    assert buckets([5, 12, 3, 3], 10) == [[0], [1], [2, 3]]  # a unit over the limit is a bucket of its own
    assert buckets([], 10) == []


def test_the_gather_choice_is_the_bucket_limit() -> None:
    import torch

    model = torch.nn.Linear(10, 10)  # 110 float32 elements
    assert SyncLimit.of(True, None, model).numel is WHOLE
    assert SyncLimit.of(False, None, model).numel == PER_UNIT
    assert SyncLimit.of(False, Budget(fraction=0.5), model).numel == 55
    assert SyncLimit.of(False, Budget(size=200), model).numel == 50  # bytes over 4-byte elements
    assert SyncLimit.of(True, Budget(fraction=1), model).numel is WHOLE
    assert SyncLimit.of(False, Budget(fraction=0), model).numel == PER_UNIT


def test_vllm_names_are_checkpoint_names() -> None:
    assert vllm_name("model.layers.0.self_attn.q_proj.weight") == "model.layers.0.self_attn.q_proj.weight"
    assert vllm_name("base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight") == \
        "model.layers.0.self_attn.q_proj.weight"
    assert vllm_name("base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight") is None
    assert vllm_name("model.layers.1._checkpoint_wrapped_module.mlp.up_proj.weight") == \
        "model.layers.1.mlp.up_proj.weight"
    assert vllm_name("base_model.model.lm_head.modules_to_save.default.weight") == "lm_head.weight"
    assert vllm_name("base_model.model.lm_head.original_module.weight") is None


def test_vllm_holds_the_policy_in_the_dtype_it_trains_in() -> None:
    # vLLM would downcast float32 to bfloat16: the 0.02-0.04 logprob gap TRL reports on CPU
    assert training_dtype(False, False, None, "float32") == "float32"
    assert training_dtype(False, False, "auto", "float32") == "float32"
    assert training_dtype(False, False, None, None) == "float32"
    assert training_dtype(True, False, None, "float32") == "bfloat16"
    assert training_dtype(False, True, "float32", None) == "float16"
    assert training_dtype(False, False, "bfloat16", "float32") == "bfloat16"


@needs_vllm
def test_vllm_generates_with_the_trained_policys_logprobs_after_each_sync() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "MASTER_PORT": str(free_port())}
    done = subprocess.run([sys.executable, str(Path(__file__).with_name("vllm_logprobs.py")),
                           str(RECIPES / "smoke" / "policy")], capture_output=True, text=True, timeout=540, env=env)
    line = next((line for line in done.stdout.splitlines() if line.startswith("RESULT ")), None)
    assert done.returncode == 0 and line, done.stdout[-3000:] + done.stderr[-6000:]
    result = json.loads(line[len("RESULT "):])
    assert result["stale"] > 1e-2  # before the sync vLLM still serves the checkpoint: the check can fail
    full = result["synced"]["whole"]["full_bytes"]
    for name, synced in result["synced"].items():
        assert synced["gap"] < 1e-3 and synced["merged_lora_layers"] == 0, (name, synced)
    assert result["synced"]["whole"]["buckets"] == 1
    assert result["synced"]["per_unit"]["buckets"] == 5  # 2 decoder layers, embedding, final norm, LM head
    assert result["synced"]["one_layer"]["buckets"] == 4  # a layer, a layer, the embedding + the norm, the head
    assert result["lora_stale"] > 1e-2 and result["lora"]["gap"] < 1e-3, result
    assert result["lora_still_unmerged"] and result["lora"]["merged_lora_layers"] == 4  # q_proj, v_proj of 2 layers
    # Single process, nothing partitioned: the whole policy is always present (ZeRO-3's peaks: the launched runs).
    assert result["lora"]["peak_bytes"] >= full
