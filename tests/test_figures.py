"""How figures and their ranges print: three significant digits, the value's unit once."""

from __future__ import annotations

from simulator.outputs import figures


def test_a_range_in_the_value_s_unit_names_it_once() -> None:
    assert figures.seconds_ranged(1.45, [1.38, 1.92]) == "1.45 s (1.38-1.92)"
    assert figures.seconds_ranged(0.0106, [0.00828, 0.046]) == "10.6 ms (8.28-46)"


def test_an_end_in_another_unit_keeps_its_own() -> None:
    assert figures.seconds_ranged(0.542, [0.458, 1.75]) == "542 ms (458 ms-1.75 s)"
    assert "e+" not in figures.seconds_ranged(0.76, [0.423, 6.12])


def test_no_range_prints_the_value_alone() -> None:
    assert figures.seconds_ranged(0.178, None) == "178 ms"
