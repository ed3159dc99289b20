"""Refresh a generator's copy of the policy from ZeRO-3 shards, never gathering more than the gather choice
allows at once: the engine-neutral half of the weight sync, in front of a `WeightTarget` (the colocated vLLM,
a vLLM server, any later engine or transport).

TRL's sync gathers one parameter at a time (a collective per tensor) and, with LoRA, the whole model at once to
merge the adapters (trl#5766, trl#3133: out of memory in the sync). Here the gather choice governs it, as it
governs HF generation: `--gather` the whole policy in one bucket, `--gather-budget` buckets of at most that many
bytes, `--no-gather` one unit (a decoder layer, the embedding, the head) at a time. Units are those of the gather
budget (rlhf_cli/rank/zero3.policy_units), so a decoder layer's adapters are always gathered with the weights
they merge into: with LoRA each layer is merged, sent and unmerged in its bucket. Gathered without a modifier
rank, the merged weights are discarded when the bucket is released: the shards never see the merge.

A sync is dense (every weight, bucket by bucket: `WeightTarget.load`) or, when the target takes patches and it
last received this policy's weights, a shard-local delta (rlhf_cli/rank/engines/delta.py: only what changed, no
parameter gathered). `sync_weights(model, target, limit)` (rlhf_cli/rank/engines/sync.py) is the whole sync.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from rlhf_cli import compat
from rlhf_cli.compat import vllm as vllm_compat
from rlhf_cli.generation.choice import Gather
from rlhf_cli.generation.sync_buckets import bucket_limit
from rlhf_cli.rank.zero3 import ModuleUnit

PEFT_PREFIXES = ("base_model.model.",)
DROPPED_IN_NAMES = ("_checkpoint_wrapped_module.", "modules_to_save.default.")


@dataclass(frozen=True)
class Patch:
    """New values of one checkpoint tensor: at flat `indices` into it, or all of it (`indices` None)."""

    name: str
    shape: tuple[int, ...]
    values: Any  # 1-D, in the generator's dtype
    indices: Any | None = None


class WeightTarget(Protocol):
    """What a generator offers the sync (verl's `update_weights` / `resume`): whole weights (`load`, then `reset`)
    and, where it can take them, patches in checkpoint coordinates."""

    dtype: Any  # the torch dtype the generator holds its weights in
    dense_reason: str | None  # why every sync into it is dense; None when it takes patches
    instead: str  # how else a run can generate while its patches go wrong (a mismatch's advice)
    adapters: AdapterServer | None  # where it serves LoRA itself: what takes the adapters; None: it holds them merged

    def load(self, weights: Iterable[tuple[str, Any]]) -> None:
        """(checkpoint name, full tensor) pairs, every weight once; a tensor may be released after it is read."""

    def patch(self, patches: list[Patch]) -> None:
        """Patches, each checkpoint tensor at most once per call."""

    def checksums(self, groups: set[str] | None = None) -> dict[str, tuple[int, int]]:
        """`delta.bit_sums` of the weights it holds, by its own names: those of `groups` (`delta.group_of` of a
        name), or all."""

    def reset(self) -> None:
        """After the weights changed: forget what was computed from the old ones (a prefix cache)."""

    def after_sync(self, model: Any, woke: bool) -> dict[str, Any]:
        """Whatever the target checks after a sync (vLLM's logprob self-check), for the sync's record."""


class AdapterServer(Protocol):
    """A generator's own LoRA (rlhf_cli/rank/engines/adapters.py): it holds the base and takes the adapters."""

    max_rank: int  # the largest adapter rank it serves

    def load(self, packed: Any) -> None:
        """Serve the adapters of `packed` (adapters.PackedAdapters) from the next generation on."""

    def checksums(self) -> dict[str, tuple[int, int]] | None:
        """`delta.bit_sums` of the adapter matrices it serves, by its own names (`delta.group_of` of a name: the
        module group); None where it cannot show them whole (tensor parallel: each rank serves slices)."""


@dataclass(frozen=True)
class SyncLimit:
    """How much of the policy one bucket gathers: None the whole policy, 0 one unit, else at most `numel`
    elements (a unit larger than that is a bucket of its own: a unit is never split)."""

    numel: int | None

    @classmethod
    def of(cls, gather: Gather, model: Any) -> SyncLimit:
        """The gather choice as a bucket limit for `model` (rlhf_cli/generation/sync_buckets.py, as the plan)."""
        params = unique_params(model)
        element_bytes = params[0].element_size() if params else 1
        return cls(bucket_limit(gather, sum(full_numel(p) for p in params), element_bytes))


def checkpoint_name(name: str) -> str | None:
    """The checkpoint name a generator loads a policy parameter under, or None for a tensor it does not hold
    (LoRA's own matrices, PEFT's copy of an original module)."""
    for prefix in PEFT_PREFIXES:
        name = name.removeprefix(prefix)
    if ".lora_" in name or "original_module" in name:
        return None
    name = name.replace(".base_layer", "")
    for dropped in DROPPED_IN_NAMES:
        name = name.replace(dropped, "")
    return name


def checkpoint_names(model: Any) -> Callable[[str], str | None]:
    """`checkpoint_name` for `model`'s parameters, with the renamings transformers applies at load undone: a
    generator loads the names the checkpoint has (rlhf_cli/compat/vllm.checkpoint_renamings)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    renamings = vllm_compat.checkpoint_renamings(base) if hasattr(base, "config") else []

    def name(param_name: str) -> str | None:
        found = checkpoint_name(param_name)
        for pattern, replacement in renamings if found is not None else ():
            found = re.sub(pattern, replacement, found)
        return found

    return name


def sent_names(model: Any) -> dict[int, str]:
    """The checkpoint name of each parameter the generator holds, by the parameter's id (a tied weight: its
    first name)."""
    named = checkpoint_names(model)
    found: dict[int, str] = {}
    for param_name, param in model.named_parameters():
        name = named(param_name)
        if name is not None and id(param) not in found:
            found[id(param)] = name
    return found


def bucket_weights(model: Any, units: list[ModuleUnit], packed: list[list[int]],
                   measure: GatheredBytes, merge: bool = True) -> Iterator[tuple[str, Any]]:
    """(checkpoint name, full tensor) of every weight, a bucket gathered (and its LoRA layers merged, unless not
    `merge`: a generator serving the adapters takes the base alone) at a time; a parameter outside every unit (on
    a module with children, outside the decoder layers) is gathered alone."""
    names = sent_names(model)
    sent: set[int] = set()
    for params, modules in bucket_contents(model, units, packed):
        with gathered(params), _merged(modules if merge else []) as merged:
            measure.sample()
            measure.merged += merged
            for param in params:
                if id(param) in names and id(param) not in sent:
                    sent.add(id(param))
                    yield names[id(param)], param.data


def bucket_contents(model: Any, units: list[ModuleUnit],
                    packed: list[list[int]]) -> list[tuple[list[Any], list[Any]]]:
    """(parameters, modules) of each bucket of units, then each parameter outside every unit alone."""
    in_units = {id(param) for unit in units for param in unit.params}
    contents = [([param for index in bucket for param in units[index].params],
                 [module for index in bucket for module in units[index].modules]) for bucket in packed]
    return contents + [([param], []) for param in unique_params(model) if id(param) not in in_units]


@contextlib.contextmanager
def gathered(params: list[Any]) -> Iterator[None]:
    """The full tensors of `params` for the block (read only: no rank's changes are written back)."""
    if not any(hasattr(param, "ds_id") for param in params):
        yield
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
        yield


@contextlib.contextmanager
def _merged(modules: list[Any]) -> Iterator[int]:
    """LoRA layers among `modules` merged into their base weights for the block (how many), unmerged after."""
    layers = lora_layers(modules)
    for layer in layers:
        layer.merge()
    try:
        yield len(layers)
    finally:
        for layer in layers:
            layer.unmerge()


def lora_layers(modules: list[Any]) -> list[Any]:
    """PEFT's LoRA layers among `modules` that are not merged already."""
    return [module for module in modules if hasattr(module, "merge") and hasattr(module, "unmerge")
            and getattr(module, "lora_A", None) is not None and not getattr(module, "merged", False)]


class GatheredBytes:
    """The bytes of the policy's parameters that are whole on this rank right now, at their most: what ZeRO-3
    itself says (`ds_status`) of every parameter, so that anything gathered beyond the bucket counts too. And
    the LoRA layers merged to be sent (`merged`)."""

    def __init__(self, model: Any) -> None:
        self.params = unique_params(model)
        self.zero3 = any(hasattr(param, "ds_status") for param in self.params)
        self.full = sum(full_numel(p) * p.element_size() for p in self.params)
        self.peak = 0
        self.merged = 0
        if self.zero3:
            _, self.partitioned = compat.zero3_param_states()

    def sample(self) -> None:
        if not self.zero3:
            self.peak = self.full  # nothing is partitioned: the whole policy is always there
            return
        held = sum(p.ds_numel * p.element_size() for p in self.params if p.ds_status != self.partitioned)
        self.peak = max(self.peak, held)


def unique_params(model: Any) -> list[Any]:
    return list({id(p): p for p in model.parameters()}.values())


def full_numel(param: Any) -> int:
    return getattr(param, "ds_numel", None) or param.numel()
