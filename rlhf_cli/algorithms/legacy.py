"""Names from TRL 0.x-era scripts and recipes that several algorithms share; each algorithm adds its own.

A renamed key is accepted with a one-line note; a retired one is refused with what to do instead.
"""

from __future__ import annotations

# Every algorithm: the script arguments of TRL 0.x's PPO/RLOO examples.
COMMON_RENAMED = {
    "sft_model_path": "model_name_or_path",
    "reward_model_path": "reward_model_name_or_path",
    "exp_name": "run_name",
    "torch_dtype": "dtype",  # transformers 4.56 renamed it; TRL 1.x's ModelConfig has `dtype`
}

COMMON_RETIRED = {
    "num_sample_generations": "remove it",
    "token_level_kl": "remove it; today's trainers apply `beta` per token",
    "normalize_reward": "remove it; today's trainers normalise within each prompt's group",
    "max_prompt_length": "remove it; TRL 1.16's trainers do not truncate prompts (the memory plan's prompt length "
                         "is `plan_prompt_length`)",
    "overwrite_output_dir": "remove it; transformers 5 dropped it: pass --overwrite to reuse an output dir",
}

# The old PPO/RLOO knobs that TRL 1.x's generating trainers (RLOO, GRPO, online DPO) no longer have.
PPO_ERA_RETIRED = {
    **COMMON_RETIRED,
    "total_episodes": "set `max_steps` (one step consumes per_device_train_batch_size x gradient_accumulation_steps "
                      "x processes completions)",
    "num_mini_batches": "set `steps_per_generation` or remove it",
    "local_rollout_forward_batch_size": "remove it; today's trainers size these forward passes from "
                                        "per_device_train_batch_size",
    "stop_token": "set `generation_kwargs: {eos_token_id: ID}` or remove it",
    "stop_token_id": "set `generation_kwargs: {eos_token_id: ID}`",
    "missing_eos_penalty": "remove it (`mask_truncated_completions: true` drops truncated completions from the loss)",
}
