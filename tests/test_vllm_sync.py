"""The weight sync into a colocated vLLM (rlhf_cli/rank/engines/sync.py, weights.py, delta.py): how the gather
choice becomes buckets, the names vLLM loads, and, where vLLM is installed, that vLLM generates with the trained
policy's logprobs after a sync with every bucket size, LoRA merged a layer at a time, and that a delta sync leaves
vLLM with what a full sync does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import RECIPES, REPO, free_port, needs_vllm
from rlhf_cli.generation.budget import Budget
from rlhf_cli.generation.choice import Gather
from rlhf_cli.generation.sync_buckets import PER_UNIT, WHOLE, buckets
from rlhf_cli.models.dtype import training_dtype
from rlhf_cli.rank.engines.weights import SyncLimit
from rlhf_cli.rank.engines.weights import checkpoint_name as vllm_name


def test_buckets_pack_whole_units_in_order_within_the_limit() -> None:
    assert buckets([5, 5, 5, 5], WHOLE) == [[0, 1, 2, 3]]
    assert buckets([5, 5, 5, 5], PER_UNIT) == [[0], [1], [2], [3]]
    assert buckets([5, 5, 5, 5], 10) == [[0, 1], [2, 3]]
    assert buckets([5, 12, 3, 3], 10) == [[0], [1], [2, 3]]  # a unit over the limit is a bucket of its own
    assert buckets([], 10) == []


def test_the_gather_choice_is_the_bucket_limit() -> None:
    import torch

    model = torch.nn.Linear(10, 10)  # 110 float32 elements
    assert SyncLimit.of(Gather.whole, model).numel is WHOLE
    assert SyncLimit.of(Gather.shards, model).numel == PER_UNIT
    assert SyncLimit.of(Gather.of(Budget(fraction=0.5)), model).numel == 55
    assert SyncLimit.of(Gather.of(Budget(size=200)), model).numel == 50  # bytes over 4-byte elements
    assert SyncLimit.of(Gather.of(Budget(fraction=1)), model).numel is WHOLE
    assert SyncLimit.of(Gather.of(Budget(fraction=0)), model).numel == PER_UNIT


def test_the_self_check_is_due_after_the_first_two_syncs_every_wake_and_every_nth() -> None:
    """The first sync sends the starting weights vLLM already holds; the second, the first update's: a 3-step run
    with a broken sync is checked where it shows."""
    from rlhf_cli.rank.engines.vllm.self_check import SyncCheck

    every_tenth = SyncCheck(10)
    assert [sync for sync in range(1, 21) if every_tenth.due(woke=False)] == [1, 2, 10, 20]
    assert every_tenth.due(woke=True)  # the 21st: after a wake from sleep
    never = SyncCheck(0)
    assert not any(never.due(woke=True) for _ in range(3))


def test_vllm_names_are_checkpoint_names() -> None:
    assert vllm_name("model.layers.0.self_attn.q_proj.weight") == "model.layers.0.self_attn.q_proj.weight"
    assert vllm_name("base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight") == \
        "model.layers.0.self_attn.q_proj.weight"
    assert vllm_name("base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight") is None
    assert vllm_name("model.layers.1._checkpoint_wrapped_module.mlp.up_proj.weight") == \
        "model.layers.1.mlp.up_proj.weight"
    assert vllm_name("base_model.model.lm_head.modules_to_save.default.weight") == "lm_head.weight"
    assert vllm_name("base_model.model.lm_head.original_module.weight") is None


def test_vllm_holds_the_policy_in_the_dtype_it_trains_in(tmp_path: Path) -> None:
    # vLLM would downcast float32 to bfloat16: the 0.02-0.04 logprob gap TRL reports on CPU
    saved, old, bare = tmp_path / "saved", tmp_path / "old", tmp_path / "bare"
    for directory, config in ((saved, {"dtype": "float32"}), (old, {"torch_dtype": "bfloat16"}), (bare, {})):
        directory.mkdir()
        (directory / "config.json").write_text(json.dumps(config))
    assert training_dtype(False, False, None, saved) == "float32"
    assert training_dtype(False, False, "auto", saved) == "float32"
    assert training_dtype(False, False, None, old) == "bfloat16"  # transformers 4's key
    assert training_dtype(False, False, None, bare) == "float32"
    assert training_dtype(False, False, None, tmp_path / "missing") == "float32"
    assert training_dtype(True, False, None, saved) == "bfloat16"
    assert training_dtype(False, True, "float32", bare) == "float16"
    assert training_dtype(False, False, "bfloat16", saved) == "bfloat16"


def _synced(policy: Path, lora_targets: list[str]) -> dict:
    """tests/vllm_logprobs.py on `policy` in a process of its own: vLLM's logprob gaps and the sync's records."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "MASTER_PORT": str(free_port())}
    done = subprocess.run([sys.executable, str(Path(__file__).with_name("vllm_logprobs.py")), str(policy),
                           *lora_targets], capture_output=True, text=True, timeout=540, env=env)
    line = next((line for line in done.stdout.splitlines() if line.startswith("RESULT ")), None)
    assert done.returncode == 0 and line, done.stdout[-3000:] + done.stderr[-6000:]
    return json.loads(line[len("RESULT "):])


def _assert_faithful(result: dict, separate_tied_head: bool = False, reprocess_needed: bool = False) -> None:
    """vLLM serves the trained policy after every sync (LoRA merged a layer at a time, on the head and the embedding
    too); the self-check passes on it and stops a sync that sends a wrong norm, or that leaves stale a tied head
    vLLM holds as a layer of its own (`separate_tied_head`). `reprocess_needed`: a model whose vLLM scores with
    its embedding (Gemma) still drifts without the re-processing, by less than the self-check stops at (0.009
    measured), so the sync's re-processing is what serves it faithfully."""
    assert result["stale"] > 1e-2  # before the sync vLLM still serves the checkpoint: the check can fail
    for name, synced in result["synced"].items():
        assert synced["gap"] < 1e-3 and synced["merged_lora_layers"] == 0, (name, synced)
    assert result["synced"]["whole"]["buckets"] == 1
    check = result["check"]
    assert check["passed"]["check_logp_difference"] < 1e-3, check
    if separate_tied_head:
        assert "differs most in the LM head" in check["stale_tied_head"] and "tied to the embedding" in \
            check["stale_tied_head"], check
    elif reprocess_needed:
        assert check["stale_tied_head"]["check_logp_difference"] > 10 * check["passed"]["check_logp_difference"], check
    else:  # no layer shares a reloaded weight: the reload alone serves the policy
        assert check["stale_tied_head"]["check_logp_difference"] < 1e-3, check
    assert "vLLM's logprobs differ from the policy's" in check["broken_norm"], check
    assert f"differs most in {check['broken']} " in check["broken_norm"] and "\n" not in check["broken_norm"]
    assert result["lora_stale"] > 1e-2 and result["lora"]["gap"] < 1e-3, result
    assert result["lora_still_unmerged"]


@needs_vllm
def test_vllm_generates_with_the_trained_policys_logprobs_after_each_sync() -> None:
    result = _synced(RECIPES / "smoke" / "policy", ["q_proj", "v_proj", "up_proj", "lm_head", "embed_tokens"])
    _assert_faithful(result)
    full = result["synced"]["whole"]["full_bytes"]
    assert result["synced"]["per_unit"]["buckets"] == 5  # 2 decoder layers, embedding, final norm, LM head
    assert result["synced"]["one_layer"]["buckets"] == 4  # a layer, a layer, the embedding + the norm, the head
    # q_proj, v_proj, up_proj of 2 layers, and the LM head and the embedding (each a unit of its own, with its LoRA)
    assert result["lora"]["merged_lora_layers"] == 8 and result["lora"]["buckets"] == 5
    # Single process, nothing partitioned: the whole policy is always present (ZeRO-3's peaks: the launched runs).
    assert result["lora"]["peak_bytes"] >= full


@pytest.mark.parametrize("family", ["granite", "gemma"])
def test_the_probe_scores_with_the_models_own_logits(family: str, tmp_path: Path) -> None:
    """The self-check's probe reads the LM head as TRL's fused head does, with the multiplier the model's forward
    applies after it (Granite divides by `logits_scaling`: 8): its logits are the model's own."""
    import torch
    from families.build import build_family
    from transformers import AutoModelForCausalLM

    from rlhf_cli.rank.engines.vllm.self_check import _logits, probe_prompts

    model = AutoModelForCausalLM.from_pretrained(build_family(family, tmp_path / family)).eval()
    ids = torch.tensor(probe_prompts(model.config.vocab_size))
    with torch.no_grad():
        own, probed = model(ids).logits, _logits(model, ids)
    assert probed.shape == own.shape and torch.allclose(probed, own, atol=1e-5), (probed - own).abs().max()


def test_the_logit_multiplier_is_read_as_trl_reads_it() -> None:
    from types import SimpleNamespace as Config

    from rlhf_cli.rank.engines.vllm.self_check import logit_multiplier

    assert logit_multiplier(Config(model_type="granite", logits_scaling=8.0)) == 1 / 8
    assert logit_multiplier(Config(model_type="hyperclovax", logits_scaling=8.0)) == 8.0
    assert logit_multiplier(Config(model_type="cohere", logit_scale=0.0625, logits_scaling=8.0)) == 0.0625
    assert logit_multiplier(Config(model_type="falcon_h1", lm_head_multiplier=0.5)) == 0.5
    assert logit_multiplier(Config(model_type="x", output_multiplier=2.0)) == 2.0
    assert logit_multiplier(Config(model_type="mpt", logit_scale=None)) == 1.0
    assert logit_multiplier(Config(model_type="x", logit_scale=0.0)) == 0.0  # a real 0 is kept, as TRL keeps it


# LoRA on attention and MLP everywhere; on the LM head and the embedding where they are not tied (a tied model
# refuses them before launch: rlhf_cli/config/lora.py).
FAMILY_LORA = {
    "llama3": ["k_proj", "o_proj", "gate_proj", "lm_head", "embed_tokens"],  # untied, GQA
    "qwen2.5": ["q_proj", "v_proj", "down_proj"],  # tied, q/k/v biases, one KV head
    "gpt2": ["c_attn", "c_fc"],  # Conv1D, tied, learned positions
    "pythia": ["query_key_value", "dense_4h_to_h", "embed_out", "embed_in"],  # fused QKV, untied, partial rotary
    "mistral": ["q_proj", "up_proj", "lm_head"],  # sliding window
    "gemma": ["q_proj", "down_proj"],  # scaled embedding, tied, one KV head
    "granite": ["k_proj", "up_proj"],  # embedding, attention, residual and logits multipliers, tied
}


@needs_vllm
@pytest.mark.parametrize("family", list(FAMILY_LORA))
def test_every_family_is_served_as_trained(family: str, tmp_path: Path) -> None:
    from families.build import build_family

    result = _synced(build_family(family, tmp_path / family, vllm=True), FAMILY_LORA[family])
    _assert_faithful(result, separate_tied_head=family in ("qwen2.5", "gpt2"),
                     reprocess_needed=family in ("gemma", "granite"))
    assert result["tied"] == (family in ("qwen2.5", "gpt2", "gemma", "granite"))



@needs_vllm
def test_a_delta_sync_sends_what_changed_and_a_lost_patch_stops_the_sync() -> None:
    """bf16 policy and vLLM: the first sync is dense, the next sends only changed elements (fewer bytes than
    dense), after which vLLM holds bit for bit what a full sync sends and serves the policy's logprobs; a lost
    patch is named."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(Path(__file__).parent),
                                                        os.environ.get("PYTHONPATH", "")]),
           "MASTER_PORT": str(free_port())}
    done = subprocess.run([sys.executable, str(Path(__file__).with_name("vllm_delta.py")),
                           str(RECIPES / "smoke" / "policy")], capture_output=True, text=True, timeout=540, env=env)
    line = next((line for line in done.stdout.splitlines() if line.startswith("RESULT ")), None)
    assert done.returncode == 0 and line, done.stdout[-3000:] + done.stderr[-6000:]
    result = json.loads(line[len("RESULT "):])
    first, delta = result["first"], result["delta"]
    assert first["mode"] == "dense" and first["dense_reason"].startswith("first sync")
    assert first["bytes_sent"] == first["dense_bytes"] == 146240 * 2  # the smoke policy in bf16
    assert delta["mode"] == "sparse" and 0 < delta["changed_share"] < 1
    assert 0 < delta["bytes_sent"] < delta["dense_bytes"], delta
    assert delta["groups_verified"] == first["groups_verified"] > 0
    assert delta["gap"] < 0.05  # bf16 kernels: vLLM's and the policy's logprobs agree to bf16's precision
    assert result["checksums_equal"] and result["checksums"] > 0  # the delta left what a full sync leaves
    assert result["dropped"] == ["model.layers.1.mlp.down_proj.weight"]
    assert result["lost"].startswith("after weight sync 2, the generator's model.layers.1.mlp.down_proj.weight "
                                     "differs from the policy's") and "\n" not in result["lost"]
    assert "or with --vllm server or without --vllm," in result["lost"]  # the other generator than the one that failed
    server = result["server"]  # the server's transport: patch files applied by its worker, checked by checksums
    assert server["first"]["mode"] == "dense" and server["first"]["groups_verified"] == first["groups_verified"]
    assert server["delta"]["mode"] == "sparse" and 0 < server["delta"]["bytes_sent"] < server["delta"]["dense_bytes"]
    assert server["delta"]["groups_verified"] == first["groups_verified"] and server["patch_file"], server
    assert server["version_kept"] and server["checksums_equal"]
    assert server["lost"].startswith("after weight sync 3, the generator's model.layers.0.mlp.down_proj.weight "
                                     "differs"), server
    assert "or with --vllm colocate or without --vllm," in server["lost"]
    assert server["version_after_lost"] == [None]  # a broken sync leaves no run's version: no generation from it
    lora = result["lora"]  # the adapters trained a step: only q, v and up of each layer are patched
    assert lora["first"]["mode"] == "dense" and lora["delta"]["mode"] == "sparse", lora
    assert {name.rsplit(".", 2)[-2] for name in lora["delta"]["patched"]} == {"q_proj", "v_proj", "up_proj"}
    assert 0 < lora["delta"]["bytes_sent"] <= lora["adapted_bytes"] < lora["delta"]["dense_bytes"] / 2, lora
    assert lora["delta"]["groups_verified"] == lora["first"]["groups_verified"] > 0
    assert lora["checksums_equal"]  # vLLM holds, bit for bit, what a full merged sync sends
