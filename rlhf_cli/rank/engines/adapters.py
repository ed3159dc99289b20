"""The adapter sync: a generator that serves LoRA itself (vLLM's LoRA, rlhf_cli/config/engines/vllm_lora.py) holds the
frozen base, sent once unmerged, and takes only the adapter matrices at every sync.

The adapters are gathered a bucket of the run's gather choice at a time (under ZeRO-3 they are partitioned like
every parameter), cast to the generator's dtype and named as PEFT saves them (`base_model.model.<module>.lora_A.
weight`). Each B is sent already multiplied by its layer's scaling (alpha / r, or / √r with rsLoRA), and the
adapter's config says alpha = r: the generator multiplies by 1, so what it holds is bit for bit what was sent,
and checked so (`bit_sums` per module group, both sides).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlhf_cli.generation.sync_buckets import buckets
from rlhf_cli.rank.engines.delta import SyncMismatch, bit_sums, group_of, suspects, total_sums
from rlhf_cli.rank.engines.slices import unmergeable
from rlhf_cli.rank.engines.weights import bucket_contents, checkpoint_names, gathered, lora_layers
from rlhf_cli.rank.zero3 import policy_units

ADAPTER_SCOPE = "LoRA: only the adapter matrices (lora_A, lora_B) are sent; the generator holds the base, sent once"
PEFT_PREFIX = "base_model.model."  # the prefix of PEFT's saved adapter names, which vLLM strips


@dataclass(frozen=True)
class PackedAdapters:
    """One sync's adapters: PEFT-format tensors, the adapter config that loads them, their checksums by group."""

    tensors: dict[str, Any]  # PEFT name -> tensor on the host, in the generator's dtype
    config: dict[str, Any]  # adapter_config.json
    sums: dict[str, dict[str, tuple[int, int]]]  # group -> {module.lora_A|lora_B: bit_sums}
    peak_bytes: int  # the most adapter bytes gathered at once

    @property
    def bytes(self) -> int:
        return sum(tensor.numel() * tensor.element_size() for tensor in self.tensors.values())


def adapter_problem(model: Any, max_rank: int) -> str | None:
    """Why `model`'s adapters cannot be sent alone to a generator serving LoRA up to `max_rank`, or None: a merge
    other than base + B·A, a weight trained outside the adapters, an adapter on an embedding or the LM head, more
    than one active adapter, a larger rank."""
    reason = unmergeable(model)
    if reason:
        return reason
    trained = next((name for name, param in model.named_parameters() if param.requires_grad and ".lora_" not in name),
                   None)
    if trained:
        return f"{trained} trains outside the adapters: the generator holds the policy merged"
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    for name, layer in _adapted(model):
        if getattr(layer, "lora_embedding_A", None) or (head is not None and head in (layer, layer.get_base_layer())):
            return f"{name} adapts an embedding or the LM head: the generator holds the policy merged"
        if len(layer.active_adapters) != 1:
            return f"{name} has {len(layer.active_adapters)} active adapters: the generator holds the policy merged"
        if max(layer.r.values()) > max_rank:
            return f"{name}'s rank {max(layer.r.values())} is above the generator's {max_rank}: merged syncs"
    return None


def pack_adapters(model: Any, limit: Any, dtype: Any) -> PackedAdapters:
    """Every LoRA layer's active A and scaled B, gathered a bucket of `limit` (a SyncLimit) at a time. Every rank
    takes part (a bucket's gather is a collective) and gets all of them."""
    names = {id(module): name for name, module in model.named_modules()}
    renamed = checkpoint_names(model)
    units = policy_units(model)
    tensors: dict[str, Any] = {}
    sums: dict[str, dict[str, tuple[int, int]]] = {}
    ranks, peak = set(), 0
    for _, modules in bucket_contents(model, units, buckets([unit.unit.numel for unit in units], limit.numel)):
        layers = lora_layers(modules)
        matrices = [param for layer in layers for adapter in layer.active_adapters
                    for param in (layer.lora_A[adapter].weight, layer.lora_B[adapter].weight)]
        with gathered(matrices):
            peak = max(peak, sum(param.numel() * param.element_size() for param in matrices))
            for layer in layers:
                module = renamed(names[id(layer)] + ".weight").removesuffix(".weight")
                adapter = layer.active_adapters[0]
                ranks.add(layer.r[adapter])
                for kind, value in (("lora_A", layer.lora_A[adapter].weight.data),
                                    ("lora_B", layer.lora_B[adapter].weight.data * layer.scaling[adapter])):
                    tensor = value.to(dtype).cpu().contiguous()
                    tensors[f"{PEFT_PREFIX}{module}.{kind}.weight"] = tensor
                    sums.setdefault(group_of(module + ".weight"), {})[f"{module}.{kind}"] = bit_sums(tensor)
    rank = max(ranks, default=1)
    targets = sorted({name.removeprefix(PEFT_PREFIX).rsplit(".", 2)[0].rsplit(".", 1)[-1] for name in tensors})
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": rank, "target_modules": targets, "bias": "none",
              "use_rslora": False, "use_dora": False}
    return PackedAdapters(tensors, config, sums, peak)


def check_adapters(packed: PackedAdapters, held: dict[str, tuple[int, int]] | None, sync: int,
                   instead: str) -> int:
    """How many groups of adapters the generator holds as `packed` sent them (`held`: `bit_sums` by the generator's
    own names, which `group_of` maps to the same groups; None: it cannot show them, none checked); SyncMismatch
    naming the adapter matrix when one differs (during weight sync number `sync`)."""
    if held is None:
        return 0
    found: dict[str, dict[str, tuple[int, int]]] = {}
    for name, pair in held.items():
        found.setdefault(group_of(name), {})[name] = pair
    for group in sorted(set(packed.sums) | {group for group, members in found.items()
                                              if total_sums(list(members.values())) != (0, 0)}):
        sent = packed.sums.get(group, {})
        if total_sums(list(sent.values())) != total_sums(list(found.get(group, {}).values())):
            culprit = suspects({"members": sent}, found.get(group, {}), set()) if sent else f"adapters of {group}"
            raise SyncMismatch(
                f"after weight sync {sync}, the generator's LoRA {culprit} differs from the policy's (bit checksums "
                "of the adapters sent): an adapter was lost or misloaded. Run with --set weight_sync_delta=false "
                f"(the policy merged, every weight at every sync), or {instead}, until this is fixed, and report it "
                "with the model's config.json")
    return len(packed.sums)


def _adapted(model: Any) -> list[tuple[str, Any]]:
    return [(name, module) for name, module in model.named_modules() if lora_layers([module])]
