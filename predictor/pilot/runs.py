"""The pilot runs a forecast reads: one run's supersteps at one size (:class:`PilotRun`), the
times of a timed run (:class:`Timing`), and the check that the runs line up (:func:`check_runs`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from predictor.errors import BadInput
from predictor.inputs import Step


@dataclass(frozen=True)
class Timing:
    """One superstep of one timed run, its times as :class:`counterd.data.records.Superstep` gives
    them (ns; None where a processor never ended it)."""

    index: int
    name: str
    span_ns: int | None  # Superstep.time_ns: the last processor's end minus the first's begin
    work_ns: int | None  # Superstep.slowest_work_ns: the slowest processor's own time
    skew_ns: int  # Superstep.skew_ns: the last processor's begin minus the first's
    shared_cpu: bool = False  # Superstep.shared_cpus: two processors took turns on one CPU

    @property
    def key(self) -> tuple[int, str]:
        return self.index, self.name


def load_timings(path: Any) -> list[Timing]:
    """The supersteps of a ``counterd record`` file with their span, work and start skew, by
    index (:meth:`counterd.data.records.Superstep.group`); BadInput names a malformed line."""
    from pathlib import Path

    from counterd.data.errors import BadInput as CounterdBadInput
    from counterd.data.records import Superstep, read_jsonl

    try:
        steps = Superstep.group(read_jsonl(Path(path)))
    except CounterdBadInput as exc:  # the predictor's own error type, for its CLI
        raise BadInput(exc.what, exc.fix) from None
    return [Timing(s.index, s.name, s.time_ns, s.slowest_work_ns, s.skew_ns, bool(s.shared_cpus))
            for s in steps]


@dataclass(frozen=True)
class PilotRun:
    """The supersteps of one run of the program at input size ``size``."""

    size: float
    steps: tuple[Step, ...]
    source: str = "<run>"
    # Per step, the span (ns) of every timed run at this size, when the counted run's steps
    # carry their median: the span's extra over the work is taken from these.
    times_ns: tuple[tuple[float, ...], ...] = ()
    # Per step and timed run as in times_ns, the slowest processor's own time (ns): the work
    # time the growth models are fitted on (more samples, the real spread).
    work_ns: tuple[tuple[float, ...], ...] = ()
    # Per step and timed run as in times_ns, whether two of its processors took turns on one
    # CPU (Timing.shared_cpu); empty where not known.
    shared: tuple[tuple[bool, ...], ...] = ()

    def __post_init__(self) -> None:
        for what, per in (("work_ns", self.work_ns), ("shared", self.shared)):
            if per and [len(w) for w in per] != [len(t) for t in self.times_ns]:
                raise ValueError(f"{what} must have one value per timed run, as times_ns")

    def step_times(self, i: int) -> list[float]:
        """The spans of superstep ``i`` (ns), one per timed run."""
        if self.times_ns:
            return list(self.times_ns[i])
        t = self.steps[i].time_ns
        return [float(t)] if t is not None else []

    def step_work(self, i: int) -> list[float]:
        """The slowest processor's own time in superstep ``i`` (ns), one per timed run as
        :meth:`step_times`. Where the run does not have it (a table without begin and end
        times), the span stands for it."""
        if self.work_ns:
            return list(self.work_ns[i])
        w = self.steps[i].meta.get("work_ns")
        if self.times_ns or w is None:
            return self.step_times(i)
        return [float(w)] if self.steps[i].time_ns is not None else []


    def step_shared(self, i: int) -> list[bool]:
        """Whether two processors of superstep ``i`` took turns on one CPU, one per timed run
        as :meth:`step_work`; empty where not known."""
        return list(self.shared[i]) if self.shared else []

    def split_work(self, i: int) -> tuple[list[float], list[float]]:
        """Superstep ``i``'s work times (ns) of the timed runs whose processors took turns on
        one CPU, and of the others (all of them where that is not known)."""
        shared = self.step_shared(i) or [False] * len(self.step_work(i))
        work = self.step_work(i)
        return ([w for w, s in zip(work, shared, strict=True) if s],
                [w for w, s in zip(work, shared, strict=True) if not s])

    def separate(self, i: int) -> PilotRun | None:
        """This run with only the timed runs in which superstep ``i``'s processors did not
        take turns on one CPU (every step's times, and their medians, from those); None where
        there is none; the run itself where it does not know (no :attr:`shared`)."""
        if not self.shared:
            return self
        keep = [k for k, s in enumerate(self.shared[i]) if not s]
        if not keep:
            return None

        def kept(per: tuple[tuple[Any, ...], ...]) -> tuple[tuple[Any, ...], ...]:
            return tuple(tuple(t[k] for k in keep) for t in per)

        times, work = kept(self.times_ns), kept(self.work_ns)
        steps = tuple(replace(s, time_ns=float(np.median(times[j])),
                              meta={**s.meta, "work_ns": float(np.median(work[j]))}
                              if work else s.meta)
                      for j, s in enumerate(self.steps))
        return replace(self, steps=steps, times_ns=times, work_ns=work,
                       shared=kept(self.shared))


def split_name(step: Step) -> tuple[int, str]:
    """(index, name) of a recorded step named ``"index:name"``."""
    head, _, tail = step.name.partition(":")
    return (int(head), tail) if head.isdecimal() else (-1, step.name)


def check_runs(runs: Sequence[PilotRun]) -> list[tuple[int, str]]:
    """The supersteps every run has, as (index, name), after checking what a forecast needs:
    sizes > 0 and not decreasing, three or more distinct sizes, every run with supersteps, and
    the same supersteps (index and name) in every run; BadInput names the run that differs."""
    if not runs:
        raise BadInput("no pilot runs", "give pilot sizes and the runs' records")
    sizes = [r.size for r in runs]
    bad = [r for r in runs if not (math.isfinite(r.size) and r.size > 0)]
    if bad:
        raise BadInput(f"pilot size {bad[0].size!r} of {bad[0].source} is not a size > 0",
                       "give sizes as positive numbers")
    if any(b < a for a, b in zip(sizes, sizes[1:], strict=False)):
        raise BadInput(f"pilot sizes {', '.join(f'{s:g}' for s in sizes)} are not increasing",
                       "give the sizes in increasing order")
    if len(set(sizes)) < 3:
        raise BadInput(f"{len(set(sizes))} distinct pilot sizes; a growth model with a constant "
                       "and one term needs three or more", "give three or more pilot sizes")
    empty = [r for r in runs if not r.steps]
    if empty:
        raise BadInput(f"pilot run {empty[0].source} (n = {empty[0].size:g}) recorded no "
                       "supersteps", "check that the command ran and marks its supersteps")
    first = [split_name(s) for s in runs[0].steps]
    for r in runs[1:]:
        mine = [split_name(s) for s in r.steps]
        if mine != first:
            diff = next((i for i, (a, b) in enumerate(zip(first, mine, strict=False)) if a != b),
                        min(len(first), len(mine)))
            have = mine[diff] if diff < len(mine) else "nothing"
            want = first[diff] if diff < len(first) else "nothing"
            raise BadInput(f"pilot run {r.source} (n = {r.size:g}) has superstep {have} where "
                           f"{runs[0].source} (n = {runs[0].size:g}) has {want}",
                           "pilot runs must have the same supersteps at every size")
    return first
