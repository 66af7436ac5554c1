"""The daemon's shipper: what the local store committed, shipped to the central store.

The local store stays first: the daemon acknowledges a record once SQLite has committed it,
whatever the network or the central database do. Triggers of the local store (schema 7,
:mod:`counterd.daemon.store`) queue the key of every record committed or completed and of every
clock anchor, in the committing transaction. This thread (:class:`Shipper`, its own SQLite
connection) reads the queue in order, a batch at a time, and ships it to PostgreSQL in one
transaction through the ingest functions (:mod:`counterd.central.schema`): the record's current
row and body, its run's row, the run's clock domain and anchors. Only once PostgreSQL has
committed does it delete the batch from the queue and move the watermark (one local
transaction). So:

* at-least-once: a batch shipped but not yet dequeued (the daemon killed in between) is
  shipped again after a restart, and the central insert is idempotent on the record's key
  (uid, run_id, host, pid, idx): the same batch twice leaves one row each (a complete record
  replaces an incomplete one, never the other way round, as locally);
* restarts of the daemon resume at the watermark; a database or network that fails makes
  the thread close its connection and retry with exponential backoff (``retry_min_s`` doubling
  to ``retry_max_s``), while the daemon's loop and writer go on: they never wait for it;
* a server that accepts and then says nothing (or stops mid-batch) costs one ``timeout_s``:
  a deadline shuts the connection's socket, and the batch is retried later;
* bounded backlog: past ``max_backlog`` queued entries the oldest leave the queue, counted
  (``counterd_central_dropped_total``) and logged; the records themselves stay in the local
  store (``counterd export`` still writes them) until its retention, so nothing committed
  locally is lost, only its central copy is given up;
* a row the database refuses (not a connection failure: a value PostgreSQL cannot hold, such
  as a NUL character in a text) is isolated by shipping that batch row by row, and only the
  refused rows are dropped (``counterd_central_refused_total``, logged): one bad row never
  stalls the rest.

Metrics (:class:`ShipperCollector`): the backlog's size, the age of its oldest entry, the lag
of the last batch (local commit to central commit, both on this node's wall clock), rows
shipped, dropped and refused, and whether the database is reachable.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from counterd.central import psycopg_module

log = logging.getLogger("counterd.daemon")


@dataclass(frozen=True)
class ShipSettings:
    """The ``[central]`` configuration (:mod:`counterd.daemon.config`)."""

    dsn: str
    role: str = ""  # the login role ("": the dsn's user)
    batch_size: int = 1000
    max_backlog: int = 1_000_000
    timeout_s: float = 10.0
    retry_min_s: float = 0.5
    retry_max_s: float = 60.0
    poll_s: float = 0.2
    node: str = field(default_factory=lambda: os.uname().nodename)


@dataclass
class ShipStats:
    """What the shipper did, for /metrics and tests (guarded by ``lock``)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    backlog: int = 0
    oldest_age_s: float = 0.0
    lag_s: float | None = None  # the last batch's largest commit-to-central lag
    shipped: int = 0  # queue entries shipped (records and anchors)
    batches: int = 0
    dropped: int = 0
    refused: int = 0
    failures: int = 0
    connected: bool = False
    last_error: str = ""
    lags: list[float] = field(default_factory=list)  # per shipped record, when kept
    keep_lags: bool = False  # the bench keeps every lag
    # called after a change (outside ``lock``): the daemon's /metrics cache re-renders then
    changed: Callable[[], None] | None = None

    def notify(self) -> None:
        if self.changed is not None:
            self.changed()

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {k: getattr(self, k) for k in (
                "backlog", "oldest_age_s", "lag_s", "shipped", "batches", "dropped", "refused",
                "failures", "connected", "last_error")}


@dataclass(frozen=True)
class _Entry:
    seq: int
    kind: str
    uid: int
    run_id: str
    host: str
    pid: int
    idx: int
    committed_ns: int
    row: tuple[Any, ...] | None  # the record's (name, rank, begin, end, body) or anchor's


_BATCH = """
SELECT q.seq, q.kind, q.uid, q.run_id, q.host, q.pid, q.idx, q.committed_ns,
       r.name, r.rank, r.begin_ns, r.end_ns, r.body, a.real_ns, a.read_ns
FROM ship_queue q
LEFT JOIN records r ON q.kind = 'r' AND r.uid = q.uid AND r.run_id = q.run_id
     AND r.host = q.host AND r.pid = q.pid AND r.idx = q.idx
LEFT JOIN clock_anchors a ON q.kind = 'a' AND a.uid = q.uid AND a.run_id = q.run_id
     AND a.mono_ns = q.idx
ORDER BY q.seq LIMIT ?
"""


def set_enabled(conn: sqlite3.Connection, enabled: bool) -> None:
    """Make the local store's triggers queue (or stop queueing) for the shipper."""
    conn.execute("UPDATE ship_state SET enabled = ?", (1 if enabled else 0,))


class _Refused(Exception):
    """The database refused the batch's data (not a connection failure)."""


class Shipper:
    """The shipping thread for the local store at ``store_path``."""

    def __init__(self, store_path: Path, settings: ShipSettings,
                 stats: ShipStats | None = None) -> None:
        self.store_path = Path(store_path)
        self.settings = settings
        self.stats = stats if stats is not None else ShipStats()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._pg: Any = None
        self._local: sqlite3.Connection | None = None

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> threading.Thread:
        psycopg_module()  # BadInput now, at start, if psycopg is missing
        self._thread = threading.Thread(target=self._run, name="counterd-shipper", daemon=True)
        self._thread.start()
        return self._thread

    def stop(self, timeout: float = 5.0) -> None:
        """Stop; what is still queued is shipped after the next start."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def nudge(self) -> None:
        """Something was committed: ship without waiting for the next poll."""
        self._wake.set()

    def _local_conn(self) -> sqlite3.Connection:
        if self._local is None:
            self._local = sqlite3.connect(self.store_path, timeout=30.0, isolation_level=None,
                                          check_same_thread=False)
            # text that is not UTF-8 (a damaged or forged store) must not stop the queue
            self._local.text_factory = lambda b: b.decode("utf-8", "replace")
        return self._local

    def _run(self) -> None:
        delay = self.settings.retry_min_s
        try:
            while not self._stop.is_set():
                try:
                    shipped = self.ship_once()
                except _Down as exc:
                    self._disconnect()
                    with self.stats.lock:
                        self.stats.failures += 1
                        self.stats.connected = False
                        first = self.stats.last_error != exc.args[0]
                        self.stats.last_error = exc.args[0]
                    self.stats.notify()
                    (log.warning if first else log.debug)(
                        "central store unreachable (%s): retrying in %.1f s, records stay "
                        "queued locally", exc.args[0], delay)
                    self._stop.wait(delay * (0.5 + random.random() / 2))
                    delay = min(delay * 2, self.settings.retry_max_s)
                    continue
                except sqlite3.Error as exc:  # the local store (busy, full): try again later
                    log.warning("shipper: local store: %s", exc)
                    self._stop.wait(self.settings.retry_min_s)
                    continue
                except Exception:  # a bug must not end shipping for good: log, back off
                    log.exception("shipper: unexpected failure; retrying")
                    self._disconnect()
                    self._stop.wait(self.settings.retry_max_s)
                    continue
                delay = self.settings.retry_min_s
                if not shipped:
                    self._wake.wait(self.settings.poll_s)
                    self._wake.clear()
        finally:
            self._disconnect()
            if self._local is not None:
                self._local.close()
                self._local = None

    # -- one batch -----------------------------------------------------------------------------
    def bound_backlog(self) -> int:
        """Apply ``max_backlog`` (drop the oldest entries past it); returns the backlog."""
        conn = self._local_conn()
        # fetchall: a statement left unfinished would hold its read snapshot, and the write
        # transaction below could then not start once the writer has committed since (WAL)
        (lo, hi, oldest), = conn.execute(
            "SELECT min(seq), max(seq), (SELECT committed_ns FROM ship_queue ORDER BY seq "
            "LIMIT 1) FROM ship_queue").fetchall()
        backlog = 0 if lo is None else hi - lo + 1
        if backlog > self.settings.max_backlog:
            cut = hi - self.settings.max_backlog  # entries with seq <= cut leave the queue
            conn.execute("BEGIN IMMEDIATE")
            try:
                n = conn.execute("DELETE FROM ship_queue WHERE seq <= ?", (cut,)).rowcount
                conn.execute("UPDATE ship_state SET dropped = dropped + ?, "
                             "shipped_seq = max(shipped_seq, ?)", (n, cut))
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            log.warning("central backlog past central.max_backlog = %d: the oldest %d queued "
                        "entries will not be shipped (their records stay in the local store)",
                        self.settings.max_backlog, n)
            with self.stats.lock:
                self.stats.dropped += n
            backlog -= n
            first = conn.execute("SELECT committed_ns FROM ship_queue ORDER BY seq LIMIT 1"
                                 ).fetchall()
            oldest = first[0][0] if first else None
        with self.stats.lock:
            moved = self.stats.backlog != backlog
            self.stats.backlog = backlog
            self.stats.oldest_age_s = (max(0.0, (time.time_ns() - oldest) / 1e9)
                                       if oldest is not None else 0.0)
        if moved:
            self.stats.notify()
        return backlog

    def ship_once(self) -> int:
        """Ship one batch (at most ``batch_size`` queue entries); returns how many entries
        left the queue. Raises :class:`_Down` when the database cannot be reached."""
        if not self.bound_backlog():
            return 0
        conn = self._local_conn()
        rows = conn.execute(_BATCH, (self.settings.batch_size,)).fetchall()
        if not rows:
            return 0
        entries, bad = [], 0
        for r in rows:
            why = _unfit(r)
            if why:
                bad += 1
                log.error("shipper: queue entry %r of run %.80r is not shippable (%s); it stays "
                          "in the local store only", r[0], r[3], why)
            else:
                entries.append(_Entry(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7],
                                      tuple(r[8:])))
        pg = self._connect()
        refused = bad
        if entries:
            try:
                self._ship(pg, conn, entries)
            except _Refused:
                refused += self._ship_one_by_one(pg, conn, entries)
        entries_done = len(rows)
        last_seq = int(rows[-1][0])
        done_ns = time.time_ns()
        last = last_seq
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute("DELETE FROM ship_queue WHERE seq <= ?", (last,))
            conn.execute("UPDATE ship_state SET shipped_seq = max(shipped_seq, ?)", (last,))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        lags = [(done_ns - e.committed_ns) / 1e9 for e in entries if e.kind == "r"]
        with self.stats.lock:
            st = self.stats
            st.connected = True
            st.last_error = ""
            st.shipped += entries_done - refused
            st.refused += refused
            st.batches += 1
            st.backlog = max(0, st.backlog - entries_done)
            if lags:
                st.lag_s = max(lags)
                if st.keep_lags:
                    st.lags.extend(lags)
        st.notify()
        return entries_done

    def _ship_one_by_one(self, pg: Any, conn: sqlite3.Connection,
                         entries: Sequence[_Entry]) -> int:
        refused = 0
        for e in entries:
            try:
                self._ship(pg, conn, [e])
            except _Refused as exc:
                refused += 1
                log.error("central store refused %s of run %r (uid %d, host %r, pid %d, index "
                          "%d): %s; it stays in the local store only",
                          "a record" if e.kind == "r" else "an anchor", e.run_id[:80], e.uid,
                          e.host[:80], e.pid, e.idx, exc)
        return refused

    def _ship(self, pg: Any, conn: sqlite3.Connection, entries: Sequence[_Entry]) -> None:
        """``entries`` in one central transaction."""
        psycopg = psycopg_module()
        node = self.settings.node
        recs: dict[tuple[int, str, str, int, int], tuple[Any, ...]] = {}
        anchors: dict[tuple[int, str, int], tuple[Any, ...]] = {}
        for e in entries:
            if e.row is None:
                continue
            if e.kind == "r" and e.row[4] is not None:  # None: pruned since
                name, rank, begin, end, body = e.row[:5]
                recs[(e.uid, e.run_id, e.host, e.pid, e.idx)] = (
                    e.uid, e.run_id, e.host, e.pid, e.idx, node, name, rank, begin, end, body,
                    e.committed_ns)
            elif e.kind == "a" and e.row[5] is not None:
                anchors[(e.uid, e.run_id, e.idx)] = (e.uid, e.run_id, node, e.idx, e.row[5],
                                                     e.row[6])
        run_keys = sorted({(k[0], k[1]) for k in recs})
        runs = [(uid, run_id, node, *row) for uid, run_id in run_keys for row in conn.execute(
            "SELECT host, job, first_seen_ns, last_seen_ns FROM runs WHERE uid = ? AND "
            "run_id = ?", (uid, run_id))]
        domain_keys = sorted({(k[0], k[1]) for k in anchors})
        domains = [(uid, run_id, node, *row) for uid, run_id in domain_keys
                   for row in conn.execute(
                       "SELECT boot_id, timens, mono_offset_ns, sync_bound_ns FROM clock_domains"
                       " WHERE uid = ? AND run_id = ?", (uid, run_id))]
        try:
            with _deadline(pg, self.settings.timeout_s), pg.transaction():
                if runs:
                    pg.execute(_call("ship_runs", 7), _columns(runs, 7))
                if domains or anchors:
                    pg.execute(_call("ship_clocks", 13),
                               _columns(domains, 7) + _columns(list(anchors.values()), 6))
                if recs:
                    pg.execute(_call("ship_records", 12), _columns(list(recs.values()), 12))
        except psycopg.OperationalError as exc:
            raise _Down(_one_line(exc)) from None
        except (psycopg.DataError, psycopg.IntegrityError, ValueError) as exc:
            if pg.closed or pg.broken:
                raise _Down(_one_line(exc)) from None
            raise _Refused(_one_line(exc)) from None
        except psycopg.Error as exc:  # privileges, a missing schema: the site must act
            raise _Down(_one_line(exc)) from None

    # -- the central connection ----------------------------------------------------------------
    def _connect(self) -> Any:
        if self._pg is not None and not self._pg.closed and not self._pg.broken:
            return self._pg
        self._disconnect()
        psycopg = psycopg_module()
        try:
            self._pg = psycopg.connect(
                self.settings.dsn, connect_timeout=max(2, int(self.settings.timeout_s)),
                application_name="counterd-shipper", autocommit=True,
                **({"user": self.settings.role} if self.settings.role else {}))
        except psycopg.Error as exc:
            raise _Down(_one_line(exc)) from None
        with self.stats.lock:
            self.stats.connected = True
        log.info("central store connected (%s)", self._pg.info.dsn)
        return self._pg

    def _disconnect(self) -> None:
        if self._pg is not None:
            with contextlib.suppress(Exception):
                self._pg.close()
            self._pg = None


class _Down(Exception):
    """The central database cannot be reached (or refuses this node); args[0]: why."""


_INT64 = (-(2**63), 2**63 - 1)


def _unfit(r: Sequence[Any]) -> str:
    """Why queue row ``r`` (the _BATCH columns) cannot be shipped ("" when it can): the local
    store is SQLite, whose columns take any type, and PostgreSQL's text holds no NUL."""
    seq, kind, uid, run_id, host, pid, idx, committed = r[:8]
    name, rank, begin, end, body, real, read = r[8:]
    ints = [seq, uid, pid, idx, committed]
    texts = [kind, run_id, host]
    if kind == "r" and body is not None:
        ints += [rank, begin] + ([end] if end is not None else [])
        texts += [name, body]
    elif kind == "a" and real is not None:
        ints += [real, read]
    elif kind not in ("r", "a"):
        return f"unknown kind {kind!r:.20}"
    for v in ints:
        if not isinstance(v, int) or isinstance(v, bool) or not _INT64[0] <= v <= _INT64[1]:
            return f"{v!r:.40} is not a 64-bit integer"
    for t in texts:
        if not isinstance(t, str):
            return f"{t!r:.40} is not text"
        if "\0" in t:
            return "a NUL character in a text"
    return ""


def _call(function: str, arity: int) -> str:
    """The ingest call with ``arity`` array parameters in binary (``%b``): psycopg's text
    format quotes every element of a text array through a regular expression (a JSON body is
    full of quotes), 78 us of the node's CPU a row against 6 us in binary
    (bench/central_ingest.py's client CPU, 1,000-row batches)."""
    return f"SELECT counterd.{function}({', '.join(['%b'] * arity)})"


def _columns(rows: Sequence[tuple[Any, ...]], width: int) -> tuple[list[Any], ...]:
    """Rows as ``width`` column lists (the ingest functions take arrays: one call a batch)."""
    if not rows:
        return tuple([] for _ in range(width))
    return tuple(list(c) for c in zip(*rows, strict=True))


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return (text[:300] + "...") if len(text) > 300 else text or type(exc).__name__


@contextlib.contextmanager
def _deadline(pg: Any, seconds: float) -> Iterator[None]:
    """Shut ``pg``'s socket down if the block takes longer than ``seconds``: a server that
    stops answering mid-batch then fails the batch (OperationalError) instead of holding the
    shipper forever (libpq has no read timeout)."""
    done = threading.Event()

    def cut() -> None:
        if done.is_set():
            return
        with contextlib.suppress(OSError, ValueError):
            fd = os.dup(pg.fileno())
            s = socket.socket(fileno=fd)
            try:
                s.shutdown(socket.SHUT_RDWR)
            finally:
                s.close()

    timer = threading.Timer(seconds, cut)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        done.set()
        timer.cancel()


class ShipperCollector:
    """The shipper's metrics for the daemon's /metrics (a prometheus-client collector)."""

    def __init__(self, stats: ShipStats) -> None:
        self.stats = stats

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        s = self.stats.snapshot()
        yield GaugeMetricFamily("counterd_central_backlog",
                                "Committed records and anchors queued for the central store",
                                value=s["backlog"])
        yield GaugeMetricFamily("counterd_central_backlog_age_seconds",
                                "Age of the oldest entry queued for the central store",
                                value=s["oldest_age_s"])
        if s["lag_s"] is not None:
            yield GaugeMetricFamily("counterd_central_lag_seconds",
                                    "Local commit to central commit, the last batch's largest",
                                    value=s["lag_s"])
        yield GaugeMetricFamily("counterd_central_up",
                                "1 while the central store took the last batch",
                                value=1 if s["connected"] else 0)
        for name, key, text in (
                ("shipped", "shipped", "Queue entries shipped to the central store"),
                ("dropped", "dropped", "Queue entries dropped past central.max_backlog"),
                ("refused", "refused", "Rows the central store refused (kept locally)"),
                ("failures", "failures", "Shipping attempts that found the store unreachable")):
            yield CounterMetricFamily(f"counterd_central_{name}", text, value=s[key])


__all__ = ["ShipSettings", "ShipStats", "Shipper", "ShipperCollector", "set_enabled"]
