"""Per-GPU memory of one ZeRO-3 RLHF run, as pure functions of sizes, lengths and batch sizes (bytes).

A run goes through phases that never overlap on a GPU: generation (the policy's weights as generation
sees them, the KV cache), training (the parameters ZeRO-3 keeps live in a forward/backward, activations,
the LM head's logits or gradients) and the optimizer step. What stays for the whole run is static: the
model states of the trained models, the shards of the frozen ones, and a fixed allowance.
Peak per GPU = static + the largest phase.

Symbols: P a model's parameters, L the most parameters one module owns (the embedding or the LM head),
G GPUs in total, N machines, b bytes per element as the run trains (2 under bf16 or fp16 mixed precision,
else the dtype's), h hidden size, q = heads x head_dim, kv = kv_heads x head_dim, i the MLP's inner width,
a heads, V vocabulary, s tokens per training sequence, c completion tokens.

Model states of a trained model (DeepSpeed 0.19, `runtime/zero/stage3.py`), per parameter, 1/G on each GPU:
- the parameter partition, b (`fp16_partitioned_groups_flat`), on the CPU with parameter offload;
- the gradient partition in the model's dtype, b (`grad_partitions_flat_buffer`, `gradient_accumulation_dtype`);
- the fp32 master copy, 4 (`_create_fp32_partitions`: a copy even in fp32, where the branch that would
  reuse the partition compares a torch.device with a device name and never matches), and Adam's two fp32
  moments, 8;
- with the optimizer offloaded, the last three and DeepSpeedCPUAdam's fp32 gradient buffer, 4
  (`initialize_optimizer_states`), are in pinned CPU memory (`self.device` is the CPU).
That is 12 + 2b bytes per parameter without offload, 16 under mixed precision; b on the GPU and 16 + b in
CPU memory with the optimizer offloaded (checked against DeepSpeed's optimizer in tests/test_plan.py).
DeepSpeed's `estimate_zero3_model_states_mem_needs` (18P/G + 4L; 2P/G + 4L offloaded) adds 4 x the largest
layer for every trained model, gathered whole or not; here the module being run is counted once, where it
is live (below).
Only during the optimizer step, the fp32 gradient of one sub-group (`_prepare_fp32_grad_for_sub_group`
flattens its b-byte gradients, then casts them): (4 + b) x min(P/G, sub_group_size + L/G) bytes under mixed
precision (a sub-group closes at the parameter that fills it), 4 per element in fp32 (the cast is a no-op);
nothing on the GPU with the optimizer offloaded.
Without zero.Init each process first loads the whole model into CPU memory: 4P, as DeepSpeed's estimator says.

Frozen models (reference, reward): ZeRO-3 shards of P x b / G, in CPU memory with parameter offload.

Weights: gathering for generation materialises the whole policy, P x b (for PPO the value model too: they
are one DeepSpeed engine). Otherwise DeepSpeed prefetches only within what is left of
stage3_max_live_parameters (`max_params_to_prefetch` in its parameter coordinator), while the module being
run is fetched whatever the budget: min(P, max_live + L) x b, in generation and in training alike
(measured on a 100M model: benchmarks/). With a gather budget, the units it buys (rlhf_cli/generation/budget.py;
B parameters) plus that bound for the rest: B x b + min(P - B, max_live + L) x b. Training adds the gradient
of the module being reduced, L x b: ZeRO-3 materialises each module's whole gradient before it reduce-scatters
it.

KV cache: layers x 2 x kv x batch x (prompt + completion) x b.

Activations: what autograd keeps for the backward, read from transformers 5's modeling code and checked
against torch's saved-tensor hooks (tests/test_plan.py). Per token and layer, llama-like block:
- each of the 2 RMSNorms: an fp32 copy of its input (4h), the normalised input cast back (bh), its output
  (bh, kept by the projections that read it) and an fp32 rstd (4): (4 + 2b)h + 4;
- attention: FlashAttention and SDPA's fused kernels keep q, k, v, their output and an fp32 log-sum-exp,
  b(2q + 2kv) + 4a (RoPE's products keep only cos and sin, shared by all layers). Under
  `attn_implementation: sdpa` (transformers' default) with a padded batch, which RLHF batches are,
  transformers repeats k and v over every head (`repeat_kv`) and PyTorch turns the boolean mask into an
  additive one that the kernel keeps: 4bq + 4a + bs, and the boolean mask itself, s bytes per token for all
  layers. Eager attention keeps q, the repeated k and v and its output (4bq), the fp32 softmax (4as) and its
  b-byte copy (bas; none in fp32), and a b-byte additive mask for all layers: the only term in s per layer,
  Korthikanti et al.'s 5as (their softmax input, output and dropout mask);
- SwiGLU MLP: gate, SiLU(gate), up and their product, 4bi;
- qwen3's RMSNorms of each head's queries and keys: (4 + b)(q + kv) + 4(a + kv_heads).
Korthikanti et al. ("Reducing Activation Recomputation in Large Transformer Models", 2022, section 4.1)
count 34 bytes per hidden unit for a GPT block (LayerNorm, a 4h GeLU MLP, dropout masks); a llama-like
block in bf16 keeps 16 + (4q + 4kv + 8i)/h: 63 for Qwen2.5-7B, 49 for Llama-3.1-8B under FlashAttention.
With `use_liger_kernel` (Liger's RMSNorm and SwiGLU kernels patched into each decoder layer and the final
norm; `liger_kernel/ops/rms_norm.py` and `swiglu.py`, `ctx.save_for_backward`): an RMSNorm keeps its
input, output and rstd, 2bh + 4; SwiGLU keeps gate and up, and the down projection their product: 3bi.
Liger's fused linear cross-entropy needs labels; none of our trainers passes them (see Logits).
GPT-NeoX block (pythia; GPT-2 counted alike, approximately): its LayerNorms' input, statistics and outputs,
the fused QKV output (v is a view of it), rotated q and k, the attention output and the dense projection's
input, the GeLU MLP's input and output: 10bh + 2bi + 4a + 4b, measured the same way.
All layers without gradient checkpointing; with it, each layer's input (bh) and one layer recomputed in the
backward. Plus the final norm, the masks above, and the gradients alive at once inside one MLP's backward:
the output's (bh) and, llama-like, the product's, SiLU's and up's (3bi; Liger writes two of them over its
saved inputs: bi), GeLU's input's and output's (2bi).

Logits: a `LogitsModel` per trainer (its registry entry, rlhf_cli/algorithms). A trainer that materialises
logits holds, at its peak, some [sequence, V] and [completion, V] tensors in the model's dtype. TRL 1.16's fused LM head
(`add_fused_lm_head`, RLOO and GRPO) never does: it projects tiles of 4096 tokens x 32768 vocabulary
entries (`TOKEN_CHUNK_SIZE`, `_CHUNKED_LOGPROB_CHUNK_SIZE`), keeps the scored tokens' hidden states and 7
fp32 statistics per token, and in the backward accumulates the head weight's gradient in fp32 (4Vh; its
b-byte cast is the module gradient counted above) and the hidden states' (4 + b per element).

CUDA context and communication buffers: a fixed CONTEXT_ALLOWANCE.

LoRA (`--lora`: PEFT adapters on the trained models, through TRL's `peft_config` or, for PPO,
rlhf_cli/rank/lora.py; A the adapter's parameters, counted from config.json in rlhf_cli/plan/model_sizes.py):
- the base weights stay frozen ZeRO-3 shards, P x b / G, like a reference model's (in CPU memory with
  parameter offload); the adapters train: A (rank x in) and B (out x rank) per adapted module, DoRA's
  magnitudes, modules_to_save copies (PPO's value head), with the trained model's states above applied to A
  (under ZeRO-3, TRL and rlhf keep adapters in the model's dtype: `autocast_adapter_dtype=False`, trl#6091);
- no reference copy: the trainers take reference log-probs with the adapters disabled (TRL's
  `use_adapter`/`disable_adapter`, PPO's `_reference_logits`);
- gathering for generation gathers base and adapters, (P + A) x b; generation runs the adapters unmerged,
  a rank-r product per adapted module beside the frozen one, with no weight copy;
- only adapters get gradients: the module being reduced is the largest adapter matrix (or copy), and the
  optimizer step's fp32 sub-group is the adapters';
- a frozen layer keeps only what the gradient of its input needs, not what its weights' gradients need
  (checked against autograd's saved tensors, tests/test_lora.py). Llama-like: not the RMSNorms' casts back
  and outputs (with Liger, the outputs), the SwiGLU product (down_proj's input), eager attention's output
  (o_proj's input; SDPA and FlashAttention keep it for their own backward), qwen3's per-head norm casts;
  GPT-NeoX: not the LayerNorms' outputs, the dense projection's input, the GeLU output; the final norm alike.
  Each adapter keeps A's output for B's gradient, rank x b per token, and A's input for A's gradient: with
  lora_dropout (TRL's default 0.05) its own dropped copy, b per element, and the dropout mask, 1 byte (CUDA's
  `native_dropout` returns a bool mask; the CPU's dropout multiplies by a noise tensor of the model's dtype,
  b bytes); without dropout the input itself, once per tensor adapted modules read;
- a frozen LM head gets no weight gradient from TRL's fused head (its backward checks `needs_input_grad`).

A checkpoint on disk, summed over ranks: each trained model's weights as saved (P x b) and its optimizer
states (the fp32 master copy and Adam's two moments: 12 bytes per parameter).

vLLM (generation by vLLM instead of the policy's `generate`): rlhf_cli/plan/engines/vllm.py.

Not counted: the allocator's fragmentation and caching, mixture-of-experts routing, the generation's
transient logits, Adam's temporaries (transformers' default is the fused AdamW: none), and adapter matrices
below stage3_param_persistence_threshold, which ZeRO-3 keeps whole on every GPU (at most A x b).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rlhf_cli.algorithms.spec import LogitsModel
from rlhf_cli.generation.budget import Stretch, bought_total
from rlhf_cli.models.architectures import ATTENTION_OUTPUT, Module
from rlhf_cli.phases import MemoryPhase
from rlhf_cli.plan.model_sizes import Adapter, ModelSize

GIB = 2**30
CONTEXT_ALLOWANCE = int(1.5 * GIB)  # CUDA context (~0.5 GiB), DeepSpeed's reduce bucket (5e8 x 2 bytes), NCCL
MARGIN = 0.10  # a configuration fits when its peak is at most 90% of a GPU's memory
DEFAULT_MAX_LIVE_PARAMETERS = 1_000_000_000  # DeepSpeed's stage3_max_live_parameters
SUB_GROUP_SIZE = 1_000_000_000  # DeepSpeed's sub_group_size: parameters the optimizer steps at once
FUSED_HEAD_TILE = (4096, 32768)  # TRL's fused LM head: tokens x vocabulary entries projected at once
FUSED_HEAD_STATISTICS = 7  # fp32 values per scored token in TRL's fused LM head (max, sums, target logit...)
FLASH_ATTENTION, SDPA, EAGER = "flash_attention_2", "sdpa", "eager"


def zero3_model_states(params: int, element_bytes: int, gpus_per_machine: int, machines: int, *,
                       offload_optimizer: bool, offload_params: bool, zero_init: bool = True) -> tuple[int, int]:
    """(CPU bytes per machine, GPU bytes per GPU) of a trained model's ZeRO-3 states between steps."""
    total_gpus = machines * gpus_per_machine
    parameter = element_bytes
    optimizer = element_bytes + 4 + 8 + (4 if offload_optimizer else 0)  # gradient, master, Adam, CPU Adam's
    gpu = (0 if offload_params else parameter) + (0 if offload_optimizer else optimizer)
    cpu = (parameter if offload_params else 0) + (optimizer if offload_optimizer else 0)
    cpu_per_machine = params * cpu // machines
    if not zero_init:
        cpu_per_machine = max(cpu_per_machine, 4 * params * gpus_per_machine)
    return cpu_per_machine, params * gpu // total_gpus


def optimizer_step(params: int, largest_layer: int, element_bytes: int, total_gpus: int,
                   offload_optimizer: bool) -> int:
    """The fp32 gradients of the largest optimizer sub-group, on the GPU during the step. DeepSpeed closes a
    sub-group at the first parameter that takes it to sub_group_size, so one can exceed it by a partition."""
    if offload_optimizer:
        return 0
    sub_group = min(-(-params // total_gpus), SUB_GROUP_SIZE + -(-largest_layer // total_gpus))
    return sub_group * (4 + (element_bytes if element_bytes < 4 else 0))


OPTIMIZER_STATE_BYTES = 12  # per parameter: fp32 master weights, Adam's exp_avg and exp_avg_sq


def checkpoint_bytes(params: int, element_bytes: int) -> int:
    """Bytes one checkpoint of a trained model takes on disk: its weights and its optimizer states."""
    return params * (element_bytes + OPTIMIZER_STATE_BYTES)


def frozen_shard(params: int, element_bytes: int, total_gpus: int) -> int:
    return params * element_bytes // total_gpus


def generation_weights(params: int, element_bytes: int, gather: bool, max_live: int, largest_layer: int) -> int:
    """Policy bytes present on a GPU while generating: all of it gathered, else what ZeRO-3 keeps live."""
    return params * element_bytes if gather else live_parameters(params, element_bytes, max_live, largest_layer)


def gather_budget(units: Sequence[Stretch], budget_numel: int, params: int, element_bytes: int, max_live: int,
                  largest_layer: int) -> int:
    """Policy bytes present on a GPU while generating with a gather budget: the units it buys, gathered once for
    the call, plus what ZeRO-3 keeps live of the rest, as without gathering."""
    gathered, _ = bought_total(units, budget_numel)
    return gathered * element_bytes + live_parameters(params - gathered, element_bytes, max_live, largest_layer)


def live_parameters(params: int, element_bytes: int, max_live: int, largest_layer: int) -> int:
    return min(params, max_live + largest_layer) * element_bytes


def training_parameters(params: int, element_bytes: int, max_live: int, largest_layer: int,
                        largest_trained: int | None = None) -> int:
    """Live parameters in a forward/backward, and the gradient of the module ZeRO-3 is reducing: the largest
    trained one (under LoRA an adapter's matrix, not the frozen layer it adapts)."""
    gradient = largest_layer if largest_trained is None else largest_trained
    return live_parameters(params, element_bytes, max_live, largest_layer) + gradient * element_bytes


def kv_cache(model: ModelSize, batch: int, sequence: int, element_bytes: int) -> int:
    return model.layers * 2 * model.kv_heads * model.head_dim * batch * sequence * element_bytes


def _norm(model: ModelSize, element_bytes: int, liger: bool) -> int:
    """Bytes per token one normalisation keeps, its output included."""
    b, hidden = element_bytes, model.hidden
    if not model.gated_mlp:  # LayerNorm: input, output, mean and rstd in the model's dtype
        return 2 * b * hidden + 2 * b
    return (2 * b * hidden if liger else (4 + 2 * b) * hidden) + 4


def _frozen_norm(model: ModelSize, element_bytes: int, liger: bool) -> int:
    """What a normalisation keeps when no weight after it trains: not its output, nor RMSNorm's cast back."""
    return _norm(model, element_bytes, liger) - _norm_weight_inputs(model, element_bytes, liger)


def _norm_weight_inputs(model: ModelSize, element_bytes: int, liger: bool) -> int:
    """A normalisation's output (kept by the projections for their weights' gradients) and, RMSNorm without
    Liger, the normalised input cast back (kept by its own weight's product)."""
    return element_bytes * model.hidden * (2 if model.gated_mlp and not liger else 1)


def _weight_gradient_inputs(model: ModelSize, element_bytes: int, attention: str, liger: bool) -> int:
    """Bytes per token a layer keeps only for its weights' gradients: what it does not keep frozen (LoRA's base)."""
    b, q, kv = element_bytes, model.heads * model.head_dim, model.kv_heads * model.head_dim
    if not model.gated_mlp:  # both LayerNorms' outputs, the dense projection's input, the GeLU output
        return 3 * b * model.hidden + b * model.intermediate
    eager_output = b * q if attention == EAGER else 0  # o_proj's input; SDPA and FlashAttention keep it themselves
    qk_norm = b * (q + kv) if model.qk_norm else 0  # the per-head norms' casts back
    return 2 * _norm_weight_inputs(model, b, liger) + b * model.intermediate + eager_output + qk_norm


def adapter_activations(model: ModelSize, adapted: Sequence[Module], rank: int, element_bytes: int, attention: str,
                        dropout: bool, mask_bytes: int = 1, copies: Sequence[Module] = ()) -> int:
    """Bytes per token that LoRA adapters on `adapted` keep (PEFT's lora.Linear adds B(A(dropout(x))) x scale),
    and trained copies of `copies` (modules_to_save): A's output for B's gradient, rank x b per adapter; for A's
    gradient its input, with lora_dropout each adapter's dropped copy and mask, else the input itself, once per
    tensor read (as a copy keeps its input), unless the frozen layer keeps that tensor anyway (llama-like
    attention output under SDPA and FlashAttention). Embedding adapters take token ids and have no dropout."""
    b = element_bytes
    linear = [module for module in adapted if not module.embedding]
    kept = rank * b * len(adapted)
    if dropout:
        kept += sum((b + mask_bytes) * module.in_features for module in linear)
        linear = []
    kept_by_layer = {ATTENTION_OUTPUT} if model.gated_mlp and attention != EAGER else set()
    keeping = [*linear, *(copy for copy in copies if not copy.embedding)]
    read = {module.reads: module.in_features for module in keeping if module.reads not in kept_by_layer}
    return kept + b * sum(read.values())


def layer_activations(model: ModelSize, sequence: int, element_bytes: int, attention: str, liger: bool,
                      frozen: bool = False) -> int:
    """Bytes per token one decoder layer keeps for the backward (see the module's docstring); `frozen`: none of
    its weights trains, as under LoRA (its adapters' own activations are `adapter_activations`)."""
    if frozen:
        return (layer_activations(model, sequence, element_bytes, attention, liger)
                - _weight_gradient_inputs(model, element_bytes, attention, liger))
    b, h, a, i = element_bytes, model.hidden, model.heads, model.intermediate
    q, kv = model.heads * model.head_dim, model.kv_heads * model.head_dim
    scores = (4 + (b if b < 4 else 0)) * a * sequence  # eager: the fp32 softmax and its 16-bit copy
    if not model.gated_mlp:  # no grouped heads: eager keeps the scores instead of SDPA's output and log-sum-exp
        extra = {EAGER: scores - 4 * a - b * h, SDPA: b * sequence}.get(attention, 0)
        return 10 * b * h + 2 * b * i + 4 * a + 4 * b + extra
    if attention == EAGER:
        attention_bytes = 4 * b * q + scores
    elif attention == SDPA:
        attention_bytes = 4 * b * q + 4 * a + b * sequence
    else:
        attention_bytes = b * (2 * q + 2 * kv) + 4 * a
    mlp = (3 if liger else 4) * b * i
    qk_norm = (4 + b) * (q + kv) + 4 * (a + model.kv_heads) if model.qk_norm else 0
    return 2 * _norm(model, b, liger) + attention_bytes + mlp + qk_norm


def _shared_mask(sequence: int, element_bytes: int, attention: str) -> int:
    """Bytes per token of the 4D attention mask that every layer reads."""
    return {SDPA: sequence, EAGER: element_bytes * sequence}.get(attention, 0)


def _backward_transient(model: ModelSize, element_bytes: int, liger: bool) -> int:
    """Bytes per token of the gradients alive at once inside one MLP's backward."""
    inner = 2 if not model.gated_mlp else (1 if liger else 3)
    return element_bytes * (inner * model.intermediate + model.hidden)


def activations(model: ModelSize, batch: int, sequence: int, element_bytes: int, checkpointing: bool,
                attention: str = FLASH_ATTENTION, liger: bool = False, adapter: Adapter | None = None,
                mask_bytes: int = 1) -> int:
    """Activations kept for the backward of one micro-batch, and the gradients of one MLP's backward; with an
    adapter, of the frozen model and its adapters (`mask_bytes`: per element of a LoRA dropout mask)."""
    liger = liger and model.gated_mlp  # Liger patches llama-like blocks only
    b = element_bytes
    if adapter is None:
        layers = [(layer_activations(model, sequence, b, attention, liger), model.layers)]
        final = _norm(model, b, liger)
    else:
        frozen = layer_activations(model, sequence, b, attention, liger, frozen=True)
        layers = [(frozen + adapter_activations(model, modules, adapter.rank, b, attention, adapter.dropout,
                                                mask_bytes), count) for modules, count in adapter.layers]
        final = _frozen_norm(model, b, liger) + adapter_activations(
            model, adapter.outside, adapter.rank, b, attention, adapter.dropout, mask_bytes, adapter.copies)
    layers = [(per_layer, count) for per_layer, count in layers if count]  # (bytes per token of a layer, layers)
    stored = model.layers * b * model.hidden + max((per_layer for per_layer, _ in layers), default=0) \
        if checkpointing else sum(per_layer * count for per_layer, count in layers)
    per_token = (stored + final + _shared_mask(sequence, b, attention) + _backward_transient(model, b, liger))
    return batch * sequence * per_token


def logits(head: LogitsModel, model: ModelSize, batch: int, sequence: int, completion: int,
           element_bytes: int, head_trained: bool = True) -> int:
    """What the LM head holds at the training peak for one micro-batch (see LogitsModel); a frozen head (LoRA)
    gets no weight gradient from TRL's fused head (`needs_input_grad`)."""
    if head.fused_head:
        tokens = batch * completion
        tile = min(tokens, FUSED_HEAD_TILE[0]) * min(model.vocab, FUSED_HEAD_TILE[1]) * element_bytes
        weight_gradient = 4 * model.vocab * model.hidden if head_trained else 0
        hidden = tokens * model.hidden * (2 * element_bytes + 4)  # kept, their fp32 gradient, its cast
        return tile + weight_gradient + hidden + 4 * FUSED_HEAD_STATISTICS * tokens
    positions = head.sequence_copies * sequence + head.completion_copies * completion
    return batch * positions * model.vocab * element_bytes


@dataclass(frozen=True)
class Component:
    """One row of the plan: what holds memory, in which phase, on the GPU and in CPU memory per machine."""

    name: str
    phase: MemoryPhase
    gpu: int
    cpu: int = 0


def phase_totals(components: list[Component]) -> dict[MemoryPhase, int]:
    """GPU bytes of the static rows and of each phase's rows."""
    return {phase: sum(c.gpu for c in components if c.phase == phase) for phase in MemoryPhase}


def peak(components: list[Component]) -> int:
    """Static memory plus the largest phase."""
    totals = phase_totals(components)
    return totals[MemoryPhase.STATIC] + max(totals[phase] for phase in MemoryPhase if phase != MemoryPhase.STATIC)


def fits(gpu_bytes: int, gpu_memory: int) -> bool:
    return gpu_bytes <= (1 - MARGIN) * gpu_memory
