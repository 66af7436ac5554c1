"""A small bulk-synchronous SPMD program with superstep markers: parallel sum with exchange.

p worker processes (default: one per CPU, at most 4), pinned one per CPU, share one array.
Supersteps, separated by barriers:
  0 fill      each processor writes ones into its own block  (stores)
  1 sum       each processor sums its own block              (loads)
  2 exchange  each processor sums its right neighbour's block (loads of data dirty elsewhere)
  3 combine   processor 0 adds the partial sums              (tiny: 2p loads)

Run it under ``counterd record --out run.jsonl -- python examples/bsp_sum.py [N] [P]``.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys

import numpy as np

import counterd
from counterd.sim import StridedStream


def worker(rank: int, p: int, n: int, shm_name: str, partials_name: str,
           barrier: mp.synchronize.Barrier) -> None:
    from multiprocessing import shared_memory

    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[rank % len(cpus)]})
    counterd.set_rank(rank)
    counterd.init()  # the markers set up before the first barrier (done at import under record)
    shm = shared_memory.SharedMemory(name=shm_name)
    part = shared_memory.SharedMemory(name=partials_name)
    a = np.ndarray((n,), dtype=np.float64, buffer=shm.buf)
    partials = np.ndarray((2 * p,), dtype=np.float64, buffer=part.buf)
    lo, hi = rank * n // p, (rank + 1) * n // p
    rlo, rhi = ((rank + 1) % p) * n // p, ((rank + 1) % p + 1) * n // p
    base = a.ctypes.data

    def words(first: int, last: int, kind: str) -> StridedStream:
        """The address stream of a[first:last] (for the sim backend; ignored by real counters)."""
        return StridedStream(base + 8 * first, last - first, 8, kind)
    try:
        a[lo:hi] = 0.0  # first touch by the processor that uses the block: page faults here
        barrier.wait()
        with counterd.superstep("fill", n=n, p=p) as step:
            a[lo:hi] = 1.0  # stores only: no temporary array
            step.feed(words(lo, hi, "store"))
        barrier.wait()
        with counterd.superstep("sum", n=n, p=p) as step:
            partials[rank] = a[lo:hi].sum()
            step.feed(words(lo, hi, "load"))
        barrier.wait()
        with counterd.superstep("exchange", n=n, p=p) as step:
            partials[p + rank] = a[rlo:rhi].sum()
            step.feed(words(rlo, rhi, "load"))
        barrier.wait()
        sums = StridedStream(partials.ctypes.data, 2 * p, 8, "load")  # read by processor 0
        with counterd.superstep("combine", n=n, p=p) as step:
            if rank == 0:
                step.feed(sums)
                total = partials[:p].sum()
                expect = float(n)
                exchanged = partials[p:].sum()
                if abs(total - expect) > 1e-6 * expect or abs(exchanged - total) > 1e-6 * expect:
                    raise SystemExit(f"wrong sum {total} != {expect}")
        barrier.wait()
    finally:
        del a, partials
        shm.close()
        part.close()


def main() -> int:
    from multiprocessing import shared_memory

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 4_000_000
    p = int(sys.argv[2]) if len(sys.argv) > 2 else min(4, len(os.sched_getaffinity(0)))
    ctx = mp.get_context("fork")
    shm = shared_memory.SharedMemory(create=True, size=n * 8)
    part = shared_memory.SharedMemory(create=True, size=2 * p * 8)
    try:
        barrier = ctx.Barrier(p)
        procs = [ctx.Process(target=worker, args=(r, p, n, shm.name, part.name, barrier))
                 for r in range(p)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join()
        failed = [proc.exitcode for proc in procs if proc.exitcode != 0]
        return 1 if failed else 0
    finally:
        shm.close()
        shm.unlink()
        part.close()
        part.unlink()


if __name__ == "__main__":
    sys.exit(main())
