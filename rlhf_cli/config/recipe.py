"""Reading recipe files: YAML with a safe loader, keys kept with the line they stand on."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlhf_cli.config.bundled import bundled_dir
from rlhf_cli.config.paths import describe, path_state
from rlhf_cli.config.yaml_file import read_yaml
from rlhf_cli.errors import ConfigError


@dataclass(frozen=True)
class Recipe:
    path: Path
    values: dict[str, Any]
    lines: dict[str, int]  # key -> 1-based line, for error messages
    problems: tuple[str, ...] = ()  # found while reading it (keys given twice), reported with the rest
    notes: tuple[str, ...] = ()  # warnings found while reading it (a key given twice with one value)

    def where(self, key: str) -> str:
        line = self.lines.get(key)
        return f"{self.path}:{line}" if line else str(self.path)


def find_recipe(name: str) -> Path:
    """A recipe path as given, or the name of a bundled one (`rloo/smoke`)."""
    path = Path(name).expanduser()
    state = path_state(path)
    if state.kind == "file":
        return path
    if state.kind != "missing" or state.reason:
        raise ConfigError(f"--recipe {describe(path, state, 'YAML file')}")
    bundled = bundled_dir("recipes") / (name if name.endswith((".yaml", ".yml")) else f"{name}.yaml")
    if not path.is_absolute() and path_state(bundled).kind == "file":
        return bundled
    raise ConfigError(f"{name}: recipe not found; give a YAML file or a bundled recipe (see recipes/)")


def load_recipe(name: str) -> Recipe:
    path = find_recipe(name)
    loaded = read_yaml(path, "recipe")
    values = {} if loaded.values is None else loaded.values
    if not isinstance(values, dict):
        raise ConfigError(f"{path}: a recipe is a mapping of keys to values, got {type(values).__name__}")
    for key in values:
        if not isinstance(key, str):
            raise ConfigError(f"{path}: key {key!r} is not a string")
    return Recipe(path.resolve(), values, loaded.lines, loaded.problems, loaded.notes)
