"""Text tables are as wide as the terminal (rich reads COLUMNS): the tests fix it at 120 so
their output is the same in a terminal and under CI."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _terminal_width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "120")


@pytest.fixture(autouse=True, scope="session")
def _own_cache_folder(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Validated presets are kept in a folder of the test session's own (preset_cache.py),
    not the user's ~/.cache; commands the tests start as processes inherit it."""
    import os

    os.environ["STEPSIM_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
