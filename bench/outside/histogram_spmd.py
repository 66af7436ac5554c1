"""A histogram of n samples in 2 processes (multiprocessing, fork) over shared memory: each
draws its share, counts it in 1024 bins, then each sums its half of the bins over all
processes' counts; the parent prints the median bin.

    python bench/outside/histogram_spmd.py N [P]
"""

from __future__ import annotations

import multiprocessing as mp
import sys
from multiprocessing import shared_memory
from typing import Any

import numpy as np

import counterd

BINS = 1024


def worker(rank: int, p: int, n: int, names: tuple[str, str], barrier: Any) -> None:
    parts, total = (shared_memory.SharedMemory(name=x) for x in names)
    counts = np.ndarray((p, BINS), dtype=np.int64, buffer=parts.buf)
    hist = np.ndarray((BINS,), dtype=np.int64, buffer=total.buf)
    share = (rank + 1) * n // p - rank * n // p
    try:
        with counterd.superstep("draw", n=n):
            x = np.random.default_rng(rank).normal(0.0, 1.0, share)
        with counterd.superstep("count", n=n):
            bins = np.clip(((x + 4.0) * (BINS / 8.0)).astype(np.int64), 0, BINS - 1)
            counts[rank] = np.bincount(bins, minlength=BINS)
        barrier.wait()
        lo, hi = rank * BINS // p, (rank + 1) * BINS // p
        with counterd.superstep("reduce", n=n):
            hist[lo:hi] = counts[:, lo:hi].sum(axis=0)
        barrier.wait()
    finally:
        del counts, hist
        parts.close()
        total.close()


def main(n: int, p: int = 2) -> int:
    ctx = mp.get_context("fork")
    parts = shared_memory.SharedMemory(create=True, size=8 * p * BINS)
    total = shared_memory.SharedMemory(create=True, size=8 * BINS)
    try:
        barrier = ctx.Barrier(p)
        procs = [ctx.Process(target=worker, args=(r, p, n, (parts.name, total.name), barrier))
                 for r in range(p)]
        for q in procs:
            q.start()
        for q in procs:
            q.join()
        hist = np.ndarray((BINS,), dtype=np.int64, buffer=total.buf)
        ok = all(q.exitcode == 0 for q in procs) and int(hist.sum()) == n
        print(f"median bin {int(np.searchsorted(np.cumsum(hist), n // 2))}")
        del hist
        return 0 if ok else 1
    finally:
        for s in (parts, total):
            s.close()
            s.unlink()


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), *(int(x) for x in sys.argv[2:3])))
