"""Per-GPU memory of one ZeRO-3 RLHF run, as pure functions of sizes, lengths and batch sizes (bytes).

The run goes through two phases that never overlap on a GPU: generation (the policy's weights as
generation sees them, plus the KV cache) and training (the ZeRO-3 parameters live during a
forward/backward, activations, fp32 logits). What stays for the whole run is static: the model
states of the trained models, the shards of the frozen ones, and a fixed allowance for the CUDA
context and communication buffers. Peak per GPU = static + max(generation, training).

Formulas (P parameters, L the largest layer's parameters, G GPUs in total, N machines, b bytes per
element: 2 under bf16 or fp16 mixed precision, else the dtype's):
- trained models: DeepSpeed's `estimate_zero3_model_states_mem_needs` (runtime/zero/stage3.py),
  which assumes mixed precision: no offload 4L + 18P/G on each GPU; optimizer offloaded 4L + 2P/G
  (CPU: 16P/N x 1.5); optimizer and parameters offloaded 4L (CPU: 18P/N x 1.5). With zero_init off
  the CPU side is P x max(4 x GPUs per machine, 16 or 18 / N) x 1.5. Like DeepSpeed's estimator,
  parameter offload without optimizer offload counts as no offload.
- frozen models (reference, reward): ZeRO-3 shards of P x b / G, in CPU memory (P x b / N per
  machine) when parameters are offloaded.
- weights for generation: gathering materialises the whole policy, P x b (for PPO the value model
  too: they are one DeepSpeed engine). Without gathering, DeepSpeed prefetches only within what is
  left of stage3_max_live_parameters (`max_params_to_prefetch` in its parameter coordinator), while
  the module being run is fetched whatever the budget: min(P, max_live + L) x b. The same bound holds
  for the training forward/backward. (Measured on a 100M model: benchmarks/.) With a gather budget, the
  units it buys (rlhf_cli/gather_budget.py; G parameters) plus that bound for the rest:
  G x b + min(P - G, max_live + L) x b.
- KV cache: layers x 2 x kv_heads x head_dim x batch x (prompt + completion) x b.
- activations (Korthikanti et al. 2022, for 16-bit; scaled by b/2): per layer
  s x batch x hidden x (34 + 5 x heads x s / hidden); all layers without gradient checkpointing,
  with it one layer plus each layer's input (s x batch x hidden x b).
- logits: batch x s x vocab x 4 bytes (fp32), for the larger of the training micro-batch and the
  no-grad scoring batch.
- CUDA context and communication buffers: a fixed CONTEXT_ALLOWANCE.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rlhf_cli.gather_budget import Unit, choose
from rlhf_cli.plan.models import ModelSize

GIB = 2**30
CONTEXT_ALLOWANCE = int(1.5 * GIB)  # CUDA context and kernels (~0.5 GiB), NCCL and DeepSpeed buckets (~1 GiB)
MARGIN = 0.10  # a configuration fits when its peak is at most 90% of a GPU's memory
DEFAULT_MAX_LIVE_PARAMETERS = 1_000_000_000  # DeepSpeed's stage3_max_live_parameters
ADDITIONAL_BUFFER_FACTOR = 1.5  # DeepSpeed's estimator default
STATIC, GENERATION, TRAINING = "static", "generation", "training"


def zero3_model_states(params: int, largest_layer: int, gpus_per_machine: int, machines: int, *,
                       offload_optimizer: bool, offload_params: bool, zero_init: bool = True,
                       buffer_factor: float = ADDITIONAL_BUFFER_FACTOR) -> tuple[int, int]:
    """(CPU bytes per machine, GPU bytes per GPU) of a trained model's ZeRO-3 states, as DeepSpeed estimates."""
    total_gpus = machines * gpus_per_machine
    largest_layer_memory = 4 * largest_layer
    if offload_optimizer:
        per_param = 18 if offload_params else 16
        gpu = largest_layer_memory + (0 if offload_params else int(2 * params / total_gpus))
        factor = per_param / machines if zero_init else max(4 * gpus_per_machine, per_param / machines)
        cpu = params * factor * buffer_factor
    else:
        gpu = largest_layer_memory + int(18 * params / total_gpus)
        cpu = (largest_layer if zero_init else params) * 4 * gpus_per_machine * buffer_factor
    return int(cpu), int(gpu)


def frozen_shard(params: int, element_bytes: int, total_gpus: int) -> int:
    return params * element_bytes // total_gpus


def generation_weights(params: int, element_bytes: int, gather: bool, max_live: int, largest_layer: int) -> int:
    """Policy bytes present on a GPU while generating: all of it gathered, else what ZeRO-3 keeps live."""
    return params * element_bytes if gather else live_parameters(params, element_bytes, max_live, largest_layer)


def gather_budget(units: Sequence[Unit], budget_numel: int, params: int, element_bytes: int, max_live: int,
                  largest_layer: int) -> int:
    """Policy bytes present on a GPU while generating with a gather budget: the units it buys, gathered once for
    the call, plus what ZeRO-3 keeps live of the rest, as without gathering."""
    gathered = sum(units[index].numel for index in choose(units, budget_numel))
    return gathered * element_bytes + live_parameters(params - gathered, element_bytes, max_live, largest_layer)


def live_parameters(params: int, element_bytes: int, max_live: int, largest_layer: int) -> int:
    return min(params, max_live + largest_layer) * element_bytes


def kv_cache(model: ModelSize, batch: int, sequence: int, element_bytes: int) -> int:
    return model.layers * 2 * model.kv_heads * model.head_dim * batch * sequence * element_bytes


def activations(model: ModelSize, batch: int, sequence: int, element_bytes: int, checkpointing: bool) -> int:
    """Activations kept for the backward pass of one micro-batch."""
    tokens = batch * sequence
    one_layer = tokens * model.hidden * (34 + 5 * model.heads * sequence / model.hidden) * element_bytes / 2
    if checkpointing:
        return int(model.layers * tokens * model.hidden * element_bytes + one_layer)
    return int(model.layers * one_layer)


def logits(batch: int, sequence: int, vocab: int) -> int:
    return batch * sequence * vocab * 4


@dataclass(frozen=True)
class Component:
    """One row of the plan: what holds memory, in which phase, on the GPU and in CPU memory per machine."""

    name: str
    phase: str
    gpu: int
    cpu: int = 0


def peak(components: list[Component]) -> int:
    """Static memory plus the larger of the two phases."""
    def total(phase: str) -> int:
        return sum(c.gpu for c in components if c.phase == phase)

    return total(STATIC) + max(total(GENERATION), total(TRAINING))


def fits(gpu_bytes: int, gpu_memory: int) -> bool:
    return gpu_bytes <= (1 - MARGIN) * gpu_memory
