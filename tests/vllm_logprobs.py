"""Run by tests/test_vllm_sync.py in its own process (vLLM's colocated engine takes the process's distributed
state): train the smoke policy one step, sync it into a colocated vLLM with each bucket limit, and print as JSON
how far vLLM's greedy logprobs are from the policy's, before and after each sync, with and without LoRA."""

from __future__ import annotations

import json
import os
import sys

PROMPTS = [[1, 40, 41, 42, 43], [1, 60, 61, 62, 63, 64, 65, 66], [1, 100, 7]]
TOKENS = 8


def greedy_gap(llm, model) -> float:
    """Largest |vLLM logprob - policy logprob| over the greedy tokens vLLM generates for PROMPTS."""
    import torch
    from vllm import SamplingParams

    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS],
                           SamplingParams(max_tokens=TOKENS, temperature=0, logprobs=0), use_tqdm=False)
    gap = 0.0
    for prompt, output in zip(PROMPTS, outputs):
        ids = list(output.outputs[0].token_ids)
        served = torch.tensor([step[token].logprob for step, token in zip(output.outputs[0].logprobs, ids)])
        with torch.no_grad():
            logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1].float()
        own = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None])[:, 0]
        gap = max(gap, (served - own).abs().max().item())
    return gap


def train_one_step(model) -> None:
    """One AdamW step on the language-model loss of the prompts: the weights vLLM loaded are then stale."""
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    batch = torch.tensor([PROMPTS[1]])
    model(batch, labels=batch).loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def main(policy: str) -> dict:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    from vllm import LLM

    from rlhf_cli.rank.vllm.sync import PER_UNIT, WHOLE, SyncLimit, sync_weights

    torch.manual_seed(0)
    llm = LLM(model=policy, dtype="float32", max_model_len=64, enforce_eager=True, seed=0,
              distributed_executor_backend="external_launcher", max_num_batched_tokens=4096,
              logprobs_mode="processed_logprobs")
    model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32)
    train_one_step(model)
    result = {"stale": greedy_gap(llm, model), "synced": {}}
    one_layer = sum(p.numel() for p in model.model.layers[0].parameters())
    for name, limit in (("whole", WHOLE), ("per_unit", PER_UNIT), ("one_layer", one_layer)):
        record = sync_weights(model, llm, SyncLimit(limit))
        result["synced"][name] = {"gap": greedy_gap(llm, model), **record}
    lora = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    for module in lora.modules():  # LoRA starts as a no-op (B = 0): give it weights that change the outputs
        if hasattr(module, "lora_B") and "default" in getattr(module, "lora_B", {}):
            torch.nn.init.normal_(module.lora_B["default"].weight, std=0.5)
    result["lora_stale"] = greedy_gap(llm, lora)
    record = sync_weights(lora, llm, SyncLimit(PER_UNIT))
    result["lora"] = {"gap": greedy_gap(llm, lora), **record}
    result["lora_still_unmerged"] = not any(getattr(m, "merged", False) for m in lora.modules())
    return result


if __name__ == "__main__":
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                        "VLLM_CPU_KVCACHE_SPACE": "1"}.items():
        os.environ.setdefault(name, value)
    print("RESULT " + json.dumps(main(sys.argv[1])))
