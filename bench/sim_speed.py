"""Speed of the sim backend's two engines, in simulated accesses per second.

Usage: python bench/sim_speed.py [--accesses N]

Prints the host, the geometry (this host's, from sysfs) and, per engine and stream shape, the
accesses simulated, the seconds taken and accesses/second. A stream shape is a strided sweep
(the microbenchmark kernels' loop nest, stride 1 word over 4 x L2, loads then stores) and a
uniformly random one with 30% stores over 64 MiB. The Python engine is the specification and is
run on fewer accesses, since it is two orders of magnitude slower.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _host import host_line  # noqa: E402

from counterd import machine  # noqa: E402
from counterd.machine.geometry import Geometry  # noqa: E402
from counterd.machine.memory import SGI_BANKS  # noqa: E402
from counterd.sim import AddressStream, CacheSim, StridedStream, native_status  # noqa: E402


def streams(geometry: Geometry, n: int) -> dict[str, list[StridedStream | AddressStream]]:
    l2 = geometry.levels[min(1, len(geometry.levels) - 1)].size_bytes
    words = min(n // 2, 4 * l2 // 8)
    reps = max(1, n // 2 // words)
    rng = np.random.default_rng(1)
    addr = (rng.integers(0, 64 << 20, size=n) & ~7).astype(np.uint64)
    kinds = (rng.random(n) < 0.3).astype(np.uint8)
    return {
        "strided": [StridedStream(1 << 40, words, 8, "load", reps),
                    StridedStream(1 << 40, words, 8, "store", reps)],
        "random": [AddressStream(addr, kinds)],
    }


def measure(engine: str, geometry: Geometry, n: int) -> list[tuple[str, int, float]]:
    rows = []
    for shape, ss in streams(geometry, n).items():
        sim = CacheSim(geometry, SGI_BANKS, engine)  # type: ignore[arg-type]
        t0 = time.perf_counter()
        sim.feed(ss)
        dt = time.perf_counter() - t0
        c = sim.counts()
        rows.append((shape, c.loads + c.stores, dt))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--accesses", type=int, default=20_000_000,
                    help="accesses per stream for the native engine (Python: 1/100 of it)")
    args = ap.parse_args()
    geometry = machine.current().geometry
    print(host_line())  # platform node, CPU model, CPUs, kernel, python
    print(f"geometry: {geometry.spec()}  ({geometry.source})")
    ok, why = native_status()
    engines = [("native", args.accesses)] if ok else []
    engines.append(("python", max(10_000, args.accesses // 100)))
    if not ok:
        print(f"native engine unavailable: {why}")
    print(f"{'engine':<8} {'stream':<8} {'accesses':>12} {'seconds':>9} {'accesses/s':>14}")
    for engine, n in engines:
        for shape, count, dt in measure(engine, geometry, n):
            print(f"{engine:<8} {shape:<8} {count:>12,} {dt:>9.3f} {count / dt:>14,.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
