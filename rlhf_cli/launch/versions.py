"""The versions that decide how a run behaves, read from the installed packages' metadata (no import)."""

from __future__ import annotations

import platform
from importlib import metadata

VERSIONED = ("torch", "transformers", "trl", "deepspeed", "accelerate", "datasets", "rlhf")


def installed_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in VERSIONED:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions
