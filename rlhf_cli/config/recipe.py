"""Reading recipe files: YAML with a safe loader, keys kept with the line they stand on."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rlhf_cli.errors import ConfigError
from rlhf_cli.config.bundled import bundled_dir


@dataclass(frozen=True)
class Recipe:
    path: Path
    values: dict[str, Any]
    lines: dict[str, int]  # key -> 1-based line, for error messages

    def where(self, key: str) -> str:
        line = self.lines.get(key)
        return f"{self.path}:{line}" if line else str(self.path)


def find_recipe(name: str) -> Path:
    """A recipe path as given, or the name of a bundled one (`rloo/smoke`)."""
    path = Path(name).expanduser()
    if path.is_file():
        return path
    if path.exists():
        raise ConfigError(f"{name}: is not a file; --recipe takes a YAML file")
    bundled = bundled_dir("recipes") / (name if name.endswith((".yaml", ".yml")) else f"{name}.yaml")
    if not path.is_absolute() and bundled.is_file():
        return bundled
    raise ConfigError(f"{name}: recipe not found; give a YAML file or a bundled recipe (see recipes/)")


def load_recipe(name: str) -> Recipe:
    path = find_recipe(name)
    text = path.read_text()
    try:
        values = yaml.safe_load(text)
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise ConfigError(f"{where}: not valid YAML ({problem})") from None
    if values is None:
        values, node = {}, None
    if not isinstance(values, dict):
        raise ConfigError(f"{path}: a recipe is a mapping of keys to values, got {type(values).__name__}")
    lines = {}
    if isinstance(node, yaml.MappingNode):
        lines = {key.value: key.start_mark.line + 1 for key, _ in node.value if isinstance(key, yaml.ScalarNode)}
    for key in values:
        if not isinstance(key, str):
            raise ConfigError(f"{path}: key {key!r} is not a string")
    return Recipe(path.resolve(), values, lines)
