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


def _algorithm_dataclasses() -> dict[str, dict[str, type]]:
    """The dataclasses whose fields make up a recipe, per algorithm and per group."""
    import warnings

    warnings.filterwarnings("ignore", message=".*trl.experimental.*")
    from trl import ModelConfig

    from rlhf_cli.algorithms import ALGORITHMS
    from rlhf_cli.algorithms.spec import load_object

    return {name: {"script": load_object(entry.script_class), "model": ModelConfig,
                   "trainer": load_object(entry.config_class)} for name, entry in ALGORITHMS.items()}


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


def describe(groups: dict[str, type]) -> dict[str, dict[str, Any]]:
    """One entry per field: group, accepted kinds, choices, default and a line of help."""
    fields: dict[str, dict[str, Any]] = {}
    for group, cls in groups.items():
        hints = typing.get_type_hints(cls)
        for field in dataclasses.fields(cls):
            if field.name in fields:
                continue  # the first group that declares a field owns it
            kinds, choices = _kinds(hints[field.name])
            entry: dict[str, Any] = {"group": group, "kinds": kinds, "default": _default(field)}
            if choices is not None:
                entry["choices"] = choices
            entry["help"] = _first_sentence(field.metadata.get("help", ""))
            fields[field.name] = entry
    return fields


def _reward_functions() -> list[str]:
    """TRL's ready-made reward functions, usable by bare name in `reward_funcs` (not its factories)."""
    import trl.rewards

    return sorted(name for name in trl.rewards.__all__ if not name.startswith("get_") and not name.endswith("s"))


def build() -> dict[str, dict[str, Any]]:
    import trl

    return {
        algorithm: {"trl_version": trl.__version__, "fields": describe(groups), "reward_functions": _reward_functions()}
        for algorithm, groups in _algorithm_dataclasses().items()
    }


def main() -> None:
    for algorithm, snapshot in build().items():
        path = SCHEMA_DIR / f"{algorithm}.json"
        path.write_text(json.dumps(snapshot, indent=1, sort_keys=True) + "\n")
        print(f"wrote {path} ({len(snapshot['fields'])} fields)")


if __name__ == "__main__":
    main()
