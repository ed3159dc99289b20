"""The all-gathers ZeRO-3 launches while the policy generates, under each gather choice, counted from the model's
structure (each module's own parameter elements against the persistence threshold, the units a budget buys), so
that the time plan charges each at the measured per-call latency (`Rates.module_overhead`) beside the bytes.

What DeepSpeed's parameter coordinator does (read from it, and counted against a probe of every all-gather one
rank launches during generation: 2 CPU ranks, the smoke policy):
- a parameter of at most stage3_param_persistence_threshold elements persists: once gathered it stays whole (the
  optimizer step gathers the persistent ones again), so it costs no all-gather per token;
- a gather (TRL's whole one, a budget's units) is deepspeed.zero.GatheredParameters: one all-gather per parameter
  not whole, once per generate call;
- leaving a gather, GatheredParameters partitions every parameter it held, the persistent ones too: the next
  forward (scoring or training) fetches each module of them again, one all-gather each, and they persist;
- under the hooks, the first forward of a generate call fetches module by module (the fetch trace was invalidated
  after the last generation): one all-gather per module holding a partitioned parameter; every later forward
  follows the recorded trace and prefetches in groups of up to stage3_prefetch_bucket_size elements (at most
  stage3_max_live_parameters), one all-gather per group.
A module's own parameters count as one (a weight and its bias): their sum decides whether they persist. No torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from rlhf_cli.generation.budget import Unit, bought
from rlhf_cli.generation.choice import Gather
from rlhf_cli.plan.model_sizes import ModelSize
from rlhf_cli.plan.rates import PERSISTENCE_THRESHOLD

PREFETCH_BUCKET = 50_000_000  # DeepSpeed's stage3_prefetch_bucket_size default
MAX_LIVE_PARAMETERS = 1_000_000_000  # DeepSpeed's stage3_max_live_parameters default


@dataclass(frozen=True)
class ZeroSettings:
    """The run's ZeRO-3 knobs that decide its fetches (None: DeepSpeed's default)."""

    persistence_threshold: int | None = None
    prefetch_bucket: int | None = None
    max_live_parameters: int | None = None

    @property
    def threshold(self) -> int:
        return self.persistence_threshold if self.persistence_threshold is not None else PERSISTENCE_THRESHOLD

    @property
    def group(self) -> int:
        """The most elements one prefetch gathers."""
        bucket = self.prefetch_bucket if self.prefetch_bucket is not None else PREFETCH_BUCKET
        live = self.max_live_parameters if self.max_live_parameters is not None else MAX_LIVE_PARAMETERS
        return max(1, min(bucket, live))


@dataclass(frozen=True)
class GenerationGathers:
    """All-gathers of one generate call of the policy."""

    once: int  # at its start: the gathered units' parameters, and the first forward's module-by-module fetches
    per_pass: int  # in each later forward (a decode step): the hooked modules' prefetch groups
    hooked_numel: int  # elements fetched in each forward under the hooks (partitioned, not gathered)
    released: int  # persistent modules the gather partitioned, fetched again by the next forward after generating


def generation_gathers(policy: ModelSize, gather: Gather, budget_numel: int | None,
                       settings: ZeroSettings) -> GenerationGathers:
    """The all-gathers of one generate call with the policy gathered whole (--gather), by a budget of
    `budget_numel` elements, or not at all (from shards)."""
    parts = policy.stretches
    if gather == Gather.whole:
        taken = [(part, part.count) for part in parts]
    elif budget_numel is not None:
        taken = bought(parts, budget_numel)
    else:
        taken = [(part, 0) for part in parts]
    held = _modules(((part.unit, count) for part, count in taken), lambda numel: numel > settings.threshold)
    hooked = _modules(((part.unit, part.count - count) for part, count in taken),
                      lambda numel: numel > settings.threshold)
    persistent = _modules(((part.unit, count) for part, count in taken), lambda numel: numel <= settings.threshold)
    return GenerationGathers(sum(count for _, count in held) + sum(count for _, count in hooked),
                             _prefetch_groups(hooked, settings.group), sum(numel * count for numel, count in hooked),
                             sum(count for _, count in persistent))


def _modules(units: Iterable[tuple[Unit, int]], kept: Callable[[int], bool]) -> list[tuple[int, int]]:
    """(elements, how many) of the modules whose size `kept` keeps among `count` copies of each unit."""
    return [(numel, count) for unit, count in units if count > 0 for numel in unit.module_numels if kept(numel)]


def _prefetch_groups(modules: list[tuple[int, int]], group: int) -> int:
    """All-gathers of one forward's prefetches: a module at least a group's size is its own; the smaller ones
    share groups (DeepSpeed fills a group until it reaches the bucket)."""
    large = sum(count for numel, count in modules if numel >= group)
    small = sum(numel * count for numel, count in modules if numel < group)
    return large + math.ceil(small / group)
