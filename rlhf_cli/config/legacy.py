"""Names that TRL 0.x-era scripts and recipes used, and what they are called today.

A renamed key is accepted with a one-line note; a key with no counterpart is refused with
an error that says what to use instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Legacy:
    renamed_to: dict[str, str] = field(default_factory=dict)  # algorithm -> today's key
    instead: str = ""  # what to do when the algorithm has no counterpart


_ALL = ("rloo", "online_dpo", "ppo")

LEGACY_KEYS: dict[str, Legacy] = {
    "sft_model_path": Legacy(dict.fromkeys(_ALL, "model_name_or_path")),
    "reward_model_path": Legacy(dict.fromkeys(_ALL, "reward_model_name_or_path")),
    "rloo_k": Legacy({"rloo": "num_generations"}),
    "response_length": Legacy({"rloo": "max_completion_length", "online_dpo": "max_new_tokens"}),
    "num_sample_generations": Legacy(instead="remove it"),
    "kl_coef": Legacy({"rloo": "beta", "online_dpo": "beta"}),
    "num_ppo_epochs": Legacy({"rloo": "num_iterations"}),
    "cliprange": Legacy({"rloo": "epsilon"}),
    "normalize_advantage": Legacy({"rloo": "normalize_advantages"}),
    "exp_name": Legacy(dict.fromkeys(_ALL, "run_name")),
    "total_episodes": Legacy(instead="set `max_steps` (one step consumes per_device_train_batch_size x "
                             "gradient_accumulation_steps x processes completions)"),
    "num_mini_batches": Legacy(instead="set `steps_per_generation` (RLOO) or remove it"),
    "local_rollout_forward_batch_size": Legacy(instead="remove it; today's trainers size these forward passes "
                                               "from per_device_train_batch_size"),
    "stop_token": Legacy(instead="set `generation_kwargs: {eos_token_id: ID}` or remove it"),
    "stop_token_id": Legacy(instead="set `generation_kwargs: {eos_token_id: ID}`"),
    "missing_eos_penalty": Legacy(instead="remove it (RLOO has none in TRL 1.x; "
                                  "`mask_truncated_completions: true` drops truncated completions from the loss)"),
    "token_level_kl": Legacy(instead="remove it; today's RLOO applies `beta` per token"),
    "normalize_reward": Legacy(instead="remove it; today's RLOO normalises within each prompt's group"),
}

# Fields TRL still declares but never reads; treated as legacy so they cannot silently do nothing.
IGNORED_BY_TRL = {"online_dpo": {"reward_model_path"}}
