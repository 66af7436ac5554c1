"""Shipping to the central store: lag (local commit to central row) p50/p99 and rows/s,
through the issue's three disruptions.

    .venv/bin/python bench/central_ship.py [--hosts 8] [--ranks 2] [--steps 1000]
        [--step-ms 10] [--restart-db] [--kill-node] [--link-down SECONDS] [--no-anchors]
        [--report-runs N] [--compare-with TREE ...]

A throwaway PostgreSQL (tests/_postgres.py: initdb in a temporary directory, a unix socket)
and ``--hosts`` simulated nodes, each a process with its own local store (counterd's Store,
synchronous=normal) and the daemon's shipper thread (counterd.central.shipper) logging in as
the node role. Each node commits its ``--ranks`` records of a superstep in one transaction
(what the daemon's writer does for a group commit) every ``--step-ms`` (0: as fast as it
can); the shipper runs as in the daemon (poll 0.2 s, batch 1000, timeout 10 s).

Disruptions (each at a third of the run; combine them or run one at a time):

* ``--restart-db``: PostgreSQL restarted (pg_ctl stop -m fast, start).
* ``--kill-node``: node 1's process (its writer and shipper) killed with SIGKILL, and 1 s later
  started again on the same local store: it resumes committing after the last superstep its
  store holds and its shipper ships what was committed and not shipped.
* ``--link-down S`` (root): every node in a network namespace of its own (bench/netns_cluster.py:
  a veth on a bridge), PostgreSQL in another, reached over TCP; node 1's link
  (``ip link set eth0 down``) down for S seconds.

Lag of a record: the central row's ``shipped_ns`` (the database's wall clock at the insert, in
the shipping transaction) less its ``committed_ns`` (the node's wall clock at the local commit;
one machine, one wall clock), for every row; and the shipper's own (local commit to the
central commit returning) for the processes that were not killed, with the CPU its thread
spent a row. Reported for all rows and
for the undisturbed nodes' rows. Rows/s: central rows over the time from the first local
commit to the last central insert. The central rows are checked against every expected
(node, rank, superstep): missing, and duplicates (rows less distinct keys). All nodes share
this host's CPUs with PostgreSQL: on a 2-CPU machine the figures are a floor of what
separate nodes reach.

Each node also commits clock anchors as the daemon does (``--no-anchors``: none, the report
then aligns no clocks and prints no spans). At the end, ``counterd report --central`` of the
run is timed as a user runs it, a new process (``--report-runs`` times; with
``--compare-with TREE``, alternating with another checkout's counterd on the same rows, and
the reports compared byte for byte: a before/after side by side).
"""

from __future__ import annotations

import argparse
import ctypes
import multiprocessing as mp
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from _host import guarded, host_line  # noqa: E402

CLONE_NEWNET = 0x40000000
DB_ADDR = "10.231.0.254"  # PostgreSQL's address with --link-down (inside the namespaces)


def _enter_netns(ns: str) -> None:
    """Move this (single-threaded) process into network namespace ``ns`` (ip netns add)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/var/run/netns/{ns}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns {ns}: {os.strerror(err)}")
    finally:
        os.close(fd)


def _node(i: int, dsn: str, ranks: int, steps: int, step_s: float, tmp: str,
          start_at: float, netns: str, out: Any, anchors: bool = True) -> None:
    """Node ``i``: commit supersteps from the first its local store lacks (a restart resumes),
    ship them, and put its shipper's figures on ``out`` once everything is shipped. With
    ``anchors``, clock anchors as the daemon takes them: with the first superstep, every
    ANCHOR_PERIOD_S, and at the end (one kernel, the client's clock the daemon's)."""
    if netns:
        _enter_netns(netns)  # before the shipper's thread: threads inherit the namespace
    from counterd.central.shipper import Shipper, ShipSettings
    from counterd.daemon.store import ClientClock, RunAnchor, RunInfo, Store
    from counterd.data.clocks import ANCHOR_PERIOD_S, boot_id, take_anchor
    from counterd.data.records import SuperstepRecord

    clock = ClientClock(boot_id(), "bench", 0, None)
    anchored = -ANCHOR_PERIOD_S
    taken = 0  # queue entries of anchors: the shipper counts them as it counts records

    def anchor(due: bool) -> list[RunAnchor]:
        nonlocal anchored, taken
        if not anchors or not due:
            return []
        anchored = time.monotonic()
        taken += 1
        return [RunAnchor(1000, "bench-run", take_anchor(), clock)]

    path = Path(tmp) / f"node{i}.db"
    store = Store(path, synchronous="normal")
    store.set_shipping(True)
    with sqlite3.connect(path) as db:
        (top,), = db.execute("SELECT max(idx) FROM records").fetchall()
    begin = 0 if top is None else int(top) + 1  # a superstep's records: one transaction
    shipper = Shipper(store.path, ShipSettings(dsn, node=f"node{i}", retry_min_s=0.1,
                                               retry_max_s=1.0))
    shipper.stats.keep_lags = True
    thread = shipper.start()
    while time.time() < start_at:
        time.sleep(0.001)
    first = time.time_ns()
    for s in range(begin, steps):
        t = time.monotonic_ns()
        store.commit([(SuperstepRecord("bench-run", s, "step", i * ranks + r, 1000 + r, r,
                                       t, t + 1000, host=f"node{i}"), RunInfo("bench", 1000))
                      for r in range(ranks)],
                     anchors=anchor(time.monotonic() - anchored >= ANCHOR_PERIOD_S))
        due = start_at + (s + 1) * step_s
        if (wait := due - time.time()) > 0:
            time.sleep(wait)
    store.commit([], anchors=anchor(True))  # the run's end
    deadline = time.monotonic() + 120
    while (shipper.stats.snapshot()["backlog"]
           or shipper.stats.shipped < (steps - begin) * ranks + taken):
        if time.monotonic() > deadline:
            break
        time.sleep(0.02)
    cpu = _thread_cpu_s(thread.native_id)
    shipper.stop()
    st = shipper.stats
    out.put((i, first, time.time_ns(), list(st.lags), st.shipped, st.failures, st.batches, cpu))


def _thread_cpu_s(tid: int | None) -> float:
    """CPU time (user + system) of this process's thread ``tid`` so far (nan: unknown)."""
    try:
        fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _quantiles(xs: list[float]) -> str:
    if not xs:
        return "none"
    xs = sorted(xs)
    q = statistics.quantiles(xs, n=100) if len(xs) > 1 else [xs[0]] * 99
    return (f"p50 {q[49] * 1e3:.0f} ms, p99 {q[98] * 1e3:.0f} ms, max {xs[-1] * 1e3:.0f} ms "
            f"({len(xs)} records)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--step-ms", type=float, default=10.0)
    ap.add_argument("--restart-db", action="store_true",
                    help="restart PostgreSQL a third of the way through the run")
    ap.add_argument("--kill-node", action="store_true",
                    help="kill -9 node 1 a third of the way through and restart it 1 s later")
    ap.add_argument("--link-down", type=float, default=0.0, metavar="S",
                    help="node 1's network link down for S seconds a third of the way "
                         "through (root: network namespaces, PostgreSQL over TCP)")
    ap.add_argument("--no-anchors", action="store_true",
                    help="ship no clock anchors (the report then aligns no clocks)")
    ap.add_argument("--report-runs", type=int, default=1, metavar="N",
                    help="time counterd report --central N times (each tree, alternating)")
    ap.add_argument("--compare-with", type=Path, action="append", default=[], metavar="TREE",
                    help="also time the report with another checkout's counterd (a clean "
                         "copy of the commit before a change) first on PYTHONPATH, "
                         "alternating with this one's on the same data; repeatable")
    args = ap.parse_args()
    if args.hosts < 1 or args.ranks < 1 or args.steps < 1 or args.step_ms < 0 \
            or args.report_runs < 1:
        print("central_ship: --hosts, --ranks, --steps, --report-runs must be >= 1 and "
              "--step-ms >= 0", file=sys.stderr)
        return 2
    trees = [ROOT, *(t.resolve() for t in args.compare_with)]
    for t in trees[1:]:
        if not (t / "counterd" / "__init__.py").is_file():
            print(f"central_ship: --compare-with {t}: no counterd/__init__.py there; give a "
                  "checkout of this repository", file=sys.stderr)
            return 2
    import pytest

    from tests import _postgres

    print(host_line(), flush=True)
    net: Any = None
    if args.link_down:
        from netns_cluster import NET, Cluster, _why_not

        reason = _why_not((), ["--net"])  # root, ip, unshare: network namespaces
        if reason:
            print(f"central_ship: --link-down: {reason}", file=sys.stderr)
            return 2
        nettmp = tempfile.mkdtemp(prefix="counterd-central-net-")
        net = Cluster(Path(nettmp))
        db_ns = net.host("db", DB_ADDR)
        for i in range(args.hosts):
            net.host(f"n{i}", f"{NET}.{i + 1}")
        _enter_netns(db_ns)  # PostgreSQL, started from here, listens in the db namespace
    try:
        ctx = (_postgres.cluster(DB_ADDR, f"{NET}.0/24") if net is not None
               else _postgres.cluster())
        c = ctx.__enter__()
    except pytest.skip.Exception as exc:
        print(f"central_ship: skipped: {exc}", file=sys.stderr)
        if net is not None:
            net.close()
        return 2
    try:
        c = _postgres.migrated(c)
        node_dsn = (f"host={DB_ADDR} port=5432 user={_postgres.NODE} dbname=counterd"
                    if net is not None else c.dsn(user=_postgres.NODE))
        mpx = mp.get_context("fork")
        out = mpx.Queue()
        events: list[str] = []
        with tempfile.TemporaryDirectory(prefix="counterd-central-bench-") as tmp:
            start_at = time.time() + 1.0

            def start(i: int) -> Any:
                p = mpx.Process(target=_node, args=(
                    i, node_dsn, args.ranks, args.steps, args.step_ms / 1e3, tmp, start_at,
                    net.ns(i) if net is not None else "", out, not args.no_anchors))
                p.start()
                return p

            procs = [start(i) for i in range(args.hosts)]
            run_s = args.steps * args.step_ms / 1e3
            if args.restart_db or args.kill_node or args.link_down:
                time.sleep(max(0.0, start_at - time.time()) + run_s / 3)
            if args.kill_node:
                os.kill(procs[0].pid, signal.SIGKILL)
                procs[0].join()
                with sqlite3.connect(Path(tmp) / "node0.db") as db:
                    (queued,), = db.execute("SELECT count(*) FROM ship_queue").fetchall()
                    (held,), = db.execute("SELECT count(*) FROM records").fetchall()
                events.append(f"node0 killed -9 with {held} records in its store, {queued} "
                              "queue entries not shipped; restarted 1 s later")
                time.sleep(1.0)
                procs[0] = start(0)
            if args.restart_db:
                t0 = time.monotonic()
                c.stop("fast")
                c.start()
                events.append(f"PostgreSQL restarted ({time.monotonic() - t0:.2f} s down)")
            if args.link_down:
                ns = net.ns(0)
                subprocess.run(["ip", "-n", ns, "link", "set", "eth0", "down"], check=True)
                time.sleep(args.link_down)
                subprocess.run(["ip", "-n", ns, "link", "set", "eth0", "up"], check=True)
                events.append(f"node0's link down for {args.link_down:g} s")
            results = [out.get(timeout=900) for _ in procs]
            for p in procs:
                p.join()
        for e in events:
            print(e)
        want = {(f"node{i}", i * args.ranks + r, s) for i in range(args.hosts)
                for r in range(args.ranks) for s in range(args.steps)}
        import psycopg

        with psycopg.connect(c.dsn(), autocommit=True) as conn:
            rows = conn.execute("SELECT node, rank, idx, committed_ns, shipped_ns "
                                "FROM counterd.records").fetchall()
            size = conn.execute("SELECT pg_total_relation_size('counterd.records')"
                                ).fetchone()[0]
        got = len(rows)
        keys = {(str(n), int(r), int(i)) for n, r, i, _, _ in rows}
        missing, extra, dups = len(want - keys), len(keys - want), got - len(keys)
        lags = [(int(s) - int(cm)) / 1e9 for _, _, _, cm, s in rows]
        calm = [(int(s) - int(cm)) / 1e9 for n, _, _, cm, s in rows if n != "node0"]
        own = [x for r in results if not (args.kill_node and r[0] == 0) for x in r[3]]
        first = min(r[1] for r in results)
        secs = (max(int(r[4]) for r in rows) - first) / 1e9
        from counterd.data.clocks import ANCHOR_PERIOD_S

        what = [w for w, on in (("a PostgreSQL restart", args.restart_db),
                                ("node0 killed -9 and restarted", args.kill_node),
                                (f"node0's link down {args.link_down:g} s", args.link_down))
                if on]
        print(f"{args.hosts} hosts x {args.ranks} ranks x {args.steps} supersteps every "
              f"{args.step_ms:g} ms; disruption: {', '.join(what) or 'none'}; clock anchors: "
              + ("none" if args.no_anchors else f"every {ANCHOR_PERIOD_S:g} s and at the end"))
        ok = got == len(want) and not missing and not extra and not dups
        print(f"central rows {got}, expected {len(want)} ({'exact' if ok else 'MISMATCH'}); "
              f"missing {missing}, unexpected {extra}, duplicates {dups}")
        print(f"records table {size / 1e6:.1f} MB with indexes ({size / max(got, 1):.0f} B/row)")
        print(f"lag (local commit -> central insert), all rows: {_quantiles(lags)}")
        print(f"lag, rows of the undisturbed nodes: {_quantiles(calm)}")
        print(f"lag (local commit -> central commit, the shipper's own, processes not killed): "
              f"{_quantiles(own)}")
        print(f"rate: {got / secs:.0f} rows/s over {secs:.1f} s (offered "
              + (f"{args.hosts * args.ranks * 1e3 / args.step_ms:.0f} rows/s"
                 if args.step_ms else "as fast as the nodes commit")
              + f"); batches {sum(r[6] for r in results)}, failed attempts "
              f"{sum(r[5] for r in results)}")
        kept = [r for r in results if not (args.kill_node and r[0] == 0)]
        ship_cpu, ship_rows = sum(r[7] for r in kept), sum(r[4] for r in kept)
        print(f"shipper thread CPU on the nodes: {ship_cpu / max(ship_rows, 1) * 1e6:.0f} us a "
              f"row ({ship_cpu:.2f} s for {ship_rows} rows and anchors, processes not killed; "
              "local queue reads and deletes, psycopg, waits)")
        same = _time_reports(c, trees, args.report_runs)
        return 0 if ok and same else 1
    finally:
        ctx.__exit__(None, None, None)
        if net is not None:
            net.close()


def _time_reports(c: Any, trees: list[Path], runs: int) -> bool:
    """Time ``counterd report --central DSN --run bench-run`` as a user runs it (a new
    process; CPU: its user + system time, PostgreSQL's not counted) ``runs`` times with each
    tree's counterd, the trees alternating; print each tree's times. Each tree runs once
    first, untimed, allowed to write its bytecode (as an installed counterd has it; a
    PYTHONDONTWRITEBYTECODE environment would otherwise compile every module each run).
    False when the trees' reports differ."""
    import resource

    from record_overhead import cli_module  # the tree's own entry: an older one has counterd.cli

    from tests import _postgres

    args = ["report", "--central", c.dsn(user=_postgres.ADMIN), "--run", "bench-run"]
    base = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    outputs: dict[Path, str] = {}
    times: dict[Path, list[tuple[float, float]]] = {t: [] for t in trees}
    for i in range(runs + 1):
        for tree in trees:
            env = {**base, "PYTHONPATH": str(tree)}
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.monotonic()
            argv = [sys.executable, "-m", cli_module(tree), *args]
            done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tree)
            took = time.monotonic() - t0
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            if done.returncode != 0:
                print(f"counterd report --central ({tree}) failed ({done.returncode}): "
                      f"{done.stderr[-500:]}")
                return False
            outputs.setdefault(tree, done.stdout)
            if i:  # the first round: untimed
                times[tree].append((took, (after.ru_utime - before.ru_utime)
                                    + (after.ru_stime - before.ru_stime)))
    for tree in trees:
        walls = sorted(w for w, _ in times[tree])
        cpus = sorted(u for _, u in times[tree])
        spread = (f" (median of {runs}; wall {walls[0]:.2f}-{walls[-1]:.2f} s)"
                  if runs > 1 else "")
        print("counterd report --central (administrator's role, the whole run, text)"
              + (f", {tree}" if len(trees) > 1 else "") + ": "
              f"{statistics.median(walls):.2f} s wall, {statistics.median(cpus):.2f} s CPU "
              f"(user + sys), a new process{spread}")
    same = len(set(outputs.values())) == 1
    if len(trees) > 1:
        print("the trees' reports are " + ("identical, byte for byte" if same else "DIFFERENT")
              + f" ({len(outputs[ROOT].splitlines())} lines)")
    return same


if __name__ == "__main__":
    sys.exit(guarded(main))
