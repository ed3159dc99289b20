"""Where the Hugging Face hub keeps downloads, found the way huggingface_hub finds it (without importing it), and
a model's config.json read from a local directory or from that cache: the planner sizes models from it, and
resolution checks LoRA target modules against it.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

COMMIT = re.compile(r"^[0-9a-f]{40}$")
CONFIG_FILE = "config.json"  # a saved model's configuration, read only here


class ModelConfigUnavailable(Exception):
    """A model whose config.json cannot be read here; the message says why."""


def hub_cache(env: Mapping[str, str] | None = None) -> Path:
    """The hub cache as huggingface_hub finds it, with `env` (a recipe's `env:` block, what the ranks see) over
    this process's environment."""
    environ = {**os.environ, **(env or {})}
    if environ.get("HF_HUB_CACHE"):
        return Path(environ["HF_HUB_CACHE"]).expanduser()
    if environ.get("HF_HOME"):
        return Path(environ["HF_HOME"]).expanduser() / "hub"
    cache_home = Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser()
    return cache_home / "huggingface" / "hub"


def find_config(name_or_path: str, revision: str | None = None, env: Mapping[str, str] | None = None) -> Path:
    """config.json of a local model directory, or of a hub id at `revision` in the hub cache."""
    local = Path(name_or_path).expanduser()
    if (local / CONFIG_FILE).is_file():
        return local / CONFIG_FILE
    if local.is_absolute() or name_or_path.startswith((".", "~")):
        raise ModelConfigUnavailable(f"{name_or_path} has no config.json")
    repo = hub_cache(env) / f"models--{name_or_path.replace('/', '--')}"
    revision = revision or "main"
    commit = revision if COMMIT.match(revision) else None
    if commit is None and (repo / "refs" / revision).is_file():
        commit = (repo / "refs" / revision).read_text().strip()
    config = repo / "snapshots" / (commit or revision) / CONFIG_FILE
    if not config.is_file():
        raise ModelConfigUnavailable(
            f"config.json of {name_or_path}@{revision} is not in the hub cache {hub_cache(env)} "
            f"(`hf download {name_or_path} config.json` fetches it)")
    return config


def read_config(name_or_path: str, revision: str | None = None,
                env: Mapping[str, str] | None = None) -> dict[str, Any]:
    path = find_config(name_or_path, revision, env)
    try:
        config = parse_config(path)
    except (OSError, ValueError) as error:
        raise ModelConfigUnavailable(f"{path}: not readable JSON ({error.__class__.__name__})") from None
    if not isinstance(config, dict):
        raise ModelConfigUnavailable(f"{path}: not a JSON object")
    return config


def parse_config(config_file: Path) -> Any:
    """The JSON value a config.json holds, as written (OSError or ValueError as reading and json raise them: the
    checks that report them word them)."""
    return json.loads(config_file.read_bytes())


def local_config_file(name_or_path: Any) -> Path | None:
    """The config.json of a local model directory (a saved model, a checkpoint); None for anything else: a hub id,
    a directory without one."""
    if not isinstance(name_or_path, (str, Path)):
        return None
    path = Path(name_or_path, CONFIG_FILE)
    return path if path.is_file() else None


def local_config(name_or_path: Any) -> dict[str, Any]:
    """A local model directory's config.json as a JSON object; {} where there is none, or it cannot be read as one
    (the checks that report that read it with `parse_config`)."""
    path = local_config_file(name_or_path)
    try:
        config = parse_config(path) if path else {}
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}
