"""ZeRO-3 generation from shards (`--no-gather`): the fix stock TRL lacks, the recipe's ZeRO-3 knobs,
and an optional probe of what generation costs each rank (gathered parameters, all-gathers, memory, time).

Why the fix: generation runs many forward passes through DeepSpeed's ZeRO-3 hooks, and the
parameter coordinator keeps the fetch trace it recorded there. The next training forward and
backward then prefetch and release parameters by that stale trace and crash at the first
backward ("The size of tensor a (0) must match the size of tensor b (64)") on any model larger
than one prefetch bucket. TRL's gather path already invalidates the trace when it re-adds the
hooks (`trl.models.utils.add_hooks`, TRL PR #4693); its no-gather path does nothing. We wrap
TRL's private generation context (through `rlhf_cli.compat`), the one context manager through which
every TRL trainer (and our PPO) generates, and invalidate the trace after each no-gather generation.
Drop this module's fix once TRL invalidates the trace on its no-gather path too.

The same wrapper spends the gather budget (`gather_budget`, rlhf_cli/gather_budget.py): on TRL's no-gather path it
gathers the chosen units of the policy once per generation call and takes ZeRO-3's hooks off them, so that only
the rest is fetched per token; at the end it leaves ZeRO-3 as a full gather does (units partitioned, hooks back,
fetch trace invalidated).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from rlhf_cli import compat
from rlhf_cli.gather_budget import Budget, Unit, choose
from rlhf_cli.output.run_dir import PROBE_CUDA_MEMORY_ENV, PROBE_GENERATION_ENV, STOCK_TRL_ENV


class GenerationClock:
    """Seconds this rank spent generating (gathering included), for the progress line's gen s/step."""

    seconds = 0.0

    @classmethod
    def take(cls) -> float:
        """The seconds since the last call."""
        seconds, cls.seconds = cls.seconds, 0.0
        return seconds


def install_generation_context(required: bool, budget: Budget | None = None) -> None:
    """Wrap TRL's generation context so that no-gather generation leaves no stale trace behind, and spends
    `budget` (None or nothing: plain no-gather) when TRL generates without gathering.

    `required`: the run generates without gathering, so a TRL without the wrapped function is an error.
    """
    try:
        original = compat.trl_generation_context()
    except compat.InternalsChanged:
        if not required:
            return
        raise
    if getattr(original, "rlhf_no_gather_fix", False):
        original = original.__wrapped__  # installed again (tests): the new budget replaces the old one

    @contextlib.contextmanager
    def unwrap_without_stale_trace(model: Any, accelerator: Any, gather_deepspeed3_params: bool = True,
                                   *args: Any, **kwargs: Any) -> Iterator[Any]:
        started = time.perf_counter()
        phases = PhaseMemory.current()
        spend = None if gather_deepspeed3_params else budget  # gathering everything already
        with (phases.generating() if phases else contextlib.nullcontext(),
              _probe(model, gather_deepspeed3_params) as probe,  # around the gathering too
              original(model, accelerator, gather_deepspeed3_params, *args, **kwargs) as unwrapped,
              gathered_units(model, units := budget_units(model, generating_model(unwrapped), spend)),
              probe.sampling(unwrapped, units)):
            yield unwrapped
        GenerationClock.seconds += time.perf_counter() - started
        # STOCK_TRL_ENV: the regression test shows the upstream bug is still there, so that we learn when this can go.
        if not gather_deepspeed3_params and not os.environ.get(STOCK_TRL_ENV):
            compat.invalidate_fetch_trace(model)

    unwrap_without_stale_trace.rlhf_no_gather_fix = True
    unwrap_without_stale_trace.__wrapped__ = original
    compat.replace_trl_generation_context(unwrap_without_stale_trace)


def generating_model(unwrapped: Any) -> Any:
    """The module that generates: the unwrapped model itself, or the part it names (PPO's policy beside its
    value model, both in one DeepSpeed engine)."""
    return getattr(unwrapped, "generating_model", unwrapped)


# -- gather budget ----------------------------------------------------------------------------------

PINNED = -1  # in a gathered parameter's `ds_active_sub_modules` (module ids are >= 0): no hook may release it


@dataclass(frozen=True)
class ModuleUnit:
    """One unit of the policy (rlhf_cli/gather_budget.py) as modules: gathered whole or not at all."""

    unit: Unit
    roots: tuple[Any, ...]  # each with all its submodules
    params: tuple[Any, ...]

    @property
    def modules(self) -> list[Any]:
        return [module for root in self.roots for module in root.modules()]


def policy_units(model: Any) -> list[ModuleUnit]:
    """The units of a generating model: each decoder layer (an element of its largest ModuleList) with all its
    submodules, and each other module without submodules that holds parameters (embedding, LM head, final
    norm). Units that share a parameter (an LM head tied to the embedding) are one: gathered apart, the hooks
    of the one left would release the other's weight."""
    import torch

    lists = [module for module in model.modules() if isinstance(module, torch.nn.ModuleList)]
    layers = list(max(lists, key=lambda layer_list: sum(_numel(p) for p in layer_list.parameters()), default=[]))
    inside = {id(module) for layer in layers for module in layer.modules()}
    leaves = [module for module in model.modules() if id(module) not in inside
              and next(module.children(), None) is None and next(module.parameters(recurse=False), None) is not None]
    roots = [*layers, *leaves]
    group = list(range(len(roots)))  # union-find over shared parameters

    def find(index: int) -> int:
        while group[index] != index:
            index = group[index]
        return index

    owner: dict[int, int] = {}
    for index, root in enumerate(roots):
        for param in root.parameters():
            group[find(index)] = find(owner.setdefault(id(param), index))
    names = {id(module): name for name, module in model.named_modules()}
    units = []
    for leader in sorted({find(index) for index in range(len(roots))}):
        members = tuple(root for index, root in enumerate(roots) if find(index) == leader)
        params = tuple({id(p): p for root in members for p in root.parameters()}.values())
        unit = Unit("+".join(names[id(root)] for root in members), sum(_numel(p) for p in params),
                    sum(1 for root in members for _ in root.modules()))
        units.append(ModuleUnit(unit, members, params))
    return units


def _numel(param: Any) -> int:
    return getattr(param, "ds_numel", None) or param.numel()  # a ZeRO-3 parameter's own tensor is its shard


def budget_units(engine: Any, model: Any, budget: Budget | None) -> list[ModuleUnit]:
    """The units of `model` that `budget` buys (rlhf_cli/gather_budget.choose); none without a budget or ZeRO-3."""
    if budget is None or budget.nothing or compat.zero3_parameter_offload(engine) is None:
        return []
    units = policy_units(model)
    params = list(model.parameters())
    total = sum(_numel(p) for p in params)
    element_bytes = params[0].element_size() if params else 1
    picked = choose([unit.unit for unit in units], budget.numel(total, element_bytes))
    return [units[index] for index in picked]


@contextlib.contextmanager
def gathered_units(engine: Any, units: list[ModuleUnit]) -> Iterator[None]:
    """Gather `units` once, and run them without ZeRO-3's hooks: no fetch, release or trace at each token, for
    them. The rest is fetched per token as without gathering. At the end ZeRO-3 is as after a full gather: the
    units partitioned again, their hooks back, the fetch trace invalidated."""
    if not units:
        yield
        return
    import deepspeed

    params = [param for unit in units for param in unit.params]
    with deepspeed.zero.GatheredParameters(params):
        for param in params:
            param.ds_active_sub_modules.add(PINNED)  # a hooked module sharing one (external parameters) keeps it
        compat.remove_zero3_hooks(engine, [module for unit in units for module in unit.modules])
        try:
            yield
        finally:
            for param in params:
                param.ds_active_sub_modules.clear()  # GatheredParameters refuses to free an active parameter
            compat.register_zero3_hooks(engine, [root for unit in units for root in unit.roots])
            compat.invalidate_fetch_trace(engine)


def apply_zero3_settings(config: Any, knobs: dict[str, int]) -> None:
    """Put the recipe's stage3_* values into the DeepSpeed config the trainer will build its engine from."""
    plugin = getattr(config, "deepspeed_plugin", None)
    given = {name: value for name, value in knobs.items() if value is not None}  # null: DeepSpeed's default
    if given and plugin is not None:
        plugin.deepspeed_config.setdefault("zero_optimization", {}).update(given)


# -- probe ------------------------------------------------------------------------------------------

class GenerationProbe:
    """What one generation call cost this rank, measured around TRL's generation context.

    - gathered parameters: at every submodule's forward, how many ZeRO-3 parameters are fully present
      (`ds_status == AVAILABLE`). With --gather the whole model is present (1.0); without it, only the
      layers being run and those prefetched. Their bytes count those still being gathered too.
    - all-gathers: every all-gather collective DeepSpeed's communication backend launches (with --gather
      one per partitioned tensor, all at entry; without it one per fetched group of tensors, every token).
    - the units a gather budget gathered once for the call, and their bytes.
    - a digest of each batch of sequences generated: runs that generate the same tokens record the same digests.
    - process memory: the largest resident set size above the one at entry, sampled by a thread.
    - wall time of the call, gathering and releasing included.
    """

    calls: list[dict[str, Any]] = []
    ALL_GATHER_METHODS = ("all_gather", "all_gather_into_tensor", "all_gather_base", "all_gather_coalesced")
    RSS_INTERVAL_S = 0.01

    def __init__(self, model: Any) -> None:
        self.available, self.partitioned = compat.zero3_param_states()
        self.params = [p for p in model.parameters() if hasattr(p, "ds_status")]
        self.total = sum(p.ds_numel for p in self.params)
        self.total_bytes = sum(p.ds_numel * p.element_size() for p in self.params)
        self.peak = 0
        self.peak_bytes = 0
        self.all_gathers = 0
        self.units: list[str] = []  # gathered once by the gather budget
        self.units_bytes = 0
        self.completions: list[str] = []  # a digest of each batch of sequences generated (prompts included)
        self._collective_depth = 0  # a backend method calling another is one launch

    def sample(self, *_: Any) -> None:
        self.peak = max(self.peak, sum(p.ds_numel for p in self.params if p.ds_status == self.available))
        # Memory: a parameter being gathered (prefetched) already holds its full buffer.
        held = sum(p.ds_numel * p.element_size() for p in self.params if p.ds_status != self.partitioned)
        self.peak_bytes = max(self.peak_bytes, held)

    @contextlib.contextmanager
    def sampling(self, module: Any, gathered: list[ModuleUnit]) -> Iterator[None]:
        """Sample the gathered parameters at every forward of `module`'s submodules; note the units the gather
        budget gathered once, and a digest of every batch of sequences generated."""
        self.units = [unit.unit.name for unit in gathered]
        self.units_bytes = sum(p.ds_numel * p.element_size() for unit in gathered for p in unit.params)
        self.sample()
        handles = []
        for submodule in module.modules():
            handles.append(submodule.register_forward_pre_hook(self.sample))
            handles.append(submodule.register_forward_hook(self.sample))
        model = generating_model(module)
        generate = model.generate

        def recorded(*args: Any, **kwargs: Any) -> Any:
            out = generate(*args, **kwargs)
            sequences = getattr(out, "sequences", out)
            self.completions.append(hashlib.sha256(sequences.cpu().numpy().tobytes()).hexdigest()[:16])
            return out

        model.generate = recorded  # an instance attribute, shadowing the class's method until deleted
        try:
            yield
        finally:
            del model.generate
            for handle in handles:
                handle.remove()

    @contextlib.contextmanager
    def counting_all_gathers(self) -> Iterator[None]:
        backend = compat.deepspeed_comm_backend()
        names = [name for name in self.ALL_GATHER_METHODS if backend is not None and hasattr(backend, name)]
        for name in names:
            setattr(backend, name, self._counted(getattr(backend, name)))
        try:
            yield
        finally:
            for name in names:
                delattr(backend, name)  # the instance attribute shadowed the class's method

    def _counted(self, method: Any) -> Any:
        def launch(*args: Any, **kwargs: Any) -> Any:
            if self._collective_depth == 0:
                self.all_gathers += 1
            self._collective_depth += 1
            try:
                return method(*args, **kwargs)
            finally:
                self._collective_depth -= 1
        return launch

    @contextlib.contextmanager
    def watching_memory(self) -> Iterator[dict[str, int]]:
        """Yield a dict filled when the block ends: resident memory at entry, at its peak, and the rise.

        The rise alone understates later calls: the allocator keeps what an earlier call freed, so it is
        already counted at entry; the absolute peak compares across runs of the same model.
        """
        import threading

        import psutil

        process = psutil.Process()
        start = process.memory_info().rss
        peak = [start]
        done = threading.Event()

        def watch() -> None:
            while not done.wait(self.RSS_INTERVAL_S):
                peak[0] = max(peak[0], process.memory_info().rss)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        result: dict[str, int] = {}
        try:
            yield result
        finally:
            done.set()
            watcher.join()
            top = max(peak[0], process.memory_info().rss)
            result.update(rss_start_bytes=start, rss_peak_bytes=top, rss_peak_delta_bytes=top - start)


@contextlib.contextmanager
def _probe(model: Any, gather: bool) -> Iterator[Any]:
    """Measure one generation call when RLHF_PROBE_GENERATION is set; else a probe that measures nothing."""
    if not os.environ.get(PROBE_GENERATION_ENV):
        yield _NoProbe()
        return
    probe = GenerationProbe(model)
    started = time.perf_counter()
    with probe.watching_memory() as memory, probe.counting_all_gathers():
        yield probe
    if probe.total:
        GenerationProbe.calls.append({
            "gather": gather, "full_numel": probe.total, "peak_numel": probe.peak,
            "peak_fraction": probe.peak / probe.total, "peak_bytes": probe.peak_bytes, "full_bytes": probe.total_bytes,
            "all_gathers": probe.all_gathers, "seconds": time.perf_counter() - started,
            "budget_units": probe.units, "budget_bytes": probe.units_bytes, "completions": probe.completions,
            **memory})


class _NoProbe:
    @contextlib.contextmanager
    def sampling(self, module: Any, gathered: list[ModuleUnit]) -> Iterator[None]:
        yield


class PhaseMemory:
    """Peak CUDA memory of each phase of a rank's run, when RLHF_PROBE_CUDA_MEMORY is set.

    Phases: `load` until the first generation, `generation` inside TRL's generation context (gathering
    included), `train` between generations (scoring, reference and policy passes, backward, optimizer step).
    Peaks are torch's allocator peaks, reset at each phase change; `outside_allocator_bytes` is what the
    device has in use beyond what the allocator reserved (CUDA context, NCCL and library workspaces). Each
    generation call's start and seconds are kept too, so that a benchmark reads seconds per step from the
    spacing of the calls. Without CUDA only the calls' times are kept.
    """

    active: PhaseMemory | None = None

    def __init__(self, cuda: Any | None, clock: Any = time.perf_counter) -> None:
        self.cuda = cuda  # `torch.cuda`, or None
        self.clock = clock
        self.started = clock()
        self.phase = "load"
        self.peaks: dict[str, dict[str, int]] = {}
        self.generation_calls: list[dict[str, float]] = []

    @classmethod
    def current(cls) -> PhaseMemory | None:
        """This rank's recorder when the probe is asked for (made at the first generation), else None."""
        if cls.active is None and os.environ.get(PROBE_CUDA_MEMORY_ENV):
            import torch

            cls.active = cls(torch.cuda if torch.cuda.is_available() else None)
        return cls.active

    def _switch(self, phase: str) -> dict[str, int]:
        """End the current phase (folding its peaks into its record) and start `phase` with fresh peaks."""
        ended: dict[str, int] = {}
        if self.cuda is not None:
            self.cuda.synchronize()
            free, total = self.cuda.mem_get_info()
            ended = {"max_allocated_bytes": self.cuda.max_memory_allocated(),
                     "max_reserved_bytes": self.cuda.max_memory_reserved(),
                     "outside_allocator_bytes": total - free - self.cuda.memory_reserved()}
            record = self.peaks.setdefault(self.phase, dict.fromkeys(ended, 0))
            for key, value in ended.items():
                record[key] = max(record[key], value)
            self.cuda.reset_peak_memory_stats()
        self.phase = phase
        return ended

    @contextlib.contextmanager
    def generating(self) -> Iterator[None]:
        self._switch("generation")
        started = self.clock()
        try:
            yield
        finally:
            peaks = self._switch("train")
            self.generation_calls.append({"started_s": started - self.started, "seconds": self.clock() - started,
                                          **peaks})

    def record(self) -> dict[str, Any]:
        """What the rank writes into `ranks/rank-N.json`; ends the open phase."""
        self._switch(self.phase)
        return {"cuda": self.cuda is not None, "phases": self.peaks, "generation_calls": self.generation_calls}
