"""Memory logP measurements: copy, pack and unpack over message sizes s and strides d.

The measurement of Cameron, Sun, Byna and Ge, "Predicting and Evaluating Memory Communication
Performance" (sections 5 and 6.1, their modified mpptest), on this host with the native
``counterd_copy2d`` kernel (:class:`microbench.kernels.CopyCall`) through the pinned worker
pool (:meth:`microbench.runner.WorkerPool.run_plans`):

* ``copy``: s bytes from words d bytes apart to words d bytes apart (section 6.1's direct copy
  of non-contiguous data); d = 8 is the contiguous copy (one row of s/8 words), whose cost in
  the first-level cache is alpha;
* ``pack``: gather s/8 words d bytes apart into a contiguous buffer; ``unpack``: the reverse;
* ``p2p.pack`` / ``p2p.unpack`` (two CPUs, section 4 and 6.5's point-to-point transfer in
  shared memory): the sender packs into a buffer the receiver unpacked from in the previous
  exchange, and the receiver unpacks a buffer the sender has just packed (dirty in the other
  CPU's cache). Each side is timed on its own CPU while the other side's step runs untimed
  before it (a set-up step of the plan).

As mpptest does, a message is copied again and again: a call repeats the copy ``reps`` times
(at least ``MIN_CALL_BYTES`` per timed call, so the ctypes call and the clock are small beside
it), and the runner repeats calls until their spread settles; the first repetitions are warm-ups
and are dropped. The default plan measures every point in several rounds, one after the other
(as microbench.compute does), so a slow spell of the host slows few of a point's calls. A
point's cost is its fastest call: the paper assumes "deterministic access delay and use[s]
minimum average values" (section 2), and on a virtual machine the slow calls are the guest
being interrupted (in the first runs on a 2-CPU KVM guest, calls of 1 ms took 3-5 ms in one of
three repetitions, with no other load); the median is kept beside it. The cost of an empty
call (one 8-byte copy) is measured the same way and subtracted. Sizes run from below the
first-level cache to beyond the last level; a stride's largest size is capped so the strided
side spans at most ``MAX_SPAN_BYTES``. The destination starts ``PAD_BYTES`` after the source's
last page, so source and destination do not share page offsets (no 4 KiB aliasing between a
load and a store stream).

The results document (format ``counterd-memlogp``, :data:`predictor.families.memlogp.FORMAT`)
carries
host metadata, the machine's geometry, the run configuration, the call overhead and per point
the raw samples (ns), their median and spread, and the cost per byte in seconds. It is
written atomically.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from counterd.data.errors import BadInput
from counterd.machine.views import NodeView
from counterd.util.fsutil import atomic_write_text
from microbench import results
from microbench.kernels import CopyCall, prefault_call
from microbench.plans import WorkerPlan
from microbench.repetition import RunConfig, disturbance, spread
from microbench.runner import PatternTiming, WorkerPool, host_metadata
from predictor.families.memlogp import FORMAT, OPS, VERSION, WORD_BYTES

KiB, MiB = 1 << 10, 1 << 20
MIN_CALL_BYTES = 1 * MiB  # bytes copied per timed call (reps = this // s)
MAX_SPAN_BYTES = 256 * MiB  # the strided side of a point spans at most this
PAD_BYTES = 1088  # destination offset past the source's last page (17 lines)

NOTES = (
    "memory logP measurements (Cameron, Sun, Byna and Ge, \"Predicting and Evaluating Memory "
    "Communication Performance\"): warm repeated copies of one message, as mpptest; "
    "per_byte_s = (fastest call - call overhead) / (reps x s): the paper's minimum average "
    "values (section 2); per_byte_median_s beside it",
    "copy: strided on both sides (d = 8: one contiguous row, vector moves); pack: strided "
    "loads, contiguous stores; unpack: contiguous loads, strided stores",
    "p2p.pack / p2p.unpack: two CPUs, the other side's step untimed before each timed call, "
    "one message per call",
)

Progress = Callable[[int, int, str], None]


def no_progress(done: int, total: int, name: str) -> None:
    """The default: report nothing (library code never prints)."""


@dataclass(frozen=True)
class PlanPoint:
    """One measurement: ``op`` at s and d (bytes)."""

    op: str
    s_bytes: int
    d_bytes: int

    @property
    def name(self) -> str:
        return f"{self.op}.s{self.s_bytes}.d{self.d_bytes}"

    @property
    def workers(self) -> int:
        return 2 if self.op.startswith("p2p.") else 1


@dataclass(frozen=True)
class Plan:
    name: str
    points: tuple[PlanPoint, ...]
    cfg: RunConfig
    rounds: int = 1  # every point is measured once per round, rounds one after the other

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "points": len(self.points), "rounds": self.rounds,
                "run_config": asdict(self.cfg),
                "min_call_bytes": MIN_CALL_BYTES, "max_span_bytes": MAX_SPAN_BYTES,
                "pad_bytes": PAD_BYTES}


def _span(s: int, d: int) -> int:
    return (s // WORD_BYTES - 1) * d + WORD_BYTES


def _grid(ops: Sequence[str], sizes: Sequence[int], strides: Sequence[int]
          ) -> list[PlanPoint]:
    return [PlanPoint(op, s, d) for op in ops for d in strides for s in sizes
            if _span(s, d) <= MAX_SPAN_BYTES]


DEFAULT_SIZES = (4 * KiB, 16 * KiB, 64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB)
DEFAULT_STRIDES = (8, 32, 64, 256, 2048, 8192)
DEFAULT_CFG = RunConfig(warmup=1, min_reps=5, max_reps=9, tolerance=0.05,
                        budget_ns=100_000_000, retries=0)
DEFAULT_ROUNDS = 4
QUICK_CFG = RunConfig(warmup=1, min_reps=3, max_reps=5, tolerance=0.10, budget_ns=50_000_000,
                      retries=0)


def default_plan(machine: NodeView) -> Plan:
    """Sizes 4 KiB .. 64 MiB (below L1 to beyond the last level of most hosts; the largest
    size is raised to twice the last level where that is larger, up to the span cap: a last
    level of more than half of :data:`MAX_SPAN_BYTES`, as a VM that reports its host's whole
    L3 of 300 MB, is not reached), strides 8 .. 8192 B, the three operations, and the
    two-CPU point-to-point transfer at three sizes and strides where the host has two CPUs."""
    llc = machine.geometry.levels[-1].size_bytes
    sizes = list(DEFAULT_SIZES)
    if sizes[-1] < 2 * llc:
        sizes.append(min(1 << (2 * llc - 1).bit_length(), MAX_SPAN_BYTES))
    pts = _grid(OPS, sizes, DEFAULT_STRIDES)
    if machine.max_procs >= 2:
        pts += _grid(("p2p.pack", "p2p.unpack"), (64 * KiB, 1 * MiB, 8 * MiB), (8, 256, 2048))
    return Plan("default", tuple(pts), DEFAULT_CFG, DEFAULT_ROUNDS)


def quick_plan(machine: NodeView) -> Plan:
    """A few seconds: three sizes, two strides, every operation (and one two-CPU point)."""
    pts = _grid(OPS, (4 * KiB, 64 * KiB, 1 * MiB), (8, 256))
    if machine.max_procs >= 2:
        pts += _grid(("p2p.pack", "p2p.unpack"), (64 * KiB,), (256,))
    return Plan("quick", tuple(pts), QUICK_CFG)


# -- plans for the runner ----------------------------------------------------------------------

def _layout(p: PlanPoint, page: int) -> tuple[int, int, int]:
    """(source, destination, buffer) offsets; the buffer is the p2p message buffer."""
    strided = _span(p.s_bytes, p.d_bytes)
    src_end = -(-strided // page) * page
    dst = src_end + PAD_BYTES
    buf = -(-(dst + strided) // page) * page + PAD_BYTES // 2
    return 0, dst, buf


def copy_call(p: PlanPoint, page: int = 4096, reps: int | None = None) -> CopyCall:
    """The kernel call of a point (for p2p points: the timed side's)."""
    n, w = p.s_bytes // WORD_BYTES, p.d_bytes // WORD_BYTES
    src, dst, buf = _layout(p, page)
    r = reps if reps is not None else (1 if p.workers > 1
                                       else max(1, MIN_CALL_BYTES // p.s_bytes))
    if p.op == "copy":
        return (CopyCall(dst, n, src, n, 1, n, r) if w == 1
                else CopyCall(dst, w, src, w, n, 1, r))
    if p.op == "pack":
        return CopyCall(dst, 1, src, w, n, 1, r)
    if p.op == "unpack":
        return CopyCall(dst, w, src, 1, n, 1, r)
    if p.op == "p2p.pack":
        return CopyCall(buf, 1, src, w, n, 1, r)
    return CopyCall(dst, w, buf, 1, n, 1, r)  # p2p.unpack


def worker_plans(p: PlanPoint, page: int = 4096) -> tuple[WorkerPlan, ...]:
    """The runner's plans: one timed worker; for p2p, a second CPU that runs the other side
    of the exchange (untimed) before every timed call."""
    main = copy_call(p, page)
    src, dst, buf = _layout(p, page)
    top = max(main.end_bytes, buf + p.s_bytes) if p.workers > 1 else main.end_bytes
    prefault = (prefault_call(0, top, page),)
    if p.workers == 1:
        return (WorkerPlan(0, True, prefault, (), main),)
    other = copy_call(PlanPoint("p2p.unpack" if p.op == "p2p.pack" else "p2p.pack",
                                p.s_bytes, p.d_bytes), page)
    # The helper writes its own destination (the receiver's dst) or reads the source: both
    # pre-faulted by the timed worker, which runs first on the same shared region.
    return (WorkerPlan(0, True, prefault, ((),), main),
            WorkerPlan(1, False, (), ((other,),), None))


def region_bytes(plan: Plan, page: int = 4096) -> int:
    top = 0
    for p in plan.points:
        _, _, buf = _layout(p, page)
        top = max(top, copy_call(p, page).end_bytes, buf + p.s_bytes)
    return -(-top // page) * page + page


def _settled(pool: WorkerPool, name: str, procs: int, work: Sequence[WorkerPlan],
             cfg: RunConfig) -> tuple[PatternTiming, int]:
    """:meth:`WorkerPool.run_settled` for plans: taken again while flagged disturbed, the
    least disturbed attempt kept."""
    best = pool.run_plans(name, procs, work, cfg)
    attempts = 1
    while attempts <= cfg.retries and disturbance(best.flags, best.samples_ns)[0]:
        t = pool.run_plans(name, procs, work, cfg)
        attempts += 1
        if disturbance(t.flags, t.samples_ns) < disturbance(best.flags, best.samples_ns):
            best = t
    return best, attempts


@dataclass
class _Taken:
    """What the rounds measured of one point so far."""

    samples: list[int]
    warmup: list[int]
    flags: set[str]
    attempts: int
    timing: PatternTiming


def _record(p: PlanPoint, call: CopyCall, taken: _Taken, overhead_ns: float) -> dict[str, Any]:
    t = taken.timing
    samples = np.asarray(taken.samples, dtype=float)
    median = float(np.median(samples))
    net = max(float(samples.min()) - overhead_ns, 1.0)
    return {"name": p.name, "op": p.op, "s_bytes": p.s_bytes, "d_bytes": p.d_bytes,
            "workers": p.workers, "cpus": list(t.cpus), "reps_per_call": call.reps,
            "samples_ns": [int(x) for x in taken.samples],
            "warmup_samples_ns": [int(x) for x in taken.warmup],
            "median_ns": median, "min_ns": float(samples.min()), "spread": spread(samples),
            "per_byte_s": net / (call.reps * p.s_bytes) / 1e9,
            "per_byte_median_s": max(median - overhead_ns, 1.0) / (call.reps * p.s_bytes) / 1e9,
            "flags": sorted(taken.flags), "attempts": taken.attempts,
            "load": {"loadavg": list(t.loadavg), "others_cpu": t.others_cpu,
                     "steal": t.steal}}


def new_document(machine: NodeView, plan: Plan) -> dict[str, Any]:
    doc: dict[str, Any] = {"format": FORMAT, "version": VERSION, "created": results.now_iso(),
                           "complete": False, "host": host_metadata(machine.cpus)}
    doc.update(machine.to_json())
    doc["geometry"]["page_bytes"] = machine.page_bytes
    doc["config"] = plan.to_json()
    doc["notes"] = list(NOTES)
    doc["points"] = []
    return doc


def write(path: str | Path, doc: dict[str, Any]) -> None:
    """Atomic replace (:func:`counterd.util.fsutil.atomic_write_text`)."""
    atomic_write_text(Path(path), results.dumps(doc))


def measure(machine: NodeView, plan: Plan, out: str | Path | None = None, *,
            force: bool = False, progress: Progress = no_progress) -> dict[str, Any]:
    """Run ``plan`` on ``machine``; return the results document, also written to ``out``
    (atomically, after every round, so an interrupted run keeps its finished rounds) when
    given. An existing ``out`` is refused unless ``force``."""
    if any(p.workers > machine.max_procs for p in plan.points):
        raise BadInput(f"the plan has two-CPU points and this host has {machine.max_procs} "
                       "CPU", "run the plan of this host (default_plan / quick_plan)")
    path = Path(out) if out is not None else None
    if path is not None:
        if path.is_dir():
            raise BadInput(f"{path} is a directory", "give a file name for --out")
        if path.exists() and not force:
            raise BadInput(f"{path} exists", "use --force to overwrite it, or choose another "
                           "--out")
    doc = new_document(machine, plan)
    if path is not None:
        write(path, doc)  # an unwritable --out fails here, before any work
    page = machine.page_bytes
    workers = max(p.workers for p in plan.points)
    t0 = time.monotonic()
    cfg = plan.cfg
    taken: dict[PlanPoint, _Taken] = {}
    total = len(plan.points) * plan.rounds
    with WorkerPool(machine, [], cfg, region=(region_bytes(plan, page), workers)) as pool:
        empty = CopyCall(WORD_BYTES, 1, 0, 1, 1, 1, 1)
        t, _ = _settled(pool, "call-overhead", 1, (WorkerPlan(0, True, (), (), empty),), cfg)
        overhead = float(np.min(t.samples_ns))
        doc["call_overhead_ns"] = overhead
        # Rounds in the outer loop (as microbench.compute does): a slow spell of the host,
        # seconds long on a shared VM, then slows few of any one point's calls.
        for r in range(plan.rounds):
            for i, p in enumerate(plan.points):
                progress(r * len(plan.points) + i, total, p.name)
                t, attempts = _settled(pool, p.name, 1, worker_plans(p, page), cfg)
                k = taken.get(p)
                if k is None:
                    taken[p] = _Taken(t.samples_ns.tolist(), t.warmup_samples_ns.tolist(),
                                      set(t.flags), attempts, t)
                else:
                    k.samples += t.samples_ns.tolist()
                    k.warmup += t.warmup_samples_ns.tolist()
                    k.flags |= set(t.flags)
                    k.attempts += attempts
            doc["points"] = [_record(p, copy_call(p, page), taken[p], overhead)
                             for p in plan.points]
            if path is not None:
                write(path, doc)
    progress(len(plan.points), len(plan.points), "done")
    doc["complete"] = True
    doc["finished"] = results.now_iso()
    doc["duration_s"] = round(time.monotonic() - t0, 1)
    if path is not None:
        write(path, doc)
    return doc


__all__ = ["DEFAULT_CFG", "MAX_SPAN_BYTES", "MIN_CALL_BYTES", "NOTES", "PAD_BYTES", "Plan",
           "PlanPoint", "QUICK_CFG", "copy_call", "default_plan", "measure", "new_document",
           "no_progress", "quick_plan", "region_bytes", "worker_plans", "write"]
