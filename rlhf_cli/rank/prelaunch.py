"""The pre-launch check, run by the launcher in a process of its own just before it starts the ranks:
`python -m rlhf_cli.rank.prelaunch` reads {algorithm, values, processes} as JSON on stdin and writes
{"problems": [...]} as JSON on stdout.

It does once what every rank would do first, and would die of on every rank: import each reward function and
check that it takes the arguments the trainer passes; import each tool and environment and check that
transformers can describe it and the policy's chat template can render its calls (rlhf_cli/rank/prelaunch_tools.py);
and build the trainer's config (TRL's dataclass, ours for PPO) from the resolved values, where its __post_init__
checks them. Its own process, because both run code the
CLI must not: the user's modules (which may import torch, print, or hang: the launcher gives this process a time
limit) and TRL with torch (which the CLI never imports). The config is built detached from any device
(`compat.detached_config_class`), so this process starts no process group and takes no GPU.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlhf_cli.algorithms import algorithm
from rlhf_cli.algorithms.spec import load_object
from rlhf_cli.output.run_dir import PRELAUNCH_STEP_MARK
from rlhf_cli.rank.inputs import RankInputs, load_reward_function
from rlhf_cli.rank.prelaunch_models import classifier_problems
from rlhf_cli.rank.prelaunch_tools import agent_problems, one_line

# TRL's reward functions that import a package only when first called (`trl.rewards.accuracy_rewards`)
TRL_REWARD_PACKAGES = {"accuracy_reward": "math_verify", "reasoning_accuracy_reward": "math_verify"}


def _step(text: str) -> None:
    print(f"{PRELAUNCH_STEP_MARK}{text}", file=sys.stderr, flush=True)


def dataset_columns(inputs: RankInputs) -> tuple[str, ...] | None:
    """The columns TRL passes each reward function besides its own arguments: the dataset's, less the prompt
    (and `completion`, `completion_ids`, which TRL leaves out); None when they cannot be known here (a hub
    dataset, a mixture). An environment that owns its data has none."""
    from rlhf_cli.config.data_files import DataFileError, first_rows

    name = inputs.script_value("dataset_name")
    if name is None and not inputs.script_value("datasets"):
        return ()
    if not isinstance(name, str) or not Path(name).is_file():
        return None
    try:
        columns, _ = first_rows(Path(name))
    except (DataFileError, KeyError):
        return None  # the resolver said what is wrong with the file; an unknown suffix is `datasets`' to read
    if not columns:
        return None  # a first row too long to read here
    prompt = inputs.script_value("dataset_prompt_column")
    return tuple(c for c in columns if c not in (prompt, "prompt", "completion", "completion_ids"))


def reward_keywords(inputs: RankInputs) -> tuple[tuple[str, ...], bool]:
    """(the keyword arguments GRPOTrainer's `_calculate_rewards` passes every reward function, whether the
    dataset's columns among them are all known): TRL's own, the dataset's columns, and `environments` when the
    recipe has an environment_factory."""
    keywords = algorithm(inputs.algorithm).reward_keywords
    if algorithm(inputs.algorithm).takes_tools and inputs.script_value("environment_factory"):
        keywords += ("environments",)
    columns = dataset_columns(inputs)
    return keywords + tuple(column for column in columns or () if column not in keywords), columns is not None


def binding_problem(function: Callable, keywords: tuple[str, ...], columns_known: bool) -> str | None:
    """Why `function` cannot be called with `keywords`, as TRL calls it; None when it can, or when its
    signature cannot be read (a builtin). With the dataset's columns unknown, an argument TRL does not pass
    itself may be one of them."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(**dict.fromkeys(keywords))
        return None
    except TypeError as error:
        if columns_known:
            return str(error)
    try:
        signature.bind_partial(**dict.fromkeys(keywords))
        return None
    except TypeError as error:
        return str(error)


def reward_function_problems(inputs: RankInputs) -> list[str]:
    """Each reward function imports, is callable, and takes the keyword arguments the trainer passes."""
    keywords, columns_known = reward_keywords(inputs)
    problems = []
    for spec in inputs.script_value("reward_funcs") or []:
        _step(f"importing reward function {spec}")
        try:
            function = load_reward_function(inputs.algorithm, spec)
        except (Exception, SystemExit) as error:  # noqa: BLE001 - whatever the user's module raises is the problem
            problems.append(f"`reward_funcs`: {spec}: importing it failed ({one_line(error)}); fix the module")
            continue
        if not callable(function):
            problems.append(f"`reward_funcs`: {spec} is a {type(function).__name__}, not a function")
            continue
        if (problem := binding_problem(function, keywords, columns_known)) is not None:
            problems.append(f"`reward_funcs`: {spec} cannot take the arguments the trainer passes "
                            f"({', '.join(keywords)}): {problem}; give it those it uses and **kwargs")
        elif (package := TRL_REWARD_PACKAGES.get(getattr(function, "__name__", ""))) and \
                getattr(function, "__module__", "").startswith("trl.") and importlib.util.find_spec(package) is None:
            problems.append(f"`reward_funcs`: {spec} needs the `{package}` package, which is not installed: "
                            f"pip install {package.replace('_', '-')}")
    return problems


def trainer_config_problem(inputs: RankInputs, processes: int) -> str | None:
    """Build the trainer's config as a rank of a `processes`-process run would; what it refuses, in one line."""
    from rlhf_cli import compat

    entry = algorithm(inputs.algorithm)
    _step(f"building {entry.config_name}")
    config_class = compat.detached_config_class(load_object(entry.config_class), processes)
    try:
        config_class(**inputs.config_values())
    except Exception as error:  # noqa: BLE001 - the config's own validation: any type it raises is the message
        return f"{entry.config_name} refuses these values: {one_line(error)}"
    return None


def check(payload: dict[str, Any]) -> list[str]:
    inputs = RankInputs.from_values(payload["algorithm"], payload["values"])
    inputs.hide_unused_engines()
    problems = reward_function_problems(inputs) + agent_problems(inputs, _step) + classifier_problems(inputs)
    config_problem = trainer_config_problem(inputs, payload["processes"])
    return problems + ([config_problem] if config_problem else [])


def main() -> int:
    result = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # what user code and libraries print goes to stderr
    problems = check(json.load(sys.stdin))
    json.dump({"problems": problems}, result)
    result.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
