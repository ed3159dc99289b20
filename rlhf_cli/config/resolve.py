"""Flags + recipe -> one resolved run, with every problem found before anything starts.

Precedence: TRL's defaults < the recipe < command-line flags and `--set`. Every value keeps
the place it came from, so `--dry-run` can say why a value is what it is.
"""

from __future__ import annotations

import difflib
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from rlhf_cli.algorithms import ALGORITHMS, algorithm
from rlhf_cli.checkpoints import incomplete_reason, newest_complete_checkpoint
from rlhf_cli.config.accelerate import AccelerateChoices, build_accelerate_config
from rlhf_cli.config.checks import check_reward_model
from rlhf_cli.config.cluster import detect_layout
from rlhf_cli.config.fields import Field, FieldTypeError, catalogue, coerce, trl_reward_functions
from rlhf_cli.config.recipe import Recipe, load_recipe
from rlhf_cli.errors import ConfigError
from rlhf_cli.run_dir import MANIFEST, RunDir
from rlhf_cli.sizes import SizeError, parse_size

# Short names people type, resolved to the field they stand for.
ALIASES = {"gather": "ds3_gather_for_generation"}
MODEL_FIELDS = ("model_name_or_path", "reward_model_name_or_path", "value_model_name_or_path")
DATA_SUFFIXES = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}
MACHINE_FIELDS = ("num_machines", "machine_rank", "main_process_ip", "main_process_port")
RESUME_AUTO = "auto"
# Keys naming something that must already exist: what it is, and whether it is a directory.
EXISTING_PATHS = {"accelerate_config": ("file", False), "nvme_path": ("directory", True),
                  "resume_from_checkpoint": ("checkpoint directory", True)}


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


@dataclass(frozen=True)
class ResolvedRun:
    algorithm: str
    recipe: Path | None
    settings: dict[str, Setting]
    accelerate: dict[str, Any]
    cpu_only: bool
    notes: tuple[str, ...] = ()

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

    def with_setting(self, name: str, value: Any, source: str, note: str) -> ResolvedRun:
        """A copy with one value decided after resolution (`gather: auto`, by the plan), and a note on why."""
        return replace(self, settings={**self.settings, name: Setting(value, source)}, notes=(*self.notes, note))


def _suggest(key: str, names: list[str]) -> str:
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    return f"; did you mean `{close[0]}`?" if close else ""


class _Resolver:
    def __init__(self, request: RunRequest, cwd: Path) -> None:
        self.request = request
        self.cwd = cwd
        self.fields = catalogue(request.algorithm)
        self.settings: dict[str, Setting] = {}
        self.layers: dict[str, tuple[str, str]] = {}  # field -> (layer, where) of the value it holds
        self.problems: list[str] = []
        self.notes: list[str] = []

    # -- keys ---------------------------------------------------------------------------
    def canonical(self, key: str, where: str) -> str | None:
        """Today's field for `key`, or None after recording why it cannot be used."""
        entry = algorithm(self.request.algorithm)
        if key in entry.renamed:  # also a key TRL declares but never reads
            today = entry.renamed[key]
            self.notes.append(f"{where}: `{key}` is the old name of `{today}`; using it as `{today}`")
            return today
        if key in ALIASES:
            return ALIASES[key]
        if key in self.fields:
            return key
        if key in entry.retired:
            self.problems.append(f"{where}: `{key}` has no counterpart in today's {entry.command}: "
                                 f"{entry.retired[key]}")
            return None
        owners = [other.command for other in ALGORITHMS.values() if key in catalogue(other.name)]
        if owners:
            self.problems.append(f"{where}: `{key}` is a key of {' and '.join(owners)}, not of {entry.command}; "
                                 f"remove it or run `rlhf {owners[0]}`")
            return None
        names = sorted(set(self.fields) | set(ALIASES))
        self.problems.append(f"{where}: unknown key `{key}`{_suggest(key, names)}")
        return None

    def put(self, key: str, raw: Any, source: str, where: str, base_dirs: tuple[Path, ...]) -> None:
        """Set one key from one layer (the recipe, or the command line); later layers win."""
        name = self.canonical(key, where)
        if name is None:
            return
        layer = "recipe" if source == "recipe" else "command line"
        if name in self.layers and self.layers[name][0] == layer:
            what = f"`{name}` is set" if key == name else f"`{key}` sets `{name}`"
            self.problems.append(f"{where}: {what} again (already set by {self.layers[name][1]}); keep one")
            return
        try:
            value = coerce(self.fields[name], raw)
        except FieldTypeError as error:
            self.problems.append(f"{where}: `{key}`: {error}")
            return
        self.layers[name] = (layer, where)
        self.settings[name] = Setting(self.locate(self.fields[name], value, where, base_dirs), source)

    # -- paths --------------------------------------------------------------------------
    def locate(self, field: Field, value: Any, where: str, base_dirs: tuple[Path, ...]) -> Any:
        """Make local paths absolute and check they exist; leave hub ids alone."""
        if value is None:
            return None
        if field.name in MODEL_FIELDS or field.name == "dataset_name":
            return self._local_or_hub(field.name, value, where, base_dirs)
        if field.name == "resume_from_checkpoint" and value == RESUME_AUTO:
            return value  # found once the output dir is known
        if field.name in EXISTING_PATHS:
            path = self._find(value, base_dirs)
            kind, must_be_dir = EXISTING_PATHS[field.name]
            if path is None or (must_be_dir and not path.is_dir()):
                self.problems.append(f"{where}: `{field.name}`: {kind} {value} not found")
                return value
            return str(path)
        if field.name == "output_dir":
            return str((self.cwd / Path(value).expanduser()).resolve())
        if field.name == "reward_funcs":
            return [self._reward_func(spec, where, base_dirs) for spec in value]
        return value

    @staticmethod
    def _find(value: str, base_dirs: tuple[Path, ...]) -> Path | None:
        path = Path(value).expanduser()
        candidates = [path] if path.is_absolute() else [base / path for base in base_dirs]
        return next((c.resolve() for c in candidates if c.exists()), None)

    def _local_or_hub(self, name: str, value: str, where: str, base_dirs: tuple[Path, ...]) -> str:
        found = self._find(value, base_dirs)
        looks_local = value.startswith((".", "/", "~")) or Path(value).suffix in DATA_SUFFIXES
        if found is None:
            if looks_local:
                kind = "dataset" if name == "dataset_name" else "model directory"
                self.problems.append(f"{where}: `{name}`: {kind} {value} not found")
            return value  # a hub id
        if name == "dataset_name" and found.is_file() and found.suffix not in DATA_SUFFIXES:
            self.problems.append(f"{where}: `{name}`: {value} is not a .json, .jsonl, .parquet or .csv file")
        if name in MODEL_FIELDS and not (found / "config.json").is_file():
            self.problems.append(f"{where}: `{name}`: {value} has no config.json; is it a saved model directory?")
        return str(found)

    def _reward_func(self, spec: Any, where: str, base_dirs: tuple[Path, ...]) -> Any:
        """`module:function` or `path/to/file.py:function`; file paths made absolute."""
        if not isinstance(spec, str):
            self.problems.append(f"{where}: `reward_funcs`: {spec!r} is not a string like module:function")
            return spec
        target, _, function = spec.rpartition(":")
        if not target and "." not in spec and spec not in trl_reward_functions(self.request.algorithm):
            names = ", ".join(trl_reward_functions(self.request.algorithm))
            self.problems.append(f"{where}: `reward_funcs`: {spec!r} is not one of TRL's ({names}); "
                                 "write module:function or file.py:function")
            return spec
        if not target.endswith(".py"):
            return spec
        found = self._find(target, base_dirs)
        if found is None:
            self.problems.append(f"{where}: `reward_funcs`: file {target} not found")
            return spec
        return f"{found}:{function}"

    # -- layers -------------------------------------------------------------------------
    def apply_recipe(self, recipe: Recipe) -> None:
        bases = (recipe.path.parent, self.cwd)
        for key, value in recipe.values.items():
            self.put(key, value, "recipe", recipe.where(key), bases)

    def apply_environment(self, environ: Mapping[str, str]) -> None:
        """A scheduler's layout (SLURM, torchrun-style) beats the recipe's; flags still beat it."""
        layout = detect_layout(environ)
        for name, (value, variable) in layout.values.items():
            self.settings[name] = Setting(value, f"env {variable}")
        self.notes.extend(layout.notes)

    def apply_command_line(self) -> None:
        bases = (self.cwd,)
        for name, (flag, value) in self.request.flags.items():
            self.put(name, value, f"flag {flag}", flag, bases)
        for pair in self.request.sets:
            key, sep, text = pair.partition("=")
            key = key.strip()
            if not sep or not key:
                self.problems.append(f"--set {pair}: expected KEY=VALUE")
                continue
            try:
                value = yaml.safe_load(text) if text.strip() else None
            except yaml.YAMLError:
                value = text
            self.put(key, value, "--set", f"--set {key}", bases)

    # -- whole-run checks ---------------------------------------------------------------
    def check_required(self) -> None:
        if "model_name_or_path" not in self.settings:
            self.problems.append("no policy model: set `model_name_or_path` in the recipe or pass --model")
        if "dataset_name" not in self.settings:
            self.problems.append("no dataset: set `dataset_name` in the recipe or pass --dataset")
        if not self.value("reward_model_name_or_path") and not self.value("reward_funcs"):
            self.problems.append(
                "no reward: set `reward_model_name_or_path` (or --reward-model) and/or `reward_funcs`")

    def value(self, name: str) -> Any:
        setting = self.settings.get(name)
        return setting.value if setting else self.fields[name].default

    def explicit(self, name: str) -> Any:
        """The value the recipe or a flag gave, or None: the accelerate config's own value then stands."""
        setting = self.settings.get(name)
        return setting.value if setting else None

    def outranks(self, name: str, other: str) -> bool:
        """Whether `name` was set on the command line and `other` only by the recipe."""
        return self.layers.get(name, ("",))[0] == "command line" and self.layers.get(other, ("",))[0] == "recipe"

    def check_gpu_memory(self) -> None:
        if self.value("gpu_memory") is not None:
            try:
                parse_size(self.value("gpu_memory"))
            except SizeError as error:
                self.problems.append(f"{self.layers['gpu_memory'][1]}: `gpu_memory`: {error}")

    def default_output_dir(self) -> None:
        if self.value("output_dir") is None:  # unset, or `output_dir: null`
            stamp = time.strftime("%Y%m%d-%H%M%S")
            path = self.cwd / "runs" / f"{self.request.algorithm.replace('_', '-')}-{stamp}"
            self.settings["output_dir"] = Setting(str(path), "default")

    def find_resume_point(self) -> None:
        """`auto`: the newest whole checkpoint in the output dir; a given one: check that it is whole."""
        setting = self.settings.get("resume_from_checkpoint")
        if setting is None or setting.value is None:
            return
        if setting.value != RESUME_AUTO:
            checkpoint = Path(setting.value)
            reason = incomplete_reason(checkpoint)
            if reason and (checkpoint / MANIFEST).is_file():  # a save that finished, damaged since
                self.problems.append(f"--resume {setting.value}: {reason}; pass an earlier checkpoint")
            elif reason:  # a checkpoint rlhf did not write, or one whose save never finished: the user's call
                self.notes.append(f"warning: --resume {setting.value}: {reason}; resuming from it as given")
            return
        if self.settings["output_dir"].source == "default":
            self.problems.append("--resume auto looks for checkpoints in the output dir, and the default "
                                 "runs/ALGO-TIME is new every time: pass --output-dir DIR")
            return
        output_dir = Path(self.value("output_dir"))
        point = newest_complete_checkpoint(output_dir)
        self.notes.extend(f"warning: --resume auto: skipping {line}" for line in point.skipped)
        if point.checkpoint is None:
            self.notes.append(f"--resume auto: no complete checkpoint in {output_dir}; starting from the beginning")
            self.settings["resume_from_checkpoint"] = Setting(None, f"{setting.source} auto: nothing to resume")
        else:
            self.notes.append(f"--resume auto: continuing from {point.checkpoint}")
            self.settings["resume_from_checkpoint"] = Setting(str(point.checkpoint), f"{setting.source} auto")

    def check_output_dir(self) -> None:
        output_dir = Path(self.value("output_dir"))
        resuming = "resume_from_checkpoint" in self.settings  # also `--resume auto` with nothing to resume yet
        if (self.value("machine_rank") or 0) > 0:
            return  # machine rank 0 owns the output dir; the others join its run
        if RunDir(output_dir).recipe.exists() and not (self.request.overwrite or resuming):
            self.problems.append(
                f"output dir {output_dir} already holds a run; choose another --output-dir or pass --overwrite")


def _cuda_present() -> bool:
    """Whether this machine has an NVIDIA GPU, asked without importing torch."""
    return any(Path(p).exists() for p in ("/dev/nvidiactl", "/dev/nvidia0", "/proc/driver/nvidia/version"))


def resolve(request: RunRequest, *, cwd: Path | None = None, cuda: bool | None = None,
            environ: Mapping[str, str] | None = None) -> ResolvedRun:
    """Validate everything; raise ConfigError listing every problem at once."""
    environ = os.environ if environ is None else environ
    resolver = _Resolver(request, (cwd or Path.cwd()).resolve())
    recipe = load_recipe(request.recipe) if request.recipe else None
    if recipe is not None:
        resolver.apply_recipe(recipe)
    resolver.apply_environment(environ)
    resolver.apply_command_line()
    resolver.check_required()
    check_reward_model(resolver.value("reward_model_name_or_path"), resolver.problems)
    resolver.default_output_dir()
    if not request.planning:
        resolver.find_resume_point()
        resolver.check_output_dir()
    resolver.check_gpu_memory()
    cpu_only = not (_cuda_present() if cuda is None else cuda) or environ.get("DS_ACCELERATOR") == "cpu"
    accelerate, accelerate_notes = build_accelerate_config(
        AccelerateChoices(
            user_config=resolver.value("accelerate_config"),
            num_processes=None if resolver.outranks("num_gpus", "num_processes") else resolver.value("num_processes"),
            num_gpus=resolver.value("num_gpus"),
            machines={name: resolver.explicit(name) for name in MACHINE_FIELDS if resolver.explicit(name) is not None},
            offload_optimizer=resolver.explicit("offload_optimizer"),
            offload_params=resolver.explicit("offload_params"),
            nvme_path=resolver.value("nvme_path"),
            gather=resolver.value("ds3_gather_for_generation"),
            zero3={name: s.value for name, s in resolver.settings.items()
                   if resolver.fields[name].group == "zero3" and s.value is not None},
            cpu_only=cpu_only,
        ),
        resolver.problems,
    )
    resolver.problems += algorithm(request.algorithm).checks(resolver.value, int(accelerate.get("num_processes") or 1))
    if resolver.problems:
        raise ConfigError(*resolver.problems)
    settings = dict(resolver.settings)
    if "num_gpus" in settings:  # num_processes follows: the written recipe must agree with itself
        settings["num_processes"] = Setting(accelerate.get("num_processes"), "num_gpus x num_machines")
    settings.setdefault("ds3_gather_for_generation",
                        Setting(resolver.fields["ds3_gather_for_generation"].default, "default"))
    if cpu_only:  # DeepSpeed's CPU path: fp32 (TRL turns bf16 on by default) over gloo
        reason = "rlhf: no CUDA on this machine"
        cpu_defaults = (("bf16", False), ("fp16", False), ("ddp_backend", "gloo"), ("dataloader_pin_memory", False))
        for name, value in cpu_defaults:
            settings.setdefault(name, Setting(value, reason))
        resolver.notes.append("no CUDA here: the ranks run on DeepSpeed's CPU path (DS_ACCELERATOR=cpu, gloo)")
    return ResolvedRun(request.algorithm, recipe.path if recipe else None, settings, accelerate, cpu_only,
                       tuple(resolver.notes + accelerate_notes))
