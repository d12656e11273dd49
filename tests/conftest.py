"""Text tables are as wide as the terminal (rich reads COLUMNS): the tests fix it at 120 so
their output is the same in a terminal and under CI."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _terminal_width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "120")
