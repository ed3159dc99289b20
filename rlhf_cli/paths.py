"""Where the bundled recipes and accelerate configs live, installed or in a checkout."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def bundled_dir(name: str) -> Path:
    """`recipes` or `accelerate_configs`: packed into the wheel, or beside the package in a checkout."""
    packed = _PACKAGE / "_bundled" / name
    return packed if packed.is_dir() else _PACKAGE.parent / name
