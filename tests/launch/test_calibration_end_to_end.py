"""`rlhf doctor --calibrate` measured for real (torch in a subprocess, two gloo processes), then read by a plan that
had no seconds before it (the plan's side alone, from a written calibration: tests/test_plan_time.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from helpers import REPO


def rlhf(*args: str, cache: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlhf_cli", *args], capture_output=True, text=True, timeout=600,
                          cwd=REPO, env={**os.environ, "RLHF_CACHE": str(cache), "CUDA_VISIBLE_DEVICES": ""})


def test_doctor_calibrates_this_machine_and_the_plan_then_has_seconds(tmp_path: Path) -> None:
    done = rlhf("doctor", "--calibrate", cache=tmp_path)
    assert "calibrated here (cpu, " in done.stdout, done.stderr[-2000:]
    kept = json.loads((tmp_path / "calibration.json").read_text())
    assert kept["backend"] == "gloo" and kept["matmul_flops"] > 1e8 and kept["all_gather_rate"] > 0
    assert 1e-7 < kept["call_latency"] < 1e-3  # a small module's call from Python: microseconds
    plan = json.loads(rlhf("plan", "rloo", "-r", "rloo/smoke", "--json", cache=tmp_path).stdout)
    assert plan["gpu"]["source"].startswith("calibrated here (cpu") and "a module call" in plan["gpu"]["source"]
    assert plan["gpu"]["call_latency"] == kept["call_latency"]
    assert all(column["step_seconds"] > 0 for column in plan["configurations"])
