"""vLLM's part of a run's plan (rlhf_cli/plan/estimate.py, time.py): its rows in a column, whether it starts, the
sequences its KV cache holds, its seconds, whether `gather: auto` may choose it, what the plan finds and says of
it. Pure functions of the plan's inputs and one candidate, over the byte counts of rlhf_cli/plan/engines/vllm.py;
the registry row's `plan` face (what rlhf_cli/plan/engines/__init__.py asks of every separate engine).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlhf_cli.algorithms.spec import StepWork
from rlhf_cli.config.engines.vllm_lora import run_lora_serving
from rlhf_cli.config.fields import catalogue
from rlhf_cli.config.run import ResolvedRun
from rlhf_cli.generation.choice import Engine
from rlhf_cli.generation.engines import USE_VLLM_KEY, installed
from rlhf_cli.phases import MemoryPhase
from rlhf_cli.plan import memory
from rlhf_cli.plan.columns import Candidate
from rlhf_cli.plan.engines import EngineWords, vllm
from rlhf_cli.plan.engines.vllm_search import Evaluate, findings, longest_kv
from rlhf_cli.plan.engines.vllm_time import call_seconds, step_sync_seconds, wake_seconds
from rlhf_cli.plan.inputs import Inputs
from rlhf_cli.plan.memory import Component
from rlhf_cli.plan.rates import Rates

# TRL 1.16's defaults where a run's algorithm has no such key (PPO's config until it grows them)
TRL_DEFAULTS: dict[str, Any] = {"vllm_gpu_memory_utilization": 0.3,
                                "vllm_tensor_parallel_size": 1, "vllm_enable_sleep_mode": False,
                                "vllm_enforce_eager": False, "vllm_sleep_level": vllm.TRL_SLEEP_LEVEL,
                                "vllm_max_model_length": None}
WORDS = EngineWords(syncing_whole="syncing vLLM the whole policy at once",
                    no_plan="vLLM's weight sync: the whole policy at once (no plan: {why})",
                    left_open="vLLM (installed, the engine left open)", chosen="vLLM, sync ",
                    defaulted=" (no gather choice given with vLLM: the plan's)")


def engine_rows(inputs: Inputs, candidate: Candidate, rows: list[Component]) -> list[Component]:
    """vLLM's rows of a column whose other `rows` are counted (all 0 without vLLM): its copy of the policy is the
    policy with its adapters merged, synced a bucket at a time."""
    policy, size_bytes, adapter = inputs.roles[0].size, inputs.work.element_bytes, inputs.roles[0].adapter
    synced = policy.params + (adapter.params if candidate.lora and adapter else 0)
    bucket = max(numel for numel, _, _ in inputs.sync_buckets(candidate.generation.gather, candidate.lora)) * size_bytes
    copies = vllm.sync_copies(policy.largest_layer, policy.vocab, policy.hidden, size_bytes)
    training = memory.phase_totals(rows)[MemoryPhase.TRAINING]
    return vllm.components(candidate.engine_settings, candidate.generation.engine, inputs.hardware.gpu_memory,
                           inputs.hardware.gpus_per_machine, synced, size_bytes, training, bucket, copies)


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


def read_setting(value: Callable[[str], Any], name: str) -> Any:
    """A vLLM key of the run, TRL's default where its algorithm's config has no such key or leaves it null."""
    try:
        found = value(name)
    except KeyError:
        found = None
    return TRL_DEFAULTS[name] if found is None else found


def run_settings(value: Callable[[str], Any]) -> vllm.VllmSettings:
    """The run's vLLM settings (a vLLM candidate's `engine_settings`), whether or not it uses vLLM (they size the
    vLLM columns)."""
    return vllm.VllmSettings(float(read_setting(value, "vllm_gpu_memory_utilization")),
                             int(read_setting(value, "vllm_tensor_parallel_size")),
                             bool(read_setting(value, "vllm_enable_sleep_mode")),
                             bool(read_setting(value, "vllm_enforce_eager")),
                             int(read_setting(value, "vllm_sleep_level")),
                             read_setting(value, "vllm_max_model_length"), serves_adapters(value))


def serves_adapters(value: Callable[[str], Any]) -> bool:
    """Whether vLLM's LoRA serves the run's adapters, for the LoRA columns (planned whether the run sets use_peft
    or not), by the policy's architecture (unknown where its config.json cannot be read)."""
    serving = run_lora_serving(lambda key: True if key == "use_peft" else value(key), value("model_name_or_path"),
                               value("model_revision"), value("env"))
    return serving is not None and serving.served


def engine_seconds(inputs: Inputs, candidate: Candidate, rates: Rates, step: StepWork) -> tuple[float, float]:
    """(generation, weight sync) seconds of one optimizer step: its generation calls, with a sleeping vLLM's KV
    cache woken once per generation round, and its syncs, with its weights woken."""
    wake_weights, wake_kv = wake_seconds(inputs, candidate, rates)
    calls = step.generated / inputs.work.generation_batch
    generation = calls * call_seconds(inputs, candidate, rates) + wake_kv * step.syncs
    return generation, step_sync_seconds(inputs, candidate, rates, step.syncs, wake_weights)


def engine_findings(evaluate: Evaluate, inputs: Inputs, settings: vllm.VllmSettings, engine: Engine,
                    own_offload: tuple[str, str]) -> list[str]:
    """What colocated vLLM means for the run and the first colocated configuration that fits (`findings`)."""
    return findings(evaluate, inputs.hardware, inputs.work, inputs.roles[0].size, settings, engine, own_offload)


def left_open(run: ResolvedRun) -> bool:
    """`gather: auto` may choose vLLM where no source chose the engine, the algorithm's trainer can use vLLM, and
    vLLM is installed here (a launch must not switch to an engine it cannot import)."""
    return (USE_VLLM_KEY in catalogue(run.algorithm) and USE_VLLM_KEY not in run.settings
            and installed(Engine.colocate.spec) is not None)
