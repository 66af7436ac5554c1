"""Run a suite: time every pattern, simulate its counters, write the results file as it goes.

Order of work (so the simulator never runs while a pattern is timed): patterns are taken in
chunks of as many patterns as there are CPUs, longest simulation first when the run has an
estimate (:func:`microbench.estimate.run_order`); each pattern of a chunk is timed by the
pinned worker pool, then the chunk's simulations run in parallel on all CPUs, then its
records are added (in the order of the patterns given) and the file is rewritten atomically.
An interrupted run leaves a valid file with ``complete: false`` and every finished pattern;
``resume=True`` continues it.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from counterd import backends
from counterd.data.errors import BadInput, UnknownBackend
from counterd.data.events import Source
from counterd.machine.views import NodeView
from counterd.sim import DEFAULT_CHUNK, native_status
from counterd.sim.sampling import SetSampling
from microbench import results
from microbench.counters import (
    SIM_COUNTERS,
    SimulatedSuperstep,
    shared_policy,
    simulate_pattern,
    uses_coherence,
)
from microbench.estimate import Estimate, chunks, run_order
from microbench.patterns import Pattern
from microbench.repetition import NORMAL, RunConfig
from microbench.runner import (
    PatternTiming,
    ProgressFn,
    WorkerPool,
    host_metadata,
    no_progress,
)

BACKENDS: tuple[str, ...] = ("auto", *backends.POLICIES["microbench"].names)

SIM_NOTES = (
    "simulated counters: counterd sim backend (write-back LRU caches; shared levels split "
    "among exclusive processors); one superstep after the same pre-fault and warm-up "
    "supersteps as the timed run",
    "concurrent patterns and coherence variants (sim.shared_policy 'coherent') are simulated "
    "as one system: workers' streams interleaved round-robin in turns of sim.coherence.chunk "
    "accesses per barrier phase, MSI invalidation between private levels, shared levels one "
    "cache; coherence misses are inside l1d_misses/l2_misses (counts per rank in "
    "sim.coherence). Not modelled: E state, forwarding of clean lines, upgrade misses, the "
    "race timing of the interleaving, and the coherence set-up's line flushes (clean/shared "
    "variants start from the preparer's dirty copy)",
    "exclusive processors are simulated each with its share of the shared last level's ways "
    "(sets indexed by address modulo sets); on hardware processors whose lines fall in "
    "different sets do not compete, and a guest may get less than the nominal size, so "
    "strided memory patterns whose distinct lines fit the last level may partly hit there "
    "(flag llc_may_hold)",
    "bank counts LM(b), WB(b) are per the declared bank map (see bank_map.provenance)",
)


@dataclass(frozen=True)
class CounterPlan:
    """Which backend gives measured counters (None: simulated only) and what it reported."""

    requested: str
    used: str
    measured_backend: str | None
    reason: str


def resolve_backend(name: str) -> CounterPlan:
    """The counter plan of a run, as :func:`counterd.backends.resolve` decides for purpose
    ``microbench`` (``auto``: perf, then papi, when it can count loads here, else sim). A
    measured backend asked for by name is used even without a load counter."""
    try:
        res = backends.resolve(name, "microbench")
    except UnknownBackend as exc:
        raise BadInput(f"unknown backend {name!r}", "choose " + ", ".join(BACKENDS)) from exc
    if res.error:
        raise res.unavailable("choose another with --backend, or auto")
    if res.backend == "sim":
        return CounterPlan(name, "sim", None,
                           "simulation requested" if name == "sim" else res.reason)
    assert res.backend is not None
    return CounterPlan(name, res.backend, res.backend, res.reason)


def _sim_job(args: tuple[Pattern, Any, Any, int, int, SetSampling | None]
             ) -> tuple[tuple[SimulatedSuperstep, ...], float]:
    """A pattern's simulated counters, and the seconds the simulation took."""
    pattern, geometry, bank_map, warmup, page_bytes, sampling = args
    t0 = time.monotonic()
    sims = simulate_pattern(pattern, geometry, bank_map, warmup=warmup, page_bytes=page_bytes,
                            sampling=sampling)
    return sims, time.monotonic() - t0


def _llc_may_hold(p: Pattern, machine: NodeView) -> bool:
    if p.level != "mem":
        return False
    llc = machine.geometry.levels[-1]
    line = llc.line_bytes
    per_proc = p.count * line if p.stride_bytes >= line else p.span_bytes
    distinct = len(set(p.bases_bytes)) if p.mode == "concurrent" else p.procs
    return distinct * per_proc < llc.size_bytes


def _flags(p: Pattern, timing: PatternTiming, sim0: SimulatedSuperstep, machine: NodeView,
           measured: bool) -> list[str]:
    flags = list(timing.flags)
    if (p.procs > 1 or p.coherence is not None) and not uses_coherence(p):
        flags.append("no_coherence_in_sim")  # simulated per processor, without coherence
    if _llc_may_hold(p, machine):
        flags.append("llc_may_hold")
    lines = [lv.line_bytes for lv in machine.geometry.levels]
    if results.served_level(sim0.counters, p, lines) != p.level:
        flags.append("level_mismatch")
    if measured and timing.unsupported:
        flags.append("unsupported_counters")
    return flags


def _record(p: Pattern, machine: NodeView, timing: PatternTiming,
            sims: Sequence[SimulatedSuperstep], cfg: RunConfig, plan: CounterPlan,
            attempts: int = 1, timed_s: float | None = None,
            sim_s: float | None = None, sampling: SetSampling | None = None
            ) -> dict[str, Any]:
    procs = []
    engine = "native" if native_status()[0] else "python"
    for rank, sim in enumerate(sims):
        counters: dict[str, dict[str, Any]] = {}
        measured = timing.measured_counters[rank] if timing.measured_counters else {}
        for name in SIM_COUNTERS:
            if name in measured:
                counters[name] = {"value": measured[name], "source": str(Source.MEASURED)}
            elif name in sim.counters:
                counters[name] = {"value": sim.counters[name], "source": str(Source.SIMULATED)}
        procs.append(results.ProcessorRecord(
            rank, timing.cpus[rank], timing.begin_ns[:, rank].tolist(),
            timing.end_ns[:, rank].tolist(), timing.nivcsw[rank], timing.checksums[rank],
            counters, sim.counters, sim.lm, sim.wb))
    lines = [lv.line_bytes for lv in machine.geometry.levels]
    load = {"loadavg": list(timing.loadavg), "others_cpu": timing.others_cpu,
            "steal": timing.steal, "unsupported": dict(timing.unsupported),
            "attempts": attempts,  # measurements taken; the least disturbed is kept
            "timed_s": timed_s}  # wall time of all attempts
    sim_meta = {"engine": engine, "shared_policy": shared_policy(p), "warmup": cfg.warmup,
                "served_level": results.served_level(sims[0].counters, p, lines),
                "seconds": sim_s}
    if sampling is not None:  # the last level's and the memory's counts are estimates
        sim_meta["set_sampling"] = sampling.to_json(machine.geometry)
    if uses_coherence(p):
        sim_meta["coherence"] = {"chunk": DEFAULT_CHUNK,
                                 "coherence_misses": [s.coherence_misses for s in sims],
                                 "invalidations": [s.invalidations for s in sims]}
    return results.pattern_record(
        p, machine, samples_ns=timing.samples_ns.tolist(),
        warmup_samples_ns=timing.warmup_samples_ns.tolist(), processors=procs,
        warmup=timing.warmup,
        flags=_flags(p, timing, sims[0], machine, plan.measured_backend is not None),
        load=load, sim=sim_meta, wall_s=timing.wall_ns / 1e9)


def prior_document(out: Path, machine: NodeView, *, suite: str, force: bool, resume: bool
                   ) -> dict[str, Any] | None:
    """The finished part of ``out`` to resume from, or None to start afresh; BadInput for an
    ``out`` that cannot be written or resumed. Cheap, so that a command checks it before any
    measuring (a bad --resume file is refused at once, not after the run's estimate)."""
    if out.is_dir():
        raise BadInput(f"{out} is a directory", "give a file name for --out")
    if out.exists() and resume:
        doc = results.load(out)
        if doc.get("suite") != suite or doc["geometry"]["spec"] != machine.geometry.spec():
            raise BadInput(f"{out} holds suite {doc.get('suite')!r} on "
                           f"{doc['geometry']['spec']}, not {suite!r} on "
                           f"{machine.geometry.spec()}",
                           "resume with the same --suite and geometry, or use --force")
        return doc
    if out.exists() and not force:
        raise BadInput(f"{out} exists", "use --force to overwrite it, --resume to continue "
                       "an interrupted run, or choose another --out")
    return None


def run_suite(machine: NodeView, patterns: Sequence[Pattern], out: str | Path, *,
              suite: str, cfg: RunConfig = NORMAL, backend: str = "auto", force: bool = False,
              resume: bool = False, quick: bool = False, compute_backend: str = "auto",
              progress: ProgressFn = no_progress, estimate: Estimate | None = None,
              sampling: SetSampling | None = None) -> dict[str, Any]:
    """Run ``patterns`` on ``machine`` and write ``out``; return the results document.

    ``estimate`` (:func:`microbench.estimate.estimate` of these patterns) drives the
    remaining time given to ``progress`` and is kept in the document beside what each step
    took (``phases_s``: start-up, timing, simulation, writing, compute).

    After the memory patterns, the compute patterns (:mod:`microbench.compute`) counted with
    ``compute_backend`` (``auto``: perf or papi where the PMU counts instructions, else
    callgrind; ``none``: skipped) go under the document's ``compute`` key.

    ``sampling``: the last level simulated on a sample of its sets
    (:mod:`counterd.sim.sampling`); every record then says so (``sim.set_sampling``), and so
    do the document's notes and config.

    An existing ``out`` is refused unless ``force`` (start again) or ``resume`` (keep its
    finished patterns, run the rest). Raises BadInput for bad input (exit 2 in the CLI)."""
    from microbench import compute

    if compute_backend not in compute.BACKENDS:
        raise BadInput(f"--compute-backend {compute_backend!r}",
                       "choose " + ", ".join(compute.BACKENDS))
    out = Path(out)
    t_start = time.monotonic()
    plan = resolve_backend(backend)
    doc: dict[str, Any] | None = prior_document(out, machine, suite=suite, force=force,
                                                resume=resume)
    if doc is None:
        config = {**asdict(cfg), "quick": quick, "counter_plan": asdict(plan),
                  "set_sampling": (sampling.to_json(machine.geometry) if sampling is not None
                                   else None)}
        notes = list(SIM_NOTES)
        if sampling is not None:
            s = sampling.to_json(machine.geometry)
            notes.append(f"set sampling: L{s['level']} simulated on {s['sampled_sets']} of its "
                         f"{s['sets']} sets (1 block of {s['block_sets']} in {s['every']}); "
                         f"its counts (l{s['level']}_misses, l{s['level']}_writebacks) and the "
                         "banks' LM(b), WB(b) are estimates scaled from the sampled sets, the "
                         "other counters are simulated in full (run without --quick, or "
                         "with --full-simulation, for every set)")
        host = host_metadata(machine.cpus)
        if host["loadavg"][0] > 0.5:
            notes.append(f"load average {host['loadavg'][0]:.2f} when the run started: other "
                         "work was running; see each pattern's load and flags")
        doc = results.new_document(machine=machine, backend=plan.used, suite=suite, host=host,
                                   config=config, notes=notes)
    if estimate is not None:
        doc["estimate"] = estimate.to_json(per_pattern=True)
    done = {p["mnemonic"] for p in doc["patterns"]}
    todo = run_order([p for p in patterns if p.mnemonic not in done], estimate)
    place = {p.mnemonic: i for i, p in enumerate(patterns)}  # records kept in this order
    phases = {"startup": 0.0, "timing": 0.0, "simulation": 0.0, "writing": 0.0,
              "compute": 0.0}
    t0 = time.monotonic()
    results.write(out, doc)  # an unwritable --out fails here, before any work
    phases["writing"] += time.monotonic() - t0
    total = len(done) + len(todo)
    if not todo:
        _run_compute(doc, out, quick, compute_backend, progress, total, phases)
        doc["complete"] = True
        results.write(out, doc)
        return doc
    costs = _costs(todo, estimate)
    spent_cost = 0.0
    events = SIM_COUNTERS if plan.measured_backend else ()
    progress(len(done), total, todo[0].mnemonic, estimate.total_s if estimate else None)
    ctx = mp.get_context("fork")
    with ProcessPoolExecutor(max_workers=max(1, machine.max_procs), mp_context=ctx) as executor:
        executor.submit(int).result()  # fork the simulators before the pool's pipes exist
        with WorkerPool(machine, todo, cfg, counter_backend=plan.measured_backend,
                        counter_events=events) as pool:
            phases["startup"] = time.monotonic() - t_start - phases["writing"]
            start = 0
            for chunk in chunks(todo, machine.max_procs):
                settled = []
                for p in chunk:
                    t0 = time.monotonic()
                    settled.append((*pool.run_settled(p, cfg), time.monotonic() - t0))
                phases["timing"] += sum(s for _, _, s in settled)
                jobs = [(p, machine.geometry, machine.bank_map, cfg.warmup, machine.page_bytes,
                         sampling) for p in chunk]
                t0 = time.monotonic()
                sims = list(executor.map(_sim_job, jobs))
                phases["simulation"] += time.monotonic() - t0
                for i, p in enumerate(chunk):
                    timing, attempts, timed_s = settled[i]
                    doc["patterns"].append(_record(p, machine, timing, sims[i][0], cfg, plan,
                                                   attempts, round(timed_s, 4),
                                                   round(sims[i][1], 4), sampling))
                    spent_cost += costs[start + i]
                start += len(chunk)
                doc["patterns"].sort(key=lambda r: place.get(r["mnemonic"], -1))
                doc["phases_s"] = {k: round(v, 2) for k, v in phases.items()}
                t0 = time.monotonic()
                results.write(out, doc)
                phases["writing"] += time.monotonic() - t0
                remaining = sum(costs[start:])
                elapsed = time.monotonic() - t_start
                eta = elapsed * remaining / spent_cost if spent_cost else None
                progress(len(doc["patterns"]), total, chunk[-1].mnemonic, eta)
    _run_compute(doc, out, quick, compute_backend, progress, total, phases)
    doc["complete"] = True
    doc["finished"] = results.now_iso()
    doc["duration_s"] = round(time.monotonic() - t_start, 1)
    doc["phases_s"] = {k: round(v, 2) for k, v in phases.items()}
    results.write(out, doc)
    return doc


def _costs(todo: Sequence[Pattern], estimate: Estimate | None) -> list[float]:
    """Each pattern's share of the remaining time: its estimated timing and its share of a
    chunk's simulation (the estimate's); without an estimate, equal shares."""
    if estimate is None:
        return [1.0] * len(todo)
    by_name = {c.mnemonic: c for c in estimate.patterns}
    cpus = max(1, estimate.cpus)
    out = []
    for p in todo:
        c = by_name.get(p.mnemonic)
        out.append(c.timing_s + c.sim_s / cpus if c is not None else 0.0)
    mean = sum(out) / len(out) if any(out) else 1.0
    return [c or mean for c in out]


def _run_compute(doc: dict[str, Any], out: Path, quick: bool, backend: str,
                 progress: ProgressFn, total: int, phases: dict[str, float]) -> None:
    """The compute patterns into ``doc["compute"]`` (once: a resumed run keeps them)."""
    from microbench import compute

    if doc.get("compute"):
        return
    t0 = time.monotonic()
    plan = compute.plan(backend)
    if plan.backend is None:
        doc["compute"] = {"backend": None, "reason": plan.reason, "patterns": []}
    else:
        progress(total, total, f"compute patterns ({plan.backend})", None)
        pats = compute.measure(quick=quick, backend=plan.backend)
        doc["compute"] = {"backend": plan.backend, "reason": plan.reason,
                          "notes": list(compute.NOTES), "patterns": pats}
    phases["compute"] = time.monotonic() - t0
    results.write(out, doc)


__all__ = ["BACKENDS", "CounterPlan", "SIM_NOTES", "resolve_backend",
           "run_suite"]
