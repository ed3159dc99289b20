"""What one GPU of a run does per second (FLOPs, memory bytes, bytes to the other GPUs and to the host), and the
work of a forward in FLOPs and ZeRO-3 fetches; shared by the time plan's phases (rlhf_cli/plan/time.py,
rlhf_cli/plan/engines/vllm_time.py). Every rate is a peak from rlhf_cli/machine/gpus.py times an assumed share of it.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlhf_cli.machine.gpus import COLLECTIVE_EFFICIENCY, Gpu
from rlhf_cli.plan import fixed_costs
from rlhf_cli.plan.model_sizes import ModelSize

# Dense forward/backward under ZeRO-3 with transformers' models: Megatron-LM reaches 41-52% of peak on A100s
# (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters", table 1); eager
# transformers' modules under ZeRO-3's hooks less: assumed 35%
MATMUL_UTILISATION = 0.35
# ZeRO-3 fetching one module: its pre-forward hook, an all-gather launch, the release; on CPU with gloo we measured
# 0.8 ms (benchmarks/results/gather_units.md); on a GPU with NCCL assumed 0.15 ms
ZERO3_MODULE_OVERHEAD = 0.15e-3
# A small module's call from Python on a GPU's host (the module machinery, dispatch, the kernel's launch): assumed
# 5 us, so that a llama layer's calls in a decode step (rlhf_cli/plan/fixed_costs.py) cost the 0.3 ms that keeps HF
# generate near 30-40 tokens/s for a 7B model at batch 1 on an A100; `rlhf doctor --calibrate` measures it
CALL_LATENCY = 5e-6
# DeepSpeed's stage3_param_persistence_threshold default: a parameter of fewer elements stays whole on every rank
PERSISTENCE_THRESHOLD = 100_000
MODULES_PER_LAYER = 13  # a llama decoder layer: 9 modules with parameters, 4 without (for models without units)


@dataclass(frozen=True)
class Rates:
    """What one GPU of the run does per second: FLOPs, bytes of its memory, bytes from the others, to the host."""

    flops: float
    memory: float
    collective: float  # bytes/s each GPU receives in an all-gather among all GPUs
    host: float
    gpus: int
    machines: int
    interconnect: float  # bytes/s each way over the link between GPUs (a broadcast to a vLLM server)
    params_offloaded: bool  # ZeRO-3's parameter shards live in CPU memory
    module_overhead: float = ZERO3_MODULE_OVERHEAD  # seconds per module ZeRO-3 fetches
    call: float = CALL_LATENCY  # seconds per small module call from Python (eager PyTorch's fixed cost)

    @classmethod
    def of(cls, gpu: Gpu, gpus: int, machines: int, params_offloaded: bool) -> Rates:
        """Across machines an all-gather is as fast as the network between them (`gpu.network`) at most."""
        link = min(gpu.interconnect_bandwidth, gpu.network) if machines > 1 else gpu.interconnect_bandwidth
        return cls(gpu.bf16_flops, gpu.memory_bandwidth, link * COLLECTIVE_EFFICIENCY, gpu.host_bandwidth, gpus,
                   machines, gpu.interconnect_bandwidth * COLLECTIVE_EFFICIENCY, params_offloaded,
                   gpu.fetch_latency if gpu.fetch_latency is not None else ZERO3_MODULE_OVERHEAD,
                   gpu.call_latency if gpu.call_latency is not None else CALL_LATENCY)

    def all_gather(self, total_bytes: float) -> float:
        """Seconds to gather `total_bytes` sharded over every GPU: each receives all but its own share."""
        return total_bytes * (self.gpus - 1) / self.gpus / self.collective if self.gpus > 1 else 0.0

    def fetch(self, total_bytes: float) -> float:
        """Seconds for ZeRO-3 to gather parameters of `total_bytes`: with the shards offloaded, each GPU's share
        first crosses PCIe from CPU memory."""
        from_host = total_bytes / self.gpus / self.host if self.params_offloaded else 0.0
        return self.all_gather(total_bytes) + from_host

    def matmul(self, flops: float, utilisation: float = MATMUL_UTILISATION) -> float:
        return flops / (self.flops * utilisation)

    def calls(self, count: float) -> float:
        """Seconds of `count` small module calls' fixed cost."""
        return count * self.call

    def per_module(self, model: ModelSize, persistence: int | None) -> float:
        """Seconds ZeRO-3 adds to each module of `model` it runs under its hooks: a fetch (the hooks, an
        all-gather's launch, the release) when its parameters are partitioned; only the hooks' bookkeeping when
        even the largest module's parameters are below the persistence threshold (`persistence`, None: DeepSpeed's
        default), which keeps them whole on every rank and fetches nothing."""
        if model.largest_layer < (persistence if persistence is not None else PERSISTENCE_THRESHOLD):
            return self.calls(fixed_costs.ZERO3_HOOK_CALLS)
        return self.module_overhead


def forward_flops(model: ModelSize, sequences: float, length: int) -> float:
    """A forward over `sequences` of `length` tokens: 2 FLOPs per parameter and token, and causal attention's
    scores and weighted sum, 2 x length x heads x head_dim per layer and token on average."""
    tokens = sequences * length
    return 2 * model.params * tokens + 2 * model.layers * model.heads * model.head_dim * length * tokens


def modules(model: ModelSize) -> int:
    """Modules ZeRO-3 fetches for one forward of `model`."""
    return sum(part.unit.modules * part.count for part in model.stretches) or model.layers * MODULES_PER_LAYER + 3
