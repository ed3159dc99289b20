"""Every test in this folder launches ranks under ZeRO-3 (slow): marked `launch`, so that the fast loop is
`pytest -m "not launch"` or, the same tests, `pytest tests --ignore tests/launch`. They share one cache of passed
pre-launch checks: its key leaves out where a run writes and what it resumes (rlhf_cli/launch/prelaunch.py), so
a launch whose values another already passed skips TRL's import in a process of its own, as a user's next run
does; tests/test_prelaunch.py checks the check itself from an empty cache.

A launch is the suite's unit of cost (one 2-step run is 15-20 s on 2 cores, most of it start-up), so tests whose
needs overlap read one run: `shared_runs` starts each run once per session, whichever test asks first. Likewise
one `rlhf vllm-serve` (`vllm_server`) serves every `--vllm server` run of the session, one run after another."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from helpers import RECIPES, VLLM_ENV, free_port

HERE = Path(__file__).parent


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.launch)
        if "vllm_server" in item.fixturenames:  # one server a session: its tests on one worker (tests/conftest.py)
            item.add_marker(pytest.mark.xdist_group("vllm-server"))


@pytest.fixture(scope="session")
def passed_checks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("rlhf-cache")


@pytest.fixture(autouse=True)
def shared_passed_checks(isolated_environment: None, passed_checks: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The session's cache in place of the test's own (after `isolated_environment`, which sets that one)."""
    from rlhf_cli.machine.cache import CACHE_ENV

    monkeypatch.setenv(CACHE_ENV, str(passed_checks))


Started = TypeVar("Started")


class SharedRuns:
    """Runs several tests read, each started once per session in a folder of its own, by a key naming what it
    launched. A run that raised is not kept: the next test that asks starts it again and fails on its own."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.started: dict[Any, Any] = {}
        self.folders = 0

    def get(self, key: Any, start: Callable[[Path], Started]) -> Started:
        """What `start(a fresh folder)` returned the first time `key` was asked for."""
        if key not in self.started:
            self.folders += 1
            folder = self.root / f"run-{self.folders}"
            folder.mkdir()
            self.started[key] = start(folder)
        return self.started[key]


@pytest.fixture(scope="session")
def shared_runs(tmp_path_factory: pytest.TempPathFactory) -> SharedRuns:
    return SharedRuns(tmp_path_factory.mktemp("shared-runs"))


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of one `rlhf vllm-serve` on the smoke policy (every smoke recipe's), for the whole session, with
    vLLM's LoRA on (`--lora`): it serves the runs with LoRA their adapters, and the others their whole weights."""
    yield from _served(tmp_path_factory.mktemp("vllm-server") / "server.log", "--lora")


@pytest.fixture
def bf16_vllm_server(tmp_path: Path) -> Iterator[str]:
    """The URL of an `rlhf vllm-serve` holding the smoke policy in bf16 (a run's `bf16: true`), for one test."""
    yield from _served(tmp_path / "server.log", "--set", "bf16=true")


def _served(log: Path, *settings: str) -> Iterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with log.open("w") as sink:
        server = subprocess.Popen([sys.executable, "-m", "rlhf_cli", "vllm-serve", "ppo", "-r",
                                   str(RECIPES / "ppo" / "smoke.yaml"), *settings, "--port", str(port)], stdout=sink,
                                  stderr=subprocess.STDOUT, env={**os.environ, **VLLM_ENV}, start_new_session=True)
    try:
        wait_for_server(url, server, log)
        yield url
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)


def wait_for_server(url: str, server: subprocess.Popen, log: Path, timeout: float = 600) -> None:
    import requests

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert server.poll() is None, log.read_text()[-4000:]
        try:
            if requests.get(f"{url}/health", timeout=5).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        time.sleep(2)
    raise AssertionError(f"no vLLM server at {url} after {timeout} s:\n{log.read_text()[-4000:]}")
