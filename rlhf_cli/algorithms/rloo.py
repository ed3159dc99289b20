"""RLOO: TRL's RLOOTrainer, several completions per prompt with a leave-one-out baseline."""

from __future__ import annotations

from rlhf_cli.algorithms.legacy import COMMON_RENAMED, PPO_ERA_RETIRED
from rlhf_cli.algorithms.spec import Algorithm, StarterEntry
from rlhf_cli.algorithms.trl_generating import (
                                                 FUSED_HEAD,
                                                 TRL_REWARD_KEYWORDS,
                                                 generation_batches,
                                                 group_checks,
                                                 rloo_step_work,
)

ALGORITHM = Algorithm(
    name="rloo",
    command="rloo",
    summary="Train with RLOO (TRL's RLOOTrainer): several completions per prompt, leave-one-out baseline.",
    example="rlhf rloo -r rloo/smoke --no-gather",
    config_name="trl.RLOOConfig",
    config_class="trl:RLOOConfig",
    script_class="trl.scripts.rloo:RLOOScriptArguments",
    builder="rlhf_cli.rank.builders:build_trl_generating",
    sync_hooks={"vllm": "rlhf_cli.rank.engines.vllm.sync:hook_vllm_generation"},
    trainer_class="trl:RLOOTrainer",
    completion_field="max_completion_length",
    batch_fields=("per_device_train_batch_size",),
    batches=generation_batches,
    step_work=rloo_step_work,
    has_reference=lambda values: values("beta") != 0,  # RLOO builds no reference model when beta is 0
    logits=FUSED_HEAD,
    headline_metrics=(("reward", "reward"), ("kl", "kl"), ("loss", "loss"), ("step_time", "s/step")),
    renamed={**COMMON_RENAMED, "rloo_k": "num_generations", "response_length": "max_completion_length",
             "kl_coef": "beta", "num_ppo_epochs": "num_iterations", "cliprange": "epsilon",
             "normalize_advantage": "normalize_advantages"},
    retired=PPO_ERA_RETIRED,
    starter=(
        StarterEntry("max_steps", "optimizer steps in total", 1000),
        StarterEntry("num_generations", "completions per prompt, at least 2 (leave-one-out baseline)", 4),
        StarterEntry("max_completion_length", "most tokens generated per completion", 256),
        StarterEntry("per_device_train_batch_size", "completions per GPU per micro-batch", 4),
        StarterEntry("gradient_accumulation_steps", "micro-batches per optimizer step", 4),
        StarterEntry("learning_rate", "AdamW learning rate"),
        StarterEntry("beta", "weight of the KL penalty against the reference model"),
        StarterEntry("temperature", "sampling temperature"),
        StarterEntry("gradient_checkpointing", "recompute activations: less memory, slower", True),
    ),
    checks=group_checks,
    reward_keywords=TRL_REWARD_KEYWORDS,
)
