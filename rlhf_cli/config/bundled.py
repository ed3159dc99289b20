"""What ships with rlhf: the recipes and accelerate configs, where they are, and what each recipe is for.

No TRL, no torch: `rlhf recipes` lists them in a blink.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from rlhf_cli.algorithms import algorithm

_PACKAGE = Path(__file__).resolve().parents[1]


def bundled_dir(name: str) -> Path:
    """`recipes` or `accelerate_configs`: packed into the wheel, or beside the package in a checkout."""
    packed = _PACKAGE / "_bundled" / name
    return packed if packed.is_dir() else _PACKAGE.parent / name


@dataclass(frozen=True)
class BundledRecipe:
    name: str  # what -r takes: ALGO/NAME
    algorithm: str  # the command that runs it: ppo, rloo, online-dpo, ...
    model: str
    purpose: str  # the recipe's first comment line
    path: Path


def _first_comment(path: Path) -> str:
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            return line.lstrip("#").strip()
        if line.strip():
            break
    return ""


def _model(path: Path, value: object) -> str:
    """A hub id as written; a local model as a path under the bundled recipes (`smoke/policy`)."""
    if not isinstance(value, str):
        return "-"
    local = (path.parent / value).resolve()
    root = bundled_dir("recipes").resolve()
    return str(local.relative_to(root)) if local.exists() and local.is_relative_to(root) else value


def bundled_recipes() -> list[BundledRecipe]:
    recipes = []
    for path in sorted(bundled_dir("recipes").glob("*/*.yaml")):
        entry = algorithm(path.parent.name)
        values = yaml.safe_load(path.read_text()) or {}
        recipes.append(BundledRecipe(f"{entry.name}/{path.stem}", entry.command,
                                     _model(path, values.get("model_name_or_path")), _first_comment(path), path))
    return recipes
