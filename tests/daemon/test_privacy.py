"""The store is the daemon user's alone; run ids are namespaced by uid; users read their own
runs through the daemon (the Reliability issue: a 0644 store let anyone read every run, and
one RECORD under a run id made another user's records of that id refused)."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
import sqlite3
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from counterd.commands import cli
from counterd.daemon.auth import Peer
from counterd.daemon.query import Queries
from counterd.daemon.schema import SCHEMA_VERSION, migrate, schema_version
from counterd.daemon.store import RunInfo, Store
from counterd.data.errors import StoreError
from counterd.data.records import SuperstepRecord
from counterd.wire import protocol, query_frames
from counterd.wire.protocol import FrameType, ProtocolError
from tests.daemon import _queries

from .conftest import DaemonProc


def rec(index: int, run: str = "r", pid: int = 100, name: str = "s") -> SuperstepRecord:
    return SuperstepRecord(run_id=run, index=index, name=name, rank=0, pid=pid, cpu=0,
                           begin_ns=1_000, end_ns=2_000, host="h")


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@contextlib.contextmanager
def _umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


# -- files -------------------------------------------------------------------------------------
def test_store_directory_and_files_are_private_whatever_the_umask(tmp_path: Path) -> None:
    path = tmp_path / "state" / "counterd" / "counterd.db"
    with _umask(0o022):
        store = Store(path)
        store.commit([(rec(0), RunInfo("j", 1000))])
        assert _mode(path.parent) == 0o700  # the directory made for the store
        for name in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
            assert _mode(name) == 0o600, name
        store.close()


def test_a_world_readable_store_is_made_private_on_open(tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture
                                                        ) -> None:
    path = tmp_path / "s.db"
    Store(path).close()
    os.chmod(path, 0o644)
    with caplog.at_level(logging.WARNING, logger="counterd.daemon"):
        Store(path).close()
    assert _mode(path) == 0o600
    assert any("readable by others" in r.getMessage() for r in caplog.records)


# -- namespaces --------------------------------------------------------------------------------
def test_the_same_run_id_from_two_uids_is_two_runs(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    store.commit([(rec(0, pid=1), RunInfo("a", 1000)), (rec(1, pid=1), RunInfo("a", 1000))])
    store.commit([(rec(0, pid=1, name="squat"), RunInfo("b", 1001))])  # same key, other uid
    runs = {(r.uid, r.run_id): r.records for r in store.runs()}
    assert runs == {(1000, "r"): 2, (1001, "r"): 1}
    assert [r.name for r in store.records("r", 1000)] == ["s", "s"]
    assert [r.name for r in store.records("r", 1001)] == ["squat"]
    assert [r.uid for r in store.runs(1001)] == [1001]
    with pytest.raises(Exception, match="exists for uids 1000, 1001"):
        store.records("r")  # whose? the caller must say
    store.close()


def test_migration_3_keeps_runs_with_their_recorded_uid(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "old.db", isolation_level=None)
    assert migrate(conn, target=2) == 2
    conn.execute("INSERT INTO runs VALUES ('old', 'h', 'j', 1234, 1, 1)")
    body = json.dumps(rec(0, run="old").to_json())
    conn.execute("INSERT INTO records VALUES ('old', 'h', 100, 0, 's', 0, 1000, 2000, '', ?, 1)",
                 (body,))
    conn.close()
    store = Store(tmp_path / "old.db")
    assert schema_version(store._conn) == SCHEMA_VERSION  # through 3, and every later one
    [run] = store.runs()
    assert (run.uid, run.run_id, run.records, run.supersteps) == (1234, "old", 1, 1)
    assert store.records("old", 1234) == [rec(0, run="old")]
    store.close()


# -- disk full ---------------------------------------------------------------------------------
def test_a_full_store_says_disk_full_and_rolls_back(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    store.commit([(rec(0), RunInfo("j", 0))])
    pages = store._conn.execute("PRAGMA page_count").fetchone()[0]
    store._conn.execute(f"PRAGMA max_page_count = {pages}")
    big = [(rec(i, name="x" * 1000), RunInfo("j", 0)) for i in range(1, 200)]
    with pytest.raises(StoreError, match=r"disk full \(database or WAL cannot grow\)"):
        store.commit(big)
    assert not store._conn.in_transaction
    assert len(store.records("r", 0)) == 1  # nothing of the failed batch
    store._conn.execute("PRAGMA max_page_count = 1073741823")
    store.commit(big)  # the connection is usable again
    assert len(store.records("r", 0)) == 200
    store.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_a_full_file_system_says_disk_full(tmp_path: Path) -> None:
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        store = Store(mnt / "s.db")
        with pytest.raises(StoreError, match="disk full") as err:
            for i in range(100):
                store.commit([(rec(i * 100 + j, name="x" * 1000), RunInfo("j", 0))
                               for j in range(100)])
        assert "no transaction is active" not in str(err.value)
        assert not store._conn.in_transaction
        store.close()
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


# -- queries -----------------------------------------------------------------------------------
ALICE, BOB = Peer(10, 1000, 1000), Peer(11, 1001, 1001)


@pytest.fixture
def two_users_store(tmp_path: Path) -> Path:
    store = Store(tmp_path / "s.db")
    store.commit([(rec(i, pid=p, name="alice"), RunInfo("a", 1000))
                  for i in range(300) for p in (1, 2)])
    store.commit([(rec(0, name="bob"), RunInfo("b", 1001)),
                  (rec(0, run="bobs", name="bob"), RunInfo("b", 1001))])
    store.close()
    return tmp_path / "s.db"


def test_a_user_is_answered_with_their_own_runs_only(two_users_store: Path) -> None:
    queries = Queries(two_users_store)
    [page] = _queries.pages(queries, "runs", ALICE)
    assert [(i["uid"], i["run_id"]) for i in page.items] == [(1000, "r")]
    [page] = _queries.pages(queries, "runs", BOB)
    assert sorted((i["uid"], i["run_id"]) for i in page.items) == [(1001, "bobs"), (1001, "r")]
    # root, or a member of the allowed group: everyone's
    [page] = _queries.pages(queries, "runs", BOB, privileged=True)
    assert len(page.items) == 3
    records = [i for p in _queries.pages(queries, "records", BOB, run_id="r") for i in p.items]
    assert [r["name"] for r in records] == ["bob"]
    ftype, p = _queries.answer(queries, {"s": 1, "what": "records", "uid": 1000}, BOB)
    assert ftype is FrameType.ERROR and p["code"] == "forbidden" and p["s"] == 1
    ftype, p = _queries.answer(queries, {"s": 2, "what": "records", "run_id": "bobs"}, ALICE)
    assert ftype is FrameType.ERROR and p["code"] == "no_such_run"
    # the clock QUERY (one run across nodes) is scoped the same way
    ftype, p = _queries.answer(queries, {"s": 3, "what": "clock", "run_id": "bobs"}, ALICE)
    assert ftype is FrameType.ERROR and p["code"] == "no_such_run"
    ftype, p = _queries.answer(queries, {"s": 4, "what": "clock", "uid": 1000}, BOB)
    assert ftype is FrameType.ERROR and p["code"] == "forbidden"
    ftype, p = _queries.answer(queries, {"s": 5, "what": "clock", "run_id": "bobs"}, BOB)
    assert ftype is FrameType.RESULT, p
    queries.close()


def test_records_come_in_pages_under_the_frame_limit_each_exactly_once(
        two_users_store: Path) -> None:
    queries = Queries(two_users_store)
    pages = _queries.pages(queries, "records", ALICE, max_frame=4096, run_id="r")
    assert len(pages) > 10
    got = [(i["pid"], i["index"]) for p in pages for i in p.items]
    assert sorted(got) == [(p, i) for p in (1, 2) for i in range(300)]
    assert all(len(p.encode()) <= 4096 for p in pages)
    assert {(p.uid, p.run_id) for p in pages} == {(1000, "r")}
    queries.close()


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats()
                     | st.text(max_size=20),
                     lambda c: st.lists(c, max_size=5)
                     | st.dictionaries(st.text(max_size=5), c, max_size=3), max_leaves=10)


@given(st.dictionaries(st.sampled_from(["s", "what", "run_id", "uid", "after", "x"]), _JSON))
def test_any_query_payload_is_a_query_or_a_protocol_error(payload: dict[str, Any]) -> None:
    try:
        query = query_frames.Query.decode(payload)
    except ProtocolError as exc:
        assert exc.code in ("bad_seq", "bad_query")
    else:
        assert query.what in query_frames.QUERY_WHATS
        assert query_frames.Query.decode(json.loads(query.encode()[protocol.HEADER_BYTES:])) \
            == query


@given(st.dictionaries(st.sampled_from(["s", "items", "after", "uid", "run_id"]), _JSON))
def test_any_result_payload_is_a_result_or_a_protocol_error(payload: dict[str, Any]) -> None:
    try:
        result = query_frames.Result.decode(payload)
    except ProtocolError as exc:
        assert exc.code in ("bad_seq", "bad_reply")
    else:
        assert all(isinstance(i, dict) for i in result.items)


# -- two real users against a real daemon ------------------------------------------------------
def _cli(*argv: str) -> dict[str, Any]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(argv))
    return {"code": code, "out": out.getvalue(), "err": err.getvalue()}


@pytest.fixture
def users_daemon() -> Iterator[DaemonProc]:
    if os.geteuid() != 0 or not shutil.which("useradd"):
        pytest.skip("needs root and useradd to create two test users")
    tmp = Path(tempfile.mkdtemp(prefix="counterd-privacy-", dir="/tmp"))
    os.chmod(tmp, 0o755)  # the other users must reach the socket
    with _umask(0o022):
        d = DaemonProc(tmp / "d").start()
    yield d
    if d.alive():
        d.stop()
    shutil.rmtree(tmp, ignore_errors=True)


def test_users_see_their_own_runs_through_the_daemon_and_cannot_read_the_store(
        users_daemon: DaemonProc) -> None:
    from .test_users import _ensure_user, as_user

    alice, bob = _ensure_user("cdtest_alice"), _ensure_user("cdtest_bob")
    d = users_daemon
    store = str(d.store)

    def send(job: str, name: str) -> Any:
        from counterd.markers.sinks.socket import SocketSink

        sink = SocketSink(d.socket, job=job)
        sink.record(SuperstepRecord(run_id="same", index=0, name=name, rank=0,
                                    pid=os.getpid(), cpu=0, begin_ns=1, end_ns=2))
        ok = sink.flush(10)
        sink.close()
        return ok

    assert as_user(alice, lambda: send("a", "alice")) is True
    assert as_user(bob, lambda: send("b", "bob")) is True
    assert _mode(d.store) == 0o600  # the daemon ran with umask 022

    cfg = str(d.config)  # the CLI takes the daemon's socket from it
    got = as_user(alice, lambda: _cli("runs", "--config", cfg, "--json"))
    assert got["code"] == 0, got
    assert [(r["uid"], r["run_id"]) for r in json.loads(got["out"])] == [(alice.pw_uid, "same")]
    got = as_user(alice, lambda: _cli("report", "same", "--config", cfg, "--json"))
    assert got["code"] == 0, got
    assert "alice" in got["out"] and "bob" not in got["out"]
    got = as_user(alice, lambda: _cli("report", "same", "--uid", str(bob.pw_uid),
                                      "--config", cfg))
    assert got["code"] == 2 and "may not read the runs of uid" in got["err"], got
    assert got["err"].count("\n") == 1
    got = as_user(bob, lambda: _cli("runs", "--store", store))
    assert got["code"] == 2 and got["err"].count("\n") == 1, got
    assert "private to the daemon's user" in got["err"], got
    assert as_user(bob, lambda: os.access(store, os.R_OK)) is False
    # root asks the daemon too and sees both users' runs
    root = _cli("runs", "--config", cfg, "--json")
    assert sorted(r["uid"] for r in json.loads(root["out"])) == sorted(
        [alice.pw_uid, bob.pw_uid])
