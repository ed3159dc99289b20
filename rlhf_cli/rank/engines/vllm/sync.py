"""Refresh a colocated vLLM's copy of the policy from ZeRO-3 shards, never gathering more than the gather choice
allows at once.

TRL's sync gathers one parameter at a time (a collective per tensor) and, with LoRA, the whole model at once to
merge the adapters (trl#5766, trl#3133: out of memory in the sync). Here the gather choice governs it, as it
governs HF generation: `--gather` the whole policy in one bucket, `--gather-budget` buckets of at most that many
bytes, `--no-gather` one unit (a decoder layer, the embedding, the head) at a time. Units are those of the gather
budget (rlhf_cli/rank/zero3.policy_units), so a decoder layer's adapters are always gathered with the weights
they merge into: with LoRA each layer is merged, sent and unmerged in its bucket. Gathered without a modifier
rank, the merged weights are discarded when the bucket is released: the shards never see the merge.

vLLM takes the weights through one layerwise reload (rlhf_cli/compat/vllm.vllm_reload_weights): each of its layers is
processed as soon as its tensors have arrived, so a bucket's tensors are copied before the bucket is released.

`sync_weights(model, llm, limit)` is the whole sync; `SyncLog` keeps what each sync cost (peak bytes gathered,
seconds) and the self-check's difference (rlhf_cli/rank/engines/vllm/self_check.py) for the progress line and the rank's
record.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from rlhf_cli import compat
from rlhf_cli.compat import vllm as vllm_compat
from rlhf_cli.generation.choice import Gather
from rlhf_cli.generation.sync_buckets import bucket_limit, buckets
from rlhf_cli.rank.phases import SYNC, StepPhases
from rlhf_cli.rank.zero3 import ModuleUnit, policy_units

PEFT_PREFIXES = ("base_model.model.",)
DROPPED_IN_NAMES = ("_checkpoint_wrapped_module.", "modules_to_save.default.")


@dataclass(frozen=True)
class SyncLimit:
    """How much of the policy one bucket gathers: None the whole policy, 0 one unit, else at most `numel`
    elements (a unit larger than that is a bucket of its own: a unit is never split)."""

    numel: int | None

    @classmethod
    def of(cls, gather: Gather, model: Any) -> SyncLimit:
        """The gather choice as a bucket limit for `model` (rlhf_cli/generation/sync_buckets.py, as the plan)."""
        params = list({id(p): p for p in model.parameters()}.values())
        element_bytes = params[0].element_size() if params else 1
        return cls(bucket_limit(gather, sum(_full_numel(p) for p in params), element_bytes))


class SyncLog:
    """What each sync on this rank cost: peak bytes of the policy gathered at once (as ZeRO-3 reports its
    parameters' status, not as the buckets were meant), buckets, seconds."""

    calls: list[dict[str, Any]] = []
    _unread = 0  # calls the progress line has not shown yet

    @classmethod
    def add(cls, record: dict[str, Any]) -> None:
        cls.calls.append(record)

    @classmethod
    def take(cls) -> list[dict[str, Any]]:
        """The syncs since the last call."""
        new, cls._unread = cls.calls[cls._unread:], len(cls.calls)
        return new


def vllm_name(name: str) -> str | None:
    """The checkpoint name vLLM loads a policy parameter under, or None for a tensor vLLM does not hold (LoRA's
    own matrices, PEFT's copy of an original module)."""
    for prefix in PEFT_PREFIXES:
        name = name.removeprefix(prefix)
    if ".lora_" in name or "original_module" in name:
        return None
    name = name.replace(".base_layer", "")
    for dropped in DROPPED_IN_NAMES:
        name = name.replace(dropped, "")
    return name


def checkpoint_names(model: Any) -> Callable[[str], str | None]:
    """`vllm_name` for `model`'s parameters, with the renamings transformers applies at load undone: vLLM loads the
    names the checkpoint has (rlhf_cli/compat/vllm.checkpoint_renamings)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    renamings = vllm_compat.checkpoint_renamings(base) if hasattr(base, "config") else []

    def name(param_name: str) -> str | None:
        found = vllm_name(param_name)
        for pattern, replacement in renamings if found is not None else ():
            found = re.sub(pattern, replacement, found)
        return found

    return name


def sync_weights(model: Any, llm: Any, limit: SyncLimit, reload: Callable[[Any, Any], None] | None = None,
                 reset: Callable[[Any], None] | None = None, check: Any | None = None,
                 woke: bool = False) -> dict[str, Any]:
    """Send every weight of `model` (ZeRO-3 partitioned or not, with or without LoRA) into the colocated `llm`,
    a bucket of units at a time; every rank takes part (gathering is a collective). Returns the sync's record.
    `reload(llm, weights)` and `reset(llm)` hand the weights over elsewhere (a vLLM server: server.py beside this).
    `check` (a self_check.SyncCheck) compares vLLM's logprobs with the policy's after the syncs it is
    due for (`woke`: vLLM just woke up), and stops the run when they differ."""
    with StepPhases.current().during(SYNC):  # this step's `sync` phase (rlhf_cli/rank/phases.py)
        started = time.perf_counter()
        units = policy_units(model)
        packed = buckets([unit.unit.numel for unit in units], limit.numel)
        measure = GatheredBytes(model)
        (reload or vllm_compat.vllm_reload_weights)(llm, _bucket_weights(model, units, packed, measure))
        (reset or vllm_compat.vllm_reset_prefix_cache)(llm)
        record = {"seconds": time.perf_counter() - started, "peak_bytes": measure.peak, "buckets": len(packed),
                  "limit_numel": limit.numel, "full_bytes": measure.full, "merged_lora_layers": measure.merged}
        if check is not None and check.due(woke):
            difference = check.run(model, llm, woke)
            record.update(check_logp_difference=difference["mean"], check_logp_difference_max=difference["max"])
        SyncLog.add(record)
        return record


def _bucket_weights(model: Any, units: list[ModuleUnit], packed: list[list[int]],
                    measure: GatheredBytes) -> Iterator[tuple[str, Any]]:
    """(vLLM name, full tensor) of every weight, a bucket gathered (and its LoRA layers merged) at a time; a
    parameter outside every unit (on a module with children, outside the decoder layers) is gathered alone."""
    named = checkpoint_names(model)
    names = {id(param): named(name) for name, param in model.named_parameters()}  # a tied weight: its first name
    in_units = {id(param) for unit in units for param in unit.params}
    contents = [([param for index in bucket for param in units[index].params],
                 [module for index in bucket for module in units[index].modules]) for bucket in packed]
    contents += [([param], []) for param in {id(p): p for p in model.parameters()}.values()
                 if id(param) not in in_units]
    sent: set[int] = set()
    for params, modules in contents:
        with gathered(params), _merged(modules) as merged:
            measure.sample()
            measure.merged += merged
            for param in params:
                name = names[id(param)]
                if name is not None and id(param) not in sent:
                    sent.add(id(param))
                    yield name, param.data


@contextlib.contextmanager
def gathered(params: list[Any]) -> Iterator[None]:
    """The full tensors of `params` for the block (read only: no rank's changes are written back)."""
    if not any(hasattr(param, "ds_id") for param in params):
        yield
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
        yield


@contextlib.contextmanager
def _merged(modules: list[Any]) -> Iterator[int]:
    """LoRA layers among `modules` merged into their base weights for the block (how many), unmerged after."""
    layers = [module for module in modules if hasattr(module, "merge") and hasattr(module, "unmerge")
              and getattr(module, "lora_A", None) is not None and not getattr(module, "merged", False)]
    for layer in layers:
        layer.merge()
    try:
        yield len(layers)
    finally:
        for layer in layers:
            layer.unmerge()


class GatheredBytes:
    """The bytes of the policy's parameters that are whole on this rank right now, at their most: what ZeRO-3
    itself says (`ds_status`) of every parameter, so that anything gathered beyond the bucket counts too. And
    the LoRA layers merged to be sent (`merged`)."""

    def __init__(self, model: Any) -> None:
        self.params = list({id(p): p for p in model.parameters()}.values())
        self.zero3 = any(hasattr(param, "ds_status") for param in self.params)
        self.full = sum(_full_numel(p) * p.element_size() for p in self.params)
        self.peak = 0
        self.merged = 0
        if self.zero3:
            _, self.partitioned = compat.zero3_param_states()

    def sample(self) -> None:
        if not self.zero3:
            self.peak = self.full  # nothing is partitioned: the whole policy is always there
            return
        held = sum(p.ds_numel * p.element_size() for p in self.params if p.ds_status != self.partitioned)
        self.peak = max(self.peak, held)


def _full_numel(param: Any) -> int:
    return getattr(param, "ds_numel", None) or param.numel()


def install_vllm(gather: Gather, dtype: str, seed: int, check: Any) -> None:
    """Make TRL's colocated vLLM (RLOO, GRPO, online DPO; PPO's rollouts) hold the policy in `dtype`, the one the
    trainer holds it in (vLLM would downcast a float32 model to bfloat16), sample from the recipe's `seed` (plus
    TRL's per-rank offset), and sync through `sync_weights`, bucketed by the run's gather choice and checked by
    `check` (a rank/engines/vllm/self_check.SyncCheck). Server mode keeps TRL's own sync (NCCL to the server)."""

    def engine(*args: Any, **kwargs: Any) -> Any:  # trl's `LLM(...)`
        kwargs.setdefault("dtype", dtype)
        kwargs["seed"] = seed + kwargs.get("seed", 0)  # TRL's: the rank's tensor-parallel group, from 0
        return engine.__wrapped__(*args, **kwargs)

    def sync_generation(generation: Any) -> None:  # trl VLLMGeneration.sync_weights
        if generation.mode != "colocate":
            return sync_generation.__wrapped__(generation)
        if generation.enable_sleep_mode:  # as TRL: the weights must be mapped before they are written
            from trl.generation.vllm_generation import empty_cache

            empty_cache()  # TRL's: what the trainer freed goes back to the device before vLLM maps its weights
            generation.llm.wake_up(tags=["weights"])
            generation._llm_weights_sleeping = False
        sync_weights(generation.model, generation.llm, SyncLimit.of(gather, generation.model), check=check,
                     woke=generation.enable_sleep_mode)

    def sync_online_dpo(trainer: Any) -> None:  # trl OnlineDPOTrainer._move_model_to_vllm
        if trainer.vllm_mode != "colocate":
            return sync_online_dpo.__wrapped__(trainer)
        sync_weights(trainer.model, trainer.llm, SyncLimit.of(gather, trainer.model), check=check,
                     woke=bool(trainer.args.vllm_enable_sleep_mode))

    vllm_compat.replace_trl_vllm_engine(engine)
    vllm_compat.replace_trl_vllm_sync(sync_generation, sync_online_dpo)
