"""accelerate's and torch's launcher, as the launch supervisor drives them: the signals passed on to the ranks, the
ranks' import path, and how a rank's failure is raised and read. Their internals are listed in compat/__init__.py
with the rest."""

from __future__ import annotations

from typing import Any


def forward_signals_to_ranks(launch_args: Any, signals: str) -> None:
    """torch's launcher passes on the signals it handles; accelerate forwards this attribute to it."""
    launch_args.signals_to_handle = signals


def keep_working_directory_off_rank_path() -> None:
    """The ranks' PYTHONPATH as the caller's: without the working directory accelerate appends to it (unless the
    caller's PYTHONPATH names it too)."""
    import os

    import accelerate.commands.launch as accelerate_launch

    original = getattr(accelerate_launch.prepare_deepspeed_cmd_env, "__wrapped__",
                       accelerate_launch.prepare_deepspeed_cmd_env)

    def prepare(args: Any) -> tuple[list[str], dict[str, str]]:
        command, env = original(args)
        own = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
        entries = [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry]
        added = os.path.abspath(".")
        if entries and entries[-1] == added and added not in own:
            entries.pop()
        if entries:
            env["PYTHONPATH"] = os.pathsep.join(entries)
        else:
            env.pop("PYTHONPATH", None)
        return command, env

    prepare.__wrapped__ = original  # type: ignore[attr-defined]
    accelerate_launch.prepare_deepspeed_cmd_env = prepare


def launch_errors() -> tuple[type, type]:
    """(a signal stopped the launcher, a rank failed) as torch's elastic launcher raises them."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    return SignalException, ChildFailedError


def rank_exits(failed: Any) -> list[dict[str, Any]]:
    """How each failed rank of a ChildFailedError ended: rank (global), local_rank, pid, exitcode (-N: signal N),
    time (seconds, as torch's agent first saw it)."""
    return [{"rank": rank, "local_rank": failure.local_rank, "pid": failure.pid, "exitcode": failure.exitcode,
             "time": failure.timestamp} for rank, failure in failed.failures.items()]
