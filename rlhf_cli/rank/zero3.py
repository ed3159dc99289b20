"""ZeRO-3 generation from shards (`--no-gather`): the fix stock TRL lacks, the recipe's ZeRO-3 knobs,
and an optional probe of how much of the model generation materialises.

Why the fix: generation runs many forward passes through DeepSpeed's ZeRO-3 hooks, and the
parameter coordinator keeps the fetch trace it recorded there. The next training forward and
backward then prefetch and release parameters by that stale trace and crash at the first
backward ("The size of tensor a (0) must match the size of tensor b (64)") on any model larger
than one prefetch bucket. TRL's gather path already invalidates the trace when it re-adds the
hooks (`trl.models.utils.add_hooks`, TRL PR #4693); its no-gather path does nothing. We wrap
`trl.models.utils._unwrap_model_for_generation`, the one context manager through which every
TRL trainer (and our PPO) generates, and invalidate the trace after each no-gather generation.
Drop this module's fix once TRL invalidates the trace on its no-gather path too.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

TESTED_WITH = "trl 1.16 and deepspeed 0.19"
# Set to run TRL's generation as shipped (no fix); the regression tests use it to show that the
# upstream bug is still there, so that we learn when this module can go.
STOCK_TRL_ENV = "RLHF_STOCK_TRL_GENERATION"
PROBE_ENV = "RLHF_PROBE_GENERATION"


class Zero3InternalsChanged(RuntimeError):
    """TRL or DeepSpeed no longer has what the no-gather fix relies on."""


def _versions() -> str:
    import deepspeed
    import trl

    return f"trl {trl.__version__}, deepspeed {deepspeed.__version__}"


def param_coordinator(engine: Any) -> Any | None:
    """The ZeRO-3 parameter coordinator of a DeepSpeed engine, or None (not ZeRO-3, not prepared yet)."""
    optimizer = getattr(engine, "optimizer", None)
    if optimizer is None:
        return None
    offload = getattr(optimizer, "parameter_offload", optimizer)  # engines without optimizer hold it directly
    getter = getattr(offload, "get_param_coordinator", None)
    return getter() if getter is not None else None


def invalidate_trace(engine: Any) -> None:
    """Make the next forward re-record its fetch trace."""
    coordinator = param_coordinator(engine)
    if coordinator is None:
        return
    if not (hasattr(coordinator, "is_invalid_trace") and hasattr(coordinator, "_invalidate_trace")):
        raise Zero3InternalsChanged(
            f"DeepSpeed's ZeRO-3 parameter coordinator changed ({_versions()}); rlhf's --no-gather fix was "
            f"written for {TESTED_WITH}. Use --gather, or install the tested versions.")
    if not coordinator.is_invalid_trace():  # invalidating twice raises
        coordinator._invalidate_trace()


def install_no_gather_fix(required: bool) -> None:
    """Wrap TRL's generation context so that no-gather generation leaves no stale trace behind.

    `required`: the run generates without gathering, so a TRL without the wrapped function is an error.
    """
    import trl.models.utils as trl_model_utils

    original = getattr(trl_model_utils, "_unwrap_model_for_generation", None)
    if original is None:
        if not required:
            return
        raise Zero3InternalsChanged(
            f"trl.models.utils._unwrap_model_for_generation is gone ({_versions()}); rlhf's --no-gather fix was "
            f"written for {TESTED_WITH}. Use --gather, or install the tested versions.")
    if getattr(original, "rlhf_no_gather_fix", False):
        return

    @contextlib.contextmanager
    def unwrap_without_stale_trace(model: Any, accelerator: Any, gather_deepspeed3_params: bool = True,
                                   *args: Any, **kwargs: Any) -> Iterator[Any]:
        with original(model, accelerator, gather_deepspeed3_params, *args, **kwargs) as unwrapped:
            with _probe(unwrapped, gather_deepspeed3_params):
                yield unwrapped
        if not gather_deepspeed3_params and not os.environ.get(STOCK_TRL_ENV):
            invalidate_trace(model)

    unwrap_without_stale_trace.rlhf_no_gather_fix = True
    trl_model_utils._unwrap_model_for_generation = unwrap_without_stale_trace


def apply_zero3_settings(config: Any, knobs: dict[str, int]) -> None:
    """Put the recipe's stage3_* values into the DeepSpeed config the trainer will build its engine from."""
    plugin = getattr(config, "deepspeed_plugin", None)
    given = {name: value for name, value in knobs.items() if value is not None}  # null: DeepSpeed's default
    if given and plugin is not None:
        plugin.deepspeed_config.setdefault("zero_optimization", {}).update(given)


# -- probe ------------------------------------------------------------------------------------------

class GenerationProbe:
    """Peak share of the model's parameters gathered on this rank while generating.

    Samples, at every submodule's forward, how many ZeRO-3 parameters are fully present
    (`ds_status == AVAILABLE`). With --gather the whole model is present (1.0); without it,
    only the layers being run and those prefetched.
    """

    calls: list[dict[str, Any]] = []

    def __init__(self, module: Any) -> None:
        from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

        self.available = ZeroParamStatus.AVAILABLE
        self.module = module
        self.params = [p for p in module.parameters() if hasattr(p, "ds_status")]
        self.total = sum(p.ds_numel for p in self.params)
        self.peak = 0
        self.handles: list[Any] = []

    def sample(self, *_: Any) -> None:
        self.peak = max(self.peak, sum(p.ds_numel for p in self.params if p.ds_status == self.available))

    def __enter__(self) -> GenerationProbe:
        self.sample()
        for submodule in self.module.modules():
            self.handles.append(submodule.register_forward_pre_hook(self.sample))
            self.handles.append(submodule.register_forward_hook(self.sample))
        return self

    def __exit__(self, *_: Any) -> None:
        for handle in self.handles:
            handle.remove()


@contextlib.contextmanager
def _probe(module: Any, gather: bool) -> Iterator[None]:
    if not os.environ.get(PROBE_ENV):
        yield
        return
    with GenerationProbe(module) as probe:
        yield
    if probe.total:
        GenerationProbe.calls.append({"gather": gather, "full_numel": probe.total, "peak_numel": probe.peak,
                                      "peak_fraction": probe.peak / probe.total})
