"""The shard-local delta sync: after an optimizer step every rank compares its own ZeRO-3 partition of each
parameter, cast to the generator's dtype, with the partition it last sent (a snapshot in that dtype on the host,
1/N of the model), and sends only (flat index into the full checkpoint tensor, value) for what changed. No
parameter is gathered: patches are exchanged between ranks a bucket at a time (the run's gather choice bounds a
bucket: rlhf_cli/rank/engines/weights.py) and every rank's generator applies every rank's patches.

DeepSpeed (0.19.8, partition_parameters._partition_param) partitions a parameter's flattened tensor, padded to a
multiple of the world size, into equal contiguous slices: rank r holds flat indices [r*n, (r+1)*n) in
`param.ds_tensor` (n its numel), the last one's tail padding past `param.ds_numel`.

Between two RL steps most half-precision weights keep their bits (an update of lr 1e-6 moves few across a bf16
step), so the patches are small; a partition of which so many elements changed that patching costs more bytes
than the slice itself is sent whole. The first sync, a wake from a sleep that dropped the weights and a generator
in float32 (every element changes at every step) are dense, and the record says why. With LoRA a generator that
serves the adapters itself takes them alone (rlhf_cli/rank/engines/adapters.py); into one that holds the merged
model, after the first sync only the adapted modules' merged weights are compared and patched, each rank's slice
of the base plus the same slice of the adapters' delta (rlhf_cli/rank/engines/slices.py); the frozen
base is never sent again.

Exact, and checked: after every sync the generator's weights are compared with the policy's by checksums of
their bits (`bit_sums`, exact integer sums that do not depend on how the generator lays a tensor out: fused,
transposed or padded), per group of parameters of one module, each group as soon as the bucket holding its last
parameter is applied; a difference stops the run with one line naming the parameter. A group the generator
already holds differently after a dense sync (it transforms the values at load) is left out of the check, and the
record counts it.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any, ClassVar

from rlhf_cli.rank.engines.slices import (
    adapted_weights,
    bucket_params,
    bucket_slices,
    own_slice,
    tracked_names,
    unmergeable,
)
from rlhf_cli.rank.engines.weights import Patch, SyncLimit, WeightTarget, full_numel, sent_names, unique_params

CHECKSUM_CHUNK = 1 << 24  # elements
INDEX_BYTES = 4  # an int32 flat index; int64 for a tensor of 2**31 elements or more
FLOAT32_REASON = "the generator holds float32 weights, of which every step changes about all: dense syncs"
LORA_SCOPE = "LoRA: only the adapted modules' merged weights are compared and patched; the frozen base is not sent"
FULL_SCOPE = "every trained weight is compared; what changed is patched"
FIRST_REASON = "first sync: the generator holds the checkpoint"
WOKE_REASON = "the generator woke from a sleep that dropped its weights"
OFF_REASON = "weight_sync_delta is false: every sync sends the whole policy"


class SyncMismatch(RuntimeError):
    """The generator's weights differ from the policy's after a sync."""


class PatchesRefused(RuntimeError):
    """The generator cannot take a patch (its loader writes otherwise than by one same-shaped copy): dense from
    now on; what it took so far is overwritten by the dense sync that follows."""


class Tracker:
    """What this rank last sent one generator: its own partition of each parameter, in the generator's dtype."""

    _of: ClassVar[weakref.WeakKeyDictionary[Any, Tracker]] = weakref.WeakKeyDictionary()

    def __init__(self, target: WeightTarget) -> None:
        self.dtype = target.dtype
        self.snapshot: dict[int, Any] | None = None  # by the parameter's id
        self.unverified: set[str] = set()  # groups the generator transforms at load
        self.refused: str | None = None  # why the generator cannot take patches, once it said so
        self.lora = False  # the policy carries adapters: the generator holds it merged
        self.unmergeable: str | None = None  # why its merged weights are not base + the adapters' delta
        self.syncs = 0
        self.delta = True  # False: the recipe's `weight_sync_delta: false`, dense syncs (for debugging)
        self.base_held = False  # the generator serves the adapters and holds the unmerged base this rank sent

    @classmethod
    def of(cls, model: Any, target: WeightTarget, delta: bool = True) -> Tracker:
        """The tracker of `target` (a new one for a new target), for a sync that may be a delta (`delta`)."""
        if target not in cls._of:
            cls._of[target] = cls(target)
        tracker = cls._of[target]
        tracker.delta = delta
        tracker.lora = hasattr(model, "peft_config")
        tracker.unmergeable = unmergeable(model) if tracker.lora else None
        return tracker

    def dense_reason(self, woke: bool, target: WeightTarget | None = None) -> str | None:
        """Why the sync due now is dense, or None for a delta."""
        import torch

        reasons = [(getattr(target, "dense_reason", None), True), (OFF_REASON, not self.delta), (self.refused, True),
                   (FLOAT32_REASON, self.dtype == torch.float32), (self.unmergeable, True),
                   (FIRST_REASON, self.snapshot is None), (WOKE_REASON, woke)]
        return next((reason for reason, applies in reasons if reason and applies), None)

    def base_reason(self, woke: bool) -> str | None:
        """Why a generator that serves the adapters gets the unmerged base with this sync, or None: it holds it."""
        reasons = [(FIRST_REASON, not self.base_held), (WOKE_REASON, woke)]
        return next((reason for reason, applies in reasons if applies), None)

    def after_dense(self, model: Any, target: WeightTarget, limit: SyncLimit, woke: bool,
                    merged: bool = True) -> dict[str, Any]:
        """After a dense sync (of the unmerged base: not `merged`): this rank's snapshot of what a step can change,
        and the groups the generator holds as sent."""
        reason = self.dense_reason(woke, target) if merged else self.base_reason(woke)
        self.base_held = not merged
        self.syncs += 1
        if getattr(target, "dense_reason", None):  # it never takes patches: nothing to keep, nothing it shows
            sent = sum(full_numel(p) * p.element_size() for p in unique_params(model) if id(p) in sent_names(model))
            return {"mode": "dense", "dense_reason": reason, "bytes_sent": sent, "dense_bytes": sent,
                    "changed_share": None, "groups_verified": 0, "groups_unverified": []}
        self.snapshot = {key: value.to(self.dtype, copy=True).cpu() for _, slices in bucket_slices(model, limit)
                         for key, (_, value) in slices.items()} if self.delta and merged else None  # nothing to keep
        expected = self._expected(model)
        found = _group(target.checksums())
        self.unverified = {group for group, sums in _group(expected).items()
                           if found.get(group, {}).get("sum") != sums["sum"]}
        whole = dense_bytes(model, self.dtype)
        return {"mode": "dense", "dense_reason": reason, "bytes_sent": whole, "dense_bytes": whole,
                "changed_share": None, "groups_verified": len(_group(expected)) - len(self.unverified),
                "groups_unverified": sorted(self.unverified)}

    def send_patches(self, model: Any, target: WeightTarget, limit: SyncLimit) -> dict[str, Any]:
        """Send what changed since the last sync, a bucket at a time, then check the generator's weights."""
        import torch

        names = tracked_names(model)
        sizes = torch.zeros(3, dtype=torch.int64)  # bytes sent, elements changed, elements compared
        patched: set[str] = set()
        due = _groups_due(model, limit)
        verified = 0
        for number, (params, slices) in enumerate(bucket_slices(model, limit)):
            mine = [self._diff(id(param), names[id(param)], *slices[id(param)], sizes) for param in params]
            everyone = _all_gather([piece for piece in mine if piece is not None])
            patches = _merge(everyone, {names[id(p)]: tuple(_shape(p)) for p in params})
            if patches:
                try:
                    target.patch(patches)
                except NotImplementedError as refused:  # vLLM's sparse-loader contract
                    self.refused = (f"the generator cannot take patches of {', '.join(p.name for p in patches)} "
                                    f"({refused}): dense syncs")
                    raise PatchesRefused(self.refused) from refused
                patched.update(patch.name for patch in patches)
            if due[number]:  # the groups this bucket completes
                verified += self.check(model, target, patched, due[number])
        self.syncs += 1
        sent, changed, total = (int(value) for value in _all_reduce(sizes))
        return {"mode": "sparse", "dense_reason": None, "scope": LORA_SCOPE if self.lora else FULL_SCOPE,
                "bytes_sent": sent, "dense_bytes": dense_bytes(model, self.dtype),
                "changed_share": changed / total if total else 0.0, "buckets": len(due),
                "limit_numel": limit.numel, "peak_bytes": 0,
                "full_bytes": sum(full_numel(p) * p.element_size() for p in unique_params(model)),
                "merged_lora_layers": len(adapted_weights(model)), "patched": sorted(patched),
                "groups_verified": verified}

    def _diff(self, key: int, name: str, start: int, own: Any, sizes: Any) -> tuple[str, int, Any, Any] | None:
        """(name, start, flat indices or None for the whole slice, values) of this rank's changed elements of the
        parameter `key` (its slice `own` from `start`), or None when none changed; the snapshot takes them.
        `sizes` adds bytes, changed, elements."""
        import torch

        current = own.to(self.dtype).cpu()
        snapshot = self.snapshot[key]
        changed = torch.nonzero(_bits(current) != _bits(snapshot)).flatten()
        sizes += torch.tensor([0, changed.numel(), current.numel()])
        if not changed.numel():
            return None
        value_bytes = current.element_size()
        index_dtype = torch.int32 if start + current.numel() < 2**31 else torch.int64
        if changed.numel() * (value_bytes + INDEX_BYTES) >= current.numel() * value_bytes:  # the slice is cheaper
            snapshot.copy_(current)
            sizes[0] += current.numel() * value_bytes
            return name, start, None, current.clone()
        values = current[changed]
        snapshot[changed] = values
        sizes[0] += changed.numel() * (value_bytes + torch.empty((), dtype=index_dtype).element_size())
        return name, start, (changed + start).to(index_dtype), values

    def _expected(self, model: Any, groups: set[str] | None = None) -> dict[str, tuple[int, int]]:
        """`bit_sums` of every full tensor the generator should hold (of `groups`, or all), from the snapshots of
        all ranks."""
        import torch

        names = sent_names(model)
        params = [param for param in unique_params(model) if id(param) in names
                  and (groups is None or group_of(names[id(param)]) in groups)]
        local = torch.stack([torch.tensor(bit_sums(self._held(param))) for param in params]) if params else \
            torch.zeros((0, 2), dtype=torch.int64)
        total = _all_reduce(local)
        return {names[id(param)]: (int(sums[0]), int(sums[1])) for param, sums in zip(params, total, strict=True)}

    def _held(self, param: Any) -> Any:
        if self.snapshot is not None and id(param) in self.snapshot:
            return self.snapshot[id(param)]
        return own_slice(param)[1].to(self.dtype)  # a frozen weight: as the first sync sent it

    def check(self, model: Any, target: WeightTarget, patched: set[str], groups: set[str]) -> int:
        """How many of `groups` of the generator's weights equal what was sent; SyncMismatch, naming the
        parameter, when one of them differs (during the sync after the `syncs` done). Every rank takes part."""
        expected, held = _group(self._expected(model, groups)), _group(target.checksums(groups))
        for group, sums in expected.items():
            if group not in self.unverified and held.get(group, {}).get("sum") != sums["sum"]:
                culprit = suspects(sums, held.get(group, {}).get("members", {}), patched)
                raise SyncMismatch(
                    f"after weight sync {self.syncs + 1}, the generator's {culprit} differs from the policy's (bit "
                    "checksums of the patched weights): a patch was lost or misapplied. Run with --set "
                    f"weight_sync_delta=false (dense syncs), or {target.instead}, until this is fixed, and report "
                    "it with the model's config.json")
        return len(expected) - len(self.unverified & set(expected))


def bit_sums(tensor: Any) -> tuple[int, int]:
    """Σb and Σb² (wrapping int64) over the bit patterns b of `tensor`'s elements: equal for equal multisets of
    values, whatever their order."""
    import torch

    views = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    flat = tensor.detach().contiguous().flatten().view(views[tensor.element_size()])
    first = second = 0
    for start in range(0, flat.numel(), CHECKSUM_CHUNK):  # int64 copies of a chunk at a time, not of the tensor
        bits = flat[start:start + CHECKSUM_CHUNK].to(torch.int64)
        first, second = first + int(bits.sum()), second + int((bits * bits).sum())
    return _wrap(first), _wrap(second)


def _bits(tensor: Any) -> Any:
    import torch

    return tensor.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()])


def _shape(param: Any) -> Any:
    return getattr(param, "ds_shape", None) or param.shape


def group_of(name: str) -> str:
    """The module whose parameters a generator may fuse, transpose or pad together: `model.layers.0.self_attn`
    for `model.layers.0.self_attn.q_proj.weight` (vLLM's `qkv_proj`), '' for `lm_head.weight`."""
    parts = name.split(".")
    return ".".join(parts[:-2])


def _groups_due(model: Any, limit: SyncLimit) -> list[set[str]]:
    """Per bucket, the groups whose last parameter it holds: complete, and checked, once it is applied."""
    names = sent_names(model)
    packed = bucket_params(model, limit)
    last = {group_of(names[id(param)]): number for number, params in enumerate(packed) for param in params
            if id(param) in names}
    due: list[set[str]] = [set() for _ in packed]
    for group, number in last.items():
        due[number].add(group)
    return due


def _group(sums: dict[str, tuple[int, int]]) -> dict[str, dict[str, Any]]:
    grouped: dict[str, dict[str, Any]] = {}
    for name, pair in sums.items():
        grouped.setdefault(group_of(name), {"members": {}})["members"][name] = pair
    for entry in grouped.values():
        entry["sum"] = total_sums(list(entry["members"].values()))
    return grouped


def total_sums(pairs: list[tuple[int, int]]) -> tuple[int, int]:
    """The sum of `bit_sums` pairs, wrapping as int64 does."""
    return _wrap(sum(pair[0] for pair in pairs)), _wrap(sum(pair[1] for pair in pairs))


def _wrap(value: int) -> int:
    return (value + 2**63) % 2**64 - 2**63


def suspects(sent: dict[str, Any], held: dict[str, tuple[int, int]], patched: set[str]) -> str:
    """The sent parameters no held tensor accounts for (a held tensor may be several sent ones fused): the one
    that differs, or those it is one of."""
    members = sent["members"]
    unexplained = set(members)
    if len(members) <= 12:
        for pair in held.values():
            for size in range(1, len(members) + 1):
                match = next((combo for combo in itertools.combinations(sorted(unexplained), size)
                              if total_sums([members[n] for n in combo]) == tuple(pair)), None)
                if match:
                    unexplained -= set(match)
                    break
    names = sorted(unexplained & patched) or sorted(unexplained) or sorted(members)
    return names[0] if len(names) == 1 else "one of " + ", ".join(names)


def _merge(pieces: list[tuple[str, int, Any, Any]], shapes: dict[str, tuple[int, ...]]) -> list[Patch]:
    """Every rank's pieces of one bucket as one patch per checkpoint tensor (the ranks' slices are disjoint)."""
    import torch

    by_name: dict[str, list[tuple[Any, Any]]] = {}
    for name, start, indices, values in pieces:
        flat = torch.arange(start, start + values.numel()) if indices is None else indices.long()
        by_name.setdefault(name, []).append((flat, values))
    return [Patch(name, shapes[name], torch.cat([values for _, values in found]),
                  torch.cat([flat for flat, _ in found])) for name, found in by_name.items()]


def dense_bytes(model: Any, dtype: Any) -> int:
    import torch

    names = sent_names(model)
    size = torch.empty((), dtype=dtype).element_size()
    return sum(full_numel(param) * size for param in unique_params(model) if id(param) in names)


def _all_gather(mine: list[Any]) -> list[Any]:
    """Every rank's pieces, in rank order (this rank's alone outside a process group)."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return mine
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return [piece for pieces in everyone for piece in pieces]


def _all_reduce(tensor: Any) -> Any:
    """`tensor` summed over the ranks (int64 wraps alike everywhere)."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return tensor
    import torch

    on = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else tensor.device
    summed = tensor.to(on, copy=True)
    dist.all_reduce(summed)
    return summed.cpu()
