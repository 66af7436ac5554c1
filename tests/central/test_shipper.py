"""The central store: the shipper (idempotence, resume after restarts of the daemon and the
database, the backlog bound) and its security (row-level security between two real reader
roles, a node role that can only insert). One throwaway PostgreSQL for the module
(tests/_postgres.py); skipped with the reason without PostgreSQL or psycopg."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from counterd.central.shipper import Shipper, ShipSettings
from counterd.daemon.store import RunInfo, Store
from counterd.data.records import SuperstepRecord
from tests._postgres import ADMIN, NODE, Cluster, count


def rec(index: int, run: str = "job-1", host: str = "n1", end: int | None = 6_000,
        rank: int = 0) -> SuperstepRecord:
    return SuperstepRecord(run, index, "step", rank, 10 + rank, 0, 5_000, end, host=host,
                           flags=frozenset() if end is not None else frozenset({"incomplete"}))


def local_store(tmp_path: Path) -> Store:
    store = Store(tmp_path / "local.db", synchronous="normal")
    store.set_shipping(True)
    return store


def shipper(store: Store, c: Cluster, **kw: object) -> Shipper:
    settings = ShipSettings(c.dsn(user=NODE), node="node-a", retry_min_s=0.05,
                            retry_max_s=0.2, poll_s=0.02, timeout_s=5, **kw)  # type: ignore[arg-type]
    return Shipper(store.path, settings)


def drain(s: Shipper) -> int:
    shipped = 0
    while n := s.ship_once():
        shipped += n
    return shipped


def test_the_same_batch_twice_leaves_one_row_each(central: Cluster, tmp_path: Path) -> None:
    store = local_store(tmp_path)
    store.commit([(rec(i), RunInfo("j", 1001)) for i in range(3)])
    queued = sqlite3.connect(store.path).execute("SELECT * FROM ship_queue").fetchall()
    s = shipper(store, central)
    assert drain(s) == 3
    assert count(central) == 3
    # the daemon killed after the central commit, before dequeueing: the batch again
    raw = sqlite3.connect(store.path, isolation_level=None)
    raw.executemany("INSERT INTO ship_queue VALUES (?, ?, ?, ?, ?, ?, ?, ?)", queued)
    assert drain(s) == 3
    assert count(central) == 3
    assert count(central, "uid = 1001 AND run_id = 'job-1' AND node = 'node-a'") == 3
    assert s.stats.shipped == 6 and s.stats.refused == 0 and s.stats.lag_s is not None


def test_a_complete_record_replaces_an_incomplete_one_never_the_reverse(
        central: Cluster, tmp_path: Path) -> None:
    store = local_store(tmp_path)
    s = shipper(store, central)
    store.commit([(rec(0, end=None), RunInfo("j", 1001))])
    drain(s)
    assert count(central, "end_ns IS NULL") == 1
    store.commit([(rec(0, end=7_000), RunInfo("j", 1001))])
    drain(s)
    assert count(central, "end_ns = 7000") == 1
    # an incomplete copy of it shipped late (an old queue entry) changes nothing
    import psycopg

    with psycopg.connect(central.dsn(user=NODE), autocommit=True) as conn:
        conn.execute("SELECT counterd.ship_records(%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)",
                     ([1001], ["job-1"], ["n1"], [10], [0], ["x"], ["step"], [0], [5000],
                      [None], ["{}"], [0]))
    assert count(central, "end_ns = 7000") == 1 and count(central) == 1


def test_a_restarted_shipper_resumes_at_the_watermark(central: Cluster, tmp_path: Path) -> None:
    store = local_store(tmp_path)
    store.commit([(rec(i), RunInfo("j", 1001)) for i in range(5)])
    first = shipper(store, central, batch_size=2)
    assert first.ship_once() == 2  # then the daemon stops
    first.stop()
    shipped_seq, = sqlite3.connect(store.path).execute(
        "SELECT shipped_seq FROM ship_state").fetchone()
    assert shipped_seq == 2
    store.close()
    store = Store(tmp_path / "local.db", synchronous="normal")  # the daemon again
    store.set_shipping(True)
    store.commit([(rec(i), RunInfo("j", 1001)) for i in range(5, 7)])
    assert drain(shipper(store, central, batch_size=2)) == 5
    assert count(central) == 7


def test_nothing_is_queued_while_shipping_is_off(central: Cluster, tmp_path: Path) -> None:
    store = Store(tmp_path / "local.db", synchronous="normal")
    store.set_shipping(False)  # a daemon without [central]
    store.commit([(rec(0), RunInfo("j", 1001))])
    assert sqlite3.connect(store.path).execute("SELECT count(*) FROM ship_queue"
                                               ).fetchone() == (0,)


def test_database_down_then_back(central: Cluster, tmp_path: Path) -> None:
    store = local_store(tmp_path)
    s = shipper(store, central)
    s.start()
    try:
        central.stop()
        t0 = time.monotonic()
        store.commit([(rec(i), RunInfo("j", 1001)) for i in range(4)])  # the node goes on
        assert time.monotonic() - t0 < 2.0
        deadline = time.monotonic() + 10
        while s.stats.failures == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert s.stats.failures > 0 and not s.stats.connected
        central.start()
        deadline = time.monotonic() + 15
        while count(central) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert count(central) == 4
    finally:
        s.stop()
        if not central.running():
            central.start()


def test_the_backlog_bound_drops_the_oldest_queue_entries_never_local_records(
        central: Cluster, tmp_path: Path) -> None:
    store = local_store(tmp_path)
    store.commit([(rec(i), RunInfo("j", 1001)) for i in range(12)])
    s = shipper(store, central, batch_size=2, max_backlog=5)
    assert s.bound_backlog() == 5
    assert s.stats.dropped == 7
    assert len(store.records("job-1", 1001)) == 12  # all still in the local store
    drain(s)
    assert count(central) == 5 and count(central, "idx >= 7") == 5


def test_two_readers_see_their_own_runs_the_admin_all(central: Cluster, tmp_path: Path) -> None:
    import psycopg

    store = local_store(tmp_path)
    store.commit([(rec(i, run="mine"), RunInfo("j", 1001)) for i in range(3)]
                 + [(rec(i, run="theirs"), RunInfo("j", 1002)) for i in range(2)]
                 + [(rec(0, run="nobody's"), RunInfo("j", 1003))])
    drain(shipper(store, central))

    def seen(role: str, table: str = "records") -> list[tuple[int, str]]:
        with psycopg.connect(central.dsn(user=role), autocommit=True) as conn:
            return sorted({(int(u), str(r)) for u, r in conn.execute(
                f"SELECT uid, run_id FROM counterd.{table}")})

    assert seen("u1001") == [(1001, "mine")]
    assert seen("u1002") == [(1002, "theirs")]
    assert seen("u1001", "runs") == [(1001, "mine")]
    assert seen(ADMIN) == [(1001, "mine"), (1002, "theirs"), (1003, "nobody's")]
    # the mapping itself: a reader sees its own line only
    with psycopg.connect(central.dsn(user="u1002"), autocommit=True) as conn:
        assert conn.execute("SELECT role_name, uid FROM counterd.readers").fetchall() == [
            ("u1002", 1002)]


@pytest.mark.parametrize("statement", [
    "SELECT * FROM counterd.records",
    "SELECT * FROM counterd.runs",
    "UPDATE counterd.records SET body = '{}'",
    "DELETE FROM counterd.records",
    "INSERT INTO counterd.records (uid, run_id, host, pid, idx, node, name, rank, begin_ns, "
    "body, committed_ns, shipped_ns) VALUES (1, 'r', 'h', 1, 1, 'n', 's', 0, 0, '{}', 0, 0)",
    "TRUNCATE counterd.records",
    "SELECT * FROM counterd.readers",
])
def test_the_node_role_can_only_call_the_ingest_functions(central: Cluster, statement: str
                                                          ) -> None:
    import psycopg

    with psycopg.connect(central.dsn(user=NODE), autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(statement)


def test_migrating_again_changes_nothing_and_a_newer_schema_is_refused(central: Cluster) -> None:
    import psycopg

    from counterd.central import schema

    with psycopg.connect(central.dsn()) as conn:
        assert schema.migrate(conn) == schema.SCHEMA_VERSION
        with conn.transaction(force_rollback=True):
            conn.execute("INSERT INTO counterd.schema_version (version) VALUES (99)")
            with pytest.raises(schema.CentralError, match="newer than this counterd"):
                schema.migrate(conn)


PROGRAM = textwrap.dedent("""
    import counterd
    from counterd.markers.api import recorder
    counterd.init()
    for i in range(5):
        with counterd.superstep("s"):
            sum(range(10000))
    assert recorder().sink.flush(10)
""")


def _wait_rows(c: Cluster, n: int, timeout: float = 15.0) -> int:
    deadline = time.monotonic() + timeout
    while (got := count(c)) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    return got


def test_a_daemon_ships_through_kill9_and_restart_and_its_user_reads_the_run(
        central: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import psycopg

    from counterd.central import schema
    from counterd.commands import cli
    from tests.daemon.conftest import DaemonProc

    def config(dsn: str) -> str:
        return f'[central]\ndsn = "{dsn}"\nretry_max_s = 1\ntimeout_s = 2\n'

    # first the database is out of reach (a socket directory with no server): the daemon
    # acknowledges and commits locally, its queue holds the records; then kill -9
    d = DaemonProc(tmp_path / "d", extra=config(f"host={tmp_path} user={NODE} dbname=x"))
    d.start()
    try:
        out = subprocess.run([sys.executable, "-c", PROGRAM], timeout=60, text=True,
                             env=d.env(COUNTERD_RUN_ID="e2e"), capture_output=True)
        assert out.returncode == 0, out.stderr  # acknowledged: flush() returned True
        d.kill9()
        queued = sqlite3.connect(d.store).execute("SELECT count(*) FROM ship_queue "
                                                  "WHERE kind = 'r'").fetchone()
        assert queued == (5,) and count(central) == 0
        d.write_config(config(central.dsn(user=NODE)))  # the database reachable again
        d.start()
        assert _wait_rows(central, 5) == 5
        deadline = time.monotonic() + 5  # /metrics: the lag of the batch, an empty backlog
        while "counterd_central_lag_seconds " not in (text := d.metrics()) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "counterd_central_lag_seconds " in text and "counterd_central_up 1.0" in text
    finally:
        d.stop()
    with psycopg.connect(central.dsn(), autocommit=True) as conn:
        conn.execute("DO $$ BEGIN CREATE ROLE me LOGIN; "
                     "EXCEPTION WHEN duplicate_object THEN NULL; END $$")
        schema.add_reader(conn, "me", os.getuid())
    capsys.readouterr()
    assert cli.main(["report", "--central", central.dsn(user="me"), "--run", "e2e",
                     "--format", "json"]) == 0
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    assert run["run_id"] == "e2e" and run["records"] == 5 and len(run["nodes"]) == 1
    assert cli.main(["runs", "--central", central.dsn(user="me"), "--json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert (listed["run_id"], listed["records"], listed["supersteps"]) == ("e2e", 5, 5)
    # another user's role does not see it, nor can it name it
    assert cli.main(["report", "--central", central.dsn(user="u1001"), "--run", "e2e"]) == 2
    assert "no run 'e2e'" in capsys.readouterr().err
    assert cli.main(["runs", "--central", central.dsn(user="u1001")]) == 0
    assert "no runs" in capsys.readouterr().out


def test_the_central_admin_commands(central: Cluster, capsys: pytest.CaptureFixture[str]
                                    ) -> None:
    from counterd.commands import cli

    assert cli.main(["central", "migrate", central.dsn()]) == 0
    assert "schema version 1 -> 1" in capsys.readouterr().err
    assert cli.main(["central", "reader", central.dsn(), "no_such_role", "5"]) == 2
    assert "must exist" in capsys.readouterr().err
    # a node's role cannot make itself a reader
    assert cli.main(["central", "reader", central.dsn(user=NODE), NODE, "1001"]) == 2


def test_central_config_keys(tmp_path: Path) -> None:
    from counterd.daemon import config
    from counterd.data.errors import BadInput

    f = tmp_path / "c.toml"
    f.write_text('[central]\ndsn = "host=/x dbname=c"\nrole = "node7"\nbatch_size = 50\n'
                 "max_backlog = 500\ntimeout_s = 3\n")
    cfg = config.load(f, env={})
    assert (cfg.central_dsn, cfg.central_role, cfg.central_batch_size, cfg.central_max_backlog,
            cfg.central_timeout_s) == ("host=/x dbname=c", "node7", 50, 500, 3.0)
    assert config.load(f, env={"COUNTERD_CENTRAL_MAX_BACKLOG": "900"}).central_max_backlog == 900
    f.write_text("[central]\nbatch_size = 100\nmax_backlog = 10\n")
    with pytest.raises(BadInput, match="central.max_backlog"):
        config.load(f, env={})


def test_the_central_report_is_the_report_of_its_records_files(central: Cluster,
                                                                tmp_path: Path) -> None:
    """The report is built from the central rows in memory; the same rows written as records
    files (the file convention) give the same report."""
    from counterd.central import reader
    from counterd.report import nodes

    store = local_store(tmp_path)
    store.commit([(rec(i, run="both", host=h, rank=r), RunInfo("j", 1001))
                  for i in range(3) for r, h in ((0, "n1"), (1, "n2"))])
    drain(shipper(store, central))
    dsn = central.dsn(user=ADMIN)
    files = reader.run_files(dsn, "both", None, tmp_path)
    assert len(files) == 2
    from_files = json.loads(nodes.render(nodes.build(files), "json"))
    in_memory = json.loads(reader.report(dsn, "both", None, "json"))
    assert in_memory["runs"] == from_files["runs"] and in_memory["runs"][0]["records"] == 6


def test_ingest_parameters_go_in_binary_and_awkward_values_land_exactly(
        central: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shipper passes its arrays in binary (psycopg's text arrays cost 12 times the node's
    CPU: bench/central_ingest.py); quotes, braces, backslashes, commas, non-ASCII and 64-bit
    extremes arrive as the local store holds them."""
    import psycopg

    sent: list[str] = []
    execute = psycopg.Connection.execute

    def spy(self: psycopg.Connection[Any], query: Any, *a: Any, **kw: Any) -> Any:
        sent.append(str(query))
        return execute(self, query, *a, **kw)

    monkeypatch.setattr(psycopg.Connection, "execute", spy)
    store = local_store(tmp_path)
    odd = 'h\u00e9"{x},\\ y'
    big = 2**63 - 1
    recs = [SuperstepRecord("awk'ward\"{run}", big, 'n"a{m}e\\,', -2**31, 2**31 - 1, 0, big - 5,
                            big, host=odd),
            rec(0, run="awk'ward\"{run}", host=odd)]
    store.commit([(r, RunInfo("j", 1001)) for r in recs])
    drain(shipper(store, central))
    calls = [q for q in sent if "counterd.ship_" in q]
    assert calls and all("%b" in q and "%s" not in q for q in calls)
    with psycopg.connect(central.dsn(), autocommit=True) as conn:
        got = conn.execute("SELECT run_id, idx, name, rank, pid, begin_ns, end_ns, host, body "
                           "FROM counterd.records ORDER BY idx").fetchall()
    assert [(g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7]) for g in got] == [
        (r.run_id, r.index, r.name, r.rank, r.pid, r.begin_ns, r.end_ns, r.host)
        for r in sorted(recs, key=lambda r: r.index)]
    assert [SuperstepRecord.from_json(json.loads(g[8])) for g in got] == sorted(
        recs, key=lambda r: r.index)


def _os_users(c: Cluster) -> list[tuple[str, int, int]]:
    """Two OS accounts other than root and the PostgreSQL server's (name, uid, gid)."""
    import pwd

    owner = pwd.getpwnam(c.owner).pw_uid if c.owner else os.getuid()
    seen: dict[int, tuple[str, int, int]] = {}
    for p in sorted(pwd.getpwall(), key=lambda p: p.pw_uid):
        if p.pw_uid not in (0, owner) and p.pw_uid not in seen and p.pw_name.isidentifier():
            seen[p.pw_uid] = (p.pw_name, p.pw_uid, p.pw_gid)
    return list(seen.values())[:2]


def test_two_real_uids_each_read_only_their_own_rows(central: Cluster, tmp_path: Path) -> None:
    """Two OS users, authenticated by the kernel (peer authentication on the socket: the
    server reads the client's uid), each mapped to a reader role for their own uid: each one's
    query returns their own rows and none of the other's, and neither can log in as the
    other's role."""
    import shutil

    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run queries as two other users")
    users = _os_users(central)
    if len(users) < 2:
        pytest.skip("fewer than two OS accounts besides root and PostgreSQL's")
    (name_a, uid_a, gid_a), (name_b, uid_b, gid_b) = users
    import psycopg

    from counterd.central import schema

    store = local_store(tmp_path)
    store.commit([(rec(i, run="a-run"), RunInfo("j", uid_a)) for i in range(3)]
                 + [(rec(i, run="b-run"), RunInfo("j", uid_b)) for i in range(2)])
    drain(shipper(store, central))
    hba, ident = central.datadir / "pg_hba.conf", central.datadir / "pg_ident.conf"
    saved = hba.read_text(), ident.read_text()
    with psycopg.connect(central.dsn(), autocommit=True) as conn:
        for role, uid in (("os_a", uid_a), ("os_b", uid_b)):
            conn.execute(f"DO $$ BEGIN CREATE ROLE {role} LOGIN; "
                         "EXCEPTION WHEN duplicate_object THEN NULL; END $$")
            schema.add_reader(conn, role, uid)

        def reload() -> None:
            conn.execute("SELECT pg_reload_conf()")

        def query(uid: int, gid: int, role: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
                 str(central.bindir / "psql"), "-X", "-A", "-t", "-h", str(central.sockdir),
                 "-p", "5432", "-U", role, "-d", "counterd", "-c",
                 "SELECT uid || ' ' || run_id FROM counterd.records ORDER BY 1"],
                capture_output=True, text=True, timeout=30, cwd="/")

        try:
            hba.write_text("local all os_a,os_b peer map=realusers\n" + saved[0])
            ident.write_text(saved[1] + f"realusers {name_a} os_a\nrealusers {name_b} os_b\n")
            reload()
            deadline = time.monotonic() + 10
            while query(uid_a, gid_a, "os_b").returncode == 0:  # the old rules: trust
                assert time.monotonic() < deadline, "pg_hba.conf was not reloaded"
                time.sleep(0.1)
            a, b = query(uid_a, gid_a, "os_a"), query(uid_b, gid_b, "os_b")
            assert a.returncode == 0 and b.returncode == 0, (a.stderr, b.stderr)
            assert a.stdout.split("\n")[:-1] == [f"{uid_a} a-run"] * 3
            assert b.stdout.split("\n")[:-1] == [f"{uid_b} b-run"] * 2
            refused = query(uid_b, gid_b, "os_a")
            assert refused.returncode != 0 and "authentication failed" in refused.stderr
        finally:
            hba.write_text(saved[0])
            ident.write_text(saved[1])
            reload()


TIMENS = "time:[4026531834]"


def _anchor(run: str, mono: int, offset: int | None, bound: int | None = None) -> Any:
    from counterd.daemon.store import ClientClock, RunAnchor
    from counterd.data.clocks import Anchor

    return RunAnchor(1001, run, Anchor(mono, 1_790_000_000_000_000_000 + mono, 300),
                     ClientClock("boot-1", TIMENS, offset, bound))


def test_clock_domains_with_unknown_offset_and_bound_ship_as_nulls_and_read_back(
        central: Cluster, tmp_path: Path) -> None:
    """ship_clocks with columns of None only (a client whose time namespace the daemon could
    not read, a kernel that stated no sync bound: one batch each): the domain lands with
    NULLs, and the reader gives no domain for the unknown offset, a domain without a bound
    for the other."""
    import psycopg

    from counterd.central import reader

    store = local_store(tmp_path)
    s = shipper(store, central)
    store.commit([(rec(i, run="blind"), RunInfo("j", 1001)) for i in range(2)],
                 anchors=[_anchor("blind", 1_000, None), _anchor("blind", 9_000, None)])
    assert drain(s) == 4  # its own batch: offsets [None], bounds [None]
    store.commit([(rec(i, run="seen"), RunInfo("j", 1001)) for i in range(2)],
                 anchors=[_anchor("seen", 1_000, 500), _anchor("seen", 9_000, 500)])
    assert drain(s) == 4  # offsets [500], bounds [None]
    with psycopg.connect(central.dsn(), autocommit=True) as conn:
        domains = conn.execute("SELECT run_id, node, boot_id, timens, mono_offset_ns, "
                               "sync_bound_ns FROM counterd.clock_domains ORDER BY 1").fetchall()
        anchors = conn.execute("SELECT run_id, node, mono_ns, real_ns - mono_ns, read_ns FROM "
                               "counterd.clock_anchors ORDER BY 1, 3").fetchall()
    assert domains == [("blind", "node-a", "boot-1", TIMENS, None, None),
                       ("seen", "node-a", "boot-1", TIMENS, 500, None)]
    assert anchors == [(run, "node-a", m, 1_790_000_000_000_000_000, 300)
                       for run in ("blind", "seen") for m in (1_000, 9_000)]
    dsn = central.dsn(user=ADMIN)
    ((_, blind, none),) = reader.run_parts(dsn, "blind", None)
    assert len(blind) == 2 and none == []
    ((_, _, (domain,)),) = reader.run_parts(dsn, "seen", None)
    assert [a.mono_ns for a in domain.anchors] == [1_500, 9_500]  # moved by the offset
    assert (domain.boot_id, domain.sync_bound_ns) == ("boot-1", None)
    text = reader.report(dsn, "seen", None, "text")
    assert "1 monotonic clock(s) on one kernel" in text and "no clock domain" not in text
    assert "no clock domain" in reader.report(dsn, "blind", None, "text")


def _node_store(tmp_path: Path, c: Cluster, node: str) -> tuple[Store, Shipper]:
    (tmp_path / str(abs(hash(node)))).mkdir()
    store = Store(tmp_path / str(abs(hash(node))) / "local.db", synchronous="normal")
    store.set_shipping(True)
    return store, Shipper(store.path, ShipSettings(c.dsn(user=NODE), node=node,
                                                   retry_min_s=0.05, timeout_s=5))


def _awkward_run(central: Cluster, tmp_path: Path) -> None:
    """Run "mix" on two nodes, one named with a "/" and a host of one too: clock domains,
    an incomplete record, a rank with two processes, missing ranks (4, and 5 once), two supersteps
    under one index, equal work on two ranks (the tie goes to the lower rank)."""
    def r(i: int, rank: int, host: str, begin: int, end: int | None, name: str = "step",
          pid: int = 0) -> SuperstepRecord:
        return SuperstepRecord("mix", i, name, rank, pid or 100 + rank, 0, begin, end,
                               host=host, flags=frozenset() if end is not None
                               else frozenset({"incomplete"}))

    a, ship_a = _node_store(tmp_path, central, "node-a")
    b, ship_b = _node_store(tmp_path, central, "rack/1")
    a.commit([(r(0, 0, "n1", 2_000, 3_000), RunInfo("j", 1001)),
              (r(0, 1, "n1", 2_100, 3_100), RunInfo("j", 1001)),
              (r(1, 0, "n1", 4_000, 5_500), RunInfo("j", 1001)),
              (r(1, 1, "n1", 4_000, None), RunInfo("j", 1001)),
              (r(1, 0, "n1", 4_100, 4_200, name="other", pid=7), RunInfo("j", 1001))],
             anchors=[_anchor("mix", 1_000, 0, 2_000), _anchor("mix", 90_000, 0, 2_000)])
    b.commit([(r(0, 2, "h/2", 2_050, 3_050), RunInfo("j", 1001)),
              (r(0, 3, "h/2", 2_000, 3_000), RunInfo("j", 1001)),
              (r(0, 3, "h/2", 2_000, 3_900, pid=9), RunInfo("j", 1001)),
              (r(1, 2, "h/2", 4_000, 5_000), RunInfo("j", 1001)),
              (r(1, 5, "h/2", 4_000, 5_000), RunInfo("j", 1001))],
             anchors=[_anchor("mix", 1_000, 7_000, None), _anchor("mix", 90_000, 7_000, None)])
    assert drain(ship_a) == 7 and drain(ship_b) == 7


@pytest.mark.parametrize("fmt", ["text", "json", "csv"])
def test_the_central_report_from_rows_is_the_report_of_its_records(
        central: Cluster, tmp_path: Path, fmt: str) -> None:
    """``counterd report --central`` builds from the rows' fields (nodes.build_rows, no record
    made); the same run read as records (the JSON bodies, nodes.build_parts) gives the same
    report, byte for byte, in every format."""
    from counterd.central import reader
    from counterd.report import nodes

    _awkward_run(central, tmp_path)
    dsn = central.dsn(user=ADMIN)
    from_rows = reader.report(dsn, "mix", None, fmt, clock_bound_ns=1_000)
    parts = reader.run_parts(dsn, "mix", None)
    assert [name for name, _, _ in parts] == ["central:node-a/n1", "central:rack/1/h/2"]
    assert from_rows == nodes.render(nodes.build_parts(parts, clock_bound_ns=1_000), fmt)
    if fmt == "json":
        (run,) = json.loads(from_rows)["runs"]
        assert run["records"] == 10 and run["nodes"] == ["h/2", "n1"]
        step0 = run["supersteps"][0]
        assert step0["missing_ranks"] == [4, 5] and step0["slowest"] == {"node": "h/2", "rank": 3}
        assert [(n["node"], n["slowest_rank"]) for n in step0["nodes"]] == [("h/2", 3), ("n1", 0)]


def test_run_files_names_each_file_from_its_node_and_host_whatever_they_hold(
        central: Cluster, tmp_path: Path) -> None:
    """A node or host named with "/" (or "..") names a file in the directory by its own
    name made safe, not split at the "/" of central:<node>/<host>; the files' report is the
    central one."""
    from counterd.central import reader
    from counterd.report import nodes

    _awkward_run(central, tmp_path)
    store, ship = _node_store(tmp_path, central, "../../up")
    store.commit([(SuperstepRecord("mix", 2, "step", 6, 106, 0, 7_000, 8_000, host=".."),
                   RunInfo("j", 1001))])
    assert drain(ship) == 1
    out = tmp_path / "files"
    out.mkdir()
    dsn = central.dsn(user=ADMIN)
    files = reader.run_files(dsn, "mix", None, out)
    assert [f.name for f in files] == ["0000-.._.._up-...jsonl", "0001-node_a-n1.jsonl",
                                       "0002-rack_1-h_2.jsonl"]
    assert sorted(out.iterdir()) == sorted(files)
    from_files = json.loads(nodes.render(nodes.build(files), "json"))
    assert from_files["runs"] == json.loads(reader.report(dsn, "mix", None, "json"))["runs"]


def test_the_central_report_loads_neither_the_report_model_nor_predictions(
        central: Cluster, tmp_path: Path) -> None:
    """The whole ``counterd report --central`` in a fresh interpreter: psycopg and the report
    across nodes, not the per-node report's model, HTML page or prediction code."""
    store = local_store(tmp_path)
    store.commit([(rec(i, run="lean"), RunInfo("j", 1001)) for i in range(2)])
    drain(shipper(store, central))
    code = ("import sys\n"
            "from counterd.commands import cli\n"
            f"rc = cli.main(['report', '--central', {central.dsn(user=ADMIN)!r}, '--run', "
            "'lean'])\n"
            "print(rc, ' '.join(m for m in ('counterd.report.model', 'counterd.report.html',"
            " 'counterd.prediction', 'counterd.daemon.config', 'statistics') "
            "if m in sys.modules))\n")
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "run lean" in proc.stdout and proc.stdout.splitlines()[-1].split() == ["0"]
