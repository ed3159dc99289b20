"""One weight sync: dense, a shard-local delta (rlhf_cli/rank/engines/weights.py, delta.py) or, into a generator
that serves LoRA itself, the adapters alone (rlhf_cli/rank/engines/adapters.py), into any WeightTarget, measured
(seconds, bytes sent, changed share, the sync's own peak memory) into the rank's sync log
(rlhf_cli/rank/engines/sync_log.py)."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import rlhf_cli.rank.engines.adapters as adapters
import rlhf_cli.rank.engines.delta as delta_sync
from rlhf_cli.generation.sync_buckets import buckets
from rlhf_cli.phases import StepPhase
from rlhf_cli.rank.engines.sync_log import SYNC_LOG
from rlhf_cli.rank.engines.weights import (
    GatheredBytes,
    SyncLimit,
    WeightTarget,
    bucket_weights,
    full_numel,
    unique_params,
)
from rlhf_cli.rank.phases import PeakMeter, StepPhases
from rlhf_cli.rank.zero3 import policy_units


def sync_weights(model: Any, target: WeightTarget, limit: SyncLimit, woke: bool = False,
                 delta: bool = True) -> dict[str, Any]:
    """Bring `target`'s weights to `model`'s (ZeRO-3 partitioned or not, with or without LoRA): the adapters alone
    when the target serves them, a shard-local delta when the target takes patches and holds what this rank last
    sent it, else every weight, a bucket of units at a time. Every rank takes part (the sync is a collective).
    `woke`: the generator just woke from a sleep that dropped its weights; `delta` False (the recipe's
    `weight_sync_delta: false`): every weight at every sync. Returns the sync's record, also added to the rank's
    sync log."""
    with StepPhases.current().during(StepPhase.SYNC):  # this step's `sync` phase (rlhf_cli/rank/phases.py)
        started = time.perf_counter()
        with PeakMeter.current().added(StepPhase.SYNC) as memory:  # the sync's own peak, and what it added
            tracker = delta_sync.Tracker.of(model, target, delta)
            reason = _adapters_reason(model, target, delta)
            if reason is None:
                record = _send_adapters(model, target, limit, tracker, woke)
            else:
                record = _send_merged(model, target, limit, tracker, woke)
                record.update({"adapters_merged_reason": reason} if tracker.lora else {})
            target.reset()
        record["seconds"] = time.perf_counter() - started
        record.update(memory)
        record.update(target.after_sync(model, woke))
        SYNC_LOG.add(record)
        return record


def _send_merged(model: Any, target: WeightTarget, limit: SyncLimit, tracker: delta_sync.Tracker,
                 woke: bool) -> dict[str, Any]:
    """The policy as the generator holds it (LoRA merged): a delta when it can be, else every weight."""
    if tracker.dense_reason(woke, target) is None:
        with contextlib.suppress(delta_sync.PatchesRefused):  # every rank's generator refuses the same patch
            return tracker.send_patches(model, target, limit)
    record = _send_dense(model, target, limit)
    record.update(tracker.after_dense(model, target, limit, woke))
    return record


def _send_dense(model: Any, target: WeightTarget, limit: SyncLimit, merge: bool = True) -> dict[str, Any]:
    units = policy_units(model)
    packed = buckets([unit.unit.numel for unit in units], limit.numel)
    measure = GatheredBytes(model)
    target.load(bucket_weights(model, units, packed, measure, merge))
    return {"peak_bytes": measure.peak, "buckets": len(packed), "limit_numel": limit.numel,
            "full_bytes": measure.full, "merged_lora_layers": measure.merged}


def _adapters_reason(model: Any, target: WeightTarget, delta: bool) -> str | None:
    """Why this sync does not send the adapters alone (rlhf_cli/rank/engines/adapters.py), or None: they are sent
    alone when the policy has adapters and the target serves them as they are."""
    served = getattr(target, "adapters", None)
    if not hasattr(model, "peft_config"):
        return "no adapters"
    if served is None:
        return getattr(target, "lora_reason", None) or "the generator does not serve LoRA: it holds the policy merged"
    if not delta:
        return delta_sync.OFF_REASON
    return adapters.adapter_problem(model, served.max_rank)


def _send_adapters(model: Any, target: WeightTarget, limit: SyncLimit, tracker: delta_sync.Tracker,
                   woke: bool) -> dict[str, Any]:
    """The unmerged base when the generator does not hold it (the first sync, a wake that dropped it), then the
    adapters, checked against what the generator holds."""
    record: dict[str, Any] = {"mode": "adapter", "dense_reason": None, "bytes_sent": 0, "changed_share": None,
                              "peak_bytes": 0, "merged_lora_layers": 0}
    if tracker.base_reason(woke) is not None:
        record.update(_send_dense(model, target, limit, merge=False))
        record.update(tracker.after_dense(model, target, limit, woke, merged=False))
    else:
        tracker.syncs += 1
    packed = adapters.pack_adapters(model, limit, target.dtype)
    target.adapters.load(packed)
    verified = adapters.check_adapters(packed, target.adapters.checksums(), tracker.syncs, target.instead)
    return {**record, "scope": adapters.ADAPTER_SCOPE, "bytes_sent": record["bytes_sent"] + packed.bytes,
            "adapter_bytes": packed.bytes, "dense_bytes": delta_sync.dense_bytes(model, target.dtype),
            "adapter_groups_verified": verified, "peak_bytes": max(record["peak_bytes"], packed.peak_bytes),
            "limit_numel": limit.numel, "full_bytes": sum(full_numel(p) * p.element_size()
                                                          for p in unique_params(model))}


