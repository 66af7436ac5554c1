"""Many concurrent marker clients through one daemon: records stored, lost, per second.

    .venv/bin/python bench/daemon_throughput.py [--clients 64] [--steps 1000] [--sync full]

Each client is a forked process (its own connection, as multiprocessing workers get) that
marks ``--steps`` empty supersteps with the marker API and then waits for the daemon's
acknowledgement of all of them. Time runs from the start of the first client to the last
acknowledgement; "lost" = clients x steps - records in the store afterwards.

With ``--pyperf FILE`` each client's time (its start to its last acknowledgement, per
superstep) and the whole run's time per stored record are also written as pyperf JSON
(bench/_pyperf.py), under ``daemon_throughput/N clients/sync S/...``: ``python -m pyperf
compare_to OLD NEW`` compares two runs (the whole run is one value: pyperf cannot test its
significance).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _daemon import Daemon  # noqa: E402
from _host import host_line  # noqa: E402
from _pyperf import PyperfOut, add_option  # noqa: E402

import counterd  # noqa: E402
from counterd.daemon.store import open_readonly  # noqa: E402
from counterd.markers.api import configure, recorder  # noqa: E402


def client(rank: int, steps: int, socket_path: str, go: object, took: Any) -> None:
    configure(backend="none", socket=socket_path, run_id="throughput")
    counterd.set_rank(rank)
    go.wait()  # type: ignore[attr-defined]
    t0 = time.monotonic()
    for i in range(steps):
        with counterd.superstep("s", i=i):
            pass
    if not recorder().sink.flush(300):  # type: ignore[union-attr]
        sys.exit(3)
    took[rank] = time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--sync", choices=("full", "normal"), default="full")
    add_option(ap)
    args = ap.parse_args()
    host = host_line()
    print(host)
    out = PyperfOut(args.pyperf, host)
    with tempfile.TemporaryDirectory() as tmp:
        d = Daemon(Path(tmp), synchronous=args.sync)
        ctx = mp.get_context("fork")
        go = ctx.Event()
        took = ctx.Array("d", args.clients)  # each client's seconds, 0 where it failed
        procs = [ctx.Process(target=client, args=(r, args.steps, str(d.socket), go, took))
                 for r in range(args.clients)]
        for p in procs:
            p.start()
        time.sleep(1.0)  # all connected and waiting
        cpu0 = d.cpu_seconds()
        t0 = time.monotonic()
        go.set()
        for p in procs:
            p.join()
        elapsed = time.monotonic() - t0
        cpu = d.cpu_seconds() - cpu0
        rss = d.rss_bytes()
        d.stop()
        store = open_readonly(d.store)
        stored = len(store.records("throughput"))
        store.close()
        expected = args.clients * args.steps
        failed = sum(p.exitcode != 0 for p in procs)
        print(f"clients {args.clients} x supersteps {args.steps} (store synchronous={args.sync})")
        print(f"records expected {expected}, stored {stored}, lost {expected - stored}, "
              f"clients failed {failed}")
        print(f"elapsed {elapsed:.2f} s, {stored / elapsed:,.0f} records/s, daemon CPU "
              f"{cpu:.2f} s ({100 * cpu / elapsed:.0f} % of one core), daemon RSS "
              f"{rss / 2**20:.1f} MiB")
        stem = f"daemon_throughput/{args.clients} clients/sync {args.sync}"
        out.add(f"{stem}/client time per superstep", [t / args.steps for t in took[:] if t > 0],
                loops=args.steps)
        if stored:
            out.add(f"{stem}/run time per stored record", [elapsed / stored], loops=stored)
    out.dump()
    return 0


if __name__ == "__main__":
    sys.exit(main())
