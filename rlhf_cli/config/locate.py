"""Where each value points: local paths made absolute and checked, hub ids left alone, inner parts checked.

Values that name files (models, data, rewards, accelerate configs, checkpoints) are found relative to the recipe's
directory, then the working directory; a problem names the key and the place that set it.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

from rlhf_cli.config.agent_code import AGENT_CODE_FIELDS, locate_agent_code
from rlhf_cli.config.data_files import DATA_SUFFIXES
from rlhf_cli.config.draft import Draft, suggest
from rlhf_cli.config.fields import Field, FieldTypeError, coerce, generation_fields, snapshot_list, trl_reward_functions
from rlhf_cli.config.paths import PathState, describe, path_state
from rlhf_cli.config.rewards import RewardSpecError, locate_reward
from rlhf_cli.config.run import RESUME_AUTO
from rlhf_cli.models.hub import CONFIG_FILE

MODEL_FIELDS = ("model_name_or_path", "reward_model_name_or_path", "value_model_name_or_path")
# Keys naming something that must already exist: what it is, and whether it is a directory.
EXISTING_PATHS = {"accelerate_config": ("file", False), "nvme_path": ("directory", True),
                  "resume_from_checkpoint": ("checkpoint directory", True)}
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
DATA_BUILDERS = ("json", "csv", "parquet")  # `datasets` builders that read local `data_files`
# The hub's repository ids: a name, or an owner and a name (huggingface_hub's validate_repo_id).
HUB_ID = re.compile(r"(?!.*(--|\.\.))[A-Za-z0-9][\w.-]{0,95}(/[A-Za-z0-9][\w.-]{0,95})?(?<![.-])")


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


def locate(draft: Draft, field: Field, value: Any, where: str, base_dirs: tuple[Path, ...]) -> Any:
    """Make local paths absolute and check they exist; leave hub ids alone; check values with inner parts."""
    if value is None:
        return None
    if field.name in MODEL_FIELDS or field.name == "dataset_name":
        return _local_or_hub(draft, field.name, value, where, base_dirs)
    if field.name == "resume_from_checkpoint" and value == RESUME_AUTO:
        return value  # found once the output dir is known
    if field.name == "accelerate_config" and (named := _trl_accelerate_config(value, base_dirs)):
        draft.notes.append(f"{where}: `accelerate_config: {value}` is TRL's bundled {named}")
        return str(named)
    if field.name in EXISTING_PATHS:
        kind, must_be_dir = EXISTING_PATHS[field.name]
        if isinstance(value, str) and not value.strip():  # Path('') is the working directory
            draft.problems.append(f"{where}: `{field.name}` is empty; give a {kind}")
            return value
        path, state = _find(value, base_dirs)
        if state.kind != ("dir" if must_be_dir else "file"):
            draft.problems.append(f"{where}: `{field.name}`: {describe(value, state, kind)}")
            return value
        return str(path)
    if field.name == "output_dir":
        try:
            return str((draft.cwd / Path(value).expanduser()).resolve()) if value.strip() else value
        except (RuntimeError, OSError) as error:  # a symlink loop: RuntimeError before Python 3.13
            draft.problems.append(f"{where}: output dir {value}: {error}; give a directory")
            return value
    if field.name == "reward_funcs":
        return [_reward_func(draft, spec, where, base_dirs) for spec in value]
    if field.name in AGENT_CODE_FIELDS:
        return locate_agent_code(field.name, value, where, base_dirs, draft.cwd, draft.problems)
    if field.name == "env":
        return _environment(draft, value, where)
    if field.name == "generation_kwargs":
        return _generation_kwargs(draft, value, where)
    if field.name == "datasets":
        return [_mixture_entry(draft, entry, index, where, base_dirs) for index, entry in enumerate(value)]
    return value


def _find(value: str, base_dirs: tuple[Path, ...]) -> tuple[Path, PathState]:
    """The first of the candidate places that exists, else the first that says why (too long, through a
    file), else the first candidate, missing."""
    path = Path(value).expanduser()
    candidates = [path] if path.is_absolute() else [base / path for base in base_dirs]
    states = [(candidate, path_state(candidate)) for candidate in candidates]
    return next(((c.resolve(), s) for c, s in states if s.exists), None) \
        or next(((c, s) for c, s in states if s.kind == "error" or s.reason), states[0])


def _local_or_hub(draft: Draft, name: str, value: str, where: str, base_dirs: tuple[Path, ...]) -> str:
    found, state = _find(value, base_dirs)
    looks_local = value.startswith((".", "/", "~")) or Path(value).suffix in DATA_SUFFIXES
    kind = "dataset" if name == "dataset_name" else "model directory"
    if not state.exists:
        if looks_local or state.kind == "error" or state.reason:
            draft.problems.append(f"{where}: `{name}`: {describe(value, state, kind)}")
        elif not HUB_ID.fullmatch(value):
            draft.problems.append(f"{where}: `{name}`: {value} is not found here, and is not a hub id (NAME or "
                                  f"OWNER/NAME); give a local {kind} that exists, or a hub id")
        return value  # a hub id
    if state.kind == "other":  # a pipe or a device: the ranks would read it forever, or read nothing
        draft.problems.append(f"{where}: `{name}`: {value} is neither a file nor a directory (a device, pipe or "
                              f"socket); give a {kind}")
    elif name == "dataset_name" and state.kind == "dir" and found.suffix in DATA_SUFFIXES:
        draft.problems.append(f"{where}: `{name}`: {value} is a directory, not a {found.suffix} file; give the "
                              "data file itself")
    if name == "dataset_name" and state.kind == "file" and found.suffix not in DATA_SUFFIXES:
        draft.problems.append(f"{where}: `{name}`: {value} is not a .json, .jsonl, .parquet or .csv file")
    if name in MODEL_FIELDS and state.kind == "file":
        draft.problems.append(f"{where}: `{name}`: {value} is a file; give a saved model's directory")
    elif name in MODEL_FIELDS and state.kind == "dir" and path_state(found / CONFIG_FILE).kind != "file":
        draft.problems.append(f"{where}: `{name}`: {value} has no config.json; is it a saved model directory?")
    return str(found)


def _reward_func(draft: Draft, spec: Any, where: str, base_dirs: tuple[Path, ...]) -> Any:
    """`module:function` or `path/to/file.py:function`, file paths made absolute, checked without running."""
    if not isinstance(spec, str):
        draft.problems.append(f"{where}: `reward_funcs`: {spec!r} is not a string like module:function")
        return spec
    try:
        return locate_reward(spec, trl_reward_functions(draft.request.algorithm), base_dirs, draft.cwd)
    except RewardSpecError as error:
        draft.problems.append(f"{where}: `reward_funcs`: {error}")
        return spec


def _environment(draft: Draft, value: dict[Any, Any], where: str) -> dict[str, str]:
    """TRL's `env:` block: variable -> value, set as text (as TRL's parser does: str(value))."""
    environment = {}
    for name, text in value.items():
        if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
            draft.problems.append(f"{where}: `env`: {name!r} is not a variable name (letters, digits, _)")
        elif text is None or isinstance(text, (list, dict)):
            draft.problems.append(f"{where}: `env.{name}`: give the variable one value (text or a number), "
                                  f"got {text!r}")
        elif "\0" in str(text):
            draft.problems.append(f"{where}: `env.{name}`: a NUL byte, which no environment variable can hold; "
                                  "remove it")
        else:
            environment[name] = str(text)
    return environment


def _generation_kwargs(draft: Draft, value: dict[Any, Any], where: str) -> dict[Any, Any]:
    """Keys transformers' GenerationConfig has, with values of the right type and range."""
    known = snapshot_list(draft.request.algorithm, "generation_keys")
    for key, item in value.items():
        if key not in known:
            draft.problems.append(f"{where}: `generation_kwargs`: {key!r} is not a generation setting"
                                  f"{suggest(str(key), list(known))}")
        elif key in generation_fields():
            try:
                coerce(generation_fields()[key], item)
            except FieldTypeError as error:
                draft.problems.append(f"{where}: `generation_kwargs.{key}`: {error}")
    return value


def _mixture_entry(draft: Draft, entry: Any, index: int, where: str, base_dirs: tuple[Path, ...]) -> Any:
    """One dataset of TRL's `datasets:` mixture: TRL's keys, a `path`, local files made absolute."""
    label = f"{where}: `datasets[{index}]`"
    keys = snapshot_list(draft.request.algorithm, "dataset_entry_keys")
    if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
        draft.problems.append(f"{label}: each entry is a mapping with at least `path` (a hub id, a local file "
                              "or directory, or json/csv/parquet with `data_files`)")
        return entry
    unknown = [key for key in entry if key not in keys]
    if unknown:
        draft.problems.append(f"{label}: unknown key `{unknown[0]}`{suggest(str(unknown[0]), list(keys))} "
                              f"(an entry takes {', '.join(keys)})")
        return entry
    located = dict(entry)
    found, state = _find(entry["path"], base_dirs)
    if state.exists:
        located["path"] = str(found)
    elif Path(entry["path"]).suffix in DATA_SUFFIXES or entry["path"].startswith((".", "/", "~")):
        draft.problems.append(f"{label}: `path`: {describe(entry['path'], state, 'dataset')}")
    files = entry.get("data_files")
    if files is not None and entry["path"] in DATA_BUILDERS:  # else relative to the dataset's own path
        located["data_files"] = _data_files(draft, files, f"{label}: `data_files`", base_dirs)
    return located


def _data_files(draft: Draft, files: Any, label: str, base_dirs: tuple[Path, ...]) -> Any:
    """`data_files` as `datasets` takes it (a path, a list, or split -> path(s)), local paths made absolute."""
    if isinstance(files, dict):
        return {split: _data_files(draft, part, label, base_dirs) for split, part in files.items()}
    if isinstance(files, list):
        return [_data_files(draft, part, label, base_dirs) for part in files]
    if not isinstance(files, str):
        draft.problems.append(f"{label}: expected a path, a list of paths or split -> paths, got {files!r}")
        return files
    found, state = _find(files, base_dirs)
    if state.kind == "file":
        return str(found)
    if not any(mark in files for mark in "*?["):  # a glob is `datasets`' to expand
        draft.problems.append(f"{label}: {describe(files, state, 'data file')}")
    return files
