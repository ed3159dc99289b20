"""The gather budget without launching: reading it, choosing units, the plan's and the ranks' choice agreeing,
flags against recipes, the plan's rows and `--gather auto`'s budget."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ARCHITECTURES, RECIPES, SEED, free_port, seed_run, write
from rlhf_cli.config.resolve import RunRequest, resolve
from rlhf_cli.errors import ConfigError
from rlhf_cli.generation.budget import Budget, BudgetError, Unit, choose, parse_budget
from rlhf_cli.models.hub import read_config
from rlhf_cli.plan import memory
from rlhf_cli.plan.estimate import plan_run, planned
from rlhf_cli.plan.model_sizes import model_size

pytestmark = pytest.mark.usefixtures("nothing_launches")
SMOKE_POLICY = RECIPES / "smoke" / "policy"


# -- reading a budget --------------------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "budget"), [
    (0.5, Budget(fraction=0.5)), ("0.25", Budget(fraction=0.25)), (1, Budget(fraction=1.0)),
    ("0", Budget(fraction=0.0)), ("2GiB", Budget(size=2 * 2**30)), ("500MB", Budget(size=500 * 10**6)),
])
def test_budgets_are_fractions_or_sizes(value, budget) -> None:
    assert parse_budget(value) == budget


@pytest.mark.parametrize(("value", "message"), [
    (3, "a fraction of the policy is from 0 to 1; a size needs its unit"),
    ("1.5", "a fraction of the policy is from 0 to 1"),
    (-0.1, "from 0 to 1"),
    ("lots", "'lots' is not a memory size"),
    (True, "not a gather budget"),
])
def test_bad_budgets_say_what_is_expected(value, message) -> None:
    with pytest.raises(BudgetError, match=message):
        parse_budget(value)


def test_a_budget_counts_parameter_elements() -> None:
    assert Budget(fraction=0.5).numel(1001, 2) == 500
    assert Budget(size=1000).numel(10**6, 2) == 500
    assert Budget(size=10**9).numel(1000, 2) == 1000  # never more than the policy
    assert Budget(fraction=1.0).whole and Budget(fraction=0.0).nothing and not Budget(size=1).nothing


# -- choosing units ------------------------------------------------------------------------------------------

def test_the_most_modules_per_parameter_come_first_each_that_still_fits() -> None:
    layer, embedding, norm = Unit("layer", 1000, 13), Unit("embedding", 500, 1), Unit("norm", 10, 1)
    units = [layer, layer, layer, embedding, norm]
    assert choose(units, 0) == []
    assert choose(units, 10) == [4]  # the norm: 1 module for 10 parameters
    assert choose(units, 1010) == [0, 4]  # then a layer (13 / 1000) before the embedding (1 / 500)
    assert choose(units, 1009) == [3, 4]  # no layer fits after the norm: the embedding does
    assert choose(units, 2100) == [0, 1, 4]  # the earlier layers first; the 90 left buy nothing more
    assert choose(units, 10**9) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_the_plan_counts_the_units_the_ranks_find(name: str) -> None:
    """The plan (config.json arithmetic) and the ranks (the real modules) see the same units in the same order,
    so they choose the same ones for any budget."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlhf_cli.rank.zero3 import policy_units

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**ARCHITECTURES[name]))
    ranks = [(unit.unit.numel, unit.unit.modules) for unit in policy_units(model)]
    plan = model_size(ARCHITECTURES[name]).units
    assert ranks == [(unit.numel, unit.modules) for unit in plan]
    assert sum(unit.numel for unit in plan) == sum(p.numel() for p in model.parameters())


def test_a_tied_lm_head_is_one_unit_with_its_embedding() -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlhf_cli.rank.zero3 import policy_units

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**ARCHITECTURES["llama-tied-bias"]))
    names = [unit.unit.name for unit in policy_units(model)]
    assert names == ["model.layers.0", "model.layers.1", "model.embed_tokens+lm_head", "model.norm"]


ZERO3_IDS_PROBE = """
import json, sys
import torch, deepspeed
from transformers import AutoConfig, AutoModelForCausalLM
from trl.models.utils import add_hooks, remove_hooks
from rlhf_cli.rank.zero3 import gathered_units, policy_units

deepspeed.init_distributed(dist_backend="gloo")
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**json.loads(sys.argv[1])))
engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters()), config={
    "train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
    "zero_force_ds_cpu_optimizer": False})
ids = lambda: [module.ds_id for module in engine.module.modules()]
tokens = torch.tensor([[1, 2, 3, 4, 5]])
found = {"start": ids()}
with torch.no_grad():
    reference = engine(tokens).logits
    units = policy_units(model)
    for _ in range(2):  # two budgeted generation calls: the tied embedding, a layer and the norm gathered
        with gathered_units(engine, [unit for unit in units if unit.unit.name != "model.layers.0"]):
            budgeted = engine(tokens).logits
    found["budget"] = ids()
    found["budget logits equal"] = torch.equal(budgeted, reference) and torch.equal(engine(tokens).logits, reference)
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):  # TRL's full gather
        remove_hooks(engine)
        add_hooks(engine)
    found["gather"] = ids()
engine.backward(engine(tokens, labels=tokens).loss)
engine.step()
print(json.dumps(found))
"""


def test_zero3_module_ids_stay_unique_when_hooks_are_put_back(tmp_path: Path) -> None:
    """DeepSpeed keys a module's fetches and releases by its ds_id. The gather budget takes ZeRO-3's hooks off
    the units it gathers and puts them back: the ids must come back as they were (re-registering numbered a
    unit's root like the last module registered). TRL's full gather renumbers the whole model, uniquely."""
    probe = write(tmp_path / "probe.py", ZERO3_IDS_PROBE)
    environment = {**os.environ, "DS_ACCELERATOR": "cpu", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
                   "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}
    done = subprocess.run([sys.executable, str(probe), json.dumps(ARCHITECTURES["llama-tied-bias"])],
                          env=environment, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(set(found["start"])) == len(found["start"])
    assert found["budget"] == found["start"]
    assert found["budget logits equal"]
    assert len(set(found["gather"])) == len(found["gather"])


# -- flags and recipes ------------------------------------------------------------------------------------------

def smoke(tmp_path: Path, body: str = "", **flags) -> RunRequest:
    recipe = write(tmp_path / "recipe.yaml", (RECIPES / "rloo" / "smoke.yaml").read_text().replace(
        "gather: true", body).replace("../smoke/", f"{RECIPES}/smoke/"))
    return RunRequest("rloo", str(recipe), flags)


def test_a_budget_generates_from_shards_and_gathers_its_part(tmp_path: Path) -> None:
    run = resolve(smoke(tmp_path, "gather: true", gather_budget=("--gather-budget", "0.5")), cuda=False)
    assert run.value("gather_budget") == 0.5 and run.settings["gather_budget"].source == "flag --gather-budget"
    assert run.value("ds3_gather_for_generation") is False  # the flag beats the recipe's gather: true
    assert run.settings["ds3_gather_for_generation"].source == "gather_budget 0.5"
    whole = resolve(smoke(tmp_path, "gather_budget: 1"), cuda=False)
    assert whole.value("ds3_gather_for_generation") is True
    size = resolve(smoke(tmp_path, "gather_budget: 2GiB"), cuda=False)
    assert size.value("gather_budget") == "2GiB" and size.value("ds3_gather_for_generation") is False


def test_a_gather_flag_beats_the_recipes_budget_with_a_note(tmp_path: Path) -> None:
    run = resolve(smoke(tmp_path, "gather_budget: 0.5", ds3_gather_for_generation=("--no-gather", False)),
                  cuda=False)
    assert "gather_budget" not in run.settings and run.value("ds3_gather_for_generation") is False
    assert "--no-gather overrides the recipe's gather_budget 0.5" in run.notes


@pytest.mark.parametrize(("body", "flags", "message"), [
    ("", {"ds3_gather_for_generation": ("--no-gather", False), "gather_budget": ("--gather-budget", "0.5")},
     "--gather-budget: gather_budget 0.5 contradicts --no-gather (gather: false is the budget 0); keep one"),
    ("", {"ds3_gather_for_generation": ("--gather", True), "gather_budget": ("--gather-budget", "2GiB")},
     "contradicts --gather (gather: true is the budget 1)"),
    ("", {"ds3_gather_for_generation": ("--gather auto", "auto"), "gather_budget": ("--gather-budget", "0.5")},
     "contradicts --gather auto (gather: auto lets the plan choose the budget)"),
    ("gather: false\ngather_budget: 0.5", {}, "recipe.yaml:13: gather_budget 0.5 contradicts "),
    ("", {"gather_budget": ("--gather-budget", "3")}, "a size needs its unit (2GiB)"),
])
def test_contradictions_and_bad_budgets_are_errors(tmp_path: Path, body, flags, message) -> None:
    with pytest.raises(ConfigError) as raised:
        resolve(smoke(tmp_path, body, **flags), cuda=False)
    assert len(raised.value.problems) == 1 and message in raised.value.problems[0], raised.value.problems


def test_the_cli_refuses_a_contradiction_in_one_line(cli) -> None:
    result = cli("rloo", "-r", "rloo/smoke", "--no-gather", "--gather-budget", "0.5", "--dry-run")
    assert result.exit_code == 2
    assert "Error: --gather-budget: gather_budget 0.5 contradicts --no-gather" in result.output


# -- the plan ----------------------------------------------------------------------------------------------

def test_gen_weights_are_the_units_bought_plus_what_zero3_keeps_live_of_the_rest(tmp_path: Path) -> None:
    run = resolve(smoke(tmp_path, "", gather_budget=("--gather-budget", "0.5")), cuda=False)
    plan = plan_run(run)
    chosen = plan.chosen
    assert chosen.candidate.generation.gather.budget == Budget(fraction=0.5) and chosen.candidate.mode == "budget 0.5"
    policy = model_size(read_config(str(SMOKE_POLICY)))
    bought = sum(policy.units[i].numel for i in choose(policy.units, policy.params // 2))
    assert 0 < bought <= policy.params // 2
    live = memory.live_parameters(policy.params - bought, 4, memory.DEFAULT_MAX_LIVE_PARAMETERS,
                                  policy.largest_layer)
    assert next(c.gpu for c in chosen.components if c.name == "gen weights") == bought * 4 + live


def test_a_budget_lies_between_no_gather_and_gather(seed_models) -> None:
    weights = {}
    for budget in ("0", "0.25", "0.5", "0.75", "1"):
        chosen = plan_run(seed_run(gather_budget=("--gather-budget", budget))).chosen
        weights[budget] = next(c.gpu for c in chosen.components if c.name == "gen weights")
    assert weights["0"] < weights["0.25"] < weights["0.5"] < weights["0.75"] < weights["1"]
    no_gather = plan_run(seed_run(ds3_gather_for_generation=("--no-gather", False))).chosen
    assert weights["0"] == next(c.gpu for c in no_gather.components if c.name == "gen weights")


def test_gather_auto_takes_the_largest_budget_that_fits(seed_models) -> None:
    run, plan = planned(seed_run(ds3_gather_for_generation=("--gather auto", "auto")))
    budget = run.value("gather_budget")
    assert run.value("ds3_gather_for_generation") is False and 0 < budget < 1
    source = run.settings["gather_budget"].source
    assert source.startswith("rlhf plan: gathering needs") and "of the policy needs" in source
    assert any(note.startswith(f"gather: auto -> budget {budget:.3g}") for note in run.notes)
    assert plan.chosen.fits and plan.chosen.candidate.generation.gather.budget == Budget(fraction=budget)
    # One more unit does not fit: the next budget up, planned as the run's own, is over the GPU.
    policy = plan.roles[0].size
    bought = sum(policy.units[i].numel for i in choose(policy.units, int(budget * policy.params)))
    layer = policy.units[0].numel
    more = plan_run(seed_run(gather_budget=("--gather-budget", str((bought + layer + 0.5) / policy.params))))
    assert not more.chosen.fits


def test_dry_run_shows_the_budget_auto_chose_and_why(cli, seed_models) -> None:
    result = cli("ppo", "-r", SEED, "--gpu-memory", "23.7GiB", "--num-gpus", "4", "--gather", "auto",
                 "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["trainer"]["ds3_gather_for_generation"] is False
    assert data["sources"]["gather_budget"].startswith("rlhf plan: gathering needs")
    assert any(note.startswith("gather: auto -> budget") for note in data["notes"])
    assert result.stderr.startswith("plan: gather 0.")  # the compact plan: the budget chosen and its peak
    assert [c["gather_budget"] for c in data["plan"]["configurations"] if c["chosen"]] != [None]


def test_the_plan_reports_the_largest_generation_batch_that_fits(seed_models) -> None:
    from dataclasses import replace

    from rlhf_cli.plan import estimate
    from rlhf_cli.plan.inputs import read_inputs

    run = seed_run(ds3_gather_for_generation=("--no-gather", False))
    plan = plan_run(run)
    largest = plan.largest_generation_batch
    assert largest and largest > plan.work.generation_batch
    inputs = read_inputs(run)
    for batch, fits in ((largest, True), (largest + 1, False)):
        sized = replace(inputs, work=replace(inputs.work, generation_batch=batch))
        assert estimate._column(sized, plan.chosen.candidate, True).fits is fits


def test_the_generation_value_reads_and_writes_the_recipe_keys() -> None:
    from rlhf_cli.generation.choice import Gather, Generation

    def read(**values: object) -> Generation:
        return Generation.from_values(lambda name: values.get(name))

    assert read(ds3_gather_for_generation=True).gather == Gather.whole
    assert read().gather == Gather.whole  # TRL's default: gather
    assert read(ds3_gather_for_generation="auto").gather == Gather.auto
    assert read(ds3_gather_for_generation=False).gather == Gather.shards
    assert read(ds3_gather_for_generation=False, gather_budget=0).gather == Gather.shards
    half = read(ds3_gather_for_generation=False, gather_budget=0.5)
    assert half.gather == Gather("budget", Budget(fraction=0.5)) and half.gather.through_shards
    assert half.trl_settings() == {"ds3_gather_for_generation": False, "gather_budget": 0.5}
    size = read(ds3_gather_for_generation=False, gather_budget="500MB")
    assert read(**size.trl_settings()) == size  # a size written as bytes reads back the same
    assert not Gather.whole.through_shards and not Gather.auto.through_shards
    assert Generation(Gather.auto).trl_settings() == {"ds3_gather_for_generation": "auto"}


def test_the_generation_value_holds_the_engine_and_writes_trls_vllm_keys() -> None:
    from rlhf_cli.generation.choice import Engine, Gather, Generation

    def read(**values: object) -> Generation:
        return Generation.from_values(lambda name: values.get(name))

    assert read().engine == Engine.hf and read(use_vllm=False, vllm_mode="server").engine == Engine.hf
    assert read(use_vllm=True).engine == Engine.colocate  # TRL's default mode
    server = read(use_vllm=True, vllm_mode="server", ds3_gather_for_generation=False, gather_budget=0.25)
    assert server.engine == Engine.server and server.gather == Gather.of(Budget(fraction=0.25))
    assert server.trl_settings() == {"ds3_gather_for_generation": False, "gather_budget": 0.25, "use_vllm": True,
                                     "vllm_mode": "server"}
    assert read(**server.trl_settings()) == server
    assert "use_vllm" not in read().trl_settings()  # generate: TRL's default, no key written
    assert server.describe() == "generate with vLLM server, its weights synced 0.25 of the policy at once"
    assert Generation(Gather.shards, Engine.colocate).describe().endswith("synced one unit at a time")
