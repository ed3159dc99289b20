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

