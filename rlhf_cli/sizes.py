"""Memory sizes as people write them (`24GiB`, `24GB`, `24576MiB`, bytes) and as rlhf prints them."""

from __future__ import annotations

import re

UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


class SizeError(ValueError):
    """A memory size that cannot be read; the message says what is expected."""


def parse_size(value: str | int) -> int:
    """Bytes from `24GiB`, `24GB`, `24576MiB` or a plain number of bytes."""
    if isinstance(value, bool):
        raise SizeError(f"{value!r} is not a memory size; write e.g. 24GiB, 24GB, 24576MiB or bytes")
    if isinstance(value, int):
        number, unit = float(value), ""
    else:
        match = SIZE.match(str(value))
        if not match or match.group(2).lower() not in UNITS:
            raise SizeError(f"{value!r} is not a memory size; write e.g. 24GiB, 24GB, 24576MiB or bytes")
        number, unit = float(match.group(1)), match.group(2).lower()
    if unit in ("", "b") and number != int(number):
        raise SizeError(f"{value!r}: a plain number is bytes and must be whole; write e.g. 23.7GiB")
    if number <= 0:
        raise SizeError(f"{value!r}: a memory size must be positive")
    return int(number * UNITS[unit])


def gib(value: int) -> str:
    return f"{value / 2**30:.1f} GiB"


def readable(value: int) -> str:
    """Bytes in the largest binary unit that keeps a number of at least 1: 12.0 KiB, 5.9 MiB, 265.8 GiB."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value} B"

