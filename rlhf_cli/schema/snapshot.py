"""Write the field catalogues that let the CLI validate recipes without importing TRL.

`rlhf --help` and `--dry-run` must stay fast, so they read a JSON snapshot of TRL's
dataclasses instead of importing them. This module (which does import TRL) writes that
snapshot; a test regenerates it and fails when the installed TRL disagrees.

    python -m rlhf_cli.schema.snapshot      # rewrite rlhf_cli/schema/*.json
"""

from __future__ import annotations

import dataclasses
import enum
import json
import types
import typing
from pathlib import Path
from typing import Any

SCHEMA_DIR = Path(__file__).parent
HELP_CHARS = 160


def _algorithm_dataclasses() -> dict[str, dict[str, tuple[type, ...]]]:
    """The dataclasses whose fields make up a recipe, per algorithm and per group: what TRL's own scripts parse
    from a config file (script arguments with the dataset mixture, model, trainer)."""
    import warnings

    warnings.filterwarnings("ignore", message=".*trl.experimental.*")
    from trl import DatasetMixtureConfig, ModelConfig

    from rlhf_cli.algorithms import ALGORITHMS
    from rlhf_cli.algorithms.spec import load_object

    return {name: {"script": (load_object(entry.script_class), DatasetMixtureConfig), "model": (ModelConfig,),
                   "trainer": (load_object(entry.config_class),)} for name, entry in ALGORITHMS.items()}


def _kinds(annotation: Any) -> tuple[list[str], list[Any] | None]:
    """Map a type annotation to the YAML kinds it accepts, plus its fixed choices if any."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        arms = typing.get_args(annotation)
        kinds: list[str] = []
        choices: list[Any] | None = None
        for arm in arms:
            arm_kinds, arm_choices = _kinds(arm)
            kinds += [k for k in arm_kinds if k not in kinds]
            # `SchedulerType | str` still means one of the enum's values; `str | Literal[False]` means any string.
            is_enum = isinstance(arm, type) and issubclass(arm, enum.Enum)
            if arm_choices is not None and (is_enum or str not in arms):
                choices = (choices or []) + arm_choices
        return kinds, choices
    if origin is typing.Literal:
        values = list(typing.get_args(annotation))
        kinds = []
        for value in values:
            kind = "null" if value is None else type(value).__name__
            if kind not in kinds:
                kinds.append(kind)
        return kinds, values
    if annotation is type(None):
        return ["null"], None
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return ["str"], [member.value for member in annotation]
    if annotation in (bool, int, float, str):
        return [annotation.__name__], None
    if origin in (list, tuple) or annotation in (list, tuple):
        return ["list"], None
    if origin is dict or annotation is dict:
        return ["dict"], None
    return ["any"], None


def _default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        return None
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return list(value)
    try:
        json.dumps(value)
    except TypeError:
        return repr(value)
    return value


def _first_sentence(text: str) -> str:
    text = " ".join(text.split())
    end = text.find(". ")
    text = text if end < 0 else text[: end + 1]
    return text if len(text) <= HELP_CHARS else text[: HELP_CHARS - 1] + "…"


def _report_targets() -> list[str]:
    """What `report_to` takes: transformers' integrations, `all` and `none`."""
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

    return ["all", "none", *sorted(INTEGRATION_TO_CALLBACK)]


def describe(groups: dict[str, tuple[type, ...]]) -> dict[str, dict[str, Any]]:
    """One entry per field: group, accepted kinds, choices, default and a line of help.

    Choices come from the type (an enum, a Literal), else from the `choices` TRL's argument parser enforces
    (`metadata["choices"]`); `report_to`'s from transformers' integrations.
    """
    fields: dict[str, dict[str, Any]] = {}
    for group, classes in groups.items():
        for cls in classes:
            hints = typing.get_type_hints(cls)
            for field in dataclasses.fields(cls):
                if field.name in fields:
                    continue  # the first group that declares a field owns it
                kinds, choices = _kinds(hints[field.name])
                if choices is None and "choices" in field.metadata:
                    choices = list(field.metadata["choices"])
                if field.name == "report_to":
                    choices = _report_targets()
                entry: dict[str, Any] = {"group": group, "kinds": kinds, "default": _default(field)}
                if choices is not None:
                    entry["choices"] = choices
                entry["help"] = _first_sentence(field.metadata.get("help", ""))
                fields[field.name] = entry
    return fields


def _script_reward_registry() -> dict[str, dict[str, Any] | None]:
    """The names `trl grpo` / `trl rloo` take in `reward_funcs` (the `reward_funcs_registry` of TRL's scripts),
    read from the scripts' source: each maps to None (the function itself) or the keyword arguments its factory
    is called with."""
    import ast
    import importlib.util

    registries = []
    for script in ("trl.scripts.grpo", "trl.scripts.rloo"):
        tree = ast.parse(Path(importlib.util.find_spec(script).origin).read_text())
        found = next(node.value for node in ast.walk(tree) if isinstance(node, ast.Assign)
                     and any(getattr(target, "id", "") == "reward_funcs_registry" for target in node.targets))
        registries.append({ast.literal_eval(key): {word.arg: ast.literal_eval(word.value) for word in value.keywords}
                           if isinstance(value, ast.Call) else None
                           for key, value in zip(found.keys, found.values, strict=True)})
    if registries[0] != registries[1]:
        raise RuntimeError("TRL's grpo and rloo scripts name different reward functions; snapshot each")
    return registries[0]


def _generation_keys() -> list[str]:
    """The keys `generation_kwargs` may hold: the attributes of transformers' GenerationConfig."""
    from transformers import GenerationConfig

    return sorted(key for key in GenerationConfig().to_dict() if not key.startswith("_"))


def _accelerate_launch_options() -> list[str]:
    """`accelerate launch`'s options: `trl ALGO --config FILE` passes the file's keys no dataclass takes to it."""
    from accelerate.commands.launch import launch_command_parser

    return sorted(vars(launch_command_parser().parse_args(["script.py"])))


def _accelerate_config_keys() -> list[str]:
    """The keys of an accelerate config file for local machines (its ClusterConfig dataclass): `accelerate launch`
    refuses a file with any other key, so rlhf checks them before launch without importing accelerate (torch)."""
    from accelerate.commands.config.config_args import ClusterConfig

    return sorted(field.name for field in dataclasses.fields(ClusterConfig))


def _dataset_entry_keys() -> list[str]:
    """What one entry of a recipe's `datasets:` list (TRL's dataset mixture) may hold."""
    from trl.scripts.utils import DatasetConfig

    return [field.name for field in dataclasses.fields(DatasetConfig)]


def build() -> dict[str, dict[str, Any]]:
    import trl

    shared = {"trl_version": trl.__version__, "reward_functions": _script_reward_registry(),
              "generation_keys": _generation_keys(), "accelerate_launch_options": _accelerate_launch_options(),
              "accelerate_config_keys": _accelerate_config_keys(),
              "dataset_entry_keys": _dataset_entry_keys()}
    return {algorithm: {**shared, "fields": describe(groups)} for algorithm, groups in _algorithm_dataclasses().items()}


def main() -> None:
    for algorithm, snapshot in build().items():
        path = SCHEMA_DIR / f"{algorithm}.json"
        path.write_text(json.dumps(snapshot, indent=1, sort_keys=True) + "\n")
        print(f"wrote {path} ({len(snapshot['fields'])} fields)")


if __name__ == "__main__":
    main()
