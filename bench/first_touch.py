"""What a first touch of memory costs on this host by how long the memory lay free before:
the free page reporting check of ``counterd probe`` (counterd/commands/noise.py), measured.

Where a VM's balloon device reports freed memory to the hypervisor (free page reporting), the
hypervisor drops it, and the next first touch of it faults there as well as in the guest.
Memory freed and taken again before the guest reports it (the kernel waits about 2 s,
mm/page_reporting.c) costs only the guest's fault. So a program that allocates runs slower or
faster by how long the memory it is given lay free, and the pilots, checking runs and a
user's run of the same program differ by it.

Each round allocates and fills a fresh buffer (numpy.ones: the kernel's page faults plus the
writes, as a numpy program's first touch of a new array) after sleeping each of the waits
since the previous buffer was freed; rounds repeat the waits in order. Printed per wait: the
median, least and greatest time over the rounds and the median over the no-wait median. On a
host without free page reporting the times should not depend on the wait.

    .venv/bin/python bench/first_touch.py [--mib 64] [--rounds 5] [--waits 0,0.5,1,2,4,8]
        [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._host import guarded, host_line  # noqa: E402
from counterd.data.host import page_reporting  # noqa: E402


def _waits(text: str) -> list[float]:
    try:
        waits = [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give seconds, comma-separated, e.g. 0,1,4") from None
    if not waits or any(not 0 <= w <= 60 for w in waits):
        raise argparse.ArgumentTypeError(f"{text!r}: each wait 0 to 60 seconds")
    return waits


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number of 1 or more")
    return value


def touch_ms(mib: int) -> float:
    """Milliseconds to allocate and fill ``mib`` MiB; the buffer is freed on return."""
    t0 = time.perf_counter()
    buf = np.ones(mib * (1 << 20) // 8)
    t1 = time.perf_counter()
    del buf
    return (t1 - t0) * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=_positive, default=64, help="buffer size (default 64 MiB)")
    ap.add_argument("--rounds", type=_positive, default=5, help="rounds over the waits (5)")
    ap.add_argument("--waits", type=_waits, default=[0.0, 0.5, 1.0, 2.0, 4.0, 8.0],
                    help="seconds idle after a free, comma-separated (0,0.5,1,2,4,8)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    a = ap.parse_args()
    pr = page_reporting()
    touch_ms(a.mib)  # the first buffer of the process: numpy's and the allocator's first use
    times: dict[float, list[float]] = {w: [] for w in a.waits}
    for _ in range(a.rounds):
        for w in a.waits:
            time.sleep(w)
            times[w].append(touch_ms(a.mib))
    base = statistics.median(times[a.waits[0]])
    print(host_line())
    print(f"free page reporting: {pr.state} ({pr.detail()})")
    print(f"{a.mib} MiB allocated and filled (numpy.ones) after each wait, {a.rounds} rounds")
    print(f"{'idle before':>12} {'median':>9} {'least':>9} {'greatest':>9} "
          f"{'/ at ' + format(a.waits[0], 'g') + ' s':>10}")
    rows = []
    for w in a.waits:
        med = statistics.median(times[w])
        rows.append({"wait_s": w, "median_ms": med, "min_ms": min(times[w]),
                     "max_ms": max(times[w]), "ratio": med / base, "ms": times[w]})
        print(f"{w:>10g} s {med:>6.1f} ms {min(times[w]):>6.1f} ms {max(times[w]):>6.1f} ms "
              f"{med / base:>9.1f}x")
    if a.json:
        a.json.write_text(json.dumps({"host": host_line(), "page_reporting": pr.to_json(),
                                      "mib": a.mib, "rounds": a.rounds, "rows": rows},
                                     indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(guarded(main))
