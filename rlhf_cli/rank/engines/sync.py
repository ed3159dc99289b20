"""One weight sync: dense or a shard-local delta (rlhf_cli/rank/engines/weights.py, delta.py), into any
WeightTarget, measured (seconds, bytes sent, changed share, the sync's own peak memory) into the rank's sync log
(rlhf_cli/rank/engines/sync_log.py)."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import rlhf_cli.rank.engines.delta as delta_sync
from rlhf_cli.generation.sync_buckets import buckets
from rlhf_cli.phases import StepPhase
from rlhf_cli.rank.engines.sync_log import SYNC_LOG
from rlhf_cli.rank.engines.weights import GatheredBytes, SyncLimit, WeightTarget, bucket_weights
from rlhf_cli.rank.phases import PeakMeter, StepPhases
from rlhf_cli.rank.zero3 import policy_units


def sync_weights(model: Any, target: WeightTarget, limit: SyncLimit, woke: bool = False,
                 delta: bool = True) -> dict[str, Any]:
    """Bring `target`'s weights to `model`'s (ZeRO-3 partitioned or not, with or without LoRA): a shard-local
    delta when the target takes patches and holds what this rank last sent it, else every weight, a bucket of
    units at a time. Every rank takes part (the sync is a collective). `woke`: the generator just woke from a
    sleep that dropped its weights; `delta` False (the recipe's `weight_sync_delta: false`): every weight at every
    sync. Returns the sync's record, also added to the rank's sync log."""
    with StepPhases.current().during(StepPhase.SYNC):  # this step's `sync` phase (rlhf_cli/rank/phases.py)
        started = time.perf_counter()
        with PeakMeter.current().added(StepPhase.SYNC) as memory:  # the sync's own peak, and what it added
            tracker = delta_sync.Tracker.of(model, target, delta)
            record = None
            if tracker.dense_reason(woke, target) is None:
                with contextlib.suppress(delta_sync.PatchesRefused):  # every rank's generator refuses the same patch
                    record = tracker.send_patches(model, target, limit)
            if record is None:
                record = _send_dense(model, target, limit)
                record.update(tracker.after_dense(model, target, limit, woke))
            target.reset()
        record["seconds"] = time.perf_counter() - started
        record.update(memory)
        record.update(target.after_sync(model, woke))
        SYNC_LOG.add(record)
        return record


def _send_dense(model: Any, target: WeightTarget, limit: SyncLimit) -> dict[str, Any]:
    units = policy_units(model)
    packed = buckets([unit.unit.numel for unit in units], limit.numel)
    measure = GatheredBytes(model)
    target.load(bucket_weights(model, units, packed, measure))
    return {"peak_bytes": measure.peak, "buckets": len(packed), "limit_numel": limit.numel,
            "full_bytes": measure.full, "merged_lora_layers": measure.merged}


