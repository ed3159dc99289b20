"""How many processes a run starts when nothing says: what `trl ALGO` (through `accelerate launch`) would start.

The user's default accelerate config (`accelerate config` writes it) first, else one process per visible GPU
(CUDA_VISIBLE_DEVICES, else `nvidia-smi -L`), else one. Asked without importing torch or accelerate.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

import yaml


def default_accelerate_config(environ: Mapping[str, str]) -> Path:
    """accelerate's default_config_file (accelerate/commands/config/config_args.py), for this environment."""
    home = environ.get("HF_HOME") or os.path.join(environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "accelerate" / "default_config.yaml"


def _visible_gpus(environ: Mapping[str, str]) -> tuple[int, str] | None:
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [part for part in visible.split(",") if part.strip()]
        return len(ids), f"CUDA_VISIBLE_DEVICES={visible}"
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    count = sum(line.startswith("GPU ") for line in listed.stdout.splitlines())
    return (count, "nvidia-smi -L") if count else None


def default_process_count(environ: Mapping[str, str]) -> tuple[int, str]:
    """The count and where it came from, for `--dry-run`'s source column."""
    config = default_accelerate_config(environ)
    try:
        loaded = yaml.safe_load(config.read_text()) if config.is_file() else None
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        loaded = None
    if isinstance(loaded, dict) and isinstance(loaded.get("num_processes"), int) and loaded["num_processes"] > 0:
        return loaded["num_processes"], f"your default accelerate config {config}"
    gpus = _visible_gpus(environ)
    if gpus is not None and gpus[0] > 0:
        return gpus[0], f"one per visible GPU ({gpus[1]})"
    return 1, "one process: no GPU visible"
