"""Sizes are read as nccl-tests reads them (powers of two)."""

import pytest

from simulator.errors import InputError
from simulator.units import GiB, KiB, MiB, format_size, parse_count, parse_size


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


@pytest.mark.parametrize(
    ("text", "expected"),
    [("500M", 500_000_000), ("1B", 10**9), ("2T", 2 * 10**12), ("1.5b", 1_500_000_000),
     ("300", 300), ("2e12", 2 * 10**12), ("10K", 10_000), (1000, 1000)],
)
def test_parse_count_is_decimal(text, expected):
    assert parse_count(text) == expected


@pytest.mark.parametrize("bad", ["", "1X", "-5M", "0", "B", "1.2.3B"])
def test_parse_count_rejects_with_the_flag_named(bad):
    with pytest.raises(InputError, match="--train-tokens"):
        parse_count(bad, "--train-tokens")
