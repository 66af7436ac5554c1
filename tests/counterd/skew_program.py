"""Barrier, an empty superstep, barrier, an empty superstep: the start skew of a first superstep
against a second one (tests/counterd/test_start_skew.py, bench/start_skew.py).

    python skew_program.py fork|spawn N ROUNDS   # ROUNDS sets of N fresh worker processes
    mpiexec -n N python skew_program.py mpi      # one round of N MPI ranks

Each round's supersteps carry ``round=k``, so that rounds of one recording can be told apart.
The program marks nothing else and calls nothing of counterd's but ``superstep`` (each
process's rank is the one counterd finds: the MPI launcher's, the multiprocessing worker's):
whatever sets the markers up (``COUNTERD_INIT=import`` under ``counterd record``, or
``--init``: an explicit ``counterd.init()`` in each process) is what is measured.
"""

from __future__ import annotations

import multiprocessing as mp
import sys
from collections.abc import Iterable
from typing import Any

import counterd
from counterd.data.records import SuperstepRecord

EXPLICIT = "--init" in sys.argv


def _steps(k: int, barrier: Any) -> None:
    if EXPLICIT:
        counterd.init()
    barrier()
    with counterd.superstep("first", round=k):
        pass
    barrier()
    with counterd.superstep("second", round=k):
        pass
    barrier()


def _worker(rank: int, k: int, barrier: Any) -> None:
    _steps(k, barrier.wait)


def skews(records: Iterable[SuperstepRecord]) -> dict[int, tuple[int, int]]:
    """Per round: the start skew (last begin minus first begin over its processors) of its
    first and of its second superstep, in ns."""
    begins: dict[tuple[object, str], list[int]] = {}
    for r in records:
        begins.setdefault((r.params.get("round"), r.name), []).append(r.begin_ns)
    out = {}
    for (k, name), b in begins.items():
        if name == "first" and (k, "second") in begins:
            s = begins[(k, "second")]
            out[int(str(k))] = (max(b) - min(b), max(s) - min(s))
    return dict(sorted(out.items()))


def main() -> int:
    args = [a for a in sys.argv[1:] if a != "--init"]
    how = args[0]
    if how == "mpi":
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        comm.Barrier()  # MPI's own first-use set-up (its shared-memory channels): not counterd's
        _steps(0, comm.Barrier)
        return 0
    n, rounds = int(args[1]), int(args[2])
    if EXPLICIT:
        counterd.init()  # a forked worker inherits it (and is set up at the fork)
    ctx = mp.get_context(how)
    for k in range(rounds):
        barrier = ctx.Barrier(n)
        procs = [ctx.Process(target=_worker, args=(r, k, barrier)) for r in range(n)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        if any(p.exitcode != 0 for p in procs):
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
