"""`rlhf grpo -r grpo/agent-smoke` really launched: 2 ranks under ZeRO-3 on the CPU, the stand-in calling its tool."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import FIXTURES, RECIPES, launch_rlhf

FAILING_TOOLS = FIXTURES / "failing_tools.py"


def agent_smoke(out: Path, *args: str) -> list[dict]:
    """Two steps of the bundled agent recipe; the logged steps."""
    done = launch_rlhf("grpo", out, "--max-steps", "2", *args, recipe=RECIPES / "grpo" / "agent-smoke.yaml",
                       timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    return [entry for entry in history if "tools/call_frequency" in entry]


def test_the_stand_in_calls_its_tool_and_a_tool_that_raises_is_a_failure_not_a_crash(tmp_path: Path) -> None:
    """Gathered: the taught stand-in calls the calculator, whose results mostly come back. From shards: the same
    calls reach a calculator that always raises; each counts as a failed call and training goes on."""
    gathered = agent_smoke(tmp_path / "gather", "--gather")
    assert len(gathered) == 2
    assert all(entry["tools/call_frequency"] > 0 for entry in gathered)
    assert all(entry["tools/failure_frequency"] < 1 for entry in gathered)
    failing = agent_smoke(tmp_path / "no-gather", "--no-gather", "--set", f"tools=[{FAILING_TOOLS}:calculate]")
    assert len(failing) == 2
    assert all(entry["tools/call_frequency"] > 0 and entry["tools/failure_frequency"] == 1 for entry in failing)
