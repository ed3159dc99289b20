"""The algorithm registry: every entry complete, every field checked, each algorithm's assets in place.

An entry that lacks a field fails here, not in a command: every field of `Algorithm` has a check below, and a
field added to `Algorithm` without one fails `test_every_field_has_a_check`.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers import RECIPES, REPO
from rlhf_cli.algorithms import ALGORITHMS, algorithm
from rlhf_cli.algorithms.spec import Algorithm, Batches, load_object, unset
from rlhf_cli.config.fields import ALIASES, catalogue
from rlhf_cli.generation.engines import ENGINES

ENTRIES = list(ALGORITHMS.values())
IDS = [entry.name for entry in ENTRIES]


def smoke_values(entry: Algorithm) -> Callable[[str], Any]:
    """The smoke recipe's values, else the field defaults: what a real run of the entry passes its functions."""
    recipe = yaml.safe_load((RECIPES / entry.name / "smoke.yaml").read_text())
    fields = catalogue(entry.name)
    values = {ALIASES.get(key, key): value for key, value in recipe.items()}
    return lambda key: values[key] if key in values else fields[key].default


def logged_metrics(entry: Algorithm) -> set[str]:
    """Every metric a real run of the algorithm logged (tests/fixtures/runs/NAME/trainer_state.json, and
    NAME_agent/ for an algorithm that takes tools)."""
    runs = [entry.name, *([f"{entry.name}_agent"] if entry.takes_tools else [])]
    states = [json.loads((REPO / "tests" / "fixtures" / "runs" / run / "trainer_state.json").read_text())
              for run in runs]
    return {key for state in states for log in state["log_history"] for key in log}


def is_config_dataclass(path: str) -> bool:
    return dataclasses.is_dataclass(load_object(path))


def _sync_hooks_complete(entry: Algorithm) -> bool:
    """A hook for every separate engine the algorithm can generate with (its TRL keys are the algorithm's), each a
    function in that engine's rank room taking the run's sync settings."""
    engines = {spec.name: spec for spec in ENGINES.values() if spec.distributions
               and set(spec.trl_keys) <= set(catalogue(entry.name))}
    return bool(engines) and set(entry.sync_hooks) == set(engines) and all(
        path.startswith(engines[name].faces["rank"] + ".") and callable(hook := load_object(path))
        and len(inspect.signature(hook).parameters) == 1 for name, path in entry.sync_hooks.items())


FIELD_CHECKS: dict[str, Callable[[Algorithm], bool]] = {
    "name": lambda e: (REPO / "rlhf_cli" / "schema" / f"{e.name}.json").is_file()
    and (RECIPES / e.name / "smoke.yaml").is_file(),
    "command": lambda e: e.command == e.name.replace("_", "-"),
    "summary": lambda e: len(e.summary) > 20,
    "example": lambda e: e.example.startswith(f"rlhf {e.command} -r {e.name}/"),
    "config_name": lambda e: bool(e.config_name),
    "config_class": lambda e: is_config_dataclass(e.config_class),
    "script_class": lambda e: is_config_dataclass(e.script_class),
    "builder": lambda e: callable(load_object(e.builder)),
    "trainer_class": lambda e: isinstance(load_object(e.trainer_class), type),
    "completion_field": lambda e: catalogue(e.name)[e.completion_field].kinds[0] == "int",
    "batch_fields": lambda e: bool(e.batch_fields) and all(catalogue(e.name)[f].kinds[0] == "int"
                                                           for f in e.batch_fields),
    "batches": lambda e: e.batches is not unset and all(
        n >= 1 for n in dataclasses.astuple(e.batches(smoke_values(e), 2))),
    "has_reference": lambda e: e.has_reference is not unset and isinstance(e.has_reference(smoke_values(e)), bool),
    "trains_value_model": lambda e: isinstance(e.trains_value_model, bool),
    "bf16_unless_told": lambda e: isinstance(e.bf16_unless_told, bool),
    "sequence_cap_field": lambda e: e.sequence_cap_field is None or e.sequence_cap_field in catalogue(e.name),
    "step_work": lambda e: e.step_work is not unset and (lambda work: work.trained >= 1 and work.generated > 0
                                                          and 0 < work.syncs <= 1)(e.step_work(smoke_values(e))),
    "logits": lambda e: e.logits is not None and (e.logits.fused_head or e.logits.sequence_copies > 0),
    "headline_metrics": lambda e: bool(e.headline_metrics)
    and e.headline_metrics[0][0] in logged_metrics(e),  # the first is the score every logging step carries
    "renamed": lambda e: all(new in catalogue(e.name) and old != new for old, new in e.renamed.items()),
    "retired": lambda e: all(old not in catalogue(e.name) and advice for old, advice in e.retired.items()),
    "starter": lambda e: bool(e.starter) and all(line.key in catalogue(e.name) for line in e.starter),
    "starter_models": lambda e: all(line.key in catalogue(e.name) for line in e.starter_models),
    "checks": lambda e: e.checks(smoke_values(e), 2) == [],
    "reward_keywords": lambda e: {"prompts", "completions", "completion_ids"} <= set(e.reward_keywords),
    # a trainer that takes tools has TRL's turn limit for them, and a bundled recipe that calls one
    "takes_tools": lambda e: e.takes_tools == ("max_tool_calling_iterations" in catalogue(e.name))
    and e.takes_tools == (RECIPES / e.name / "agent-smoke.yaml").is_file(),
    "sync_hooks": lambda e: _sync_hooks_complete(e),
}


def test_every_field_has_a_check() -> None:
    assert set(FIELD_CHECKS) == {field.name for field in dataclasses.fields(Algorithm)}


@pytest.mark.parametrize("field", sorted(FIELD_CHECKS))
@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_entry_field(entry: Algorithm, field: str) -> None:
    assert FIELD_CHECKS[field](entry), f"{entry.name}: registry field `{field}` is missing or wrong"


def test_a_missing_field_fails_its_check_not_the_import() -> None:
    incomplete = Algorithm(name="ppo", command="ppo")  # builds: a command reading it would fail, this test first
    failing = {field for field, check in FIELD_CHECKS.items() if not _passes(check, incomplete)}
    assert failing >= {"summary", "example", "config_class", "builder", "trainer_class", "completion_field",
                       "batch_fields", "batches", "step_work", "has_reference", "headline_metrics", "starter",
                       "logits", "sync_hooks"}


def _passes(check: Callable[[Algorithm], bool], entry: Algorithm) -> bool:
    try:
        return check(entry)
    except Exception:  # noqa: BLE001 - any failure of a check on an incomplete entry counts as failing
        return False


def test_commands_and_names_find_the_same_entry() -> None:
    for entry in ENTRIES:
        assert algorithm(entry.name) is algorithm(entry.command) is entry


def test_every_headline_metric_is_logged_by_its_algorithm() -> None:
    for entry in ENTRIES:
        logged = logged_metrics(entry)
        # `kl` is logged only when a reference model exists (beta != 0); GRPO's default has none.
        missing = {key for key, _ in entry.headline_metrics if key not in logged and key != "kl"}
        assert not missing, (entry.name, missing)


def test_each_algorithm_has_a_pythia_recipe_that_parses() -> None:
    for entry in ENTRIES:
        recipe = RECIPES / entry.name / "pythia-12b-descriptiveness.yaml"
        values = yaml.safe_load(recipe.read_text())
        assert values["model_name_or_path"] == "EleutherAI/pythia-12b", recipe


def test_batches_follow_the_trainers(tmp_path: Path) -> None:
    """Per process: PPO generates in chunks of local_rollout_forward_batch_size; TRL's generating trainers one
    generation batch of steps_per_generation micro-batches; online DPO two completions per prompt."""
    def values(**given: Any) -> Callable[[str], Any]:
        return lambda key: given.get(key)

    ppo = algorithm("ppo").batches(values(per_device_train_batch_size=2, gradient_accumulation_steps=4,
                                          num_mini_batches=2, local_rollout_forward_batch_size=4), 2)
    assert ppo == Batches(generation=4, train=2, score=4)
    for name in ("rloo", "grpo"):
        entry = algorithm(name)
        assert entry.batches(values(per_device_train_batch_size=4, gradient_accumulation_steps=2), 8) == \
            Batches(generation=8, train=4, score=4)
        assert entry.batches(values(per_device_train_batch_size=4, generation_batch_size=64), 8).generation == 8
    assert algorithm("online_dpo").batches(values(per_device_train_batch_size=3), 2) == Batches(6, 6, 6)


def test_step_work_follows_the_trainers() -> None:
    """Per process and optimizer step: PPO's update is num_ppo_epochs x num_mini_batches steps over its rollouts;
    RLOO always takes old log-probs, GRPO only when generation and steps misalign or with vLLM's correction;
    online DPO generates and trains two completions per prompt of every micro-batch."""
    def values(**given: Any) -> Callable[[str], Any]:
        return lambda key: given.get(key)

    ppo = algorithm("ppo").step_work(values(per_device_train_batch_size=2, gradient_accumulation_steps=4,
                                            num_mini_batches=2, num_ppo_epochs=4))
    assert (ppo.generated, ppo.trained, ppo.syncs, ppo.old_logprobs) == (1.0, 4, 1 / 8, True)
    aligned = values(per_device_train_batch_size=4, gradient_accumulation_steps=2, num_iterations=1,
                     vllm_importance_sampling_correction=True)
    rloo, grpo = (algorithm(name).step_work(aligned) for name in ("rloo", "grpo"))
    assert rloo.generated == grpo.generated == 8 and rloo.old_logprobs and not grpo.old_logprobs
    assert grpo.old_logprobs_with_vllm and grpo.syncs == 1
    reused = algorithm("grpo").step_work(values(per_device_train_batch_size=4, gradient_accumulation_steps=2,
                                                num_iterations=2, steps_per_generation=2))
    assert (reused.generated, reused.trained, reused.syncs, reused.old_logprobs) == (4.0, 8, 0.5, True)
    dpo = algorithm("online_dpo").step_work(values(per_device_train_batch_size=3, gradient_accumulation_steps=2))
    assert (dpo.generated, dpo.trained, dpo.old_logprobs) == (12, 12, False)


@pytest.mark.parametrize("command", ["rloo", "grpo"])
def test_generation_groups_are_checked_before_launch(cli, command: str) -> None:
    """TRL would stop every rank at start-up; here the mistake is one line, exit 2, and a value that fits."""
    result = cli(command, "-r", f"{command}/smoke", "--set", "num_generations=3", "--dry-run")
    assert result.exit_code == 2
    assert "`num_generations` (3) must divide the generation batch (4 = per_device_train_batch_size x processes " \
           "x steps per generation): set num_generations to 2, or per_device_train_batch_size to a multiple of 3" \
        in " ".join(result.output.split())
    assert "at least 2" in cli(command, "-r", f"{command}/smoke", "--set", "num_generations=1", "--dry-run").output
    both = cli(command, "-r", f"{command}/smoke", "--set", "generation_batch_size=8", "--set",
               "steps_per_generation=2", "--dry-run")
    assert "cannot both be set" in both.output and both.exit_code == 2
