"""Run by tests/test_vllm_sync.py in its own process (vLLM's colocated engine takes the process's distributed
state): a bf16 policy and a bf16 colocated vLLM, synced once (dense), trained a step with a small learning rate and
synced again (a shard-local delta); then the same weights sent whole into the same engine (a full sync), and a
sync of which one patch is lost; the same through a vLLM server's patch files; and the same with LoRA adapters
(only the adapted modules patched). Prints as JSON what each sync recorded, vLLM's logprob gap to the policy, the
engine's weight checksums after the delta and after the full sync, and the lost patch's error.

    python tests/vllm_delta.py POLICY_DIR
"""

from __future__ import annotations

import json
import os
import sys

from vllm_logprobs import greedy_gap, prompts


def train_one_step(model, lr: float) -> None:
    """One AdamW step on a bf16 policy: at a small `lr` few of its bf16 weights change."""
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    batch = torch.tensor([prompts(model.config.vocab_size)[1]])
    model.train()
    model(batch, labels=batch).loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def main(policy: str) -> dict:
    import torch
    from transformers import AutoModelForCausalLM
    from vllm import LLM

    from rlhf_cli.generation.sync_buckets import PER_UNIT
    from rlhf_cli.rank.engines.delta import SyncMismatch
    from rlhf_cli.rank.engines.sync import sync_weights
    from rlhf_cli.rank.engines.vllm.target import ColocatedVLLM
    from rlhf_cli.rank.engines.weights import SyncLimit

    torch.manual_seed(0)
    llm = LLM(model=policy, dtype="bfloat16", max_model_len=64, enforce_eager=True, seed=0,
              distributed_executor_backend="external_launcher", max_num_batched_tokens=4096,
              logprobs_mode="processed_logprobs")
    model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.bfloat16)
    target, limit = ColocatedVLLM(llm), SyncLimit(PER_UNIT)
    train_one_step(model, 1e-2)
    result = {"first": sync_weights(model, target, limit)}
    train_one_step(model, 1e-3)
    result["delta"] = {**sync_weights(model, target, limit), "gap": greedy_gap(llm, model)}
    after_delta = target.checksums()
    result["full"] = sync_weights(model, ColocatedVLLM(llm), limit)  # a new target: the same weights, whole
    result["checksums_equal"] = after_delta == target.checksums()
    result["checksums"] = len(after_delta)

    train_one_step(model, 1e-3)
    lossy = ColocatedVLLM(llm)
    sync_weights(model, lossy, limit)  # dense: its first
    train_one_step(model, 1e-3)
    patch = lossy.patch
    dropped = []

    def lose_one(patches):  # the down projection of the last layer never arrives
        kept = [p for p in patches if not (p.name.endswith("mlp.down_proj.weight") and ".1." in p.name)]
        dropped.extend(p.name for p in patches if p not in kept)
        patch(kept)

    lossy.patch = lose_one
    try:
        sync_weights(model, lossy, limit)
        result["lost"] = None
    except SyncMismatch as failed:
        result["lost"] = str(failed)
    result["dropped"] = dropped
    result["server"] = server_syncs(llm, model, limit)
    result["lora"] = lora_syncs(llm, model, limit)
    return result


class WorkerSession:
    """A vLLM server's endpoints as `rlhf vllm-serve` serves them (its worker extension), answered in this process
    on the colocated engine's worker, through JSON as over HTTP."""

    def __init__(self, llm) -> None:
        from rlhf_cli.compat.vllm import vllm_model_runner
        from rlhf_cli.rank.engines.vllm.worker_extension import ReloadWithTiedLayers

        self.llm, self.worker = llm, ReloadWithTiedLayers()
        self.worker.model_runner = vllm_model_runner(llm)

    def post(self, url: str, json: dict | None = None):
        from json import dumps, loads  # `json` is the request's body here, as in `requests`
        from types import SimpleNamespace

        if url.endswith("/reset_prefix_cache"):
            result = self.llm.reset_prefix_cache()
        elif url.endswith("/v1/unload_lora_adapter"):  # a server without vLLM's LoRA has no such route
            return SimpleNamespace(status_code=404, text="Not Found", content=b"Not Found", json=lambda: {})
        else:
            result = getattr(self.worker, json["method"])(**json.get("kwargs", {}))
        body = dumps({"results": [result]})
        return SimpleNamespace(status_code=200, text=body, content=body.encode(),
                               json=lambda: loads(body))


def server_syncs(llm, model, limit) -> dict:
    """The server target over its directory, into the same engine: dense, a step, a delta through patch files;
    its checksums then and after the same weights sent whole; then a delta of which one patch file is lost."""
    import tempfile
    from pathlib import Path
    from types import SimpleNamespace

    from rlhf_cli.rank.engines.delta import SyncMismatch
    from rlhf_cli.rank.engines.sync import sync_weights
    from rlhf_cli.rank.engines.vllm.server import ServerTarget, server_weight_version
    from rlhf_cli.rank.engines.vllm.target import ColocatedVLLM

    client = SimpleNamespace(base_url="http://in-process", session=WorkerSession(llm), model=str(model.name_or_path))
    everyone = SimpleNamespace(wait_for_everyone=lambda: None)
    target = ServerTarget(client, everyone, Path(tempfile.mkdtemp()) / "vllm-weights")
    result = {"first": sync_weights(model, target, limit)}
    train_one_step(model, 1e-3)
    result["delta"] = sync_weights(model, target, limit)
    result["version_kept"] = server_weight_version(client.base_url, client.session) == [target.version]
    result["patch_file"] = (target.weight_dir / "patches.safetensors").is_file()
    after_delta = target.checksums()
    sync_weights(model, ColocatedVLLM(llm), limit)
    result["checksums_equal"] = after_delta == target.checksums()
    train_one_step(model, 1e-3)
    apply = target.patch
    lost = "model.layers.0.mlp.down_proj.weight"
    target.patch = lambda patches: apply([patch for patch in patches if patch.name != lost])
    try:
        sync_weights(model, target, limit)
        result["lost"] = None
    except SyncMismatch as failed:
        result["lost"] = str(failed)
    result["version_after_lost"] = server_weight_version(client.base_url, client.session)
    return result


def lora_syncs(llm, model, limit) -> dict:
    """LoRA on the same engine: a dense first sync of the merged policy, a step of the adapters alone, a delta;
    then the same merged weights sent whole from a copy of the policy (outside ZeRO-3 a merge and unmerge round the
    base in place) into the same engine."""
    import copy

    from peft import LoraConfig, get_peft_model

    from rlhf_cli.rank.engines.sync import sync_weights
    from rlhf_cli.rank.engines.vllm.target import ColocatedVLLM

    adapted = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"]))
    target = ColocatedVLLM(llm)
    result = {"first": sync_weights(adapted, target, limit)}
    train_one_step(adapted, 1e-2)
    result["delta"] = sync_weights(adapted, target, limit)
    after_delta = target.checksums()
    result["full"] = sync_weights(copy.deepcopy(adapted), ColocatedVLLM(llm), limit)
    result["checksums_equal"] = after_delta == target.checksums()
    result["adapted_bytes"] = sum(param.numel() * 2 for name, param in adapted.named_parameters()
                                  if "base_layer.weight" in name)
    return result


if __name__ == "__main__":
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                        "VLLM_CPU_KVCACHE_SPACE": "1"}.items():
        os.environ.setdefault(name, value)
    print("RESULT " + json.dumps(main(sys.argv[1]), default=str))
