"""The same marker API in MPI ranks (mpi4py): a two-superstep program with barriers.

    counterd record --out run.jsonl -- mpiexec -n 2 python examples/bsp_mpi.py [N]

Each rank's processor id comes from the MPI launcher's environment (PMI_RANK and friends);
``counterd.set_rank(comm.rank)`` would do the same explicitly.
"""

from __future__ import annotations

import sys

import numpy as np
from mpi4py import MPI

import counterd


def main() -> int:
    comm = MPI.COMM_WORLD
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    local = np.arange(comm.rank, n, comm.size, dtype=np.float64)
    counterd.init()  # the markers set up before the first barrier (done at import under record)
    comm.Barrier()
    with counterd.superstep("local sum", n=n):
        partial = float(local.sum())
    comm.Barrier()
    with counterd.superstep("allreduce", n=n):
        total = comm.allreduce(partial)
    comm.Barrier()
    return 0 if total == n * (n - 1) / 2 else 1


if __name__ == "__main__":
    sys.exit(main())
