"""Fuzzing is opt-in: these tests run under ``make fuzz``, ``pytest -m fuzz`` or when named.

Every module here is marked ``fuzz``; this hook deselects them from any other run (``make
test`` collects ``tests/`` whole), so the default suite keeps the unit tests' smaller budgets.
docs/fuzzing.md says what each target checks and what the last full run took.
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def _named_here(config: pytest.Config) -> bool:
    """Whether the command line names this folder or a file in it."""
    for arg in config.args:
        path = Path(arg.split("::", 1)[0]).resolve()
        if path == HERE or HERE in path.parents:
            return True
    return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "fuzz" in (config.getoption("markexpr") or "") or _named_here(config):
        return  # -m decides (pytest's own filter), or the user asked for these files
    kept = [item for item in items if item.get_closest_marker("fuzz") is None]
    if len(kept) != len(items):
        config.hook.pytest_deselected(items=[i for i in items if i not in kept])
        items[:] = kept
