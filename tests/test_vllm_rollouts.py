"""PPO's vLLM rollouts without vLLM: prompts and responses as `generate` has them, the sync's buckets under each
gather choice, and the server command `rlhf vllm-serve` starts."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM

from conftest import RECIPES
from rlhf_cli.gather_budget import Budget
from rlhf_cli.rank.ppo.vllm_rollouts import padded_responses, prompt_ids, sampling_settings
from rlhf_cli.rank.ppo.weight_sync import buckets, sync_weights

PAD = 0


def test_prompts_lose_their_left_padding_and_responses_are_right_padded() -> None:
    queries = torch.tensor([[PAD, PAD, 5, 6], [7, 8, 9, 10]])
    assert prompt_ids(queries, PAD) == [[5, 6], [7, 8, 9, 10]]
    responses = padded_responses([[3, 2], [4, 4, 4]], PAD, torch.device("cpu"))
    assert responses.tolist() == [[3, 2, PAD], [4, 4, 4]]
    assert padded_responses([[], []], PAD, torch.device("cpu")).tolist() == [[PAD], [PAD]]


def test_sampling_matches_generate_and_stops_only_at_the_stop_token() -> None:
    with_stop = sampling_settings(12, 0.7, stop_token_id=2)
    assert with_stop["max_completion_length"] == 12 and with_stop["top_k"] == 0 and with_stop["top_p"] == 1.0
    assert with_stop["temperature"] == pytest.approx(0.7 + 1e-7)  # as rollout_generation_config
    assert with_stop["generation_kwargs"] == {"ignore_eos": True, "stop_token_ids": [2]}
    assert sampling_settings(12, 0.7, stop_token_id=None)["generation_kwargs"]["stop_token_ids"] is None


class Recorder:
    """A sync target that keeps what it was sent, bucket by bucket."""

    def __init__(self) -> None:
        self.loads: list[dict[str, torch.Tensor]] = []
        self.finished = 0

    def load(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        self.loads.append({name: tensor.clone() for name, tensor in weights})

    def finish(self) -> None:
        self.finished += 1


@pytest.fixture(scope="module")
def policy() -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(RECIPES / "smoke" / "policy")


def test_gather_sends_one_bucket_no_gather_one_unit_each(policy: torch.nn.Module) -> None:
    state = policy.state_dict()
    assert len(buckets(policy, gather=True, budget=None)) == 1
    per_unit = buckets(policy, gather=False, budget=None)
    assert all(len(group) == 1 for group in per_unit) and len(per_unit) == 5  # 2 layers, embedding, norm, head
    for gather in (True, False):
        target = Recorder()
        measured = sync_weights(None, policy, target, gather, None)
        sent = {name: tensor for bucket in target.loads for name, tensor in bucket.items()}
        assert sent.keys() == state.keys() and all(sent[name].equal(state[name]) for name in state)
        assert target.finished == 1 and measured["buckets"] == len(target.loads)
        assert measured["seconds"] >= 0 and measured["peak_bytes"] == measured["full_bytes"]  # no ZeRO-3 here


def test_a_budget_packs_whole_units_up_to_it(policy: torch.nn.Module) -> None:
    total = sum(p.numel() for p in policy.parameters())
    groups = buckets(policy, gather=False, budget=Budget(fraction=0.5))
    assert 1 < len(groups) < 5
    for group in groups:
        size = sum(unit.unit.numel for unit in group)
        assert size <= total // 2 or len(group) == 1  # a unit larger than the budget goes alone
    assert sum(len(group) for group in groups) == 5
    assert len(buckets(policy, gather=False, budget=Budget(fraction=1.0))) == 1


def test_vllm_serve_starts_the_runs_model_on_loopback_with_its_settings() -> None:
    done = subprocess.run([sys.executable, "-m", "rlhf_cli", "vllm-serve", "ppo", "-r", "ppo/smoke", "--dry-run",
                           "--set", "vllm_server_port=8123", "--set", "vllm_max_model_length=64", "--set", "seed=7"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    argv = shlex.split(done.stdout.strip())
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    options = dict(zip(argv[3::2], argv[4::2]))
    assert options["--model"] == str(RECIPES / "smoke" / "policy")
    assert (options["--host"], options["--port"], options["--max-model-len"], options["--seed"]) == \
        ("127.0.0.1", "8123", "64", "7")
