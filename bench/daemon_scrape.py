"""``/metrics`` scrape time at about 10,000 series, and the daemon's RSS.

    .venv/bin/python bench/daemon_scrape.py [--workloads 50] [--names 40] [--scrapes 300]

Fills a daemon with one record per (workload, superstep name), each with three counters, so
the exposition holds workloads x names x 5 superstep series (duration count and sum, three
counters) plus the daemon's own; then times full HTTP scrapes (urllib, new connection each)
and prints p50, p99 and max.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _daemon import Daemon  # noqa: E402
from _host import host_line  # noqa: E402

from counterd.backends.base import CounterValue  # noqa: E402
from counterd.data.events import Source  # noqa: E402
from counterd.data.records import SuperstepRecord  # noqa: E402
from counterd.markers.sinks.socket import SocketSink  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", type=int, default=50)
    ap.add_argument("--names", type=int, default=40)
    ap.add_argument("--scrapes", type=int, default=300)
    args = ap.parse_args()
    print(host_line())
    with tempfile.TemporaryDirectory() as tmp:
        d = Daemon(Path(tmp), synchronous="normal",
                   metrics_extra=f"max_jobs = {args.workloads + 5}\n"
                                 f"max_superstep_names = {args.names + 5}\n")
        try:
            for w in range(args.workloads):
                sink = SocketSink(d.socket, job=f"workload{w:03d}")
                for n in range(args.names):
                    sink.record(SuperstepRecord(
                        run_id=f"run{w}", index=n, name=f"superstep{n:03d}", rank=0,
                        pid=os.getpid(), cpu=0, begin_ns=n * 1000, end_ns=n * 1000 + 500,
                        counters={"loads": CounterValue(1e6, Source.SIMULATED),
                                  "l1d_misses": CounterValue(1e4, Source.SIMULATED),
                                  "task_clock_ns": CounterValue(4e5, Source.MEASURED)}))
                assert sink.flush(60)
                sink.close()
            time.sleep(2.0)  # the exposition is re-rendered at most every metrics.refresh_s
            body = urllib.request.urlopen(d.url, timeout=10).read().decode()
            series = sum(1 for line in body.splitlines() if line and not line.startswith("#"))
            times = []
            for _ in range(args.scrapes):
                t0 = time.perf_counter()
                urllib.request.urlopen(d.url, timeout=10).read()
                times.append((time.perf_counter() - t0) * 1e3)
            times.sort()
            p99 = times[min(len(times) - 1, int(0.99 * len(times)))]
            print(f"series {series}, exposition {len(body) / 1024:.0f} KiB, {args.scrapes} scrapes")
            print(f"scrape ms: p50 {statistics.median(times):.1f}, p99 {p99:.1f}, "
                  f"max {times[-1]:.1f}; daemon RSS {d.rss_bytes() / 2**20:.1f} MiB")
        finally:
            d.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
