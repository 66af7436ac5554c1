"""The central store's ingest cost per row: the node's ingest function against COPY, for the
sizing of issue 32 (rows per second and table growth at 1,000 nodes x 64 ranks).

    .venv/bin/python bench/central_ingest.py [--rows 100000] [--batch 1000] [--counters 0]

A throwaway PostgreSQL (tests/_postgres.py: fsync off, so WAL is written but not flushed: a
site's disk adds its flush cost on top) and one connection, loading ``--rows`` records of
one run (8 nodes x 2 ranks x supersteps; ``--counters`` counters in each body, as a sampling
backend adds) four ways, each into an empty table:

* ``ship_records``: counterd.ship_records as a node's shipper calls it (its arrays in
  binary), ``--batch`` rows a call, one transaction each (ON CONFLICT: idempotent);
  ``ship_records text``: the same with psycopg's text format (the shipper before 2026-11-27);
* ``COPY + merge``: COPY of a batch into a temporary table, then INSERT ... SELECT ... ON
  CONFLICT DO NOTHING into the records table (idempotent as well);
* ``COPY``: COPY straight into the records table (not idempotent: the upper bound).

Per way: rows/s on the wall clock, the server process's CPU per row (its /proc utime +
stime: what a database core must spend, less disturbed by other load than the wall clock),
the client's CPU per row (this process: psycopg adapting the rows; the shipper's share),
WAL bytes per row (pg_wal_lsn_diff) and the table's bytes per row with its indexes
(pg_total_relation_size). Needs root or the PostgreSQL server's user to read /proc of its
process.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from _host import guarded, host_line  # noqa: E402

COLUMNS = ("uid, run_id, host, pid, idx, node, name, rank, begin_ns, end_ns, body, "
           "committed_ns, shipped_ns")


def _call(function: str, arity: int) -> str:
    from counterd.central import shipper

    return shipper._call(function, arity)  # noqa: SLF001 - the shipper's own statement


def _rows(n: int, counters: int) -> list[tuple[Any, ...]]:
    from counterd.data.events import CounterValue, Source
    from counterd.data.records import SuperstepRecord

    out = []
    now = time.time_ns()
    for k in range(n):
        node, r, s = k % 8, (k // 8) % 2, k // 16
        t = s * 10_000_000 + r * 1000
        rec = SuperstepRecord(
            "bench-run", s, "step", node * 2 + r, 1000 + r, r, t, t + 3_000_000,
            host=f"node{node}",
            counters={f"counter_{c}": CounterValue(1.5e6 + c, Source.MEASURED)
                      for c in range(counters)})
        out.append((1000, "bench-run", f"node{node}", 1000 + r, s, f"node{node}", "step",
                    node * 2 + r, t, t + 3_000_000, json.dumps(rec.to_json()), now, now))
    return out


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _measure(conn: Any, name: str, rows: list[tuple[Any, ...]], batch: int) -> None:
    conn.execute("TRUNCATE counterd.records")
    conn.execute("CHECKPOINT")
    pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    lsn0 = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
    cpu0, t0, mine0 = _cpu_s(pid), time.perf_counter(), time.process_time()
    for i in range(0, len(rows), batch):
        part = rows[i:i + batch]
        with conn.transaction():
            if name.startswith("ship_records"):
                cols = [list(c) for c in zip(*part, strict=True)][:12]
                call = _call("ship_records", 12)
                conn.execute(call.replace("%b", "%s") if name.endswith("text") else call, cols)
            elif name == "COPY + merge":
                conn.execute("CREATE TEMP TABLE IF NOT EXISTS staging (LIKE counterd.records)"
                             " ON COMMIT DELETE ROWS")
                with conn.cursor().copy(f"COPY staging ({COLUMNS}) FROM STDIN") as cp:
                    for row in part:
                        cp.write_row(row)
                conn.execute("INSERT INTO counterd.records SELECT * FROM staging "
                             "ON CONFLICT DO NOTHING")
            else:
                with conn.cursor().copy(f"COPY counterd.records ({COLUMNS}) FROM STDIN") as cp:
                    for row in part:
                        cp.write_row(row)
    wall, cpu = time.perf_counter() - t0, _cpu_s(pid) - cpu0
    mine = time.process_time() - mine0
    wal = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", (lsn0,)
                       ).fetchone()[0]
    size = conn.execute("SELECT pg_total_relation_size('counterd.records')").fetchone()[0]
    got = conn.execute("SELECT count(*) FROM counterd.records").fetchone()[0]
    n = len(rows)
    print(f"{name:17s} {n / wall:8.0f} rows/s wall, server CPU {cpu / n * 1e6:6.1f} us/row "
          f"({n / max(cpu, 1e-9):6.0f} rows/s a core), client CPU {mine / n * 1e6:5.1f} us/row, "
          f"WAL {int(wal) / n:5.0f} B/row, "
          f"table {size / got:4.0f} B/row ({got} rows)", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--counters", type=int, default=0)
    args = ap.parse_args()
    if args.rows < 16 or args.batch < 1 or args.counters < 0:
        print("central_ingest: --rows >= 16, --batch >= 1, --counters >= 0", file=sys.stderr)
        return 2
    import psycopg
    import pytest

    from tests import _postgres

    print(host_line(), flush=True)
    rows = _rows(args.rows, args.counters)
    body = sum(len(r[10]) for r in rows) / len(rows)
    try:
        ctx = _postgres.cluster()
        c = ctx.__enter__()
    except pytest.skip.Exception as exc:
        print(f"central_ingest: skipped: {exc}", file=sys.stderr)
        return 2
    try:
        c = _postgres.migrated(c)
        print(f"{args.rows} rows, batches of {args.batch}, {args.counters} counters a record "
              f"(JSON body {body:.0f} B)")
        with psycopg.connect(c.dsn(), autocommit=True) as conn:
            for name in ("ship_records text", "ship_records", "COPY + merge", "COPY"):
                _measure(conn, name, rows, args.batch)
        return 0
    finally:
        ctx.__exit__(None, None, None)


if __name__ == "__main__":
    sys.exit(guarded(main))
