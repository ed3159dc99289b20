"""The resolver's draft: the settings gathered so far, where each came from, and the problems found.

Each step of resolution (layers, value location, run checks) reads and adds to one `Draft`; `resolve()` turns it
into a `ResolvedRun` once no problem is left.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from rlhf_cli.config.fields import Field, catalogue
from rlhf_cli.config.run import RunRequest, Setting


class Refused(Exception):
    """A check asked for a value that was refused: its answer would be about a value nobody gave."""


def suggest(key: str, names: list[str]) -> str:
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    return f"; did you mean `{close[0]}`?" if close else ""


class Draft:
    """A run being resolved: what each layer set so far, from where, and every problem and note found."""

    def __init__(self, request: RunRequest, cwd: Path) -> None:
        self.request = request
        self.cwd = cwd
        self.fields: dict[str, Field] = catalogue(request.algorithm)
        self.settings: dict[str, Setting] = {}
        self.layers: dict[str, tuple[str, str, str]] = {}  # field -> (layer, where, key as given) of its value
        self.problems: list[str] = list(request.problems)
        self.notes: list[str] = []
        self.refused: set[str] = set()  # keys given a value that was refused
        self.recipe_path: Path | None = None
        self.resume_asked: str | None = None  # `--resume` as given (`auto`, a path), before `auto` is looked up
        self.output_dir_entries: tuple[str, ...] | None = None  # what the output dir held when it was checked

    def value(self, name: str) -> Any:
        setting = self.settings.get(name)
        return setting.value if setting else self.fields[name].default

    def given(self, name: str) -> Any:
        """The value, for checks that must not judge a key whose given value was refused (they are skipped)."""
        if name in self.refused:
            raise Refused(name)
        return self.value(name)

    def said(self, name: str) -> str | None:
        """How a problem names where `name`'s value came from, with `{value}` for the value: `--machine-rank
        {value}`, `SLURM_NODEID={value}`, `` `machine_rank: {value}` (recipe.yaml:4)``."""
        setting = self.settings.get(name)
        if setting is None or setting.source == "default":
            return None
        if setting.source.startswith("env "):
            variables = setting.source[4:]
            return f"{variables}={{value}}" if " " not in variables else f"{{value}} ({variables})"
        if setting.source.startswith("flag "):
            return f"{setting.source[5:]} {{value}}"
        return f"`{name}: {{value}}` ({self.layers.get(name, ('', setting.source))[1]})"

    def explicit(self, name: str) -> Any:
        """The value the recipe or a flag gave, or None: the accelerate config's own value then stands."""
        setting = self.settings.get(name)
        return setting.value if setting else None

    def outranks(self, name: str, other: str) -> bool:
        """Whether `name` was set on the command line and `other` only by the recipe."""
        return self.layers.get(name, ("",))[0] == "command line" and self.layers.get(other, ("",))[0] == "recipe"
