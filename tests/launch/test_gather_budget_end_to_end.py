"""A gather budget really launched: 2 ranks under DeepSpeed ZeRO-3 on the CPU, small ZeRO-3 buckets (as
tests/helpers.py's SMALL_BUCKETS), the same seed at budgets 0, 0.5 and 1 (PPO: --no-gather, a budget of 0.5 and
--gather, the three ways it generates).

What it shows: the generated tokens are the same at every budget (the probe's digest of every generated batch,
on every rank), and so is everything trained after them (the logged metrics of every step and the saved weights,
exactly): a training step after a partial gather runs on the ZeRO-3 state a full gather leaves. And the probe's
gathered share follows the budget. PPO's runs score with a reward function and no reward model, so that its value
model is the policy with a fresh score head: its random start must be seeded too, or the runs part at the first
update.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import FIXTURES, PPO_METRICS, RECIPES, SMALL_BUCKETS, launch_rlhf, sets

BUDGETS = ("0", "0.5", "1")
FLAGS = {"rloo": {budget: ("--gather-budget", budget) for budget in BUDGETS},
         "ppo": {"0": ("--no-gather",), "0.5": ("--gather-budget", "0.5"), "1": ("--gather",)}}
PAIRS = {"rloo": ("max_steps=2",),  # PPO: 8 rollouts an update; a reward function, no reward model
         "ppo": ("total_episodes=16", "reward_model_name_or_path=null",
                 f"reward_funcs=[{FIXTURES}/rewards.py:letter_e]")}


def launch(command: str, out: Path, budget: str) -> list[dict]:
    """Run the smoke recipe for 2 steps at `budget`; return each rank's probe records."""
    done = launch_rlhf(command, out, *FLAGS[command][budget], *sets(*PAIRS[command], *SMALL_BUCKETS),
                       env={"RLHF_PROBE_GENERATION": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    records = [json.loads((out / "ranks" / f"rank-{rank}.json").read_text()) for rank in (0, 1)]
    assert all(record["ds3_gather_for_generation"] is (budget == "1") for record in records)
    return [record["generation_probe"] for record in records]


def weights(out: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(out / "model.safetensors")


CLOCK = {"step_time", "eps", "train_runtime", "train_samples_per_second", "train_steps_per_second"}  # eps: PPO's


def metrics(out: Path) -> list[dict]:
    """Every logged value of every step, but the clock's."""
    return [{key: value for key, value in entry.items() if key not in CLOCK}
            for entry in json.loads((out / "trainer_state.json").read_text())["log_history"]]


def differences(logged: list[dict], expected: list[dict]) -> list[str]:
    return [f"step {index}: {key} {entry.get(key)} != {other.get(key)}"
            for index, (entry, other) in enumerate(zip(logged, expected, strict=True))
            for key in entry.keys() | other.keys() if entry.get(key) != other.get(key)]


@pytest.mark.parametrize("command", ["rloo", "ppo"])
def test_every_budget_generates_and_trains_the_same(command: str, tmp_path: Path) -> None:
    probes = {budget: launch(command, tmp_path / budget, budget) for budget in BUDGETS}

    # The same tokens on every rank at every budget; then the same training, to the last bit.
    for budget in BUDGETS:
        for rank in (0, 1):
            digests = [call["completions"] for call in probes[budget][rank]["per_call"]]
            assert digests == [call["completions"] for call in probes["1"][rank]["per_call"]], (budget, rank)
            assert len(digests) >= 2 and all(digests)
        assert differences(metrics(tmp_path / budget), metrics(tmp_path / "1")) == [], budget
        trained, gathered = weights(tmp_path / budget), weights(tmp_path / "1")
        assert trained.keys() == gathered.keys() and all(trained[k].equal(gathered[k]) for k in trained), budget
    if command == "ppo":  # every metric of TRL 1.12's PPO at each update; the policy saved alone, whole, trained
        steps = [entry for entry in metrics(tmp_path / "0") if "objective/scores" in entry]
        assert [entry["episode"] for entry in steps] == [8, 16] and all(set(PPO_METRICS) <= s.keys() for s in steps)
        initial = weights(RECIPES / "smoke" / "policy")
        assert weights(tmp_path / "0").keys() == initial.keys()
        assert any(not weight.equal(initial[name]) for name, weight in weights(tmp_path / "0").items())

    # The gathered share follows the budget: 1 gathers everything (PPO: the value model too, one engine); 0.5
    # gathers whole units once, at most half the policy, and at its peak holds more than 0 and less than 1.
    from rlhf_cli.models.hub import read_config
    from rlhf_cli.plan.model_sizes import model_size

    policy_bytes = 4 * model_size(read_config(str(RECIPES / "smoke" / "policy"))).params
    for rank in (0, 1):
        shares = {budget: probes[budget][rank]["peak_fraction"] for budget in BUDGETS}
        assert shares["0"] < shares["0.5"] < shares["1"] == 1.0, shares
        for call in probes["0.5"][rank]["per_call"]:
            assert 0 < call["budget_bytes"] <= policy_bytes / 2 and "model.layers.0" in call["budget_units"]
        assert all(call["budget_bytes"] == 0 for call in probes["0"][rank]["per_call"])
