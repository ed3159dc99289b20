"""PPO's vLLM settings: TRL's GRPOConfig keys for vLLM rollouts and their importance-sampling correction, with its
names, defaults and meaning (they are the recipe keys), a dataclass PPO's config inherits. Only field definitions
and the correction they choose: nothing here imports vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlhf_cli.generation.engines import EngineChoiceSettings
from rlhf_cli.rank.engines.importance_sampling import SamplingCorrection


@dataclass
class VLLMRolloutSettings(EngineChoiceSettings):
    """TRL's vLLM keys (rlhf_cli/rank/engines/vllm/sync.py syncs the engine, ppo_rollouts.py samples with it); the
    two that choose the engine are the registry's (`EngineChoiceSettings`)."""

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

    def sampling_correction(self) -> SamplingCorrection:
        """The correction these keys choose, for the trainer's engine-neutral loss and metrics."""
        return SamplingCorrection(self.vllm_importance_sampling_correction, self.vllm_importance_sampling_mode,
                                  self.vllm_importance_sampling_clip_min, self.vllm_importance_sampling_clip_max)
