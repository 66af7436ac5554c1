"""Units of every printed and exported quantity: the one home of how a value is written.

* Text for humans: a time in seconds with the SI prefix that suits the value
  (:func:`seconds`: "1.23 ms", "850 us"), a count as a grouped integer (:func:`count`:
  "7,246,000"); never e-notation. A table's header names the quantity, its values carry the
  unit.
* Machine-readable outputs (CSV, JSON): plain numbers in SI base units, the unit in the column
  or key name (``time_s``, ``F1_s``); counts as integers. A counter kept in nanoseconds
  (``task_clock_ns``) is written in seconds under its SI name (:func:`si_name`,
  :func:`si_value`: ``task_clock_s``).
* Prometheus: names end in the base unit (``_seconds``, ``_total``) and HELP says the unit.

Data only: no imports of counterd's services (the predictor imports this module).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

NS_PER_S = 1e9  # records keep times as integer nanoseconds

_PREFIXES = ((1.0, "s"), (1e-3, "ms"), (1e-6, "us"), (1e-9, "ns"))


_DURATION_UNITS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}


def duration_ns(text: str) -> int:
    """A duration written ``<number><unit>`` (unit ns, us, ms or s; ``50us``, ``0.2ms``) in
    integer nanoseconds. ValueError, saying what is accepted, for anything else."""
    t = text.strip()
    for unit in ("ns", "us", "ms", "s"):  # "s" last: it ends the other three
        if t.endswith(unit):
            try:
                v = float(t[:-len(unit)]) * _DURATION_UNITS[unit]
            except ValueError:
                break
            if math.isfinite(v) and 0 <= v < 2**63:
                return round(v)
            break
    raise ValueError(f"{text!r} is not a duration: write a number and ns, us, ms or s "
                     "(e.g. 50us)")


def _significant(x: float, digits: int = 3) -> str:
    """``x`` to ``digits`` significant digits in positional notation, thousands grouped."""
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    return f"{x:,.{decimals}f}"


def seconds(v_s: float) -> str:
    """A time in seconds with an SI prefix and three significant digits: "1.23 ms", "850 us",
    "1,230 s"; below 1 ns still in ns ("0.500 ns")."""
    if not math.isfinite(v_s):
        return str(v_s)
    v = float(f"{v_s:.3g}")  # rounded first, so 999.6 us is "1.00 ms", not "1,000 us"
    if v == 0:
        return "0 s"
    size = abs(v)
    scale, unit = _PREFIXES[-1]
    for s, u in _PREFIXES:  # (a loop, not next() over a generator: a report calls this for
        if size >= s:  # each node of each superstep)
            scale, unit = s, u
            break
    return f"{_significant(v / scale)} {unit}"


def count(v: float) -> str:
    """A count as a grouped integer: "7,246,000" (a multiplexed estimate is rounded)."""
    return f"{round(v):,}" if math.isfinite(v) else str(v)


def is_time(counter: str) -> bool:
    """Whether a canonical counter holds nanoseconds (``task_clock_ns``); the others count."""
    return counter.endswith("_ns")


def counter_text(counter: str, v: float) -> str:
    """A canonical counter's value for humans: a time with its unit, else a count."""
    return seconds(v / NS_PER_S) if is_time(counter) else count(v)


def si_name(counter: str) -> str:
    """A canonical counter's name in CSV and JSON, where times are seconds: ``task_clock_s``
    for ``task_clock_ns``; a count keeps its name."""
    return counter[:-3] + "_s" if is_time(counter) else counter


def si_value(counter: str, v: float) -> float | int:
    """A canonical counter's value for CSV and JSON: seconds for a time, an integer count."""
    return v / NS_PER_S if is_time(counter) else round(v)


def si_fields(row: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON row with its nanosecond fields (``F_ns``, ``time_ns``) in seconds (``F_s``,
    ``time_s``); every other field as it is."""
    return {(k[:-3] + "_s" if k.endswith("_ns") else k):
            (v / NS_PER_S if k.endswith("_ns") and isinstance(v, (int, float))
             and not isinstance(v, bool) else v)
            for k, v in row.items()}
