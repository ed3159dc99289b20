"""GRPO: TRL's GRPOTrainer, groups of completions per prompt scored against the group; no reference at beta 0."""

from __future__ import annotations

from rlhf_cli.algorithms.legacy import COMMON_RENAMED, PPO_ERA_RETIRED
from rlhf_cli.algorithms.spec import Algorithm, StarterEntry
from rlhf_cli.algorithms.trl_generating import (
                                                 FUSED_HEAD,
                                                 TRL_REWARD_KEYWORDS,
                                                 generation_batches,
                                                 group_checks,
                                                 grpo_step_work,
)

ALGORITHM = Algorithm(
    name="grpo",
    command="grpo",
    summary="Train with GRPO (TRL's GRPOTrainer): groups of completions per prompt, advantages within the group.",
    example="rlhf grpo -r grpo/smoke --no-gather",
    config_name="trl.GRPOConfig",
    config_class="trl:GRPOConfig",
    script_class="trl.scripts.grpo:GRPOScriptArguments",
    builder="rlhf_cli.rank.builders:build_trl_generating",
    sync_hooks={"vllm": "rlhf_cli.rank.engines.vllm.sync:hook_vllm_generation"},
    trainer_class="trl:GRPOTrainer",
    completion_field="max_completion_length",
    batch_fields=("per_device_train_batch_size",),
    batches=generation_batches,
    step_work=grpo_step_work,
    has_reference=lambda values: values("beta") != 0,  # TRL's default beta 0: no reference model, no KL term
    logits=FUSED_HEAD,
    headline_metrics=(("reward", "reward"), ("kl", "kl"), ("loss", "loss"), ("entropy", "entropy"),  # and with tools:
                      ("tools/call_frequency", "tool calls"), ("tools/failure_frequency", "tool failures")),
    renamed={**COMMON_RENAMED, "response_length": "max_completion_length", "kl_coef": "beta",
             "num_ppo_epochs": "num_iterations", "cliprange": "epsilon"},
    retired=PPO_ERA_RETIRED,
    starter=(
        StarterEntry("max_steps", "optimizer steps in total", 1000),
        StarterEntry("num_generations", "completions per prompt (a group), at least 2", 8),
        StarterEntry("max_completion_length", "most tokens generated per completion", 256),
        StarterEntry("per_device_train_batch_size", "completions per GPU per micro-batch", 8),
        StarterEntry("gradient_accumulation_steps", "micro-batches per optimizer step", 4),
        StarterEntry("learning_rate", "AdamW learning rate"),
        StarterEntry("beta", "KL penalty against a reference model; 0 loads no reference model"),
        StarterEntry("loss_type", "dapo, grpo, dr_grpo, bnpo, cispo, sapo, luspo or vespo: how token losses add up"),
        StarterEntry("temperature", "sampling temperature"),
        StarterEntry("gradient_checkpointing", "recompute activations: less memory, slower", True),
    ),
    checks=group_checks,
    reward_keywords=TRL_REWARD_KEYWORDS,
    takes_tools=True,  # GRPOTrainer(tools=, environment_factory=, rollout_func=); RLOO's and online DPO's do not
)
