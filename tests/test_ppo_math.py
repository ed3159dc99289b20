"""PPO's math against values worked out by hand on short sequences."""

from __future__ import annotations

import math

import pytest
import torch

from rlhf_cli.rank.engines.importance_sampling import SamplingCorrection, sampling_correction, sampling_weights_seen
from rlhf_cli.rank.engines.vllm.ppo_config import VLLMRolloutSettings
from rlhf_cli.rank.ppo import core

T = torch.tensor


def test_eos_truncation_and_padding_masks() -> None:
    responses = T([[5, 2, 7, 8], [5, 6, 7, 8]])
    truncated = core.truncate_after_stop(responses, stop_token_id=2, pad_token_id=0)
    assert truncated.tolist() == [[5, 2, 0, 0], [5, 6, 7, 8]]
    lengths = core.first_true_indices(truncated == 0) - 1
    assert lengths.tolist() == [1, 3]
    logprob_mask, value_mask = core.response_masks(lengths, width=4)
    assert logprob_mask.tolist() == [[False, False, True, True], [False, False, False, False]]
    assert value_mask.tolist() == [[False, False, False, True], [False, False, False, False]]


def test_missing_eos_penalty() -> None:
    scores = core.penalise_missing_eos(T([2.0, 3.0]), T([[5, 2, 0], [5, 6, 7]]), eos_token_id=2, penalty=1.0)
    assert scores.tolist() == [2.0, 2.0]
    assert core.penalise_missing_eos(T([3.0]), T([[5]]), 2, None).tolist() == [3.0]


def test_kl_estimators() -> None:
    logprobs, ref = T([-1.0]), T([-1.5])
    assert core.kl_estimate(logprobs, ref, "k1").item() == pytest.approx(0.5)
    assert core.kl_estimate(logprobs, ref, "k3").item() == pytest.approx(math.exp(-0.5) - 1 + 0.5)
    assert core.kl_estimate(ref, logprobs, "k3").item() >= 0
    with pytest.raises(ValueError):
        core.kl_estimate(logprobs, ref, "k2")


def test_score_lands_after_the_last_real_token() -> None:
    rewards, non_score = core.token_rewards(T([2.0, 3.0]), torch.full((2, 4), 0.1), kl_coef=0.5,
                                            sequence_lengths=T([1, 3]))
    assert torch.allclose(non_score, torch.full((2, 4), -0.05))
    assert torch.allclose(rewards, T([[-0.05, -0.05, 1.95, -0.05], [-0.05, -0.05, -0.05, 2.95]]))


def test_gae_and_returns() -> None:
    rewards, values = T([[0.0, 1.0]]), T([[0.5, 0.25]])
    advantages, returns = core.gae(rewards, values, gamma=1.0, lam=0.5)
    assert advantages[0].tolist() == pytest.approx([0.125, 0.75])
    assert returns[0].tolist() == pytest.approx([0.625, 1.0])
    advantages, _ = core.gae(rewards, values, gamma=0.9, lam=1.0)
    assert advantages[0].tolist() == pytest.approx([0.4, 0.75])


def test_whitening_ignores_padding() -> None:
    whitened = core.masked_whiten(T([1.0, 2.0, 3.0, 100.0]), T([True, True, True, False]))
    assert whitened[:3].tolist() == pytest.approx([-1.0, 0.0, 1.0], abs=1e-6)
    kept_mean = core.masked_whiten(T([1.0, 2.0, 3.0, 100.0]), T([True, True, True, False]), shift_mean=False)
    assert kept_mean[:3].tolist() == pytest.approx([1.0, 2.0, 3.0], abs=1e-6)


def test_clipped_policy_loss_with_padding_masked() -> None:
    new = T([[math.log(1.5), math.log(1.5), 50.0]])
    old = T([[0.0, 0.0, 0.0]])
    advantages = T([[1.0, -1.0, 1e6]])
    mask = T([[True, True, False]])
    loss, clipfrac, approxkl = core.policy_loss(new, old, advantages, cliprange=0.2, mask=mask)
    # +1 advantage: max(-1.5, -1.2) = -1.2 (clipped); -1 advantage: max(1.5, 1.2) = 1.5 (not clipped)
    assert loss.item() == pytest.approx((-1.2 + 1.5) / 2)
    assert clipfrac.item() == pytest.approx(0.5)
    assert approxkl.item() == pytest.approx(0.5 * math.log(1.5) ** 2)


def test_importance_sampling_weights_the_policy_loss_as_trls_token_truncate() -> None:
    """TRL's GRPO `token_truncate`: exp(policy - vLLM) per token clipped into [clip_min, clip_max]; NaN (unscored
    by vLLM) and masked tokens weigh 1 and are left out of the logp difference."""
    policy = T([[math.log(0.5), math.log(0.5), math.log(0.9), -1.0]])
    sampling = T([[math.log(0.25), math.log(0.05), float("nan"), -50.0]])
    mask = T([[True, True, True, False]])
    ratio, difference = sampling_correction(policy, sampling, mask, "token_truncate", None, 3.0)
    assert ratio[0, :3].tolist() == pytest.approx([2.0, 3.0, 1.0]) and ratio[0, 3].item() == 1.0
    assert difference.tolist() == pytest.approx([math.log(2.0), math.log(10.0)])
    floored, _ = sampling_correction(policy, sampling, mask, "token_truncate", 1.5, None)
    assert floored[0].tolist() == pytest.approx([2.0, 10.0, 1.5, 1.5])  # the lower clip, no upper
    new, old, advantages = T([[0.0, 0.0]]), T([[0.0, 0.0]]), T([[1.0, 1.0]])
    weighted, _, _ = core.policy_loss(new, old, advantages, cliprange=0.2, mask=T([[True, True]]),
                                      weights=T([[2.0, 0.5]]))
    assert weighted.item() == pytest.approx((-2.0 - 0.5) / 2)


def test_importance_sampling_masks_and_weighs_sequences_as_trls_modes() -> None:
    """`token_mask` zeroes each token whose ratio is outside [clip_min, clip_max]; the sequence modes take one ratio
    per sequence, exp of its tokens' summed log-ratios (B x 1), clipped (`sequence_truncate`) or zeroed outside the
    bounds (`sequence_mask`, TRL's default), and weigh each of its tokens with it."""
    policy = T([[math.log(0.5), math.log(0.5), 0.0], [math.log(0.2), math.log(0.9), 0.0]])
    sampling = T([[math.log(0.25), math.log(0.05), 7.0], [math.log(0.4), math.log(0.9), 0.0]])
    mask = T([[True, True, False], [True, True, False]])  # token ratios: [2, 10, -], [0.5, 1, -]
    token_mask, _ = sampling_correction(policy, sampling, mask, "token_mask", 0.6, 3.0)
    assert token_mask.flatten().tolist() == pytest.approx([2.0, 0.0, 1.0, 0.0, 1.0, 1.0])
    sequence_truncate, _ = sampling_correction(policy, sampling, mask, "sequence_truncate", 0.6, 3.0)
    assert sequence_truncate.shape == (2, 1) and sequence_truncate.flatten().tolist() == pytest.approx([3.0, 0.6])
    sequence_mask, _ = sampling_correction(policy, sampling, mask, "sequence_mask", None, 30.0)
    assert sequence_mask.flatten().tolist() == pytest.approx([20.0, 0.5])  # 2 x 10, 0.5 x 1
    sequence_mask, _ = sampling_correction(policy, sampling, mask, "sequence_mask", 0.6, 3.0)
    assert sequence_mask.tolist() == [[0.0], [0.0]]
    assert sampling_weights_seen(sequence_truncate, mask).tolist() == pytest.approx([3.0, 0.6])
    assert sampling_weights_seen(token_mask, mask).tolist() == pytest.approx([2.0, 0.0, 0.0, 1.0])
    new = old = T([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    advantages = T([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    loss, _, _ = core.policy_loss(new, old, advantages, cliprange=0.2, mask=mask, weights=sequence_truncate)
    assert loss.item() == pytest.approx(-(3.0 * 2 + 0.6 * 2) / 4)
    with pytest.raises(ValueError, match="token_truncate, token_mask, sequence_truncate, sequence_mask"):
        sampling_correction(policy, sampling, mask, "sequence", None, 3.0)


def test_clipped_value_loss() -> None:
    predicted, old, returns = T([[1.0, 0.1, 9.0]]), T([[0.0, 0.0, 0.0]]), T([[2.0, 1.0, 0.0]])
    loss, clipfrac = core.value_loss(predicted, old, returns, cliprange_value=0.2, mask=T([[True, True, False]]))
    # token 1: clip(1.0) = 0.2 -> max(1.0, 3.24) = 3.24; token 2: inside the range -> 0.81
    assert loss.item() == pytest.approx(0.5 * (3.24 + 0.81) / 2)
    assert clipfrac.item() == pytest.approx(0.5)


def test_trls_importance_sampling_keys_choose_the_correction() -> None:
    """PPO's config takes TRL's `vllm_importance_sampling_*` keys (the engine room's settings); the trainer reads
    only the correction they choose."""
    chosen = VLLMRolloutSettings(vllm_importance_sampling_correction=False, vllm_importance_sampling_mode="token_mask",
                                 vllm_importance_sampling_clip_min=0.5).sampling_correction()
    assert chosen == SamplingCorrection(weighs=False, mode="token_mask", clip_min=0.5, clip_max=3.0)
