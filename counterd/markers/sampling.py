"""Sampling of short supersteps (issue 13): counters read for 1 in k, the others estimated.

A marker pair costs a few microseconds, most of it the two reads of the counter group; on a
superstep of tens of microseconds that is a large share (``counterd report`` says how large).
With sampling on (``configure(sample=...)``, ``COUNTERD_SAMPLE=50us:10`` or ``counterd record
--sample 50us:10``), once a superstep of some name on some processor (thread) took less than
the threshold, the counters of only every k-th following superstep of that name are read.
Every superstep keeps its record and its own measured times; the counters of one whose counters
were not read are the last measured superstep's of the same name and processor, scaled by the
ratio of the two supersteps' times, with source ``sampled`` and the record flagged ``sampled``.
A measured superstep at or above the threshold ends the sampling of its name until a short one
comes again. Only measured counters are sampled (perf, papi): a simulator's are not. Rescaling
by time assumes a name's supersteps do the same work per unit time, which is what makes them one
kind of superstep; the records say which values rest on it.

The compiled hot path (counterd/_native/hotpath_src/) makes the same decisions and writes the same
values; this module is the Python path's and the definition of both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from counterd.data.errors import BadInput
from counterd.data.events import CounterValue, Source
from counterd.data.units import duration_ns

MAX_EVERY = 1 << 20
# Superstep names one processor keeps sampling state for; beyond them every superstep is read
# (names that never repeat, "iter 17", would otherwise grow it without bound, and are never
# sampled anyway).
MAX_NAMES = 4096


class Sampling(NamedTuple):
    """Read the counters of 1 in ``every`` supersteps shorter than ``below_ns``."""

    below_ns: int
    every: int

    @classmethod
    def parse(cls, text: str, where: str = "the sampling option") -> Sampling | None:
        """``"<duration>:<k>"`` (``50us:10``); ``""``, ``off`` or ``k`` = 1: no sampling."""
        if text.strip() in ("", "off"):
            return None
        below, sep, every = text.partition(":")
        try:
            if not sep:
                raise ValueError("no ':'")
            k = int(every)
            sampling = cls(duration_ns(below), k)
            if not 1 <= k <= MAX_EVERY:
                raise ValueError(f"k = {k} is not in 1..{MAX_EVERY}")
        except ValueError as exc:
            raise BadInput(f"{where} {text!r} is not <duration>:<k> ({exc})",
                           "write e.g. 50us:10 (read the counters of 1 in 10 supersteps "
                           "shorter than 50 us), or off") from None
        return sampling if k > 1 and sampling.below_ns > 0 else None


class NameState:
    """What one processor's sampling knows of one superstep name."""

    __slots__ = ("countdown", "values", "time_ns", "unsupported")

    def __init__(self) -> None:
        self.countdown = 0  # supersteps still to estimate before the next read
        self.values: Mapping[str, float] = {}  # the last measured superstep's counters
        self.time_ns = 0  # ... its time
        self.unsupported: Mapping[str, str] = {}  # ... and the counters its group could not count

    def measured(self, values: Mapping[str, CounterValue], unsupported: Mapping[str, str],
                 time_ns: int, sampling: Sampling) -> None:
        """A superstep of this name was measured: the next ``every - 1`` are estimated if it
        was short."""
        self.values = {name: v.value for name, v in values.items()}
        self.unsupported, self.time_ns = unsupported, time_ns
        self.countdown = sampling.every - 1 if time_ns < sampling.below_ns else 0

    def basis(self) -> Basis:
        return Basis(self.values, self.time_ns, self.unsupported)

    def skip(self) -> bool:
        """Whether the superstep beginning now is estimated rather than read."""
        if self.countdown > 0 and self.time_ns > 0:
            self.countdown -= 1
            return True
        return False


class Basis(NamedTuple):
    """What a superstep whose counters were not read is estimated from: the last measured
    superstep of its name's counter values, its time (> 0) and its group's unsupported
    counters."""

    values: Mapping[str, float]
    time_ns: int
    unsupported: Mapping[str, str]

    def estimate(self, time_ns: int) -> dict[str, CounterValue]:
        """The counters of a superstep of ``time_ns`` (ratio 1: nothing was scheduled)."""
        scale = time_ns / self.time_ns
        return {name: CounterValue(v * scale, Source.SAMPLED, 1.0, None)
                for name, v in self.values.items()}
