"""Cost of one superstep marker pair (begin + end): in-process, to the spool file that
``counterd record`` uses, and through the daemon's socket.

    .venv/bin/python bench/marker_cost.py [--pairs N] [--batches B]

Each batch times N empty ``with counterd.superstep(...)`` blocks; the figure is the median over
batches of batch time / N (min and max beside it). "through the daemon" includes sending the
begin and the record frames and reading acknowledgements as they arrive; the last column says
how many records the daemon had acknowledged (committed) when the batches ended plus a flush.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _daemon import Daemon  # noqa: E402
from _host import host_line  # noqa: E402

import counterd  # noqa: E402
from counterd.markers.api import configure  # noqa: E402
from counterd.markers.client import SocketSink  # noqa: E402

SOFTWARE = ("task_clock_ns", "page_faults", "context_switches")


def per_pair_us(pairs: int, batches: int) -> list[float]:
    out = []
    for _ in range(batches):
        t0 = time.monotonic_ns()
        for _ in range(pairs):
            with counterd.superstep("s"):
                pass
        out.append((time.monotonic_ns() - t0) / pairs / 1e3)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=2000)
    ap.add_argument("--batches", type=int, default=15)
    args = ap.parse_args()
    print(host_line())
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "spool").mkdir()
        d = Daemon(Path(tmp))
        try:
            print(f"{'configuration':<62} {'median us/pair':>15} {'min':>8} {'max':>8}  acked")
            configs = [
                ("in-process, no counters, memory sink", dict(backend="none", socket="off")),
                ("in-process, perf software events, memory sink",
                 dict(backend="perf", events=SOFTWARE, socket="off")),
                ("in-process, perf software events, spool file (counterd record)",
                 dict(backend="perf", events=SOFTWARE, spool=Path(tmp) / "spool",
                      socket="off")),
                ("daemon socket, no counters", dict(backend="none", socket=d.socket)),
                ("daemon socket, perf software events in-process",
                 dict(backend="perf", events=SOFTWARE, socket=d.socket)),
                ("daemon socket, daemon counts on the client's behalf",
                 dict(backend="daemon", events=SOFTWARE, socket=d.socket)),
            ]
            for label, kw in configs:
                rec = configure(**kw)  # type: ignore[arg-type]
                per_pair_us(200, 1)  # warm-up
                samples = per_pair_us(args.pairs, args.batches)
                acked = ""
                if isinstance(rec.sink, SocketSink):
                    ok = rec.sink.flush(60)
                    acked = "all" if ok else f"{len(rec.sink.unacked)} unacked"
                    if rec.sink.degraded:
                        acked += f" (degraded: {rec.sink.degraded})"
                print(f"{label:<62} {statistics.median(samples):>15.2f} {min(samples):>8.2f} "
                      f"{max(samples):>8.2f}  {acked}")
            configure(backend="none", socket="off")
        finally:
            d.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
