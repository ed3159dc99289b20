"""Per-rank facts written next to the model, so a run (and a test) can see what each rank did."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

from rlhf_cli.generation.choice import GATHER_KEY
from rlhf_cli.output.run_dir import RunDir, checkpoint_step
from rlhf_cli.rank.engines import GENERATION_SECONDS_KEY, SYNC_RECORD_KEY
from rlhf_cli.rank.engines.sync_log import SYNC_LOG
from rlhf_cli.rank.phases import merged
from rlhf_cli.rank.probes import GenerationProbe, PhaseMemory


def write_rank_record(trainer: Any, phases: dict[str, Any] | None = None) -> Path:
    """`ranks/rank-N.json`: the gather mode this rank's trainer ran with, how generation went and its step phases
    (`phases`: rlhf_cli/rank/phases.StepPhases.record)."""
    accelerator = trainer.accelerator
    calls = GenerationProbe.calls
    record = {
        "rank": accelerator.process_index,
        "local_rank": accelerator.local_process_index,
        "machine_rank": int(os.environ.get("GROUP_RANK", "0")),  # set by torch's elastic launcher
        "world_size": accelerator.num_processes,
        "hostname": socket.gethostname(),
        GATHER_KEY: getattr(trainer.args, GATHER_KEY),  # TRL's key, spelled where the gather choice lives
        "global_step": trainer.state.global_step,
        **(phases or {"phases": None, "memory": None}),  # seconds per step and peak bytes of each phase
        "generation_probe": {
            "calls": len(calls),
            "peak_fraction": max((c["peak_fraction"] for c in calls), default=None),
            "full_numel": calls[0]["full_numel"] if calls else None,
            "per_call": calls,  # seconds, all_gathers, peak_bytes, rss_peak_bytes, ... of each call
        },
        "phase_memory": PhaseMemory.active.record() if PhaseMemory.active else None,  # RLHF_PROBE_CUDA_MEMORY
        # each weight sync into the generator: seconds, mode (dense|sparse), bytes_sent, dense_bytes,
        # changed_share, peak_memory_bytes, buckets, peak_bytes gathered, ... (rlhf_cli/rank/engines/weights.py)
        SYNC_RECORD_KEY: SYNC_LOG.records(),
        # PPO's rollouts from a separate engine (rlhf_cli/rank/ppo/rollouts.py): each generation call's seconds
        GENERATION_SECONDS_KEY: getattr(trainer, "rollouts", None) and trainer.rollouts.generation_seconds,
    }
    path = RunDir(Path(trainer.args.output_dir)).rank_record(accelerator.process_index)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path


def write_summary(trainer: Any, algorithm: str, status: str, wall_seconds: float,
                  phases: dict[str, Any] | None = None, final_save_seconds: float | None = None) -> None:
    """`summary.json` (rank 0): how the run ended, its pace, its step phases over every rank (the slowest rank's
    seconds, the largest peak), its final save's seconds (rank 0's; None: preempted, no final save) and its last
    logged metrics. Every rank calls it: the phases are gathered."""
    from accelerate.utils import gather_object

    ranks = gather_object([phases or {}]) if trainer.accelerator.num_processes > 1 else [phases or {}]
    if not trainer.accelerator.is_main_process:
        return
    state = trainer.state
    step_logs = [entry for entry in state.log_history if "train_runtime" not in entry]
    output_dir = RunDir(Path(trainer.args.output_dir))
    resumed = trainer.args.resume_from_checkpoint
    first_step = (checkpoint_step(resumed) or 0) if resumed else 0
    summary = {
        "algorithm": algorithm,
        "status": status,
        "global_step": state.global_step,
        "max_steps": state.max_steps,
        "resumed_from_step": first_step,
        "wall_seconds": round(wall_seconds, 1),  # this launch: loading, training and saving
        "steps_per_second": round((state.global_step - first_step) / wall_seconds, 4) if wall_seconds else None,
        **(merged(ranks) or {"phases": None, "memory": None}),
        "final_save_seconds": round(final_save_seconds, 3) if final_save_seconds is not None else None,
        "weight_syncs": _sync_summary(),
        "final_metrics": {key: value for key, value in (step_logs[-1] if step_logs else {}).items()
                          if isinstance(value, (int, float))},
        "saved": str(output_dir.path if status == "finished" else output_dir.checkpoint(state.global_step)),
    }
    output_dir.summary.write_text(json.dumps(summary, indent=2) + "\n")


def _sync_summary() -> list[dict[str, Any]] | None:
    """Rank 0's weight syncs, compactly: the bytes sent count every rank's patches, so rank 0's say it all."""
    keys = ("mode", "dense_reason", "scope", "bytes_sent", "dense_bytes", "changed_share", "seconds",
            "peak_memory_bytes", "added_peak_bytes")
    records = SYNC_LOG.records()
    return [{key: record.get(key) for key in keys} for record in records] if records else None
