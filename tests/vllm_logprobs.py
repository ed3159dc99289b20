"""Run by tests/test_vllm_sync.py in its own process (vLLM's colocated engine takes the process's distributed
state): train a policy one step, sync it into a colocated vLLM with each bucket limit, and print as JSON how far
vLLM's greedy logprobs are from the policy's, before and after each sync, with and without LoRA (on the modules
named on the command line); then what the sync's self-check says of a good sync and of two broken ones.

    python tests/vllm_logprobs.py POLICY_DIR [LORA_TARGET ...]
"""

from __future__ import annotations

import json
import os
import sys

TOKENS = 8


def prompts(vocab: int) -> list[list[int]]:
    return [[(1 + 40 * row + step) % vocab for step in range(length)] for row, length in enumerate((5, 8, 3))]


def greedy_gap(llm, model) -> float:
    """Largest |vLLM logprob - policy logprob| over the greedy tokens vLLM generates for the prompts."""
    import torch
    from vllm import SamplingParams

    asked = prompts(model.config.vocab_size)
    outputs = llm.generate([{"prompt_token_ids": p} for p in asked],
                           SamplingParams(max_tokens=TOKENS, temperature=0, logprobs=0), use_tqdm=False)
    gap = 0.0
    model.eval()
    for prompt, output in zip(asked, outputs, strict=True):
        ids = list(output.outputs[0].token_ids)
        served = torch.tensor([step[token].logprob for step, token in zip(output.outputs[0].logprobs, ids, strict=True)])
        with torch.no_grad():
            logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1].float()
        own = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None])[:, 0]
        gap = max(gap, (served - own).abs().max().item())
    return gap


def train_one_step(model) -> None:
    """One AdamW step on the language-model loss of a prompt: the weights vLLM loaded are then stale."""
    import torch

    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.05)
    model.train()
    batch = torch.tensor([prompts(model.config.vocab_size)[1]])
    model(batch, labels=batch).loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def adapted(model, targets: list[str]):
    """`model` with LoRA on `targets`, its B matrices random (LoRA starts as a no-op), trained one step."""
    import torch
    from peft import LoraConfig, get_peft_model

    lora = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=targets))
    for name, param in lora.named_parameters():
        if "lora_B" in name or "lora_embedding_B" in name:
            torch.nn.init.normal_(param, std=0.5)
    train_one_step(lora)
    return lora


def self_check(model, llm) -> dict:
    """The self-check on a good sync, on a sync whose tied layers are not re-processed (the stale tied head), and
    on one that sends the final norm's weight as 3 w + 1."""
    from rlhf_cli.compat import vllm as vllm_compat
    from rlhf_cli.rank.engines.vllm.self_check import SyncCheck, SyncCheckFailed
    from rlhf_cli.generation.sync_buckets import PER_UNIT
    from rlhf_cli.rank.engines.sync import sync_weights
    from rlhf_cli.rank.engines.weights import SyncLimit
    from rlhf_cli.rank.engines.vllm.target import ColocatedVLLM

    found: dict = {"passed": sync_weights(model, ColocatedVLLM(llm, SyncCheck(1)), SyncLimit(PER_UNIT))}

    class StaleTiedHead(ColocatedVLLM):
        def load(self, weights):
            vllm_compat.vllm_model_runner(self.llm).reload_weights(weights_iterator=weights,
                                                                    is_checkpoint_format=True)

    norm = next(name for name, param in model.named_parameters()  # the final norm: it scales every logit
                if param.dim() == 1 and name.endswith("weight") and ("norm" in name or "ln_f" in name)
                and ".layers." not in name and ".h." not in name)

    class BrokenNorm(ColocatedVLLM):
        def load(self, weights):
            vllm_compat.vllm_reload_weights(self.llm, ((n, t * 3 + 1 if norm.endswith(n) else t) for n, t in weights))

    found["broken"] = norm
    for case, target in (("stale_tied_head", StaleTiedHead), ("broken_norm", BrokenNorm)):
        train_one_step(model)
        try:
            found[case] = sync_weights(model, target(llm, SyncCheck(1)), SyncLimit(PER_UNIT))
        except SyncCheckFailed as failed:
            found[case] = str(failed)
    return found


def main(policy: str, targets: list[str]) -> dict:
    import torch
    from transformers import AutoModelForCausalLM
    from vllm import LLM

    from rlhf_cli.generation.sync_buckets import PER_UNIT, WHOLE
    from rlhf_cli.rank.engines.sync import sync_weights
    from rlhf_cli.rank.engines.weights import SyncLimit
    from rlhf_cli.rank.engines.vllm.target import ColocatedVLLM

    torch.manual_seed(0)
    llm = LLM(model=policy, dtype="float32", max_model_len=64, enforce_eager=True, seed=0,
              distributed_executor_backend="external_launcher", max_num_batched_tokens=4096,
              logprobs_mode="processed_logprobs")
    model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32)
    train_one_step(model)
    result = {"tied": model.config.tie_word_embeddings, "stale": greedy_gap(llm, model), "synced": {}}
    one_layer = sum(p.numel() for p in model.get_decoder().layers[0].parameters()) \
        if hasattr(model.get_decoder(), "layers") else sum(p.numel() for p in model.get_decoder().h[0].parameters())
    for name, limit in (("whole", WHOLE), ("per_unit", PER_UNIT), ("one_layer", one_layer)):
        record = sync_weights(model, ColocatedVLLM(llm), SyncLimit(limit))  # a new target: a dense sync
        result["synced"][name] = {"gap": greedy_gap(llm, model), **record}
    result["check"] = self_check(model, llm)
    if targets:
        lora = adapted(model, targets)
        result["lora_stale"] = greedy_gap(llm, lora)
        record = sync_weights(lora, ColocatedVLLM(llm), SyncLimit(PER_UNIT))
        result["lora"] = {"gap": greedy_gap(llm, lora), **record}
        result["lora_still_unmerged"] = not any(getattr(m, "merged", False) for m in lora.modules())
    return result


if __name__ == "__main__":
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                        "VLLM_CPU_KVCACHE_SPACE": "1"}.items():
        os.environ.setdefault(name, value)
    print("RESULT " + json.dumps(main(sys.argv[1], sys.argv[2:])))
