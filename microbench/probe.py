"""The probe: this host's per-access figures (:class:`~microbench.estimate.Speeds`) that
:func:`microbench.estimate.estimate` prices a run with, measured in a second or two
(:func:`probe`): the native kernels' time per access at each level, the simulator's, the
runner's fixed costs, one repetition of the compute kernels and a Python's start.
"""

from __future__ import annotations

import ctypes
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import numpy as np
import psutil

from counterd.machine.views import NodeView
from counterd.sim import CacheSim, CoherentSim, StridedStream
from counterd.sim.sampling import SetSampling
from microbench.counters import translation_period
from microbench.estimate import FAR_LINES, NEAR_LINES, PROBE_MEM_BYTES, Speeds, level_keys
from microbench.kernels import KernelCall, native_lib
from microbench.plans import WorkerPlan
from microbench.repetition import RunConfig
from microbench.runner import WorkerPool


def _best(f: Any, tries: int = 3) -> float:
    best = math.inf
    for _ in range(tries):
        t0 = time.perf_counter_ns()
        f()
        best = min(best, time.perf_counter_ns() - t0)
    return float(best)


def _spans(machine: NodeView) -> dict[str, tuple[int, int]]:
    """(bytes, stride in words) the probe sweeps for each level key: half of each level, as
    the suite's patterns of that level span (s1 in L1, a line apart below it; at most
    PROBE_MEM_BYTES, so the probe stays short), and for memory four lines apart over twice the
    last level, at most PROBE_MEM_BYTES. (A cap of 4x the level above probed an L3 of 300 MB
    over 8 MB: the quick suite's L3 patterns then took 2.4 times their estimate per
    superstep on the 2-CPU test host, whose sysfs reports more L3 than serves them.)"""
    levels = machine.geometry.levels
    word = machine.word_bytes
    line_words = max(1, levels[0].line_bytes // word)
    out: dict[str, tuple[int, int]] = {}
    for i, lv in enumerate(levels):
        span = lv.size_bytes // 2
        if i > 0:
            span = max(levels[i - 1].size_bytes * 2, min(span, PROBE_MEM_BYTES))
        out[f"L{lv.level}"] = (span, 1 if i == 0 else line_words)
    out["mem"] = (min(2 * levels[-1].size_bytes, PROBE_MEM_BYTES), NEAR_LINES * line_words)
    return out


def _kernel_times(machine: NodeView, spans: Mapping[str, tuple[int, int]]
                  ) -> tuple[dict[str, float], dict[str, float], tuple[float, float], float,
                             float]:
    """Native kernels: ns per access at each level (loads, stores; memory NEAR_LINES lines
    apart), memory loads and stores FAR_LINES lines apart, ns per page touched first and
    touched again (a pattern's pre-fault: one store per page, mapped already)."""
    lib = native_lib()
    page = machine.page_bytes
    size = max(s for s, _ in spans.values()) + 2 * page
    # Shared memory, as the run's region: its pages are touched below first.
    shm = SharedMemory(create=True, size=size)
    view = ctypes.c_char.from_buffer(shm.buf)  # type: ignore[arg-type]
    addr = -(-ctypes.addressof(view) // page) * page
    pages = (size - page) // page
    touch = KernelCall("store", 0, pages, page // 8)
    t0 = time.perf_counter_ns()
    touch.run(lib, addr)
    fault_ns = (time.perf_counter_ns() - t0) / pages
    touch_ns = _best(lambda: touch.run(lib, addr), 2) / pages
    load: dict[str, float] = {}
    store: dict[str, float] = {}
    line_words = max(1, machine.geometry.levels[0].line_bytes // 8)
    far = (spans["mem"][0], FAR_LINES * line_words)
    for key, (span, stride) in [*spans.items(), ("far", far)]:
        count = max(1, span // (stride * 8))
        reps = max(1, (1 << 17) // count)
        for kernel, out in (("load", load), ("store", store)):
            call = KernelCall(kernel, 0, count, stride, reps)  # type: ignore[arg-type]
            call.run(lib, addr)  # warm
            out[key] = _best(lambda c=call: c.run(lib, addr),
                             2 if key in ("mem", "far") else 3) / (count * reps)
    del view
    shm.close()
    shm.unlink()
    return load, store, (load.pop("far"), store.pop("far")), fault_ns, touch_ns


def _sim_times(machine: NodeView, spans: Mapping[str, tuple[int, int]],
               sampling: SetSampling | None = None
               ) -> tuple[dict[str, float], dict[str, float], tuple[float, float],
                          dict[str, float]]:
    """Simulator: ns per access served at each level, loads and stores, one processor alone
    (a warmed sweep; memory: lines new to caches full of others, across every set of the
    last level, as in a memory pattern's measured superstep, NEAR_LINES and FAR_LINES lines
    apart), and the share of an access
    that each further processor of a coherent system adds (systems of 1 and 4 on the same
    lines: the simulator's concurrent patterns on 16 processors of the 16-CPU node's caches
    took 17 times one processor's time per access at L1, 5 times from memory). Each figure
    is the least of a few tries: another process taking the CPU only adds time."""
    g, banks = machine.geometry, machine.bank_map
    far = translation_period(g, banks, machine.page_bytes, sampling) * (1 << 16)  # new tags
    llc = g.levels[-1]
    load: dict[str, float] = {}
    store: dict[str, float] = {}
    line_words = max(1, g.levels[0].line_bytes // 8)
    far_stride = FAR_LINES * line_words
    for key, (span, stride) in [*spans.items(), ("far", (0, far_stride))]:
        mem = key in ("mem", "far")
        count = max(1, span // (stride * 8))
        if mem:  # across every set of the last level, as a memory pattern sweeps
            count = max(1 << 12, llc.sets * llc.line_bytes // (stride * 8))
        n = min(count, 1 << (15 if mem else 17))
        reps = max(1, (1 << 14) // n)
        for kind, out in (("load_stride", load), ("store_stride", store)):
            sim = CacheSim(g, banks, sampling=sampling)
            sim.feed(StridedStream.from_kernel(kind, n, stride, 1, 0))  # warm
            best = math.inf
            for k in range(1, 3):
                s = StridedStream.from_kernel(kind, n, stride, reps, k * far if mem else 0)
                t0 = time.perf_counter_ns()
                sim.feed(s)
                best = min(best, time.perf_counter_ns() - t0)
            out[key] = best / (n * reps)
    # Coherent systems of 1 and 4 processors sweeping the same lines, L1-resident and new
    # to the caches: per(n) = per(1) * (1 + share * (n - 1)) gives the share each further
    # processor adds at L1 and at memory; the levels between are interpolated.
    share: dict[str, float] = {}
    for key in ("L1", "mem"):
        mem = key == "mem"
        span, stride = spans[key]
        n = min(max(1, span // (stride * 8)), 1 << 11)
        reps = 1 if mem else max(1, (1 << 15) // n)
        systems = {procs: CoherentSim(g, procs, banks, sampling=sampling) for procs in (1, 4)}
        per = dict.fromkeys(systems, math.inf)
        for k in range(1, 4):
            s = StridedStream.from_kernel("load_stride", n, stride, reps, k * far if mem else 0)
            for procs, csim in systems.items():
                t0 = time.perf_counter_ns()
                csim.feed([s] * procs)
                if k > 1 or mem:  # the L1 lines' first sweep warms them
                    per[procs] = min(per[procs],
                                     (time.perf_counter_ns() - t0) / (len(s) * procs))
        share[key] = min(2.0, max(0.0, per[4] / per[1] - 1) / 3)
    keys = level_keys(machine)
    snoop = {key: share["L1"] + (share["mem"] - share["L1"]) * i / (len(keys) - 1)
             for i, key in enumerate(keys)}
    far_times = (load.pop("far"), store.pop("far"))
    return load, store, far_times, snoop


def _pool_times(machine: NodeView) -> tuple[float, float, float]:
    """(ns per superstep and participant, ns per pattern, ns per worker started) of the
    runner itself: a pool of up to two of this host's CPUs timing a one-access kernel."""
    from microbench.patterns import host_machine

    here = host_machine(machine.geometry, machine.bank_map, machine.bank_provenance)
    n = min(2, here.max_procs)
    few, many = 3, 13
    cfg = RunConfig(warmup=0, min_reps=few, max_reps=many, retries=0)
    t0 = time.perf_counter_ns()
    pool = WorkerPool(here, [], cfg, region=(here.page_bytes, n))
    pool.start()
    started = (time.perf_counter_ns() - t0) / n
    try:
        work = [WorkerPlan(k, True, (), (), KernelCall("load", 0, 1, 1)) for k in range(n)]
        walls = {}
        for reps in (few, many):
            c = RunConfig(warmup=0, min_reps=reps, max_reps=reps, retries=0,
                          tolerance=0.999999)
            pool.run_plans("probe", n, work, c)  # warm
            walls[reps] = min(pool.run_plans("probe", n, work, c).wall_ns for _ in range(4))
    finally:
        pool.close()
    # wall(reps) = pattern + reps * n * step; noise can tilt the line: the pattern's own
    # cost is kept to at least a tenth of the shortest run.
    step = max(0.0, (walls[many] - walls[few]) / (many - few)) / n
    pattern = max(walls[few] / 10, walls[few] - few * step * n)
    return min(step, (walls[few] - pattern) / (few * n)), pattern, started


def _python_start_s() -> float:
    """Starting a Python that imports numpy and counterd, as the compute program does: the
    CPU time it takes (user and system; the best of three, callgrind's estimate multiplies it
    by CALLGRIND_START). Not its wall time, which beside other work includes waiting for a
    CPU: at load 3 on the 2-CPU test host a probed start of about 0.2 s priced the quick set's
    counted run at 1 min 31 s, which took 46 s at that load (the start is 0.09-0.11 s on the
    quiet host)."""
    best = math.inf
    for _ in range(3):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import numpy, counterd"], check=False,
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        best = min(best, cpu if cpu > 0 else wall)  # no rusage: the wall time
    return best


def _callgrind_bare_s() -> float:
    """CPU seconds (user and system) of a bare Python start (``-S -I -c pass``: no site, no
    imports) under Callgrind with the counted run's options and this host's geometry: how
    fast valgrind runs Python here, now. :func:`microbench.estimate.compute_cost` prices the
    counted run of the compute patterns as a fixed multiple of it (the instructions it
    executes do not depend on the host's speed or load). A native start is no proxy: beside
    other work (even niced) its CPU time grew from 0.10 to 0.23-0.33 s on the 2-CPU test host,
    whose counted runs did not slow down alike. 0.0 where valgrind or the geometry is lacking
    (the estimate then falls back to the native start)."""
    from counterd.backends.callgrind.geometry import CallgrindGeometry
    from counterd.backends.callgrind.valgrind import valgrind_argv, valgrind_path
    from counterd.data.errors import BadInput

    exe = valgrind_path()
    if exe is None:
        return 0.0
    try:
        geometry = CallgrindGeometry.from_machine()
    except BadInput:
        return 0.0
    with tempfile.TemporaryDirectory(prefix="microbench-probe-") as out:
        argv = valgrind_argv([sys.executable, "-S", "-I", "-c", "pass"], geometry, out, exe)
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run(argv, check=False, stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        return 0.0
    return (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


class _OtherWork:
    """The CPUs' worth of other processes' work that competes with a run at this process's
    priority, over a window (:meth:`cpus` at its end): the whole system's busy time
    (psutil.cpu_times: user, system, interrupts, steal) less this process's and its waited
    children's. Niced work is left out when this process is not niced itself: a nice 19
    process gets about 1.5 % of a CPU beside one at nice 0 (CFS weights 15 and 1024), and on
    the 2-CPU test host a quick run beside niced helpers (load average 2.2) ran its
    simulations at their quiet speed while the load average priced them twice as long."""

    def __init__(self) -> None:
        self._t0 = time.perf_counter()
        self._sys0 = psutil.cpu_times()
        self._own0 = self._own()

    @staticmethod
    def _own() -> float:
        return sum(r.ru_utime + r.ru_stime for r in (
            resource.getrusage(resource.RUSAGE_SELF),
            resource.getrusage(resource.RUSAGE_CHILDREN)))

    @staticmethod
    def _busy(t: Any, niced: bool) -> float:
        fields = ("user", "system", "irq", "softirq", "steal", *(("nice",) if niced else ()))
        return sum(float(getattr(t, f, 0.0)) for f in fields)

    def cpus(self) -> float:
        wall = time.perf_counter() - self._t0
        if wall <= 0:
            return 0.0
        niced = os.nice(0) > 0  # a niced run competes with niced work too
        busy = self._busy(psutil.cpu_times(), niced) - self._busy(self._sys0, niced)
        return max(0.0, busy - (self._own() - self._own0)) / wall


def _compute_times() -> tuple[float, float, float]:
    """(one quick repetition, one full repetition, preparing the quick inputs) of the compute
    kernels, in this process; the full set scaled by its sizes. A repetition is the faster of
    two (one cold repetition alone read 0.017-0.051 s for the quick set on the test host)."""
    from microbench import compute

    rng = np.random.default_rng(0)
    quick = full = prepare = 0.0
    for spec in compute.SPECS:
        sizes = compute.sizes(spec, True)
        t0 = time.perf_counter()
        states = [spec.prepare(n, rng) for n in sizes]
        t1 = time.perf_counter()
        best = math.inf
        for _ in range(2):
            t2 = time.perf_counter()
            for st in states:
                spec.run(st)
            best = min(best, time.perf_counter() - t2)
        prepare += t1 - t0
        quick += best
        full += best * sum(compute.sizes(spec, False)) / sum(sizes)
    return quick, full, prepare


def process_age_s() -> float:
    """Seconds since this process started: for a command that probes first thing, what its
    start cost (interpreter, imports, arguments), as a run's start will cost."""
    try:
        import psutil

        return max(0.0, time.time() - psutil.Process().create_time())
    except (ImportError, OSError):  # pragma: no cover - psutil is a dependency
        return 0.0


def probe(machine: NodeView, *, compute: bool = True, planned: bool = False,
          startup_s: float = 0.0, callgrind: bool = False,
          sampling: SetSampling | None = None) -> Speeds:
    """Measure this host's :class:`Speeds` for ``machine``'s geometry (a second or two).
    ``compute``: also time the compute kernels; ``planned``: the machine is another node (a
    machine file), so this host's load says nothing about its repetitions; ``startup_s``: a
    run's own start (interpreter and imports; :func:`process_age_s` in a command);
    ``callgrind``: the compute patterns will be counted by Callgrind, so time valgrind here
    (:func:`_callgrind_bare_s`, two to three seconds more);
    ``sampling``: the run's set sampling, which the simulator is probed with."""
    t0 = time.perf_counter()
    other_work = _OtherWork()
    startup = startup_s
    spans = _spans(machine)
    k_load, k_store, k_far, fault, touch = _kernel_times(machine, spans)
    s_load, s_store, s_far, snoop = _sim_times(machine, spans, sampling)
    step, pattern, worker = _pool_times(machine)
    cq, cf, cp = _compute_times() if compute else (0.0, 0.0, 0.0)
    python_start = _python_start_s() if compute else 0.0
    bare = _callgrind_bare_s() if compute and callgrind else 0.0
    cpus = os.cpu_count() or 1
    others = 0.0 if planned else other_work.cpus()
    # Other work interrupting a measurement at random (Poisson, load / cpus per CPU over
    # one): disturbed at least once with probability 1 - exp(-load / cpus), with the load
    # average, niced work included (the runner's check sees any other process on a CPU).
    # Attempts per pattern on the 2-CPU test host: 1.24 at load 0.37, 1.91 at 1.72, 1.87-2.0
    # at 2.1-2.3, i.e. d = 0.20, 0.58, 0.55-0.62 (1 + d + d^2); this gives 0.17, 0.58,
    # 0.65-0.69, the former min(1, load / cpus) 0.18, 0.86, 1.
    load = 0.0 if planned else os.getloadavg()[0]
    disturbed = 1.0 - math.exp(-load / cpus)
    notes = []
    llc = machine.geometry.levels[-1].size_bytes
    if 2 * llc > PROBE_MEM_BYTES:
        notes.append(f"memory kernels timed over {PROBE_MEM_BYTES >> 20} MiB, less than twice "
                     f"the last level ({llc >> 20} MiB): where it holds them, memory patterns "
                     "take longer than estimated")
    return Speeds(k_load, k_store, s_load, s_store, s_far, snoop, fault, touch, step, pattern,
                  worker, startup, python_start, cq, cf, cp, disturbed, others,
                  time.perf_counter() - t0,
                  tuple(notes), k_far, bare)


__all__ = ["probe", "process_age_s"]
