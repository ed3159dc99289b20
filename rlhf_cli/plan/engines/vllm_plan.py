"""vLLM's part of a run's memory plan (rlhf_cli/plan/estimate.py): its rows in a column, whether it starts, the
sequences its KV cache holds, and whether `gather: auto` may choose it. Pure functions of the plan's inputs and one
candidate, over the byte counts of rlhf_cli/plan/engines/vllm.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlhf_cli.config.fields import catalogue
from rlhf_cli.config.run import ResolvedRun
from rlhf_cli.generation.choice import Engine
from rlhf_cli.generation.engines import USE_VLLM_KEY, installed
from rlhf_cli.plan import memory
from rlhf_cli.plan.columns import Candidate
from rlhf_cli.plan.engines import vllm
from rlhf_cli.plan.engines.vllm_search import longest_kv
from rlhf_cli.plan.inputs import Inputs
from rlhf_cli.plan.memory import TRAINING, Component


def engine_rows(inputs: Inputs, candidate: Candidate, rows: list[Component]) -> list[Component]:
    """vLLM's rows of a column whose other `rows` are counted (all 0 without vLLM): its copy of the policy is the
    policy with its adapters merged, synced a bucket at a time."""
    policy, size_bytes, adapter = inputs.roles[0].size, inputs.work.element_bytes, inputs.roles[0].adapter
    synced = policy.params + (adapter.params if candidate.lora and adapter else 0)
    bucket = max(numel for numel, _, _ in inputs.sync_buckets(candidate.generation.gather, candidate.lora)) * size_bytes
    copies = vllm.sync_copies(policy.largest_layer, policy.vocab, policy.hidden, size_bytes)
    return vllm.components(candidate.engine_settings, candidate.generation.engine, inputs.hardware.gpu_memory,
                           inputs.hardware.gpus_per_machine, synced, size_bytes, memory.phase_totals(rows)[TRAINING],
                           bucket, copies)


def engine_starts(inputs: Inputs, candidate: Candidate) -> bool:
    """A colocated vLLM whose budget cannot hold its weights and one sequence of its model length fails to
    start, whatever else fits."""
    settings = candidate.colocated
    if settings is None:
        return True
    work, policy = inputs.work, inputs.roles[0].size
    return vllm.starts(settings, inputs.hardware.gpu_memory, policy.params, work.element_bytes,
                       longest_kv(settings, work, policy))


def engine_batch(inputs: Inputs, candidate: Candidate) -> int | None:
    """The sequences a colocated vLLM's KV cache holds per process; None: not even one, or a server (not
    planned)."""
    settings, work, policy = candidate.colocated, inputs.work, inputs.roles[0].size
    if settings is None:
        return None
    per_sequence = memory.kv_cache(policy, 1, work.prompt_length + work.completion_length, work.element_bytes)
    return vllm.kv_sequences(settings, inputs.hardware.gpu_memory, policy.params, work.element_bytes,
                             per_sequence) or None


def settings_for(value: Callable[[str], Any], engine: Engine) -> vllm.VllmSettings | None:
    """The run's vLLM settings when `engine` is vLLM's (a candidate's `vllm`), else None."""
    return vllm.run_settings(value) if engine.spec.is_vllm else None


def left_open(run: ResolvedRun) -> bool:
    """`gather: auto` may choose vLLM where no source chose the engine, the algorithm's trainer can use vLLM, and
    vLLM is installed here (a launch must not switch to an engine it cannot import)."""
    return (USE_VLLM_KEY in catalogue(run.algorithm) and USE_VLLM_KEY not in run.settings
            and installed(Engine.colocate.spec) is not None)
