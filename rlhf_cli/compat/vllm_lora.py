"""vLLM's LoRA as the adapter sync uses it (rlhf_cli/rank/engines/vllm/adapters.py): a colocated engine built with
LoRA takes each sync's adapters as a new LoRA through its public `LLMEngine.add_lora`, and the sync reads back,
through the private internals listed here, the matrices the engine serves, to check them against what it sent; a
server's worker reads them the same way (rlhf_cli/rank/engines/vllm/worker_extension.py).
Beside rlhf_cli/compat/vllm.py (the rest of vLLM's internals), resolved only where vLLM is installed.
"""

from __future__ import annotations

from typing import Any

from rlhf_cli.compat import Internal

VLLM_LORA_INTERNALS = (
    Internal("vllm.v1.worker.lora_model_runner_mixin:LoRAModelRunnerMixin.load_lora_model",
             "the adapter sync checks the adapters a colocated vLLM serves against those it sent: it reads the "
             "model runner's `lora_manager` (set here), its adapter manager's `lora_index_to_id` (the slot of each "
             "served LoRA) and each LoRA layer's `lora_a_stacked` / `lora_b_stacked` (the slot's matrices, padded "
             "with zeros)", "vLLM reports the adapters it serves", ("model", "vllm_config", "device")),
    Internal("vllm.lora.model_manager:LoRAModelManager.activate_adapter",
             "as above: it copies a LoRA into its slot of the layers' stacked matrices", "as above", ("lora_id",)),
    Internal("vllm.lora.layers:BaseLayerWithLoRA.set_lora",
             "as above: the LoRA layers whose stacked matrices the check reads", "as above",
             ("index", "lora_a", "lora_b")),
    Internal("vllm.lora.worker_manager:WorkerLoRAManager.list_adapters",
             "a server's worker reports the LoRA it serves (rlhf_cli/rank/engines/vllm/worker_extension.py): the ids "
             "its model runner's `lora_manager` holds", "as above"),
    Internal("vllm.entrypoints.serve.engine.serving:BaseServing._maybe_get_adapters",
             "a server serves the run's adapters to TRL's client, which names the model and never a LoRA: the run "
             "loads them under the model's name (rlhf_cli/rank/engines/vllm/server_lora.py), and vLLM serves a "
             "request naming a loaded LoRA with it before it looks at the base models "
             "(tests/test_lora_serving.py asserts it)",
             "TRL's client passes a LoRA name, or vLLM's server takes a default LoRA", ("request",)),
)


def vllm_swap_lora(llm: Any, previous: int | None, request: Any) -> None:
    """Serve the LoRA of `request` (a vllm LoRARequest) in a colocated `vllm.LLM`, loaded now, in place of the
    LoRA `previous` (its id; None for none)."""
    engine = llm.llm_engine
    if previous is not None:
        engine.remove_lora(previous)
    if not engine.add_lora(request):
        raise RuntimeError(f"vLLM did not load the LoRA at {request.lora_path}")


def vllm_tensor_parallel_size(llm: Any) -> int:
    """How many ranks a colocated `vllm.LLM` shards its layers over (each serves a slice of a LoRA's matrices)."""
    return llm.llm_engine.vllm_config.parallel_config.tensor_parallel_size


def vllm_lora_ids(runner: Any) -> list[int]:
    """The ids of the LoRAs a vLLM worker's model runner (colocated: `vllm_model_runner`; a server's worker:
    its own) holds loaded; none where it runs without LoRA."""
    manager = getattr(runner, "lora_manager", None)
    return sorted(manager.list_adapters()) if manager is not None else []


def vllm_served_lora(runner: Any, lora_id: int) -> dict[str, Any]:
    """The matrices a vLLM worker's model runner serves for the LoRA `lora_id`, by `<layer>.lora_a<slice>` and
    `<layer>.lora_b<slice>` (a packed layer, such as `qkv_proj`, has a slice per module it packs), zero-padded to
    the engine's largest rank; empty when that LoRA is not active."""
    from vllm.lora.layers import BaseLayerWithLoRA

    slots = runner.lora_manager._adapter_manager.lora_index_to_id
    if lora_id not in slots:
        return {}
    slot = slots.index(lora_id)
    found = {}
    for name, module in runner.get_model().named_modules():
        if isinstance(module, BaseLayerWithLoRA):
            for kind, stacked in (("lora_a", module.lora_a_stacked), ("lora_b", module.lora_b_stacked)):
                for index, matrices in enumerate(stacked):
                    found[f"{name}.{kind}{index}"] = matrices[slot]
    return found
