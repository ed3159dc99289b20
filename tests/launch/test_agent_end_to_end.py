"""`rlhf grpo -r grpo/agent-smoke` really launched: 2 ranks under ZeRO-3 on the CPU, the stand-in calling its tool.

The tools (tests/fixtures/diverging_tools.py) make the ranks take different numbers of tool-calling turns: rank 1's
results are all too long to continue, so TRL's loop regenerates nothing there while rank 0 regenerates. Without
rlhf's collective turns (rlhf_cli/rank/agent_turns.py) rank 1 would wait in the gather after generation while rank
0 waits in its regeneration. The reward is TRL's documented signature, `reward(completions, answer, **kwargs)`."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import FIXTURES, RECIPES, launch_rlhf

DIVERGING = FIXTURES / "diverging_tools.py"
COMPLETIONS_PER_STEP = 4  # per_device_train_batch_size 2 x 2 ranks


def agent_smoke(out: Path, *args: str) -> list[dict]:
    """Two steps of the bundled agent recipe with the diverging tools and TRL's reward signature; the logged
    steps."""
    done = launch_rlhf("grpo", out, "--max-steps", "2", "--set", f"reward_funcs=[{DIVERGING}:reward]",
                       "--set", f"tools=[{DIVERGING}:calculate]", "--set", "max_tool_calling_iterations=2", *args,
                       recipe=RECIPES / "grpo" / "agent-smoke.yaml", timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    return [entry for entry in history if "tools/call_frequency" in entry]


def calls(out: Path, rank: int) -> list[str]:
    path = out / f"tool-calls-rank-{rank}.txt"
    return path.read_text().splitlines() if path.exists() else []


def test_ranks_whose_rollouts_take_different_numbers_of_turns_finish_gathered_and_from_shards(tmp_path: Path) -> None:
    """Gathered: both ranks call the calculator, rank 1's results overlong; the run finishes and the logged calls
    are every call made. From shards: rank 0's calculator raises (each a failed call, fed back, and rank 0's
    rollouts go on), rank 1's results overlong; the failures logged are exactly rank 0's calls."""
    gathered = agent_smoke(tmp_path / "gather", "--gather")
    assert len(gathered) == 2
    made = calls(tmp_path / "gather", 0) + calls(tmp_path / "gather", 1)
    assert calls(tmp_path / "gather", 0) and calls(tmp_path / "gather", 1)  # rank 0 regenerated, rank 1 could not
    assert round(sum(entry["tools/call_frequency"] for entry in gathered) * COMPLETIONS_PER_STEP) == len(made)
    assert all(entry["tools/failure_frequency"] == 0 for entry in gathered)

    failing = agent_smoke(tmp_path / "no-gather", "--no-gather", "--set", "env={DIVERGING_TOOLS_FAIL: '1'}")
    assert len(failing) == 2
    failed, overlong = calls(tmp_path / "no-gather", 0), calls(tmp_path / "no-gather", 1)
    assert failed and overlong
    per_step = [(entry["tools/call_frequency"] * COMPLETIONS_PER_STEP, entry["tools/failure_frequency"])
                for entry in failing]
    assert round(sum(made for made, _ in per_step)) == len(failed) + len(overlong)
    assert round(sum(made * share for made, share in per_step)) == len(failed)
