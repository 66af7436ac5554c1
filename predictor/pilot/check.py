"""``predict --pilot --check``: what the checking runs at the target measured (:class:`Measured`,
:func:`measured`) and a forecast against it (:class:`Comparison`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from predictor.pilot.runs import Timing


@dataclass(frozen=True)
class Measured:
    """One superstep at the target as the checking runs measured it: medians over the runs
    (ns) of the slowest processor's own time, of the span and of the start skew; and in how
    many of the ``runs`` two of its processors took turns on one CPU."""

    work_ns: float
    span_ns: float
    skew_ns: float
    shared_cpu_runs: int = 0
    runs: int = 0

    def to_json(self) -> dict[str, float | int]:
        return {"work_s": self.work_ns * 1e-9, "span_s": self.span_ns * 1e-9,
                "skew_s": self.skew_ns * 1e-9, "shared_cpu_runs": self.shared_cpu_runs,
                "runs": self.runs}


@dataclass(frozen=True)
class Comparison:
    """A forecast (seconds, with its interval) against the time measured for it."""

    forecast_s: float
    lower_s: float
    upper_s: float
    measured_s: float

    @property
    def e(self) -> float | None:
        """E = max(T, P) / min(T, P) (1 is perfect); None unless both are > 0."""
        t, p = self.measured_s, self.forecast_s
        return max(t, p) / min(t, p) if t > 0 and p > 0 else None

    @property
    def inside(self) -> bool:
        return self.lower_s <= self.measured_s <= self.upper_s

    def to_json(self) -> dict[str, Any]:
        return {"forecast_s": self.forecast_s, "interval_s": [self.lower_s, self.upper_s],
                "measured_s": self.measured_s, "E": self.e, "inside": self.inside}


def measured(timed: Sequence[Sequence[Timing]]) -> dict[tuple[int, str], Measured]:
    """The supersteps of the first of the ``timed`` runs, each with the medians over the runs
    of its work (the slowest processor's own time), span and start skew, and how many shared
    a CPU; a superstep that some run lacks or did not end is left out."""
    runs = [{t.key: t for t in ts} for ts in timed]
    out = {}
    for k in runs[0] if runs else {}:
        got = [t for t in (m.get(k) for m in runs)
               if t is not None and t.span_ns is not None and t.work_ns is not None]
        if len(got) == len(runs):
            out[k] = Measured(float(np.median([t.work_ns or 0 for t in got])),
                              float(np.median([t.span_ns or 0 for t in got])),
                              float(np.median([t.skew_ns for t in got])),
                              sum(t.shared_cpu for t in got), len(got))
    return out
