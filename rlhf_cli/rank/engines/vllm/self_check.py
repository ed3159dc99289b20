"""The weight sync checks itself: vLLM's logprobs against the policy's on a fixed probe, after the first sync, after
every wake from sleep and every `vllm_sync_check_steps` syncs.

A sync can succeed and leave vLLM generating from other weights than the policy's (a tied LM head vLLM kept
stale, an adapter no bucket merged); nothing fails, the run samples from the wrong policy and TRL's importance
ratios quietly zero the loss. The probe is a few prompts of fixed token ids: vLLM continues each greedily and the
policy scores the same tokens in one forward (every rank runs it: under ZeRO-3 the forward is a collective).
Above the tolerance the run stops with one line that names the part of vLLM's model that differs most
(`diagnose`: vLLM's LM head on the policy's own last hidden states, then every weight vLLM keeps readable) and
what to do.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from rlhf_cli.compat import vllm as vllm_compat
from rlhf_cli.generation.sync_check import PROBE_PROMPT_TOKENS, PROBE_PROMPTS, PROBE_TOKENS, checked
from rlhf_cli.rank.engines.weights import checkpoint_names, gathered

# Mean |vLLM logprob - policy logprob| over the probe's tokens above which the sync is broken: a float32 sync is
# exact to ~1e-5 on CPU; half precision kernels differ by ~1e-2 (TRL's own bf16 runs log 0.01-0.05).
TOLERANCE = {"float32": 1e-2, "bfloat16": 1e-1, "float16": 1e-1}


class SyncCheckFailed(RuntimeError):
    """vLLM generates from other weights than the policy's after a sync."""


def probe_prompts(vocab_size: int) -> list[list[int]]:
    """Fixed prompts of token ids spread over the vocabulary (the same on every rank and every run)."""
    return [[(7 + prompt * 131 + token * 37) % vocab_size for token in range(PROBE_PROMPT_TOKENS)]
            for prompt in range(PROBE_PROMPTS)]


class SyncCheck:
    """When to check (`due`) and the check itself (`run`), for one rank's syncs."""

    def __init__(self, every: int) -> None:
        self.every = every  # 0: never
        self.syncs = 0

    def due(self, woke: bool) -> bool:
        """Whether the sync just done is checked (rlhf_cli/generation/sync_check.checked)."""
        self.syncs += 1
        return checked(self.syncs, self.every, woke)

    def run(self, model: Any, llm: Any, woke: bool = False) -> dict[str, float]:
        """The probe's logprob differences (mean and max over its tokens); SyncCheckFailed above the tolerance.
        A vLLM woken for the sync has its weights back, not yet its KV cache (TRL wakes it next, a no-op after)."""
        if woke:
            llm.wake_up(tags=["kv_cache"])
        difference = probe_difference(model, llm)
        tolerance = TOLERANCE.get(str(next(model.parameters()).dtype).removeprefix("torch."), TOLERANCE["bfloat16"])
        if difference["mean"] > tolerance:
            raise SyncCheckFailed(failure_line(difference, tolerance, self.syncs, diagnose(model, llm)))
        return difference


def failure_line(difference: dict[str, float], tolerance: float, sync: int, culprit: str) -> str:
    return (f"after weight sync {sync}, vLLM's logprobs differ from the policy's by {difference['mean']:.3g} nats a "
            f"token on the probe (max {difference['max']:.3g}, tolerance {tolerance:g}): vLLM generates from other "
            f"weights; it differs most in {culprit}. Run with --vllm server or without --vllm until the sync of this "
            "model is fixed, and report it with the model's config.json")


def probe_difference(model: Any, llm: Any) -> dict[str, float]:
    """vLLM's greedy continuations of the probe, scored by vLLM and by `model`: mean and max |difference|. An engine
    serving the policy's LoRA generates with it (rlhf_cli/rank/engines/vllm/adapters.py wraps its `generate`)."""
    import torch
    from vllm import SamplingParams

    prompts = probe_prompts(_config(model).vocab_size)
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompts],
                           SamplingParams(max_tokens=PROBE_TOKENS, temperature=0, logprobs=0), use_tqdm=False)
    differences = []
    for prompt, output in zip(prompts, outputs, strict=True):
        completion = output.outputs[0]
        ids = list(completion.token_ids)
        served = torch.tensor([step[token].logprob for step, token in zip(completion.logprobs, ids, strict=True)])
        own = policy_logprobs(model, prompt, ids)
        differences.append((served - own).abs())
    every = torch.cat(differences)
    return {"mean": every.mean().item(), "max": every.max().item()}


def policy_logprobs(model: Any, prompt: list[int], completion: list[int]) -> Any:
    """The policy's log-probabilities of `completion` after `prompt` (float32, dropout off)."""
    import torch

    device = next(model.parameters()).device
    with torch.no_grad(), _evaluating(model):
        logits = _logits(model, torch.tensor([prompt + completion], device=device))[0, len(prompt) - 1:-1].float()
    ids = torch.tensor(completion, device=device)[:, None]
    return torch.log_softmax(logits, -1).gather(-1, ids)[:, 0].cpu()


def _logits(model: Any, ids: Any) -> Any:
    """The policy's logits as TRL's fused LM head computes them in training: the backbone's forward, then the head's
    weights read directly (gathered here) rather than through the head module. ZeRO-3 prefetches by the order of
    the modules the last forward ran: a probe that ran the head module would have it prefetched during training,
    where TRL then finds it gathered, does not gather it itself, and its gradient meets an empty shard
    (open-r1#692: "size of tensor a (0) must match ... at non-singleton dimension 1")."""
    import torch

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    base = base.module if hasattr(base, "module") and not hasattr(base, "config") else base
    hidden = base.base_model(input_ids=ids, use_cache=False).last_hidden_state
    head = base.get_output_embeddings()
    with gathered(list(head.parameters())):
        logits = head.forward(hidden)  # the module's own hooks bypassed, as TRL's fused head does
    config = base.config.get_text_config() if hasattr(base.config, "get_text_config") else base.config
    logits = logits * logit_multiplier(config)
    cap = getattr(config, "final_logit_softcapping", None)
    return torch.tanh(logits / cap) * cap if cap else logits


def logit_multiplier(config: Any) -> float:
    """What the model's own forward multiplies the LM head's output by before any softcap, read from its text
    config as TRL 1.16's fused LM head reads it (trl/trainer/utils.py `add_fused_lm_head`): Cohere's `logit_scale`,
    Muse Glimmer's `output_multiplier`, Falcon-H1's `lm_head_multiplier`, and `logits_scaling`, which Granite and
    MiniCPM3 divide by and HyperCLOVA X multiplies by. None is unscaled; a real 0.0 is kept."""
    for name in ("logit_scale", "output_multiplier", "lm_head_multiplier"):
        if getattr(config, name, None) is not None:
            return getattr(config, name)
    scaling = getattr(config, "logits_scaling", None)
    if scaling is None:
        return 1.0
    return scaling if getattr(config, "model_type", None) == "hyperclovax" else 1 / scaling


@contextlib.contextmanager
def _evaluating(model: Any) -> Iterator[None]:
    """`model` in eval mode for the block (GPT-2's dropout would make the policy's side random)."""
    training = {module: module.training for module in model.modules()}
    model.eval()
    try:
        yield
    finally:
        for module, mode in training.items():
            module.train(mode)


def diagnose(model: Any, llm: Any) -> str:
    """The part of vLLM's model that differs most from the policy: its LM head applied to the policy's own last
    hidden states, else the weight (of those vLLM keeps readable: embeddings, norms, biases; on GPU every one)
    furthest from the policy's. Colocated engines only (the model lives in this process)."""
    head = head_difference(model, llm)
    weights = weight_differences(model, vllm_compat.vllm_model(llm))
    name, worst = max(weights.items(), key=lambda item: item[1], default=("", 0.0))
    if head > 1e-3 and head >= worst:
        return (f"the LM head ({head:.3g} nats from the policy's on its own last hidden states"
                f"{', tied to the embedding' if _config(model).tie_word_embeddings else ''})")
    if worst > 0:
        return f"{name} (max |difference| {worst:.3g})"
    return "a decoder layer's packed weights (no weight vLLM keeps readable differs, nor its LM head)"


def head_difference(model: Any, llm: Any) -> float:
    """Max |log-softmax difference| between the policy's logits on the probe and vLLM's LM head applied to the
    policy's last hidden states."""
    import torch

    engine = vllm_compat.vllm_model(llm)
    ids = torch.tensor(probe_prompts(_config(model).vocab_size), device=next(model.parameters()).device)
    with torch.no_grad(), _evaluating(model):
        out = model(ids, output_hidden_states=True)
        hidden = out.hidden_states[-1].reshape(-1, out.hidden_states[-1].shape[-1])
        served = engine.compute_logits(hidden.to(next(engine.parameters()).dtype))
    own = out.logits.reshape(-1, out.logits.shape[-1]).float()
    served = served[:, :own.shape[-1]].float().to(own.device)
    return (torch.log_softmax(served, -1) - torch.log_softmax(own, -1)).abs().max().item()


def weight_differences(model: Any, engine: Any) -> dict[str, float]:
    """Max |difference| of every vLLM weight that is readable under the policy's checkpoint name, by that name."""
    held = {name: param for name, param in engine.named_parameters() if param.numel() > 0}
    named = checkpoint_names(model)
    found: dict[str, float] = {}
    for name, param in model.named_parameters():
        served = held.get(named(name) or "")
        if served is None:
            continue
        with gathered([param]):
            own = param.data.detach().float().cpu()
        if served.dim() == own.dim() and all(s >= o for s, o in zip(served.shape, own.shape, strict=True)):
            part = served.detach()[tuple(slice(0, size) for size in own.shape)].float().cpu()
            found[named(name)] = (part - own).abs().max().item()
    return found


def _config(model: Any) -> Any:
    return model.config if hasattr(model, "config") else model.module.config
