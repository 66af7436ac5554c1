"""Simulated counters for the same access pattern from the two simulators, side by side.

    .venv/bin/python bench/sim_vs_callgrind.py [--n N]

A program marks three supersteps with the real marker API and runs native kernels of
libcounterd in them (p1, stride 8 words = 64 B, N elements, i.e. one access per line):
  load   - strided loads over the array (cold)
  store  - strided stores over the same array
  reload - strided loads again (evicts the dirty lines of `store`)
It runs under callgrind via ``callgrind.count_supersteps`` (markers cut the dumps), and the
same streams (StridedStream.from_kernel) are fed to the sim backend. Both get one geometry:
this host's L1d and, as the last level, this host's L2 (so that the array does not fit and
misses and writebacks are non-trivial). Callgrind's counts include the marker's own work and
the interpreter (a few thousand accesses per superstep); sim's are the kernel's stream only.
Every number printed is simulated.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _host import host_line  # noqa: E402

from counterd import machine, sim  # noqa: E402
from counterd.backends.callgrind.counting import count_supersteps  # noqa: E402
from counterd.backends.callgrind.geometry import CacheSpec, CallgrindGeometry  # noqa: E402
from counterd.machine.geometry import CacheLevel, Geometry  # noqa: E402

PROGRAM = """\
import sys
import numpy as np
import counterd
from counterd._native import lib

L = lib()
n, stride = int(sys.argv[1]), 8
a = np.zeros(n * stride, dtype=np.uint64)
a[:] = 0  # pre-fault outside the supersteps
with counterd.superstep("load", n=n):
    L.counterd_load_stride(a.ctypes.data, n, stride, 1)
with counterd.superstep("store", n=n):
    L.counterd_store_stride(a.ctypes.data, n, stride, 1, 7)
with counterd.superstep("reload", n=n):
    L.counterd_load_stride(a.ctypes.data, n, stride, 1)
"""
KERNELS = (("load", "load_stride"), ("store", "store_stride"), ("reload", "load_stride"))
COUNTERS = ("loads", "stores", "l1d_misses", "l2_misses", "l2_writebacks")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200_000, help="elements (one per 64-byte line)")
    args = ap.parse_args()
    m = machine.current()  # this host's (sysfs), or COUNTERD_MACHINE's
    if m.l1i is None or len(m.levels) < 2:
        raise SystemExit(f"{m.caches_source} lacks an L1i, an L1d or an L2")
    l1, l1i, l2 = m.levels[0], m.l1i, m.levels[1]
    spec = CacheSpec
    geo_cg = CallgrindGeometry(spec(l1i.size_bytes, l1i.ways, l1i.line_bytes),
                               spec(l1.size_bytes, l1.ways, l1.line_bytes),
                               spec(l2.size_bytes, l2.ways, l2.line_bytes), last_level=2)
    geo_sim = Geometry((CacheLevel(1, l1.size_bytes, l1.ways, l1.line_bytes),
                       CacheLevel(2, l2.size_bytes, l2.ways, l2.line_bytes)))
    print(host_line())
    print(f"geometry for both: {geo_sim.spec()} (host L1d, host L2 as last level); "
          f"pattern p1.s8 (64 B stride), N = {args.n:,} elements = {args.n * 64 / 2**20:.1f} MiB")
    with tempfile.TemporaryDirectory() as tmp:
        prog = Path(tmp) / "pattern.py"
        prog.write_text(PROGRAM)
        recs = count_supersteps([sys.executable, str(prog), str(args.n)], run_id="xcheck",
                                env=dict(os.environ), geometry=geo_cg,
                                outdir=Path(tmp) / "cg", timeout=1200)
    engine = sim.CacheSim(geo_sim)
    base = 1 << 30  # line- and page-aligned like numpy's large allocations
    engine.feed(sim.StridedStream(base, args.n * 8, 8, "store"))  # the program's a[:] = 0
    by_name = {r.name: r for r in recs.values()}
    print(f"{'superstep':<8} {'counter':<14} {'sim':>12} {'callgrind':>12} {'cg/sim':>8}")
    worst = 0.0
    for step, kernel in KERNELS:
        before = engine.counts().canonical()
        engine.feed(sim.StridedStream.from_kernel(kernel, args.n, 8, 1, base))
        after = engine.counts().canonical()
        rec = by_name[step]
        for c in COUNTERS:
            s_val = after[c] - before[c]
            cv = rec.counters.get(c)
            c_val = cv.value if cv is not None else float("nan")
            ratio = c_val / s_val if s_val else float("nan")
            if s_val >= 1000:
                worst = max(worst, abs(ratio - 1))
            print(f"{step:<8} {c:<14} {s_val:>12,.0f} {c_val:>12,.0f} {ratio:>8.3f}")
    print(f"largest relative difference on counts >= 1,000: {worst:.2%}")
    print("sim L1 is write-back into L2; callgrind's D1 is write-through (dirty lines live in "
          "the LL only): their l1d writebacks are not compared.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
