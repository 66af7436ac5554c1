"""How long a ``microbench run`` will take, before it starts.

A run (:func:`microbench.suite.run_suite`) times its patterns one after the other on pinned
workers, in chunks of as many patterns as the node has CPUs; after each chunk it simulates
the chunk's counters in parallel, one pattern per CPU, so a chunk lasts its patterns' timings
plus its slowest simulation. Then come the compute patterns. :func:`estimate` prices each of
these steps from the patterns' own numbers (accesses per processor, sweeps, processors,
repetitions, pages, what the simulator is fed: :func:`microbench.counters.simulations`) and
from per-access figures of this host that :func:`probe` measures in a second or two:

* the native kernels' time per access at each level, loads and stores (one processor),
  each level swept over as much as its patterns span (at most PROBE_MEM_BYTES), memory
  NEAR_LINES and FAR_LINES lines apart;
* the simulator's time per access served at each level, loads and stores, on the machine's
  own geometry, and the share of it each further processor of a coherent system adds (every
  access snoops the others' private caches);
* the runner's fixed costs: a pattern's dispatch and load readings, a superstep's barrier per
  participant, starting a worker, a page's first touch;
* one in-process repetition of the compute kernels, and a Python's start.

Assumptions, said again in every :class:`Estimate`:

* processors run their kernels in parallel as fast as one processor does here, except that
  memory patterns queue for the machine's banks beyond one processor per bank (its declared
  bank map, seed 004's bank contention);
* repetitions: ``min_reps``, and measurements taken again (``retries``) in the share of
  patterns this host's load makes disturbed (1 - exp(-load average / CPUs); none on a
  planned node);
* the run's processes share the CPUs with the other processes' work (the load average; none
  on a planned node): n of them beside a load of L on C CPUs go max(1, (L + n) / C) times
  slower, and the simulations of a chunk, one per CPU, slow each other down no further;
* callgrind runs the compute program's start (a Python with numpy and counterd, and what
  the counted run adds besides the kernels) :data:`CALLGRIND_START` times slower than a
  Python's start here, and its kernels :data:`CALLGRIND_WORK` times slower than natively.

The estimate is for this host's speed: for a machine file describing another node
(``microbench list --machine FILE``), the file's CPUs, caches and banks with this host's
per-access times, its own simulator times on the file's caches included.
"""

from __future__ import annotations

import ctypes
import math
import os
import resource
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from multiprocessing.shared_memory import SharedMemory
from typing import Any, Literal, TypeVar

import numpy as np

from counterd.errors import BadInput
from counterd.sim import CacheSim, CoherentSim, StridedStream
from microbench.counters import simulations, translation_period, uses_coherence
from microbench.kernels import KernelCall, native_lib
from microbench.patterns import Machine, Pattern, region_bytes
from microbench.runner import RunConfig, WorkerPlan, WorkerPool

ComputeBackend = Literal["none", "perf", "papi", "callgrind"]
COMPUTE_BACKENDS: tuple[str, ...] = ("none", "perf", "papi", "callgrind")

# Callgrind's counted run of the compute program, in two parts that it slows down unequally
# (measured on the 2-CPU test host, Intel family 6 model 207, valgrind 3.19, with the
# backend's options: cache, write-back and branch simulation, a dump per superstep):
# * the program's start, priced per second of a Python's start here (0.09-0.14 s with numpy
#   and counterd): importing numpy and counterd under it took 19.9 s, the program's own
#   imports 27.4 s, and its whole counted run with only the empty kernel 41.7 s (imports,
#   the dumps, the record reading them): about 400 times the start;
# * the kernels (preparing the inputs, two repetitions): the full set's counted run took
#   141 s and the quick one's 55 s, their kernels natively 0.28 s and 0.04 s: (141 - 55) /
#   0.24 = 358 times. One factor of 300 for both priced the full set at 123 s against 141 s
#   real; the quick set at 77 s against 55-62 s, its kernels probed cold (one repetition).
CALLGRIND_START = 400.0
CALLGRIND_WORK = 360.0
# Repetitions of the compute patterns' timed run (microbench.compute.measure's default).
COMPUTE_REPS = 11
# The probe's memory span: twice the last level where that is smaller. Memory patterns span
# twice the last level: a probe over 64 MiB on the 2-CPU test host (sysfs L3 300 MB, served
# like one up to 150 MB) timed loads at 8.5 ns and stores at 9.1 ns per access, against 19
# and 24-29 over 512 MiB, and the quick suite's memory stores took 2.4 times their estimate.
# Mapping the span costs the probe about 0.3 s on that host (2.5 us per page).
PROBE_MEM_BYTES = 512 << 20
# The simulator's memory accesses are probed this many lines apart (the suite's memory
# strides span one bank interleave to a bank cycle: 4 to 32 lines of 64 B); between them, the
# time per access is interpolated in the logarithm of the stride.
NEAR_LINES, FAR_LINES = 4, 32
_T = TypeVar("_T")


def level_keys(machine: Machine) -> tuple[str, ...]:
    """The serving levels a pattern names: L1, L2, ... and mem."""
    return (*(f"L{lv.level}" for lv in machine.geometry.levels), "mem")


@dataclass(frozen=True)
class Speeds:
    """Per-access and fixed costs of this host (nanoseconds unless the name says seconds),
    measured by :func:`probe`. Keys of the per-level maps: :func:`level_keys`."""

    kernel_load_ns: Mapping[str, float]  # native kernel, one processor, per access
    kernel_store_ns: Mapping[str, float]
    sim_load_ns: Mapping[str, float]  # simulator, one processor alone, per access
    sim_store_ns: Mapping[str, float]  # (memory: accesses NEAR_LINES lines apart)
    sim_far_ns: tuple[float, float]  # memory loads, stores FAR_LINES lines apart
    snoop: Mapping[str, float]  # share of an access each further coherent processor adds
    fault_ns: float  # first touch of a page of the shared region
    touch_ns: float  # a store to each page of a mapped region (a pattern's pre-fault)
    superstep_ns: float  # one barrier of one participant, and the runner's bookkeeping
    pattern_ns: float  # a pattern's fixed cost: dispatch, load readings, collection
    worker_start_ns: float  # starting one pinned worker (and one simulator process)
    startup_s: float  # a run's own start: interpreter, imports, host metadata
    python_start_s: float  # a compute program's start: interpreter, numpy, counterd
    compute_quick_s: float  # one repetition of the quick compute kernels, in process
    compute_full_s: float  # the same for the full set (sizes scaled from the quick ones)
    compute_prepare_s: float  # building the quick compute kernels' inputs
    disturbed: float  # share of measurements expected to be taken again (0..1)
    others: float = 0.0  # CPUs' worth of other processes' work (load average; planned: 0)
    probe_s: float = 0.0  # how long the probe took
    notes: tuple[str, ...] = ()
    # Native kernels' memory loads, stores FAR_LINES lines apart (None: as NEAR_LINES apart).
    kernel_far_ns: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        maps = (self.kernel_load_ns, self.kernel_store_ns, self.sim_load_ns, self.sim_store_ns,
                self.snoop)
        keys = set(self.kernel_load_ns)
        for m in maps:
            if set(m) != keys or any(not (v >= 0 and math.isfinite(v)) for v in m.values()):
                raise BadInput(f"per-access times {dict(m)}", "give one finite time >= 0 per "
                               "level, the same levels for kernels and simulator")
        scalars = (*self.sim_far_ns, *(self.kernel_far_ns or ()), self.others, self.fault_ns,
                   self.touch_ns, self.superstep_ns,
                   self.pattern_ns, self.worker_start_ns, self.startup_s, self.python_start_s,
                   self.compute_quick_s,
                   self.compute_full_s, self.compute_prepare_s)
        if any(not (v >= 0 and math.isfinite(v)) for v in scalars):
            raise BadInput(f"fixed costs {scalars}", "give finite times >= 0")
        if not 0 <= self.disturbed <= 1:
            raise BadInput(f"disturbed share {self.disturbed}", "give a share in [0, 1]")

    def to_json(self) -> dict[str, Any]:
        return {"kernel_load_ns": dict(self.kernel_load_ns),
                "kernel_store_ns": dict(self.kernel_store_ns),
                "sim_load_ns": dict(self.sim_load_ns), "sim_store_ns": dict(self.sim_store_ns),
                "sim_far_ns": list(self.sim_far_ns),
                "kernel_far_ns": list(self.kernel_far_ns) if self.kernel_far_ns else None,
                "others": self.others,
                "snoop": dict(self.snoop),
                "fault_ns": self.fault_ns, "touch_ns": self.touch_ns,
                "superstep_ns": self.superstep_ns,
                "pattern_ns": self.pattern_ns, "worker_start_ns": self.worker_start_ns,
                "startup_s": self.startup_s, "python_start_s": self.python_start_s,
                "compute_quick_s": self.compute_quick_s,
                "compute_full_s": self.compute_full_s,
                "compute_prepare_s": self.compute_prepare_s, "disturbed": self.disturbed,
                "probe_s": self.probe_s, "notes": list(self.notes)}

    def scaled(self, factor: float) -> Speeds:
        """Every per-access time times ``factor`` (a host that many times slower)."""
        def mul(m: Mapping[str, float]) -> dict[str, float]:
            return {k: v * factor for k, v in m.items()}
        kfar = self.kernel_far_ns
        return replace(self, kernel_load_ns=mul(self.kernel_load_ns),
                       kernel_far_ns=(kfar[0] * factor, kfar[1] * factor) if kfar else None,
                       kernel_store_ns=mul(self.kernel_store_ns),
                       sim_load_ns=mul(self.sim_load_ns), sim_store_ns=mul(self.sim_store_ns),
                       sim_far_ns=(self.sim_far_ns[0] * factor, self.sim_far_ns[1] * factor),
                       touch_ns=self.touch_ns * factor)


@dataclass(frozen=True)
class PatternCost:
    """One pattern's share: ``timing_s`` all its timed attempts, ``sim_s`` its simulation in
    one simulator process, ``attempts`` and ``supersteps`` (per attempt) as expected."""

    mnemonic: str
    timing_s: float
    sim_s: float
    attempts: float
    supersteps: float

    def to_json(self) -> dict[str, Any]:
        return {"mnemonic": self.mnemonic, "timing_s": self.timing_s, "sim_s": self.sim_s,
                "attempts": self.attempts, "supersteps": self.supersteps}


@dataclass(frozen=True)
class Estimate:
    """The estimated duration of a run, by step (seconds). ``simulation_s`` is wall time (a
    chunk's slowest simulation), ``simulation_cpu_s`` the sum over patterns."""

    patterns: tuple[PatternCost, ...]
    cpus: int
    startup_s: float
    region_s: float
    timing_s: float
    simulation_s: float
    simulation_cpu_s: float
    compute_s: float
    compute_backend: str
    assumptions: tuple[str, ...] = field(default=())

    @property
    def total_s(self) -> float:
        return (self.startup_s + self.region_s + self.timing_s + self.simulation_s
                + self.compute_s)

    def to_json(self, per_pattern: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "total_s": self.total_s, "startup_s": self.startup_s, "region_s": self.region_s,
            "timing_s": self.timing_s, "simulation_s": self.simulation_s,
            "simulation_cpu_s": self.simulation_cpu_s, "compute_s": self.compute_s,
            "compute_backend": self.compute_backend, "cpus": self.cpus,
            "patterns": len(self.patterns), "assumptions": list(self.assumptions)}
        if per_pattern:
            out["per_pattern"] = [c.to_json() for c in self.patterns]
        return out


# --------------------------------------------------------------------------------------------
# The model


def _per_element(times: tuple[float, float], op: str, store_every: int) -> float:
    """Time of one element of a sweep (an rmw element is a load and a store)."""
    load, store = times
    if op == "load":
        return load
    if op == "store":
        return store
    if op == "rmw":
        return load + store
    k = max(1, store_every)
    return ((k - 1) * load + store) / k


def _key(machine: Machine, level: str) -> str:
    keys = level_keys(machine)
    return level if level in keys else keys[-1]


def _setup_sweeps(p: Pattern) -> tuple[tuple[str, ...], ...]:
    """Per set-up step, the sweeps its slowest participant makes (runner.plans)."""
    if p.coherence is None:
        return ()
    first = ("store",) if p.coherence == "dirty" else ("store", "store", "load")  # flush ~ store
    return (first, ("load",)) if p.coherence == "shared" else (first,)


def superstep_s(p: Pattern, machine: Machine, speeds: Speeds) -> float:
    """One superstep of ``p``: its slowest processor's kernel, the set-up sweeps and barriers
    before it, a barrier per participant and step."""
    lv = _key(machine, p.level)
    times = (speeds.kernel_load_ns[lv], speeds.kernel_store_ns[lv])
    if lv == "mem" and speeds.kernel_far_ns is not None:
        # Far apart, each access is on a page of its own (a TLB miss, a page walk) and a
        # store's write-back opens another DRAM row: on the 2-CPU test host stores 32 lines
        # apart took 2.4 times as long per access as 4 lines apart (quick suite, 600 MB).
        times = _by_stride(times, speeds.kernel_far_ns, p.stride_bytes,
                           machine.geometry.levels[-1].line_bytes)
    elements = p.count * p.sweeps
    kernel = elements * _per_element(times, p.op, p.store_every)
    if lv == "mem":
        kernel *= max(1.0, p.procs / machine.bank_map.banks)  # queueing for the banks
    steps = _setup_sweeps(p)
    setup = sum(p.count * _per_element(times, op, 0) for step in steps for op in step)
    barriers = (1 + len(steps)) * p.cpus_needed * speeds.superstep_ns
    return (kernel + setup + barriers) / 1e9


def _reps(cfg: RunConfig, step_s: float, speeds: Speeds) -> float:
    """Measured supersteps: ``min_reps`` unless disturbed, up to ``max_reps`` (or the
    time budget)."""
    more = speeds.disturbed * (cfg.max_reps - cfg.min_reps)
    if step_s > 0:
        more = min(more, max(0.0, cfg.budget_ns / 1e9 / step_s - cfg.min_reps))
    return cfg.min_reps + more


def _crowding(speeds: Speeds, busy: int, machine: Machine) -> float:
    """How much slower ``busy`` processes of the run go beside the other processes' work:
    all of them share the machine's CPUs."""
    return max(1.0, (speeds.others + busy) / machine.max_procs)


def expected_attempts(retries: int, disturbed: float) -> float:
    """Attempts a pattern takes when each is disturbed with probability ``disturbed``:
    :meth:`microbench.runner.WorkerPool.run_settled` measures again only while every
    attempt so far was disturbed, so the k-th retry comes with probability disturbed**k
    (1 + d + d**2 for two retries; the former 1 + 2d priced the quick suite's attempts at
    1.37 per pattern at load 0.37 on the 2-CPU test host, where they were 1.24)."""
    return float(sum(disturbed ** k for k in range(retries + 1)))


def timing_cost(p: Pattern, machine: Machine, speeds: Speeds, cfg: RunConfig
                ) -> tuple[float, float, float]:
    """(seconds of all timed attempts, attempts, supersteps per attempt) of ``p``."""
    step = superstep_s(p, machine, speeds) * _crowding(speeds, p.cpus_needed, machine)
    n = cfg.warmup + _reps(cfg, step, speeds)
    pages = -(-p.span_bytes // machine.page_bytes) + 1
    prefault = pages * speeds.touch_ns * _crowding(speeds, p.procs, machine) / 1e9
    attempts = expected_attempts(cfg.retries, speeds.disturbed)
    per_attempt = speeds.pattern_ns / 1e9 + prefault + n * step
    return attempts * per_attempt, attempts, n


def _calls(plan: WorkerPlan) -> tuple[Sequence[KernelCall], Sequence[KernelCall],
                                       Sequence[KernelCall]]:
    setup = [c for step in plan.setup for c in step if isinstance(c, KernelCall)]
    main = [plan.main] if isinstance(plan.main, KernelCall) else []
    return [c for c in plan.prefault if isinstance(c, KernelCall)], setup, main


def _by_stride(near: tuple[float, float], far: tuple[float, float], stride_bytes: int,
               line_bytes: int) -> tuple[float, float]:
    """Memory (load, store) times per access ``stride_bytes`` apart: ``near`` at NEAR_LINES
    lines and below, ``far`` at FAR_LINES and beyond, interpolated in the logarithm of the
    stride between them."""
    lines = max(1.0, stride_bytes / line_bytes)
    f = min(1.0, max(0.0, math.log2(lines / NEAR_LINES) / math.log2(FAR_LINES / NEAR_LINES)))
    return near[0] + f * (far[0] - near[0]), near[1] + f * (far[1] - near[1])


def _sim_call_ns(call: KernelCall, level: str, speeds: Speeds, line_bytes: int) -> float:
    if call.kernel == "flush":
        return 0.0  # not simulated
    times = (speeds.sim_load_ns[level], speeds.sim_store_ns[level])
    if level == "mem":  # farther apart, fewer neighbours share a page of the simulator's state
        times = _by_stride(times, speeds.sim_far_ns, call.stride_words * 8, line_bytes)
    return call.count * call.reps * _per_element(times, call.kernel, call.store_every)


def simulation_cost(p: Pattern, machine: Machine, speeds: Speeds, cfg: RunConfig) -> float:
    """Seconds one simulator process spends on ``p``: the pre-fault, ``warmup`` + 1 set-ups
    and main kernels of every plan it is fed, served at the pattern's level (the pre-fault
    from memory); a coherent system adds to every access what its processors snoop."""
    lv = _key(machine, p.level)
    line = machine.geometry.levels[-1].line_bytes
    fed = simulations(p, machine.geometry, machine.bank_map, page_bytes=machine.page_bytes)
    total = 0.0
    for plan in fed:
        prefault, setup, main = _calls(plan)
        total += sum(_sim_call_ns(c, "mem", speeds, line) for c in prefault)
        total += (cfg.warmup + 1) * sum(_sim_call_ns(c, lv, speeds, line)
                                        for c in (*setup, *main))
    if uses_coherence(p):
        total *= 1 + speeds.snoop[lv] * (len(fed) - 1)
    return total / 1e9


def chunks(items: Sequence[_T], cpus: int) -> list[Sequence[_T]]:
    """The run's chunks: consecutive groups of ``cpus`` patterns (run_suite)."""
    size = max(1, cpus)
    return [items[i:i + size] for i in range(0, len(items), size)]


def run_order(patterns: Sequence[Pattern], est: Estimate | None) -> list[Pattern]:
    """The order a run takes ``patterns`` in: by estimated simulation time, longest first
    (catalogue order among equals, and without an estimate), so that the simulations of a
    chunk, which lasts as long as its slowest, take about as long as each other. On the
    16-CPU node's full suite this makes the chunks' simulations about three times shorter
    than in catalogue order."""
    if est is None:
        return list(patterns)
    sim = {c.mnemonic: c.sim_s for c in est.patterns}
    return sorted(patterns, key=lambda p: -sim.get(p.mnemonic, 0.0))


def compute_cost(backend: str, quick: bool, speeds: Speeds) -> float:
    """The compute patterns: a timed run of :data:`COMPUTE_REPS` repetitions, and for
    callgrind a counted run of two repetitions under it (microbench.compute.measure)."""
    if backend not in COMPUTE_BACKENDS:
        raise BadInput(f"compute backend {backend!r}", "choose " + ", ".join(COMPUTE_BACKENDS))
    if backend == "none":
        return 0.0
    rep = speeds.compute_quick_s if quick else speeds.compute_full_s
    prepare = speeds.compute_prepare_s * (rep / speeds.compute_quick_s
                                          if speeds.compute_quick_s > 0 else 1.0)
    timed = speeds.python_start_s + prepare + COMPUTE_REPS * rep
    if backend != "callgrind":
        return timed
    return timed + CALLGRIND_START * speeds.python_start_s + CALLGRIND_WORK * (prepare + 2 * rep)


ASSUMPTIONS = (
    "processors run their kernels in parallel as fast as one does on this host; memory "
    "patterns queue for the declared banks beyond one processor per bank",
    "each pattern takes min_reps repetitions, and is measured again (retries) as often as "
    "this host's load average per CPU says (not at all on a planned node)",
    "the run's processes share the CPUs with the load average's other work (none on a "
    "planned node); a chunk's simulations run one per CPU",
    f"callgrind runs the compute program's start {CALLGRIND_START:g} times slower than a "
    f"Python's start here, its kernels {CALLGRIND_WORK:g} times slower than natively",
)


def estimate(patterns: Sequence[Pattern], machine: Machine, speeds: Speeds, *,
             cfg: RunConfig, compute_backend: str = "none", quick: bool = False) -> Estimate:
    """The estimated duration of ``microbench run`` over ``patterns`` on ``machine`` with
    ``cfg`` (module doc). ``compute_backend``: what counts the compute patterns after the
    memory ones (none, perf, papi or callgrind, as resolved)."""
    costs = []
    for p in patterns:
        t, attempts, steps = timing_cost(p, machine, speeds, cfg)
        costs.append(PatternCost(p.mnemonic, t, simulation_cost(p, machine, speeds, cfg),
                                 attempts, steps))
    cpus = machine.max_procs
    ordered = sorted(costs, key=lambda c: -c.sim_s)  # run_order
    sim_wall = sum(max(c.sim_s for c in chunk) * _crowding(speeds, len(chunk), machine)
                   for chunk in chunks(ordered, cpus))
    workers = max((p.cpus_needed for p in patterns), default=0) + cpus
    startup = speeds.startup_s + workers * speeds.worker_start_ns / 1e9
    pages = region_bytes(patterns, machine.page_bytes) // machine.page_bytes if patterns else 0
    return Estimate(tuple(costs), cpus, startup, pages * speeds.fault_ns / 1e9,
                    sum(c.timing_s for c in costs), sim_wall,
                    sum(c.sim_s for c in costs), compute_cost(compute_backend, quick, speeds),
                    compute_backend, ASSUMPTIONS)


# --------------------------------------------------------------------------------------------
# The probe


def _best(f: Any, tries: int = 3) -> float:
    best = math.inf
    for _ in range(tries):
        t0 = time.perf_counter_ns()
        f()
        best = min(best, time.perf_counter_ns() - t0)
    return float(best)


def _spans(machine: Machine) -> dict[str, tuple[int, int]]:
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


def _kernel_times(machine: Machine, spans: Mapping[str, tuple[int, int]]
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


def _sim_times(machine: Machine, spans: Mapping[str, tuple[int, int]]
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
    far = translation_period(g, banks, machine.page_bytes) * (1 << 16)  # same sets, new tags
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
            sim = CacheSim(g, banks)
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
        systems = {procs: CoherentSim(g, procs, banks) for procs in (1, 4)}
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


def _pool_times(machine: Machine) -> tuple[float, float, float]:
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


def probe(machine: Machine, *, compute: bool = True, planned: bool = False,
          startup_s: float = 0.0) -> Speeds:
    """Measure this host's :class:`Speeds` for ``machine``'s geometry (a second or two).
    ``compute``: also time the compute kernels; ``planned``: the machine is another node (a
    machine file), so this host's load says nothing about its repetitions; ``startup_s``: a
    run's own start (interpreter and imports; :func:`process_age_s` in a command)."""
    t0 = time.perf_counter()
    startup = startup_s
    spans = _spans(machine)
    k_load, k_store, k_far, fault, touch = _kernel_times(machine, spans)
    s_load, s_store, s_far, snoop = _sim_times(machine, spans)
    step, pattern, worker = _pool_times(machine)
    cq, cf, cp = _compute_times() if compute else (0.0, 0.0, 0.0)
    python_start = _python_start_s() if compute else 0.0
    cpus = os.cpu_count() or 1
    others = 0.0 if planned else os.getloadavg()[0]
    # Other work interrupting a measurement at random (Poisson, others / cpus per CPU over
    # one): disturbed at least once with probability 1 - exp(-others / cpus). Attempts per
    # pattern on the 2-CPU test host: 1.24 at load 0.37, 1.91 at 1.72, 1.87-2.0 at 2.1-2.3,
    # i.e. d = 0.20, 0.58, 0.55-0.62 (1 + d + d^2); this gives 0.17, 0.58, 0.65-0.69, the
    # former min(1, others / cpus) 0.18, 0.86, 1.
    disturbed = 1.0 - math.exp(-others / cpus)
    notes = []
    llc = machine.geometry.levels[-1].size_bytes
    if 2 * llc > PROBE_MEM_BYTES:
        notes.append(f"memory kernels timed over {PROBE_MEM_BYTES >> 20} MiB, less than twice "
                     f"the last level ({llc >> 20} MiB): where it holds them, memory patterns "
                     "take longer than estimated")
    return Speeds(k_load, k_store, s_load, s_store, s_far, snoop, fault, touch, step, pattern,
                  worker, startup, python_start, cq, cf, cp, disturbed, others,
                  time.perf_counter() - t0,
                  tuple(notes), k_far)


def fmt_duration(seconds: float) -> str:
    """``45 s``, ``3 min 20 s``, ``2 h 05 min``."""
    s = round(seconds)
    if s < 60:
        return f"{max(0, s)} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def describe(est: Estimate, speeds: Speeds) -> str:
    """One line: the total and its parts."""
    parts = [f"timing {fmt_duration(est.timing_s)}",
             f"simulation {fmt_duration(est.simulation_s)} on {est.cpus} CPU"
             f"{'s' if est.cpus > 1 else ''}"]
    if est.compute_s:
        parts.append(f"compute patterns ({est.compute_backend}) "
                     f"{fmt_duration(est.compute_s)}")
    parts.append(f"start-up {fmt_duration(est.startup_s + est.region_s)}")
    return (f"estimated run time: {fmt_duration(est.total_s)} (" + ", ".join(parts)
            + f"; per-access times probed here in {speeds.probe_s:.2f} s)")


def totals_by(est: Estimate, key: Iterable[str]) -> dict[str, float]:
    """Estimated seconds (timing plus simulation CPU) per group of mnemonics (e.g. by
    processors): what weighs in a suite."""
    out: dict[str, float] = {}
    for name, c in zip(key, est.patterns, strict=True):
        out[name] = out.get(name, 0.0) + c.timing_s + c.sim_s
    return out


__all__ = ["ASSUMPTIONS", "CALLGRIND_START", "CALLGRIND_WORK", "COMPUTE_BACKENDS", "COMPUTE_REPS",
           "Estimate",
           "PatternCost", "Speeds", "chunks", "compute_cost", "describe", "estimate",
           "run_order",
           "expected_attempts", "fmt_duration", "level_keys", "probe", "process_age_s",
           "simulation_cost",
           "superstep_s",
           "timing_cost", "totals_by"]
