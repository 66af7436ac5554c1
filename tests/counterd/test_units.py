"""One unit per quantity (counterd/data/units.py): times in seconds with an SI prefix, grouped
counts, never e-notation; SI base units in the names of machine-readable fields."""

from __future__ import annotations

import math
import re

import pytest

from counterd.data.units import count, counter_text, is_time, seconds, si_name, si_value

E_NOTATION = re.compile(r"\d[eE][+-]?\d")


@pytest.mark.parametrize("v, text", [
    (1.234e-3, "1.23 ms"), (850e-6, "850 us"), (2.5, "2.50 s"), (63.8e-6, "63.8 us"),
    (7.0, "7.00 s"), (12e-9, "12.0 ns"), (0.0, "0 s"), (-2e-3, "-2.00 ms"),
    (999.6e-6, "1.00 ms"),  # rounded before the prefix is chosen: not "1,000 us"
    (1234.0, "1,230 s"), (5e-10, "0.500 ns"), (math.inf, "inf"),
])
def test_seconds_picks_the_prefix_per_value(v: float, text: str) -> None:
    assert seconds(v) == text


@pytest.mark.parametrize("v, text", [
    (7_246_000.0, "7,246,000"), (250_000, "250,000"), (0.0, "0"), (999.6, "1,000"),
    (1e12, "1,000,000,000,000"), (-3.0, "-3"), (math.nan, "nan"),
])
def test_count_is_a_grouped_integer(v: float, text: str) -> None:
    assert count(v) == text


def test_never_e_notation() -> None:
    for exp in range(-15, 13):
        for mant in (1.0, 2.345, 9.9996):
            v = mant * 10.0 ** exp
            assert not E_NOTATION.search(seconds(v)), (v, seconds(v))
            assert not E_NOTATION.search(count(v)), (v, count(v))


def test_a_time_counter_is_written_in_seconds() -> None:
    assert is_time("task_clock_ns") and not is_time("l1d_misses")
    assert counter_text("task_clock_ns", 7.246e6) == "7.25 ms"
    assert counter_text("l1d_misses", 250_000.0) == "250,000"
    assert (si_name("task_clock_ns"), si_value("task_clock_ns", 7.246e6)) == ("task_clock_s",
                                                                              7.246e-3)
    assert (si_name("loads"), si_value("loads", 2e6)) == ("loads", 2_000_000)
    assert isinstance(si_value("loads", 2e6), int)


def test_si_fields_turns_nanosecond_fields_into_seconds() -> None:
    from counterd.data.units import si_fields

    row = {"F_ns": 2_500_000.0, "time_ns": 1000, "F1_ns": None, "H": 7, "flag_ns": True,
           "superstep": "0:fill"}
    assert si_fields(row) == {"F_s": 0.0025, "time_s": 1e-6, "F1_s": None, "H": 7,
                              "flag_s": True, "superstep": "0:fill"}
