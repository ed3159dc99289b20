"""What one recipe key is (`Field`) and the range of a number (`Limits`): the types every catalogue is made of, the
one in rlhf_cli/config/fields.py and the keys an engine adds (rlhf_cli/config/engines/)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Limits:
    """A number's range (rlhf_cli/schema/ranges.yaml): None where a side is open."""

    min: float | None = None
    max: float | None = None
    above: float | None = None  # excluded lower bound
    below: float | None = None  # excluded upper bound
    also: tuple[Any, ...] = ()  # values accepted outside the range
    why: str = ""

    def problem(self, value: float) -> str | None:
        """Why `value` is out of range, or None."""
        if value in self.also or (
                (self.min is None or value >= self.min) and (self.max is None or value <= self.max)
                and (self.above is None or value > self.above) and (self.below is None or value < self.below)):
            return None
        low = f"at least {self.min}" if self.min is not None else f"above {self.above}" \
            if self.above is not None else None
        high = f"at most {self.max}" if self.max is not None else f"below {self.below}" \
            if self.below is not None else None
        wanted = " and ".join(filter(None, (low, high)))
        also = f" (or {' or '.join(map(str, self.also))})" if self.also else ""
        why = f": {self.why}" if self.why else ""
        return f"must be {wanted}{also}, got {value}{why}"


@dataclass(frozen=True)
class Field:
    """One recipe key. `group` says who consumes it: TRL's script, model or trainer
    arguments, our launcher (`launch`), or the DeepSpeed ZeRO-3 section (`zero3`)."""

    name: str
    group: str
    kinds: tuple[str, ...]
    default: Any
    help: str
    choices: tuple[Any, ...] | None = None
    limits: Limits | None = None

    def describe_type(self) -> str:
        if self.choices is not None:
            return "one of " + choices_text(self.choices)
        names = {"str": "a string", "int": "an integer", "float": "a number", "bool": "true or false",
                 "list": "a list", "dict": "a mapping", "null": "null", "any": "any value"}
        return " or ".join(names[kind] for kind in self.kinds)


def choices_text(choices: tuple[Any, ...]) -> str:
    return ", ".join(json.dumps(c) if isinstance(c, bool) else str(c) for c in choices)
