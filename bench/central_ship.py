"""Shipping to the central store: lag (local commit to central commit) p50/p99 and rows/s.

    .venv/bin/python bench/central_ship.py [--hosts 8] [--ranks 2] [--steps 1000]
        [--step-ms 10] [--restart-db]

A throwaway PostgreSQL (tests/_postgres.py: initdb in a temporary directory, a unix socket)
and ``--hosts`` simulated nodes, each a process with its own local store (counterd's Store,
synchronous=normal) and the daemon's shipper thread (counterd.central.shipper) logging in as
the node role. Each node commits its ``--ranks`` records of a superstep in one transaction
(what the daemon's writer does for a group commit) every ``--step-ms``; the shipper runs as in
the daemon (poll 0.2 s, batch 1000). The lag of a record is the shipper's: the wall time from
its local commit to the central transaction's commit, on the node's clock. Rows/s: central
rows over the time from the first local commit to the last central commit. ``--restart-db``
restarts PostgreSQL (pg_ctl restart -m fast) half-way through. Afterwards the central row
count is checked against hosts x ranks x steps (exactly, and no duplicates: the key is the
primary key). All nodes share this host's CPUs with PostgreSQL: on a 2-CPU machine the figure
is a floor of what separate nodes reach.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from _host import guarded, host_line  # noqa: E402


def _node(i: int, dsn: str, ranks: int, steps: int, step_s: float, tmp: str,
          start_at: float, out: Any) -> None:
    from counterd.central.shipper import Shipper, ShipSettings
    from counterd.daemon.store import RunInfo, Store
    from counterd.records import SuperstepRecord

    store = Store(Path(tmp) / f"node{i}.db", synchronous="normal")
    store.set_shipping(True)
    shipper = Shipper(store.path, ShipSettings(dsn, node=f"node{i}", retry_min_s=0.1,
                                               retry_max_s=1.0))
    shipper.stats.keep_lags = True
    shipper.start()
    while time.time() < start_at:
        time.sleep(0.001)
    first = time.time_ns()
    for s in range(steps):
        t = time.monotonic_ns()
        store.commit([(SuperstepRecord("bench-run", s, "step", i * ranks + r, 1000 + r, r,
                                       t, t + 1000, host=f"node{i}"), RunInfo("bench", 1000))
                      for r in range(ranks)])
        due = start_at + (s + 1) * step_s
        if (wait := due - time.time()) > 0:
            time.sleep(wait)
    deadline = time.monotonic() + 120
    while shipper.stats.snapshot()["backlog"] or shipper.stats.shipped < steps * ranks:
        if time.monotonic() > deadline:
            break
        time.sleep(0.02)
    shipper.stop()
    st = shipper.stats
    out.put((i, first, time.time_ns(), list(st.lags), st.shipped, st.failures, st.batches))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--step-ms", type=float, default=10.0)
    ap.add_argument("--restart-db", action="store_true",
                    help="restart PostgreSQL half-way through the run")
    args = ap.parse_args()
    import pytest

    from tests import _postgres

    print(host_line())
    try:
        ctx = _postgres.cluster()
        c = ctx.__enter__()
    except pytest.skip.Exception as exc:
        print(f"central_ship: skipped: {exc}", file=sys.stderr)
        return 2
    try:
        c = _postgres.migrated(c)
        mpx = mp.get_context("fork")
        out = mpx.Queue()
        with tempfile.TemporaryDirectory(prefix="counterd-central-bench-") as tmp:
            start_at = time.time() + 1.0
            procs = [mpx.Process(target=_node, args=(
                i, c.dsn(user=_postgres.NODE), args.ranks, args.steps, args.step_ms / 1e3, tmp,
                start_at, out)) for i in range(args.hosts)]
            for p in procs:
                p.start()
            if args.restart_db:
                time.sleep(max(0.0, start_at - time.time()) + args.steps * args.step_ms / 2e3)
                t0 = time.monotonic()
                c.stop("fast")
                c.start()
                print(f"PostgreSQL restarted half-way ({time.monotonic() - t0:.2f} s down)")
            results = [out.get(timeout=600) for _ in procs]
            for p in procs:
                p.join()
        want = args.hosts * args.ranks * args.steps
        got = _postgres.count(c)
        lags = sorted(x for r in results for x in r[3])
        first = min(r[1] for r in results)
        import psycopg

        with psycopg.connect(c.dsn(), autocommit=True) as conn:
            last = conn.execute("SELECT max(shipped_ns) FROM counterd.records").fetchone()[0]
            size = conn.execute("SELECT pg_total_relation_size('counterd.records')"
                                ).fetchone()[0]
        secs = (int(last) - first) / 1e9
        q = statistics.quantiles(lags, n=100) if len(lags) > 1 else [lags[0]] * 99
        print(f"{args.hosts} hosts x {args.ranks} ranks x {args.steps} supersteps every "
              f"{args.step_ms:g} ms{' with a PostgreSQL restart' if args.restart_db else ''}")
        print(f"central rows {got} of {want} ({'exact' if got == want else 'MISMATCH'}; "
              f"duplicates impossible: primary key), records table {size / 1e6:.1f} MB "
              f"({size / max(got, 1):.0f} B/row)")
        print(f"shipping lag (local commit -> central commit): p50 {q[49] * 1e3:.0f} ms, "
              f"p99 {q[98] * 1e3:.0f} ms, max {lags[-1] * 1e3:.0f} ms over {len(lags)} records")
        print(f"rate: {got / secs:.0f} rows/s over {secs:.1f} s (offered "
              f"{args.hosts * args.ranks * 1e3 / args.step_ms:.0f} rows/s); batches "
              f"{sum(r[6] for r in results)}, failed attempts {sum(r[5] for r in results)}")
        return 0 if got == want else 1
    finally:
        ctx.__exit__(None, None, None)


if __name__ == "__main__":
    sys.exit(guarded(main))
