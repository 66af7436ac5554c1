"""Hostile tests of the central store: garbage reaching the shipper from the local store, a
central "database" that never answers or a connection cut mid-batch (the daemon goes on
acknowledging), SQL-injection-shaped run ids, names and role names. One throwaway PostgreSQL
for the module (tests/_postgres.py)."""

from __future__ import annotations

import contextlib
import os
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from counterd.central.shipper import Shipper, ShipSettings, _Down
from counterd.daemon.store import RunInfo, Store
from counterd.data.records import SuperstepRecord
from tests._postgres import NODE, Cluster, count


def rec(index: int, run: str = "r", name: str = "step", host: str = "n1") -> SuperstepRecord:
    return SuperstepRecord(run, index, name, 0, 10, 0, 5_000, 6_000, host=host)


def local(tmp_path: Path) -> Store:
    store = Store(tmp_path / "local.db", synchronous="normal")
    store.set_shipping(True)
    return store


def shipper(store: Store, dsn: str, **kw: object) -> Shipper:
    return Shipper(store.path, ShipSettings(dsn, node="node-a", retry_min_s=0.05,
                                            retry_max_s=0.2, poll_s=0.02, **kw))  # type: ignore[arg-type]


def drain(s: Shipper) -> int:
    shipped = 0
    while n := s.ship_once():
        shipped += n
    return shipped


def test_garbage_in_the_local_store_is_refused_row_by_row_and_the_rest_ships(
        central: Cluster, tmp_path: Path) -> None:
    store = local(tmp_path)
    store.commit([(rec(i), RunInfo("j", 1001)) for i in range(3)])
    raw = sqlite3.connect(store.path, isolation_level=None)
    cols = "uid, run_id, host, pid, idx, name, rank, begin_ns, end_ns, flags, body, received_ns"
    garbage = [
        (1001, "r", "nul\x00host", 1, 1, "s", 0, 0, 1, "", "{}", 1),  # PostgreSQL holds no NUL
        (1001, "r", "n1", 2, 1, "s", 0, "not a number", 1, "", "{}", 1),  # SQLite takes any type
        (1001, "r", "n1", 3, 1, "s", 0, 1.5e300, None, "", "{}", 1),
        (1001, "r", "n1", 4, 1, "s", 0, 0, 1, "", b"\xff\xfe a blob", 1),  # not text
        (1001, "r", "n1", 6, 1, "s", 0, 0, 1, "", "{}", 1),  # its body made not UTF-8 below
        (1001, "r", "n1", 5, 1, "x" * 100_000, 0, 0, 1, "", "b" * 4_000_000, 1),  # oversized
    ]
    raw.executemany(f"INSERT INTO records ({cols}) VALUES ({','.join('?' * 12)})", garbage)
    raw.execute("UPDATE records SET body = CAST(X'FFFE6E6F74205554462D38' AS TEXT) "
                "WHERE pid = 6")
    store.commit([(rec(i), RunInfo("j", 1001)) for i in range(3, 5)])
    s = shipper(store, central.dsn(user=NODE))
    drain(s)
    assert s.stats.refused == 4  # NUL, a text and a real for a number, a blob for a text
    # what PostgreSQL can hold is shipped, the bad bytes replaced; the good records all are
    assert count(central, "host = 'n1' AND pid = 10") == 5
    assert count(central, "pid = 6 AND body LIKE '%not UTF-8'") == 1
    assert count(central, "pid = 5 AND length(body) = 4000000") == 1
    assert raw.execute("SELECT count(*) FROM ship_queue").fetchone() == (0,)  # not stuck


class Proxy:
    """A unix-socket stand-in for the database's socket directory, forwarding to the real one
    (``mode`` "pass"), or cutting the connection half-way through the first large message
    after the startup ("cut": a batch), or swallowing everything after the startup
    ("silent": a server that stops answering), or never answering at all ("mute")."""

    def __init__(self, upstream: Path) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="counterd-proxy-"))
        self.upstream = str(upstream / ".s.PGSQL.5432")
        self.mode = "pass"
        self.cuts = 0
        self._srv = socket.socket(socket.AF_UNIX)
        self._srv.bind(str(self.dir / ".s.PGSQL.5432"))
        self._srv.listen(16)
        self._open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def dsn(self, user: str = NODE) -> str:
        return f"host={self.dir} port=5432 user={user} dbname=counterd"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._srv.accept()
            except OSError:
                return
            self._open.append(client)
            if self.mode == "mute":
                continue  # accepted, never read, never answered
            up = socket.socket(socket.AF_UNIX)
            up.connect(self.upstream)
            self._open.append(up)
            mode = self.mode
            threading.Thread(target=self._pump, args=(client, up, mode), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, client, "pass"), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, mode: str) -> None:
        first = True
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                if not first and mode == "silent":
                    continue
                if not first and mode == "cut" and len(data) > 200:
                    dst.sendall(data[:len(data) // 2])
                    self.cuts += 1
                    for s in (src, dst):
                        s.shutdown(socket.SHUT_RDWR)
                    return
                first = False
                dst.sendall(data)

    def close(self) -> None:
        self._srv.close()
        for s in self._open:
            with contextlib.suppress(OSError):
                s.close()
        with contextlib.suppress(OSError):
            os.unlink(self.dir / ".s.PGSQL.5432")
        os.rmdir(self.dir)


@pytest.fixture
def proxy(central: Cluster) -> Iterator[Proxy]:
    p = Proxy(central.sockdir)
    yield p
    p.close()


def test_a_connection_cut_mid_batch_is_retried_and_lands_once(
        central: Cluster, proxy: Proxy, tmp_path: Path) -> None:
    store = local(tmp_path)
    store.commit([(rec(i), RunInfo("j", 1001)) for i in range(50)])
    s = shipper(store, proxy.dsn(), timeout_s=2)
    proxy.mode = "cut"
    with pytest.raises(_Down):
        s.ship_once()
    assert proxy.cuts == 1 and count(central) == 0  # the cut transaction left nothing
    proxy.mode = "pass"
    s._disconnect()
    assert drain(s) == 50 and count(central) == 50


def test_a_server_that_stops_answering_mid_batch_costs_one_timeout(
        central: Cluster, proxy: Proxy, tmp_path: Path) -> None:
    store = local(tmp_path)
    store.commit([(rec(i), RunInfo("j", 1001)) for i in range(5)])
    s = shipper(store, proxy.dsn(), timeout_s=1)
    proxy.mode = "silent"  # the startup goes through, then nothing does
    t0 = time.monotonic()
    with pytest.raises(_Down):
        s.ship_once()
    assert time.monotonic() - t0 < 30  # not forever: the deadline shut the socket
    assert sqlite3.connect(store.path).execute("SELECT count(*) FROM ship_queue"
                                               ).fetchone() == (5,)  # still queued
    proxy.mode = "pass"
    assert drain(s) == 5 and count(central) == 5


PROGRAM = """
import counterd
from counterd.markers.api import recorder
counterd.init()
for i in range(20):
    with counterd.superstep("s"):
        pass
assert recorder().sink.flush(10)
"""


def test_a_mute_central_server_does_not_stall_the_daemon(
        central: Cluster, proxy: Proxy, tmp_path: Path) -> None:
    from tests.daemon.conftest import DaemonProc

    proxy.mode = "mute"  # accepts the connection, never answers
    d = DaemonProc(tmp_path / "d", extra=f'[central]\ndsn = "{proxy.dsn()}"\ntimeout_s = 1\n')
    d.start()
    try:
        # acknowledged (the program's flush returned True) while the shipper waits on the
        # mute server, which it has been doing since the daemon started
        out = subprocess.run([sys.executable, "-c", PROGRAM], timeout=60, text=True,
                             env=d.env(COUNTERD_RUN_ID="m1"), capture_output=True)
        assert out.returncode == 0, out.stderr
        assert sqlite3.connect(d.store).execute(
            "SELECT count(*) FROM records").fetchone() == (20,)
        deadline = time.monotonic() + 5
        while not proxy._open and time.monotonic() < deadline:
            time.sleep(0.02)
        assert proxy._open  # the shipper is (or was) connecting to the mute server
        assert "counterd_central_backlog" in d.metrics()
    finally:
        d.stop()
    assert count(central) == 0


INJECTIONS = [
    "x'); DROP TABLE counterd.records; --",
    "'; DELETE FROM counterd.runs WHERE ''='",
    "r\"; SELECT pg_sleep(10); --",
    "$$; TRUNCATE counterd.records; $$",
]


def test_injection_shaped_run_ids_and_names_are_data(central: Cluster, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from counterd.commands import cli

    store = local(tmp_path)
    store.commit([(rec(i, run=run, name=run[:60], host=run[:40]), RunInfo("j", 1001))
                  for run in INJECTIONS for i in range(2)])
    drain(shipper(store, central.dsn(user=NODE)))
    assert count(central) == 2 * len(INJECTIONS)
    for run in INJECTIONS:
        assert count(central, "run_id = " + _literal(run)) == 2
        capsys.readouterr()
        assert cli.main(["report", "--central", central.dsn(user="u1001"), "--run", run,
                         "--format", "json"]) == 0
        (got,) = json.loads(capsys.readouterr().out)["runs"]
        assert got["run_id"] == run and got["records"] == 2
    assert count(central) == 2 * len(INJECTIONS)  # nothing dropped, deleted or truncated


def test_an_injection_shaped_role_name_is_an_identifier(central: Cluster) -> None:
    import psycopg

    from counterd.central import schema

    with psycopg.connect(central.dsn(), autocommit=True) as conn:
        with pytest.raises(psycopg.errors.UndefinedObject):
            schema.add_reader(conn, 'x"; DROP SCHEMA counterd CASCADE; --', 1)
        assert conn.execute("SELECT to_regclass('counterd.records')").fetchone() == (
            "counterd.records",)


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


@pytest.mark.parametrize("field, value, says", [
    ("end", 4_000, "end_ns 4000 before begin_ns 5000"),
    ("rank", 1 << 40, "outside 32 bits"),
    ("pid", -1, "outside 32 bits"),
    ("idx", -3, "superstep index -3"),
    ("name", "n" * 2_000, "longer than"),
    ("run", "r" * 300, "run_id must have 1 to 256 characters"),
])
def test_a_node_that_ships_records_outside_a_records_bounds_fails_the_report_in_one_line(
        central: Cluster, capsys: pytest.CaptureFixture[str], field: str, value: object,
        says: str) -> None:
    """The node role calls ship_records itself with a row no recorder makes (the report
    reads the rows' fields without making records: its SQL check must catch what
    SuperstepRecord refuses): the report says which node's record is damaged, exit 2."""
    import psycopg

    from counterd.commands import cli
    from tests._postgres import ADMIN

    row: dict[str, object] = {"uid": 1001, "run": "r", "host": "n1", "pid": 10, "idx": 1,
                           "node": "evil", "name": "step", "rank": 0, "begin": 5_000,
                           "end": 6_000, "body": "{}", "committed": 1}
    row[field] = value
    good = dict(row, idx=0, end=6_000, rank=0, pid=10, name="step")
    with psycopg.connect(central.dsn(user=NODE), autocommit=True) as conn:
        conn.execute("SELECT counterd.ship_runs(%s, %s, %s, %s, %s, %s, %s)",
                     [[1001], [row["run"]], ["evil"], ["n1"], ["j"], [1], [1]])
        conn.execute("SELECT counterd.ship_records(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, "
                     "%s)", [list(c) for c in zip(good.values(), row.values(), strict=True)])
    assert cli.main(["report", "--central", central.dsn(user=ADMIN), "--run",
                     str(row["run"])]) == 2
    err = capsys.readouterr().err
    assert f"damaged record of run {row['run']!r:.20}" in err and says in err
    assert "from node 'evil'" in err
    assert len(err.strip().splitlines()) <= 2  # the error and its fix
