"""Where the Hugging Face hub keeps downloads, found the way huggingface_hub finds it (without importing it)."""

from __future__ import annotations

import os
from pathlib import Path


def hub_cache() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    cache_home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser()
    return cache_home / "huggingface" / "hub"
