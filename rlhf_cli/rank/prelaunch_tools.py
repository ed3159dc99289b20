"""What GRPOTrainer would refuse, or trip over mid-run, about a recipe's tools, found by the pre-launch check.

TRL turns each tool into a JSON schema with transformers' `get_json_schema` when it renders a prompt (a missing
type hint or docstring line fails then, on every rank, after the models have loaded); it builds one environment
at start-up to find its methods; and it checks the policy's chat template: that it renders a tool-calling
conversation (`supports_tool_calling`), that it preserves prefixes (else it swaps in a training template of its
own, when it has one) and that a response parser is known for it (`add_response_schema`). The same calls are made
here, once, in the pre-launch check's own process (rlhf_cli/rank/prelaunch.py).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlhf_cli.algorithms import algorithm
from rlhf_cli.rank.inputs import RankInputs, load_code


def one_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {' '.join(str(error).split()) or 'no message'}"


def _loaded(label: str, spec: str, problems: list[str]) -> Any:
    try:
        loaded = load_code(spec)
    except (Exception, SystemExit) as error:  # noqa: BLE001 - whatever the user's module raises is the problem
        problems.append(f"{label}: {spec}: importing it failed ({one_line(error)}); fix the module")
        return None
    if not callable(loaded):
        problems.append(f"{label}: {spec} is a {type(loaded).__name__}, not a function or class")
        return None
    return loaded


def schema_problem(function: Callable) -> str | None:
    """Why transformers cannot describe `function` as a tool (which argument lacks a type hint or an Args: line)."""
    from transformers.utils import get_json_schema

    try:
        get_json_schema(function)
    except Exception as error:  # noqa: BLE001 - TypeHintParsingException, DocstringParsingException, ValueError
        return (f"transformers cannot turn it into a tool schema ({' '.join(str(error).split())}); give every "
                "argument a type hint and a line in the docstring's Args: section")
    return None


def tool_problems(specs: list[str]) -> list[str]:
    """Why a tool of `tools` would never be called as meant: TRL keeps tools by name (a second one of a name hides
    the first) and calls each with the model's arguments as keywords (a `*args` parameter is never filled)."""
    problems: list[str] = []
    named: dict[str, str] = {}
    for spec in specs:
        tool = _loaded("`tools`", spec, problems)
        if tool is None:
            continue
        if problem := schema_problem(tool) or _keyword_problem(tool):
            problems.append(f"`tools`: {spec}: {problem}")
            continue  # one problem a tool: its name matters once it is callable
        name = getattr(tool, "__name__", spec)
        if name in named:
            problems.append(f"`tools`: {named[name]} and {spec} are both named `{name}`: the model calls tools by "
                            "name, so the second hides the first; rename one")
        named.setdefault(name, spec)
    return problems


def _keyword_problem(tool: Callable) -> str | None:
    try:
        parameters = inspect.signature(tool).parameters.values()
    except (TypeError, ValueError):
        return None  # no readable signature: the schema check spoke for it
    if any(parameter.kind is inspect.Parameter.VAR_POSITIONAL for parameter in parameters):
        return ("it takes *args, which a tool call never fills (the model's arguments come as keywords); name each "
                "argument")
    return None


def _environment_problems(label: str, spec: str, row: dict[str, Any]) -> tuple[list[str], bool]:
    """(problems, whether it owns a reward): the class builds with no arguments, has `reset`, which takes `row`
    (the keyword arguments GRPOTrainer passes it) and returns, and each public method is a valid tool."""
    problems: list[str] = []
    factory = _loaded(label, spec, problems)
    if factory is None:
        return problems, False
    try:
        instance = factory()
    except Exception as error:  # noqa: BLE001 - the user's constructor
        return [f"{label}: {spec}: building one failed ({one_line(error)}); GRPOTrainer builds it with no "
                "arguments, once per rollout"], False
    methods = dict(inspect.getmembers(type(instance), predicate=inspect.isfunction))
    if "reset" not in methods:
        problems.append(f"{label}: {spec} has no `reset` method; GRPOTrainer calls reset(**row) before each rollout")
    elif problem := _reset_problem(instance.reset, row):
        problems.append(f"{label}: {spec}: {problem}")
    for name in sorted(methods):
        if name in ("reset", "get_reward") or name.startswith("_"):
            continue
        if problem := schema_problem(getattr(instance, name)):
            problems.append(f"{label}: {spec}: method `{name}` is a tool, and {problem} (or make it _private)")
    return problems, "get_reward" in methods


def _reset_problem(reset: Callable, row: dict[str, Any]) -> str | None:
    """Why GRPOTrainer's `reset(**row)` would fail: it cannot take the row's columns, or it raises on one."""
    shown = ", ".join(row)
    try:
        inspect.signature(reset).bind(**row)
    except TypeError as error:
        return (f"reset cannot take the dataset row GRPOTrainer passes it as keywords ({shown}): {error}; write "
                "reset(self, **kwargs)")
    except ValueError:
        pass  # no readable signature: calling it says
    try:
        reset(**row)
    except Exception as error:  # noqa: BLE001 - the user's code
        return f"reset(**row) raised {one_line(error)} on the dataset's first row ({shown}); fix reset"
    return None


def _rollout_problems(spec: str) -> list[str]:
    """The rollout function imports and takes what GRPOTrainer passes it: rollout_func(prompts, trainer)."""
    problems: list[str] = []
    function = _loaded("`rollout_func`", spec, problems)
    if function is None:
        return problems
    try:
        inspect.signature(function).bind(None, None)
    except TypeError as error:
        problems.append(f"`rollout_func`: {spec} cannot be called as GRPOTrainer calls it, rollout_func(prompts, "
                        f"trainer): {error}; give it both arguments")
    except ValueError:
        pass
    return problems


def template_problems(processing_class: Any, model: str) -> list[str]:
    """The chat template renders tool calls, keeps prefixes (or TRL can swap it), and has a response parser."""
    from trl.chat_template_utils import (
        add_response_schema,
        get_training_chat_template,
        is_chat_template_prefix_preserving,
        supports_tool_calling,
    )

    where = f"`model_name_or_path` ({model})"
    if not supports_tool_calling(processing_class):
        return [f"{where}: its chat template cannot render a tool-calling conversation (TRL's supports_tool_calling: "
                "user -> assistant with tool_calls -> tool); use a model whose template does (Qwen 2.5, Llama 3.1)"]
    problems = []
    if not is_chat_template_prefix_preserving(processing_class):
        try:
            swapped = get_training_chat_template(processing_class)
        except ValueError:
            swapped = None
        if swapped is None:
            problems.append(f"{where}: its chat template is not prefix-preserving (an earlier turn renders "
                            "differently once a tool result follows) and TRL has no training template for it")
    tokenizer = getattr(processing_class, "tokenizer", processing_class)
    if getattr(tokenizer, "response_template", None) is None and getattr(tokenizer, "response_schema", None) is None:
        try:
            add_response_schema(processing_class)
        except ValueError:
            problems.append(f"{where}: its tokenizer has no response schema to parse tool calls with and TRL knows "
                            "none for its chat template; set `response_template` in its tokenizer_config.json")
    return problems


def agent_problems(inputs: RankInputs, step: Callable[[str], None]) -> list[str]:
    """Every problem with the recipe's tools, environments, rollout function and the policy's chat template, and
    a recipe whose only reward would be an environment's that has none."""
    if not algorithm(inputs.algorithm).takes_tools:
        return []  # only GRPO's recipes have these keys (resolution refuses them elsewhere)
    problems: list[str] = []
    tools = inputs.script_value("tools") or []
    if tools:
        step("checking tools")
        problems += tool_problems(tools)
    factory = inputs.script_value("environment_factory")
    owns_reward = False
    if factory:
        step("building an environment")
        named = factory.items() if isinstance(factory, dict) else [(None, factory)]
        for name, spec in named:
            label = "`environment_factory`" if name is None else f"`environment_factory.{name}`"
            found, rewards = _environment_problems(label, spec, reset_row(inputs, name))
            problems += found
            owns_reward |= rewards
        if not (owns_reward or inputs.script_value("reward_funcs") or inputs.script_value("reward_model_name_or_path")):
            problems.append("no reward: `environment_factory` has no get_reward method and the recipe sets no "
                            "`reward_funcs` or reward model; add one (TRL scores a rollout by get_reward() alone "
                            "only when the environment has it)")
    if inputs.script_value("rollout_func"):
        problems += _rollout_problems(inputs.script_value("rollout_func"))
    if tools or factory:
        step("checking the chat template for tool calls")
        problems += _policy_template_problems(inputs)
    return problems


def reset_row(inputs: RankInputs, environment: str | None) -> dict[str, Any]:
    """What GRPOTrainer passes `reset` as keywords: a dataset row (the first of the environment's, in a local
    file) with its prompt column named `prompt`, without the `environment` column that picked it; without a
    dataset (the environment owns the data) TRL's placeholder row, an empty prompt."""
    from rlhf_cli.config.data_files import DataFileError, first_rows

    placeholder = {"prompt": [{"role": "user", "content": ""}]}
    name = inputs.script_value("dataset_name")
    if name is None or not Path(name).is_file():
        return placeholder  # no dataset, or one only `datasets` reads: the prompt is the one column known
    try:
        _, rows = first_rows(Path(name))
    except (DataFileError, KeyError):
        return placeholder
    rows = [row for _, row in rows if isinstance(row, dict)]
    if not rows:
        return placeholder
    row = next((row for row in rows if environment is not None and row.get("environment") == environment), rows[0])
    column = inputs.script_value("dataset_prompt_column")
    row = {("prompt" if key == column else key): value for key, value in row.items()}
    return {key: value for key, value in row.items() if environment is None or key != "environment"}


def _policy_template_problems(inputs: RankInputs) -> list[str]:
    """The policy's processing class as GRPOTrainer loads it; a model that cannot be read here is the ranks' to
    report (a hub id without network, say)."""
    from transformers import AutoProcessor

    model = inputs.model_value("model_name_or_path")
    try:
        processing_class = AutoProcessor.from_pretrained(
            model, revision=inputs.model_value("model_revision"), padding_side="left",
            trust_remote_code=bool(inputs.trainer.get("trust_remote_code")))
    except Exception:  # noqa: BLE001 - unreadable here; loading the policy reports it with its own message
        return []
    return template_problems(processing_class, model)
