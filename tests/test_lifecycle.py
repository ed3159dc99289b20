"""How a rank ends when another fails: without waiting for a collective's timeout."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from rlhf_cli.run_dir import RunDir

BLOCKED_RANK = """
import sys, time
from pathlib import Path
from rlhf_cli.rank.lifecycle import failures_recorded
with failures_recorded(Path(sys.argv[1]), watch_interval_s=0.2):
    print("training", flush=True)
    time.sleep(120)  # as a rank blocked in an all-reduce whose peer is gone
"""


def test_a_blocked_rank_exits_soon_after_another_rank_fails(tmp_path: Path) -> None:
    rank = subprocess.Popen([sys.executable, "-c", BLOCKED_RANK, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert rank.stdout.readline() == "training\n"
    time.sleep(0.5)
    assert rank.poll() is None  # no failure anywhere: it keeps going
    marker = RunDir(tmp_path).first_failure
    marker.parent.mkdir(parents=True)
    marker.touch()  # what the first failing rank, on any machine, leaves in the shared output dir
    started = time.monotonic()
    assert rank.wait(timeout=30) == 1
    assert time.monotonic() - started < 5
