"""vLLM generation end to end: RLOO, GRPO and online DPO with `--vllm colocate`, 2 ranks under ZeRO-3 on the CPU,
each with another gather choice (whole policy, a budget, one layer at a time) bounding the weight sync.

Skipped where vLLM is not installed; run them with the Python that has it (README: Tests).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import SMALL_BUCKETS, launch_rlhf, needs_vllm, sets

pytestmark = [needs_vllm]

LAYER_BYTES = 41088 * 4  # one decoder layer of the smoke policy, float32: its largest unit
POLICY_BYTES = 146240 * 4


def _sync_records(out: Path) -> list[list[dict]]:
    return [json.loads((out / "ranks" / f"rank-{rank}.json").read_text())["vllm_sync"] for rank in (0, 1)]


@pytest.mark.parametrize(("command", "gather", "extra"), [
    ("grpo", "--gather-budget", ("170KiB", "--set", "learning_rate=0.3")),  # a layer fits, two do not
    ("online-dpo", "--no-gather", ()),
    ("rloo", "--gather", ()),
], ids=["grpo-budget", "online-dpo-no-gather", "rloo-gather"])
def test_vllm_colocate_trains_and_syncs_within_the_gather_choice(command: str, gather: str, extra: tuple[str, ...],
                                                                tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = launch_rlhf(command, out, "--vllm", "colocate", gather, *extra, "--max-steps", "2", *sets(*SMALL_BUCKETS))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    state = json.loads((out / "trainer_state.json").read_text())
    steps = [entry for entry in state["log_history"] if "loss" in entry]
    assert state["global_step"] == 2 and len(steps) == 2
    assert all("  sync " in line for line in done.stdout.splitlines() if line.startswith("step "))
    for records in _sync_records(out):
        assert len(records) >= 2  # once per generation: the policy vLLM samples from is the trained one
        for record in records:
            assert record["full_bytes"] == POLICY_BYTES
            if gather == "--gather":
                assert record["buckets"] == 1 and record["peak_bytes"] == POLICY_BYTES
            elif gather == "--no-gather":
                assert record["buckets"] == 5 and record["peak_bytes"] <= LAYER_BYTES
            else:  # ZeRO-3's own account of what was whole at once stays within the budget
                assert record["buckets"] > 1 and record["peak_bytes"] <= 170 * 1024
    if command == "grpo":  # vLLM's logprobs are the policy's, after each update at a learning rate of 0.3
        differences = [entry["sampling/sampling_logp_difference/max"] for entry in steps]
        assert all(difference < 0.1 for difference in differences), differences
