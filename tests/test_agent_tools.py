"""A recipe's tools and environments as the ranks import them: once per file, under names that shadow nothing, and
each call limited by `tool_timeout` (rlhf_cli/rank/inputs.py, rlhf_cli/rank/agent_tools.py)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import pytest

from helpers import write
from rlhf_cli.rank.agent_tools import timed_environment, timed_tool
from rlhf_cli.rank.inputs import load_code

SHARED = '''
calls = []

def lookup(key: str) -> str:
    """Look a key up.

    Args:
        key: What to look up.
    """
    calls.append(key)
    return key

def reward(completions, **kwargs):
    return [float(len(calls)) for _ in completions]
'''


def test_a_tool_file_named_json_replaces_no_module_and_shares_its_state_with_a_reward_from_it(tmp_path: Path) -> None:
    path = write(tmp_path / "json.py", SHARED)
    lookup, reward = load_code(f"{path}:lookup"), load_code(f"{path}:reward")
    assert sys.modules["json"] is json and json.dumps([1]) == "[1]"
    lookup("a")
    assert reward(completions=[None]) == [1.0]  # one module: the reward sees the tool's call
    other = write(tmp_path / "other" / "json.py", SHARED)
    assert load_code(f"{other}:reward")(completions=[None]) == [0.0]  # another file, another module


def test_a_file_that_fails_to_import_is_not_kept_half_built(tmp_path: Path) -> None:
    path = write(tmp_path / "flaky.py", "raise RuntimeError('not yet')\n")
    with pytest.raises(RuntimeError):
        load_code(f"{path}:lookup")
    write(path, SHARED)
    assert load_code(f"{path}:lookup")("b") == "b"


def slow(seconds: float) -> str:
    """Sleep.

    Args:
        seconds: How long.
    """
    time.sleep(seconds)
    return "woke"


async def slow_async(seconds: float) -> str:
    """Sleep without blocking.

    Args:
        seconds: How long.
    """
    await asyncio.sleep(seconds)
    return "woke"


def broken(seconds: float) -> str:
    """Fail.

    Args:
        seconds: Ignored.
    """
    raise ValueError("bad input")


def test_a_call_past_tool_timeout_raises_timeout_error_which_trl_counts_as_a_failed_call() -> None:
    """TRL's loop catches Exception around each call and feeds str(error) back: TimeoutError is one, with a
    message naming the tool and the limit. The schema transformers writes is the tool's own."""
    from transformers.utils import get_json_schema

    timed = timed_tool(slow, 0.2)
    assert get_json_schema(timed) == get_json_schema(slow)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"the tool slow did not return within tool_timeout \(0.2 s\)"):
        timed(seconds=5)
    assert time.monotonic() - started < 2
    assert timed(seconds=0) == "woke"
    with pytest.raises(ValueError, match="bad input"):  # the tool's own error, as without a limit
        timed_tool(broken, 1)(seconds=0)
    timed_async = timed_tool(slow_async, 0.2)
    assert asyncio.iscoroutinefunction(timed_async) and get_json_schema(timed_async) == get_json_schema(slow_async)
    with pytest.raises(TimeoutError, match="slow_async"):
        asyncio.run(timed_async(seconds=5))
    assert timed_tool(slow, None) is slow


class Sandbox:
    """An environment: reset and get_reward are the trainer's, the rest tools."""

    def reset(self, **kwargs) -> str:
        time.sleep(0.4)
        return "go"

    def wait(self, seconds: float) -> str:
        """Wait.

        Args:
            seconds: How long.
        """
        time.sleep(seconds)
        return "waited"

    def get_reward(self) -> float:
        return 1.0


def test_an_environments_tools_are_limited_and_reset_and_get_reward_are_not() -> None:
    import inspect

    timed = timed_environment(Sandbox, 0.2)
    environment = timed()
    assert timed.__name__ == "Sandbox" and isinstance(environment, Sandbox)
    assert environment.reset() == "go" and environment.get_reward() == 1.0  # past 0.2 s, and not limited
    with pytest.raises(TimeoutError, match="the tool wait"):
        environment.wait(seconds=5)
    assert environment.wait(seconds=0) == "waited"
    assert sorted(name for name, _ in inspect.getmembers(timed, predicate=inspect.isfunction)) == \
        ["get_reward", "reset", "wait"]  # the methods GRPOTrainer lists, as on the user's class


def test_a_tool_the_model_could_never_call_as_meant_is_a_pre_launch_problem(tmp_path: Path) -> None:
    """Two tools of one name (TRL keeps the last) and a tool taking *args (tool calls pass keywords) are refused;
    tools of distinct names with named arguments pass."""
    from rlhf_cli.rank.prelaunch_tools import tool_problems

    first = write(tmp_path / "a" / "tools.py", SHARED)
    second = write(tmp_path / "b" / "tools.py", SHARED)
    starred = write(tmp_path / "starred.py", SHARED.replace("def lookup(key: str)", "def lookup(*key: str)"))
    assert tool_problems([f"{first}:lookup"]) == []
    assert tool_problems([f"{first}:lookup", f"{second}:lookup"]) == [
        f"`tools`: {first}:lookup and {second}:lookup are both named `lookup`: the model calls tools by name, so the "
        "second hides the first; rename one"]
    problems = tool_problems([f"{starred}:lookup"])
    assert len(problems) == 1 and problems[0].startswith(f"`tools`: {starred}:lookup: ") and "*args" in problems[0]
