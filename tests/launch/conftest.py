"""Every test in this folder launches ranks under ZeRO-3 (slow): marked `launch`, so that the fast loop is
`pytest -m "not launch"` or, the same tests, `pytest tests --ignore tests/launch`."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.launch)
