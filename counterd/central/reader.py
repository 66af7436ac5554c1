"""``counterd report --central DSN --run RUN`` and ``counterd runs --central DSN``: the central
store read through the reader's own database role, so row-level security gives each user their
own runs (an administrator's role: everyone's).

A run's records are laid out as the file convention of the report across nodes lays out its
files (one part per node and host with its clock domain: :mod:`counterd.report.nodes`), in
memory, and that report is built from them: the same report for files and for the central
store (:func:`run_files` writes the parts as records files)."""

from __future__ import annotations

import gc
import json
from collections import defaultdict
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path
from typing import Any

from counterd.central import psycopg_module
from counterd.central.schema import SCHEMA_VERSION, CentralError, schema_version
from counterd.data.clocks import Anchor, ClockDomain, kept_anchors
from counterd.data.errors import BadInput
from counterd.data.jobid import source_of
from counterd.data.records import (
    INT32_MAX,
    INT32_MIN,
    MAX_ID_CHARS,
    MAX_NAME_CHARS,
    SuperstepRecord,
    write_jsonl,
)
from counterd.util import strictjson

SOURCE = "central:"  # how the report names a node's part: central:<node>/<host>


@dataclass(frozen=True)
class CentralRun:
    uid: int
    run_id: str
    nodes: int
    hosts: int
    records: int
    supersteps: int
    first_seen_ns: int
    last_seen_ns: int


def connect(dsn: str) -> Any:
    """A read-only connection to the central store (BadInput: unreachable, or not one)."""
    psycopg = psycopg_module()
    try:
        conn = psycopg.connect(dsn, connect_timeout=10, autocommit=True,
                               application_name="counterd-report")
    except psycopg.Error as exc:
        raise BadInput(f"cannot connect to the central store: {' '.join(str(exc).split())}",
                       "check --central DSN (host=... dbname=... user=YOUR_ROLE)") from None
    try:
        conn.execute("SET default_transaction_read_only = on")
        version = schema_version(conn)
    except psycopg.Error as exc:
        conn.close()
        raise BadInput(f"the central store cannot be read: {' '.join(str(exc).split())}",
                       "ask its administrator to make your role a reader (counterd central "
                       "reader ROLE UID)") from None
    if version != SCHEMA_VERSION:
        conn.close()
        raise CentralError(f"the central store has schema version {version}, this counterd "
                           f"reads {SCHEMA_VERSION}",
                           "run counterd central migrate DSN as its owner, or upgrade counterd")
    return conn


def runs(dsn: str) -> list[CentralRun]:
    """The runs this role may read, oldest first."""
    conn = connect(dsn)
    try:
        rows = conn.execute(
            "SELECT r.uid, r.run_id, count(DISTINCT r.node), min(r.first_seen_ns), "
            "max(r.last_seen_ns), "
            "(SELECT count(DISTINCT x.host) FROM counterd.records x WHERE x.uid = r.uid AND "
            " x.run_id = r.run_id), "
            "(SELECT count(*) FROM counterd.records x WHERE x.uid = r.uid AND "
            " x.run_id = r.run_id), "
            "(SELECT count(DISTINCT (x.idx, x.name)) FROM counterd.records x WHERE "
            " x.uid = r.uid AND x.run_id = r.run_id) "
            "FROM counterd.runs r GROUP BY r.uid, r.run_id ORDER BY 4, 2, 1").fetchall()
    finally:
        conn.close()
    return [CentralRun(int(u), str(r), int(n), int(h), int(c), int(s), int(f), int(la))
            for u, r, n, f, la, h, c, s in rows]


def render_runs(rows: list[CentralRun], as_json: bool = False) -> str:
    if as_json:
        return json.dumps([r.__dict__ for r in rows], indent=2) + "\n"
    if not rows:
        return "no runs in the central store that this role may read\n"
    out = [f"{'run':<28} {'uid':>7} {'nodes':>5} {'hosts':>5} {'supersteps':>10} "
           f"{'records':>8}"]
    for r in rows:
        out.append(f"{r.run_id[:28]:<28} {r.uid:>7} {r.nodes:>5} {r.hosts:>5} "
                   f"{r.supersteps:>10} {r.records:>8}")
    return "\n".join(out) + "\n"


def _domain(run_id: str, host: str, row: tuple[Any, ...] | None,
            anchors: list[tuple[int, int, int]]) -> ClockDomain | None:
    """A node's domain as the local store gives it (anchors moved onto the client's
    CLOCK_MONOTONIC by its offset; :meth:`counterd.daemon.store.Store.clock_domain`)."""
    if row is None or row[2] is None:
        return None
    boot, timens, offset, bound = row
    moved = [Anchor(int(m) + int(offset), int(r), int(n)) for m, r, n in anchors]
    moved = [a for a in moved if a.mono_ns >= 0]
    if not moved:
        return None
    return ClockDomain(run_id, host, str(boot), str(timens), kept_anchors(moved),
                       None if bound is None else int(bound), source_of(run_id))


Part = tuple[str, list[SuperstepRecord], list[ClockDomain]]

# A row of counterd.records the report can take as a record of the file convention without
# making one (counterd.data.records.SuperstepRecord's bounds on the fields the report reads): rows
# outside them are made into a record, whose ValueError says what is wrong.
_VALID = ("idx >= 0 AND begin_ns >= 0 AND (end_ns IS NULL OR end_ns >= begin_ns) "
          f"AND rank BETWEEN {INT32_MIN} AND {INT32_MAX} AND pid BETWEEN 0 AND {INT32_MAX} "
          f"AND char_length(name) <= {MAX_NAME_CHARS} AND char_length(host) <= {MAX_ID_CHARS}")


@dataclass(frozen=True)
class _NodePart:
    """One (node, host) of a run: its records (or their rows) and its clock domain."""

    node: str
    host: str
    records: list[Any]  # SuperstepRecord, or counterd.report.nodes.Row
    domains: list[ClockDomain]

    @property
    def name(self) -> str:
        return f"{SOURCE}{self.node}/{self.host}"


def _damaged(run_id: str, node: object, exc: Exception) -> BadInput:
    return BadInput(f"the central store holds a damaged record of run {run_id!r:.80} from "
                    f"node {node!r:.80} ({exc})",
                    "ask its administrator to check that node's shipper")


def _node_parts(dsn: str, run_id: str, uid: int | None, bodies: bool) -> list[_NodePart]:
    """Run ``run_id``'s records (of ``uid``; None: the one uid this role sees it under) and
    clock domains per (node, host), sorted by node and host, each part's records by superstep,
    rank and pid. ``bodies`` False: each record as its :data:`counterd.report.nodes.Row`, the
    row's key and times only (run, host, superstep, name, rank, pid, begin, end; no counters,
    params or cpu), which is all the report across nodes reads: no JSON body parsed, no
    record object made (the report's time went to them)."""
    conn = connect(dsn)
    try:
        uids = [int(u) for (u,) in conn.execute(
            "SELECT DISTINCT uid FROM counterd.runs WHERE run_id = %s"
            + (" AND uid = %s" if uid is not None else "") + " ORDER BY uid",
            (run_id, uid) if uid is not None else (run_id,))]
        if not uids:
            raise BadInput(f"no run {run_id!r:.80} in the central store that this role may read",
                           "list them with counterd runs --central DSN")
        if len(uids) > 1:
            raise BadInput(f"run {run_id!r:.80} exists for uids {', '.join(map(str, uids))}",
                           "name the user with --uid")
        owner = uids[0]
        # unordered: PostgreSQL's sort of the text keys cost more than Python's sort below
        rows = conn.execute(
            "SELECT node, run_id, host, idx, name, rank, pid, begin_ns, end_ns, "
            + ("body" if bodies else f"NOT ({_VALID})") + " FROM counterd.records "
            "WHERE uid = %s AND run_id = %s", (owner, run_id)).fetchall()
        domains = {str(n): (b, t, o, s) for n, b, t, o, s in conn.execute(
            "SELECT node, boot_id, timens, mono_offset_ns, sync_bound_ns FROM "
            "counterd.clock_domains WHERE uid = %s AND run_id = %s", (owner, run_id))}
        anchors: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
        for n, m, r, d in conn.execute(
                "SELECT node, mono_ns, real_ns, read_ns FROM counterd.clock_anchors WHERE "
                "uid = %s AND run_id = %s ORDER BY node, mono_ns", (owner, run_id)):
            anchors[str(n)].append((int(m), int(r), int(d)))
    finally:
        conn.close()
    # by (node, host, idx, rank, pid), unique: the table's key is (uid, run_id, host, pid, idx)
    rows.sort(key=itemgetter(0, 2, 3, 5, 6))
    parts: dict[tuple[str, str], list[Any]] = {}
    incomplete = frozenset({"incomplete"})
    whole = 1 <= len(run_id) <= MAX_ID_CHARS
    for row in rows:
        node, _, host, idx, name, rank, pid, begin, end, extra = row
        key = (node, host)
        part = parts.get(key)
        if part is None:
            part = parts[key] = []
        if bodies or extra or not whole:
            try:
                rec = (SuperstepRecord.from_json(strictjson.loads(str(extra))) if bodies else
                       SuperstepRecord(run_id, idx, name, rank, pid, 0, begin, end, host=host,
                                       flags=incomplete if end is None else frozenset()))
            except (strictjson.Malformed, BadInput, ValueError) as exc:
                raise _damaged(run_id, node, exc) from None
            part.append(rec if bodies else row[1:9])
        else:
            part.append(row[1:9])
    out = []
    for (node, host), records in parts.items():
        domain = _domain(run_id, host, domains.get(node), anchors.get(node, []))
        out.append(_NodePart(str(node), str(host), records,
                             [domain] if domain is not None else []))
    return out


def run_parts(dsn: str, run_id: str, uid: int | None) -> list[Part]:
    """Run ``run_id``'s records (of ``uid``; None: the one uid this role sees it under), one
    part per (node, host) as :func:`counterd.report.nodes.build_parts` takes them: its name
    (``central:<node>/<host>``), its records, its clock domain."""
    return [(p.name, p.records, p.domains) for p in _node_parts(dsn, run_id, uid, True)]


def run_files(dsn: str, run_id: str, uid: int | None, directory: Path) -> list[Path]:
    """Run ``run_id``'s records as records files in ``directory``, one per (node, host), each
    with its clock domain in front (the file convention: :func:`run_parts`). A file's name is
    its order, node and host made safe (``0003-rack_1-n7.jsonl``): a node or host name of any
    characters ("/" included) names a file in ``directory``."""
    paths = []
    for i, p in enumerate(_node_parts(dsn, run_id, uid, True)):
        path = directory / f"{i:04d}-{_safe(p.node)}-{_safe(p.host)}.jsonl"
        write_jsonl(p.records, path, header=[d.to_json() for d in p.domains])
        paths.append(path)
    return paths


def _safe(name: str) -> str:
    return "".join(c if c.isascii() and (c.isalnum() or c in "._") else "_"
                   for c in name[:40]) or "_"


def report(dsn: str, run_id: str, uid: int | None, fmt: str,
           clock_bound_ns: int | None = None) -> str:
    """The report across nodes of central run ``run_id`` in ``fmt``."""
    from counterd.report import nodes

    # The rows, the report's accumulators and its lines are some 10 objects a record, none in
    # a cycle: the cyclic collector, run every 700 allocations, made 177 passes for 16,000
    # records, freed 20 objects and took about a tenth of the report's time.
    collecting = gc.isenabled()
    gc.disable()
    try:
        parts = [(p.name, p.records, p.domains) for p in _node_parts(dsn, run_id, uid, False)]
        return nodes.render(nodes.build_rows(parts, clock_bound_ns=clock_bound_ns), fmt)
    finally:
        if collecting:
            gc.enable()


__all__ = ["CentralRun", "connect", "render_runs", "report", "run_files", "run_parts", "runs"]
