"""A parallel prefix sum over shared memory: 2 processes (multiprocessing, fork), each scans
its half of n doubles, reads the totals of the halves before its own, adds that offset.

    python bench/outside/prefix_spmd.py N [P]
"""

from __future__ import annotations

import multiprocessing as mp
import sys
from multiprocessing import shared_memory
from typing import Any

import numpy as np

import counterd


def worker(rank: int, p: int, n: int, names: tuple[str, str], barrier: Any) -> None:
    data, sums = (shared_memory.SharedMemory(name=x) for x in names)
    a = np.ndarray((n,), dtype=np.float64, buffer=data.buf)
    totals = np.ndarray((p,), dtype=np.float64, buffer=sums.buf)
    mine = a[rank * n // p:(rank + 1) * n // p]
    try:
        with counterd.superstep("fill", n=n):
            mine[:] = 1.0
        barrier.wait()
        with counterd.superstep("scan", n=n):
            np.cumsum(mine, out=mine)
            totals[rank] = mine[-1] if len(mine) else 0.0
        barrier.wait()
        with counterd.superstep("add offsets", n=n):
            mine += totals[:rank].sum()
        barrier.wait()
        if rank == p - 1 and a[-1] != n:
            raise SystemExit(f"wrong prefix sum {a[-1]}")
    finally:
        del a, totals, mine
        data.close()
        sums.close()


def main(n: int, p: int = 2) -> int:
    ctx = mp.get_context("fork")
    data = shared_memory.SharedMemory(create=True, size=8 * n)
    sums = shared_memory.SharedMemory(create=True, size=8 * p)
    try:
        barrier = ctx.Barrier(p)
        procs = [ctx.Process(target=worker, args=(r, p, n, (data.name, sums.name), barrier))
                 for r in range(p)]
        for q in procs:
            q.start()
        for q in procs:
            q.join()
        print(f"total {float(np.ndarray((p,), dtype=np.float64, buffer=sums.buf).sum()):g}")
        return 0 if all(q.exitcode == 0 for q in procs) else 1
    finally:
        for shm in (data, sums):
            shm.close()
            shm.unlink()


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), *(int(x) for x in sys.argv[2:3])))
