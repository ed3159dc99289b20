"""The canary of rlhf's no-gather fix: stock TRL, launched with 2 ranks under DeepSpeed ZeRO-3 on the CPU, still
crashes with --no-gather. (Every algorithm's runs: tests/launch/test_conformance.py.)

The DeepSpeed config uses buckets smaller than the smoke model, as a real model is larger than
DeepSpeed's default buckets: that is what makes stock TRL crash with --no-gather.
"""

from __future__ import annotations

from pathlib import Path

from helpers import SMALL_BUCKETS, launch_rlhf, sets

STALE_TRACE_CRASH = "The size of tensor a (0) must match the size of tensor b"


def test_stock_trl_still_crashes_with_no_gather(tmp_path: Path) -> None:
    """Without our fix, TRL 1.16 crashes at the first backward; when this starts passing, drop the fix."""
    done = launch_rlhf("rloo", tmp_path / "run", "--no-gather", *sets(*SMALL_BUCKETS),
                       env={"RLHF_STOCK_TRL_GENERATION": "1"})
    assert done.returncode != 0
    assert STALE_TRACE_CRASH in done.stdout + done.stderr
