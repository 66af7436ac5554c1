"""One run across nodes from several records files (issue 32 item 4, the file convention).

``counterd report --records a.jsonl b.jsonl ...`` and ``counterd runs --records ...``: each
file holds one node's records (or several nodes', gathered from a shared spool) and the clock
domain of the node that recorded it (:mod:`counterd.data.clocks`). Per run, per superstep:

* each processor's own work (its end minus its begin, one node's CLOCK_MONOTONIC: exact), per
  node the slowest, and the slowest of all (exact);
* node-to-node imbalance: the slowest node's work over the mean of the nodes' slowest work;
* the span across nodes (the last end minus the first begin), the nodes' timestamps mapped to
  CLOCK_REALTIME through their anchors, with the error bound of that mapping plus the realtime
  clocks' disagreement between nodes (0 on one kernel; else each node's sync bound). Where the
  bound is over :data:`UNCERTAIN_SHARE` of the span, or unknown, the span is said to be
  uncertain rather than printed as a confident number;
* the ranks of the run missing from the superstep, by number.

Records are keyed by (run id, node, rank, superstep index, pid): a record given twice (the
same file copied, gathered twice) counts once; two different records under one key are
counted as conflicts and the first kept. A later shipper to a central store can be idempotent
on the same key.

Files are read a line at a time; what is kept is per superstep, node and rank (two times).
"""

from __future__ import annotations

import datetime
import json
import os
import stat
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from counterd.data.clocks import ClockDomain
from counterd.data.errors import BadInput
from counterd.data.jobid import JOB_WIDE, SOURCES
from counterd.data.records import SuperstepRecord, read_jsonl
from counterd.data.units import NS_PER_S, seconds

UNCERTAIN_SHARE = 0.25  # a span whose clock bound is over this share of it is not printed bare
MAX_FILES = 4096
# Ranks 0..max count as the run's (MPI numbering: a gap is a missing rank) where the numbering
# is dense enough: max below 16 x the ranks seen + 64 (a file claiming rank 2^31 alone does not
# make two billion ranks missing). At most MAX_MISSING_LISTED missing ranks are kept per
# superstep, with their count.
MAX_MISSING_LISTED = 64
REPORT_FORMAT = "counterd-cross-node-report"
REPORT_VERSION = 1

# (run id, node, rank, superstep index, pid): one record's identity across files and stores.
RecordKey = tuple[str, str, int, int, int]


def record_key(r: SuperstepRecord) -> RecordKey:
    return (r.run_id, r.host, r.rank, r.index, r.pid)


@dataclass(frozen=True)
class NodeStep:
    """One node's part of one superstep."""

    node: str
    ranks: tuple[int, ...]
    slowest_work_ns: int | None  # None: a rank of it never ended the superstep
    slowest_rank: int | None
    incomplete: tuple[int, ...]  # ranks whose record has no end


@dataclass(frozen=True)
class CrossStep:
    index: int
    name: str
    nodes: tuple[NodeStep, ...]
    missing: tuple[int, ...]  # ranks of the run without a record of it (the first 64)
    span_ns: int | None  # realtime span estimate; None: not every rank ended, or no anchors
    span_err_ns: int | None  # its bound; None: unknown (see span_note)
    span_note: str  # why the span is uncertain or unknown ("" when it is not)
    missing_count: int = 0  # all of them

    @property
    def slowest_work_ns(self) -> int | None:
        works = [n.slowest_work_ns for n in self.nodes]
        return None if not works or None in works else max(w for w in works if w is not None)

    @property
    def slowest(self) -> tuple[str, int] | None:
        best = None
        for n in self.nodes:
            if n.slowest_work_ns is not None and n.slowest_rank is not None and (
                    best is None or n.slowest_work_ns > best[0]):
                best = (n.slowest_work_ns, n.node, n.slowest_rank)
        return None if best is None else (best[1], best[2])

    @property
    def node_imbalance(self) -> float | None:
        """The slowest node's work over the mean of the nodes' (1.0: balanced)."""
        works = [n.slowest_work_ns for n in self.nodes]
        if len(works) < 2 or None in works:
            return None
        mean = sum(w for w in works if w is not None) / len(works)
        return None if mean <= 0 else max(w for w in works if w is not None) / mean

    @property
    def span_uncertain(self) -> bool:
        if self.span_ns is None:
            return False
        if self.span_err_ns is None:
            return True
        return self.span_err_ns > UNCERTAIN_SHARE * max(self.span_ns, 1)


@dataclass(frozen=True)
class CrossRun:
    run_id: str
    source: str  # a key of counterd.data.jobid.SOURCES
    nodes: tuple[str, ...]
    ranks: tuple[int, ...]
    steps: tuple[CrossStep, ...]
    records: int
    notes: tuple[str, ...]
    start_real_ns: int | None  # the first anchor's realtime
    clock: str = ""  # how the nodes' clocks were aligned, in words

    @property
    def job_wide(self) -> bool:
        return self.source in JOB_WIDE


@dataclass(frozen=True)
class CrossReport:
    sources: tuple[str, ...]
    runs: tuple[CrossRun, ...]
    notes: tuple[str, ...] = ()
    clock_bound_ns: int | None = None


# -- reading ------------------------------------------------------------------------------
@dataclass
class _NodeAcc:
    begin: int | None = None
    end: int | None = None
    ranks: dict[int, dict[int, tuple[int, int | None]]] = field(default_factory=dict)
    open: int = 0  # records of it without an end


@dataclass
class _RunAcc:
    steps: dict[tuple[int, str], dict[tuple[str, int], _NodeAcc]] = field(default_factory=dict)
    records: int = 0
    duplicates: int = 0
    conflicts: int = 0
    domains: dict[tuple[str, int], ClockDomain] = field(default_factory=dict)  # (host, file)


def _check_files(paths: Sequence[Path]) -> None:
    if not paths:
        raise BadInput("no records files given", "give counterd record --out files")
    if len(paths) > MAX_FILES:
        raise BadInput(f"{len(paths)} records files: at most {MAX_FILES}",
                       "gather them into fewer files (cat keeps them valid)")
    seen: dict[tuple[int, int], Path] = {}
    for p in paths:
        try:
            st = os.stat(p)
        except OSError as exc:
            raise BadInput(f"cannot read {p}: {exc.strerror}", "check the path") from None
        if not stat.S_ISREG(st.st_mode):
            raise BadInput(f"{p} is not a regular file", "give counterd record --out files")
        ident = (st.st_dev, st.st_ino)
        if ident in seen:
            raise BadInput(f"{p} is given twice (also as {seen[ident]})",
                           "give each node's file once")
        seen[ident] = p


def build(paths: Sequence[Path], *, clock_bound_ns: int | None = None) -> CrossReport:
    """The cross-node report of the records files ``paths``. ``clock_bound_ns``: the site's
    declared bound on two nodes' CLOCK_REALTIME disagreement, for nodes whose kernel stated
    none (None: such nodes' spans are unknown)."""
    _check_files(paths)

    def part(path: Path) -> tuple[str, Iterable[SuperstepRecord], list[ClockDomain]]:
        domains: list[ClockDomain] = []  # filled as its records are read
        return str(path), read_jsonl(path, domains), domains

    return build_parts([part(p) for p in paths], clock_bound_ns=clock_bound_ns)


def build_parts(parts: Sequence[tuple[str, Iterable[SuperstepRecord], list[ClockDomain]]], *,
                clock_bound_ns: int | None = None) -> CrossReport:
    """The cross-node report of ``parts`` already read: each (its name, its records, its clock
    domains), one part as one records file (:func:`build`). The domains are read after the
    records are iterated."""
    return build_rows([(name, _rows(records), domains) for name, records, domains in parts],
                      clock_bound_ns=clock_bound_ns)


# One record as the report across nodes reads it: (run id, host, superstep index, superstep
# name, rank, pid, begin_ns, end_ns (None: it never ended)), the fields of a SuperstepRecord.
Row = tuple[str, str, int, str, int, int, int, int | None]


def _rows(records: Iterable[SuperstepRecord]) -> Iterator[Row]:
    for r in records:
        yield (r.run_id, r.host, r.index, r.name, r.rank, r.pid, r.begin_ns, r.end_ns)


def build_rows(parts: Sequence[tuple[str, Iterable[Row], list[ClockDomain]]], *,
               clock_bound_ns: int | None = None) -> CrossReport:
    """:func:`build_parts` of records given as their :data:`Row` (valid records' fields: the
    central store's rows, :mod:`counterd.central.reader`, without a record object each)."""
    runs: dict[str, _RunAcc] = {}
    notes: list[str] = []
    for fi, (path, rows, domains) in enumerate(parts):
        hosts_of_run: dict[str, set[str]] = {}
        last: str | None = None
        run: _RunAcc | None = None
        hosts: set[str] = set()
        for run_id, host, index, name, rank, pid, begin, end in rows:
            if run is None or run_id != last:  # a part is mostly one run's: looked up anew
                run = runs.get(run_id)  # when the run id changes
                if run is None:
                    run = runs[run_id] = _RunAcc()
                hosts = hosts_of_run.setdefault(run_id, set())
                last = run_id
            hosts.add(host)
            run.records += 1
            nodes = run.steps.get((index, name))
            if nodes is None:
                nodes = run.steps[(index, name)] = {}
            acc = nodes.get((host, fi))
            if acc is None:
                acc = nodes[(host, fi)] = _NodeAcc()
            _put(run, acc, rank, pid, begin, end)
        by_key: dict[tuple[str, str], ClockDomain] = {}
        unused = 0
        for d in domains:
            old = by_key.get((d.run_id, d.host))
            if old is not None and old.key != d.key:
                raise BadInput(f"{path}: two clock domains for run {d.run_id!r:.40} on host "
                               f"{d.host!r:.40} (boot {old.boot_id} and {d.boot_id})",
                               "give each node's records in a file of their own")
            by_key[(d.run_id, d.host)] = d
            if d.host not in hosts_of_run.get(d.run_id, set()):
                unused += 1
                continue
            runs[d.run_id].domains[(d.host, fi)] = d
        if unused:
            notes.append(f"{path}: {unused} clock domain(s) name a run or host without records "
                         "in this file (ignored: a domain anchors its own file's records only)")
    return CrossReport(tuple(name for name, _, _ in parts),
                       tuple(_finish(rid, acc, clock_bound_ns)
                             for rid, acc in sorted(runs.items())),
                       tuple(notes), clock_bound_ns)


def _put(run: _RunAcc, acc: _NodeAcc, rank: int, pid: int, begin: int, end: int | None) -> None:
    """One record's times into its node's part of a superstep, once per key."""
    pids = acc.ranks.setdefault(rank, {})
    old = pids.get(pid)
    if old is not None:
        if old == (begin, end):
            run.duplicates += 1
        else:
            run.conflicts += 1
        return
    pids[pid] = (begin, end)
    acc.begin = begin if acc.begin is None else min(acc.begin, begin)
    if end is None:
        acc.open += 1
    else:
        acc.end = end if acc.end is None else max(acc.end, end)


def _merge_nodes(run: _RunAcc, names: dict[tuple[str, int], str]) -> None:
    """The parts of one node read from several files (one clock domain: the same file given
    under two names, or gathered twice) merged into one, keyed by the first file's; records
    under one key counted once."""
    first: dict[str, tuple[str, int]] = {}
    for key in sorted(names):
        first.setdefault(names[key], key)
    if len(first) == len(names):  # a node read from one file each: nothing to merge
        return
    for step, nodes in run.steps.items():
        merged: dict[tuple[str, int], _NodeAcc] = {}
        for key, acc in sorted(nodes.items()):
            into = first[names[key]]
            if into not in merged:
                merged[into] = acc if key == into else _NodeAcc()
            if key != into or merged[into] is not acc:
                for rank, pids in acc.ranks.items():
                    for pid, (b, e) in pids.items():
                        _put(run, merged[into], rank, pid, b, e)
        run.steps[step] = merged


def _node_names(run: _RunAcc) -> dict[tuple[str, int], str]:
    """(host, file) -> the node's name: its host, told apart by clock domain where one host
    name comes with several (two machines of one name, or one rebooted between files; the
    files of a host without a domain are one node)."""
    keys = {k for nodes in run.steps.values() for k in nodes}
    by_host: dict[str, dict[object, list[tuple[str, int]]]] = {}
    for host, fi in sorted(keys):
        d = run.domains.get((host, fi))
        by_host.setdefault(host, {}).setdefault(d.key if d else ("no domain", ""), []).append(
            (host, fi))
    names: dict[tuple[str, int], str] = {}
    for host, groups in by_host.items():
        for n, members in enumerate(groups.values()):
            for k in members:
                names[k] = host if len(groups) == 1 else f"{host}#{n + 1}"
    return names


def _finish(run_id: str, acc: _RunAcc, clock_bound_ns: int | None) -> CrossRun:
    names = _node_names(acc)
    _merge_nodes(acc, names)
    notes: list[str] = []
    doms = list(acc.domains.values())
    sources = {d.run_id_source for d in doms}
    source = next(iter(sources)) if len(sources) == 1 else "unknown"
    if len(sources) > 1:
        notes.append("the nodes' files disagree on where the run id came from: "
                     + ", ".join(sorted({d.run_id_source for d in doms})))
    nodes = sorted(set(names.values()))
    if source == "node":
        notes.append("the run id is node-local (" + SOURCES["node"] + "): ranks of this job on "
                     "other nodes are under other run ids; record with counterd record -- "
                     "mpiexec, or give every rank COUNTERD_RUN_ID")
    elif source == "unknown" and not doms:
        notes.append("no clock domain in its files (records of an older counterd, or not "
                     "from counterd record): its nodes' clocks cannot be aligned")
    unanchored = sorted({names[k] for k in names if k not in acc.domains})
    if unanchored and doms:
        notes.append("no clock domain for " + ", ".join(unanchored) + ": spans across them "
                     "are unknown (their records came through another node's file)")
    boots = {d.boot_id for d in doms}
    one_kernel = len(boots) == 1 and "" not in boots
    unbound = sorted({names[k] for k, d in acc.domains.items()
                      if not one_kernel and d.sync_bound_ns is None and clock_bound_ns is None})
    if unbound:
        notes.append("the realtime clocks of " + ", ".join(unbound) + " stated no sync bound "
                     "(not synchronised, or not stated): give the site's NTP/PTP bound with "
                     "--clock-bound to have spans across nodes")
    if acc.duplicates:
        notes.append(f"{acc.duplicates} records given twice (same key, same times): counted "
                     "once")
    if acc.conflicts:
        notes.append(f"{acc.conflicts} records conflict with another of the same run, node, "
                     "rank, superstep and pid (other times): the first read was kept")
    all_ranks = sorted({rank for nodes_ in acc.steps.values() for a in nodes_.values()
                        for rank in a.ranks})
    expected = set(all_ranks)
    if all_ranks and 0 <= all_ranks[0] and all_ranks[-1] < 16 * len(all_ranks) + 64:
        expected |= set(range(all_ranks[-1] + 1))  # ranks 0..max: a gap is a missing rank
    steps = []
    outside = False
    for (index, name), per_node in sorted(acc.steps.items()):
        present: set[int] = set()
        rows = []
        for key, a in sorted(per_node.items(), key=lambda kv: names[kv[0]]):
            present.update(a.ranks)
            works: dict[int, int | None] = {}
            for rank, pids in a.ranks.items():
                if len(pids) == 1:  # one process a rank: its work
                    for b, e in pids.values():
                        works[rank] = None if e is None else e - b
                    continue
                ds = [None if e is None else e - b for b, e in pids.values()]
                works[rank] = None if None in ds else max(d for d in ds if d is not None)
            if a.open:
                incomplete = tuple(sorted(r for r, w in works.items() if w is None))
                done = {r: w for r, w in works.items() if w is not None}
            else:  # every rank ended it
                incomplete, done = (), cast("dict[int, int]", works)
            slow = max(done, key=done.__getitem__) if done else None
            rows.append(NodeStep(names[key], tuple(sorted(works)),
                                 None if incomplete or slow is None else done[slow],
                                 slow, incomplete))
        span, err, note, out_ = _span(per_node, acc, names, one_kernel, clock_bound_ns)
        outside = outside or out_
        missing = sorted(expected - present)
        steps.append(CrossStep(index, name, tuple(rows), tuple(missing[:MAX_MISSING_LISTED]),
                               span, err, note, len(missing)))
    if outside:
        notes.append("some supersteps lie outside their node's anchors (before the first or "
                     "after the last): a clock step there would go unseen")
    start = min((d.anchors[0].real_ns for d in doms), default=None)
    if not doms:
        clock = "not aligned (no clock domains)"
    elif one_kernel:
        clock = (f"{len({d.key for d in doms})} monotonic clock(s) on one kernel (one boot id): "
                 "CLOCK_REALTIME is shared; the bound is the anchors' read intervals and any "
                 "clock step between anchors")
    else:
        clock = (f"{len(boots)} kernels: the bound adds each node's realtime sync bound (its "
                 "kernel's adjtimex maxerror, else --clock-bound) to the anchors' read "
                 "intervals and clock steps")
    return CrossRun(run_id, source, tuple(nodes), tuple(all_ranks), tuple(steps),
                    acc.records - acc.duplicates, tuple(notes), start, clock)


def _span(per_node: dict[tuple[str, int], _NodeAcc], acc: _RunAcc,
          names: dict[tuple[str, int], str], one_kernel: bool, clock_bound_ns: int | None
          ) -> tuple[int | None, int | None, str, bool]:
    """(span, its bound, why uncertain or unknown, whether a time lay outside its anchors)."""
    begins: list[tuple[int, int | None]] = []
    ends: list[tuple[int, int | None]] = []
    outside = False
    no_domain: list[str] = []
    for key, a in per_node.items():
        d = acc.domains.get(key)
        if a.begin is None:
            continue
        if a.end is None or a.open:
            return None, None, "not every rank ended it", False
        if d is None:
            no_domain.append(names[key])
            continue
        real_bound = 0 if one_kernel else (d.sync_bound_ns if d.sync_bound_ns is not None
                                           else clock_bound_ns)
        b, be, bin_ = d.to_real(a.begin)
        e, ee, ein = d.to_real(a.end)
        outside = outside or not (bin_ and ein)
        begins.append((b, None if real_bound is None else be + real_bound))
        ends.append((e, None if real_bound is None else ee + real_bound))
    if no_domain:
        return None, None, "no clock domain for " + ", ".join(sorted(no_domain)), outside
    if not begins:
        return None, None, "no records", outside
    span = max(e for e, _ in ends) - min(b for b, _ in begins)
    errs = [u for _, u in begins + ends]
    if None in errs:
        return span, None, "a node's realtime clock has no sync bound (--clock-bound)", outside
    err = max(u for _, u in ends if u is not None) + max(u for _, u in begins if u is not None)
    note = ""
    if err > UNCERTAIN_SHARE * max(span, 1):
        note = (f"the clock alignment's bound is {err / max(span, 1):.0%} of the span "
                "(over 25%)")
    return span, err, note, outside


# -- rendering ------------------------------------------------------------------------------
def _t(ns: int | None) -> str:
    return "-" if ns is None else seconds(ns / NS_PER_S)


def span_text(s: CrossStep) -> str:
    if s.span_ns is None:
        return "unknown"
    if s.span_err_ns is None:
        return f"uncertain (~{_t(s.span_ns)}, bound unknown)"
    text = f"{_t(s.span_ns)} +- {_t(s.span_err_ns)}"
    return f"uncertain ({text})" if s.span_uncertain else text


def _ranks(ranks: Sequence[int]) -> str:
    """Ranks as ranges: 0-3,7."""
    groups: list[list[int]] = []
    for r in sorted(set(ranks)):
        if groups and groups[-1][1] == r - 1:
            groups[-1][1] = r
        else:
            groups.append([r, r])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in groups) or "-"


def render_text(rep: CrossReport) -> str:
    out = ["counterd report across nodes: " + ", ".join(rep.sources)]
    out += [f"note: {n}" for n in rep.notes]
    ranks_of: dict[tuple[int, ...], str] = {}  # a node's ranks, mostly alike every superstep
    for run in rep.runs:
        start = "" if run.start_real_ns is None else ", started " + datetime.datetime.fromtimestamp(
            run.start_real_ns / NS_PER_S, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        out += ["", f"run {run.run_id} ({SOURCES[run.source]}): {len(run.nodes)} nodes "
                    f"({', '.join(run.nodes)}), ranks {_ranks(run.ranks)}, "
                    f"{len(run.steps)} supersteps, {run.records} records{start}"]
        out.append(f"  clocks: {run.clock}")
        out += [f"  note: {n}" for n in run.notes]
        out.append(f"  {'#':>4} {'superstep':<20} {'nodes':>5} {'slowest work':>12} "
                   f"{'on':<16} {'node imb':>8}  span across nodes (realtime, +- bound)")
        for s in run.steps:
            slow = s.slowest
            imb = s.node_imbalance
            out.append(f"  {s.index:>4} {s.name[:20]:<20} {len(s.nodes):>5} "
                       f"{_t(s.slowest_work_ns):>12} "
                       f"{(f'{slow[0]} r{slow[1]}' if slow else '-')[:16]:<16} "
                       f"{'-' if imb is None else f'{imb:.2f}':>8}  {span_text(s)}"
                       + (f"  [{s.span_note}]" if s.span_note else ""))
            for n in s.nodes:
                extra = f", never ended: {_ranks(n.incomplete)}" if n.incomplete else ""
                ranks = ranks_of.get(n.ranks)
                if ranks is None:
                    ranks = ranks_of[n.ranks] = _ranks(n.ranks)
                out.append(f"  {'':>4}   {n.node[:24]:<24} ranks {ranks:<12} "
                           f"slowest work {_t(n.slowest_work_ns)}"
                           + (f" (rank {n.slowest_rank})" if n.slowest_rank is not None
                              else "") + extra)
            if s.missing:
                more = s.missing_count - len(s.missing)
                out.append(f"  {'':>4}   missing ranks: {_ranks(s.missing)}"
                           + (f" and {more} more" if more else ""))
    if not rep.runs:
        out.append("no records")
    out += ["", "work: a processor's own end minus begin on its node's clock (exact); node imb: "
                "the slowest node's work over the mean node's; span: the last end minus the "
                "first begin across nodes, each node's clock mapped to realtime through its "
                f"anchors, with the bound of that mapping (uncertain: bound over "
                f"{UNCERTAIN_SHARE:.0%} of the span, or unknown)"]
    return "\n".join(out) + "\n"


def to_json(rep: CrossReport) -> dict[str, Any]:
    def s_(ns: int | None) -> float | None:
        return None if ns is None else ns / NS_PER_S

    return {
        "format": REPORT_FORMAT, "version": REPORT_VERSION, "sources": list(rep.sources),
        "notes": list(rep.notes), "clock_bound_s": s_(rep.clock_bound_ns),
        "runs": [{
            "run_id": r.run_id, "run_id_source": r.source, "job_wide": r.job_wide,
            "nodes": list(r.nodes), "ranks": list(r.ranks), "records": r.records,
            "notes": list(r.notes), "start_realtime_s": s_(r.start_real_ns),
            "clocks": r.clock,
            "supersteps": [{
                "index": s.index, "name": s.name, "slowest_work_s": s_(s.slowest_work_ns),
                "slowest": None if s.slowest is None else
                {"node": s.slowest[0], "rank": s.slowest[1]},
                "node_imbalance": s.node_imbalance, "span_s": s_(s.span_ns),
                "span_bound_s": s_(s.span_err_ns), "span_uncertain": s.span_uncertain,
                "span_note": s.span_note, "missing_ranks": list(s.missing),
                "missing_count": s.missing_count,
                "nodes": [{"node": n.node, "ranks": list(n.ranks),
                           "slowest_work_s": s_(n.slowest_work_ns),
                           "slowest_rank": n.slowest_rank, "incomplete_ranks": list(n.incomplete)}
                          for n in s.nodes]} for s in r.steps]} for r in rep.runs]}


def render_json(rep: CrossReport) -> str:
    return json.dumps(to_json(rep), indent=2) + "\n"


def render_csv(rep: CrossReport) -> str:
    import csv
    import io

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["run_id", "index", "superstep", "node", "ranks", "node_slowest_work_s",
                "slowest_work_s", "node_imbalance", "span_s", "span_bound_s", "span_uncertain",
                "missing_ranks"])
    for r in rep.runs:
        for s in r.steps:
            for n in s.nodes:
                w.writerow([r.run_id, s.index, s.name, n.node, _ranks(n.ranks),
                            "" if n.slowest_work_ns is None else n.slowest_work_ns / NS_PER_S,
                            "" if s.slowest_work_ns is None else s.slowest_work_ns / NS_PER_S,
                            "" if s.node_imbalance is None else s.node_imbalance,
                            "" if s.span_ns is None else s.span_ns / NS_PER_S,
                            "" if s.span_err_ns is None else s.span_err_ns / NS_PER_S,
                            int(s.span_uncertain), _ranks(s.missing)])
    return buf.getvalue()


def render(rep: CrossReport, fmt: str) -> str:
    renderers = {"text": render_text, "json": render_json, "csv": render_csv}
    if fmt not in renderers:
        raise BadInput(f"the report across nodes has no {fmt} format",
                       "choose --format text, json or csv")
    return renderers[fmt](rep)


def render_runs(rep: CrossReport, as_json: bool = False) -> str:
    """``counterd runs --records``: the runs of the files, across nodes."""
    if as_json:
        return json.dumps([{"run_id": r.run_id, "run_id_source": r.source,
                            "job_wide": r.job_wide, "nodes": list(r.nodes),
                            "ranks": len(r.ranks), "supersteps": len(r.steps),
                            "records": r.records, "notes": list(r.notes)}
                           for r in rep.runs], indent=2) + "\n"
    if not rep.runs:
        return "no runs in " + ", ".join(rep.sources) + "\n"
    out = [f"{'run':<28} {'run id from':<12} {'nodes':>5} {'ranks':>5} {'supersteps':>10} "
           f"{'records':>8}  notes"]
    for r in rep.runs:
        out.append(f"{r.run_id[:28]:<28} {r.source:<12} {len(r.nodes):>5} {len(r.ranks):>5} "
                   f"{len(r.steps):>10} {r.records:>8}  {len(r.notes) or ''}")
    return "\n".join(out) + "\n"


def is_cross_node(paths: Iterable[Path]) -> bool:
    """Whether ``paths`` need the report across nodes: more than one file."""
    return len(list(paths)) > 1
