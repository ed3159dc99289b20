"""rlhf's folder in this machine's cache: what rlhf remembers between runs (passed pre-launch checks, the
rehearsal's longest prompts). Pure Python: every layer may ask where it is."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "RLHF_CACHE"  # where rlhf remembers; default ~/.cache/rlhf


def cache_dir() -> Path:
    """$RLHF_CACHE, else rlhf's folder in the user's cache (XDG_CACHE_HOME, else ~/.cache)."""
    cache = os.environ.get(CACHE_ENV) or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rlhf"
    return Path(cache)
