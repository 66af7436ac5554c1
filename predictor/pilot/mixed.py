"""What a superstep's pilot runs say where they are not all of one regime: processes that took
turns on one CPU in some of them (:func:`shared_cpu_note`, :data:`SHARED_CPU_ADVICE`), and a
rise of the time per counted instruction between two pilot sizes that the sharing does not
explain (:func:`jump_below`). :func:`predictor.pilot.forecast.forecast` reads them."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from predictor.pilot.choice import regime_jump
from predictor.pilot.extrapolation import WORK
from predictor.pilot.runs import PilotRun


def shared_cpu_note(runs: Sequence[PilotRun], i: int) -> str:
    """What the timed pilot runs say of superstep ``i``'s processors taking turns on one CPU
    (:func:`counterd.data.records.shared_cpus`), "" where none did or it is not known: in how
    many runs at each size, and how much longer their work took than the other runs' at the
    same sizes (the geometric mean, over the sizes that have both, of the medians' ratio)."""
    per = [(r.size, r.step_shared(i)) for r in runs if r.shared]
    if not any(any(s) for _, s in per):
        return ""
    counts = ", ".join(f"{sum(s)} of {len(s)} at {n:g}" for n, s in per)
    ratios = [math.log(np.median(shared_ns) / np.median(apart_ns))
              for shared_ns, apart_ns in (r.split_work(i) for r in runs if r.shared)
              if shared_ns and apart_ns]
    longer = (f"; where a size has both, those runs' work took "
              f"{math.exp(float(np.mean(ratios))):.2g} times the others'" if ratios else "")
    return f"two of its processes took turns on one CPU in timed pilot runs ({counts}){longer}"


# Said once after the per-superstep notes of :func:`shared_cpu_note`.
SHARED_CPU_ADVICE = (
    "processes that took turns on one CPU: the scheduler put them there (forked processes "
    "start on their parent's CPU; a wake-up may pull a process to its waker's) and moved them "
    "apart only later; the forecast follows the pilots' mix of shared and separate runs, and "
    "a run at the target may share or not. Pin each process to its own CPU "
    "(os.sched_setaffinity) for times of the work alone")


def work_per_size(runs: Sequence[PilotRun], i: int) -> list[float]:
    """Superstep ``i``'s counted work (:data:`WORK`, summed over processors) at each pilot
    size, increasing: the mean over the runs of that size."""
    return [float(np.mean([r.steps[i].counter(WORK).sum() for r in runs if r.size == m]))
            for m in sorted({r.size for r in runs})]


def jump_below(runs: Sequence[PilotRun], i: int, sizes: Sequence[float], work_at: float
               ) -> tuple[float, tuple[float, float, float]] | None:
    """Where superstep ``i``'s time per counted instruction rose by
    :data:`~predictor.pilot.choice.REGIME_JUMP` or more between two pilot sizes
    (:func:`~predictor.pilot.choice.regime_jump`) and its processes did not take turns on one
    CPU in a larger share of the timed runs above the rise than below it: the work at the
    target (``work_at`` instructions) at the median time per instruction of the size below
    the rise, in seconds, and the rise (size below, size above, factor); None where there is
    no such rise.

    Why: above such a rise the pilots run in another regime, and the target may be in it
    fully, or in it with a cost that is amortised by then. cg's conjugate gradients (the
    outside suite, 15 sets on an Intel Xeon KVM guest, 2026-11-27/28): OpenBLAS hands its
    vector operations to a thread pool from about n = 10,000, its first use in a process
    costs some milliseconds, and the time per instruction rose 2.3-4.8x between the pilots
    at 8,000 and 12,000; scaled from above, its step at 4x was forecast 1.08-2.52x high
    (median 1.83), from below it would have been low; the geometric mean: 1.04-1.48 (median
    1.20; results page, "A rise in the time per instruction"). A rise that the CPU sharing explains
    (the runs above it shared more often: the first superstep of a forked worker) is left to
    the pilots' mix (:func:`shared_cpu_note`)."""
    med = [float(np.median([w for r in runs if r.size == m for w in r.step_work(i)])) * 1e-9
           for m in sizes]
    work = work_per_size(runs, i)
    jump = regime_jump(sizes, med, work)
    if jump is None:
        return None
    below, above, _ = jump

    def shared(m: float) -> float:
        flags = [f for r in runs if r.size == m for f in r.step_shared(i)]
        return sum(flags) / len(flags) if flags else 0.0

    if shared(above) > shared(below):
        return None
    k = list(sizes).index(below)
    return med[k] / work[k] * work_at, jump
