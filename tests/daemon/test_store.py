"""The SQLite store: WAL, round trip, duplicates, migrations, retention."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from counterd.backends.base import CounterValue
from counterd.daemon.schema import SCHEMA_VERSION, migrate, schema_version
from counterd.daemon.store import RunInfo, Sample, Store, open_readonly
from counterd.data.errors import StoreError
from counterd.data.events import Source
from counterd.data.records import SuperstepRecord


def rec(index: int, rank: int = 0, end: int | None = 2_000, run: str = "r1",
        pid: int = 100) -> SuperstepRecord:
    return SuperstepRecord(
        run_id=run, index=index, name=f"s{index}", rank=rank, pid=pid + rank, cpu=0,
        begin_ns=1_000, end_ns=end,
        counters={"loads": CounterValue(10.0 * (rank + 1), Source.SIMULATED)},
        params={"n": 5}, flags=frozenset() if end else frozenset({"incomplete"}),
        backend="sim", host="h")


def test_wal_round_trip_and_view(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    records = [rec(i, r) for i in range(3) for r in range(2)]
    store.commit([(r, RunInfo("job", 7)) for r in records],
                 [Sample(time.time_ns(), "job", "loads", 5.0, 1.0)])
    store.close()
    conn = sqlite3.connect(tmp_path / "s.db")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    rows = conn.execute("SELECT idx, processors, time_ns FROM supersteps ORDER BY idx").fetchall()
    assert rows == [(0, 2, 1000), (1, 2, 1000), (2, 2, 1000)]
    # The SQL view is the store's reading of the one superstep aggregate (records.Superstep).
    from counterd.data.records import Superstep

    assert rows == [(s.index, len({r.rank for r in s.records}), s.time_ns)
                    for s in Superstep.group(records)]
    ro = open_readonly(tmp_path / "s.db")
    assert ro.records("r1") == sorted(records, key=lambda r: (r.index, r.rank))
    [run] = ro.runs()
    assert (run.run_id, run.job, run.uid, run.records, run.supersteps) == ("r1", "job", 7, 6, 3)
    assert ro.samples("job")[0].value == 5.0


def test_duplicates_ignored_and_complete_replaces_incomplete(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    info = RunInfo("j", 0)
    store.commit([(rec(0, end=None), info)])
    store.commit([(rec(0), info), (rec(0), info)])  # resent after a reconnect
    store.commit([(rec(0, end=None), info)])  # a late incomplete never overwrites
    assert store.records("r1") == [rec(0)]


def test_the_view_has_span_work_and_skew_as_the_superstep_aggregate(tmp_path: Path) -> None:
    from dataclasses import replace

    from counterd.data.records import Superstep

    # Processor 1 begins 700 ns late and works 300 ns; processor 0 works 1,000 ns.
    records = [rec(0, 0), replace(rec(0, 1), begin_ns=1_700), rec(1, 0, end=None), rec(1, 1)]
    store = Store(tmp_path / "s.db")
    store.commit([(r, RunInfo("job", 7)) for r in records], [])
    store.close()
    conn = sqlite3.connect(tmp_path / "s.db")
    rows = conn.execute("SELECT idx, time_ns, work_ns, skew_ns FROM supersteps ORDER BY idx"
                        ).fetchall()
    assert rows == [(0, 1_000, 1_000, 700), (1, None, None, 0)]
    assert rows == [(s.index, s.time_ns, s.slowest_work_ns, s.skew_ns)
                    for s in Superstep.group(records)]


def test_migrations_from_version_1(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "old.db", isolation_level=None)
    assert migrate(conn, target=1) == 1
    conn.execute("INSERT INTO runs VALUES ('r1', 'h', 'j', 0, 1, 1)")
    conn.close()
    store = Store(tmp_path / "old.db")
    assert schema_version(store._conn) == SCHEMA_VERSION
    assert store.runs()[0].run_id == "r1"
    versions = [v for (v,) in store._conn.execute("SELECT version FROM schema_version")]
    assert versions == list(range(1, SCHEMA_VERSION + 1))


def test_newer_store_is_refused(tmp_path: Path) -> None:
    Store(tmp_path / "s.db").close()
    conn = sqlite3.connect(tmp_path / "s.db")
    conn.execute("INSERT INTO schema_version VALUES (99, 0)")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="newer"):
        Store(tmp_path / "s.db")


def test_retention_prunes_old_runs_and_samples(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    store.commit([(rec(0, run="old"), RunInfo("j", 0))],
                 [Sample(1, "j", "loads", 1.0, 1.0)])
    store._conn.execute("UPDATE runs SET last_seen_ns = 1")
    store.commit([(rec(0, run="new"), RunInfo("j", 0))],
                 [Sample(time.time_ns(), "j", "loads", 2.0, 1.0)])
    deleted = store.prune(retention_ns=86400 * 10**9)
    assert deleted == 3  # old record, old run, old sample
    assert [r.run_id for r in store.runs()] == ["new"]
    assert [s.value for s in store.samples()] == [2.0]
