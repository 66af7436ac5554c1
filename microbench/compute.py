"""Compute calibration patterns: what a superstep costs beyond its memory traffic.

The memory patterns (``microbench.patterns``) run C loops whose only cost is the memory
hierarchy; real supersteps also execute instructions, and mispredict branches. These patterns
are small, fixed Python and numpy kernels chosen to span that space: interpreter loops
(predictable and data-dependent branches), hashing, comparison sorts, vectorised arithmetic,
gathers and scatters, BLAS. None of them is code of the shipped programs, so F's accuracy on
those programs (``bench/program_accuracy.py``) is measured on programs the calibration never
saw.

A pattern is one kernel at one size, run as a superstep of this module's program::

    python -m microbench.compute [--quick] [--reps R] [--cpu C] [--only K1,K2]

Counters come from one run under ``counterd record --backend B`` (callgrind on a host without a
PMU: every count simulated by it, instructions exact; perf where the PMU counts instructions),
times from ``reps`` timed repetitions of every kernel in one run with markers only
(``--backend none``): the first repetition of each kernel is a warm-up and is dropped.
``measure`` does both and returns the results file's pattern objects (suite ``compute``).
"""

from __future__ import annotations

import argparse
import mmap
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

SUITE = "compute"
BACKENDS = ("auto", "perf", "papi", "callgrind", "none")
NOTES = (
    "compute patterns: small Python and numpy kernels, one superstep each after a 1 ms idle "
    "(as at a barrier); times from the timed run (first repetition dropped), counters from "
    "the counted run's second repetition",
    "under callgrind every counter is simulated by it (instructions exact for the code it "
    "ran) except page_faults, measured in the counted run's native run; the timed runs hide "
    "from code dispatch the CPU features valgrind lacks (AVX-512), so they run the code "
    "Callgrind counts",
)
PREFIX = "compute."
# The counters a compute pattern keeps (what the counting source gives of these).
COUNTERS = ("instructions", "branch_misses", "loads", "stores", "l1d_misses",
            "l2_misses", "l3_misses", "l1d_writebacks", "l2_writebacks", "l3_writebacks",
            "dtlb_misses", "page_faults")

Kernel = Callable[[Any], float]
IDLE_S = 0.001  # idle before every superstep, as at a barrier


@dataclass(frozen=True)
class Spec:
    """A kernel: ``prepare(n, rng)`` builds its input outside the timed superstep,
    ``run(state)`` is the superstep and returns a checksum (so nothing is skipped)."""

    name: str
    what: str
    prepare: Callable[[int, np.random.Generator], Any]
    run: Kernel
    size: int  # the base size (see sizes)
    quick: tuple[int, ...] = ()  # the quick suite's sizes, where not half the base size
    full: tuple[int, ...] = ()  # the full suite's, where not the base size and 4x


def _py_loop(n: int) -> float:
    s = 0
    for i in range(n):
        s += i & 7
    return float(s)


def _py_branch(bits: list[int]) -> float:
    s = 0
    for b in bits:
        if b:
            s += 1
        else:
            s -= 3
    return float(s)


def _py_dict(keys: list[int]) -> float:
    d: dict[int, int] = {}
    for k in keys:
        d[k] = d.get(k, 0) + 1
    return float(len(d))


def _np_add_small(st: tuple[np.ndarray, np.ndarray, np.ndarray, int]) -> float:
    a, b, c, reps = st
    for _ in range(reps):
        np.add(a, b, out=c)
    return float(c[0])


def _np_add(st: tuple[np.ndarray, np.ndarray, np.ndarray]) -> float:
    a, b, c = st
    for _ in range(40):
        np.add(a, b, out=c)
    return float(c[-1])


def _fresh_pages(n: int) -> float:
    """Map ``n`` fresh pages and touch each: the page faults a superstep pays when it
    allocates new arrays (glibc serves large allocations with fresh mappings)."""
    page = mmap.PAGESIZE
    with mmap.mmap(-1, n * page) as m:
        a = np.frombuffer(m, dtype=np.uint8)
        a[::page] = 1
        s = float(a[::page].sum())
        del a
    return s


def _np_matmul(st: tuple[np.ndarray, int]) -> float:
    a, reps = st
    c = a
    for _ in range(reps):
        c = a @ a
    return float(c[0, 0])


def _np_tiny(st: tuple[np.ndarray, int]) -> float:
    a, reps = st
    s = 0.0
    for _ in range(reps):
        s += float(np.cumsum(a)[-1])
    return s


SPECS: tuple[Spec, ...] = (
    Spec("empty", "nothing: the superstep's own fixed cost",
         lambda n, rng: n, lambda n: 0.0, 1),
    Spec("np-tiny", "a few numpy calls on a 512-element array",
         lambda n, rng: (rng.random(512), n), _np_tiny, 10),
    Spec("py-loop", "interpreter loop, predictable branches",
         lambda n, rng: n, _py_loop, 30_000),
    Spec("py-branch", "interpreter loop, a random branch per iteration",
         lambda n, rng: rng.integers(0, 2, n).tolist(), _py_branch, 30_000),
    Spec("py-dict", "dict counting of random keys (hashing)",
         lambda n, rng: rng.integers(0, n, n).tolist(), _py_dict, 15_000),
    Spec("py-sort", "sorted() of random floats (timsort)",
         lambda n, rng: rng.random(n).tolist(), lambda x: float(sorted(x)[0]), 15_000),
    Spec("np-add-small", "np.add on L1-resident arrays (call overhead)",
         lambda n, rng: (rng.random(256), rng.random(256), np.empty(256), n), _np_add_small,
         1_500),
    Spec("np-add", "np.add on L2-resident arrays (vectorised)",
         lambda n, rng: (rng.random(n), rng.random(n), np.empty(n)), _np_add, 10_000),
    Spec("np-sort", "np.sort of random int64",
         lambda n, rng: rng.integers(0, 2**62, n), lambda x: float(np.sort(x)[0]), 50_000),
    Spec("np-sort-sorted", "np.sort of sorted int64",
         lambda n, rng: np.arange(n, dtype=np.int64), lambda x: float(np.sort(x)[-1]),
         50_000),
    Spec("np-argsort", "np.argsort of random doubles",
         lambda n, rng: rng.random(n), lambda x: float(np.argsort(x)[0]), 50_000),
    Spec("np-searchsorted", "binary searches of random doubles in a sorted array",
         lambda n, rng: (np.sort(rng.random(n)), rng.random(n)),
         lambda st: float(np.searchsorted(st[0], st[1]).sum()), 20_000),
    Spec("np-cumsum", "np.cumsum (a dependency chain)",
         lambda n, rng: rng.random(n), lambda x: float(np.cumsum(x)[-1]), 500_000),
    Spec("np-mask", "boolean selection with a random mask",
         lambda n, rng: rng.random(n), lambda x: float(x[x > 0.5].sum()), 200_000),
    Spec("np-bincount", "histogram of random integers (scattered increments)",
         lambda n, rng: rng.integers(0, 4096, n), lambda x: float(np.bincount(x)[0]),
         800_000),
    Spec("np-take", "gather at random indices from an L3-sized array",
         lambda n, rng: (rng.random(1 << 20), rng.integers(0, 1 << 20, n)),
         lambda st: float(st[0][st[1]].sum()), 150_000),
    Spec("fresh-pages", "touching freshly mapped pages (page faults)",
         # Four sizes in both suites: the page-fault term rests on them (cross-validation
         # must find some in every training fold).
         lambda n, rng: n, _fresh_pages, 500, (100, 300, 1_000, 2_000),
         (100, 300, 1_000, 3_000)),
    Spec("np-matmul", "64 x 64 matrix products (BLAS)",
         lambda n, rng: (rng.random((64, 64)), n), _np_matmul, 200),
)
BY_NAME = {s.name: s for s in SPECS}


def sizes(spec: Spec, quick: bool) -> tuple[int, ...]:
    """Quick: half the base size (counting the quick set under callgrind took 25-30 s on the
    2-CPU test host, 10 s of it valgrind starting Python and numpy); full: the base size and
    four times it."""
    if quick:
        return spec.quick or (max(1, spec.size // 2),)
    return spec.full or (spec.size, 4 * spec.size)


def mnemonic(spec: Spec, n: int) -> str:
    return f"{PREFIX}{spec.name}.n{n}"


def run_program(quick: bool, reps: int, only: Sequence[str] = ()) -> None:
    """The calibration program: every kernel at every size, ``reps`` supersteps each (the
    first a warm-up), inside ``counterd.superstep`` markers named by the pattern."""
    import counterd

    rng = np.random.default_rng(0)
    cases = [(spec, n, spec.prepare(n, rng)) for spec in SPECS
             if not only or spec.name in only for n in sizes(spec, quick)]
    # Repetitions in the outer loop: each pattern's samples spread over the whole run, so a
    # slow spell of the host (seconds long on a shared VM) moves few of any one's samples.
    for r in range(reps):
        for spec, n, state in cases:
            time.sleep(IDLE_S)  # as a BSP processor waits at the barrier before a step
            with counterd.superstep(mnemonic(spec, n), rep=r, n=n):
                spec.run(state)


# -- measuring: the counted run and the timed run, as pattern objects of the results file ------

@dataclass(frozen=True)
class Plan:
    """Which backend counts the compute patterns (None: they are skipped, ``reason`` says
    why)."""

    backend: str | None
    reason: str


def plan(requested: str = "auto") -> Plan:
    """A counting source that gives instructions: perf or papi where the PMU counts them,
    else callgrind where valgrind is installed; ``none`` skips the compute patterns."""
    from counterd import backends

    if requested == "none":
        return Plan(None, "skipped (--compute-backend none)")
    tried = ("perf", "papi", "callgrind") if requested == "auto" else (requested,)
    why = []
    for name in tried:
        cap = backends.capability(name)
        if cap.supports("instructions"):
            return Plan(name, f"{name}: {cap.reason}")
        why.append(f"{name}: {cap.reason if not cap.available else 'counts no instructions'}")
    return Plan(None, "no source counts instructions here (" + "; ".join(why) + "); install "
                "valgrind to count them with callgrind")


def _program(quick: bool, reps: int, cpu: int, only: Sequence[str]) -> list[str]:
    argv = [sys.executable, "-m", "microbench.compute", "--reps", str(reps), "--cpu", str(cpu)]
    return argv + (["--quick"] if quick else []) + (["--only", ",".join(only)] if only else [])


def _by_pattern(records: Sequence[Any]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for r in sorted(records, key=lambda r: r.index):
        out.setdefault(r.name, []).append(r)
    return out


def measure(*, quick: bool, reps: int = 11, backend: str = "callgrind", cpu: int | None = None,
            only: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Every compute pattern: counters from one run under ``backend`` (its second repetition,
    after a warm-up, where the backend is an outside simulator; the median of the warm
    repetitions where it counts in the process), times from ``reps`` repetitions of which the
    first is dropped. Raises BadInput when a run fails."""
    from counterd.backends.callgrind.counting import SERIAL_POOLS
    from counterd.commands.recording import record
    from counterd.data.errors import BadInput

    if reps < 2:
        raise BadInput(f"{reps} repetitions of the compute patterns",
                       "give at least 2 (the first is a warm-up)")
    cpu = max(os.sched_getaffinity(0)) if cpu is None else cpu
    env = {k: v for k, v in SERIAL_POOLS.items() if k not in os.environ}
    os.environ.update(env)  # one BLAS thread in every run, as the counted run has
    try:
        inproc = backend in ("perf", "papi")
        timed = record(_program(quick, reps, cpu, only), out=None,
                       backend=backend if inproc else "none",
                       cpu_features="as-counted" if backend == "callgrind" else "native")
        counted = timed if inproc else record(_program(quick, 2, cpu, only), out=None,
                                              backend=backend)
    finally:
        for k in env:
            os.environ.pop(k, None)
    for run, what in ((timed, "timed"), (counted, "counted")):
        if run.exit_code != 0 or not run.records:
            raise BadInput(f"the {what} run of the compute patterns failed (exit code "
                           f"{run.exit_code}, {len(run.records)} supersteps)",
                           f"run it by hand: {' '.join(_program(quick, 2, cpu, only))}")
    times, counts = _by_pattern(timed.records), _by_pattern(counted.records)
    out = []
    for name, recs in times.items():
        spec = BY_NAME[name[len(PREFIX):].rsplit(".n", 1)[0]]
        warm = [r for r in counts.get(name, [])[1:] if r.end_ns is not None]
        if not warm:
            raise BadInput(f"compute pattern {name}: the counted run has no warm repetition",
                           "run microbench again")
        counters = {}
        for c in COUNTERS:
            vals = [r.counters[c] for r in warm if c in r.counters]
            if len(vals) == len(warm):  # counted in every repetition, else not at all
                counters[c] = {"value": float(np.median([v.value for v in vals])),
                               "source": str(vals[0].source)}
        samples = [int(r.duration_ns) for r in recs if r.duration_ns is not None]
        out.append(_pattern(name, spec, int(name.rsplit(".n", 1)[1]), samples,
                            recs[0].cpu, counters, counted.backend,
                            sorted({f for r in recs for f in r.flags})))
    return out


def _pattern(name: str, spec: Spec, n: int, samples: Sequence[int], cpu: int,
             counters: dict[str, dict[str, Any]], backend: str, flags: list[str]
             ) -> dict[str, Any]:
    from microbench.repetition import mad_ratio, spread

    warm = np.asarray(samples[1:], dtype=float)
    accesses = sum(int(counters[c]["value"]) for c in ("loads", "stores") if c in counters)
    return {
        "mnemonic": name, "suite": SUITE, "kernel": spec.name, "what": spec.what, "n": n,
        "procs": 1, "accesses_per_proc": accesses,
        "time_ns": {"samples": list(samples[1:]), "median": float(np.median(warm)),
                    "spread": spread(warm), "spread_definition": "(p90-p10)/median",
                    "mad_ratio": mad_ratio(warm), "warmup_dropped": 1,
                    "warmup_samples": list(samples[:1]), "reps": int(warm.size)},
        "processors": [{"rank": 0, "cpu": cpu, "counters": counters}],
        "counted_by": backend, "flags": flags,
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m microbench.compute",
                                 description="the compute calibration program (run it under "
                                             "counterd record)")
    ap.add_argument("--quick", action="store_true", help="one size per kernel")
    ap.add_argument("--reps", type=int, default=1,
                    help="supersteps per kernel and size (the first is a warm-up)")
    ap.add_argument("--cpu", type=int, default=None, help="pin to this CPU")
    ap.add_argument("--only", default="", help="comma-separated kernels (default: all)")
    a = ap.parse_args(argv)
    only = [x for x in a.only.split(",") if x]
    unknown = [x for x in only if x not in BY_NAME]
    if unknown or a.reps < 1:
        print(f"python -m microbench.compute: unknown kernel {unknown[0]!r}; choose from "
              + ", ".join(BY_NAME) if unknown else "--reps must be >= 1", file=sys.stderr)
        return 2
    if a.cpu is not None:
        os.sched_setaffinity(0, {a.cpu})
    run_program(a.quick, a.reps, only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
