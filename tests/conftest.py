"""What every test shares: text tables as wide as a fixed terminal (rich reads COLUMNS: 120,
so output is the same in a terminal and under CI), and a cache folder of the run's own."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest


@pytest.fixture(autouse=True)
def _terminal_width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "120")


def pytest_configure(config: pytest.Config) -> None:
    """Validated presets are kept in a folder of the test run's own (preset_cache.py), not the
    user's ~/.cache: set before collection, which already loads presets, and inherited by the
    commands the tests start as processes."""
    os.environ["STEPSIM_CACHE_DIR"] = tempfile.mkdtemp(prefix="stepsim-test-cache-")


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(os.environ.pop("STEPSIM_CACHE_DIR", ""), ignore_errors=True)
