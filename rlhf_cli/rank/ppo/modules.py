"""The modules PPO trains and scores with, and how it generates: the policy and value model as one module for
DeepSpeed, the reward model's score, dropout off, a generation config that is the sampling distribution."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn as nn
from peft import PeftModel
from transformers import GenerationConfig

from rlhf_cli.rank.ppo import core


class PolicyAndValue(nn.Module):
    """One module for DeepSpeed to shard and optimise: the policy and the value model."""

    def __init__(self, policy: nn.Module, value_model: nn.Module) -> None:
        super().__init__()
        self.policy = policy
        self.value_model = value_model
        self.config = policy.config  # DeepSpeed sizes its buckets from this

    # TRL's generation context turns checkpointing off and on again by these names.
    @property
    def generating_model(self) -> nn.Module:
        """What generates (rlhf_cli/rank/zero3.py): a gather budget is spent on the policy, not the value model."""
        return self.policy

    @property
    def is_gradient_checkpointing(self) -> bool:
        return self.policy.is_activation_checkpointing

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict[str, Any] | None = None) -> None:
        for model in (self.policy, self.value_model):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=gradient_checkpointing_kwargs)

    def gradient_checkpointing_disable(self) -> None:
        for model in (self.policy, self.value_model):
            model.activation_checkpointing_disable()

    def forward(self, **kwargs: Any) -> tuple[Any, torch.Tensor]:
        value_model = _transformers_model(self.value_model)
        backbone = getattr(value_model, value_model.base_model_prefix)
        hidden = backbone(**kwargs).last_hidden_state
        return self.policy(**kwargs), value_model.score(hidden)


def _transformers_model(model: nn.Module) -> nn.Module:
    """The transformers model itself: under LoRA, the one inside PEFT's wrapper (its adapters in place)."""
    return model.get_base_model() if isinstance(model, PeftModel) else model


def rollout_generation_config(max_new_tokens: int, temperature: float, pad_token_id: int,
                              stop_token_id: int | None) -> GenerationConfig:
    """Samples of softmax(logits / temperature), the distribution old log-probs are computed from: no top-k,
    top-p or repetition penalty; stop at the stop token, or run to `max_new_tokens` without one."""
    return GenerationConfig(max_new_tokens=max_new_tokens, do_sample=True, temperature=temperature + 1e-7, top_k=0,
                            top_p=1.0, repetition_penalty=1.0, pad_token_id=pad_token_id, eos_token_id=stop_token_id)


@contextlib.contextmanager
def only_this_generation_config(model: nn.Module, config: GenerationConfig) -> Iterator[None]:
    """transformers 5 fills every field a passed config leaves unset from the checkpoint's
    generation_config.json (its EOS ids, a repetition penalty, ...); with `config` as the model's own for
    the call, nothing of the checkpoint's is left to fill from."""
    own = model.generation_config
    model.generation_config = config
    try:
        yield
    finally:
        model.generation_config = own


def model_inputs(query_responses: torch.Tensor, pad_token_id: int) -> dict[str, torch.Tensor]:
    """Forward inputs for left-padded prompts followed by right-padded responses."""
    attention_mask = query_responses != pad_token_id
    position_ids = attention_mask.cumsum(1) - attention_mask.long()
    return {"input_ids": torch.masked_fill(query_responses, ~attention_mask, 0), "attention_mask": attention_mask,
            "position_ids": position_ids, "use_cache": False}


def sequence_scores(reward_model: nn.Module, query_responses: torch.Tensor, pad_token_id: int,
                    context_length: int) -> torch.Tensor:
    """The reward model's score at the last real token of each response."""
    backbone = getattr(reward_model, reward_model.base_model_prefix)
    hidden = backbone(**model_inputs(query_responses, pad_token_id)).last_hidden_state
    logits = reward_model.score(hidden).squeeze(-1)
    last = core.first_true_indices(query_responses[:, context_length:] == pad_token_id) - 1 + context_length
    return logits[torch.arange(logits.size(0), device=logits.device), last]


def disable_dropout(model: nn.Module) -> None:
    """Dropout off for good, as TRL did: the log-probs of an update must be those its rollouts were sampled
    with. Dropout layers (GPT-2's are 0.1), and the attention dropout Llama-style models read from a float."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0
