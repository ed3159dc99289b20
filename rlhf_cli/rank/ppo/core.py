"""The math of RLHF PPO ("The N Implementation Details of RLHF with PPO", Huang et al., 2024).

Pure tensor functions, so each step can be checked against values worked out by hand.
Shapes: B sequences x T response tokens; masks are True where a token is padding.
"""

from __future__ import annotations

import torch

INVALID_LOGPROB = 1.0  # what masked log-probabilities are set to; never read by a loss


def first_true_indices(bools: torch.Tensor) -> torch.Tensor:
    """Index of the first True per row, or the row length when there is none."""
    length = bools.size(-1)
    positions = length * (~bools).long() + torch.arange(length, device=bools.device)
    return positions.min(dim=-1).values


def truncate_after_stop(responses: torch.Tensor, stop_token_id: int, pad_token_id: int) -> torch.Tensor:
    """Keep each response up to and including its first stop token; pad the rest."""
    stop_at = first_true_indices(responses == stop_token_id).unsqueeze(-1)
    positions = torch.arange(responses.size(1), device=responses.device).view(1, -1)
    return torch.masked_fill(responses, positions > stop_at, pad_token_id)


def response_masks(sequence_lengths: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Padding masks for log-probs (after the last real token) and values (one token later).

    `sequence_lengths` is the index of each response's last real token.
    """
    positions = torch.arange(width, device=sequence_lengths.device).unsqueeze(0)
    return positions > sequence_lengths.unsqueeze(1), positions > (sequence_lengths + 1).unsqueeze(1)


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token KL(policy || reference): k1 = log p - log q; k3 = (q/p - 1) - log(q/p), never negative."""
    log_ratio = ref_logprobs - logprobs
    if estimator == "k1":
        return -log_ratio
    if estimator == "k3":
        return torch.expm1(log_ratio) - log_ratio
    raise ValueError(f"kl_estimator must be k1 or k3, got {estimator!r}")


def token_rewards(scores: torch.Tensor, kl: torch.Tensor, kl_coef: float,
                  sequence_lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """reward = -kl_coef * KL per token, plus the sequence score on the token after the last real one
    (on the last real token when the response fills the whole width). Returns (rewards, non-score part)."""
    non_score = -kl_coef * kl
    rewards = non_score.clone()
    after_last = sequence_lengths + 1
    end = torch.where(after_last < rewards.size(1), after_last, sequence_lengths)
    rewards[torch.arange(rewards.size(0), device=rewards.device), end] += scores
    return rewards, non_score


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Mean over the positions where `mask` is True."""
    if axis is None:
        return (values * mask).sum() / mask.sum()
    return (values * mask).sum(axis) / mask.sum(axis)


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """Normalise to unit variance (and zero mean) over the positions where `mask` is True."""
    mean = masked_mean(values, mask)
    centered = values - mean
    variance = masked_mean(centered**2, mask)
    count = mask.sum()
    if count > 1:
        variance = variance * count / (count - 1)  # unbiased, as the reference implementation
    whitened = centered * torch.rsqrt(variance + 1e-8)
    return whitened if shift_mean else whitened + mean


def gae(rewards: torch.Tensor, values: torch.Tensor, gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation; returns (advantages, returns = advantages + values)."""
    last = torch.zeros_like(rewards[:, 0])
    advantages_reversed = []
    width = rewards.size(1)
    for t in reversed(range(width)):
        next_values = values[:, t + 1] if t < width - 1 else torch.zeros_like(last)
        delta = rewards[:, t] + gamma * next_values - values[:, t]
        last = delta + gamma * lam * last
        advantages_reversed.append(last)
    advantages = torch.stack(advantages_reversed[::-1], dim=1)
    return advantages, advantages + values


def policy_loss(new_logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                cliprange: float, mask: torch.Tensor,
                weights: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Clipped surrogate loss, each token's weighted by `weights` (vLLM's importance sampling) when given; returns
    (loss, clip fraction, approximate KL old->new), over `mask`."""
    log_ratio = new_logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - cliprange, 1.0 + cliprange)
    per_token = torch.max(unclipped, clipped)
    loss = masked_mean(per_token if weights is None else per_token * weights, mask)
    clipfrac = masked_mean((clipped > unclipped).float(), mask)
    approxkl = 0.5 * masked_mean(log_ratio**2, mask)
    return loss, clipfrac, approxkl


def value_loss(predicted: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
               cliprange_value: float, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss 0.5 * max((v - R)^2, (clip(v) - R)^2); returns (loss, clip fraction)."""
    clipped_prediction = torch.clamp(predicted, old_values - cliprange_value, old_values + cliprange_value)
    unclipped = (predicted - returns) ** 2
    clipped = (clipped_prediction - returns) ** 2
    loss = 0.5 * masked_mean(torch.max(unclipped, clipped), mask)
    return loss, masked_mean((clipped > unclipped).float(), mask)


def penalise_missing_eos(scores: torch.Tensor, responses: torch.Tensor, eos_token_id: int,
                         penalty: float | None) -> torch.Tensor:
    """Subtract `penalty` from the score of every response that never emits EOS."""
    if penalty is None:
        return scores
    has_eos = (responses == eos_token_id).any(dim=-1)
    return torch.where(has_eos, scores, scores - penalty)
