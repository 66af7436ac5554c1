"""How long a ``microbench run`` will take, before it starts.

A run (:func:`microbench.suite.run_suite`) times its patterns one after the other on pinned
workers, in chunks of as many patterns as the node has CPUs; after each chunk it simulates
the chunk's counters in parallel, one pattern per CPU, so a chunk lasts its patterns' timings
plus its slowest simulation. Then come the compute patterns. :func:`estimate` prices each of
these steps from the patterns' own numbers (accesses per processor, sweeps, processors,
repetitions, pages, what the simulator is fed: :func:`microbench.counters.simulations`) and
from per-access figures of this host that :func:`microbench.probe.probe` measures in a second or
two:

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
* the run's processes share the CPUs with the other processes' work that competes with them
  (measured over the probe: busy CPUs less the probe's own, niced work left out; none on a
  planned node): n of them beside L CPUs' worth of it on C CPUs go max(1, (L + n) / C)
  times slower, and the simulations of a chunk, one per CPU, slow each other down no
  further;
* callgrind counts the compute patterns in :data:`CALLGRIND_BARE` times what a bare Python
  start takes under it here, now (where valgrind could not be timed: the compute program's
  start :data:`CALLGRIND_START` times slower than a Python's start here, its kernels
  :data:`CALLGRIND_WORK` times slower than natively).

The estimate is for this host's speed: for a machine file describing another node
(``microbench list --machine FILE``), the file's CPUs, caches and banks with this host's
per-access times, its own simulator times on the file's caches included.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypeVar

from counterd.data.errors import BadInput
from counterd.machine.views import NodeView
from counterd.sim.sampling import SetSampling
from microbench.counters import simulations, uses_coherence
from microbench.kernels import KernelCall
from microbench.patterns import Pattern, region_bytes
from microbench.plans import WorkerPlan
from microbench.repetition import RunConfig

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
# The counted run of the compute patterns, quick set (True) and full set (False), in bare
# Python starts under Callgrind (microbench.probe._callgrind_bare_s), which time valgrind on
# this host as it runs now. On the 2-CPU test host (2026-11-27, niced work beside, load
# average 2.3-4.0; `microbench run [--quick] --suite table1 --procs 1 --strides 1
# --compute-backend callgrind`, two bare starts before each run): quick 69.5 s and 58.2 s
# after bare starts of 3.00-3.21 s and 2.89-3.50 s (ratios 22.4, 18.2); full 170.7 s and
# 181.4 s after 2.62-2.83 s and 2.58-2.80 s (62.7, 67.4). One bare start varies by about
# 15 % from the next. The former proxy, a native start's CPU time, tripled beside the same
# niced work (0.10 -> 0.23-0.33 s) and priced the quick set at 101-136 s.
CALLGRIND_BARE = {True: 20.0, False: 65.0}
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


def level_keys(machine: NodeView) -> tuple[str, ...]:
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
    others: float = 0.0  # CPUs' worth of other work competing with a run (planned: 0)
    probe_s: float = 0.0  # how long the probe took
    notes: tuple[str, ...] = ()
    # Native kernels' memory loads, stores FAR_LINES lines apart (None: as NEAR_LINES apart).
    kernel_far_ns: tuple[float, float] | None = None
    # CPU seconds of a bare Python start under Callgrind (0: not probed; see compute_cost).
    callgrind_bare_s: float = 0.0

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
                   self.compute_full_s, self.compute_prepare_s, self.callgrind_bare_s)
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
                "callgrind_bare_s": self.callgrind_bare_s,
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


def _key(machine: NodeView, level: str) -> str:
    keys = level_keys(machine)
    return level if level in keys else keys[-1]


def _setup_sweeps(p: Pattern) -> tuple[tuple[str, ...], ...]:
    """Per set-up step, the sweeps its slowest participant makes (microbench.plans)."""
    if p.coherence is None:
        return ()
    first = ("store",) if p.coherence == "dirty" else ("store", "store", "load")  # flush ~ store
    return (first, ("load",)) if p.coherence == "shared" else (first,)


def superstep_s(p: Pattern, machine: NodeView, speeds: Speeds) -> float:
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


def _crowding(speeds: Speeds, busy: int, machine: NodeView) -> float:
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


def timing_cost(p: Pattern, machine: NodeView, speeds: Speeds, cfg: RunConfig
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


def simulation_cost(p: Pattern, machine: NodeView, speeds: Speeds, cfg: RunConfig,
                    sampling: SetSampling | None = None) -> float:
    """Seconds one simulator process spends on ``p``: the pre-fault, ``warmup`` + 1 set-ups
    and main kernels of every plan it is fed, served at the pattern's level (the pre-fault
    from memory); a coherent system adds to every access what its processors snoop."""
    lv = _key(machine, p.level)
    line = machine.geometry.levels[-1].line_bytes
    fed = simulations(p, machine.geometry, machine.bank_map, page_bytes=machine.page_bytes,
                      sampling=sampling)
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


def compute_cost(backend: str, quick: bool, speeds: Speeds, cpus: int = 1) -> float:
    """The compute patterns: a timed run of :data:`COMPUTE_REPS` repetitions, and for
    callgrind a counted run of two repetitions under it (microbench.compute.measure): where
    valgrind was timed here (``callgrind_bare_s``), :data:`CALLGRIND_BARE` times that (quick
    set or full), slowed down by the other work that competes for the ``cpus`` CPUs; else
    the native start and kernels times :data:`CALLGRIND_START` and :data:`CALLGRIND_WORK`."""
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
    if speeds.callgrind_bare_s > 0:
        crowding = max(1.0, (speeds.others + 1) / max(1, cpus))
        return timed + CALLGRIND_BARE[quick] * speeds.callgrind_bare_s * crowding
    return timed + CALLGRIND_START * speeds.python_start_s + CALLGRIND_WORK * (prepare + 2 * rep)


ASSUMPTIONS = (
    "processors run their kernels in parallel as fast as one does on this host; memory "
    "patterns queue for the declared banks beyond one processor per bank",
    "each pattern takes min_reps repetitions, and is measured again (retries) as often as "
    "this host's load average per CPU says (not at all on a planned node)",
    "the run's processes share the CPUs with the other work that competes with them, as "
    "measured while probing (niced work left out; none on a "
    "planned node); a chunk's simulations run one per CPU",
    f"callgrind counts the quick compute patterns in {CALLGRIND_BARE[True]:g} times, the full "
    f"ones in {CALLGRIND_BARE[False]:g} times what a bare Python start takes under it here",
)


def estimate(patterns: Sequence[Pattern], machine: NodeView, speeds: Speeds, *,
             cfg: RunConfig, compute_backend: str = "none", quick: bool = False,
             sampling: SetSampling | None = None) -> Estimate:
    """The estimated duration of ``microbench run`` over ``patterns`` on ``machine`` with
    ``cfg`` (module doc). ``compute_backend``: what counts the compute patterns after the
    memory ones (none, perf, papi or callgrind, as resolved); ``sampling``: the run's set
    sampling (``speeds`` probed with it: :func:`microbench.probe.probe`)."""
    costs = []
    for p in patterns:
        t, attempts, steps = timing_cost(p, machine, speeds, cfg)
        costs.append(PatternCost(p.mnemonic, t,
                                 simulation_cost(p, machine, speeds, cfg, sampling),
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
                    sum(c.sim_s for c in costs),
                    compute_cost(compute_backend, quick, speeds, machine.max_procs),
                    compute_backend, ASSUMPTIONS)


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
           "CALLGRIND_BARE", "Estimate",
           "PatternCost", "Speeds", "chunks", "compute_cost", "describe", "estimate",
           "run_order",
           "expected_attempts", "fmt_duration", "level_keys",
           "simulation_cost",
           "superstep_s",
           "timing_cost", "totals_by"]
