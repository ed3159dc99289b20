"""The all-gathers the time plan counts for one generate call under each gather choice, from a model's config.json:
persistent parameters never fetched, a gather one all-gather per partitioned parameter, the first forward one per
fetched module, each later forward one per prefetch group (rlhf_cli/plan/fetches.py)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from helpers import MODEL_CONFIGS, RECIPES
from rlhf_cli.algorithms import algorithm
from rlhf_cli.config.resolve import RunRequest, resolve
from rlhf_cli.generation.budget import Budget, bought, bought_total
from rlhf_cli.generation.choice import Gather, Generation
from rlhf_cli.machine import calibration
from rlhf_cli.plan import time
from rlhf_cli.plan.estimate import plan_run
from rlhf_cli.plan.fetches import PREFETCH_BUCKET, ZeroSettings, generation_gathers
from rlhf_cli.plan.inputs import read_inputs
from rlhf_cli.plan.model_sizes import model_size

pytestmark = pytest.mark.usefixtures("nothing_launches")  # no test here starts ranks

LLAMA_MODULES_PER_LAYER = 9  # q, k, v, o, gate, up, down and two norms, each holding its own weight


def smoke_policy():
    return model_size(json.loads((RECIPES / "smoke" / "policy" / "config.json").read_text()))


def test_the_smoke_policy_persists_whole_so_no_choice_gathers_anything_while_generating() -> None:
    """No all-gather in generation (a probe of the smoke run found none but one prefetch by the training's stale
    trace); after it, the next forward fetches again what a gather released: all 21 modules, the budget's 10
    (the probe: 21 and 10 more all-gathers between generations than no-gather's)."""
    policy = smoke_policy()
    config = json.loads((RECIPES / "smoke" / "policy" / "config.json").read_text())
    assert policy.largest_layer <= 100_000  # every parameter under DeepSpeed's default persistence threshold
    budget = policy.params // 2
    bought_units = [part.unit for part, count in bought(policy.stretches, budget) for _ in range(count)]
    modules = {"whole": LLAMA_MODULES_PER_LAYER * config["num_hidden_layers"] + 3,
               "budget": sum(len(unit.module_numels) for unit in bought_units), "none": 0}
    for name, gathered, numel in (("whole", Gather.whole, None), ("budget", Gather.of(Budget(fraction=0.5)), budget),
                                  ("none", Gather.shards, None)):
        counted = generation_gathers(policy, gathered, numel, ZeroSettings())
        assert (counted.once, counted.per_pass, counted.hooked_numel) == (0, 0, 0)
        assert counted.released == modules[name]
    assert 0 < modules["budget"] < modules["whole"]


def test_without_persistence_each_choice_counts_its_modules() -> None:
    """The counts a probe of the smoke run found with stage3_param_persistence_threshold=0: 21 at a gather's entry;
    the budget's 10 units' parameters plus the rest's 11 modules in the first forward; every module in no-gather's
    first forward, and one prefetch group per later forward (the whole model is under one bucket)."""
    policy = smoke_policy()
    config = json.loads((RECIPES / "smoke" / "policy" / "config.json").read_text())
    modules = LLAMA_MODULES_PER_LAYER * config["num_hidden_layers"] + 3  # the embedding, final norm, LM head
    settings = ZeroSettings(persistence_threshold=0)
    whole = generation_gathers(policy, Gather.whole, None, settings)
    assert (whole.once, whole.per_pass, whole.hooked_numel) == (modules, 0, 0)
    shards = generation_gathers(policy, Gather.shards, None, settings)
    assert (shards.once, shards.per_pass, shards.hooked_numel) == (modules, 1, policy.params)
    budget = policy.params // 2
    spent = generation_gathers(policy, Gather.of(Budget(fraction=0.5)), budget, settings)
    numel, _ = bought_total(policy.stretches, budget)
    assert (spent.once, spent.per_pass, spent.hooked_numel) == (modules, 1, policy.params - numel)


def test_small_prefetch_buckets_fetch_each_large_module_on_its_own() -> None:
    policy = smoke_policy()
    config = json.loads((RECIPES / "smoke" / "policy" / "config.json").read_text())
    bounded = ZeroSettings(persistence_threshold=0, prefetch_bucket=2000, max_live_parameters=20000)
    large = 7 * config["num_hidden_layers"] + 2  # every linear, the embedding and the LM head exceed 2000 elements
    norms = (2 * config["num_hidden_layers"] + 1) * config["hidden_size"]
    assert generation_gathers(policy, Gather.shards, None, bounded).per_pass == large + math.ceil(norms / 2000)
    assert generation_gathers(policy, Gather.shards, None, ZeroSettings(0, 10**9, 2000)).per_pass == \
        generation_gathers(policy, Gather.shards, None, bounded).per_pass  # the live limit bounds a group too


def test_a_7b_model_prefetches_its_partitioned_weights_in_buckets() -> None:
    config = json.loads((MODEL_CONFIGS / "llama-2-7b" / "config.json").read_text())
    policy = model_size(config)
    norms = (2 * config["num_hidden_layers"] + 1) * config["hidden_size"]  # persistent: under the threshold
    shards = generation_gathers(policy, Gather.shards, None, ZeroSettings())
    assert shards.hooked_numel == policy.params - norms
    assert shards.once == (LLAMA_MODULES_PER_LAYER - 2) * config["num_hidden_layers"] + 2
    table = config["vocab_size"] * config["hidden_size"]  # the embedding and the LM head: a group each
    assert config["hidden_size"] * config["intermediate_size"] < PREFETCH_BUCKET <= table  # a layer's modules share
    assert shards.per_pass == 2 + math.ceil((policy.params - norms - 2 * table) / PREFETCH_BUCKET)
    assert generation_gathers(policy, Gather.whole, None, ZeroSettings()).per_pass == 0


@pytest.mark.parametrize("gather", [Gather.whole, Gather.of(Budget(fraction=0.5)), Gather.shards])
@pytest.mark.parametrize("threshold", [None, 0])
def test_the_plan_charges_each_counted_all_gather_at_the_calibrated_latency(monkeypatch, gather, threshold) -> None:
    """The smoke recipe's generation seconds move with the calibrated all-gather latency by exactly the counted
    all-gathers of its generate calls: none at DeepSpeed's default persistence threshold, every one without it."""
    def generation(latency: float) -> tuple[float, object]:
        measured = calibration.Calibration("cpu", 240e9, 87.5e9, 0.4e9, latency, "gloo", 0.0, "here", 5e-6)
        monkeypatch.setattr("rlhf_cli.plan.hardware.remembered", lambda: measured)
        monkeypatch.setattr("rlhf_cli.plan.hardware.detected", lambda: (None, ""))
        sets = () if threshold is None else (f"stage3_param_persistence_threshold={threshold}",)
        run = resolve(RunRequest("rloo", "rloo/smoke", {}, sets, planning=True), cuda=False)
        inputs, plan = read_inputs(run), plan_run(run)
        candidate = replace(plan.chosen.candidate, generation=Generation(gather))
        seconds = time.step_time(inputs, candidate, inputs.hardware.gpu, plan.checkpoint_bytes)["generation"]
        return seconds, inputs

    low, inputs = generation(1e-4)
    high, _ = generation(3e-4)
    policy, work = inputs.roles[0].size, inputs.work
    budget = gather.budget.numel(policy.params, work.element_bytes) if gather.budget else None
    counted = generation_gathers(policy, gather, budget, ZeroSettings(persistence_threshold=threshold))
    per_call = counted.once + (work.completion_length - 1) * counted.per_pass
    assert (threshold is None) == (per_call == 0)
    generate_calls = algorithm(inputs.algorithm).step_work(inputs.value).generated / work.generation_batch
    assert high - low == pytest.approx(2e-4 * per_call * generate_calls, abs=1e-12)
