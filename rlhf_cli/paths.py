"""Where things live: the bundled recipes and accelerate configs, and the Hugging Face hub cache."""

from __future__ import annotations

import os
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def bundled_dir(name: str) -> Path:
    """`recipes` or `accelerate_configs`: packed into the wheel, or beside the package in a checkout."""
    packed = _PACKAGE / "_bundled" / name
    return packed if packed.is_dir() else _PACKAGE.parent / name


def hub_cache() -> Path:
    """Where huggingface_hub keeps downloads, found the way it finds it (without importing it)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    cache_home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser()
    return cache_home / "huggingface" / "hub"
