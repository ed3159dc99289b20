"""The resolved run and what asks for it: the types plan, launch, the CLI and the ranks read.

Resolution (rlhf_cli/config/resolve.py) builds a `ResolvedRun` from a `RunRequest`; everything after it reads
the run through these types and never imports the resolver.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rlhf_cli.config.fields import RESUME_AUTO, catalogue
from rlhf_cli.generation.choice import Generation

__all__ = ["RESUME_AUTO", "ResolvedRun", "RunRequest", "Setting"]


@dataclass(frozen=True)
class Setting:
    value: Any
    source: str  # "recipe", "flag --max-steps", "--set", "default", or why rlhf chose it


@dataclass(frozen=True)
class RunRequest:
    """What the command line asked for, before anything is checked."""

    algorithm: str
    recipe: str | None = None
    flags: dict[str, tuple[str, Any]] = field(default_factory=dict)  # field -> (flag, value), only those given
    sets: tuple[str, ...] = ()
    overwrite: bool = False
    planning: bool = False  # `rlhf plan`: nothing will be written, so the output dir and resume point are not checked
    problems: tuple[str, ...] = ()  # found in the command line itself (flags that contradict each other)
    # `--learning_rate 1e-6`, `--report_to wandb tensorboard`, `--use_vllm`: (flag, its words), as TRL's parser splits
    trl_flags: tuple[tuple[str, tuple[str, ...]], ...] = ()


@dataclass(frozen=True)
class ResolvedRun:
    algorithm: str
    recipe: Path | None
    settings: dict[str, Setting]
    accelerate: dict[str, Any]
    cpu_only: bool
    generation: Generation  # read from the settings once; `with_generation` keeps the two in step
    notes: tuple[str, ...] = ()
    # What the output dir held when it was checked (machine rank 0): the launcher, once it holds the directory,
    # refuses to start if another run changed it meanwhile. None: not checked (another machine's launcher).
    output_dir_entries: tuple[str, ...] | None = None

    @property
    def output_dir(self) -> Path:
        return Path(self.settings["output_dir"].value)

    def value(self, name: str) -> Any:
        setting = self.settings.get(name)
        return setting.value if setting else catalogue(self.algorithm)[name].default

    def group(self, group: str) -> dict[str, Any]:
        fields = catalogue(self.algorithm)
        return {name: s.value for name, s in self.settings.items() if fields[name].group == group}

    def recipe_values(self) -> dict[str, Any]:
        """The resolved run as a recipe: loading it again gives the same run."""
        return {name: setting.value for name, setting in self.settings.items()}

    def with_generation(self, generation: Generation, source: str, note: str) -> ResolvedRun:
        """A copy generating as decided after resolution (`gather: auto`, by the plan), its TRL keys written too;
        a key that keeps its value keeps its source (`use_vllm` from --vllm stays --vllm's)."""
        old = self.settings
        settings = {**old, **{name: Setting(value, source) for name, value in generation.trl_settings().items()
                              if name not in old or old[name].value != value}}
        return replace(self, settings=settings, generation=generation, notes=(*self.notes, note))

    def with_note(self, note: str) -> ResolvedRun:
        """A copy with one more note, found after resolution (the output dir's free space, by the launcher)."""
        return replace(self, notes=(*self.notes, note))

