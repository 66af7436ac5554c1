"""The per-superstep report model (``counterd report``): :class:`Report`, its rows and counters.

Per superstep, three times (:class:`counterd.data.records.Superstep` defines each; this module folds
the records as they stream past and gets the same numbers):

* **work**: the slowest processor's own time in the superstep, its end minus its begin
  (``Superstep.slowest_work_ns``). This is what the cost function F predicts, and the
  measured time T of the error ratio.
* **span**: max end - min begin over the processors (``Superstep.time_ns``, DESIGN.md
  section 3): the elapsed time of the superstep in the run. It is the work plus at most the
  start skew: the time the processors that began first spent before the last one began.
* **start skew**: the last processor's begin minus the first one's (``Superstep.skew_ns``).

Why F is compared with the work, not the span: Amato, Perdue, Pietracaprina, Pucci and
Mathis, "Predicting Performance on SMPs. A Case Study: The SGI Power Challenge" (Texas A&M
technical report 99-020, 1999), read the cycle counter "as each superstep started and ended"
on each processor, and define F "under the assumption that the running time of a superstep is
determined by one of" the accesses some processor issues to the memory hierarchy (F1, a
maximum over processors), the traffic on the shared bus (F2) or the contention at one memory
bank (F3). Every term prices memory accesses that processors perform inside the superstep;
none prices processors beginning at different times. The paper does not tell the two times
apart: its supersteps are separated by barriers (SGI ``m_sync()``) and it speaks of no start
skew. In a recording the processors can begin a superstep milliseconds apart (a process
setting itself up at its first superstep, a process scheduled late), and what F models is
then the slowest processor's own time, not the span. So E = max(T, P) / min(T, P) (the
paper's error ratio, T measured, P = F) takes T = the work; the span stays in every
rendering beside it.

A superstep whose processors began far apart (start skew over :data:`SKEW_SHARE` of its work
and over :data:`SKEW_FLOOR_NS`) carries the report flag ``start_skew`` (:data:`REPORT_FLAGS`):
its span is mostly waiting for late processors, not cost of the superstep (``shared_cpu``: below).

Per counter the max and sum over processors and the imbalance max/mean; and, when a machine
profile is configured, the predicted F1 (hierarchy), F2 (bus), F3 (bank), F = max(F1, F2,
F3), the BSP bounds the profile provides, the dominating term and the error ratio E.
"""

from __future__ import annotations

import math
import statistics
from array import array
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TypeVar

from counterd.data import units
from counterd.data.errors import BadInput
from counterd.data.events import NAMES, CounterValue, Source
from counterd.data.records import FLAGS, INFO_FLAGS, SHARED_OVERLAP, SuperstepRecord, shared_cpus
from counterd.prediction import NO_PREDICTION_REASONS, PredictFn, Prediction, error_ratio

# A superstep's start skew is flagged when it is over this share of the superstep's work ...
SKEW_SHARE = 0.25
# ... and over this many ns: below it a skew is scheduling noise (a process woken a little
# late), which no superstep can be blamed for.
SKEW_FLOOR_NS = 100_000
START_SKEW = "start_skew"
SHARED_CPU = "shared_cpu"
# Flags the report sets on a row from its times (the records' own flags:
# counterd.data.records.FLAGS).
REPORT_FLAGS = {
    START_SKEW: f"the processors began the superstep far apart (start skew over "
                f"{SKEW_SHARE:.0%} of its work and over {SKEW_FLOOR_NS / 1e6:g} ms): its span "
                "holds up to that much waiting for the late ones, which is not the superstep's "
                "cost; E compares F with the work",
    SHARED_CPU: f"two or more of its processors began it on one CPU, their times overlapping by "
                f"{SHARED_OVERLAP:.0%} of the shorter or more: they took turns on it until the "
                "scheduler moved one (forked processes start on their parent's CPU), each one's "
                "work holding some of the other's; pin each process (os.sched_setaffinity)",
}


def flag_meaning(flag: str) -> str:
    """A flag in plain words (the records' :data:`counterd.data.records.FLAGS`, the report's
    :data:`REPORT_FLAGS`)."""
    return REPORT_FLAGS.get(flag) or FLAGS.get(flag) or flag


def flags_legend(rows: Iterable[StepRow], verbose: bool = False
                 ) -> tuple[list[tuple[str, str]], list[str]]:
    """(flag, meaning) of each flag the rows show (:meth:`StepRow.shown_flags`), and the
    flags left out without ``verbose`` (with the number of rows that carry each)."""
    shown: set[str] = set()
    hidden: dict[str, int] = defaultdict(int)
    for r in rows:
        shown.update(r.shown_flags(verbose))
        for f in r.all_flags - set(r.shown_flags(verbose)):
            hidden[f] += 1
    return ([(f, flag_meaning(f)) for f in sorted(shown)],
            [f"{f} ({n})" for f, n in sorted(hidden.items())])


@dataclass(frozen=True)
class CounterStats:
    max: float
    sum: float
    imbalance: float | None  # max / mean over processors (1 = balanced)
    source: str


@dataclass(frozen=True)
class StepRow:
    index: int
    name: str
    processors: int
    time_ns: int | None  # the span (Superstep.time_ns), None unless every processor ended it
    work_ns: dict[int, int]  # rank -> that processor's own duration
    counters: dict[str, CounterStats]
    flags: frozenset[str]
    prediction: Prediction | None = None
    # Why there is no prediction although a profile was configured ("" otherwise).
    no_prediction: str = ""
    # The costliest marker pair of its processes (SuperstepRecord.marker_ns), None if unknown.
    marker_ns: int | None = None
    # The last processor's begin minus the first one's (Superstep.skew_ns).
    skew_ns: int = 0
    # rank -> what its body raised (SuperstepRecord.exception; the flag exception), if kept.
    exceptions: dict[int, str] = field(default_factory=dict)
    shared_cpus: frozenset[int] = frozenset()  # CPUs its processors shared (records.shared_cpus)

    # The longest exception text the text and HTML tables show in a row (the legend of the
    # HTML has it whole; the JSON and CSV always).
    SHORT_EXCEPTION = 60

    def exception_note(self, short: bool = True) -> str:
        """What the row's body raised, for the flag ``exception`` in the text and HTML: the
        lowest rank's text (cut to :data:`SHORT_EXCEPTION` with ``short``), and which ranks
        raised where the superstep has several processors; "" when none was kept."""
        if not self.exceptions:
            return ""
        first = min(self.exceptions)
        text = self.exceptions[first]
        if short and len(text) > self.SHORT_EXCEPTION:
            text = text[:self.SHORT_EXCEPTION - 3] + "..."
        if self.processors > 1:
            ranks = sorted(self.exceptions)
            others = len(set(self.exceptions.values())) > 1
            text += f" (rank{'s' if len(ranks) > 1 else ''} " + ", ".join(map(str, ranks)) \
                + (f"; rank {first}'s" if others else "") + ")"
        return text

    @property
    def slowest_work_ns(self) -> int | None:
        """The slowest processor's own time (Superstep.slowest_work_ns): what F predicts;
        None unless every processor ended the superstep."""
        if self.time_ns is None or not self.work_ns:
            return None
        return max(self.work_ns.values())

    @property
    def skewed(self) -> bool:
        """Whether the start skew is large: over :data:`SKEW_SHARE` of the work and over
        :data:`SKEW_FLOOR_NS` (the row then carries the flag ``start_skew``)."""
        work = self.slowest_work_ns
        return work is not None and self.skew_ns > max(SKEW_SHARE * work, SKEW_FLOOR_NS)

    @property
    def all_flags(self) -> frozenset[str]:
        """The records' flags and the report's own (:data:`REPORT_FLAGS`)."""
        own = {f for f, on in ((START_SKEW, self.skewed), (SHARED_CPU, self.shared_cpus)) if on}
        return self.flags | own if own else self.flags

    def shown_flags(self, verbose: bool = False) -> list[str]:
        """The flags a reader of the text or HTML report sees on this row: those that change
        what to believe about it; with ``verbose``, every one (:data:`INFO_FLAGS` describe
        where the numbers come from, the legend says how)."""
        return sorted(self.all_flags if verbose else self.all_flags - INFO_FLAGS)

    @property
    def marker_share(self) -> float | None:
        """The marker pair's cost as a share of the superstep's work (each process pays its
        pair; a span inflated by start skew would understate it): what the measurement adds
        to the run per superstep (begin's counter read falls before the superstep's clock
        starts, end's after it stops: the measured time holds little of it)."""
        work = self.slowest_work_ns
        if self.marker_ns is None or not work:
            return None
        return self.marker_ns / work

    @property
    def error_ratio(self) -> float | None:
        """E = max(T, P) / min(T, P) with T the work (the slowest processor's own time) and
        P = F; the module says why T is not the span."""
        work = self.slowest_work_ns
        if self.prediction is None or work is None:
            return None
        return error_ratio(work / 1e9, self.prediction.total_s)

    @property
    def dominating(self) -> str | None:
        """The term that sets F; none without a prediction or when every term is 0."""
        p = self.prediction
        return None if p is None or max(p.terms_s.values()) <= 0 else p.dominating

    @property
    def slowest_rank(self) -> int | None:
        return max(self.work_ns, key=lambda r: self.work_ns[r]) if self.work_ns else None

    @property
    def time_imbalance(self) -> float | None:
        vals = list(self.work_ns.values())
        if len(vals) < 2 or sum(vals) <= 0:
            return None
        return max(vals) / (sum(vals) / len(vals))


@dataclass(frozen=True)
class Report:
    source: str
    runs: tuple[str, ...]
    hosts: tuple[str, ...]
    backends: tuple[str, ...]
    rows: tuple[StepRow, ...]
    # Where predictions come from (profile, model variant), or why there are none at all.
    prediction_basis: str
    counters: tuple[str, ...] = field(default=())

    @property
    def predicted(self) -> bool:
        return any(r.prediction is not None for r in self.rows)

    @property
    def prediction_note(self) -> str:
        """The basis, then which supersteps have no prediction and why."""
        return self.prediction_basis + "".join(
            f"; no prediction for supersteps {', '.join(map(str, steps))}: {why}"
            for why, steps in self.missing_predictions().items())

    def missing_predictions(self) -> dict[str, list[int]]:
        """Why supersteps have no prediction although a profile was configured: reason ->
        superstep indices."""
        out: dict[str, list[int]] = defaultdict(list)
        for r in self.rows:
            if r.no_prediction:
                out[r.no_prediction].append(r.index)
        return dict(out)

    def bottlenecks(self) -> dict[str, int]:
        """How many supersteps each term dominates, most frequent first (supersteps without a
        prediction or whose terms are all 0 have none)."""
        doms = [d for r in self.rows if (d := r.dominating) is not None]
        return {t: doms.count(t) for t in sorted(set(doms), key=lambda t: (-doms.count(t), t))}

    @cached_property
    def short_ns(self) -> float:
        """Supersteps whose work is shorter than this are too small a part of the run for
        their imbalance to matter: under 5 % of the total work and under a fifth of the
        average superstep's (the second keeps runs of many equal supersteps in view). Work,
        not span: one superstep's start skew would make every other superstep look short."""
        works = [w for r in self.rows if (w := r.slowest_work_ns) is not None]
        return min(0.05 * sum(works), 0.2 * sum(works) / len(works)) if works else 0.0

    def is_short(self, row: StepRow) -> bool:
        """Whether ``row``'s work is shorter than :attr:`short_ns`."""
        work = row.slowest_work_ns
        return work is not None and work < self.short_ns

    @property
    def simulated(self) -> bool:
        """Whether any counter comes from a cache simulator (the sim or callgrind backend)."""
        return any(c.source == Source.SIMULATED for r in self.rows for c in r.counters.values())

    MARKER_WARN = 0.01  # a marker pair above this share of a superstep is said

    @property
    def marker_shares(self) -> bool:
        """Whether any superstep's marker share is known (records with ``marker_ns``)."""
        return any(r.marker_share is not None for r in self.rows)

    def markers_over(self, r: StepRow) -> bool:
        """Whether the marker pair is over :data:`MARKER_WARN` of superstep ``r``'s time (a
        sampled superstep's markers read no counters: the calibrated pair is not theirs)."""
        m = r.marker_share
        return m is not None and m > self.MARKER_WARN and "sampled" not in r.flags

    def marker_note(self) -> str:
        """One line on the markers' own cost: what a pair costs, and how many supersteps it is
        more than 1% of: there the markers slow the run down noticeably (the measured times
        hold only a small part of it: begin reads the counters before the superstep's clock
        starts, end after it stops); "" when no record carries a calibrated cost."""
        costs = [r.marker_ns for r in self.rows if r.marker_ns is not None]
        sampled = sum("sampled" in r.flags for r in self.rows)
        sampling = (f"; the counters of {sampled} of {len(self.rows)} supersteps are sampled "
                    "(not read: the last measured superstep's of the same name, scaled by "
                    "time)") if sampled else ""
        if not costs:
            return sampling[2:]
        # A sampled superstep's markers read no counters: the calibrated (read) pair's cost
        # is not theirs, so they are not counted against it.
        over = [r for r in self.rows if self.markers_over(r)]
        cost = f"{min(costs) / 1e3:.1f}" + ("" if min(costs) == max(costs) else
                                           f"-{max(costs) / 1e3:.1f}")
        text = f"markers: one begin + end pair costs {cost} us (calibrated in each process)"
        if not over:
            return (text + f"; under {self.MARKER_WARN:.0%} of every "
                    f"{'read ' if sampled else ''}superstep" + sampling)
        worst = max(r.marker_share or 0.0 for r in over)
        hint = "" if sampled or self.simulated else (
            "; sampling reads the counters of only 1 in k short supersteps "
            "(counterd record --sample DURATION:K)")
        read = len(self.rows) - sampled
        return (text + f"; warning: it is over {self.MARKER_WARN:.0%} of the time of "
                f"{len(over)} of {read}{' read' if sampled else ''} supersteps (up to "
                f"{worst:.0%}): the markers "
                "slow the run there (the measured times hold little of it)" + hint + sampling)

    TIMES = ("work = the slowest processor's own time (its end minus its begin), what F "
             "predicts and E compares with; span = max end - min begin over the processors, "
             "the work plus at most the start skew; skew = the last processor's begin minus "
             "the first one's")

    def flagged(self, flag: str) -> list[StepRow]:
        """The rows that carry ``flag`` (the records' or the report's own)."""
        return [r for r in self.rows if flag in r.all_flags]

    def flag_note(self, flag: str) -> str:
        """How many supersteps carry the report's ``flag`` (:data:`REPORT_FLAGS`), which, and
        what it means; "" for none."""
        rows = self.flagged(flag)
        if not rows:
            return ""
        which = ", ".join(str(r.index) for r in rows[:8]) + (", ..." if len(rows) > 8 else "")
        return (f"{len(rows)} of {len(self.rows)} supersteps ({which}) flagged {flag}: "
                + REPORT_FLAGS[flag])

    def error_summary(self, *, rated: bool = False) -> tuple[float, float] | None:
        """Average and maximum E over the predicted supersteps; ``rated``: only those not
        too short to rate (:meth:`is_short`), whose E says little about the run's time."""
        errs = [e for r in self.rows if (e := r.error_ratio) is not None
                and not (rated and self.is_short(r))]
        return (sum(errs) / len(errs), max(errs)) if errs else None

    def worst_error(self) -> StepRow | None:
        """The superstep with the largest E (None without predictions)."""
        rows = [r for r in self.rows if r.error_ratio is not None]
        return max(rows, key=lambda r: r.error_ratio or 0.0) if rows else None

    def error_note(self) -> str:
        """E's average and maximum, which superstep has the maximum, and the same over the
        supersteps not too short to rate where short ones have an E; "" without predictions."""
        summary, worst = self.error_summary(), self.worst_error()
        if summary is None or worst is None:
            return ""
        text = (f"error ratio E = max(T,P)/min(T,P), T the work, P = F: average "
                f"{summary[0]:.2f}, maximum {summary[1]:.2f} (superstep {worst.index} "
                f"{worst.name})")
        short = [r for r in self.rows if r.error_ratio is not None and self.is_short(r)]
        if short:
            rated = self.error_summary(rated=True)
            text += (f"; without the {len(short)} superstep{'s' if len(short) > 1 else ''} "
                     f"whose work is under "
                     f"{units.seconds(self.short_ns / 1e9)} (too short a part of the run): "
                     + ("none left" if rated is None else
                        f"average {rated[0]:.2f}, maximum {rated[1]:.2f}"))
        return text

    @cached_property
    def by_name(self) -> tuple[NameSummary, ...]:
        """Each superstep name (and processor count) with a predicted, complete occurrence, in
        the order of first occurrence (:class:`NameSummary`)."""
        groups: dict[tuple[str, int], list[tuple[int, int, float]]] = {}
        for r in self.rows:
            work = r.slowest_work_ns
            if r.prediction is not None and work is not None and r.prediction.total_s > 0:
                groups.setdefault((r.name, r.processors), []).append(
                    (r.index, work, r.prediction.total_s))
        return tuple(
            NameSummary(name, p, occ[0][0], len(occ), statistics.median(w for _, w, _ in occ),
                        min(w for _, w, _ in occ), max(w for _, w, _ in occ),
                        statistics.median(f for _, _, f in occ),
                        statistics.median(w / 1e9 / f for _, w, f in occ))
            for (name, p), occ in groups.items())

    @property
    def repeated(self) -> bool:
        """Whether some superstep name has several predicted occurrences (the report then
        also judges each name by its median: :attr:`by_name`)."""
        return any(n.occurrences > 1 for n in self.by_name)

    def name_error_summary(self) -> tuple[float, float, NameSummary] | None:
        """Average and maximum E over :attr:`by_name`, and the name with the maximum."""
        rated = [(e, n) for n in self.by_name if (e := n.error_ratio) is not None]
        if not rated:
            return None
        worst = max(rated, key=lambda x: x[0])
        return sum(e for e, _ in rated) / len(rated), worst[0], worst[1]

    def name_error_note(self) -> str:
        """One line on E per superstep name where names repeat; "" otherwise."""
        summary = self.name_error_summary()
        if not self.repeated or summary is None:
            return ""
        return (f"per superstep name, the median of its occurrences' work over F: average E "
                f"{summary[0]:.2f}, maximum {summary[1]:.2f} "
                f"({summary[2].name}); one occurrence's work varies from one to the next, "
                "the median is the superstep's typical time")


@dataclass(frozen=True)
class NameSummary:
    """One superstep name of the run at one processor count, over its predicted, complete
    occurrences (an iterative program runs the same supersteps again and again): the median
    of each occurrence's work over its F, and the medians of the two.

    One occurrence's work on a shared or virtual host varies by tens of percent from one
    occurrence to the next (a neighbour's burst, a late wake-up); the median of several is
    the superstep's typical time, the figure a prediction is fairly judged against (as
    pyperf judges a benchmark by many values, not by one). E is taken from the median ratio,
    not from the two medians, so that occurrences whose F differs (other parameters under
    the same name) are each judged against their own F; where F is the same in every
    occurrence the two agree."""

    name: str
    processors: int
    first_index: int  # the index of its first predicted, complete occurrence
    occurrences: int  # how many were predicted and complete
    work_ns: float  # the median of their work (the slowest processor's own time)
    low_ns: int  # the least and the most work of one occurrence
    high_ns: int
    predicted_s: float  # the median of their F
    ratio: float  # the median of work / F over the occurrences

    @property
    def error_ratio(self) -> float | None:
        """E = max(r, 1/r) of the median ratio r of work to F."""
        return None if self.ratio <= 0 else max(self.ratio, 1 / self.ratio)


_I = TypeVar("_I")


class _RankRow:
    """One processor's part of one superstep, compact: what the report needs of its records.

    A report holds one of these per (superstep, rank) instead of the records (a 200 MB
    records file holds ~180k records; their objects took 1.2 GB). ``counters`` is indexed by
    the report's counter names (:class:`_Steps.names`); NaN marks a counter this rank has not
    reported, which is distinct from 0.
    """

    __slots__ = ("begin_ns", "end_ns", "work_ns", "counters", "cpu")

    def __init__(self, begin_ns: int, cpu: int | None) -> None:
        self.begin_ns = begin_ns
        self.end_ns: int | None = None
        self.work_ns: int | None = None  # the longest of this rank's records (threads)
        self.counters = array("d")
        self.cpu = cpu  # the CPU all its records began on; None: they began on several


class _Step:
    """The aggregate of one superstep's records as they stream past: the same quantities as
    :class:`counterd.data.records.Superstep` (time = max end - min begin, None unless every record
    ended; work per rank = its longest record; start skew = the latest begin minus the
    earliest), without holding the records. ``tests/readers/test_streaming.py`` checks the
    two agree on random record sets."""

    __slots__ = ("run_id", "ranks", "complete", "flags", "sources", "marker_ns",
                 "last_begin_ns", "exceptions")

    def __init__(self, run_id: str, begin_ns: int) -> None:
        self.run_id = run_id
        self.last_begin_ns = begin_ns  # the latest begin of any of its records
        self.ranks: dict[int, _RankRow] = {}
        self.complete = True
        self.flags: frozenset[str] = frozenset()
        self.sources: dict[str, str] = {}
        self.marker_ns: int | None = None
        self.exceptions: dict[int, str] | None = None  # rank -> what it raised, if any did


class _Steps:
    """Records folded into per-superstep aggregates, one record at a time."""

    def __init__(self) -> None:
        self.steps: dict[tuple[int, str], _Step] = {}
        self.names: dict[str, int] = {}  # counter name -> its slot in _RankRow.counters
        self.runs: set[str] = set()
        self.hosts: set[str] = set()
        self.backends: set[str] = set()
        self._interned: dict[object, object] = {}  # flag sets and sources: one object each

    def _intern(self, v: _I) -> _I:
        return self._interned.setdefault(v, v)  # type: ignore[return-value]

    def add(self, r: SuperstepRecord) -> None:
        self.runs.add(r.run_id)
        if r.host:
            self.hosts.add(r.host)
        self.backends.add(r.backend)
        step = self.steps.get((r.index, r.name))
        if step is None:
            step = self.steps[(r.index, r.name)] = _Step(self._intern(r.run_id), r.begin_ns)
        step.last_begin_ns = max(step.last_begin_ns, r.begin_ns)
        row = step.ranks.get(r.rank)
        if row is None:
            row = step.ranks[r.rank] = _RankRow(r.begin_ns, r.cpu)
        elif row.cpu != r.cpu:
            row.cpu = None
        row.begin_ns = min(row.begin_ns, r.begin_ns)
        if r.end_ns is None:
            step.complete = False
        else:
            row.end_ns = r.end_ns if row.end_ns is None else max(row.end_ns, r.end_ns)
            d = r.end_ns - r.begin_ns
            row.work_ns = d if row.work_ns is None else max(row.work_ns, d)
        if r.flags and not r.flags <= step.flags:
            step.flags = self._intern(step.flags | r.flags)
        if r.marker_ns is not None and (step.marker_ns is None or r.marker_ns > step.marker_ns):
            step.marker_ns = r.marker_ns
        if r.exception is not None:  # a rank's threads: the first one kept
            if step.exceptions is None:
                step.exceptions = {}
            step.exceptions.setdefault(r.rank, r.exception)
        for k, cv in r.counters.items():
            slot = self.names.setdefault(k, len(self.names))
            if slot >= len(row.counters):
                row.counters.extend([math.nan] * (slot + 1 - len(row.counters)))
            old = row.counters[slot]
            row.counters[slot] = cv.value if math.isnan(old) else old + cv.value
            step.sources[k] = self._intern(cv.source.value)

    def per_rank(self, step: _Step) -> dict[int, dict[str, float]]:
        """Per rank, its counters summed over its records (absent counters left out)."""
        names = list(self.names)
        return {rank: {names[i]: v for i, v in enumerate(row.counters) if not math.isnan(v)}
                for rank, row in step.ranks.items()}


def _prediction_input(step: _Step, index: int, name: str,
                      per_rank: dict[int, dict[str, float]]) -> list[SuperstepRecord]:
    """One record per rank carrying its summed counters: what a PredictFn reads
    (:func:`counterd.prediction.per_processor` sums per rank, so the sums give its answer)."""
    out = []
    for rank, counters in sorted(per_rank.items()):
        row = step.ranks[rank]
        out.append(SuperstepRecord(
            run_id=step.run_id, index=index, name=name, rank=rank, pid=0, cpu=0,
            begin_ns=row.begin_ns, end_ns=row.end_ns,
            counters={k: CounterValue(v, Source(step.sources[k])) for k, v in counters.items()},
            flags=frozenset() if row.end_ns is not None else frozenset({"incomplete"})))
    return out


def build(records: Iterable[SuperstepRecord], *, predict: PredictFn | None = None,
          prediction_note: str = "", source: str = "") -> Report:
    """The report of ``records``, read once and folded as they come (a generator such as
    :func:`counterd.data.records.read_jsonl` keeps memory to the supersteps, not the records)."""
    acc = _Steps()
    for r in records:
        acc.add(r)
    if not acc.steps:
        raise BadInput(f"no superstep records to report{' in ' + source if source else ''}",
                       "record a run first")
    rows = []
    for (index, name), step in sorted(acc.steps.items()):
        ends = [row.end_ns for row in step.ranks.values() if row.end_ns is not None]
        first_begin = min(row.begin_ns for row in step.ranks.values())
        time_ns = max(ends) - first_begin if step.complete else None
        work = {rank: row.work_ns for rank, row in step.ranks.items()
                if row.work_ns is not None}
        per_rank = acc.per_rank(step)
        counters = {}
        for k in sorted(step.sources, key=_counter_order):
            vals = [v[k] for v in per_rank.values() if k in v]
            total = sum(vals)
            mean = total / len(vals) if vals else 0.0
            counters[k] = CounterStats(max(vals), total, max(vals) / mean if mean > 0 else None,
                                       step.sources[k])
        pred, why = None, ""
        if predict is not None and not step.complete:
            why = NO_PREDICTION_REASONS["incomplete"]
        elif predict is not None:
            try:
                pred = predict(_prediction_input(step, index, name, per_rank))
            except Exception as exc:  # a failing prediction is a missing column, said once
                why = str(exc)
            if pred is None and not why:
                why = "the predictor gave none"
        shared = shared_cpus((row.cpu, row.begin_ns, row.end_ns if step.complete else None)
                             for row in step.ranks.values())
        rows.append(StepRow(index, name, len(step.ranks), time_ns, work, counters,
                            step.flags, pred, why, step.marker_ns,
                            step.last_begin_ns - first_begin, dict(step.exceptions or {}),
                            shared))
    present = tuple(sorted({k for row in rows for k in row.counters}, key=_counter_order))
    note = prediction_note if predict is None else (
        prediction_note or "predictions from the configured profile")
    used = sorted({r.prediction.accuracy_note for r in rows if r.prediction is not None} - {""})
    if used:  # which model variant predicted (chosen by the counters present) and how well
        note += "; model " + "; ".join(used)
    return Report(source, tuple(sorted(acc.runs)), tuple(sorted(acc.hosts)),
                  tuple(sorted(acc.backends)), tuple(rows), note, present)


def _counter_order(name: str) -> tuple[int, str]:
    return (NAMES.index(name) if name in NAMES else len(NAMES), name)
