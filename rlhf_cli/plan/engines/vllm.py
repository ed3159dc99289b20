"""vLLM's share of a training GPU, as pure functions of its settings (bytes).

Colocated (`--vllm colocate`), vLLM runs inside every training process (TRL's `VLLMGeneration`,
`distributed_executor_backend="external_launcher"`) and takes from each GPU:
- its budget, `vllm_gpu_memory_utilization` x the GPU's total memory (vLLM's `requested_memory`: a share of
  the total, not of what is free, so what training holds is not subtracted), which holds its own copy of the
  policy's weights, P x b / `vllm_tensor_parallel_size` (each rank of a tensor-parallel group keeps its shard),
  then activations of its profiling run and the KV cache in the rest. It cannot start with a budget below the
  weights and the KV cache of one sequence of its model length (`vllm_max_model_length`, else the model's);
- outside the budget, the CUDA graphs it captures (CUDA_GRAPHS), none with `enforce_eager`.
All of it stays for the whole run, training included, unless `vllm_enable_sleep_mode`: TRL sleeps vLLM at
level 2 after every generation (weights and KV cache freed, `llm.sleep(level=2)`), wakes its weights for the
sync and its KV cache to generate. Asleep it keeps about SLEEP_RESIDUAL (its CUDA graph pool, allocator
state); sleep level 1 (ms-swift's `--sleep_level 1`) keeps the weights in host memory, P x b / TP per GPU.

The weight sync: under ZeRO-3 the policy is gathered to refresh vLLM, as much at once as the gather choice
says (`--gather` the whole policy, `--gather-budget` that many bytes, `--no-gather` one unit: a decoder
layer or the embedding), after the optimizer step. It is counted on top of the training phase (torch's
allocator still holds training's blocks), or, when vLLM sleeps, on top of what stays and vLLM's woken
weights (TRL empties torch's cache before waking them: `sync_weights`). A sleeping vLLM then wakes its KV cache
to generate while torch's cache still holds the freed bucket (nothing empties it in between), so the bucket
counts in generation too.

In server mode (`--vllm server`) vLLM runs on GPUs of its own: nothing of it is on the training GPUs,
only the sync's gathered bucket (broadcast to the server).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlhf_cli.generation.choice import Engine
from rlhf_cli.phases import MemoryPhase
from rlhf_cli.plan.memory import GIB, Component

SLEEP_RESIDUAL = 1 * GIB  # what vLLM keeps on a GPU while asleep: its CUDA graph pool and allocator state
CUDA_GRAPHS = GIB // 2  # CUDA graphs captured outside the budget (vLLM logs 0.2-1 GiB for dense models)
TRL_SLEEP_LEVEL = 2  # TRL 1.16 always sleeps at level 2 (`llm.sleep(level=2)` in vllm_generation.py)
@dataclass(frozen=True)
class VllmSettings:
    """How a colocated vLLM runs (its share of each GPU, tensor parallelism, sleep): the keys TRL reads. Whether vLLM
    is colocated or a server is the candidate's `Generation.engine`."""

    gpu_memory_utilization: float = 0.3
    tensor_parallel_size: int = 1
    sleep: bool = False
    enforce_eager: bool = False
    sleep_level: int = TRL_SLEEP_LEVEL
    max_model_length: int | None = None  # vllm_max_model_length; None: the model's max_position_embeddings
    # a LoRA column's vLLM (colocated, or a server started with --lora) serves the adapters itself
    # (rlhf_cli/config/engines/vllm_lora.py): every sync after the first sends the adapters alone
    serves_adapters: bool = False

    def description(self, engine: Engine) -> str:
        """The settings in TRL's key names, for a table's title."""
        if engine.spec.is_server:
            return "--vllm server: vLLM on GPUs of its own"
        return (f"--vllm colocate, vllm_gpu_memory_utilization {self.gpu_memory_utilization:g}, "
                f"vllm_tensor_parallel_size {self.tensor_parallel_size}, "
                f"{'sleeping while training' if self.sleep else 'awake while training'}"
                f"{', enforce_eager' if self.enforce_eager else ''}")

    def label(self, engine: Engine) -> str:
        if engine.spec.is_server:
            return "vLLM server"
        parts = [f"vLLM {self.gpu_memory_utilization:g}", f"TP{self.tensor_parallel_size}"]
        if self.sleep:
            parts.append("sleep" if self.sleep_level == TRL_SLEEP_LEVEL else f"sleep {self.sleep_level}")
        if self.enforce_eager:
            parts.append("eager")
        return " ".join(parts)

    def as_dict(self, engine: Engine) -> dict[str, Any]:
        return {"mode": engine.mode, "gpu_memory_utilization": self.gpu_memory_utilization,
                "tensor_parallel_size": self.tensor_parallel_size, "sleep": self.sleep,
                "sleep_level": self.sleep_level, "enforce_eager": self.enforce_eager,
                "max_model_length": self.max_model_length}


def budget(settings: VllmSettings, gpu_memory: int) -> int:
    """vLLM's budget on one GPU: its share of the GPU's total memory (weights, profiling activations, KV cache)."""
    return int(settings.gpu_memory_utilization * gpu_memory)


def weights(settings: VllmSettings, params: int, element_bytes: int) -> int:
    """vLLM's copy of the policy on one GPU: its tensor-parallel shard."""
    return -(-params * element_bytes // settings.tensor_parallel_size)


def cuda_graphs(settings: VllmSettings) -> int:
    return 0 if settings.enforce_eager else CUDA_GRAPHS


def resident(settings: VllmSettings, gpu_memory: int) -> int:
    """What vLLM holds on a GPU while the policy trains: all of it, or asleep its residual."""
    return SLEEP_RESIDUAL if settings.sleep else budget(settings, gpu_memory) + cuda_graphs(settings)


def awake(settings: VllmSettings, gpu_memory: int) -> int:
    """What waking vLLM to generate adds to what it holds while the policy trains."""
    if not settings.sleep:
        return 0
    return max(0, budget(settings, gpu_memory) + cuda_graphs(settings) - SLEEP_RESIDUAL)


def woken_weights(settings: VllmSettings, params: int, element_bytes: int) -> int:
    """What waking a sleeping vLLM's weights for the sync allocates on a GPU."""
    return weights(settings, params, element_bytes) if settings.sleep else 0


def host_weights(settings: VllmSettings, params: int, element_bytes: int, gpus_per_machine: int) -> int:
    """CPU memory per machine for sleep level 1's weights (level 2 discards them)."""
    if not settings.sleep or settings.sleep_level != 1:
        return 0
    return weights(settings, params, element_bytes) * gpus_per_machine


def kv_room(settings: VllmSettings, gpu_memory: int, params: int, element_bytes: int) -> int:
    """What the budget leaves after the weights for the KV cache and activations; negative: vLLM cannot start."""
    return budget(settings, gpu_memory) - weights(settings, params, element_bytes)


def kv_sequences(settings: VllmSettings, gpu_memory: int, params: int, element_bytes: int,
                 kv_per_sequence: int) -> int:
    """Sequences of the run's length a colocated vLLM's KV cache holds per process: a tensor-parallel group of T
    processes shares one engine whose cache is T GPUs' room, so T x room / sequence for T processes."""
    room = kv_room(settings, gpu_memory, params, element_bytes) - PROFILE_ALLOWANCE
    return max(0, room) // kv_per_sequence


def model_length(settings: VllmSettings, max_positions: int | None, sequence: int) -> int:
    """The longest sequence vLLM must hold: vllm_max_model_length, else (vLLM's default) the model's limit."""
    return settings.max_model_length or max_positions or sequence


def starts(settings: VllmSettings, gpu_memory: int, params: int, element_bytes: int, longest_kv: int) -> bool:
    """vLLM starts when its budget holds its weights, its profiling run and the KV cache of one sequence of its
    model length (`longest_kv`, over the whole tensor-parallel group: each GPU holds its share)."""
    room = kv_room(settings, gpu_memory, params, element_bytes)
    return room > 0 and room - PROFILE_ALLOWANCE >= -(-longest_kv // settings.tensor_parallel_size)


# A column's vLLM rows: what it holds while the policy trains, what waking it to generate adds (beside the sync's
# freed bucket, still in torch's cache), and the weight sync: its gathered bucket on top of training's blocks, or
# of vLLM's woken weights.
ROWS = (("vLLM", MemoryPhase.STATIC), ("vLLM awake", MemoryPhase.GENERATION),
        ("gen: sync bucket cached", MemoryPhase.GENERATION), ("sync bucket", MemoryPhase.SYNC),
        ("sync: vLLM copies", MemoryPhase.SYNC), ("sync: vLLM weights", MemoryPhase.SYNC),
        ("sync: train reserve", MemoryPhase.SYNC))
VOCAB_ALIGNMENT = 64  # vLLM pads its embedding and LM head to a multiple of this many rows


def sync_copies(largest_layer: int, vocab: int, hidden: int, element_bytes: int) -> int:
    """The copies a colocated vLLM holds while it takes a sync, whatever the bucket: every tensor goes in as a copy
    (rlhf_cli/compat/vllm.vllm_reload_weights) that vLLM keeps until its layer has all its elements, the largest
    module's at most (on a small model, the embedding: 66 MiB measured on a 100M Llama for buckets of 49 to 396
    MiB), and the vocabulary tables until the reload ends when vLLM pads them (a vocabulary not a multiple of 64:
    the embedding and the LM head, counted untied)."""
    padded = 2 * vocab * hidden if vocab % VOCAB_ALIGNMENT else 0
    return (largest_layer + padded) * element_bytes


def components(settings: VllmSettings | None, engine: Engine, gpu_memory: int, gpus_per_machine: int, params: int,
               element_bytes: int, training: int, bucket: int, copies: int) -> list[Component]:
    """The ROWS of one column (all 0 without vLLM; a server holds nothing on the training GPUs but the sync's
    bucket): `training` is the GPU bytes of its training phase, `bucket` the policy bytes one sync gathers,
    `copies` what vLLM holds of them while it takes them (`sync_copies`)."""
    if settings is None or not engine.spec.is_vllm:
        return [Component(name, phase, 0) for name, phase in ROWS]
    if engine.spec.is_server:
        return [Component(name, phase, {"sync bucket": bucket, "sync: train reserve": training}.get(name, 0))
                for name, phase in ROWS]
    gpu = (resident(settings, gpu_memory), awake(settings, gpu_memory), bucket if settings.sleep else 0, bucket,
           copies, woken_weights(settings, params, element_bytes), 0 if settings.sleep else training)
    cpu = (host_weights(settings, params, element_bytes, gpus_per_machine), 0, 0, 0, 0, 0, 0)
    return [Component(name, phase, on_gpu, on_cpu) for (name, phase), on_gpu, on_cpu in zip(ROWS, gpu, cpu,
                                                                                            strict=True)]


def tensor_parallel_sizes(gpus_per_machine: int) -> list[int]:
    """Tensor-parallel sizes a colocated vLLM can take: divisors of the GPUs of one machine."""
    return [size for size in range(1, gpus_per_machine + 1) if gpus_per_machine % size == 0]


PROFILE_ALLOWANCE = 1 * GIB  # vLLM's profiling run inside its budget (TRL caps it at 4096 batched tokens)
UTILIZATION_STEP = 0.01


def least_utilization(gpu_memory: int, weights_bytes: int, kv_cache_bytes: int) -> float | None:
    """The smallest `vllm_gpu_memory_utilization` (in steps of 0.01) whose budget holds vLLM's weights, the KV
    cache of one generation batch and its profiling run; None: above 0.95."""
    needed = (weights_bytes + kv_cache_bytes + PROFILE_ALLOWANCE) / gpu_memory
    steps = -(-needed // UTILIZATION_STEP)
    utilization = round(steps * UTILIZATION_STEP, 2)
    return utilization if utilization <= 0.95 else None

