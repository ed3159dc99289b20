"""Every test in this folder launches ranks under ZeRO-3 (slow): marked `launch`, so that the fast loop is
`pytest -m "not launch"` or, the same tests, `pytest tests --ignore tests/launch`. They share one cache of passed
pre-launch checks: its key leaves out where a run writes and what it resumes (rlhf_cli/launch/prelaunch.py), so
a launch whose values another already passed skips TRL's import in a process of its own, as a user's next run
does; tests/test_prelaunch.py checks the check itself from an empty cache."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.launch)


@pytest.fixture(scope="session")
def passed_checks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("rlhf-cache")


@pytest.fixture(autouse=True)
def shared_passed_checks(isolated_environment: None, passed_checks: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The session's cache in place of the test's own (after `isolated_environment`, which sets that one)."""
    from rlhf_cli.machine.cache import CACHE_ENV

    monkeypatch.setenv(CACHE_ENV, str(passed_checks))
