"""The policy's weights into vLLM after an update, never gathering more of it at once than the gather choice allows.

Under ZeRO-3 each rank holds a shard of every parameter; vLLM needs whole tensors. The gather choice decides how
much is gathered at once: `--gather` the whole policy (one bucket), `--gather-budget` buckets of whole units
(rlhf_cli/gather_budget.py: a decoder layer, the embedding, the LM head) of at most the budget, `--no-gather`
one unit at a time. Each bucket is gathered, handed to the target (a colocated engine, or the server's weight
directory), and released before the next. The sync's seconds and the most parameter bytes held gathered at
once are measured on the parameters themselves (their ZeRO-3 status), not computed from the plan.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any, Protocol

import torch
from torch import nn

from rlhf_cli import compat
from rlhf_cli.gather_budget import Budget, choose
from rlhf_cli.rank.zero3 import ModuleUnit, policy_units

Named = list[tuple[str, torch.Tensor]]


class Target(Protocol):
    def load(self, weights: Named) -> None: ...
    def finish(self) -> None: ...


class ColocatedTarget:
    """A vLLM engine in this process: each bucket reloaded in place (TRL's per-parameter `load_weights` fails on
    CPU, where vLLM repacks its linear weights), the prefix cache dropped at the end."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm

    def load(self, weights: Named) -> None:
        compat.vllm_model_runner(self.llm).reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)

    def finish(self) -> None:
        self.llm.reset_prefix_cache()


def buckets(policy: nn.Module, gather: bool, budget: Budget | None) -> list[list[ModuleUnit]]:
    """The units of `policy` in the groups gathered together: all of them (`gather`), as many whole units as fit
    the budget (at least one), or one at a time."""
    units = policy_units(policy)
    if gather or (budget is not None and budget.whole):
        return [units]
    if budget is None or budget.nothing:
        return [[unit] for unit in units]
    params = list(policy.parameters())
    cap = budget.numel(sum(unit.unit.numel for unit in units), params[0].element_size())
    groups: list[list[ModuleUnit]] = [[]]
    for unit in units:
        if groups[-1] and sum(member.unit.numel for member in groups[-1]) + unit.unit.numel > cap:
            groups.append([])
        groups[-1].append(unit)
    return groups


def vllm_name(name: str) -> str:
    """A policy parameter's name as the checkpoint (and vLLM) spells it."""
    return name.removeprefix("module.")


@contextlib.contextmanager
def _gathered(params: list[nn.Parameter]) -> Iterator[None]:
    if not any(hasattr(param, "ds_status") for param in params):
        yield
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(params):
        yield


def _held_bytes(params: list[nn.Parameter]) -> int:
    """Bytes of `policy`'s parameters that are whole right now (all of them without ZeRO-3)."""
    if not params or not hasattr(params[0], "ds_status"):
        return sum(param.numel() * param.element_size() for param in params)
    _, partitioned = compat.zero3_param_states()
    return sum(param.ds_numel * param.element_size() for param in params if param.ds_status != partitioned)


def sync_weights(engine: Any, policy: nn.Module, target: Target, gather: bool, budget: Budget | None) -> dict[str, Any]:
    """Gather the policy bucket by bucket and load each into `target`; returns seconds, peak bytes, buckets."""
    del engine  # the policy's parameters are the engine's own: gathering them is the engine's collective
    started = time.perf_counter()
    names = {id(param): vllm_name(name) for name, param in policy.named_parameters()}
    every = list(policy.parameters())
    peak = 0
    groups = buckets(policy, gather, budget)
    with torch.no_grad():
        for group in groups:
            params = list({id(p): p for unit in group for p in unit.params}.values())
            with _gathered(params):
                peak = max(peak, _held_bytes(every))
                target.load([(names[id(param)], param.data) for param in params])
    target.finish()
    return {"seconds": time.perf_counter() - started, "peak_bytes": peak, "buckets": len(groups),
            "full_bytes": sum(getattr(p, "ds_numel", p.numel()) * p.element_size() for p in every)}
