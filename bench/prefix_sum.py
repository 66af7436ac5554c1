"""An SPMD prefix sum over shared memory, written as a user would write it (not for counterd).

P worker processes (multiprocessing, fork) share one array of n doubles and a small array of
block totals; three supersteps separated by barriers:

    local scan   each processor: np.cumsum of its own block, in place
    offsets      each processor: the sum of the totals of the blocks before its own
    add offsets  each processor: its block plus its offset, in place

The last element is checked against the closed form. The program calls nothing of counterd's
but ``superstep``: whatever sets the markers up is counterd's business (under ``counterd
record`` it happens at import).

    python bench/prefix_sum.py N [P]
    counterd record --out run.jsonl -- python bench/prefix_sum.py 800000
    predict --pilot 'python bench/prefix_sum.py {n}' --sizes 50000,100000,150000,200000 \\
        --target 800000 --check
"""

from __future__ import annotations

import multiprocessing as mp
import sys
from multiprocessing import shared_memory
from typing import Any

import numpy as np

import counterd


def worker(rank: int, p: int, n: int, names: tuple[str, str], barrier: Any) -> None:
    data = shared_memory.SharedMemory(name=names[0])
    sums = shared_memory.SharedMemory(name=names[1])
    a = np.ndarray((n,), dtype=np.float64, buffer=data.buf)
    totals = np.ndarray((p,), dtype=np.float64, buffer=sums.buf)
    lo, hi = rank * n // p, (rank + 1) * n // p
    mine = a[lo:hi]
    try:
        mine[:] = np.arange(lo, hi, dtype=np.float64)  # the input: 0, 1, ..., n-1
        barrier.wait()
        with counterd.superstep("local scan", n=n):
            np.cumsum(mine, out=mine)
            totals[rank] = mine[-1] if hi > lo else 0.0
        barrier.wait()
        with counterd.superstep("offsets", n=n):
            offset = float(totals[:rank].sum())
        barrier.wait()
        with counterd.superstep("add offsets", n=n):
            mine += offset
        barrier.wait()
        if rank == p - 1 and n and a[-1] != n * (n - 1) / 2:
            raise SystemExit(f"wrong prefix sum: {a[-1]} != {n * (n - 1) / 2}")
    finally:
        del a, totals, mine
        data.close()
        sums.close()


def main() -> int:
    n = int(sys.argv[1])
    p = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    ctx = mp.get_context("fork")
    data = shared_memory.SharedMemory(create=True, size=max(8, 8 * n))
    sums = shared_memory.SharedMemory(create=True, size=8 * p)
    try:
        barrier = ctx.Barrier(p)
        procs = [ctx.Process(target=worker, args=(r, p, n, (data.name, sums.name), barrier))
                 for r in range(p)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join()
        return 0 if all(proc.exitcode == 0 for proc in procs) else 1
    finally:
        data.close()
        data.unlink()
        sums.close()
        sums.unlink()


if __name__ == "__main__":
    sys.exit(main())
