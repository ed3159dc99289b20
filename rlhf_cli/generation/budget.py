"""The gather budget: how much of the policy each rank gathers once per generation call, and which parts.

`--gather` gathers the whole policy once per generation call and runs it without ZeRO-3's hooks; `--no-gather`
fetches and releases every module through ZeRO-3's hooks at every generated token. A budget in between gathers
whole parts of the policy (units: a decoder layer, the embedding, the LM head, a final norm) once per call, runs
them without hooks, and fetches the rest per token. It is a fraction of the policy's parameters (`0.5`) or a size
(`2GiB`); `--gather` is the fraction 1, `--no-gather` the fraction 0.

Which units: those that save the most generation time per byte they hold. Per generated token a unit costs ZeRO-3
a fixed time for each module it holds (the hooks, the fetch and release bookkeeping, an all-gather launch) plus a
time per byte moved, the same per byte whichever unit the byte belongs to (benchmarks/gather_units.py measures
both on a 100M Llama). So the units with the most modules per parameter come first: on a small vocabulary the
embedding and the LM head (one module each), on a large one the decoder layers.

Pure and torch-free: the plan chooses from config.json arithmetic and the ranks from the real modules, both
with `choose`, so that what the plan counts is what the ranks gather.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rlhf_cli.sizes import SizeError, gib, parse_size


class BudgetError(ValueError):
    """A gather budget that cannot be read; the message says what is expected."""


@dataclass(frozen=True)
class Budget:
    """A fraction of the policy's parameters, or a size in bytes; exactly one is set."""

    fraction: float | None = None
    size: int | None = None

    def numel(self, total: int, element_bytes: int) -> int:
        """The most parameter elements it gathers, of a policy of `total` elements of `element_bytes` bytes."""
        if self.fraction is not None:
            return int(self.fraction * total)
        assert self.size is not None
        return min(total, self.size // element_bytes)

    @property
    def nothing(self) -> bool:
        return self.fraction == 0

    @property
    def whole(self) -> bool:
        """The whole policy whatever its size: the same as --gather."""
        return self.fraction == 1

    def __str__(self) -> str:
        return f"{self.fraction:.3g}" if self.fraction is not None else gib(self.size or 0)


def parse_budget(value: str | float | int) -> Budget:
    """`0.5` or `"0.5"` (a fraction from 0 to 1), or a size with its unit (`2GiB`, `500MB`)."""
    if isinstance(value, bool):
        raise BudgetError(f"{value!r} is not a gather budget; write a fraction from 0 to 1 (0.5) or a size (2GiB)")
    number: float | None
    if isinstance(value, (int, float)):
        number = float(value)
    else:
        try:
            number = float(value)
        except ValueError:
            number = None
    if number is not None:
        if not 0 <= number <= 1:
            raise BudgetError(f"{value!r}: a fraction of the policy is from 0 to 1; a size needs its unit (2GiB)")
        return Budget(fraction=number)
    try:
        return Budget(size=parse_size(value))
    except SizeError as error:
        raise BudgetError(f"{error}; or a fraction of the policy from 0 to 1 (0.5)") from None


@dataclass(frozen=True)
class Unit:
    """A part of the policy gathered whole or not at all."""

    name: str
    numel: int  # parameter elements it holds
    modules: int  # modules whose ZeRO-3 hooks it takes out of every generated token
    # the parameter elements each of its modules holds directly (the plan's count of ZeRO-3's fetches); the ranks
    # leave it empty: they gather what they find
    module_numels: tuple[int, ...] = ()


@dataclass(frozen=True)
class Stretch:
    """`count` alike units side by side from index `first` (a model's decoder layers): the plan counts a model in
    stretches, so that its arithmetic does not grow with the depth."""

    unit: Unit
    first: int
    count: int


def stretches(units: Sequence[Unit]) -> tuple[Stretch, ...]:
    """`units` in index order, alike neighbours together."""
    found: list[Stretch] = []
    for index, unit in enumerate(units):
        if found and found[-1].unit == unit:
            found[-1] = Stretch(unit, found[-1].first, found[-1].count + 1)
        else:
            found.append(Stretch(unit, index, 1))
    return tuple(found)


def ranked(parts: Sequence[Stretch]) -> list[Stretch]:
    """Best buy first: most modules per parameter; among units alike (the decoder layers) the earlier first."""
    return sorted(parts, key=lambda part: (-part.unit.modules / max(part.unit.numel, 1), part.first))


def bought(parts: Sequence[Stretch], budget_numel: int) -> list[tuple[Stretch, int]]:
    """How many units of each stretch the budget buys, taking the best buys first, each unit that still fits: of
    alike units, the earliest."""
    taken, left = [], budget_numel
    for part in ranked(parts):
        numel = part.unit.numel
        count = part.count if numel == 0 else min(part.count, left // numel)
        taken.append((part, count))
        left -= count * numel
    return taken


def bought_total(parts: Sequence[Stretch], budget_numel: int) -> tuple[int, int]:
    """(elements, modules) the budget buys."""
    taken = bought(parts, budget_numel)
    return (sum(part.unit.numel * count for part, count in taken),
            sum(part.unit.modules * count for part, count in taken))


def choose(units: Sequence[Unit], budget_numel: int) -> list[int]:
    """Indices (ascending) of the units to gather: the best buys first, each that still fits."""
    return sorted(part.first + offset for part, count in bought(stretches(units), budget_numel)
                  for offset in range(count))
