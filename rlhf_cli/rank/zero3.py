"""ZeRO-3 generation from shards (`--no-gather`): the fix stock TRL lacks, the recipe's ZeRO-3 knobs,
around which rlhf_cli/rank/probes.py measures what generation costs each rank.

Why the fix: generation runs many forward passes through DeepSpeed's ZeRO-3 hooks, and the
parameter coordinator keeps the fetch trace it recorded there. The next training forward and
backward then prefetch and release parameters by that stale trace and crash at the first
backward ("The size of tensor a (0) must match the size of tensor b (64)") on any model larger
than one prefetch bucket. TRL's gather path already invalidates the trace when it re-adds the
hooks (`trl.models.utils.add_hooks`, TRL PR #4693); its no-gather path does nothing. We wrap
TRL's private generation context (through `rlhf_cli.compat`), the one context manager through which
every TRL trainer (and our PPO) generates, and invalidate the trace after each no-gather generation.
Drop this module's fix once TRL invalidates the trace on its no-gather path too.

The same wrapper spends the gather budget (`gather_budget`, rlhf_cli/generation/budget.py): on TRL's no-gather path it
gathers the chosen units of the policy once per generation call and takes ZeRO-3's hooks off them, so that only
the rest is fetched per token; at the end it leaves ZeRO-3 as a full gather does (units partitioned, hooks back,
fetch trace invalidated).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from rlhf_cli import compat
from rlhf_cli.generation.budget import Budget, Unit, choose
from rlhf_cli.output.run_dir import STOCK_TRL_ENV
from rlhf_cli.phases import StepPhase
from rlhf_cli.rank.phases import StepPhases
from rlhf_cli.rank.probes import PhaseMemory, probe_generation


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
        with (StepPhases.current().during(StepPhase.GENERATION),
              phases.generating() if phases else contextlib.nullcontext(),
              probe_generation(model, gather_deepspeed3_params) as probe,  # around the gathering too
              original(model, accelerator, gather_deepspeed3_params, *args, **kwargs) as unwrapped,
              gathered_units(model, units := budget_units(model, generating_model(unwrapped), spend)),
              probe.sampling(unwrapped, generating_model(unwrapped), units)):
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
    """One unit of the policy (rlhf_cli/generation/budget.py) as modules: gathered whole or not at all."""

    unit: Unit
    roots: tuple[Any, ...]  # each with all its submodules
    params: tuple[Any, ...]

    @property
    def modules(self) -> list[Any]:
        return [module for root in self.roots for module in root.modules()]


def policy_units(model: Any) -> list[ModuleUnit]:
    """The units of a generating model: each decoder layer (an element of its largest ModuleList) with all its
    submodules, each adapted module outside them (PEFT's LoRA layer on the LM head or the embedding, with its base
    layer and adapters: merged as one) and each other module without submodules that holds parameters (embedding,
    LM head, final norm). Units that share a parameter (an LM head tied to the embedding) are one: gathered apart,
    the hooks of the one left would release the other's weight."""
    import torch

    lists = [module for module in model.modules() if isinstance(module, torch.nn.ModuleList)]
    layers = list(max(lists, key=lambda layer_list: sum(_numel(p) for p in layer_list.parameters()), default=[]))
    inside = {id(module) for layer in layers for module in layer.modules()}
    others = []
    for module in model.modules():  # parents before their children
        if id(module) in inside:
            continue
        if _adapted(module):
            others.append(module)
            inside.update(id(sub) for sub in module.modules())
        elif next(module.children(), None) is None and next(module.parameters(recurse=False), None) is not None:
            others.append(module)
    roots = [*layers, *others]
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


def _adapted(module: Any) -> bool:
    """A PEFT tuner layer: its base layer and adapters, merged into one weight."""
    return hasattr(module, "base_layer") and hasattr(module, "merge") and hasattr(module, "unmerge")


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
