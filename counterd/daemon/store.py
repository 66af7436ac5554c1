"""The embedded store: SQLite in WAL mode, one schema for runs, per-processor superstep records,
the per-superstep view over them, and sampled counters (DESIGN.md section 6).

Durability: the daemon acknowledges a record to its client only after the transaction that
holds it has committed (:meth:`Store.commit`). In WAL mode a committed transaction is in the
WAL file before ``COMMIT`` returns, so a ``kill -9`` of the daemon loses nothing acknowledged;
with ``synchronous=FULL`` (the default) the WAL is also fsync'ed at every commit, so a power
loss does not either. ``normal`` trades the latter for throughput.

Schema changes are migrations: ``schema_version`` holds the version, :data:`MIGRATIONS` the
ordered scripts; opening a store applies the missing ones in one transaction each, and a store
written by a newer counterd is refused rather than guessed at.

Records are kept whole, as their JSON (``records.py`` format, versioned there), next to the
columns that are queried; a record is identified by (run, host, pid, superstep index), so a
client that resends after a reconnect cannot create duplicates, and a complete record replaces
an ``incomplete`` one of the same identity.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from counterd.errors import BadInput, CounterdError
from counterd.records import SuperstepRecord

# Schema history (each entry is applied once, in order, in its own transaction):
#   1 - runs, records (one row per processor per superstep, JSON body), samples.
#   2 - the supersteps view (time = max end - min begin over processors) and time indices
#       used by retention.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE runs (
        run_id        TEXT PRIMARY KEY,
        host          TEXT NOT NULL,
        job           TEXT NOT NULL,
        uid           INTEGER NOT NULL,      -- SO_PEERCRED uid of the first client
        first_seen_ns INTEGER NOT NULL,      -- wall clock (time.time_ns)
        last_seen_ns  INTEGER NOT NULL
    );
    CREATE TABLE records (
        run_id      TEXT NOT NULL,
        host        TEXT NOT NULL,
        pid         INTEGER NOT NULL,
        idx         INTEGER NOT NULL,
        name        TEXT NOT NULL,
        rank        INTEGER NOT NULL,
        begin_ns    INTEGER NOT NULL,        -- CLOCK_MONOTONIC of the client's host
        end_ns      INTEGER,                 -- NULL: incomplete
        flags       TEXT NOT NULL,           -- comma-separated, sorted
        body        TEXT NOT NULL,           -- SuperstepRecord.to_json()
        received_ns INTEGER NOT NULL,        -- wall clock
        PRIMARY KEY (run_id, host, pid, idx)
    ) WITHOUT ROWID;
    CREATE TABLE samples (
        ts_ns   INTEGER NOT NULL,            -- wall clock
        job     TEXT NOT NULL,
        counter TEXT NOT NULL,
        value   REAL NOT NULL,               -- cumulative over the job's processes
        ratio   REAL NOT NULL                -- smallest multiplexing ratio in the sum
    );
    """,
    """
    CREATE INDEX records_received ON records(received_ns);
    CREATE INDEX samples_ts ON samples(ts_ns);
    -- time_ns: counterd.records.Superstep.time_ns in SQL, for readers of the database
    -- (tests/daemon/test_store.py checks that the two agree).
    CREATE VIEW supersteps AS
        SELECT run_id, idx, name,
               COUNT(DISTINCT rank) AS processors,
               MIN(begin_ns) AS begin_ns,
               CASE WHEN COUNT(end_ns) = COUNT(*) THEN MAX(end_ns) END AS end_ns,
               CASE WHEN COUNT(end_ns) = COUNT(*) THEN MAX(end_ns) - MIN(begin_ns) END
                   AS time_ns,
               SUM(end_ns IS NULL) AS incomplete
        FROM records GROUP BY run_id, idx, name;
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)


@dataclass(frozen=True)
class RunInfo:
    """Who sent a record: the run's metadata as the daemon saw it."""

    job: str
    uid: int


@dataclass(frozen=True)
class RunRow:
    run_id: str
    host: str
    job: str
    uid: int
    first_seen_ns: int
    last_seen_ns: int
    records: int
    supersteps: int
    incomplete: int


@dataclass(frozen=True)
class Sample:
    ts_ns: int
    job: str
    counter: str
    value: float
    ratio: float


class StoreError(CounterdError):
    """The store cannot be opened or written."""


def _connect(path: Path, synchronous: str, *, readonly: bool = False) -> sqlite3.Connection:
    try:
        if readonly:
            conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10.0,
                                   isolation_level=None, check_same_thread=False)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(path, timeout=10.0, isolation_level=None,
                                   check_same_thread=False)
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(f"{path}: SQLite refused WAL mode ({mode})",
                                 "put the store on a local file system")
        conn.execute(f"PRAGMA synchronous={synchronous.upper()}")
        conn.execute("PRAGMA foreign_keys=ON")
        return conn
    except sqlite3.Error as exc:
        raise StoreError(f"cannot open the store {path}: {exc}",
                         "check the path and its permissions (store.path / COUNTERD_STORE)"
                         ) from exc
    except OSError as exc:
        raise StoreError(f"cannot create the store's directory {path.parent}: {exc.strerror}",
                         "choose a writable store.path (COUNTERD_STORE)") from exc


def schema_version(conn: sqlite3.Connection) -> int:
    row = conn.execute("SELECT name FROM sqlite_master WHERE name='schema_version'").fetchone()
    if row is None:
        return 0
    got = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0]
    return int(got or 0)


def migrate(conn: sqlite3.Connection, target: int = SCHEMA_VERSION) -> int:
    """Apply the missing migrations up to ``target``; returns the version reached."""
    current = schema_version(conn)
    if current > SCHEMA_VERSION:
        raise StoreError(f"the store has schema version {current}, newer than this counterd's "
                         f"{SCHEMA_VERSION}", "upgrade counterd, or point store.path elsewhere")
    for version in range(current + 1, target + 1):
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL,"
                         " applied_ns INTEGER NOT NULL)")
            for statement in MIGRATIONS[version - 1].split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute("INSERT INTO schema_version VALUES (?, ?)", (version, time.time_ns()))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    return max(current, target)


_UPSERT = """
INSERT INTO records (run_id, host, pid, idx, name, rank, begin_ns, end_ns, flags, body,
                     received_ns)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (run_id, host, pid, idx) DO UPDATE SET
    name=excluded.name, rank=excluded.rank, begin_ns=excluded.begin_ns, end_ns=excluded.end_ns,
    flags=excluded.flags, body=excluded.body, received_ns=excluded.received_ns
WHERE records.end_ns IS NULL AND excluded.end_ns IS NOT NULL
"""


def _row(rec: SuperstepRecord, now: int) -> tuple[object, ...]:
    return (rec.run_id, rec.host, rec.pid, rec.index, rec.name, rec.rank, rec.begin_ns,
            rec.end_ns, ",".join(sorted(rec.flags)),
            json.dumps(rec.to_json(), separators=(",", ":")), now)


class Store:
    """One connection; used by one thread at a time (the daemon's writer thread, or a reader).
    Readers (``counterd report``) open their own :class:`Store` with ``readonly=True``."""

    def __init__(self, path: Path, *, synchronous: str = "full", readonly: bool = False) -> None:
        self.path = Path(path)
        if readonly and not self.path.exists():
            raise BadInput(f"no store at {self.path}",
                           "run counterd run first, or pass --store / --records")
        self._conn = _connect(self.path, synchronous, readonly=readonly)
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

    # -- writing (the daemon) ------------------------------------------------------------------
    def commit(self, records: Sequence[tuple[SuperstepRecord, RunInfo]],
               samples: Sequence[Sample] = ()) -> None:
        """Store ``records`` and ``samples`` in one transaction; durable when this returns."""
        now = time.time_ns()
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                runs: dict[str, tuple[str, RunInfo]] = {}
                for rec, info in records:
                    runs.setdefault(rec.run_id, (rec.host, info))
                conn.executemany(
                    "INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (run_id) DO UPDATE "
                    "SET last_seen_ns=excluded.last_seen_ns",
                    [(run_id, host, info.job, info.uid, now, now)
                     for run_id, (host, info) in runs.items()])
                conn.executemany(_UPSERT, [_row(rec, now) for rec, _ in records])
                if samples:
                    conn.executemany("INSERT INTO samples VALUES (?, ?, ?, ?, ?)",
                                     [(s.ts_ns, s.job, s.counter, s.value, s.ratio)
                                      for s in samples])
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise StoreError(f"cannot write the store {self.path}: {exc}",
                             "free disk space or fix the store's permissions") from exc

    def run_owners(self) -> dict[str, int]:
        return {r: int(u) for r, u in self._conn.execute("SELECT run_id, uid FROM runs")}

    def prune(self, retention_ns: int, now_ns: int | None = None) -> int:
        """Delete runs (with their records) and samples older than the retention; returns the
        number of rows deleted."""
        cutoff = (now_ns if now_ns is not None else time.time_ns()) - retention_ns
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            old = [r for (r,) in conn.execute("SELECT run_id FROM runs WHERE last_seen_ns < ?",
                                              (cutoff,))]
            deleted = 0
            for run_id in old:
                deleted += conn.execute("DELETE FROM records WHERE run_id = ?",
                                        (run_id,)).rowcount
                deleted += conn.execute("DELETE FROM runs WHERE run_id = ?", (run_id,)).rowcount
            deleted += conn.execute("DELETE FROM samples WHERE ts_ns < ?", (cutoff,)).rowcount
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return deleted

    # -- reading (reports) ----------------------------------------------------------------
    def runs(self) -> list[RunRow]:
        rows = self._conn.execute(
            "SELECT r.run_id, r.host, r.job, r.uid, r.first_seen_ns, r.last_seen_ns, "
            "(SELECT COUNT(*) FROM records x WHERE x.run_id = r.run_id), "
            "(SELECT COUNT(*) FROM supersteps s WHERE s.run_id = r.run_id), "
            "(SELECT COUNT(*) FROM records x WHERE x.run_id = r.run_id AND x.end_ns IS NULL) "
            "FROM runs r ORDER BY r.first_seen_ns, r.run_id").fetchall()
        return [RunRow(*row) for row in rows]

    def latest_run(self) -> str | None:
        row = self._conn.execute(
            "SELECT run_id FROM runs ORDER BY last_seen_ns DESC, run_id LIMIT 1").fetchone()
        return None if row is None else str(row[0])

    def records(self, run_id: str) -> list[SuperstepRecord]:
        rows = self._conn.execute(
            "SELECT body FROM records WHERE run_id = ? ORDER BY idx, rank, pid", (run_id,))
        return [SuperstepRecord.from_json(json.loads(body)) for (body,) in rows]

    def all_records(self) -> list[SuperstepRecord]:
        rows = self._conn.execute("SELECT body FROM records ORDER BY run_id, idx, rank, pid")
        return [SuperstepRecord.from_json(json.loads(body)) for (body,) in rows]

    def samples(self, job: str | None = None) -> list[Sample]:
        query = "SELECT ts_ns, job, counter, value, ratio FROM samples"
        args: tuple[object, ...] = ()
        if job is not None:
            query += " WHERE job = ?"
            args = (job,)
        return [Sample(*row) for row in self._conn.execute(query + " ORDER BY ts_ns", args)]


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
