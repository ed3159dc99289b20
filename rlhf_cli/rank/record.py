"""Per-rank facts written next to the model, so a run (and a test) can see what each rank did."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

from rlhf_cli.rank.zero3 import GenerationProbe

RANKS_DIR = "ranks"


def write_rank_record(trainer: Any) -> Path:
    """`ranks/rank-N.json`: the gather mode this rank's trainer ran with and how generation went."""
    accelerator = trainer.accelerator
    calls = GenerationProbe.calls
    record = {
        "rank": accelerator.process_index,
        "world_size": accelerator.num_processes,
        "hostname": socket.gethostname(),
        "ds3_gather_for_generation": trainer.args.ds3_gather_for_generation,
        "global_step": trainer.state.global_step,
        "generation_probe": {
            "calls": len(calls),
            "peak_fraction": max((c["peak_fraction"] for c in calls), default=None),
            "full_numel": calls[0]["full_numel"] if calls else None,
            "per_call": calls,  # seconds, all_gathers, peak_bytes, rss_peak_bytes, ... of each call
        },
    }
    path = Path(trainer.args.output_dir) / RANKS_DIR / f"rank-{accelerator.process_index}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path
