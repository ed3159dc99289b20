"""Seconds per optimizer step of one planned configuration, split by phase, from FLOPs and bytes over the GPU's rates.

JSON shape (`rlhf plan ... --json`; under `plan` in `--dry-run --json`), kept stable for the run's record to put
measured beside predicted:
- every object of `configurations` gains `time` and `step_seconds`:
  `time`: {"generation": s, "weight_sync": s, "scoring": s, "training": s, "optimizer_step": s, "saving": s,
  "waiting": s}, seconds per optimizer step on one GPU (every GPU does the same work under ZeRO-3), floats;
  `step_seconds`: their sum. The run's own configuration is the one with `"chosen": true`.
- the plan gains `gpu`: {"name", "source", "bf16_flops", "memory_bandwidth", "interconnect",
  "interconnect_bandwidth", "host_bandwidth", "memory", "network", "network_source", "fetch_latency",
  "corrections"} (FLOP/s, bytes/s, seconds; `source` names a calibration and its age when one was used,
  `corrections` the factors a rehearsal on this machine left), and `fastest` / `smallest`: the labels of
  the fitting configuration with the least `step_seconds` and the one with the least `peak_gpu` (null when none
  fits).
Phase keys (rlhf_cli/phases.Phase, in its order): `generation` (sampling the rollouts: HF generate or vLLM),
`weight_sync` (refreshing vLLM's weights), `scoring` (no-grad forwards: reference, reward, value, old log-probs),
`training` (the policy's, and PPO's value model's, forward and backward with ZeRO-3's all-gathers and
reduce-scatter), `optimizer_step` (Adam on the GPU, or on the CPU with its PCIe traffic when offloaded, NVMe when
there), `saving` (a checkpoint's write amortised over `save_steps`), `waiting` (on other ranks: 0, no imbalance is
modelled).
"""

from __future__ import annotations

from dataclasses import replace

from rlhf_cli.algorithms import algorithm
from rlhf_cli.algorithms.spec import StepWork
from rlhf_cli.generation.budget import bought_total
from rlhf_cli.machine.gpus import Gpu
from rlhf_cli.phases import EVERY_STEP, Phase
from rlhf_cli.plan import fixed_costs, memory
from rlhf_cli.plan.columns import Candidate, Plan
from rlhf_cli.plan.engines import plan_room
from rlhf_cli.plan.fetches import GenerationGathers, ZeroSettings, generation_gathers
from rlhf_cli.plan.inputs import Inputs
from rlhf_cli.plan.model_sizes import ModelSize
from rlhf_cli.plan.rates import Rates, forward_flops, modules

# Assumed, then checked against published step times (benchmarks/plan_published.py):
HF_DECODE_BANDWIDTH = 0.6  # share of memory bandwidth HF generate's decode step reaches reading the weights
ADAM_BYTES = 28  # per parameter of a GPU's partition: fp32 gradient, master, exp_avg, exp_avg_sq read, 3 written
ADAM_BANDWIDTH = 0.8  # share of memory bandwidth a fused Adam reaches
# DeepSpeedCPUAdam (AVX-512, every core of a machine): about 1e9 parameters a second per machine, assumed (the
# ZeRO-Offload paper, Ren et al. 2021, reports its CPU-Adam several times faster than PyTorch's on CPU)
CPU_ADAM_RATE = 1e9
NVME_BANDWIDTH = 3e9  # bytes/s per machine: one PCIe Gen4 NVMe drive's sequential rate
DISK_BANDWIDTH = 1e9  # bytes/s per machine writing a checkpoint (a local disk; network filesystems are slower)
TRL_SAVE_STEPS = 500  # transformers' TrainingArguments default save_steps


def step_time(inputs: Inputs, candidate: Candidate, gpu: Gpu, checkpoint_bytes: int) -> dict[str, float]:
    """Seconds per optimizer step of `candidate` on `gpu`, by phase (`Phase`, in its order)."""
    hw = inputs.hardware
    rates = Rates.of(gpu, hw.total_gpus, hw.machines, candidate.offload_params != "none")
    step = algorithm(inputs.algorithm).step_work(inputs.value)
    if candidate.engine_settings is not None:  # a separate engine: its room times generation and its syncs
        generation, weight_sync = plan_room(candidate.generation.engine.spec).engine_seconds(inputs, candidate,
                                                                                            rates, step)
    else:
        generation, weight_sync = generation_seconds(inputs, candidate, rates, step), 0.0
    return {
        Phase.GENERATION: generation,
        Phase.WEIGHT_SYNC: weight_sync,
        Phase.SCORING: scoring_seconds(inputs, candidate, rates, step),
        Phase.TRAINING: training_seconds(inputs, candidate, rates, step),
        Phase.OPTIMIZER_STEP: optimizer_seconds(inputs, candidate, rates),
        Phase.SAVING: saving_seconds(inputs, checkpoint_bytes, hw.machines, rates.calls(fixed_costs.SAVE_CALLS)),
        Phase.WAITING: 0.0,
    }


def generation_seconds(inputs: Inputs, candidate: Candidate, rates: Rates, step: StepWork) -> float:
    """The policy's own `generate` sampling one optimizer step's share of the rollouts: `generated` / batch calls
    of a prefill and one forward per completion token."""
    work, policy = inputs.work, inputs.roles[0].size
    calls = step.generated / work.generation_batch
    b, p, c = work.element_bytes, work.prompt_length, work.completion_length
    batch = work.generation_batch
    prefill = rates.matmul(forward_flops(policy, batch, p))
    kv = memory.kv_cache(policy, batch, p + c // 2, b)
    token = max((policy.params * b + kv) / (rates.memory * HF_DECODE_BANDWIDTH),
                rates.matmul(forward_flops(policy, batch, 1))) + rates.calls(fixed_costs.decode_token(policy))
    gathered, gathered_modules = _gathered(inputs, candidate)
    gathers = _generation_gathers(inputs, candidate)
    once = (rates.fetch(gathered * b) + _budget_seconds(inputs, candidate, rates)
            + gathers.once * rates.module_overhead)
    hooks = (modules(policy) - gathered_modules) * rates.calls(fixed_costs.ZERO3_HOOK_CALLS)
    per_pass = rates.fetch(gathers.hooked_numel * b)  # the persistent parameters stay whole: no bytes per pass
    decode_gathers = max(c - 1, 0) * gathers.per_pass * rates.module_overhead  # the first forward's are in `once`
    passes = (overlapped(inputs, prefill, per_pass) + hooks + c * (overlapped(inputs, token, per_pass) + hooks)
              + decode_gathers)
    return calls * (once + passes + rates.calls(fixed_costs.forward(policy) + fixed_costs.GENERATE_CALLS))


def overlapped(inputs: Inputs, compute: float, comm: float) -> float:
    """Seconds of `compute` beside ZeRO-3's fetches and reductions (`comm`): on a stream of their own they overlap
    (DeepSpeed's default under ZeRO-3); with the run's `overlap_comm: false` they run on the compute stream, after
    it (DeepSpeed's parameter coordinator then fetches on the default stream)."""
    return compute + comm if inputs.value("overlap_comm") is False else max(compute, comm)


def _generation_gathers(inputs: Inputs, candidate: Candidate) -> GenerationGathers:
    """The all-gathers of one generate call under the candidate's gather choice (rlhf_cli/plan/fetches.py)."""
    gather, policy = candidate.generation.gather, inputs.roles[0].size
    budget = gather.budget.numel(policy.params, inputs.work.element_bytes) if gather.budget is not None else None
    settings = ZeroSettings(inputs.persistence_threshold, inputs.value("stage3_prefetch_bucket_size"),
                            inputs.value("stage3_max_live_parameters"))
    return generation_gathers(policy, gather, budget, settings)


def _budget_seconds(inputs: Inputs, candidate: Candidate, rates: Rates) -> float:
    """A gather budget's own work per generate call: the policy's units found and chosen (a walk over its modules
    and parameters), the chosen ones' hooks taken off and registered again."""
    if candidate.generation.gather.budget is None:
        return 0.0
    return rates.calls(fixed_costs.BUDGET_MODULE_CALLS * modules(inputs.roles[0].size))


def _gathered(inputs: Inputs, candidate: Candidate) -> tuple[int, int]:
    """Policy (elements, modules) gathered once per generation call: all of it, a budget's units, or none."""
    gather, policy = candidate.generation.gather, inputs.roles[0].size
    if gather.budget is not None:
        return bought_total(policy.stretches, gather.budget.numel(policy.params, inputs.work.element_bytes))
    return (policy.params, modules(policy)) if gather.mode == "whole" else (0, 0)


def scoring_seconds(inputs: Inputs, candidate: Candidate, rates: Rates, step: StepWork) -> float:
    """No-grad forwards over the generated sequences: the reference (the policy with adapters off under LoRA), the
    reward and value models, and the policy's old log-probs when the trainer takes them. A model offloaded on its
    own fetches its shards from host memory for every forward, as the run's parameter offload does."""
    work = inputs.work
    old = step.scores_old_logprobs(candidate.engine_settings is not None)
    scored = [role for role in inputs.roles if role.name != "policy"] + ([inputs.roles[0]] if old else [])
    length = work.prompt_length + work.completion_length
    micro_batches = step.generated / work.score_batch
    return sum(micro_batches * _forward_pass(inputs, role.size, work.score_batch, length,
                                             replace(rates, params_offloaded=True) if role.offloaded else rates)
               for role in scored)


def _forward_pass(inputs: Inputs, model: ModelSize, batch: int, length: int,
                  rates: Rates) -> float:
    """One ZeRO-3 forward: compute overlapped with gathering every module, plus each module's fetch overhead."""
    b = inputs.work.element_bytes
    gather = rates.fetch(model.params * b)
    return (overlapped(inputs, rates.matmul(forward_flops(model, batch, length)), gather)
            + modules(model) * rates.per_module(model, inputs.persistence_threshold)
            + rates.calls(fixed_costs.forward(model)))


def training_seconds(inputs: Inputs, candidate: Candidate, rates: Rates, step: StepWork) -> float:
    """Forward and backward of every trained model over the step's micro-batches: 6 FLOPs a parameter and token
    (8 with gradient checkpointing's recomputed forward; a frozen LoRA base 4 or 6: no weight gradients), overlapped
    with ZeRO-3's all-gathers in the forward and the backward and the gradients' reduce-scatter; after HF
    generation from a gathered policy, the persistent modules the gather released are fetched again."""
    work, b = inputs.work, inputs.work.element_bytes
    micro_batches = step.trained / work.train_batch
    recompute = 2 if work.gradient_checkpointing else 0
    seconds = 0.0
    for role in (role for role in inputs.roles if role.trained):
        model = role.size
        forward = forward_flops(model, work.train_batch, work.train_sequence)
        adapter = role.adapter.params if candidate.lora and role.adapter else None
        base = (4 + recompute) / 2 if adapter is not None else (6 + recompute) / 2
        flops = base * forward + (6 * adapter * work.train_batch * work.train_sequence if adapter else 0)
        gradients = (adapter if adapter is not None else model.params) * b
        comm = 2 * rates.fetch(model.params * b) + rates.all_gather(gradients)
        seconds += micro_batches * (overlapped(inputs, rates.matmul(flops), comm)
                                    + 2 * modules(model) * rates.per_module(model, inputs.persistence_threshold)
                                    + rates.calls(fixed_costs.forward_backward(model)))
    if candidate.engine_settings is None:  # the policy's persistent modules a gather released, fetched again
        released = _generation_gathers(inputs, candidate).released * rates.module_overhead
        seconds += step.generated / work.generation_batch * released
    return seconds


def optimizer_seconds(inputs: Inputs, candidate: Candidate, rates: Rates) -> float:
    """Adam over each GPU's partition: on the GPU at its memory's rate; offloaded, DeepSpeedCPUAdam on the
    machine's cores with the gradients down and the updated parameters up over PCIe; on NVMe, the states read and
    written too. Each step also pays its fixed calls (the trainer's per-step work and DeepSpeed's step)."""
    b = inputs.work.element_bytes
    trained = sum(role.adapter.params if candidate.lora and role.adapter else role.size.params
                  for role in inputs.roles if role.trained)
    share = trained / rates.gpus
    fixed = rates.calls(fixed_costs.STEP_CALLS)
    if candidate.offload_optimizer == "none":
        return share * (ADAM_BYTES + b) / (rates.memory * ADAM_BANDWIDTH) + fixed
    seconds = fixed + trained / rates.machines / CPU_ADAM_RATE + share * 2 * b / rates.host
    if candidate.offload_optimizer == "nvme":
        seconds += 2 * trained / rates.machines * memory.OPTIMIZER_STATE_BYTES / NVME_BANDWIDTH
    return seconds


def saving_seconds(inputs: Inputs, checkpoint_bytes: int, machines: int, per_save: float = 0.0) -> float:
    """The run's writes at the disk's rate, each with its fixed cost `per_save`, per step: a checkpoint every
    `save_steps` (a fraction of `max_steps`; none with `save_strategy: no`) and, at the end, the final model's
    weights (the ranks always save it). With `max_steps` known, the checkpoints the run really writes and the final
    model spread over its steps; else one checkpoint over `save_steps`."""
    rate = DISK_BANDWIDTH * machines
    steps = inputs.value("max_steps") or 0
    every = inputs.value("save_steps") or TRL_SAVE_STEPS
    if every < 1:
        every = every * steps if steps > 0 else TRL_SAVE_STEPS
    every = max(int(every), 1)
    saving = str(inputs.value("save_strategy")) != "no"
    if steps <= 0:
        return (checkpoint_bytes / rate + per_save) / every if saving else 0.0
    final = inputs.roles[0].size.params * inputs.work.element_bytes
    checkpoints = steps // every if saving else 0
    return ((checkpoints * checkpoint_bytes + final) / rate + (checkpoints + 1) * per_save) / steps


def final_save_seconds(plan: Plan) -> float | None:
    """Seconds of the run's last save, the final model's weights (the ranks always save it): what a running job's
    ETA counts for it until the run has measured a save of its own; None without a known GPU."""
    hw = plan.hardware
    if not plan.known or hw is None or hw.gpu is None or not plan.roles or plan.work is None:
        return None
    rates = Rates.of(hw.gpu, hw.total_gpus, hw.machines, False)
    weights = plan.roles[0].size.params * plan.work.element_bytes
    return weights / (DISK_BANDWIDTH * hw.machines) + rates.calls(fixed_costs.SAVE_CALLS)


def planned_step_seconds(plan: Plan) -> dict[str, float] | None:
    """The run's own configuration's seconds per step by measured step phase (rlhf_cli/phases.py: what each one
    measures of the plan's), for a running job's ETA to start from; None unless the plan timed this machine (a GPU
    named for another, or none known, says nothing of the steps here)."""
    chosen = plan.chosen if plan.known else None
    if chosen is None or chosen.seconds is None or plan.hardware is None or not plan.hardware.this_machine:
        return None
    return {phase: sum(chosen.seconds[name] for name in phase.planned) for phase in EVERY_STEP}
