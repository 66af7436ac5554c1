"""Jacobi sweeps of a 5-point stencil on a square grid of n cells, rows split between 2
processes (multiprocessing, fork) sharing two grids; then each process's largest change.

    python bench/outside/stencil_spmd.py N [P]
"""

from __future__ import annotations

import math
import multiprocessing as mp
import sys
from multiprocessing import shared_memory
from typing import Any

import numpy as np

import counterd

SWEEPS = 4


def worker(rank: int, p: int, m: int, names: tuple[str, str, str], barrier: Any) -> None:
    shms = [shared_memory.SharedMemory(name=x) for x in names]
    grids = [np.ndarray((m, m), dtype=np.float64, buffer=s.buf) for s in shms[:2]]
    delta = np.ndarray((p,), dtype=np.float64, buffer=shms[2].buf)
    lo, hi = max(1, rank * m // p), min(m - 1, (rank + 1) * m // p)
    try:
        with counterd.superstep("init", n=m * m):
            for g in grids:
                g[lo:hi] = 0.0
                g[lo:hi, 0] = 1.0  # a hot left edge
            if rank == 0:
                for g in grids:
                    g[0] = 0.0
            if rank == p - 1:
                for g in grids:
                    g[m - 1] = 0.0
        barrier.wait()
        for k in range(SWEEPS):
            old, new = grids[k % 2], grids[(k + 1) % 2]
            with counterd.superstep("sweep", n=m * m):
                new[lo:hi, 1:-1] = 0.25 * (old[lo - 1:hi - 1, 1:-1] + old[lo + 1:hi + 1, 1:-1]
                                           + old[lo:hi, :-2] + old[lo:hi, 2:])
            barrier.wait()
        with counterd.superstep("change", n=m * m):
            delta[rank] = float(np.abs(grids[0][lo:hi] - grids[1][lo:hi]).max())
        barrier.wait()
    finally:
        del grids, delta
        for s in shms:
            s.close()


def main(n: int, p: int = 2) -> int:
    m = max(2 * p + 2, math.isqrt(n))
    ctx = mp.get_context("fork")
    shms = [shared_memory.SharedMemory(create=True, size=8 * m * m) for _ in range(2)]
    shms.append(shared_memory.SharedMemory(create=True, size=8 * p))
    try:
        barrier = ctx.Barrier(p)
        procs = [ctx.Process(target=worker,
                             args=(r, p, m, tuple(s.name for s in shms), barrier))
                 for r in range(p)]
        for q in procs:
            q.start()
        for q in procs:
            q.join()
        change = np.ndarray((p,), dtype=np.float64, buffer=shms[2].buf)
        print(f"largest change {float(change.max()):.4g}")
        del change
        return 0 if all(q.exitcode == 0 for q in procs) else 1
    finally:
        for s in shms:
            s.close()
            s.unlink()


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), *(int(x) for x in sys.argv[2:3])))
