"""Cost of one superstep marker pair (begin + end), in microseconds, per configuration.

    .venv/bin/python bench/marker_cost.py [--pairs N] [--batches B]

Each batch times N empty ``with counterd.superstep(...)`` blocks with CLOCK_MONOTONIC; the
figure is the median over batches of (batch time / N), with the min and max batch beside it.
Configurations: no counters (memory sink), perf software events (task_clock_ns, page_faults,
context_switches) with the memory sink, and the same writing to a spool file as under
``counterd record``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _host import host_line  # noqa: E402

import counterd  # noqa: E402
from counterd.superstep import configure  # noqa: E402

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
    print(f"{'configuration':<44} {'median us/pair':>15} {'min':>8} {'max':>8}")
    with tempfile.TemporaryDirectory() as spool:
        configs = [
            ("no counters, memory sink", dict(backend="none")),
            ("perf software events, memory sink", dict(backend="perf", events=SOFTWARE)),
            ("perf software events, spool file", dict(backend="perf", events=SOFTWARE,
                                                      spool=Path(spool))),
        ]
        for label, kw in configs:
            configure(**kw)  # type: ignore[arg-type]
            per_pair_us(200, 1)  # warm-up: opens the counter group, fills caches
            samples = per_pair_us(args.pairs, args.batches)
            got = counterd.records()[-1:] if not kw.get("spool") else []
            if got and kw["backend"] == "perf" and "task_clock_ns" not in got[0].counters:
                print(f"  warning: {label}: no task_clock_ns in records ({got[0].unsupported})")
            print(f"{label:<44} {statistics.median(samples):>15.2f} {min(samples):>8.2f} "
                  f"{max(samples):>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
