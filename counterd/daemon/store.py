"""The embedded store: SQLite in WAL mode, one schema for runs, per-processor superstep records,
the per-superstep view over them, and sampled counters (DESIGN.md section 6).

Durability: the daemon acknowledges a record to its client only after the transaction that
holds it has committed (:meth:`Store.commit`). In WAL mode a committed transaction is in the
WAL file before ``COMMIT`` returns, so a ``kill -9`` of the daemon loses nothing acknowledged;
with ``synchronous=FULL`` (the default) the WAL is also fsync'ed at every commit, so a power
loss does not either. ``normal`` trades the latter for throughput.

Schema changes are migrations (:mod:`counterd.daemon.schema`): opening a store applies the
missing ones, and a store written by a newer counterd is refused rather than guessed at.

Records are kept whole, as their JSON (``records.py`` format, versioned there), next to the
columns that are queried; a record is identified by (run, host, pid, superstep index), so a
client that resends after a reconnect cannot create duplicates, and a complete record replaces
an ``incomplete`` one of the same identity.

Privacy: the store holds every user's runs, so it is the daemon user's alone. The database, its
WAL and shared-memory files are 0600 and a directory created for them 0700, whatever the umask
(:func:`counterd.daemon.schema.private_file`); a store found readable by others is made
private when opened, with a log line. Run ids are namespaced by the uid that sent them
(schema 3): the same run id from two users is two runs, so no user can claim, fill or block
another's run id. Users read their own runs through the daemon (:mod:`counterd.daemon.query`),
never the file.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time
from collections.abc import Generator, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from counterd.daemon.schema import SCHEMA_VERSION, connect, migrate, schema_version
from counterd.data.clocks import Anchor, ClockDomain, kept_anchors
from counterd.data.errors import BadInput, StoreError
from counterd.data.jobid import source_of
from counterd.data.records import SuperstepRecord
from counterd.util import strictjson


@dataclass(frozen=True)
class ClientClock:
    """What a client's CLOCK_MONOTONIC is beside the daemon's: its time namespace and that
    namespace's offset from the daemon's (None: not readable), on this kernel's boot."""

    boot_id: str
    timens: str
    mono_offset_ns: int | None
    sync_bound_ns: int | None = None


@dataclass(frozen=True)
class RunAnchor:
    """An anchor of the daemon's clocks for run ``(uid, run_id)``, and its client's clock."""

    uid: int
    run_id: str
    anchor: Anchor
    clock: ClientClock


@dataclass(frozen=True)
class RunInfo:
    """Who sent a record: the run's metadata as the daemon saw it."""

    job: str
    uid: int
    batch_job: str = ""  # HELLO's (the /metrics label; not stored)


@dataclass(frozen=True)
class RunRow:
    uid: int
    run_id: str
    host: str
    job: str
    first_seen_ns: int
    last_seen_ns: int
    records: int
    supersteps: int
    incomplete: int


    def key(self) -> RunKey:
        """Where the run listing goes on after this run (a QUERY's ``after``)."""
        return (self.first_seen_ns, self.run_id, self.uid)


RunKey = tuple[int, str, int]  # (first_seen_ns, run_id, uid): the run listing's order


@dataclass(frozen=True)
class Sample:
    ts_ns: int
    job: str
    counter: str
    value: float
    ratio: float


_UPSERT = """
INSERT INTO records (uid, run_id, host, pid, idx, name, rank, begin_ns, end_ns, flags, body,
                     received_ns)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (uid, run_id, host, pid, idx) DO UPDATE SET
    name=excluded.name, rank=excluded.rank, begin_ns=excluded.begin_ns, end_ns=excluded.end_ns,
    flags=excluded.flags, body=excluded.body, received_ns=excluded.received_ns
WHERE records.end_ns IS NULL AND excluded.end_ns IS NOT NULL
"""


def _row(rec: SuperstepRecord, uid: int, now: int) -> tuple[object, ...]:
    return (uid, rec.run_id, rec.host, rec.pid, rec.index, rec.name, rec.rank, rec.begin_ns,
            rec.end_ns, ",".join(sorted(rec.flags)),
            json.dumps(rec.to_json(), separators=(",", ":")), now)


class Store:
    """One connection; used by one thread at a time (the daemon's writer thread, or a reader).
    Readers (``counterd report``) open their own :class:`Store` with ``readonly=True``."""

    def __init__(self, path: Path, *, synchronous: str = "full", readonly: bool = False) -> None:
        self.path = Path(path)
        if readonly:
            private = BadInput(f"the store {self.path} is private to the daemon's user",
                               "omit --store: counterd runs and counterd report ask the "
                               "daemon, which gives you your own runs")
            try:
                os.stat(self.path)
            except FileNotFoundError:
                raise BadInput(f"no store at {self.path}",
                               "start the daemon (counterd run, or systemctl start "
                               "counterd) or pass --store PATH; counterd report also reads a "
                               "records file (--records FILE)") from None
            except OSError:  # EACCES: in the daemon's private directory
                raise private from None
            if not os.access(self.path, os.R_OK):
                raise private
        self._conn = connect(self.path, synchronous, readonly=readonly)
        if readonly:
            version = schema_version(self._conn)
            if version != SCHEMA_VERSION:
                raise StoreError(f"the store {self.path} has schema version {version}, this "
                                 f"counterd reads {SCHEMA_VERSION}",
                                 "start counterd run once to migrate it, or upgrade counterd")
        else:
            migrate(self._conn)

    def close(self) -> None:
        self._conn.close()

    def set_shipping(self, enabled: bool) -> None:
        """Queue (or stop queueing) what is committed for the central shipper (schema 7)."""
        self._conn.execute("UPDATE ship_state SET enabled = ?", (1 if enabled else 0,))

    # -- writing (the daemon) ------------------------------------------------------------------
    def commit(self, records: Sequence[tuple[SuperstepRecord, RunInfo]],
               samples: Sequence[Sample] = (), anchors: Sequence[RunAnchor] = ()) -> None:
        """Store ``records`` (each in its sender's uid namespace, ``RunInfo.uid``),
        ``samples`` and clock ``anchors`` in one transaction; durable when this returns.
        StoreError names the cause (:func:`_write_failure`); nothing of the batch is kept
        then. A run's clock domain row is its first anchor's client clock (a later one
        updates its sync bound only)."""
        now = time.time_ns()
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            runs: dict[tuple[int, str], tuple[str, RunInfo]] = {}
            for rec, info in records:
                runs.setdefault((info.uid, rec.run_id), (rec.host, info))
            conn.executemany(
                "INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (uid, run_id) DO UPDATE "
                "SET last_seen_ns=excluded.last_seen_ns",
                [(uid, run_id, host, info.job, now, now)
                 for (uid, run_id), (host, info) in runs.items()])
            conn.executemany(_UPSERT, [_row(rec, info.uid, now) for rec, info in records])
            if samples:
                conn.executemany("INSERT INTO samples VALUES (?, ?, ?, ?, ?)",
                                 [(s.ts_ns, s.job, s.counter, s.value, s.ratio)
                                  for s in samples])
            if anchors:
                conn.executemany(
                    "INSERT INTO clock_domains VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT "
                    "(uid, run_id) DO UPDATE SET sync_bound_ns=excluded.sync_bound_ns",
                    [(a.uid, a.run_id, a.clock.boot_id, a.clock.timens,
                      a.clock.mono_offset_ns, a.clock.sync_bound_ns) for a in anchors])
                conn.executemany(
                    "INSERT OR IGNORE INTO clock_anchors VALUES (?, ?, ?, ?, ?)",
                    [(a.uid, a.run_id, a.anchor.mono_ns, a.anchor.real_ns, a.anchor.read_ns)
                     for a in anchors])
            conn.execute("COMMIT")
        except BaseException as exc:
            # SQLite rolls back by itself when COMMIT fails for lack of space (SQLITE_FULL):
            # a ROLLBACK then fails with "no transaction is active" and, raised, would hide
            # the cause. Roll back only what is still open.
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise _write_failure(self.path, exc) from exc
            raise

    def prune(self, retention_ns: int, now_ns: int | None = None) -> int:
        """Delete runs (with their records) and samples older than the retention; returns the
        number of rows deleted."""
        cutoff = (now_ns if now_ns is not None else time.time_ns()) - retention_ns
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            old = conn.execute("SELECT uid, run_id FROM runs WHERE last_seen_ns < ?",
                               (cutoff,)).fetchall()
            deleted = 0
            for uid, run_id in old:
                deleted += conn.execute("DELETE FROM records WHERE uid = ? AND run_id = ?",
                                        (uid, run_id)).rowcount
                deleted += conn.execute("DELETE FROM runs WHERE uid = ? AND run_id = ?",
                                        (uid, run_id)).rowcount
                conn.execute("DELETE FROM clock_domains WHERE uid = ? AND run_id = ?",
                             (uid, run_id))
            deleted += conn.execute("DELETE FROM samples WHERE ts_ns < ?", (cutoff,)).rowcount
            # anchors by their own time: also those of runs that never committed a record
            deleted += conn.execute("DELETE FROM clock_anchors WHERE real_ns < ?",
                                    (cutoff,)).rowcount
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return deleted

    # -- reading (reports, and the daemon's answers to QUERY) -----------------------------------
    # ``uid`` None reads every user's runs: for those who may read the file (root, the daemon
    # user); the daemon passes the asking client's uid unless it is privileged.
    def runs(self, uid: int | None = None, after: RunKey | None = None,
             limit: int | None = None) -> list[RunRow]:
        """The runs (of ``uid``; None: everyone's) in listing order (first seen, run id, uid),
        from after the key ``after`` (:meth:`RunRow.key`), at most ``limit`` of them: a page
        is a range of an index (runs_by_uid, runs_by_time) and its counts are counted for its
        own runs only, so a page costs the same however many runs come before it."""
        where: list[str] = []
        args: list[object] = []
        if uid is not None:
            where.append("uid = ?")
            args.append(uid)
        if after is not None:
            where.append("(first_seen_ns, run_id, uid) > (?, ?, ?)")
            args.extend(after)
        sql = ("SELECT uid, run_id, host, job, first_seen_ns, last_seen_ns FROM runs "
               + (f"WHERE {' AND '.join(where)} " if where else "")
               + "ORDER BY first_seen_ns, run_id, uid")
        if limit is not None:
            sql += " LIMIT ?"
            args.append(limit)
        # Each count is a range of the records' primary key (the supersteps view's groups,
        # (idx, name), counted directly: through the view SQLite built the whole view per run).
        rows = self._conn.execute(
            "SELECT r.uid, r.run_id, r.host, r.job, r.first_seen_ns, r.last_seen_ns, "
            "(SELECT COUNT(*) FROM records x WHERE x.uid = r.uid AND x.run_id = r.run_id), "
            "(SELECT COUNT(DISTINCT x.idx || '/' || x.name) FROM records x "
            "WHERE x.uid = r.uid AND x.run_id = r.run_id), "
            "(SELECT COUNT(*) FROM records x WHERE x.uid = r.uid AND x.run_id = r.run_id "
            f"AND x.end_ns IS NULL) FROM ({sql}) r ORDER BY r.first_seen_ns, r.run_id, r.uid",
            args).fetchall()
        return [RunRow(*row) for row in rows]

    def usage(self, uids: Iterable[int] | None = None) -> dict[int, int]:
        """uid -> bytes of records it keeps in the store (of ``uids``; None: every uid's)."""
        if uids is None:
            rows = self._conn.execute("SELECT uid, bytes FROM usage WHERE records > 0")
        else:
            wanted = sorted(set(uids))
            rows = self._conn.execute(
                f"SELECT uid, bytes FROM usage WHERE uid IN ({','.join('?' * len(wanted))})",
                wanted)
        return {int(u): int(b) for u, b in rows}

    def latest(self, uid: int | None = None) -> tuple[int, str] | None:
        """(uid, run id) of the run seen last (of ``uid``'s runs, if given)."""
        where, args = ("WHERE uid = ? ", (uid,)) if uid is not None else ("", ())
        row = self._conn.execute(
            f"SELECT uid, run_id FROM runs {where}ORDER BY last_seen_ns DESC, run_id LIMIT 1",
            args).fetchone()
        return None if row is None else (int(row[0]), str(row[1]))

    def latest_run(self) -> str | None:
        latest = self.latest()
        return None if latest is None else latest[1]

    def run_uid(self, run_id: str, uid: int | None = None) -> int | None:
        """The uid whose run ``run_id`` is (None: no such run). With ``uid`` None and the id
        used by several users, BadInput: the caller must say whose."""
        if uid is not None:
            found = self._conn.execute("SELECT 1 FROM runs WHERE uid = ? AND run_id = ?",
                                       (uid, run_id)).fetchone()
            return uid if found else None
        uids = [int(u) for (u,) in self._conn.execute(
            "SELECT uid FROM runs WHERE run_id = ? ORDER BY uid", (run_id,))]
        if len(uids) > 1:
            raise BadInput(f"run {run_id!r} exists for uids {', '.join(map(str, uids))}",
                           "name the user with --uid")
        return uids[0] if uids else None

    def record_bodies(self, uid: int, run_id: str, after: tuple[str, int, int] | None = None
                      ) -> Generator[tuple[tuple[str, int, int], str], None, None]:
        """The JSON bodies of run ``(uid, run_id)``'s records, each with its key (host, pid,
        index), in key order (the primary key's: no sort), from after the key ``after``:
        :mod:`counterd.daemon.query` sends them in pages and resumes there."""
        query = "SELECT host, pid, idx, body FROM records WHERE uid = ? AND run_id = ?"
        args: tuple[object, ...] = (uid, run_id)
        if after is not None:
            query += " AND (host, pid, idx) > (?, ?, ?)"
            args += after
        cur = self._conn.execute(query + " ORDER BY host, pid, idx", args)
        try:  # a cursor left open would hold a read transaction (and the WAL) until collected
            for host, pid, idx, body in cur:
                yield (str(host), int(pid), int(idx)), str(body)
        finally:
            cur.close()

    def records(self, run_id: str, uid: int | None = None) -> list[SuperstepRecord]:
        """Run ``run_id``'s records (of ``uid``'s namespace; None: the one user who has that
        run id, see :meth:`run_uid`), by index, rank and pid."""
        owner = self.run_uid(run_id, uid)
        if owner is None:
            return []
        rows = self._conn.execute(
            "SELECT body FROM records WHERE uid = ? AND run_id = ? ORDER BY idx, rank, pid",
            (owner, run_id))
        return [self._record(body) for (body,) in rows]

    def clock_domain(self, run_id: str, uid: int, host: str) -> tuple[ClockDomain | None, str]:
        """Run ``(uid, run_id)``'s clock domain on node ``host`` with its anchors moved onto
        the client's CLOCK_MONOTONIC, or None and why not (a run recorded before schema 6, a
        client's time namespace the daemon could not read)."""
        row = self._conn.execute(
            "SELECT boot_id, timens, mono_offset_ns, sync_bound_ns FROM clock_domains "
            "WHERE uid = ? AND run_id = ?", (uid, run_id)).fetchone()
        if row is None:
            return None, "the daemon took no clock anchors for this run (recorded before)"
        boot, timens, offset, bound = row
        if offset is None:
            return None, (f"the client's time namespace ({timens or 'unknown'}) could not be "
                          "read by the daemon: its monotonic clock is not known")
        anchors = [Anchor(int(m) + int(offset), int(r), int(n)) for m, r, n in self._conn.execute(
            "SELECT mono_ns, real_ns, read_ns FROM clock_anchors WHERE uid = ? AND run_id = ? "
            "ORDER BY mono_ns", (uid, run_id))]
        anchors = [a for a in anchors if a.mono_ns >= 0]
        if not anchors:
            return None, "its anchors were pruned"
        return ClockDomain(run_id, host, str(boot), str(timens), kept_anchors(anchors),
                           None if bound is None else int(bound), source_of(run_id)), ""

    def run_hosts(self, run_id: str, uid: int) -> list[str]:
        """The hosts of run ``(uid, run_id)``'s records."""
        return [str(h) for (h,) in self._conn.execute(
            "SELECT DISTINCT host FROM records WHERE uid = ? AND run_id = ? ORDER BY host",
            (uid, run_id))]

    def all_records(self) -> list[SuperstepRecord]:
        rows = self._conn.execute(
            "SELECT body FROM records ORDER BY uid, run_id, idx, rank, pid")
        return [self._record(body) for (body,) in rows]

    def _record(self, body: object) -> SuperstepRecord:
        """A stored body as a record, checked as a file's would be (BadInput: the store was
        written by something else, or damaged)."""
        try:
            return SuperstepRecord.from_json(strictjson.loads(str(body)))
        except (strictjson.Malformed, BadInput) as exc:
            raise BadInput(f"the store {self.path} holds a damaged record ({exc})",
                           "restore the store from a backup, or delete it") from None

    def samples(self, job: str | None = None) -> list[Sample]:
        query = "SELECT ts_ns, job, counter, value, ratio FROM samples"
        args: tuple[object, ...] = ()
        if job is not None:
            query += " WHERE job = ?"
            args = (job,)
        return [Sample(*row) for row in self._conn.execute(query + " ORDER BY ts_ns", args)]


_SQLITE_FULL = 13  # sqlite3.h: "Insertion failed because database is full"


def _write_failure(path: Path, exc: sqlite3.Error) -> StoreError:
    """The StoreError of a failed write, naming the cause: SQLITE_FULL is a full disk (or a
    full quota, or max_page_count), not the rollback error that used to hide it."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None and code & 0xFF == _SQLITE_FULL:
        return StoreError(f"cannot write the store {path}: disk full (database or WAL cannot "
                          "grow)", "free space on its file system, or lower "
                          "store.retention_days")
    return StoreError(f"cannot write the store {path}: {exc}",
                      "free disk space or fix the store's permissions")


def open_readonly(path: Path) -> Store:
    return Store(path, readonly=True)


def store_records(path: Path, records: Iterable[SuperstepRecord], job: str = "import",
                  uid: int = 0) -> int:
    """Write records into a store directly (tests, imports); returns the count."""
    recs = list(records)
    store = Store(path)
    try:
        store.commit([(r, RunInfo(job, uid)) for r in recs])
    finally:
        store.close()
    return len(recs)
