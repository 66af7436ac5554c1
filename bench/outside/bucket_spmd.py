"""A bucket sort of n random doubles in 2 processes (multiprocessing, fork) over shared memory:
each draws its share of uniform values in [0, 1) and counts them per bucket (bucket b holds
[b/p, (b+1)/p)); after the counts are exchanged each writes its values into every bucket's
place in one shared array, then each sorts its own bucket with np.sort. The parent checks that
the whole array is sorted.

    python bench/outside/bucket_spmd.py N [P]
"""

from __future__ import annotations

import multiprocessing as mp
import sys
from multiprocessing import shared_memory
from typing import Any

import numpy as np

# numpy 2 imports numpy.random at its first use: imported here, before the fork, so that
# each process's "generate" does not pay for the import.
from numpy.random import default_rng

import counterd


def worker(rank: int, p: int, n: int, names: tuple[str, str], barrier: Any) -> None:
    data, sizes = (shared_memory.SharedMemory(name=x) for x in names)
    out = np.ndarray((n,), dtype=np.float64, buffer=data.buf)
    counts = np.ndarray((p, p), dtype=np.int64, buffer=sizes.buf)  # [rank, bucket]
    share = (rank + 1) * n // p - rank * n // p
    try:
        with counterd.superstep("generate", n=n):
            x = default_rng(100 + rank).random(share)
            bucket = np.minimum((x * p).astype(np.int64), p - 1)
            counts[rank] = np.bincount(bucket, minlength=p)
        barrier.wait()
        with counterd.superstep("scatter", n=n):
            # Bucket b starts after every smaller bucket; this rank's part of it after the
            # parts of the ranks before it.
            starts = np.concatenate(([0], np.cumsum(counts.sum(axis=0))[:-1]))
            offsets = starts + counts[:rank].sum(axis=0)
            order = np.argsort(bucket, kind="stable")
            ends = np.cumsum(counts[rank])
            for b in range(p):
                seg = order[ends[b] - counts[rank, b]:ends[b]]
                out[offsets[b]:offsets[b] + len(seg)] = x[seg]
        barrier.wait()
        with counterd.superstep("sort", n=n):
            mine = out[starts[rank]:starts[rank] + counts[:, rank].sum()]
            mine[:] = np.sort(mine)
        barrier.wait()
    finally:
        del out, counts
        data.close()
        sizes.close()


def main(n: int, p: int = 2) -> int:
    ctx = mp.get_context("fork")
    data = shared_memory.SharedMemory(create=True, size=max(8 * n, 1))
    sizes = shared_memory.SharedMemory(create=True, size=8 * p * p)
    try:
        barrier = ctx.Barrier(p)
        procs = [ctx.Process(target=worker, args=(r, p, n, (data.name, sizes.name), barrier))
                 for r in range(p)]
        for q in procs:
            q.start()
        for q in procs:
            q.join()
        out = np.ndarray((n,), dtype=np.float64, buffer=data.buf)
        counts = np.ndarray((p, p), dtype=np.int64, buffer=sizes.buf)
        ok = (all(q.exitcode == 0 for q in procs) and int(counts.sum()) == n
              and bool(np.all(out[1:] >= out[:-1])))
        print(f"sorted {n} values in {p} buckets of {', '.join(map(str, counts.sum(axis=0)))}: "
              + ("in order" if ok else "NOT in order"))
        del out, counts
        return 0 if ok else 1
    finally:
        for shm in (data, sizes):
            shm.close()
            shm.unlink()


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), *(int(x) for x in sys.argv[2:3])))
