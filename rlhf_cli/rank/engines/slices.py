"""What a rank compares in the delta sync (rlhf_cli/rank/engines/delta.py): its own slice of each weight the
generator holds, as a full sync would send it, without gathering a weight.

Without LoRA that slice is the rank's ZeRO-3 partition. With LoRA a full sync sends an adapted module's weight
merged (its base plus the adapters' delta, rlhf_cli/rank/engines/weights.bucket_weights), so a rank adds to its
partition of the base the same elements of the adapters' delta, computed as PEFT's merge computes it: the adapters
(r rows and columns) are gathered, the base never, and the sum rounds to the policy's dtype as the merge's
in-place add does. A frozen weight outside every adapted module never changes: after the first sync it is neither
compared nor sent (it is still checked), so a LoRA run's deltas hold the adapted modules' weights only.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rlhf_cli.generation.sync_buckets import buckets
from rlhf_cli.rank.engines.weights import SyncLimit, bucket_contents, gathered, lora_layers, sent_names, unique_params
from rlhf_cli.rank.zero3 import policy_units

ADAPTER_PREFIX = "lora_"  # PEFT's adapter matrices: lora_A, lora_B, lora_embedding_A, lora_embedding_B


def own_slice(param: Any) -> tuple[int, Any]:
    """(flat start, this rank's part of the flattened full tensor): its ZeRO-3 partition without the padding, or,
    for a parameter ZeRO-3 does not partition, all of it on the first rank and nothing elsewhere."""
    import torch.distributed as dist

    if hasattr(param, "ds_tensor"):
        rank = dist.get_rank(group=param.ds_process_group)
        size = param.ds_tensor.numel()
        start = rank * size
        return start, param.ds_tensor.data.flatten()[:max(0, min(size, param.ds_numel - start))]
    flat = param.data.flatten()
    return 0, flat if not dist.is_initialized() or dist.get_rank() == 0 else flat[:0]


def adapted_weights(model: Any) -> dict[int, Any]:
    """The LoRA layer of each adapted base weight, by the weight's id."""
    return {id(layer.get_base_layer().weight): layer for layer in lora_layers(list(model.modules()))}


def unmergeable(model: Any) -> str | None:
    """Why a LoRA layer's merged weight is not base + the delta of its adapters (a variant such as DoRA, or an
    adapter bias that changes the base bias), or None."""
    for name, module in model.named_modules():
        if lora_layers([module]) and (getattr(module, "lora_variant", None)
                                                or any(getattr(module, "lora_bias", {}).values())):
            return f"LoRA layer {name} merges otherwise than base + B·A (DoRA or an adapter bias): dense syncs"
    return None


def tracked_names(model: Any) -> dict[int, str]:
    """The checkpoint name of each weight a step can change (trained, or the base of an adapted module), by id."""
    params = {id(param): param for param in unique_params(model)}
    adapted = adapted_weights(model)
    return {key: name for key, name in sent_names(model).items() if key in adapted or params[key].requires_grad}


def bucket_params(model: Any, limit: SyncLimit) -> list[list[Any]]:
    """The parameters of each bucket of the gather choice, in the order `bucket_slices` yields them."""
    return [params for params, _ in _contents(model, limit)]


def _contents(model: Any, limit: SyncLimit) -> list[tuple[list[Any], list[Any]]]:
    units = policy_units(model)
    return bucket_contents(model, units, buckets([unit.unit.numel for unit in units], limit.numel))


def bucket_slices(model: Any, limit: SyncLimit) -> Iterator[tuple[list[Any], dict[int, tuple[int, Any]]]]:
    """Per bucket of the gather choice: its weights a step can change, and this rank's (flat start, slice in the
    policy's dtype, merged) of each by id. Every rank takes part (an adapted bucket gathers its adapters)."""
    tracked = tracked_names(model)
    adapted = adapted_weights(model)
    for params, modules in _contents(model, limit):
        mine = [param for param in params if id(param) in tracked]
        layers = lora_layers(modules)
        adapters = [param for layer in layers for name, param in layer.named_parameters()
                    if name.startswith(ADAPTER_PREFIX) or f".{ADAPTER_PREFIX}" in name]
        with gathered(adapters):
            slices = {id(param): merged_slice(param, adapted.get(id(param))) for param in mine}
        yield mine, slices


def merged_slice(param: Any, layer: Any | None) -> tuple[int, Any]:
    """(flat start, this rank's slice of `param`), with the active adapters' delta of `layer` added, one adapter at
    a time, as PEFT's `merge` adds them (`base.weight.data += delta`: one rounding to the base's dtype each)."""
    start, own = own_slice(param)
    if layer is None:
        return start, own
    merged = own
    for adapter in layer.active_adapters:
        if adapter in layer.lora_A or adapter in getattr(layer, "lora_embedding_A", {}):
            delta = layer.get_delta_weight(adapter).flatten()[start:start + own.numel()]
            merged = (merged + delta).to(own.dtype)
    return start, merged
