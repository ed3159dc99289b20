"""A resolved run -> its memory plan: every candidate configuration's per-GPU peak, the run's own marked.

Candidates: gather / no-gather x offload none / optimizer to CPU / optimizer and parameters to CPU, the same
with LoRA (offload none / optimizer and parameters: the optimizer states are the adapters', so offloading them
alone saves little), plus the run's own configuration when it is none of these (a gather budget, NVMe offload).
`gather: auto` takes the fastest of gather, the gather budgets and no-gather that fits (rlhf_cli/plan/time.py),
and every plan lists that configuration. Planning never raises for a
model it cannot size: the plan is then `unknown` with the reason, and only `gather: auto` fails.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from itertools import accumulate
from typing import Any

from rlhf_cli.algorithms import algorithm
from rlhf_cli.config.engines import config_room
from rlhf_cli.config.run import ResolvedRun
from rlhf_cli.errors import PlanError
from rlhf_cli.generation.budget import Budget, ranked
from rlhf_cli.generation.choice import GATHER_KEY, Engine, Gather, Generation
from rlhf_cli.phases import MemoryPhase
from rlhf_cli.plan import memory, time
from rlhf_cli.plan.columns import OFFLOADS, Candidate, Column, Plan, trained_checkpoint_bytes
from rlhf_cli.plan.engines import engine_rows, engine_settings, engine_starts, plan_room
from rlhf_cli.plan.inputs import Inputs, read_inputs
from rlhf_cli.plan.memory import Component
from rlhf_cli.plan.workload import tool_note, workload
from rlhf_cli.sizes import gib

LORA_OFFLOADS = (("none", "none"), ("cpu", "cpu"))
MAX_MACHINES_SEARCHED = 256
MAX_BUDGETS_TRIED = 128  # gather budgets `gather: auto` times per configuration (gather_choices)
MAX_GENERATION_BATCH = 1 << 16  # sequences per GPU: the search for the largest generation batch stops there


def components(inputs: Inputs, candidate: Candidate) -> list[Component]:
    """Every row of one candidate's column. Each trained model has a states row (with LoRA: its adapters') and
    a shard row (with LoRA: its frozen base); under LoRA the reference is the policy with adapters off: no copy."""
    hw, work = inputs.hardware, inputs.work
    size_bytes = work.element_bytes
    optimizer_offloaded, params_offloaded = candidate.offload_optimizer != "none", candidate.offload_params != "none"

    def shard(name: str, params: int, loading: int = 0, on_host: bool = params_offloaded) -> Component:
        offloaded = params * size_bytes // hw.machines if on_host else 0
        return Component(f"{name} shard", MemoryPhase.STATIC, 0 if on_host else
                         memory.frozen_shard(params, size_bytes, hw.total_gpus), max(offloaded, loading))

    rows: list[Component] = []
    for role in inputs.roles:
        params = role.size.params
        adapter = role.adapter if candidate.lora else None
        if role.trained:
            cpu, gpu = memory.zero3_model_states(
                adapter.params if adapter else params, size_bytes, hw.gpus_per_machine, hw.machines,
                offload_optimizer=optimizer_offloaded, offload_params=params_offloaded,
                zero_init=inputs.zero_init or adapter is not None)
            rows.append(Component(f"{role.name} states", MemoryPhase.STATIC, gpu, cpu))
            # without zero.Init each process loads the whole model into CPU memory first, adapters or not
            loading = 0 if inputs.zero_init or adapter is None else 4 * params * hw.gpus_per_machine
            rows.append(shard(role.name, params if adapter else 0, loading))
        else:
            rows.append(shard(role.name, 0 if candidate.lora and role.name == "reference" else params,
                              on_host=params_offloaded or role.offloaded))
    rows.append(Component("CUDA + buffers", MemoryPhase.STATIC, memory.CONTEXT_ALLOWANCE))
    trained = [role for role in inputs.roles if role.trained]
    adapters = [role.adapter for role in trained if role.adapter] if candidate.lora else []
    policy = inputs.roles[0].size
    # PPO trains policy and value as one engine; with LoRA it holds the adapters beside the frozen weights
    engine = sum(role.size.params for role in trained) + sum(adapter.params for adapter in adapters)
    largest = max(role.size.largest_layer for role in trained)
    trained_params = sum(adapter.params for adapter in adapters) if candidate.lora else engine
    largest_trained = max(adapter.largest for adapter in adapters) if candidate.lora else largest
    hf = candidate.engine_settings is None  # with a separate engine the policy does not generate: its rows instead
    rows.append(Component("gen weights", MemoryPhase.GENERATION,
                          _generation_weights(inputs, candidate, engine, largest) if hf else 0))
    rows.append(Component("gen KV cache", MemoryPhase.GENERATION, memory.kv_cache(
        policy, work.generation_batch, work.prompt_length + work.completion_length, size_bytes) if hf else 0))
    rows.append(Component("train live params", MemoryPhase.TRAINING, memory.training_parameters(
        engine, size_bytes, inputs.max_live, largest, largest_trained)))
    rows.append(Component("train activations", MemoryPhase.TRAINING, sum(
        memory.activations(role.size, work.train_batch, work.train_sequence, size_bytes, work.gradient_checkpointing,
                           work.attention, work.liger, role.adapter if candidate.lora else None, inputs.mask_bytes)
        for role in trained)))
    head_trained = not candidate.lora or bool(inputs.roles[0].adapter and inputs.roles[0].adapter.head_trained)
    rows.append(Component("train logits", MemoryPhase.TRAINING, memory.logits(
        work.logits, policy, max(work.train_batch, work.score_batch), work.train_sequence, work.completion_length,
        size_bytes, head_trained)))
    rows.append(Component("step fp32 grads", MemoryPhase.STEP, memory.optimizer_step(
        trained_params, largest_trained, size_bytes, hw.total_gpus, optimizer_offloaded)))
    return rows + engine_rows(inputs, candidate, rows)


def _generation_weights(inputs: Inputs, candidate: Candidate, engine: int, largest: int) -> int:
    """The `gen weights` row: the whole policy gathered, a gather budget's units plus what ZeRO-3 keeps live of the
    rest, or only what ZeRO-3 keeps live."""
    size_bytes, policy, gather = inputs.work.element_bytes, inputs.roles[0].size, candidate.generation.gather
    if gather.budget is None:
        return memory.generation_weights(engine, size_bytes, gather == Gather.whole, inputs.max_live, largest)
    return memory.gather_budget(policy.stretches, gather.budget.numel(policy.params, size_bytes), engine, size_bytes,
                                inputs.max_live, largest)


def _column(inputs: Inputs, candidate: Candidate, chosen: bool) -> Column:
    rows = components(inputs, candidate)
    peak = memory.peak(rows)
    gpu = inputs.hardware.gpu
    seconds = time.step_time(inputs, candidate, gpu, trained_checkpoint_bytes(
        inputs.roles, candidate.lora, inputs.work.element_bytes)) if gpu else None
    factors = inputs.hardware.corrections
    if seconds and factors:
        seconds = {phase: value * factors.get(phase, 1.0) for phase, value in seconds.items()}
    return Column(candidate, rows, peak, sum(row.cpu for row in rows),
                  memory.fits(peak, inputs.hardware.gpu_memory) and engine_starts(inputs, candidate), chosen, seconds)


def _fits(inputs: Inputs, candidate: Candidate) -> bool:
    return _column(inputs, candidate, False).fits


def _largest_fitting(inputs: Inputs, candidate: Candidate, name: str) -> int | None:
    """The largest value of an integer trainer field, below the run's, with which `candidate` fits."""
    current = inputs.value(name)

    def fits_with(number: int) -> bool:
        def value(key: str) -> Any:
            return number if key == name else inputs.value(key)
        work = workload(inputs.algorithm, value, inputs.hardware.total_gpus, inputs.roles[0].size.max_positions)
        return _fits(replace(inputs, work=work), candidate)

    return _largest(fits_with, current - 1)


def _largest(fits_with: Callable[[int], bool], high: int) -> int | None:
    """The largest number from 1 to `high` that fits, when fitting only gets harder as the number grows."""
    low = 0  # the answer lies in low..high; low is 0 or a number that fits
    while low < high:
        middle = (low + high + 1) // 2
        if fits_with(middle):
            low = middle
        else:
            high = middle - 1
    return low or None


def _machines_needed(inputs: Inputs, candidate: Candidate) -> int | None:
    hw = inputs.hardware
    for machines in range(hw.machines + 1, MAX_MACHINES_SEARCHED + 1):
        bigger = replace(hw, machines=machines)
        if _fits(replace(inputs, hardware=bigger), candidate):
            return machines
    return None


def suggestions(inputs: Inputs, columns: list[Column], candidate: Candidate) -> list[str]:
    """What would fit when `candidate` does not: other configurations, more GPUs, shorter or smaller batches."""
    same_engine = [c for c in columns if c.candidate.engine == candidate.engine]  # vLLM's own search is below
    found = [f"{c.candidate.label} fits ({gib(c.peak)})" for c in same_engine
             if c.fits and c.candidate.lora == candidate.lora]
    lora = [c for c in same_engine if c.fits and c.candidate.lora]
    if not candidate.lora and not found and lora:  # offloading parameters is the slowest way to fit; then no-gather
        best = min(lora, key=lambda c: (c.candidate.offload_params != "none",
                                        c.candidate.generation.gather != Gather.whole))
        found.append(f"--lora fits ({gib(best.peak)}): {best.candidate.label}")
    per_machine = inputs.hardware.gpus_per_machine
    machines = _machines_needed(inputs, candidate)
    found.append(f"{candidate.label} fits on {machines * per_machine} GPUs ({machines} machine(s) of {per_machine})"
                 if machines else f"{candidate.label} fits on no number of {gib(inputs.hardware.gpu_memory)} GPUs: "
                                  "what does not shrink with more GPUs (weights gathered, activations) is too big")
    entry = algorithm(inputs.algorithm)
    for name in (entry.completion_field, *entry.batch_fields):
        largest = _largest_fitting(inputs, candidate, name)
        if largest:
            found.append(f"{candidate.label} fits with {name} {largest} (now {inputs.value(name)})")
    return found


def _run_candidate(run: ResolvedRun, gather: Gather) -> Candidate:
    """The run's own offload, LoRA and engine, with `gather`."""
    deepspeed = run.accelerate.get("deepspeed_config") or {}
    engine = run.generation.engine
    return Candidate(Generation(gather, engine), deepspeed.get("offload_optimizer_device") or "none",
                     deepspeed.get("offload_param_device") or "none", lora=bool(run.value("use_peft")),
                     engine_settings=engine_settings(run.value, engine))


def gather_choices(inputs: Inputs, candidate: Candidate) -> list[Candidate]:
    """`candidate` gathering the whole policy, then gather budgets of its units bought in order (the largest first;
    all units but the last: a budget of the whole policy is gathering), then none. Every budget up to
    MAX_BUDGETS_TRIED; past that (a deep model) that many spread evenly, and the largest that fits, so that
    planning does not grow with the square of the depth."""
    policy, engine = inputs.roles[0].size, candidate.generation.engine
    bought = [numel for part in ranked(policy.stretches) for numel in [part.unit.numel] * part.count]
    totals = list(accumulate(bought))[:-1]

    def with_budget(numel: int) -> Candidate:
        budget = Gather.of(Budget(fraction=(numel + 0.5) / policy.params))
        return replace(candidate, generation=Generation(budget, engine))

    if len(totals) > MAX_BUDGETS_TRIED:
        step = len(totals) / MAX_BUDGETS_TRIED
        tried = {int(index * step) for index in range(MAX_BUDGETS_TRIED)}
        largest = _largest(lambda count: _fits(inputs, with_budget(totals[count - 1])), len(totals))
        totals = [totals[index] for index in sorted(tried | ({largest - 1} if largest else set()))]
    whole, shards = (replace(candidate, generation=Generation(gather, engine)) for gather in (Gather.whole,
                                                                                              Gather.shards))
    return [whole, *(with_budget(numel) for numel in reversed(totals)), shards]


def fastest_fitting(inputs: Inputs, choices: list[Candidate]) -> Candidate | None:
    """`gather: auto`'s choice: of `choices`, the fitting one with the fewest seconds per step; with no GPU to time
    them on, the first that fits (the order of `gather_choices`: the most gathered)."""
    fitting = [column for column in (_column(inputs, candidate, False) for candidate in choices) if column.fits]
    timed = [column for column in fitting if column.step_seconds is not None]
    if timed:
        return min(timed, key=lambda column: column.step_seconds or 0.0).candidate
    return fitting[0].candidate if fitting else None


def _largest_generation_batch(inputs: Inputs, candidate: Candidate) -> int | None:
    """The most sequences one GPU can generate together with `candidate` (the KV cache grows with them); with
    vLLM, the sequences its KV cache holds per process; None: not even one (or, vLLM server: not planned)."""
    if candidate.generation.engine.separate:
        return plan_room(candidate.generation.engine.spec).engine_batch(inputs, candidate)

    def fits_with(batch: int) -> bool:
        return _fits(replace(inputs, work=replace(inputs.work, generation_batch=batch)), candidate)

    return _largest(fits_with, MAX_GENERATION_BATCH)


def _describe(column: Column, gpu_memory: int) -> str:
    candidate = column.candidate
    verdict = "fits" if column.fits else "does not fit"
    return (f"{candidate.generation.describe()} ({candidate.label}) needs {gib(column.peak)} of {gib(gpu_memory)} "
            f"per GPU: {verdict} with a {memory.MARGIN:.0%} margin")


def plan_run(run: ResolvedRun) -> Plan:
    """The run's plan; unknown (with the reason) when a model or the hardware cannot be sized."""
    inputs = read_inputs(run)
    if isinstance(inputs, str):
        return Plan(False, why_unknown=inputs)
    gather, engine = run.generation.gather, run.generation.engine
    own = _run_candidate(run, Gather.whole if gather == Gather.auto else gather)
    separate = engine if engine.separate else Engine.separate_of(run.value)  # the engine of the separate columns
    room = plan_room(separate.spec)
    settings = room.run_settings(run.value)
    best = _auto_choice(inputs, replace(own, generation=Generation(Gather.whole, engine)),
                        settings if room.left_open(run) else None, separate)
    chosen = best if gather == Gather.auto else own
    hf, with_separate = Generation(engine=Engine.hf), Generation(engine=separate)
    whole_or_shards = (Gather.whole, Gather.shards)
    candidates = [Candidate(replace(hf, gather=g), optimizer, params) for g in whole_or_shards
                  for optimizer, params in OFFLOADS]
    candidates += [Candidate(replace(hf, gather=g), optimizer, params, lora=True) for g in whole_or_shards
                   for optimizer, params in LORA_OFFLOADS]
    candidates += [Candidate(replace(with_separate, gather=g), optimizer, params, engine_settings=settings)
                   for g in whole_or_shards for optimizer, params in OFFLOADS]
    sharded = [replace(own, generation=Generation(Gather.shards, engine))] if gather == Gather.auto else []
    candidates += [c for c in dict.fromkeys((own, *sharded, chosen, best)) if c not in candidates]
    columns = [_column(inputs, candidate, candidate == chosen) for candidate in candidates]
    mine = next(column for column in columns if column.chosen)
    notes = [f"{role.name} ({role.path}): unknown architecture, counted as a llama-like decoder"
             for role in inputs.roles if role.size.approximate]
    notes += [f"{role.name} ({role.path}): LoRA adapters sized as a llama-like decoder's"
              for role in inputs.roles if role.adapter and role.adapter.approximate and not role.size.approximate]
    notes += filter(None, [tool_note(run.algorithm, run.value, inputs.work)])
    return Plan(True, hardware=inputs.hardware, roles=inputs.roles, work=inputs.work, columns=columns,
                reason=_describe(mine, inputs.hardware.gpu_memory),
                suggestions=[] if mine.fits else suggestions(inputs, columns, chosen), notes=notes,
                largest_generation_batch=_largest_generation_batch(inputs, chosen),
                engine_findings=room.engine_findings(lambda candidate: _column(inputs, candidate, False), inputs,
                                                     settings, separate, (own.offload_optimizer, own.offload_params)))


def _auto_choice(inputs: Inputs, gathered: Candidate, open_settings: Any, separate: Engine) -> Candidate:
    """`gather: auto`: the fastest gather (or, with vLLM, sync bucket) that fits; where the run left vLLM open, vLLM
    too. Without a GPU to time on: the policy gathering to generate when that fits, else vLLM with the largest
    sync bucket that fits, else the largest gather budget that fits; no-gather when nothing fits."""
    hf = gather_choices(inputs, gathered)
    choices = [hf[0]]
    if open_settings is not None:  # the separate engine's settings, where the run left the engine open
        choices += gather_choices(inputs, replace(gathered, generation=Generation(engine=separate),
                                                  engine_settings=open_settings))
    found = fastest_fitting(inputs, choices + hf[1:])
    return found or hf[-1]


def planned(run: ResolvedRun) -> tuple[ResolvedRun, Plan]:
    """Plan a resolved run once, and settle from that plan the choices left to it (`gather: auto`)."""
    plan = plan_run(run)
    return settle_gather(run, plan), plan


def settle_gather(run: ResolvedRun, plan: Plan) -> ResolvedRun:
    """`gather: auto` becomes the plan's choice (the fastest gather, budget or no-gather that fits with the margin;
    with a separate engine, of the weight sync; where the run left the engine open and vLLM is installed, vLLM when
    that is faster), with the reason as the value's source. A separate engine's run given no gather choice (its
    config room's SYNC_DEFAULT_SOURCE) syncs the whole policy when there is no plan. Errors name the fix; the
    engine's words are its plan room's (WORDS)."""
    if run.generation.gather != Gather.auto:
        return run
    engine = run.generation.engine
    words = plan_room(engine.spec).WORDS if engine.separate else None
    defaulted = engine.separate and run.settings[GATHER_KEY].source == config_room(engine.spec).SYNC_DEFAULT_SOURCE
    if not plan.known and words is not None and defaulted:
        return run.with_generation(Generation(Gather.whole, engine), f"default: no plan ({plan.why_unknown})",
                                   words.no_plan.format(why=plan.why_unknown))
    if not plan.known:
        raise PlanError(f"gather: auto needs a memory plan, and there is none: {plan.why_unknown}; "
                        "pass --gather or --no-gather, or make config.json available")
    assert plan.hardware is not None and plan.chosen is not None
    own, chosen = _run_candidate(run, Gather.whole), plan.chosen.candidate
    gathered, sharded = (plan.column(Generation(gather, engine), own.offload_optimizer, own.offload_params, own.lora,
                                     own.engine_settings) for gather in (Gather.whole, Gather.shards))
    assert gathered is not None and sharded is not None
    memory_text = gib(plan.hardware.gpu_memory)
    doing = words.syncing_whole if words is not None else "gathering"
    if not plan.chosen.fits:
        what = "; ".join(plan.suggestions)
        sharded_doing = "one unit at a time" if own.engine_settings else "generating from shards"
        raise PlanError(f"gather: auto: neither fits: {doing} needs {gib(gathered.peak)} and "
                        f"{sharded_doing} {gib(sharded.peak)} "
                        f"of {memory_text} per GPU ({memory.MARGIN:.0%} margin). {what}")
    why = f"{doing} needs {gib(gathered.peak)} of {memory_text}"
    chosen_words = plan_room(chosen.generation.engine.spec).WORDS if chosen.generation.engine.separate else None
    if chosen.generation.engine != engine and chosen_words is not None:
        why += f"; {chosen_words.left_open} with {chosen.label} needs {gib(plan.chosen.peak)}"
    if chosen.generation.gather.budget is not None:
        why += f"; gathering {chosen.generation.gather.budget} of the policy needs {gib(plan.chosen.peak)}"
    if plan.chosen.step_seconds is not None:
        why += f"; the fastest that fits: {plan.chosen.step_seconds:.3g} s per step"
    sync = chosen_words.chosen if chosen_words is not None else ""
    given = words.defaulted if words is not None and defaulted else ""
    return run.with_generation(chosen.generation, f"rlhf plan{given}: {why}",
                               f"gather: auto -> {sync}{chosen.mode}{given}; {why}")
