"""What colocated vLLM means for a run, and the first colocated vLLM configuration that fits it.

The columns come from `rlhf_cli.plan.estimate` through `evaluate` (a candidate -> its column).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace

from rlhf_cli.generation.choice import Engine, Gather, Generation
from rlhf_cli.plan import memory
from rlhf_cli.plan.columns import OFFLOADS, Candidate, Column
from rlhf_cli.plan.engines import vllm
from rlhf_cli.plan.engines.vllm import VllmSettings
from rlhf_cli.plan.hardware import Hardware
from rlhf_cli.plan.model_sizes import ModelSize
from rlhf_cli.plan.workload import Workload
from rlhf_cli.sizes import gib

Evaluate = Callable[[Candidate], Column]


def findings(evaluate: Evaluate, hw: Hardware, work: Workload, policy: ModelSize, settings: VllmSettings,
             engine: Engine = Engine.colocate, own_offload: tuple[str, str] = ("none", "none")) -> list[str]:
    """What colocated vLLM means for this run (its own copy of the policy beside training), what the run's own
    vLLM settings leave, and the first colocated configuration that fits, or why none does."""
    size_bytes = work.element_bytes
    whole = policy.params * size_bytes
    found = [f"colocated vLLM keeps its own copy of the policy on every GPU, {gib(whole)} / "
             "vllm_tensor_parallel_size, for the whole run unless it sleeps: without tensor parallelism or sleep "
             f"that is as much as gathering holds ({gib(whole)}), so it makes generation faster, not smaller; "
             "with tensor parallelism across the GPUs and vllm_enable_sleep_mode it can do both"]
    if engine.spec.is_server:
        found.append("--vllm server: vLLM runs on GPUs of its own, not counted here; the training GPUs hold "
                     "only the sync's gathered bucket")
    elif vllm.kv_room(settings, hw.gpu_memory, policy.params, size_bytes) <= 0:
        found.append(f"vllm_gpu_memory_utilization {settings.gpu_memory_utilization:g} gives vLLM "
                     f"{gib(vllm.budget(settings, hw.gpu_memory))}, less than its weights "
                     f"({gib(vllm.weights(settings, policy.params, size_bytes))}): it cannot start")
    elif not vllm.starts(settings, hw.gpu_memory, policy.params, size_bytes, longest_kv(settings, work, policy)):
        length = vllm.model_length(settings, policy.max_positions, work.prompt_length + work.completion_length)
        found.append(f"vllm_gpu_memory_utilization {settings.gpu_memory_utilization:g} leaves vLLM less KV cache "
                     f"than one sequence of its model length ({length} tokens: vllm_max_model_length, else the "
                     "model's max_position_embeddings): it cannot start; set vllm_max_model_length to the prompt + "
                     "completion length, or raise vllm_gpu_memory_utilization")
    return [*found, search(evaluate, hw, work, policy, settings.max_model_length, own_offload)]


def longest_kv(settings: VllmSettings, work: Workload, policy: ModelSize) -> int:
    """KV cache bytes of one sequence of vLLM's model length, over all the GPUs of a tensor-parallel group."""
    length = vllm.model_length(settings, policy.max_positions, work.prompt_length + work.completion_length)
    return memory.kv_cache(policy, 1, length, work.element_bytes)


def search(evaluate: Evaluate, hw: Hardware, work: Workload, policy: ModelSize, max_model_length: int | None = None,
           own_offload: tuple[str, str] = ("none", "none")) -> str:
    """The first colocated vLLM configuration that fits, trying the cheapest first: no offload before offload,
    awake before sleeping, less tensor parallelism before more, the whole policy synced before one unit; where
    it needs more offload than the run's own, also the least the run's own offload needs."""
    columns = list(_tried(evaluate, hw, work, policy, max_model_length))
    if not columns:
        return "no colocated vLLM configuration fits: its weights and KV cache exceed 95% of a GPU at any " \
               "tensor-parallel size this machine allows"
    own = min((c for c in columns if (c.candidate.offload_optimizer, c.candidate.offload_params) == own_offload),
              key=lambda c: c.peak, default=None)
    fit = next((column for column in columns if column.fits), None)
    if fit is None:
        best = min(columns, key=lambda c: c.peak)
        return (f"no colocated vLLM configuration fits: the least, {best.candidate.label}, needs {gib(best.peak)} "
                f"of {gib(hw.gpu_memory)} per GPU; --vllm server (vLLM on GPUs of its own) or --lora may")
    found = _fit(fit, hw.gpu_memory)
    if own is not None and not own.fits and OFFLOADS.index(own_offload) < OFFLOADS.index(
            (fit.candidate.offload_optimizer, fit.candidate.offload_params)):
        found += (f"; with the run's own offload ({own.candidate.offload_short}) the least, {own.candidate.label}, "
                  f"needs {gib(own.peak)} of the {gib(int(hw.gpu_memory * (1 - memory.MARGIN)))} that fit")
    return found


def _tried(evaluate: Evaluate, hw: Hardware, work: Workload, policy: ModelSize,
           max_model_length: int | None) -> Iterator[Column]:
    """Every colocated configuration in the search's order, each with the least share that holds vLLM's weights
    and KV cache (the generation batch's, or one sequence of its model length)."""
    kv = memory.kv_cache(policy, work.generation_batch, work.prompt_length + work.completion_length,
                         work.element_bytes)
    for optimizer, params in OFFLOADS:
        for sleep in (False, True):
            for size in vllm.tensor_parallel_sizes(hw.gpus_per_machine):
                shape = VllmSettings(tensor_parallel_size=size, max_model_length=max_model_length)
                weights = vllm.weights(shape, policy.params, work.element_bytes)
                longest = -(-longest_kv(shape, work, policy) // size)
                utilization = vllm.least_utilization(hw.gpu_memory, weights, max(kv, longest))
                if utilization is None:
                    continue
                settings = replace(shape, gpu_memory_utilization=utilization, sleep=sleep)
                for gather in (Gather.whole, Gather.shards):
                    yield evaluate(Candidate(Generation(gather, Engine.colocate), optimizer, params,
                                             engine_settings=settings))


def _fit(column: Column, gpu_memory: int) -> str:
    candidate = column.candidate
    settings = candidate.engine_settings
    assert settings is not None
    sync = "--gather (the whole policy at once)" if candidate.generation.gather == Gather.whole else \
        "--no-gather (one unit at a time)"
    return (f"vLLM fits colocated with vllm_tensor_parallel_size {settings.tensor_parallel_size}, "
            f"vllm_gpu_memory_utilization {settings.gpu_memory_utilization:g}"
            f"{', vllm_enable_sleep_mode' if settings.sleep else ''}, sync {sync}, offload "
            f"{candidate.offload_short}: {gib(column.peak)} of {gib(gpu_memory)} per GPU")
