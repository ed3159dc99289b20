"""A recipe's tools and environments as GRPOTrainer gets them, with `tool_timeout` applied.

TRL 1.16 runs each tool call on the training thread and waits for it however long it takes: a tool that hangs
stops every rank (the stall watch then ends the job). With `tool_timeout`, each call runs on a thread of its own and
is abandoned after that many seconds: TimeoutError is raised in its place, which TRL's loop counts as a failed call
(`tools/failure_frequency`) and feeds back to the policy as the tool's error, and the run goes on. The abandoned
thread runs on in the background until the tool returns (Python cannot stop a thread), so a tool that never
returns holds what it holds; async tools are cancelled instead.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
from collections.abc import Callable
from typing import Any


def _timed_out(name: str, seconds: float) -> TimeoutError:
    return TimeoutError(f"the tool {name} did not return within tool_timeout ({seconds:g} s); the call was abandoned")


def timed_tool(tool: Callable, seconds: float | None) -> Callable:
    """`tool` with each call limited to `seconds` (None: `tool` itself). The wrapper keeps its name, docstring and
    signature, from which transformers writes the tool's schema."""
    if seconds is None:
        return tool
    name = getattr(tool, "__name__", "tool")
    if inspect.iscoroutinefunction(tool):
        @functools.wraps(tool)
        async def call_async(*args: Any, **kwargs: Any) -> Any:
            try:
                return await asyncio.wait_for(tool(*args, **kwargs), seconds)
            except asyncio.TimeoutError:
                raise _timed_out(name, seconds) from None

        return call_async

    @functools.wraps(tool)
    def call(*args: Any, **kwargs: Any) -> Any:
        done = threading.Event()
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                outcome["result"] = tool(*args, **kwargs)
            except BaseException as error:  # noqa: BLE001 - handed to the caller as the tool raised it
                outcome["error"] = error
            finally:
                done.set()

        threading.Thread(target=run, name=f"tool {name}", daemon=True).start()
        if not done.wait(seconds):
            raise _timed_out(name, seconds)
        if "error" in outcome:
            raise outcome["error"]
        return outcome["result"]

    return call


def timed_environment(factory: Callable, seconds: float | None) -> Callable:
    """An environment class whose public methods (its tools, as GRPOTrainer finds them) are limited to `seconds`
    per call; `reset` and `get_reward` are left as they are. A subclass of the user's class, under its name."""
    if seconds is None or not isinstance(factory, type):
        return factory
    methods = {name: timed_tool(method, seconds)
               for name, method in inspect.getmembers(factory, predicate=inspect.isfunction)
               if name not in ("reset", "get_reward") and not name.startswith("_")}
    timed = type(factory.__name__, (factory,), {**methods, "__module__": factory.__module__,
                                                "__qualname__": factory.__qualname__, "__doc__": factory.__doc__})
    return timed
