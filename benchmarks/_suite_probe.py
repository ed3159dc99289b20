"""A pytest plugin for benchmarks/suite.py: appends to $SUITE_PROBE_LOG, one JSON line each, every test's seconds
(setup, call and teardown) and every `rlhf` training or serving process a test started, with its wall seconds."""

from __future__ import annotations

import json
import os
import subprocess
import time
from typing import Any

import pytest

from rlhf_cli.algorithms import ALGORITHMS

LAUNCHING = {entry.command for entry in ALGORITHMS.values()} | {"vllm-serve"}
_started, _waited = subprocess.Popen.__init__, subprocess.Popen.wait


def _write(record: dict[str, Any]) -> None:
    with open(os.environ["SUITE_PROBE_LOG"], "a") as log:
        log.write(json.dumps(record) + "\n")


def _launched(argv: Any) -> str | None:
    """The `rlhf` command `argv` launches ranks or a server with; None for anything else (--dry-run included)."""
    words = [str(word) for word in argv] if isinstance(argv, (list, tuple)) else []
    if "rlhf_cli" not in words or "--dry-run" in words or words.index("rlhf_cli") + 1 >= len(words):
        return None
    command = words[words.index("rlhf_cli") + 1]
    return command if command in LAUNCHING else None


def _start(self: subprocess.Popen, args: Any, *rest: Any, **options: Any) -> None:
    _started(self, args, *rest, **options)
    command = _launched(args)
    self._suite_launch = (command, time.monotonic(), os.environ.get("PYTEST_CURRENT_TEST", "")) if command else None


def _wait(self: subprocess.Popen, *args: Any, **options: Any) -> int:
    code = _waited(self, *args, **options)
    launch = getattr(self, "_suite_launch", None)
    if launch:
        self._suite_launch = None
        command, started, test = launch
        _write({"launch": command, "test": test.rsplit(" ", 1)[0], "seconds": time.monotonic() - started})
    return code


subprocess.Popen.__init__, subprocess.Popen.wait = _start, _wait


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _write({"test": report.nodeid, "phase": report.when, "seconds": report.duration, "outcome": report.outcome})
