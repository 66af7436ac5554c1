"""What a process's first superstep markers cost against its later ones, under ``counterd record``.

A first superstep's start skew (bench/start_skew.py) is partly how much more marker code a
process runs on its way into its first superstep than into a later one: every such microsecond
is a window in which a process descheduled on a busy host begins late. This times, in each
process, STEPS empty supersteps one after the other (no barrier): the begin (from just before
``with counterd.superstep(...)`` to the step's own ``begin_ns``, both CLOCK_MONOTONIC), the
enter (to the first statement inside) and the end (from the last statement inside to just after
the block). Each superstep follows a barrier of the processes, as in the program whose start
skew bench/start_skew.py measures: a process's marker code is as cold after a barrier's wait as
it is there. Processes: forked and spawned multiprocessing workers and MPI ranks, as
tests/counterd/skew_program.py starts them; the table gives, per path and backend, the median
over processes of the first, second and last superstep's costs, in microseconds.

    python bench/first_marker.py [--procs 2] [--rounds 5] [--how fork,spawn,mpi]
                                 [--backend perf,sim] [--steps 10] [--pyperf FILE]

With ``--pyperf FILE`` every process's first, second and last begin, enter and end are also
written as pyperf JSON (bench/_pyperf.py), ``first_marker/BACKEND/HOW/Np/first begin`` and so
on: ``python -m pyperf compare_to OLD NEW`` compares two runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MPIEXEC = Path(sys.executable).parent / "mpiexec"


def _times(steps: int, barrier: Callable[[], object]) -> list[tuple[int, int, int]]:
    """(begin, enter, end) ns of ``steps`` empty supersteps, each after a barrier."""
    import counterd

    clock = time.monotonic_ns
    out = []
    for k in range(steps):
        barrier()
        t0 = clock()
        with counterd.superstep("timed", k=k) as step:
            t1 = clock()
        t2 = clock()
        out.append((step.begin_ns - t0, t1 - t0, t2 - t1))
    return out


def _child(steps: int, out: str, barrier: Callable[[], object]) -> None:
    times = _times(steps, barrier)
    with open(out, "a") as f:
        f.write(json.dumps(times) + "\n")


def _worker(steps: int, out: str, barrier: Any) -> None:
    _child(steps, out, barrier.wait)


def _program(how: str, n: int, rounds: int, steps: int, out: str) -> int:
    """The recorded program: ``how`` workers (or this MPI rank) time their supersteps."""
    if how == "mpi":
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        comm.Barrier()  # MPI's own first-use set-up
        _child(steps, out, comm.Barrier)
        return 0
    import multiprocessing as mp

    ctx = mp.get_context(how)
    for _ in range(rounds):
        barrier = ctx.Barrier(n)
        procs = [ctx.Process(target=_worker, args=(steps, out, barrier)) for _ in range(n)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
    return 0


def _measure(backend: str, how: str, n: int, rounds: int, steps: int,
             tmp: Path) -> list[list[tuple[int, int, int]]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COUNTERD_")}
    env["COUNTERD_SOCKET"] = "off"
    env["PYTHONPATH"] = str(ROOT)
    out = tmp / f"{backend}-{how}.times"
    out.unlink(missing_ok=True)
    me = [sys.executable, str(Path(__file__).resolve()), "--program", how, str(n), str(rounds),
          str(steps), str(out)]
    for _ in range(rounds if how == "mpi" else 1):
        cmd = [str(MPIEXEC), "-n", str(n), *me] if how == "mpi" else me
        subprocess.run([sys.executable, "-m", "counterd.commands.cli", "record", "--backend",
                        backend,
                        "--out", str(tmp / "rec.jsonl"), "--", *cmd], env=env, cwd=tmp,
                       check=True, capture_output=True, timeout=600)
    return [json.loads(line) for line in out.read_text().splitlines()]


def main() -> int:
    if sys.argv[1:2] == ["--program"]:
        how, n, rounds, steps, out = sys.argv[2:7]
        return _program(how, int(n), int(rounds), int(steps), out)
    sys.path.insert(0, str(ROOT / "bench"))
    from _host import host_line
    from _pyperf import PyperfOut, add_option

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--how", default="fork,spawn,mpi")
    ap.add_argument("--backend", default="perf,sim")
    add_option(ap)
    a = ap.parse_args()
    host = host_line()
    print(host)
    pp = PyperfOut(a.pyperf, host)
    print(f"load average {os.getloadavg()[0]:.2f}; per process: median over processes, us "
          "(begin = to the step's begin_ns; enter = to the body; end = body to after)")
    hows = [h for h in a.how.split(",") if h != "mpi" or MPIEXEC.exists()]
    with tempfile.TemporaryDirectory(prefix="first-marker-") as tmp:
        for backend in a.backend.split(","):
            for how in hows:
                per = _measure(backend, how, a.procs, a.rounds, a.steps, Path(tmp))
                cells = []
                for what, i in (("begin", 0), ("enter", 1), ("end", 2)):
                    med = [statistics.median(p[k][i] for p in per) / 1e3
                           for k in (0, 1, a.steps - 1)]
                    cells.append(f"{what} {med[0]:7.1f} {med[1]:6.1f} {med[2]:6.1f}")
                    for k, which in ((0, "first"), (1, "second"), (a.steps - 1, "last")):
                        pp.add(f"first_marker/{backend}/{how}/{a.procs}p/{which} {what}",
                                [p[k][i] / 1e9 for p in per], backend=backend)
                print(f"  {backend:<5} {how:<6} ({len(per)} processes)  first/second/last: "
                      + "   ".join(cells), flush=True)
    pp.dump()
    return 0


if __name__ == "__main__":
    sys.exit(main())
