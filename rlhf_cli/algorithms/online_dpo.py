"""Online DPO: TRL's experimental OnlineDPOTrainer, two completions per prompt ranked by the reward."""

from __future__ import annotations

from rlhf_cli.algorithms.legacy import COMMON_RENAMED, PPO_ERA_RETIRED
from rlhf_cli.algorithms.spec import Algorithm, Batches, LogitsModel, StarterEntry, StepWork, Values


def _batches(values: Values, num_processes: int) -> Batches:
    pairs = 2 * values("per_device_train_batch_size")  # two completions per prompt, trained on together
    return Batches(generation=pairs, train=pairs, score=pairs)


def _step_work(values: Values) -> StepWork:
    """Each micro-batch generates its two completions per prompt and trains on them; vLLM is synced once per
    optimizer step (trl/experimental/online_dpo)."""
    pairs = 2 * values("per_device_train_batch_size") * values("gradient_accumulation_steps")
    return StepWork(generated=pairs, trained=pairs, old_logprobs=False, old_logprobs_with_vllm=False, syncs=1)


ALGORITHM = Algorithm(
    name="online_dpo",
    command="online-dpo",
    summary="Train with online DPO (TRL's OnlineDPOTrainer): two completions per prompt, ranked by the reward.",
    example="rlhf online-dpo -r online_dpo/smoke --offload-optimizer cpu --dry-run",
    config_name="trl.experimental.online_dpo.OnlineDPOConfig",
    config_class="trl.experimental.online_dpo:OnlineDPOConfig",
    script_class="trl.scripts.rloo:RLOOScriptArguments",
    builder="rlhf_cli.rank.builders:build_online_dpo",
    sync_hooks={"vllm": "rlhf_cli.rank.engines.vllm.sync:hook_online_dpo"},
    trainer_class="trl.experimental.online_dpo:OnlineDPOTrainer",
    completion_field="max_new_tokens",
    batch_fields=("per_device_train_batch_size",),
    batches=_batches,
    step_work=_step_work,
    has_reference=lambda values: True,
    sequence_cap_field="max_length",
    # trl/experimental/online_dpo: `_forward` computes logits over every position and keeps the completion's
    # log-softmax; the reference's `_forward` runs while the policy's is kept; the backward of the slice adds a
    # gradient over every position
    logits=LogitsModel(sequence_copies=1, completion_copies=3),
    headline_metrics=(("objective/scores", "score"), ("objective/kl", "kl"), ("loss", "loss")),
    # TRL 1.16 declares `reward_model_path` but never reads it: read as the key it means.
    renamed={**COMMON_RENAMED, "response_length": "max_new_tokens", "kl_coef": "beta"},
    retired={name: instead for name, instead in PPO_ERA_RETIRED.items() if name != "missing_eos_penalty"},
    starter=(
        StarterEntry("max_steps", "optimizer steps in total", 1000),
        StarterEntry("max_new_tokens", "most tokens generated per completion", 256),
        StarterEntry("max_length", "most tokens of prompt + completion scored", 1024),
        StarterEntry("missing_eos_penalty", "subtracted from the score of unfinished completions", 1.0),
        StarterEntry("per_device_train_batch_size", "prompts per GPU per micro-batch (two completions each)", 2),
        StarterEntry("gradient_accumulation_steps", "micro-batches per optimizer step", 8),
        StarterEntry("learning_rate", "AdamW learning rate"),
        StarterEntry("beta", "pull toward the reference model (a list: one per epoch)"),
        StarterEntry("temperature", "sampling temperature"),
        StarterEntry("gradient_checkpointing", "recompute activations: less memory, slower", True),
    ),
    reward_keywords=("prompts", "completions", "completion_ids", "trainer_state"),
)
