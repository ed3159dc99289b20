"""Shared fixtures: an isolated home and hub cache, the repo's paths, and a CLI runner."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

MOST_WORKERS = 4  # each launched test starts 2 ranks (and some a vLLM engine): more workers, more memory


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto` (pyproject's addopts): one worker per core, at most MOST_WORKERS, at least 2. A launched run keeps
    about one core busy on average (its five processes mostly start one after another), so 2 workers fill a 2-core
    machine; tests that read one shared run or server carry one `xdist_group` and run on one worker."""
    return max(2, min(len(os.sched_getaffinity(0)), MOST_WORKERS))


@pytest.fixture(autouse=True)
def isolated_environment(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test reads the user's caches or reaches a hub."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HF_HOME", str(home / "hf"))
    monkeypatch.setenv("RLHF_CACHE", str(home / "rlhf-cache"))  # the pre-launch checks that passed
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")  # online DPO is experimental in TRL; we know
    monkeypatch.delenv("RLHF_DEBUG", raising=False)


class Program:
    """`rlhf` as the console script runs it, through `main()` and its one error boundary, for click's CliRunner
    (which calls `main(args=..., prog_name=...)` and reads the exit code from SystemExit)."""

    name = "rlhf"

    def main(self, args: list[str], prog_name: str | None = None, **_: object) -> None:
        from rlhf_cli.cli.app import main

        raise SystemExit(main(list(args)))


@pytest.fixture(scope="session")
def family_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every model-family stand-in (tests/families/build.py), built once per session: name -> directory."""
    from families.build import build_all

    return build_all(tmp_path_factory.mktemp("families"))


@pytest.fixture(scope="session")
def tied_vllm_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Qwen2.5-0.5B-style stand-in vLLM's CPU attention runs: tied embeddings, q/k/v biases, 2 heads of 64, one
    KV head (tests/families/build.py `for_vllm`)."""
    from families.build import build_family

    return build_family("qwen2.5", tmp_path_factory.mktemp("vllm-families") / "qwen2.5", vllm=True)


@pytest.fixture
def seed_models() -> None:
    """The seed recipe's models (Pythia 12B and 70M) in the hub cache, config.json only."""
    from helpers import cache_model

    cache_model("EleutherAI/pythia-12b", "pythia-12b")
    cache_model("EleutherAI/pythia-70m", "pythia-70m")


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """Run `rlhf ARGS` in-process from a fresh working directory; returns the click Result."""
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(Program(), [str(a) for a in args])

    return invoke


@pytest.fixture
def nothing_launches(monkeypatch: pytest.MonkeyPatch) -> list:
    """Any launch is recorded instead of started, the pre-launch check with it (its own process, seconds of
    TRL's import; tests/test_prelaunch.py runs it); the list holds the runs that would have started."""
    from rlhf_cli.launch import runner

    launched: list = []

    def record(run, verbosity: str = "normal", **_) -> runner.Outcome:
        launched.append(run)
        return runner.Outcome(0, "finished")

    monkeypatch.setattr(runner, "launch", record)
    return launched


class PassingCheck:
    """The pre-launch check when the test is about what follows it: passes at once, or after `delay` seconds."""

    delay = 0.0

    def __init__(self, run, timeout: float = 0) -> None:
        pass

    def wait(self) -> None:
        import time

        time.sleep(self.delay)


@pytest.fixture
def check_passes(monkeypatch: pytest.MonkeyPatch) -> type[PassingCheck]:
    """runner.launch without the seconds of the real pre-launch check (tests/test_prelaunch.py runs that)."""
    from rlhf_cli.launch import runner

    monkeypatch.setattr(runner, "PendingCheck", PassingCheck)
    return PassingCheck
