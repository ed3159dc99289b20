"""The recipes shipped with rlhf, described from their own files (no TRL, no torch)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlhf_cli.config.recipe import load_recipe
from rlhf_cli.paths import bundled_dir


@dataclass(frozen=True)
class BundledRecipe:
    name: str  # what -r takes: ALGO/NAME
    algorithm: str  # the command that runs it: ppo, rloo, online-dpo
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
        algorithm = path.parent.name
        recipe = load_recipe(str(path))
        recipes.append(BundledRecipe(f"{algorithm}/{path.stem}", algorithm.replace("_", "-"),
                                     _model(path, recipe.values.get("model_name_or_path")),
                                     _first_comment(path), path))
    return recipes
