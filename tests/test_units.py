"""Sizes are read as nccl-tests reads them (powers of two)."""

import pytest

from simulator.errors import InputError
from simulator.units import GiB, KiB, MiB, format_size, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [("8", 8), ("64K", 64 * KiB), ("25M", 25 * MiB), ("8G", 8 * GiB), ("1.5M", 3 * MiB // 2),
     ("16MiB", 16 * MiB), (4096, 4096)],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "abc", "-1", "5X", "1e9"])
def test_parse_size_rejects(bad):
    with pytest.raises(InputError):
        parse_size(bad)


def test_format_size_round_trips():
    for n in (8, 64 * KiB, 25 * MiB, 8 * GiB):
        assert parse_size(format_size(n)) == n
