"""How much of a ZeRO-3 policy one weight sync gathers at once: the gather choice as a bucket limit, and the policy's
units packed into buckets under it. The plan sizes the sync's memory and time with these, the ranks gather with them.

`--gather` syncs the whole policy in one bucket, a gather budget in buckets of at most that many elements,
`--no-gather` one unit (a decoder layer, the embedding, the head) at a time; a unit is never split.
"""

from __future__ import annotations

from collections.abc import Sequence

from rlhf_cli.generation.choice import Gather

WHOLE = None  # a bucket limit: the whole policy in one bucket (--gather)
PER_UNIT = 0  # a bucket limit: one unit per bucket (--no-gather)


def bucket_limit(gather: Gather, total_numel: int, element_bytes: int) -> int | None:
    """The most policy elements one bucket holds for `gather`: WHOLE, PER_UNIT, or a budget's elements of a policy
    of `total_numel` elements of `element_bytes` bytes. `Gather.auto` is settled by the plan before anyone syncs."""
    if gather.mode == "auto":
        raise ValueError("gather: auto has no bucket until the plan settles it")
    if gather.budget is not None:
        return gather.budget.numel(total_numel, element_bytes)
    return WHOLE if gather.mode == "whole" else PER_UNIT


def buckets(numels: Sequence[int], limit: int | None) -> list[list[int]]:
    """Indices of units, in order, packed into buckets of at most `limit` elements each (WHOLE: one bucket;
    PER_UNIT: one unit each); a unit larger than the limit makes a bucket alone."""
    packed: list[list[int]] = []
    held = 0
    for index, numel in enumerate(numels):
        if packed and (limit is None or held + numel <= limit):
            packed[-1].append(index)
            held += numel
        else:
            packed.append([index])
            held = numel
    return packed



def bucket_sizes(parts: Sequence[tuple[int, int, int]], limit: int | None) -> list[tuple[int, int, int]]:
    """`buckets` counted without listing them: `parts` are (elements, modules, count) of alike units side by side,
    in order; the answer is (elements, modules, how many buckets alike) of the buckets `buckets` packs, in order.
    Its cost grows with the parts, not with the units (a 20,000-layer model is a few parts)."""
    packed: list[tuple[int, int, int]] = []
    held = modules = 0
    open_ = False

    def close() -> None:
        if open_:
            packed.append((held, modules, 1))

    for numel, unit_modules, count in parts:
        left = count
        while left:
            if open_ and (limit is None or held + numel <= limit):
                joining = left if limit is None or numel == 0 else min(left, (limit - held) // numel)
                held, modules, left = held + joining * numel, modules + joining * unit_modules, left - joining
                continue
            close()
            per_bucket = left if limit is None or numel == 0 else max(1, limit // numel)
            full, rest = divmod(left, per_bucket)
            if rest == 0:  # the last full bucket stays open: a following unit may still join it
                full, rest = full - 1, per_bucket
            if full:
                packed.append((per_bucket * numel, per_bucket * unit_modules, full))
            held, modules, left, open_ = rest * numel, rest * unit_modules, 0, True
    close()
    return packed
