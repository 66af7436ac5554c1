"""SPMD runner: pinned worker processes, one shared region, barriers between supersteps.

Seed 004 section 2: every experiment is an SPMD bulk-synchronous program; the running time of
a superstep is read from a cycle counter as each processor starts and ends it. Here (DESIGN.md
sections 3 and 7):

* one worker process per CPU, pinned with ``os.sched_setaffinity``, forked once per run and
  kept, so page tables and caches are not rebuilt for every pattern; worker (rank) k runs on
  ``machine.cpus[k]``, whose order spreads the ranks round-robin over the NUMA nodes
  (:func:`microbench.patterns.host_machine`), so a p-processor pattern runs where a pinned
  p-thread program would;
* one ``multiprocessing.shared_memory`` region, page-aligned (mmap), sized for the largest
  pattern; a pattern's bases are offsets into it. Each worker pre-faults the pages it uses;
* a ``multiprocessing.Barrier`` per number of participants (barriers can only be inherited);
  every superstep is ``[set-up steps, barrier each] -> t0 -> kernel -> t1 -> barrier``. Each
  worker stops its own clock (``time.monotonic_ns``) right after its kernel, before the
  closing barrier; superstep time = max over processors of t1 - min over processors of t0;
* warm-up supersteps are run and dropped, then supersteps are repeated until the spread
  (p90 - p10) / median is within the tolerance, or a repetition or time limit is reached; the
  decision is a pure function of the shared begin/end table, so every worker takes it alike
  without an extra barrier (:mod:`microbench.repetition`; the participants' plans:
  :mod:`microbench.plans`);
* host metadata (CPU, SMT, governor, THP, isolated CPUs, load) with every run; machine load
  and CPU steal during a pattern, involuntary context switches of the workers and an unstable
  spread become per-pattern flags instead of silently noisy numbers.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import platform
import resource
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory
from pathlib import Path
from typing import Any

import numpy as np

from counterd.data.errors import BadInput, CounterdError
from counterd.data.host import host_info
from counterd.machine.views import NodeView
from microbench.kernels import buffer_address, native_lib
from microbench.patterns import Pattern, region_bytes
from microbench.plans import WorkerPlan, plans
from microbench.repetition import (
    NORMAL,
    RunConfig,
    disturbance,
    should_stop,
    spread,
    superstep_times,
)

try:  # psutil is a project dependency; the runner still works without it
    import psutil
except ImportError:  # pragma: no cover
    psutil = None


class RunnerError(CounterdError):
    """A worker failed or a barrier broke; the message carries the worker's traceback."""

    exit_code = 1


# --------------------------------------------------------------------------------------------
# Host metadata


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _bracketed(text: str | None) -> str:
    if not text:
        return "unknown"
    for word in text.split():
        if word.startswith("[") and word.endswith("]"):
            return word[1:-1]
    return text


def host_metadata(cpus: Sequence[int], sysfs: str | Path = "/sys",
                  procfs: str | Path = "/proc") -> dict[str, Any]:
    """host_info plus what decides whether timings are trustworthy (pyperf's lesson)."""
    sys_ = Path(sysfs)
    info = host_info(procfs, sysfs).to_json()
    governors = {}
    for cpu in cpus:
        gov = _read(sys_ / f"devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor")
        governors[str(cpu)] = gov or "unknown"
    distinct = set(governors.values())
    info.update({
        "governor": distinct.pop() if len(distinct) == 1 else governors,
        "smt": info.get("threads_per_core"),
        "smt_active": _read(sys_ / "devices/system/cpu/smt/active") or "unknown",
        "hugepages": _bracketed(_read(sys_ / "kernel/mm/transparent_hugepage/enabled")),
        "isolated": _read(sys_ / "devices/system/cpu/isolated") or "",
        "loadavg": list(os.getloadavg()),
        "cpus_used": list(cpus),
        "python": platform.python_version(),
        "psutil": psutil.__version__ if psutil is not None else None,
    })
    return info


# --------------------------------------------------------------------------------------------
# Workers


@dataclass
class _Job:
    plan: WorkerPlan
    parties: int
    procs: int
    cfg: RunConfig
    table_reps: int  # rows of the shared begin/end table (the pool's capacity)
    counter_backend: str | None  # "perf"/"papi": measured counters per superstep
    counter_events: tuple[str, ...] = ()


@dataclass
class WorkerResult:
    slot: int
    reps: int
    checksum: int
    nivcsw: int
    counters: dict[str, float] = field(default_factory=dict)
    unsupported: dict[str, str] = field(default_factory=dict)
    affinity: tuple[int, ...] = ()


def _open_counters(name: str, events: tuple[str, ...]) -> tuple[Any, dict[str, str]]:
    from counterd import backends

    backend = backends.get(name)
    try:
        group = backend.open(events, strict=False)  # type: ignore[call-arg]
    except TypeError:
        group = backend.open(events)
    first = group.read()
    return group, dict(first.unsupported)


def _worker_main(index: int, cpu: int, conn: Connection, shm: SharedMemory,
                 barriers: Mapping[int, Any], times: Any) -> None:
    os.sched_setaffinity(0, {cpu})
    lib = native_lib()
    address = buffer_address(shm.buf)  # type: ignore[arg-type]
    table = np.frombuffer(times, dtype=np.int64)
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        try:
            conn.send(("ok", _run_job(job, lib, address, barriers, table)))
        except BaseException:  # noqa: BLE001 - reported to the parent, which raises
            barriers[job.parties].abort()
            conn.send(("error", traceback.format_exc()))


def _run_job(job: _Job, lib: Any, address: int, barriers: Mapping[int, Any],
             table: np.ndarray) -> WorkerResult:
    plan, cfg, p = job.plan, job.cfg, job.procs
    barrier = barriers[job.parties]
    timeout = cfg.barrier_timeout_s
    view = table.reshape(job.table_reps, -1, 2)  # [rep, slot, begin/end]
    checksum = 0
    for fault in plan.prefault:
        fault.run(lib, address, value=1)
    group = None
    unsupported: dict[str, str] = {}
    per_rep: list[dict[str, float]] = []
    if job.counter_backend and plan.timed:
        group, unsupported = _open_counters(job.counter_backend, job.counter_events)
    barrier.wait(timeout)
    nivcsw0 = resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw
    k = 0
    while True:
        for step in plan.setup:
            for call in step:
                checksum += call.run(lib, address, value=k)
            barrier.wait(timeout)
        if plan.main is not None:
            before = group.read() if group is not None else None
            t0 = time.monotonic_ns()
            checksum += plan.main.run(lib, address, value=k)
            t1 = time.monotonic_ns()
            if group is not None and before is not None:
                delta = group.read().delta(before)
                if k >= cfg.warmup:
                    per_rep.append({n: v.value for n, v in delta.items()})
            view[k, plan.slot, 0] = t0
            view[k, plan.slot, 1] = t1
        barrier.wait(timeout)
        k += 1
        done = view[:k, :p, :]
        if k >= cfg.capacity or should_stop(superstep_times(done[:, :, 0], done[:, :, 1]),
                                            cfg.warmup, cfg):
            break
    nivcsw = resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw - nivcsw0
    counters: dict[str, float] = {}
    if group is not None:
        group.close()
        for name in per_rep[0] if per_rep else {}:
            counters[name] = float(np.median([r[name] for r in per_rep]))
    return WorkerResult(plan.slot, k, checksum & ((1 << 63) - 1), nivcsw, counters,
                        unsupported, tuple(sorted(os.sched_getaffinity(0))))


@dataclass(frozen=True)
class PatternTiming:
    """What a timed run of one pattern produced (everything in ns, CLOCK_MONOTONIC)."""

    begin_ns: np.ndarray  # [rep, rank], warm-ups included
    end_ns: np.ndarray
    warmup: int
    cpus: tuple[int, ...]
    affinity: tuple[tuple[int, ...], ...]  # what each timed worker was pinned to
    nivcsw: tuple[int, ...]
    checksums: tuple[int, ...]
    measured_counters: tuple[dict[str, float], ...]
    unsupported: dict[str, str]
    loadavg: tuple[float, float, float]
    others_cpu: float | None  # CPUs' worth of use by other processes during the pattern
    steal: float | None  # fraction of CPU time stolen by the hypervisor during the pattern
    wall_ns: int
    flags: tuple[str, ...]

    @property
    def samples_ns(self) -> np.ndarray:
        return superstep_times(self.begin_ns, self.end_ns)[self.warmup:]

    @property
    def warmup_samples_ns(self) -> np.ndarray:
        return superstep_times(self.begin_ns, self.end_ns)[:self.warmup]

    @property
    def per_proc_ns(self) -> np.ndarray:
        return (self.end_ns - self.begin_ns)[self.warmup:]


class WorkerPool:
    """Pinned workers over one shared region. Use as a context manager::

        with WorkerPool(machine, patterns) as pool:
            timing = pool.run(pattern, NORMAL)
    """

    def __init__(self, machine: NodeView, patterns: Sequence[Pattern],
                 cfg: RunConfig = NORMAL, *, counter_backend: str | None = None,
                 counter_events: tuple[str, ...] = (),
                 region: tuple[int, int] | None = None) -> None:
        """``region``: (bytes, workers) for a pool that runs plans (:meth:`run_plans`) rather
        than patterns; ``patterns`` may then be empty."""
        if region is not None:
            patterns = list(patterns)
        elif not patterns:
            raise BadInput("no patterns to run", "choose a suite or processor counts with "
                           "patterns in them (microbench list)")
        need = max([p.cpus_needed for p in patterns] + ([region[1]] if region else []))
        if need > machine.max_procs:
            raise BadInput(f"a pattern needs {need} CPUs, {machine.max_procs} are available",
                           "choose fewer processors with --procs")
        bad = [p.mnemonic for p in patterns if p.word_bytes != 8]
        if bad:
            raise BadInput(f"{bad[0]} uses {patterns[0].word_bytes} B words; the native "
                           "kernels use 8 B", "run host patterns (host_machine())")
        native_lib()  # fail early, in the parent, with the fix
        self.machine = machine
        self.cfg = cfg
        self.counter_backend = counter_backend
        self.counter_events = counter_events
        self.size = max(region_bytes(patterns, machine.page_bytes) if patterns else 0,
                        region[0] if region else 0)
        self.n = need
        self._ctx = mp.get_context("fork")
        self._shm: SharedMemory | None = None
        self._procs: list[Any] = []
        self._conns: list[Connection] = []

    def __enter__(self) -> WorkerPool:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        try:
            self._shm = SharedMemory(create=True, size=self.size)
        except OSError as exc:
            raise BadInput(f"cannot allocate {self.size >> 20} MiB of shared memory: {exc}",
                           "free memory or /dev/shm space, or run fewer processors") from exc
        self._barriers = {k: self._ctx.Barrier(k) for k in range(1, self.n + 1)}
        self._times = self._ctx.RawArray("q", self.cfg.capacity * self.n * 2)
        for i in range(self.n):
            parent, child = self._ctx.Pipe()
            proc = self._ctx.Process(target=_worker_main, name=f"microbench-{i}",
                                     args=(i, self.machine.cpus[i], child, self._shm,
                                           self._barriers, self._times), daemon=True)
            proc.start()
            child.close()
            self._procs.append(proc)
            self._conns.append(parent)

    def close(self) -> None:
        for conn in self._conns:
            try:
                conn.send(None)
            except OSError:
                pass
        for proc in self._procs:
            proc.join(5)
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
        self._procs, self._conns = [], []
        if self._shm is not None:
            self._shm.close()
            self._shm.unlink()
            self._shm = None

    def worker_pids(self) -> list[int]:
        return [p.pid for p in self._procs if p.pid is not None]

    def run(self, pattern: Pattern, cfg: RunConfig | None = None) -> PatternTiming:
        """Time one pattern. Raises RunnerError if a worker fails."""
        cfg = cfg or self.cfg
        if cfg.capacity > self.cfg.capacity:
            raise BadInput("a pattern's repetitions exceed the pool's", "create the pool with "
                           "the same RunConfig")
        if pattern.end_bytes > self.size:
            raise BadInput(f"{pattern.mnemonic} needs {pattern.end_bytes} B, the region has "
                           f"{self.size} B", "create the pool with every pattern to run")
        return self.run_plans(pattern.mnemonic, pattern.procs,
                              plans(pattern, self.machine.page_bytes), cfg)

    def run_plans(self, name: str, procs: int, work: Sequence[WorkerPlan],
                  cfg: RunConfig | None = None) -> PatternTiming:
        """Time supersteps given as every participant's plan (the first ``procs`` timed);
        :meth:`run` builds the plans of a pattern."""
        cfg = cfg or self.cfg
        if cfg.capacity > self.cfg.capacity:
            raise BadInput("a pattern's repetitions exceed the pool's", "create the pool with "
                           "the same RunConfig")
        if len(work) > self.n:
            raise BadInput(f"{name} needs {len(work)} CPUs", "use a larger pool")
        calls = [c for w in work for c in (*w.prefault, *(x for st in w.setup for x in st),
                                           *((w.main,) if w.main is not None else ()))]
        end = max((c.end_bytes for c in calls), default=0)
        if end > self.size:
            raise BadInput(f"{name} needs {end} B, the region has {self.size} B",
                           "create the pool with a region that holds every run")
        table = np.frombuffer(self._times, dtype=np.int64)
        table[:] = 0
        loadavg = os.getloadavg()
        cpu0 = psutil.cpu_times() if psutil is not None else None
        own0 = self._own_cpu()
        wall0 = time.monotonic_ns()
        for plan in work:
            self._conns[plan.slot].send(_Job(plan, len(work), procs, cfg,
                                             self.cfg.capacity, self.counter_backend,
                                             self.counter_events))
        replies: list[WorkerResult] = []
        errors = []
        for plan in work:
            conn = self._conns[plan.slot]
            if not conn.poll(cfg.barrier_timeout_s * 4 + 60):
                errors.append(f"worker {plan.slot} did not answer")
                continue
            status, payload = conn.recv()
            if status == "ok":
                replies.append(payload)
            else:
                errors.append(f"worker {plan.slot}: {payload}")
        wall = time.monotonic_ns() - wall0
        if errors:
            raise RunnerError(f"{name} failed: " + " | ".join(errors),
                              "see the worker traceback; rerun with --resume to continue")
        reps = replies[0].reps
        view = table.reshape(self.cfg.capacity, self.n, 2)[:reps, :procs, :]
        begin, end = view[:, :, 0].copy(), view[:, :, 1].copy()
        timed = sorted((r for r in replies if r.slot < procs), key=lambda r: r.slot)
        others, steal = self._load(cpu0, own0, wall)
        flags = []
        samples = superstep_times(begin, end)[cfg.warmup:]
        if spread(samples) > cfg.unstable_spread:
            flags.append("unstable")
        if others is not None and others > cfg.loaded_cpu_fraction:
            flags.append("loaded")
        if steal is not None and steal > cfg.steal_fraction:
            flags.append("steal")
        if any(r.nivcsw > reps for r in timed):
            flags.append("preempted")
        unsupported: dict[str, str] = {}
        for r in timed:
            unsupported.update(r.unsupported)
        return PatternTiming(begin, end, cfg.warmup, tuple(self.machine.cpus[:procs]),
                             tuple(r.affinity for r in timed), tuple(r.nivcsw for r in timed),
                             tuple(r.checksum for r in timed),
                             tuple(r.counters for r in timed), unsupported,
                             (loadavg[0], loadavg[1], loadavg[2]), others, steal, wall,
                             tuple(flags))

    def run_settled(self, pattern: Pattern, cfg: RunConfig | None = None
                    ) -> tuple[PatternTiming, int]:
        """:meth:`run`, taken again up to ``cfg.retries`` times while the measurement is
        flagged disturbed; the least disturbed attempt (:func:`disturbance`) and how many
        attempts were made."""
        cfg = cfg or self.cfg
        best = self.run(pattern, cfg)
        attempts = 1
        while attempts <= cfg.retries and disturbance(best.flags, best.samples_ns)[0]:
            t = self.run(pattern, cfg)
            attempts += 1
            if disturbance(t.flags, t.samples_ns) < disturbance(best.flags, best.samples_ns):
                best = t
        return best, attempts

    def _own_cpu(self) -> float | None:
        if psutil is None:
            return None
        total = 0.0
        for pid in [os.getpid(), *self.worker_pids()]:
            try:
                t = psutil.Process(pid).cpu_times()
                total += t.user + t.system
            except psutil.Error:
                return None
        return total

    def _load(self, cpu0: Any, own0: float | None, wall_ns: int
              ) -> tuple[float | None, float | None]:
        """(CPUs' worth used by other processes, stolen fraction) over the pattern."""
        if psutil is None or cpu0 is None or wall_ns <= 0:
            return None, None
        cpu1 = psutil.cpu_times()
        own1 = self._own_cpu()
        idle_fields = ("idle", "iowait", "steal", "guest", "guest_nice")
        busy = sum(getattr(cpu1, f) - getattr(cpu0, f) for f in cpu1._fields
                   if f not in idle_fields)
        total = sum(getattr(cpu1, f) - getattr(cpu0, f) for f in cpu1._fields
                    if f not in ("guest", "guest_nice"))
        steal = ((cpu1.steal - cpu0.steal) / total
                 if hasattr(cpu1, "steal") and total > 0 else None)
        if own0 is None or own1 is None:
            return None, steal
        # /proc/stat and /proc/PID/stat count in 10 ms ticks: subtract what quantisation of
        # the 2 + 2 * (1 + workers) readings can account for, so short patterns are not flagged.
        tick = 0.01 * (2 + 2 * (1 + len(self._procs)))
        others = max(0.0, busy - (own1 - own0) - tick) / (wall_ns / 1e9)
        return others, steal


ProgressFn = Callable[[int, int, str, float | None], None]
"""progress(done, total, mnemonic just finished or starting, seconds remaining or None)."""


def no_progress(done: int, total: int, mnemonic: str, eta_s: float | None) -> None:
    """The default: report nothing (library code never prints)."""


__all__ = [
    "PatternTiming", "ProgressFn", "RunnerError", "WorkerPool", "host_metadata", "no_progress",
]
