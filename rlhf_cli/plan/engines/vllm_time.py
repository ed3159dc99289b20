"""Seconds of vLLM's work for one training process: one generation call, and one weight sync.

A colocated vLLM with tensor parallelism T is one engine per T processes: it generates their batches together,
each GPU reading 1/T of the weights per decode step, with two all-reduces per layer. A server generates every
process's batch at once on GPUs of its own (VLLM_SERVER_GPUS, assumed), and the processes wait for it. The
weight sync gathers the policy bucket by bucket (rlhf_cli/generation/sync_buckets.py, the ranks' packing) and
hands each to vLLM: copied in place when colocated, broadcast from rank 0 to the server otherwise.
"""

from __future__ import annotations

from rlhf_cli.algorithms import algorithm
from rlhf_cli.generation.sync_check import PROBE_PROMPTS, PROBE_TOKENS, checked
from rlhf_cli.plan import fixed_costs, memory
from rlhf_cli.plan.columns import Candidate
from rlhf_cli.plan.engines import vllm
from rlhf_cli.plan.inputs import Inputs
from rlhf_cli.plan.rates import Rates, forward_flops, modules

# All assumed, then checked against published step times (benchmarks/plan_published.py):
VLLM_PREFILL_UTILISATION = 0.5  # share of peak FLOPs of vLLM's prefill (FlashAttention, fused kernels)
VLLM_DECODE_BANDWIDTH = 0.8  # share of memory bandwidth vLLM's decode reaches with CUDA graphs
# Fitted to the smoke recipe's colocated generation on CPU (the medians of 5 interleaved rounds on a quiet machine):
VLLM_STEP_CALLS = 150  # small module calls' worth per decode step: scheduling and sampling (0.75 ms at 5 us)
VLLM_CALL_CALLS = 1200  # per generate call: TRL's requests, vLLM's batch scheduled, its outputs detokenized
TP_ALL_REDUCE = 20e-6  # seconds per all-reduce of a decode step's activations between tensor-parallel GPUs
VLLM_SERVER_GPUS = 1  # the server's GPUs, as TRL's documentation's examples give it
COLOCATED_BUCKET_OVERHEAD = 5e-3  # seconds per sync bucket: the gather's launch, vLLM's layerwise reload call
SERVER_BUCKET_OVERHEAD = 20e-3  # seconds per sync bucket to a server: its HTTP request and NCCL broadcast set-up
# vLLM's load_weights takes tensor by tensor (each parameter's weight_loader, its sharding and copy): 0.5 ms a
# tensor, of the order the Megatron-LM bridge's published syncs imply (84.9 s for Qwen3-30B-A3B's 18,867 tensors
# one at a time, 11.8 s in 2 GiB buckets; benchmarks/plan_published.py replays both)
TENSOR_LOAD = 0.5e-3
SLEEP_CYCLE_OVERHEAD = 0.05  # seconds per sleep and wake: the allocator's unmap and map calls (assumed)
# Fixed costs in small module calls (rlhf_cli/plan/fixed_costs.py), fitted to the smoke recipe's colocated syncs on
# CPU (the medians of 5 interleaved rounds on a quiet machine): per tensor synced, the delta's snapshot and both
# sides' checksums; per self-check, vLLM's logprobs and the policy's head gathered; once per run, vLLM's first
# generation (buffers allocated; the first self-check pays it)
SYNC_TENSOR_CALLS = 136
CHECK_CALLS = 12_000
FIRST_GENERATION_CALLS = 6000


def call_seconds(inputs: Inputs, candidate: Candidate, rates: Rates) -> float:
    """One generation call of the process's batch: a prefill at vLLM's compute rate, then one decode step per
    completion token at the rate the engine's GPUs read their share of the weights and KV cache."""
    work, policy, b = inputs.work, inputs.roles[0].size, inputs.work.element_bytes
    settings = candidate.colocated
    if settings is not None:
        gpus, sequences = settings.tensor_parallel_size, work.generation_batch * settings.tensor_parallel_size
    else:
        gpus, sequences = VLLM_SERVER_GPUS, work.generation_batch * rates.gpus
    p, c = work.prompt_length, work.completion_length
    prefill = rates.matmul(forward_flops(policy, sequences, p) / gpus, VLLM_PREFILL_UTILISATION)
    kv = memory.kv_cache(policy, sequences, p + c // 2, b) / gpus
    read = (policy.params * b / gpus + kv) / (rates.memory * VLLM_DECODE_BANDWIDTH)
    compute = rates.matmul(forward_flops(policy, sequences, 1) / gpus, VLLM_PREFILL_UTILISATION)
    all_reduce = 2 * policy.layers * TP_ALL_REDUCE if gpus > 1 else 0.0
    return prefill + c * (max(read, compute) + all_reduce + rates.calls(VLLM_STEP_CALLS)) + rates.calls(VLLM_CALL_CALLS)


def wake_seconds(inputs: Inputs, candidate: Candidate, rates: Rates) -> tuple[float, float]:
    """(weights, KV cache) seconds of one sleep and wake of a sleeping colocated vLLM (TRL sleeps it after every
    generation round): at level 1 its weights went down to host memory and come back over the host link, at level
    2 they are only re-allocated (the sync refills them, counted there); its KV cache is re-allocated and zeroed
    at memory speed."""
    settings = candidate.colocated
    if settings is None or not settings.sleep:
        return 0.0, 0.0
    b, policy = inputs.work.element_bytes, inputs.roles[0].size
    shard = vllm.weights(settings, policy.params, b)
    weights = 2 * shard / rates.host if settings.sleep_level == 1 else 0.0
    kv = max(0, vllm.kv_room(settings, inputs.hardware.gpu_memory, policy.params, b)) / rates.memory
    return weights + SLEEP_CYCLE_OVERHEAD / 2, kv + SLEEP_CYCLE_OVERHEAD / 2


def step_sync_seconds(inputs: Inputs, candidate: Candidate, rates: Rates, syncs: float, wake_weights: float) -> float:
    """One optimizer step's weight syncs (`syncs` of them, each after a wake costing `wake_weights`) and its share
    of the sync's self-checks."""
    return (sync_seconds(inputs, candidate, rates) + wake_weights) * syncs + check_seconds(inputs, candidate, rates)


def sync_seconds(inputs: Inputs, candidate: Candidate, rates: Rates) -> float:
    """One weight sync of the candidate's buckets (a unit's modules counted as its tensors), with rlhf's own work per
    tensor (the delta's snapshot, both sides' checksums) that other frameworks' syncs do not do. A vLLM, colocated
    or a server, that serves the adapters takes them alone (the base went once, with the first sync)."""
    b = inputs.work.element_bytes
    server = candidate.generation.engine.spec.is_server
    settings = candidate.engine_settings
    buckets = inputs.sync_buckets(candidate.generation.gather, candidate.lora,
                                  adapters_alone=bool(settings and settings.serves_adapters))
    checks = rates.calls(SYNC_TENSOR_CALLS * sum(tensors * alike for _, tensors, alike in buckets))
    return checks + buckets_seconds([(numel * b, tensors, alike) for numel, tensors, alike in buckets], rates,
                                    server)


def buckets_seconds(buckets: list[tuple[float, int, int]], rates: Rates, server: bool) -> float:
    """A sync of `buckets` (bytes, tensors, how many alike): each gathered, then copied into a colocated vLLM's
    weights at memory speed or broadcast to the server over the link between GPUs, vLLM loading it tensor by
    tensor; each bucket pays its fixed overhead."""
    seconds = 0.0
    for size, tensors, alike in buckets:
        handing = size / rates.interconnect + SERVER_BUCKET_OVERHEAD if server else \
            size / rates.memory + COLOCATED_BUCKET_OVERHEAD
        seconds += alike * (rates.fetch(size) + handing + tensors * TENSOR_LOAD)
    return seconds


def check_seconds(inputs: Inputs, candidate: Candidate, rates: Rates) -> float:
    """The sync's self-check per optimizer step (rlhf_cli/rank/engines/vllm/self_check.py): after the first two syncs
    and every `vllm_sync_check_steps`-th, vLLM continues the probe's prompts and the policy scores them, one
    forward a prompt; the first check also pays vLLM's first generation. Over the run's steps (`max_steps`; unknown:
    only the periodic checks)."""
    every, steps = inputs.value("vllm_sync_check_steps"), inputs.value("max_steps") or 0
    if not every or candidate.engine_settings is None:
        return 0.0
    policy, b = inputs.roles[0].size, inputs.work.element_bytes
    fetches = modules(policy) * rates.per_module(policy, inputs.persistence_threshold)
    probe = PROBE_PROMPTS * (rates.fetch(policy.params * b) + fetches + rates.calls(fixed_costs.forward(policy)))
    probe += rates.calls(PROBE_TOKENS * VLLM_STEP_CALLS + CHECK_CALLS)
    if steps <= 0:
        return probe / every
    syncs = round(steps * algorithm(inputs.algorithm).step_work(inputs.value).syncs)
    checks = sum(checked(sync, every, False) for sync in range(1, syncs + 1))
    return (checks * probe + rates.calls(FIRST_GENERATION_CALLS)) / steps
