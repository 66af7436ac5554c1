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

Privacy: the store holds every user's runs, so it is the daemon user's alone. The database, its
WAL and shared-memory files are 0600 and a directory created for them 0700, whatever the umask
(:func:`_private_file`); a store found readable by others is made private when opened, with a
log line. Run ids are namespaced by the uid that sent them (schema 3): the same run id from two
users is two runs, so no user can claim, fill or block another's run id. Users read their own
runs through the daemon (:mod:`counterd.daemon.query`), never the file.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import stat
import time
from collections.abc import Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from counterd import strictjson
from counterd.clocks import Anchor, ClockDomain, kept_anchors
from counterd.errors import BadInput, CounterdError
from counterd.jobid import source_of
from counterd.records import SuperstepRecord

log = logging.getLogger("counterd.daemon")

# Schema history (each entry is applied once, in order, in its own transaction):
#   1 - runs, records (one row per processor per superstep, JSON body), samples.
#   2 - the supersteps view (time = max end - min begin over processors) and time indices
#       used by retention.
#   3 - run ids are namespaced by the owning uid (the Reliability issue: one RECORD under a
#       run id made another user's records of that id refused): runs are keyed on (uid,
#       run_id), records on (uid, run_id, host, pid, idx), the view groups by uid too.
#       Existing runs keep the uid they were recorded with.
#   4 - the supersteps view gains work_ns and skew_ns.
#   5 - usage (records and bytes per uid, kept by triggers: the store quota) and the run
#       listing's indices (keyset pages).
#   6 - clock domains of runs (issue 32): the node's boot id, the client's time namespace and
#       its CLOCK_MONOTONIC offset from the daemon's, and (monotonic, realtime) anchors the
#       daemon took at the run's start, periodically and at its clients' ends.
#   7 - the central shipper's queue and watermark (ship_queue, ship_state; issue 32 item 3).
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
    """
    CREATE TABLE runs_v3 (
        uid           INTEGER NOT NULL,      -- SO_PEERCRED uid of the clients (the namespace)
        run_id        TEXT NOT NULL,
        host          TEXT NOT NULL,
        job           TEXT NOT NULL,
        first_seen_ns INTEGER NOT NULL,      -- wall clock (time.time_ns)
        last_seen_ns  INTEGER NOT NULL,
        PRIMARY KEY (uid, run_id)
    );
    INSERT INTO runs_v3 SELECT uid, run_id, host, job, first_seen_ns, last_seen_ns FROM runs;
    CREATE TABLE records_v3 (
        uid         INTEGER NOT NULL,        -- the run's uid (runs.uid)
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
        PRIMARY KEY (uid, run_id, host, pid, idx)
    ) WITHOUT ROWID;
    INSERT INTO records_v3
        SELECT COALESCE((SELECT r.uid FROM runs r WHERE r.run_id = x.run_id), 0), x.run_id,
               x.host, x.pid, x.idx, x.name, x.rank, x.begin_ns, x.end_ns, x.flags, x.body,
               x.received_ns
        FROM records x;
    DROP VIEW supersteps;
    DROP INDEX records_received;
    DROP TABLE records;
    DROP TABLE runs;
    ALTER TABLE runs_v3 RENAME TO runs;
    ALTER TABLE records_v3 RENAME TO records;
    CREATE INDEX records_received ON records(received_ns);
    CREATE VIEW supersteps AS
        SELECT uid, run_id, idx, name,
               COUNT(DISTINCT rank) AS processors,
               MIN(begin_ns) AS begin_ns,
               CASE WHEN COUNT(end_ns) = COUNT(*) THEN MAX(end_ns) END AS end_ns,
               CASE WHEN COUNT(end_ns) = COUNT(*) THEN MAX(end_ns) - MIN(begin_ns) END
                   AS time_ns,
               SUM(end_ns IS NULL) AS incomplete
        FROM records GROUP BY uid, run_id, idx, name;
    """,
    """
    -- 4: the superstep's work (its slowest processor's own time: what F predicts) and start
    -- skew beside its span (time_ns): counterd.records.Superstep.slowest_work_ns, skew_ns.
    DROP VIEW supersteps;
    CREATE VIEW supersteps AS
        SELECT uid, run_id, idx, name,
               COUNT(DISTINCT rank) AS processors,
               MIN(begin_ns) AS begin_ns,
               CASE WHEN COUNT(end_ns) = COUNT(*) THEN MAX(end_ns) END AS end_ns,
               CASE WHEN COUNT(end_ns) = COUNT(*) THEN MAX(end_ns) - MIN(begin_ns) END
                   AS time_ns,
               CASE WHEN COUNT(end_ns) = COUNT(*) THEN MAX(end_ns - begin_ns) END AS work_ns,
               MAX(begin_ns) - MIN(begin_ns) AS skew_ns,
               SUM(end_ns IS NULL) AS incomplete
        FROM records GROUP BY uid, run_id, idx, name;
    """,
    """
    -- 5: what each uid keeps (the per-uid store quota, counterd.daemon.quota): its records
    -- and their bytes (the JSON bodies), kept by triggers in the transaction that changes
    -- them; and the indices of the keyset-paged run listing (Store.runs: one page is an
    -- index range, however many runs there are).
    CREATE TABLE usage (
        uid     INTEGER PRIMARY KEY,
        records INTEGER NOT NULL,
        bytes   INTEGER NOT NULL
    );
    INSERT INTO usage SELECT uid, COUNT(*), SUM(length(CAST(body AS BLOB))) FROM records
        GROUP BY uid;
    CREATE TRIGGER usage_insert AFTER INSERT ON records BEGIN
        INSERT INTO usage VALUES (NEW.uid, 1, length(CAST(NEW.body AS BLOB)))
        ON CONFLICT (uid) DO UPDATE SET records = records + 1,
                                        bytes = bytes + excluded.bytes;
    END;
    CREATE TRIGGER usage_update AFTER UPDATE OF body ON records BEGIN
        UPDATE usage SET bytes = bytes - length(CAST(OLD.body AS BLOB))
                                       + length(CAST(NEW.body AS BLOB))
        WHERE uid = NEW.uid;
    END;
    CREATE TRIGGER usage_delete AFTER DELETE ON records BEGIN
        UPDATE usage SET records = records - 1, bytes = bytes - length(CAST(OLD.body AS BLOB))
        WHERE uid = OLD.uid;
    END;
    CREATE INDEX runs_by_uid ON runs(uid, first_seen_ns, run_id);
    CREATE INDEX runs_by_time ON runs(first_seen_ns, run_id, uid);
    """,
    """
    -- 6: each run's clock domain (counterd.clocks): what its records' CLOCK_MONOTONIC is
    -- (this kernel's boot, the client's time namespace, offset from the daemon's own by
    -- mono_offset_ns: NULL where the daemon could not read it) and anchors (monotonic,
    -- realtime, read interval) on the daemon's clock, taken when a client declared the run
    -- (CONTEXT), every ANCHOR_PERIOD_S while its records are committed, and when a client of
    -- it disconnected. Runs with no domain row (recorded before) have none.
    CREATE TABLE clock_domains (
        uid            INTEGER NOT NULL,
        run_id         TEXT NOT NULL,
        boot_id        TEXT NOT NULL,
        timens         TEXT NOT NULL,
        mono_offset_ns INTEGER,
        sync_bound_ns  INTEGER,
        PRIMARY KEY (uid, run_id)
    ) WITHOUT ROWID;
    CREATE TABLE clock_anchors (
        uid     INTEGER NOT NULL,
        run_id  TEXT NOT NULL,
        mono_ns INTEGER NOT NULL,            -- the daemon's CLOCK_MONOTONIC
        real_ns INTEGER NOT NULL,            -- CLOCK_REALTIME
        read_ns INTEGER NOT NULL,
        PRIMARY KEY (uid, run_id, mono_ns)
    ) WITHOUT ROWID;
    CREATE INDEX clock_anchors_time ON clock_anchors(real_ns);
    """,
    """
    -- 7: the shipper's queue to the central store (counterd.central.shipper). While shipping
    -- is on (ship_state.enabled, set from [central] at start), triggers queue the key of each
    -- record committed or completed and of each clock anchor, in the committing transaction:
    -- what is committed is queued. The shipper ships in seq order and, once the central
    -- database has committed a batch, deletes it from the queue and moves the watermark
    -- (shipped_seq) in one local transaction, so a restart resumes after what was shipped.
    -- Past central.max_backlog the oldest entries leave the queue (dropped counts them); the
    -- records stay in this store.
    CREATE TABLE ship_state (
        one         INTEGER PRIMARY KEY CHECK (one = 1),
        enabled     INTEGER NOT NULL,
        shipped_seq INTEGER NOT NULL,        -- the highest seq the central store holds
        dropped     INTEGER NOT NULL         -- entries dropped past the backlog bound
    );
    INSERT INTO ship_state VALUES (1, 0, 0, 0);
    CREATE TABLE ship_queue (
        seq          INTEGER PRIMARY KEY AUTOINCREMENT,
        kind         TEXT NOT NULL,          -- 'r': a record, 'a': a clock anchor
        uid          INTEGER NOT NULL,
        run_id       TEXT NOT NULL,
        host         TEXT NOT NULL,          -- a record's ('' for an anchor)
        pid          INTEGER NOT NULL,       -- a record's (0 for an anchor)
        idx          INTEGER NOT NULL,       -- a record's index, an anchor's mono_ns
        committed_ns INTEGER NOT NULL        -- wall clock of the local commit
    );
    CREATE TRIGGER ship_record_insert AFTER INSERT ON records
    WHEN (SELECT enabled FROM ship_state) BEGIN
        INSERT INTO ship_queue (kind, uid, run_id, host, pid, idx, committed_ns)
        VALUES ('r', NEW.uid, NEW.run_id, NEW.host, NEW.pid, NEW.idx, NEW.received_ns);
    END;
    CREATE TRIGGER ship_record_update AFTER UPDATE OF body ON records
    WHEN (SELECT enabled FROM ship_state) BEGIN
        INSERT INTO ship_queue (kind, uid, run_id, host, pid, idx, committed_ns)
        VALUES ('r', NEW.uid, NEW.run_id, NEW.host, NEW.pid, NEW.idx, NEW.received_ns);
    END;
    CREATE TRIGGER ship_anchor_insert AFTER INSERT ON clock_anchors
    WHEN (SELECT enabled FROM ship_state) BEGIN
        INSERT INTO ship_queue (kind, uid, run_id, host, pid, idx, committed_ns)
        VALUES ('a', NEW.uid, NEW.run_id, '', 0, NEW.mono_ns, NEW.real_ns);
    END;
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)


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


class StoreError(CounterdError):
    """The store cannot be opened or written."""


def _connect(path: Path, synchronous: str, *, readonly: bool = False) -> sqlite3.Connection:
    try:
        if readonly:
            conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10.0,
                                   isolation_level=None, check_same_thread=False)
        else:
            _private_file(path)
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


_PRIVATE_FILE = 0o600
_PRIVATE_DIR = 0o700
_OTHERS = stat.S_IRWXG | stat.S_IRWXO


def _private_file(path: Path) -> None:
    """Create the store's directory (0700) and file (0600) if missing, whatever the umask, and
    take group and other access away from an existing store and its WAL and shared-memory
    files. SQLite creates ``-wal`` and ``-shm`` with the database file's mode, so they follow.
    A directory that exists is left as it is: it may be shared (the socket's, in tests)."""
    if not path.parent.is_dir():
        path.parent.mkdir(parents=True, mode=_PRIVATE_DIR)
        os.chmod(path.parent, _PRIVATE_DIR)  # mkdir's mode is masked by the umask
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, _PRIVATE_FILE)
    os.close(fd)
    for name in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        with contextlib.suppress(FileNotFoundError):
            mode = name.stat().st_mode
            if mode & _OTHERS:
                os.chmod(name, stat.S_IMODE(mode) & ~_OTHERS)
                log.warning("the store file %s was readable by others (mode %04o): made it "
                            "private (%04o)", name, stat.S_IMODE(mode),
                            stat.S_IMODE(mode) & ~_OTHERS)


def schema_version(conn: sqlite3.Connection) -> int:
    row = conn.execute("SELECT name FROM sqlite_master WHERE name='schema_version'").fetchone()
    if row is None:
        return 0
    got = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0]
    return int(got or 0)


def _statements(script: str) -> Iterator[str]:
    """The statements of ``script``, split at the semicolons that end one (a trigger's body
    holds semicolons of its own: :func:`sqlite3.complete_statement` says where it ends)."""
    statement = ""
    for piece in script.split(";"):
        statement += piece + ";"
        if sqlite3.complete_statement(statement):
            if statement.strip(" \n;"):
                yield statement
            statement = ""
    if statement.strip(" \n;"):
        yield statement


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
            for statement in _statements(MIGRATIONS[version - 1]):
                conn.execute(statement)
            conn.execute("INSERT INTO schema_version VALUES (?, ?)", (version, time.time_ns()))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    return max(current, target)


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
