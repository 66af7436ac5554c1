"""What each participant of a pattern executes: its plan (pre-faulting, the coherence set-up
before each superstep, the timed kernel), built from a :class:`~microbench.patterns.Pattern`
and run by :class:`microbench.runner.WorkerPool`."""

from __future__ import annotations

from dataclasses import dataclass

from microbench.kernels import Call, KernelCall, KernelName, prefault_call
from microbench.patterns import Pattern


@dataclass(frozen=True)
class WorkerPlan:
    """One participant's part of a pattern. ``slot`` < procs: timed rank; a helper (coherence
    variants with one processor) has ``slot = procs`` and no main kernel."""

    slot: int
    timed: bool
    prefault: tuple[KernelCall, ...]
    setup: tuple[tuple[Call, ...], ...]
    main: Call | None


def main_call(pattern: Pattern, rank: int) -> KernelCall:
    return KernelCall(pattern.op, pattern.bases_bytes[rank], pattern.count,
                      pattern.stride_words, pattern.sweeps, pattern.store_every)


def _one_sweep(pattern: Pattern, rank: int, kernel: KernelName) -> KernelCall:
    return KernelCall(kernel, pattern.bases_bytes[rank], pattern.count, pattern.stride_words, 1)


def plans(pattern: Pattern, page_bytes: int = 4096) -> tuple[WorkerPlan, ...]:
    """Every participant's plan. Coherence set-up (seed 004 section 5.1), before each
    superstep, by the preparer of rank k (rank (k+1) % p, or the helper when p = 1):

    * dirty:  the preparer stores rank k's data (modified in its cache, invalid elsewhere);
    * clean:  it stores, flushes (write back + invalidate everywhere), loads: clean in its
      cache only;
    * shared: as clean, then (second step) rank k loads it too: shared by both caches.
    """
    p = pattern.procs
    out: list[WorkerPlan] = []
    coh = pattern.coherence
    n_workers = pattern.cpus_needed
    for w in range(n_workers):
        timed = w < p
        prefault = (prefault_call(pattern.bases_bytes[w], pattern.span_bytes, page_bytes),
                    ) if timed else ()
        setup: list[tuple[Call, ...]] = []
        if coh is not None:
            target = (w - 1) % p if p > 1 else (0 if not timed else None)
            step1: tuple[Call, ...] = ()
            if target is not None:
                step1 = (_one_sweep(pattern, target, "store"),)
                if coh in ("clean", "shared"):
                    step1 += (_one_sweep(pattern, target, "flush"),
                              _one_sweep(pattern, target, "load"))
            setup.append(step1)
            if coh == "shared":
                setup.append((_one_sweep(pattern, w, "load"),) if timed else ())
        out.append(WorkerPlan(w, timed, prefault, tuple(setup),
                              main_call(pattern, w) if timed else None))
    return tuple(out)
