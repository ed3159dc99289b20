"""A colocated vLLM as the weight sync's target (rlhf_cli/rank/engines/weights.WeightTarget): whole weights through
one layerwise reload, patches through vLLM's checkpoint-coordinate loader, both followed by the re-processing the
engine needs after a load (rlhf_cli/compat/vllm.py), and the logprob self-check after a sync it is due for."""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable
from typing import Any

from rlhf_cli.compat import vllm as vllm_compat
from rlhf_cli.rank.engines.delta import bit_sums, group_of
from rlhf_cli.rank.engines.weights import Patch


class ColocatedVLLM:
    """The `vllm.LLM` in this rank's process."""

    dense_reason = None  # it takes patches
    instead = "with --vllm server or without --vllm"

    def __init__(self, llm: Any, check: Any | None = None) -> None:
        self.llm = llm
        self.check = check  # a rlhf_cli/rank/engines/vllm/self_check.SyncCheck, or None
        self.model = vllm_compat.vllm_model(llm)
        self.dtype = vllm_compat.vllm_dtype(llm)
        self.kept = vllm_compat.vllm_keep_unpacked_weights(self.model)  # filled by the first reload
        self.adapters = getattr(llm, "rlhf_lora", None)  # its own LoRA (vllm/adapters.py), when it serves one
        self.lora_reason = getattr(llm, "rlhf_lora_reason", None)  # why it holds a LoRA policy merged

    @classmethod
    def of(cls, llm: Any, check: Any | None = None) -> ColocatedVLLM:
        """The one target of `llm` (it remembers which weights it kept)."""
        target = getattr(llm, "rlhf_target", None)
        if target is None:
            target = llm.rlhf_target = cls(llm, check)
        return target

    def load(self, weights: Iterable[tuple[str, Any]]) -> None:
        vllm_compat.vllm_reload_weights(self.llm, weights)

    def patch(self, patches: list[Patch]) -> None:
        vllm_compat.vllm_apply_patches(self.model, [(patch.name, patch.shape, self.dtype, patch.values,
                                                     patch.indices) for patch in patches], self.kept)

    def checksums(self, groups: set[str] | None = None) -> dict[str, tuple[int, int]]:
        return vllm_checksums(self.model, self.kept, self.dtype, groups)

    def reset(self) -> None:
        vllm_compat.vllm_reset_prefix_cache(self.llm)

    def after_sync(self, model: Any, woke: bool) -> dict[str, Any]:
        if self.check is None or not self.check.due(woke):
            return {}
        started = time.perf_counter()
        difference = self.check.run(model, self.llm, woke)
        return {"check_logp_difference": difference["mean"], "check_logp_difference_max": difference["max"],
                "check_seconds": time.perf_counter() - started}


def vllm_checksums(model: Any, kept: dict[Any, Any], dtype: Any,
                   groups: Collection[str] | None = None) -> dict[str, tuple[int, int]]:
    """`bit_sums` of each weight a vLLM model holds (of `groups`, or all), by its own name without the `base_layer`
    of a layer vLLM's LoRA wraps (a weight it dropped after repacking: as `kept`,
    rlhf_cli/compat/vllm.vllm_keep_unpacked_weights), in the model's `dtype`: the CPU build widens a linear layer's
    bias to float32 after loading it, which the cast back undoes exactly."""
    owners = {id(module._parameters.get("weight")): module for module in model.modules()
              if hasattr(module, "_parameters")}
    found = {}
    for wrapped, param in model.named_parameters():
        name = wrapped.replace(".base_layer.", ".")
        if groups is not None and group_of(name) not in groups:
            continue
        held = kept.get(owners.get(id(param)), param) if name.endswith(".weight") else param
        if held.numel():
            found[name] = bit_sums(held.to(dtype) if held.is_floating_point() else held)
    return found
