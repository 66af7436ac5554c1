"""Daemon CPU share and RSS while it samples a watched process of 64 threads every second.

    .venv/bin/python bench/daemon_sampling.py [--threads 64] [--seconds 30] [--interval 1]

The watched process's threads sleep (the daemon's cost does not depend on what they do); the
daemon opens one perf group (task clock, page faults, context switches) per thread and reads
every group each interval. CPU share = daemon utime+stime over the window / window length.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _daemon import Daemon  # noqa: E402
from _host import host_line  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--interval", type=float, default=1.0)
    args = ap.parse_args()
    print(host_line())
    watched = subprocess.Popen([sys.executable, "-c",
                                "import threading, time\n"
                                f"ts = [threading.Thread(target=time.sleep, args=(3600,), "
                                f"daemon=True) for _ in range({args.threads - 1})]\n"
                                "[t.start() for t in ts]\ntime.sleep(3600)"])
    try:
        with tempfile.TemporaryDirectory() as tmp:
            d = Daemon(Path(tmp), interval=args.interval,
                       extra='events = ["task_clock_ns", "page_faults", "context_switches"]\n'
                             f'[[watch]]\njob = "bench"\npids = [{watched.pid}]\n')
            try:
                deadline = time.monotonic() + 20
                threads = 0.0
                while time.monotonic() < deadline:
                    for line in urllib.request.urlopen(d.url, timeout=5).read().decode() \
                            .splitlines():
                        if line.startswith('counterd_watched_threads{uid="",workload="bench"}'):
                            threads = float(line.split()[-1])
                    if threads >= args.threads:
                        break
                    time.sleep(0.5)
                cpu0, t0 = d.cpu_seconds(), time.monotonic()
                time.sleep(args.seconds)
                cpu, elapsed = d.cpu_seconds() - cpu0, time.monotonic() - t0
                print(f"threads sampled {threads:.0f}, interval {args.interval} s, window "
                      f"{elapsed:.1f} s")
                print(f"daemon CPU {cpu:.2f} s = {100 * cpu / elapsed:.2f} % of one core; "
                      f"RSS {d.rss_bytes() / 2**20:.1f} MiB")
            finally:
                d.stop()
    finally:
        watched.kill()
        watched.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
