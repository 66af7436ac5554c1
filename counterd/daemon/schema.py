"""The store's file and schema: the SQLite file opened private (0600, its directory 0700) and in
WAL mode (:func:`connect`), and the schema's migrations (:data:`MIGRATIONS`, applied by
:func:`migrate`). :mod:`counterd.daemon.store` reads and writes through it.

Schema changes are migrations: ``schema_version`` holds the version, :data:`MIGRATIONS` the
ordered scripts; opening a store applies the missing ones in one transaction each, and a store
written by a newer counterd is refused rather than guessed at. (The central database's schema
is :mod:`counterd.central.schema`.)
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from counterd.data.errors import StoreError

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
    -- time_ns: counterd.data.records.Superstep.time_ns in SQL, for readers of the database
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
    -- skew beside its span (time_ns): counterd.data.records.Superstep.slowest_work_ns, skew_ns.
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
    -- 6: each run's clock domain (counterd.data.clocks): what its records' CLOCK_MONOTONIC is
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

def connect(path: Path, synchronous: str, *, readonly: bool = False) -> sqlite3.Connection:
    try:
        if readonly:
            conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10.0,
                                   isolation_level=None, check_same_thread=False)
        else:
            private_file(path)
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


def private_file(path: Path) -> None:
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
