"""Flags + recipe -> one resolved run, with every problem found before anything starts.

Precedence: TRL's defaults < the recipe < command-line flags and `--set`. Every value keeps
the place it came from, so `--dry-run` can say why a value is what it is.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from rlhf_cli.algorithms import ALGORITHMS, algorithm
from rlhf_cli.checkpoints import incomplete_reason, newest_complete_checkpoint
from rlhf_cli.config.accelerate import LAYOUT_KEYS, AccelerateChoices, build_accelerate_config, is_zero3, zero_stage
from rlhf_cli.config.checks import check_model_config, check_reward_model, cross_field_problems
from rlhf_cli.config.cluster import detect_layout
from rlhf_cli.config.data_files import READERS, DataFileError, check_prompts
from rlhf_cli.config.vllm import length_problems, vllm_problems
from rlhf_cli.config.fields import (Field, FieldTypeError, catalogue, coerce, generation_fields, snapshot_list,
                                    trl_reward_functions)
from rlhf_cli.config.lora import lora_problems
from rlhf_cli.config.paths import PathState, describe, path_state, writable_dir_problem
from rlhf_cli.config.recipe import Recipe, load_recipe
from rlhf_cli.config.rewards import RewardSpecError, locate_reward
from rlhf_cli.errors import ConfigError
from rlhf_cli.gather_budget import BudgetError, parse_budget
from rlhf_cli.run_dir import MANIFEST, RunDir
from rlhf_cli.sizes import SizeError, parse_size

# The flag that sets each key the environment may fill in.
_FLAG_NAMES = {"num_machines": "--num-machines", "machine_rank": "--machine-rank",
               "main_process_ip": "--main-process-ip", "main_process_port": "--main-process-port",
               "num_processes": "--num-processes"}
# Short names people type, resolved to the field they stand for.
ALIASES = {"gather": "ds3_gather_for_generation"}
MODEL_FIELDS = ("model_name_or_path", "reward_model_name_or_path", "value_model_name_or_path")
DATA_SUFFIXES = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}
MACHINE_FIELDS = ("num_machines", "machine_rank", "main_process_ip", "main_process_port")
RESUME_AUTO = "auto"
# The trainers' collective timeout, unless the recipe sets one: a backstop for what the stall watch does not judge
# (a rank hung while loading or saving), long enough for the saves and loads that make the others wait.
COLLECTIVE_TIMEOUT_FACTOR = 5
# Keys naming something that must already exist: what it is, and whether it is a directory.
EXISTING_PATHS = {"accelerate_config": ("file", False), "nvme_path": ("directory", True),
                  "resume_from_checkpoint": ("checkpoint directory", True)}
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
DATA_BUILDERS = ("json", "csv", "parquet")  # `datasets` builders that read local `data_files`


class _Refused(Exception):
    """A check asked for a value that was refused: its answer would be about a value nobody gave."""


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

    def with_setting(self, name: str, value: Any, source: str, note: str | None = None) -> ResolvedRun:
        """A copy with one value decided after resolution (`gather: auto`, by the plan), and a note on why."""
        notes = self.notes if note is None else (*self.notes, note)
        return replace(self, settings={**self.settings, name: Setting(value, source)}, notes=notes)

    def with_note(self, note: str) -> ResolvedRun:
        """A copy with one more note, found after resolution (the output dir's free space, by the launcher)."""
        return replace(self, notes=(*self.notes, note))


def _trl_accelerate_config(value: str, base_dirs: tuple[Path, ...]) -> Path | None:
    """`zero3`, `fsdp2`, ...: a config TRL's CLI ships and `trl ALGO --config` takes by name (not a local file)."""
    if "/" in value or Path(value).suffix or any(path_state(base / value).exists for base in base_dirs):
        return None
    spec = importlib.util.find_spec("trl")  # finds the package without importing it
    for location in (spec.submodule_search_locations or []) if spec else []:
        named = Path(location) / "accelerate_configs" / f"{value}.yaml"
        if path_state(named).kind == "file":
            return named
    return None


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
        self.problems: list[str] = list(request.problems)
        self.notes: list[str] = []
        self.refused: set[str] = set()  # keys given a value that was refused

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
        owners = [other.command for other in ALGORITHMS.values() if key in catalogue(other.name)]
        if key in entry.retired:
            of = f" (a {' and '.join(owners)} key)" if owners else ""
            self.problems.append(f"{where}: `{key}`{of} has no counterpart in today's {entry.command}: "
                                 f"{entry.retired[key]}")
            return None
        if owners:
            self.problems.append(f"{where}: `{key}` is a {' and '.join(owners)} key, not one of {entry.command}; "
                                 f"remove it or run `rlhf {owners[0]}`")
            return None
        if key in snapshot_list(self.request.algorithm, "accelerate_launch_options"):
            self.problems.append(f"{where}: `{key}` is an option of `accelerate launch` (`trl {entry.command} "
                                 "--config` passes it on); rlhf takes it from the accelerate config: put it in a "
                                 "file given to --accelerate-config")
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
        self.layers[name] = (layer, where)
        try:
            value = coerce(self.fields[name], raw)
        except FieldTypeError as error:
            self.problems.append(f"{where}: `{key}`: {error}")
            self.refused.add(name)
            self.settings.pop(name, None)  # an earlier layer's value is not the one asked for either
            return
        self.refused.discard(name)
        found = len(self.problems)
        self.settings[name] = Setting(self.locate(self.fields[name], value, where, base_dirs), source)
        if len(self.problems) > found:  # a path not found, a bad entry: later checks must not judge it again
            self.refused.add(name)

    # -- paths and values that name files ----------------------------------------------------
    def locate(self, field: Field, value: Any, where: str, base_dirs: tuple[Path, ...]) -> Any:
        """Make local paths absolute and check they exist; leave hub ids alone; check values with inner parts."""
        if value is None:
            return None
        if field.name in MODEL_FIELDS or field.name == "dataset_name":
            return self._local_or_hub(field.name, value, where, base_dirs)
        if field.name == "resume_from_checkpoint" and value == RESUME_AUTO:
            return value  # found once the output dir is known
        if field.name == "accelerate_config" and (named := _trl_accelerate_config(value, base_dirs)):
            self.notes.append(f"{where}: `accelerate_config: {value}` is TRL's bundled {named}")
            return str(named)
        if field.name in EXISTING_PATHS:
            kind, must_be_dir = EXISTING_PATHS[field.name]
            path, state = self._find(value, base_dirs)
            if state.kind != ("dir" if must_be_dir else "file"):
                self.problems.append(f"{where}: `{field.name}`: {describe(value, state, kind)}")
                return value
            return str(path)
        if field.name == "output_dir":
            return str((self.cwd / Path(value).expanduser()).resolve()) if value.strip() else value
        if field.name == "reward_funcs":
            return [self._reward_func(spec, where, base_dirs) for spec in value]
        if field.name == "env":
            return self._environment(value, where)
        if field.name == "generation_kwargs":
            return self._generation_kwargs(value, where)
        if field.name == "datasets":
            return [self._mixture_entry(entry, index, where, base_dirs) for index, entry in enumerate(value)]
        return value

    @staticmethod
    def _find(value: str, base_dirs: tuple[Path, ...]) -> tuple[Path, PathState]:
        """The first of the candidate places that exists, else the first that says why (too long, through a
        file), else the first candidate, missing."""
        path = Path(value).expanduser()
        candidates = [path] if path.is_absolute() else [base / path for base in base_dirs]
        states = [(candidate, path_state(candidate)) for candidate in candidates]
        return next(((c.resolve(), s) for c, s in states if s.exists), None) \
            or next(((c, s) for c, s in states if s.kind == "error" or s.reason), states[0])

    def _local_or_hub(self, name: str, value: str, where: str, base_dirs: tuple[Path, ...]) -> str:
        found, state = self._find(value, base_dirs)
        looks_local = value.startswith((".", "/", "~")) or Path(value).suffix in DATA_SUFFIXES
        kind = "dataset" if name == "dataset_name" else "model directory"
        if not state.exists:
            if looks_local or state.kind == "error" or state.reason:
                self.problems.append(f"{where}: `{name}`: {describe(value, state, kind)}")
            return value  # a hub id
        if name == "dataset_name" and state.kind == "file" and found.suffix not in DATA_SUFFIXES:
            self.problems.append(f"{where}: `{name}`: {value} is not a .json, .jsonl, .parquet or .csv file")
        if name in MODEL_FIELDS and state.kind != "dir":
            self.problems.append(f"{where}: `{name}`: {value} is a file; give a saved model's directory")
        elif name in MODEL_FIELDS and path_state(found / "config.json").kind != "file":
            self.problems.append(f"{where}: `{name}`: {value} has no config.json; is it a saved model directory?")
        return str(found)

    def _reward_func(self, spec: Any, where: str, base_dirs: tuple[Path, ...]) -> Any:
        """`module:function` or `path/to/file.py:function`, file paths made absolute, checked without running."""
        if not isinstance(spec, str):
            self.problems.append(f"{where}: `reward_funcs`: {spec!r} is not a string like module:function")
            return spec
        try:
            return locate_reward(spec, trl_reward_functions(self.request.algorithm), base_dirs, self.cwd)
        except RewardSpecError as error:
            self.problems.append(f"{where}: `reward_funcs`: {error}")
            return spec

    def _environment(self, value: dict[Any, Any], where: str) -> dict[str, str]:
        """TRL's `env:` block: variable -> value, set as text (as TRL's parser does: str(value))."""
        environment = {}
        for name, text in value.items():
            if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
                self.problems.append(f"{where}: `env`: {name!r} is not a variable name (letters, digits, _)")
            elif text is None or isinstance(text, (list, dict)):
                self.problems.append(f"{where}: `env.{name}`: give the variable one value (text or a number), "
                                     f"got {text!r}")
            else:
                environment[name] = str(text)
        return environment

    def _generation_kwargs(self, value: dict[Any, Any], where: str) -> dict[Any, Any]:
        """Keys transformers' GenerationConfig has, with values of the right type and range."""
        known = snapshot_list(self.request.algorithm, "generation_keys")
        for key, item in value.items():
            if key not in known:
                self.problems.append(f"{where}: `generation_kwargs`: {key!r} is not a generation setting"
                                     f"{_suggest(str(key), list(known))}")
            elif key in generation_fields():
                try:
                    coerce(generation_fields()[key], item)
                except FieldTypeError as error:
                    self.problems.append(f"{where}: `generation_kwargs.{key}`: {error}")
        return value

    def _mixture_entry(self, entry: Any, index: int, where: str, base_dirs: tuple[Path, ...]) -> Any:
        """One dataset of TRL's `datasets:` mixture: TRL's keys, a `path`, local files made absolute."""
        label = f"{where}: `datasets[{index}]`"
        keys = snapshot_list(self.request.algorithm, "dataset_entry_keys")
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            self.problems.append(f"{label}: each entry is a mapping with at least `path` (a hub id, a local file "
                                 "or directory, or json/csv/parquet with `data_files`)")
            return entry
        unknown = [key for key in entry if key not in keys]
        if unknown:
            self.problems.append(f"{label}: unknown key `{unknown[0]}`{_suggest(str(unknown[0]), list(keys))} "
                                 f"(an entry takes {', '.join(keys)})")
            return entry
        located = dict(entry)
        found, state = self._find(entry["path"], base_dirs)
        if state.exists:
            located["path"] = str(found)
        elif Path(entry["path"]).suffix in DATA_SUFFIXES or entry["path"].startswith((".", "/", "~")):
            self.problems.append(f"{label}: `path`: {describe(entry['path'], state, 'dataset')}")
        files = entry.get("data_files")
        if files is not None and entry["path"] in DATA_BUILDERS:  # else relative to the dataset's own path
            located["data_files"] = self._data_files(files, f"{label}: `data_files`", base_dirs)
        return located

    def _data_files(self, files: Any, label: str, base_dirs: tuple[Path, ...]) -> Any:
        """`data_files` as `datasets` takes it (a path, a list, or split -> path(s)), local paths made absolute."""
        if isinstance(files, dict):
            return {split: self._data_files(part, label, base_dirs) for split, part in files.items()}
        if isinstance(files, list):
            return [self._data_files(part, label, base_dirs) for part in files]
        if not isinstance(files, str):
            self.problems.append(f"{label}: expected a path, a list of paths or split -> paths, got {files!r}")
            return files
        found, state = self._find(files, base_dirs)
        if state.kind == "file":
            return str(found)
        if not any(mark in files for mark in "*?["):  # a glob is `datasets`' to expand
            self.problems.append(f"{label}: {describe(files, state, 'data file')}")
        return files

    # -- layers -------------------------------------------------------------------------
    def apply_recipe(self, recipe: Recipe) -> None:
        bases = (recipe.path.parent, self.cwd)
        for key, value in recipe.values.items():
            self.put(key, value, "recipe", recipe.where(key), bases)

    def apply_environment(self, environ: Mapping[str, str]) -> None:
        """A scheduler's layout (SLURM, torchrun-style) beats the recipe's; flags still beat it."""
        layout = detect_layout(environ)
        for name, (text, variable) in layout.values.items():
            try:
                self.settings[name] = Setting(coerce(self.fields[name], text), f"env {variable}")
            except FieldTypeError as error:
                self.problems.append(f"{variable}={text}: `{name}`: {error}; fix the job's variables or pass "
                                     f"{_FLAG_NAMES[name]}")
                self.refused.add(name)
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
            except yaml.YAMLError as error:
                problem = getattr(error, "problem", None) or "not valid YAML"
                self.problems.append(f"--set {key}: {text!r} is not valid YAML ({problem}); to give it as text, "
                                     f"quote it: --set \"{key}='{text}'\"")
                continue
            self.put(key, value, "--set", f"--set {key}", bases)

    # -- whole-run checks ---------------------------------------------------------------
    def check_required(self) -> None:
        if "model_name_or_path" not in self.settings:
            self.problems.append("no policy model: set `model_name_or_path` in the recipe or pass --model")
        if "dataset_name" not in self.settings and not self.value("datasets") and "datasets" not in self.refused:
            self.problems.append("no dataset: set `dataset_name` in the recipe or pass --dataset")
        if not self.value("reward_model_name_or_path") and not self.value("reward_funcs"):
            self.problems.append(
                "no reward: set `reward_model_name_or_path` (or --reward-model) and/or `reward_funcs`")

    def value(self, name: str) -> Any:
        setting = self.settings.get(name)
        return setting.value if setting else self.fields[name].default

    def given(self, name: str) -> Any:
        """The value, for checks that must not judge a key whose given value was refused (they are skipped)."""
        if name in self.refused:
            raise _Refused(name)
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

    def settle_gather_budget(self) -> None:
        """`gather_budget` and `gather` say one thing: a budget of the whole policy is gather, any other no-gather
        (TRL's path; the ranks gather the budget's part themselves). When both are set, the command line beats
        the recipe; set in one place, they must agree (`--gather` is the budget 1, `--no-gather` the budget 0)."""
        setting = self.settings.get("gather_budget")
        if setting is None or setting.value is None:
            return
        where = self.layers["gather_budget"][1]
        try:
            budget = parse_budget(setting.value)
        except BudgetError as error:
            self.problems.append(f"{where}: `gather_budget`: {error}")
            return
        self.settings["gather_budget"] = Setting(budget.fraction if budget.fraction is not None else setting.value,
                                                 setting.source)
        gather = self.settings.get("ds3_gather_for_generation")
        agrees = gather is not None and gather.value is (True if budget.whole else False if budget.nothing else None)
        if gather is None or agrees or self.outranks("gather_budget", "ds3_gather_for_generation"):
            self.settings["ds3_gather_for_generation"] = Setting(budget.whole, f"gather_budget {budget}")
        elif self.outranks("ds3_gather_for_generation", "gather_budget"):
            del self.settings["gather_budget"]
            self.notes.append(f"{self.layers['ds3_gather_for_generation'][1]} overrides the recipe's "
                              f"gather_budget {budget}")
        else:
            meaning = {True: "gather: true is the budget 1", False: "gather: false is the budget 0",
                       "auto": "gather: auto lets the plan choose the budget"}[gather.value]
            self.problems.append(f"{where}: gather_budget {budget} contradicts "
                                 f"{self.layers['ds3_gather_for_generation'][1]} ({meaning}); keep one")

    def check_gpu_memory(self) -> None:
        if self.value("gpu_memory") is not None:
            try:
                parse_size(self.value("gpu_memory"))
            except SizeError as error:
                self.problems.append(f"{self.layers['gpu_memory'][1]}: `gpu_memory`: {error}")

    def check_stall_timeout(self) -> None:
        """Its range is in rlhf_cli/schema/ranges.yaml; a collective timeout of the recipe's own may undercut it."""
        timeout = self.value("stall_timeout")
        if "ddp_timeout" in self.settings and self.value("ddp_timeout") <= timeout:
            self.notes.append(f"warning: ddp_timeout {self.value('ddp_timeout')} is not above stall_timeout "
                              f"{timeout:g}: a collective may time out before the stall watch names the stalled rank")

    def default_output_dir(self) -> None:
        if self.value("output_dir") is None:  # unset, or `output_dir: null`
            stamp = time.strftime("%Y%m%d-%H%M%S")
            path = self.cwd / "runs" / f"{self.request.algorithm.replace('_', '-')}-{stamp}"
            self.settings["output_dir"] = Setting(str(path), "default")

    def find_resume_point(self) -> None:
        """`auto`: the newest whole checkpoint in the output dir; a given one: check that it is whole."""
        setting = self.settings.get("resume_from_checkpoint")
        if setting is None or setting.value is None or {"resume_from_checkpoint", "output_dir"} & self.refused:
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
        """A directory this machine can write (made if missing); machine rank 0's must not hold a run already."""
        setting = self.settings["output_dir"]
        flag = self.layers.get("output_dir", ("", "`output_dir`"))[1]
        problem = writable_dir_problem(Path(setting.value), may_create=True) if setting.value.strip() \
            else "is empty; give a directory"
        if problem:
            self.problems.append(f"{flag}: output dir {problem}")
            return
        resuming = "resume_from_checkpoint" in self.settings  # also `--resume auto` with nothing to resume yet
        if (self.value("machine_rank") or 0) > 0:
            return  # machine rank 0 owns the output dir; the others join its run
        output_dir = Path(setting.value)
        if path_state(RunDir(output_dir).recipe).exists and not (self.request.overwrite or resuming):
            self.problems.append(
                f"output dir {output_dir} already holds a run; choose another --output-dir or pass --overwrite")

    def check_nvme_path(self) -> None:
        """DeepSpeed swaps into it: a directory it can write."""
        path = self.value("nvme_path")
        if path is not None and path_state(Path(path)).kind == "dir":  # else reported as not found
            problem = writable_dir_problem(Path(path), may_create=False)
            if problem:
                self.problems.append(f"{self.layers['nvme_path'][1]}: `nvme_path`: {problem}")

    def check_models(self) -> None:
        for name in MODEL_FIELDS:
            if name in self.fields and name not in self.refused:
                check_model_config(name, self.value(name), self.layers.get(name, ("", ""))[1], self.problems)
        if "reward_model_name_or_path" not in self.refused:
            check_reward_model(self.value("reward_model_name_or_path"), self.problems)

    def check_data(self) -> None:
        """The first rows of each local prompt file parse and hold the prompt column."""
        column = self.value("dataset_prompt_column")
        files: list[tuple[str, Path, Any]] = []
        name = self.value("dataset_name")
        if isinstance(name, str) and Path(name).is_absolute() and Path(name).suffix in READERS:
            files.append((self.layers["dataset_name"][1], Path(name), None))
        for index, entry in enumerate(self.value("datasets") or []):
            if isinstance(entry, dict):
                where = f"{self.layers['datasets'][1]}: `datasets[{index}]`"
                files += [(where, path, entry.get("columns")) for path in _entry_files(entry)]
        for where, path, columns in files:
            if path_state(path).kind == "file":
                try:
                    check_prompts(path, column, columns)
                except DataFileError as error:
                    self.problems.append(f"{where}: {error}")

    def local_prompt_file(self) -> Path | None:
        """The local prompt file `dataset_name` names, if it is one."""
        name = self.value("dataset_name")
        return Path(name) if isinstance(name, str) and Path(name).is_absolute() and Path(name).is_file() else None

    def check_mixture(self) -> None:
        """TRL's rules for `fraction` in a dataset mixture, which it checks only while loading, on every rank."""
        entries = [entry for entry in self.value("datasets") or [] if isinstance(entry, dict)]
        given = [entry.get("fraction") is not None for entry in entries]
        if "datasets" in self.refused or not any(given):
            return
        where = self.layers["datasets"][1]
        if not all(given):
            self.problems.append(f"{where}: `datasets`: `fraction` is set for some datasets of the mixture and not "
                                 "for others; set it for all of them or for none")
        elif self.value("streaming"):
            self.problems.append(f"{where}: `datasets`: `fraction` cannot be used with `streaming: true` (a stream's "
                                 "length is unknown); drop one")

    def check_deepspeed_field(self, accelerate: dict[str, Any]) -> None:
        """TrainingArguments' own `deepspeed` setting must not contradict the accelerate config rlhf launches with."""
        value = self.value("deepspeed")
        if value is None or "deepspeed" in self.refused:
            return
        where = self.layers["deepspeed"][1]
        stage = _deepspeed_stage(value)
        launched = zero_stage(accelerate)
        if stage is None:
            self.problems.append(f"{where}: `deepspeed`: not a DeepSpeed config (a JSON file or a mapping with "
                                 "zero_optimization.stage); rlhf configures DeepSpeed itself: remove the key")
        elif stage != launched:
            said = f"ZeRO stage {launched}" if launched is not None else "no DeepSpeed"
            self.problems.append(f"{where}: `deepspeed` asks for ZeRO stage {stage}, the accelerate config for "
                                 f"{said}; remove `deepspeed` (rlhf sets DeepSpeed up from the accelerate config "
                                 "and the offload flags)")


def _entry_files(entry: dict[str, Any]) -> list[Path]:
    """The local data files of one mixture entry: its path, or its data_files under a json/csv/parquet builder."""
    path = Path(entry["path"])
    if path.is_absolute() and path.suffix in READERS:
        return [path]
    files = entry.get("data_files") if entry["path"] in DATA_BUILDERS else None
    found: list[str] = []
    pending = [files]
    while pending:
        part = pending.pop()
        if isinstance(part, dict):
            pending += list(part.values())
        elif isinstance(part, list):
            pending += part
        elif isinstance(part, str):
            found.append(part)
    return [Path(part) for part in found if Path(part).is_absolute() and Path(part).suffix in READERS]


def _deepspeed_stage(value: Any) -> int | None:
    """The ZeRO stage of TrainingArguments' `deepspeed` value (a path to a JSON file, or a mapping)."""
    if isinstance(value, str):
        try:
            value = json.loads(Path(value).read_text())
        except (OSError, ValueError):
            return None
    stage = value.get("zero_optimization", {}).get("stage", 0) if isinstance(value, dict) else None
    return stage if isinstance(stage, int) else None


def _cuda_present() -> bool:
    """Whether this machine has an NVIDIA GPU, asked without importing torch."""
    return any(Path(p).exists() for p in ("/dev/nvidiactl", "/dev/nvidia0", "/proc/driver/nvidia/version"))


def resolve(request: RunRequest, *, cwd: Path | None = None, cuda: bool | None = None,
            environ: Mapping[str, str] | None = None) -> ResolvedRun:
    """Validate everything; raise ConfigError listing every problem at once."""
    environ = os.environ if environ is None else environ
    resolver = _Resolver(request, (cwd or Path.cwd()).resolve())
    recipe = None
    if request.recipe:
        try:
            recipe = load_recipe(request.recipe)
        except ConfigError as error:  # reported with what the command line gets wrong, not instead of it
            resolver.problems += error.problems
    if recipe is not None:
        resolver.apply_recipe(recipe)
    resolver.apply_environment(environ)
    resolver.apply_command_line()
    if recipe is None and request.recipe:  # the recipe's own keys are unknown: its problems stand for them
        raise ConfigError(*resolver.problems)
    resolver.settle_gather_budget()
    resolver.check_required()
    resolver.check_models()
    resolver.default_output_dir()
    if not request.planning:
        resolver.find_resume_point()
        resolver.check_output_dir()
    resolver.check_nvme_path()
    resolver.check_gpu_memory()
    resolver.check_data()
    resolver.check_mixture()
    resolver.check_stall_timeout()
    cpu_only = not (_cuda_present() if cuda is None else cuda) or environ.get("DS_ACCELERATOR") == "cpu"
    accelerate, accelerate_notes = build_accelerate_config(
        AccelerateChoices(
            user_config=None if "accelerate_config" in resolver.refused else resolver.value("accelerate_config"),
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
            sources={name: said for name in LAYOUT_KEYS if (said := resolver.said(name))},
        ),
        resolver.problems,
    )
    resolver.check_deepspeed_field(accelerate)
    if cpu_only and resolver.value("fp16") is True and resolver.value("bf16") is not True:  # both: said above
        said = (resolver.said("fp16") or "`fp16: {value}`").format(value="true")
        resolver.problems.append(f"{said}: fp16 needs a GPU and this machine has none; set bf16: true (the CPU "
                                 "has bf16) or neither")
    for name, flag in (("lora_r", "--lora-r {value}"), ("merge_adapter", "--merge-adapter")):
        setting = resolver.settings.get(name)
        if setting is not None and setting.source.startswith("flag ") and resolver.value("use_peft") is not True:
            resolver.problems.append(f"{flag.format(value=setting.value)}: LoRA is off (`use_peft` is not true), so "
                                     "it would change nothing; add --lora")
    processes = int(accelerate.get("num_processes") or 1)
    for check in (lambda values: cross_field_problems(values, resolver.fields),
                  lambda values: algorithm(request.algorithm).checks(values, processes),
                  lambda values: lora_problems(values, algorithm(request.algorithm), is_zero3(accelerate)),
                  lambda values: vllm_problems(values, resolver.said, processes, cuda=not cpu_only),
                  lambda values: length_problems(values, algorithm(request.algorithm).completion_field,
                                                 resolver.local_prompt_file(), resolver.value("dataset_prompt_column"))):
        try:
            resolver.problems += check(resolver.given)
        except _Refused:
            pass  # judged once the refused value is fixed
    if resolver.problems:
        raise ConfigError(*resolver.problems)
    settings = dict(resolver.settings)
    if "num_gpus" in settings:  # num_processes follows: the written recipe must agree with itself
        settings["num_processes"] = Setting(accelerate.get("num_processes"), "num_gpus x num_machines")
    settings.setdefault("ds3_gather_for_generation",
                        Setting(resolver.fields["ds3_gather_for_generation"].default, "default"))
    settings.setdefault("ddp_timeout", Setting(round(COLLECTIVE_TIMEOUT_FACTOR * resolver.value("stall_timeout")),
                                               f"rlhf: {COLLECTIVE_TIMEOUT_FACTOR} x stall_timeout"))
    if cpu_only:  # DeepSpeed's CPU path: fp32 (TRL turns bf16 on by default) over gloo
        reason = "rlhf: no CUDA on this machine"
        cpu_defaults = (("bf16", False), ("fp16", False), ("ddp_backend", "gloo"), ("dataloader_pin_memory", False))
        for name, value in cpu_defaults:
            settings.setdefault(name, Setting(value, reason))
        resolver.notes.append("no CUDA here: the ranks run on DeepSpeed's CPU path (DS_ACCELERATOR=cpu, gloo)")
        if settings["bf16"].value and "use_cpu" not in settings:
            # transformers checks bf16 against the GPU unless told the run is on the CPU, where torch has bf16 too
            settings["use_cpu"] = Setting(True, "rlhf: bf16 without CUDA trains on the CPU")
            resolver.notes.append("no CUDA here: bf16 as asked, on the CPU (use_cpu: true)")
    return ResolvedRun(request.algorithm, recipe.path if recipe else None, settings, accelerate, cpu_only,
                       tuple(resolver.notes + accelerate_notes))
