"""PPO's settings: TRL 1.12's PPOConfig, its field names and defaults, so its command lines translate one to one."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from transformers import TrainingArguments


@dataclass
class PPOConfig(TrainingArguments):
    """Settings of rlhf's PPO trainer (RLHF PPO as in Huang et al., 2024)."""

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
    ds3_gather_for_generation: bool = field(
        default=True, metadata={"help": "Under ZeRO-3, gather the whole policy on every rank to generate."})
    # vLLM rollouts: TRL's GRPOConfig keys, names, defaults and meaning (rlhf_cli/rank/engines/vllm/sync.py syncs them).
    use_vllm: bool = field(default=False, metadata={"help": "Generate rollouts with vLLM instead of model.generate()."})
    vllm_mode: str = field(default="colocate", metadata={
        "help": "`colocate`: vLLM in each training process; `server`: a separate vLLM server (vllm_server_host)."})
    vllm_model_impl: str = field(default="vllm",
                                 metadata={"help": "vLLM's model implementation: vllm or transformers."})
    vllm_enable_sleep_mode: bool = field(default=False, metadata={
        "help": "Put colocated vLLM to sleep (weights and cache freed) while training; needs a CUDA GPU."})
    vllm_gpu_memory_utilization: float = field(default=0.3, metadata={
        "help": "Share of each GPU's total memory colocated vLLM takes (its weights and KV cache)."})
    vllm_tensor_parallel_size: int = field(default=1, metadata={
        "help": "Processes one colocated vLLM engine spans; must divide the number of processes."})
    vllm_max_model_length: int | None = field(default=None, metadata={
        "help": "vLLM's context window: at least the longest prompt plus response_length; default the model's."})
    vllm_server_base_url: str | None = field(default=None, metadata={
        "help": "Base URL of the vLLM server (http://host:8000); overrides vllm_server_host and _port."})
    vllm_server_host: str = field(default="0.0.0.0", metadata={"help": "Host of the vLLM server."})
    vllm_server_port: int = field(default=8000, metadata={"help": "Port of the vLLM server."})
    vllm_server_timeout: float = field(default=240.0, metadata={
        "help": "Seconds to wait for the vLLM server to be up."})
    vllm_group_port: int = field(default=51216, metadata={"help": "Port of the weight-update group with the server."})
    # TRL 1.16's GRPOConfig keys for vLLM's importance sampling (its deprecated `vllm_importance_sampling_cap` is
    # accepted as the old name of `vllm_importance_sampling_clip_max`: rlhf_cli/algorithms/ppo.py)
    vllm_importance_sampling_correction: bool = field(default=True, metadata={
        "help": "Weight the policy loss by importance-sampling ratios pi_policy / pi_vLLM (vllm_importance_sampling_"
                "mode): TRL's correction for the mismatch between vLLM's and the policy's log-probs."})
    vllm_importance_sampling_mode: str = field(default="sequence_mask", metadata={
        "help": "How the ratios weigh the loss: token_truncate, token_mask, sequence_truncate or sequence_mask. "
                "Per token or one per sequence (its tokens' log-ratios summed); clipped into [clip_min, clip_max] "
                "(*_truncate) or 0 outside it (*_mask)."})
    vllm_importance_sampling_clip_max: float | None = field(default=3.0, metadata={
        "help": "Importance sampling upper bound C_max used by `vllm_importance_sampling_mode`."})
    vllm_importance_sampling_clip_min: float | None = field(default=None, metadata={
        "help": "Importance sampling lower bound C_min used by `vllm_importance_sampling_mode`."})
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
