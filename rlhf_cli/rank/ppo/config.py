"""PPO's settings: TRL 1.12's PPOConfig, its field names and defaults, so its command lines translate one to one."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from transformers import TrainingArguments

from rlhf_cli.algorithms.spec import load_object
from rlhf_cli.generation.choice import GatherSettings
from rlhf_cli.generation.engines import face_paths

SETTINGS_FACE = "ppo_settings"  # the face of an engine row that names the keys it adds to PPO's config
# Each engine's own keys (TRL's GRPOConfig holds them the same way), from the engine's room
ENGINE_SETTINGS = tuple(load_object(path) for path in face_paths(SETTINGS_FACE))


@dataclass
class PPOConfig(*ENGINE_SETTINGS, GatherSettings, TrainingArguments):
    """Settings of rlhf's PPO trainer (RLHF PPO as in Huang et al., 2024); each separate engine's keys are its
    room's, inherited (`ENGINE_SETTINGS`), and so is the sampling correction they choose (`sampling_correction`);
    TRL's gather key is the gather choice's (`GatherSettings`)."""

    value_model_name_or_path: str | None = field(
        default=None, metadata={"help": "Value model to start from; default: the reward model."})
    total_episodes: int | None = field(
        default=None, metadata={"help": "Responses to train on in total; max_steps (updates) wins when set."})
    num_ppo_epochs: int = field(default=4, metadata={"help": "Passes over each batch of rollouts."})
    num_mini_batches: int = field(default=1, metadata={
        "help": "Mini-batches the rollouts of a process (per_device_train_batch_size x gradient_accumulation_steps) "
                "are split into, one optimizer step each."})
    local_rollout_forward_batch_size: int = field(
        default=64, metadata={"help": "Sequences per generation and scoring forward pass on each process."})
    response_length: int = field(default=53, metadata={"help": "Most tokens generated per response."})
    temperature: float = field(default=0.7, metadata={"help": "Sampling temperature of rollouts."})
    stop_token: Literal["eos"] | None = field(
        default=None, metadata={"help": "`eos` to cut responses after the first EOS token."})
    stop_token_id: int | None = field(default=None, metadata={"help": "Cut responses after this token."})
    missing_eos_penalty: float | None = field(
        default=None, metadata={"help": "Subtracted from the score of responses without an EOS token."})
    kl_coef: float = field(default=0.05, metadata={"help": "Weight of the per-token KL penalty."})
    kl_estimator: Literal["k1", "k3"] = field(
        default="k1", metadata={"help": "KL estimator: k1 (log-ratio) or k3 (unbiased, non-negative)."})
    whiten_rewards: bool = field(default=False, metadata={"help": "Whiten the per-token rewards."})
    cliprange: float = field(default=0.2, metadata={"help": "Clip range of the policy ratio."})
    cliprange_value: float = field(default=0.2, metadata={"help": "Clip range of the value prediction."})
    vf_coef: float = field(default=0.1, metadata={"help": "Weight of the value loss."})
    gamma: float = field(default=1.0, metadata={"help": "Discount factor of GAE."})
    lam: float = field(default=0.95, metadata={"help": "Lambda of GAE."})
    model_init_kwargs: dict[str, Any] | None = field(
        default=None, metadata={"help": "Keyword arguments for `from_pretrained` of the models."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Allow custom model code from the hub."})
    # TRL 1.12's defaults where its PPOConfig differs from TrainingArguments (its _BaseConfig, as TRL 1.16's trainers)
    learning_rate: float = field(default=3e-6, metadata={"help": "The initial learning rate for AdamW."})
    logging_steps: float = field(default=10, metadata={
        "help": "Log every this many PPO updates; below 1, a share of the run."})
    gradient_checkpointing: bool = field(default=True, metadata={
        "help": "Enable gradient checkpointing to trade compute for memory."})
    bf16: bool | None = field(default=None, metadata={
        "help": "bf16 (mixed) precision instead of 32-bit; unset: on unless fp16 is set, where the hardware has bf16."})

    def __post_init__(self) -> None:
        if self.bf16 is None:  # TRL turns bf16 on unless fp16 is set; here only where the hardware has it
            self.bf16 = not self.fp16 and has_bf16(self.use_cpu)
            if not self.bf16 and not self.fp16:
                from rlhf_cli.rank.loading import say

                say("bf16 off: this GPU has no bf16 (TRL 1.12's PPOConfig turns it on unless told); training in fp32")
        super().__post_init__()


def has_bf16(use_cpu: bool) -> bool:
    """Whether the run's device computes in bf16: the CPU does (torch), CUDA GPUs from Ampere on."""
    import torch

    if use_cpu or not torch.cuda.is_available():
        return True  # without CUDA, rlhf's resolver sets bf16 itself (off on DeepSpeed's CPU path)
    return torch.cuda.is_bf16_supported()
