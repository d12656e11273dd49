"""Interval arithmetic the reports and energy rest on (engine/timeline.py): union and
uncovered lengths, checked against a brute-force count on a grid."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from simulator.engine.timeline import subtract_length, uncovered_lengths, union_length

# intervals on a grid of quarters, so every length is exact in binary floating point
_POINT = st.integers(0, 40).map(lambda q: q / 4)
_INTERVALS = st.lists(st.tuples(_POINT, _POINT), max_size=12)


def _cells(intervals: list[tuple[float, float]]) -> set[int]:
    return {q for start, end in intervals for q in range(int(start * 4), int(end * 4))}


@given(_INTERVALS, _INTERVALS)
def test_lengths_match_a_count_of_grid_cells(base: list[tuple[float, float]],
                                             cut: list[tuple[float, float]]) -> None:
    assert union_length(base) == len(_cells(base)) / 4
    assert subtract_length(base, cut) == len(_cells(base) - _cells(cut)) / 4


@given(_INTERVALS, _INTERVALS)
def test_each_intervals_uncovered_length_is_its_own_subtraction(
        base: list[tuple[float, float]], cut: list[tuple[float, float]]) -> None:
    assert uncovered_lengths(base, cut) == [subtract_length([i], cut) for i in base]


def test_a_cut_that_covers_part_of_two_intervals() -> None:
    assert uncovered_lengths([(0.0, 2.0), (3.0, 5.0)], [(1.0, 4.0)]) == [1.0, 1.0]
