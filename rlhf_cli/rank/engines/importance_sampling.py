"""The correction for a separate engine's sampling: the engine samples with its own copy of the weights and its
own kernels, so its log-probs differ from the policy's; TRL's GRPO weighs the policy loss by the ratio (its
importance sampling). Engine-neutral: an engine's settings give a `SamplingCorrection`, the trainer applies it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# TRL's importance-sampling modes (GRPOConfig; its default: sequence_mask)
IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


@dataclass(frozen=True)
class SamplingCorrection:
    """How a run weighs its loss by the engine's sampling mismatch: `weighs` off still measures it."""

    weighs: bool
    mode: str
    clip_min: float | None
    clip_max: float | None

    def ratios(self, logprobs: torch.Tensor, sampling_logprobs: torch.Tensor,
               mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return sampling_correction(logprobs, sampling_logprobs, mask, self.mode, self.clip_min, self.clip_max)


def sampling_correction(logprobs: torch.Tensor, sampling_logprobs: torch.Tensor, mask: torch.Tensor, mode: str,
                        clip_min: float | None, clip_max: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """TRL's importance sampling for the mismatch between the engine's log-probs and the policy's (GRPOTrainer's
    importance-sampling mode): exp(policy - engine) per token (`token_*`: B x T) or per sequence, its tokens'
    log-ratios summed (`sequence_*`: B x 1, weighing each of its tokens); clipped into [clip_min, clip_max]
    (`*_truncate`) or 0 outside it (`*_mask`), a missing bound unbounded. A token outside `mask` or that the engine
    gave no log-prob (NaN) adds 0 to the log-ratio. Also |policy - engine| of the masked tokens the engine scored
    (TRL's `sampling/sampling_logp_difference`)."""
    if mode not in IS_MODES:
        raise ValueError(f"the importance-sampling mode must be one of {', '.join(IS_MODES)}, got {mode!r}")
    difference = torch.nan_to_num((logprobs - sampling_logprobs) * mask, nan=0.0)
    if mode.startswith("sequence"):
        difference = difference.sum(-1, keepdim=True)
    ratio = torch.exp(difference)
    if mode.endswith("truncate"):
        ratio = torch.clamp(ratio, min=clip_min, max=clip_max)
    else:
        low, high = -math.inf if clip_min is None else clip_min, math.inf if clip_max is None else clip_max
        ratio = ratio.masked_fill((ratio < low) | (ratio > high), 0.0)
    delta = (logprobs - sampling_logprobs).abs()
    return ratio, delta[mask & ~torch.isnan(delta)]


def sampling_weights_seen(ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The importance-sampling weights TRL's metrics summarise: each sequence's once (sequence modes), else each
    masked token's."""
    return ratio.flatten() if ratio.size(-1) == 1 else ratio[mask]
