"""A TRL config file with an `env:` block, launched as it is (tests/test_trl_config.py checks it without ranks); and
the step phases every run measures (rlhf_cli/rank/phases.py), in its summary.json and end table."""

from __future__ import annotations

import json
import os
from pathlib import Path

from helpers import REPO, launch_rlhf, trl_config


def test_a_trl_config_with_an_env_block_runs_unchanged_and_every_rank_sees_it(tmp_path: Path) -> None:
    config = trl_config(tmp_path)
    done = launch_rlhf("rloo", tmp_path / "out", recipe=config, cwd=tmp_path, env={"PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    assert {path.name: path.read_text() for path in tmp_path.glob("rank-*.txt")} == \
        {"rank-0.txt": "hello from env", "rank-1.txt": "hello from env"}
    assert "RLHF_GREETING" not in os.environ  # set in the ranks, not in the caller
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    phases = summary["phases"]
    assert set(phases) == {"generation", "sync", "saving", "train"}
    assert phases["generation"]["seconds_per_step"] > 0 and phases["train"]["seconds_per_step"] > 0
    assert phases["generation"]["peak_bytes"] > 0 and summary["memory"]["kind"] == "rss"
    assert "s/step by phase" in done.stderr
