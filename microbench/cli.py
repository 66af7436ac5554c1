"""``microbench`` entry point (thin: parse, call the library, render, exit code).

Exit codes: 0 ok, 1 a run failed, 2 bad usage or bad input (one line on stderr with the fix).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from counterd.data.errors import BackendUnavailable, BadInput, CounterdError
from counterd.machine import using
from counterd.machine.geometry import Geometry
from counterd.machine.memory import BankMap
from counterd.machine.views import NodeView
from counterd.sim.sampling import SetSampling, for_large_last_level
from counterd.util.cliutil import VersionAction, closed_pipe
from microbench import results
from microbench.catalogue import catalogue
from microbench.estimate import Estimate, Speeds, describe, estimate
from microbench.patterns import (
    COHERENT_MAX_PROCS,
    SUITES,
    Pattern,
    host_machine,
    planned_machine,
)
from microbench.probe import probe, process_age_s
from microbench.repetition import NORMAL, QUICK
from microbench.suite import BACKENDS, prior_document, run_suite

QUICK_MIN_ACCESSES = 1 << 19


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise BadInput(message, f"see {self.prog} --help")


def _int_list(text: str, what: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise BadInput(f"cannot read {what} {text!r}", f"give {what} as 1,2,4") from None
    if not values:
        raise BadInput(f"no {what} in {text!r}", f"give {what} as 1,2,4")
    return values


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise BadInput(f"{text!r} is not a number", "give a positive integer") from None
    if value <= 0:
        raise BadInput(f"size {value}", "give a positive number of accesses")
    return value


def _machine(args: argparse.Namespace, planned: bool = False) -> NodeView:
    """This host's machine (``planned``: the node a machine file describes, with its CPUs:
    what ``list`` shows)."""
    geometry = Geometry.from_spec(args.geometry, source="--geometry") if args.geometry else None
    bank_map = None
    if args.banks:
        n, _, size = args.banks.partition("x")
        try:
            bank_map = BankMap(int(n), int(size))
        except ValueError:
            raise BadInput(f"cannot read --banks {args.banks!r}", "write e.g. 8x256") from None
    return (planned_machine if planned else host_machine)(geometry, bank_map)


def _patterns(args: argparse.Namespace, machine: NodeView) -> tuple[Pattern, ...]:
    if args.suite is None:
        args.suite = "table1" if args.quick else "all"
    procs = _int_list(args.procs, "processor counts") if args.procs else None
    strides = _int_list(args.strides, "strides") if args.strides else None
    if strides and min(strides) <= 0:
        raise BadInput(f"stride {min(strides)} words", "strides are at least 1 word")
    min_accesses = args.accesses or (QUICK_MIN_ACCESSES if args.quick else None)
    kwargs = {"min_accesses": min_accesses} if min_accesses else {}
    return catalogue(machine, args.suite, procs=procs, strides=strides,
                     coherent_procs=args.coherent_procs, **kwargs)


def _sampling(args: argparse.Namespace, machine: NodeView) -> SetSampling | None:
    """A quick run's set sampling of a last level larger than 64 MiB
    (:func:`counterd.sim.sampling.for_large_last_level`), unless --full-simulation."""
    if not args.quick or getattr(args, "full_simulation", False):
        return None
    return for_large_last_level(machine.geometry)


def _estimate(args: argparse.Namespace, machine: NodeView, pats: Sequence[Pattern]
              ) -> tuple[Estimate, Speeds]:
    """The run's estimated duration, from per-access times probed on this host."""
    from microbench import compute

    backend = compute.plan(args.compute_backend).backend or "none"
    planned = machine.cpus != host_machine(machine.geometry, machine.bank_map).cpus
    sampling = _sampling(args, machine)
    speeds = probe(machine, compute=backend != "none", planned=planned,
                   startup_s=process_age_s(), callgrind=backend == "callgrind",
                   sampling=sampling)
    return (estimate(pats, machine, speeds, cfg=QUICK if args.quick else NORMAL,
                     compute_backend=backend, quick=args.quick, sampling=sampling), speeds)


def _add_selection(p: argparse.ArgumentParser) -> None:
    p.add_argument("--suite", choices=SUITES,
                   help="default: all (table1 with --quick)")
    p.add_argument("--procs", help="processor counts, e.g. 1,2 (default: 1, 2, 4, ... CPUs)")
    p.add_argument("--strides", help="only these strides in words, e.g. 1,8,32")
    p.add_argument("--accesses", type=_positive,
                   help="minimum accesses per processor per superstep (repeats short sweeps)")
    p.add_argument("--coherent-procs", type=_positive, default=COHERENT_MAX_PROCS,
                   metavar="N", help="most processors of the patterns whose processors share "
                   "data (concurrent, coherence variants), whose simulation costs grow with "
                   f"the square of their processors (default {COHERENT_MAX_PROCS})")
    p.add_argument("--quick", action="store_true",
                   help="fast run: table1 suite unless --suite is given, fewer "
                   "repetitions, shorter cache-resident supersteps, and a last level "
                   "larger than 64 MiB simulated on 1 block of its sets in 16 (set sampling: "
                   "its misses, writebacks and the banks' counts estimated from the sample)")
    p.add_argument("--full-simulation", action="store_true",
                   help="with --quick: simulate every set of the last level")
    p.add_argument("--compute-backend", default="auto",
                   choices=("auto", "perf", "papi", "callgrind", "none"),
                   help="what counts the compute patterns (instructions, branch "
                   "mispredictions) after the memory ones: auto is perf or papi where the "
                   "PMU counts instructions, else callgrind; none skips them")
    p.add_argument("--geometry", help='cache geometry instead of the machine\'s, e.g. '
                   '"L1=48K/12/64,L2=2M/16/64,L3=32M/16/64"')
    p.add_argument("--banks", help="declared bank map BANKSxINTERLEAVE_BYTES (default: the "
                   "machine's: memory channels per NUMA node x nodes, on the interleave; "
                   "8x256 assumed on a one-node host)")
    p.add_argument("--machine", metavar="FILE",
                   help="machine description (TOML, see counterd/machine/files.py) instead of "
                   "sysfs; --geometry and --banks override it (default: $COUNTERD_MACHINE)")
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")


def _add_output(p: argparse.ArgumentParser) -> None:
    """--out, --force, --machine and --json, as every measuring command takes them."""
    p.add_argument("--out", required=True, help="results file to write (JSON)")
    p.add_argument("--force", action="store_true", help="overwrite an existing --out")
    p.add_argument("--machine", metavar="FILE",
                   help="machine description (TOML) instead of sysfs (default: "
                   "$COUNTERD_MACHINE)")
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="microbench", description="Calibration suite of Amato et al., "
                     "\"Predicting performance on SMPs\" (Table 1 generalised to this host, "
                     "plus a validation suite and compute patterns)")
    parser.add_argument("--version", action=VersionAction)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    ls = sub.add_parser("list", help="the patterns of this host, their count and the "
                        "estimated time of a run (with --machine FILE: of the node it "
                        "describes, at this host's speed)")
    _add_selection(ls)
    run = sub.add_parser("run", help="run patterns and write a results file")
    _add_selection(run)
    run.add_argument("--backend", default="auto", choices=BACKENDS,
                     help="what counts the memory patterns: auto is perf or papi where the "
                     "PMU has a load counter, else sim (every counter simulated from the "
                     "patterns' address streams); times are always measured")
    run.add_argument("--out", required=True,
                     help="results file to write (JSON; rewritten as patterns finish)")
    run.add_argument("--force", action="store_true", help="overwrite an existing --out")
    run.add_argument("--resume", action="store_true",
                     help="keep the finished patterns of an existing --out and run the rest")
    show = sub.add_parser("show", help="summarise a results file")
    show.add_argument("file")
    show.add_argument("--json", action="store_true")
    ml = sub.add_parser("memlogp", help="memory logP: copy, pack and unpack over message sizes "
                        "and strides (Cameron et al.)")
    ml.add_argument("--quick", action="store_true",
                    help="a few seconds: three sizes, two strides (for tests)")
    _add_output(ml)
    tr = sub.add_parser("transfer", help="row and column transfers between two processes "
                        "(Hur and Lin's memory-lines-touched benchmark): fit them with "
                        "predict mlt --results FILE")
    tr.add_argument("--cases", type=_positive, default=None,
                    help="messages per kind, rows and columns (default 300: the paper's 100 "
                    "for training and the rest for testing; --quick: 110)")
    tr.add_argument("--passes", type=_positive, default=None,
                    help="rounds over every case, each in a fresh random order; a case's "
                    "time is the median of its rounds (default 3; --quick: 1)")
    tr.add_argument("--d-dist", choices=("log", "uniform"), default="log",
                    help="how d, the rows or columns per message, is drawn in [1, 200]: "
                    "log-uniform (the default; half the messages at d <= 14) or uniform")
    tr.add_argument("--state", choices=("cold", "dirty"), default="cold",
                    help="before each exchange the source lines are flushed to memory (cold, "
                    "the default) or the owner stores over its whole block (dirty)")
    tr.add_argument("--seed", type=int, default=0, help="seed of the random cases (default 0)")
    tr.add_argument("--quick", action="store_true",
                    help="a few seconds: 110 cases per kind, sides up to 1000, one pass")
    _add_output(tr)
    return parser


def _cmd_transfer(args: argparse.Namespace) -> int:
    from pathlib import Path

    from microbench import transfer

    if Path(args.out).exists() and not args.force:
        raise BadInput(f"{args.out} exists", "give another --out, or --force to overwrite it")
    machine = host_machine()
    count = args.cases or (110 if args.quick else transfer.CASES)
    side = 1000 if args.quick else transfer.MAX_SIDE
    cases = transfer.interleave(*(transfer.sample(count, kind, seed=args.seed, max_side=side,
                                                  d_dist=args.d_dist)
                                  for kind in ("rows", "cols")))
    passes = args.passes or (1 if args.quick else transfer.PASSES)
    cfg = transfer.QUICK_CONFIG if args.quick else transfer.CONFIG
    progress = _Progress("transfers")
    t0 = time.monotonic()
    doc = transfer.measure(machine, cases, args.out, cfg=cfg, state=args.state, passes=passes,
                           config={"d_dist": args.d_dist, "max_side": side,
                                   "seed": args.seed},
                           progress=lambda done, total, name: progress(done, total, name,
                                                                        None))
    elapsed = time.monotonic() - t0
    flagged = sum(1 for c in doc["cases"] if c["flags"])
    if args.json:
        print(json.dumps({"out": args.out, "elapsed_s": round(elapsed, 1),
                          "cases": len(doc["cases"]), "flagged": flagged}))
    else:
        print(f"{len(doc['cases'])} transfers ({count} rows, {count} columns; {passes} "
              f"pass{'es' if passes > 1 else ''}) in {elapsed:.0f} s, {flagged} flagged; "
              f"wrote {args.out} (fit it: predict mlt --results {args.out})")
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    machine = _machine(args, planned=True)
    pats = _patterns(args, machine)
    est, speeds, why = None, None, "no patterns"
    if pats:
        try:
            est, speeds = _estimate(args, machine, pats)
        except BackendUnavailable as exc:  # no native kernels: the listing still stands
            why = str(exc)
    if args.json:
        print(json.dumps({"count": len(pats), "suite": args.suite, "quick": args.quick,
                          "cpus": machine.max_procs, "machine": machine.name,
                          **machine.to_json(),
                          "estimate": est.to_json() if est else None,
                          **({} if est else {"no_estimate": why}),
                          "speeds": speeds.to_json() if speeds else None,
                          "patterns": [p.to_json() for p in pats]}, indent=1))
        return 0
    print(f"{'mnemonic':28} {'suite':10} {'level':5} {'accesses':>10} {'span':>10}  banks")
    for p in pats:
        banks = ("/".join("".join(str(b) for b in sorted(s)) for s in p.banks)
                 if p.level == "mem" else "-")
        print(f"{p.mnemonic:28} {p.suite:10} {p.level:5} {p.accesses_per_proc:>10} "
              f"{_size(p.span_bytes):>10}  {banks}")
    by_suite = {s: sum(1 for p in pats if p.suite == s) for s in ("table1", "validation")}
    where = "on this host" if machine.name == "host" else f"on {machine.name}"
    print(f"{len(pats)} patterns {where} ({machine.max_procs} CPUs, "
          f"{machine.geometry.spec()}, banks {machine.bank_map.banks} x "
          f"{machine.bank_map.interleave_bytes} B {machine.bank_provenance.split(':')[0]}): "
          + ", ".join(f"{k} {v}" for k, v in by_suite.items() if v))
    if est is not None and speeds is not None:
        counts = sorted({p.procs for p in pats})
        print(f"processors {', '.join(map(str, counts))}; shared-data patterns up to "
              f"{args.coherent_procs} (--coherent-procs)")
        print(describe(est, speeds) + ("" if machine.name == "host" else
                                       ", at this host's speed"))
        for note in speeds.notes:
            print(f"  note: {note}")
    else:
        print(f"no run-time estimate: {why}")
    return 0


def _size(n: int) -> str:
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return f"{n}B"


class _Progress:
    """Progress on stderr: a bar redrawn in place on a terminal; in a log (not a terminal),
    one plain line per tenth of the patterns, and one when they are done."""

    WIDTH = 30

    def __init__(self, noun: str = "patterns", preface: str | None = None) -> None:
        self.tty = sys.stderr.isatty()
        self.last = -1
        self.noun = noun
        self.preface = preface  # one line before the first report (once the run has started)

    def __call__(self, done: int, total: int, mnemonic: str, eta: float | None) -> None:
        if self.preface is not None:
            print(f"microbench: {self.preface}", file=sys.stderr, flush=True)
            self.preface = None
        if not self.tty:
            if done == total or (done and done % max(1, total // 10) == 0 and done != self.last):
                left = f", about {eta:.0f} s left" if eta is not None and done < total else ""
                print(f"microbench: {done}/{total} {self.noun}{left}; {mnemonic}",
                      file=sys.stderr, flush=True)
                self.last = done
            return
        filled = int(self.WIDTH * done / total) if total else self.WIDTH
        eta_text = f"{eta:5.0f}s left" if eta is not None else "   ...    "
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (self.WIDTH - filled)}] {done}/{total} "
                         f"{eta_text} {mnemonic:32.32}")
        sys.stderr.flush()
        if done == total:
            sys.stderr.write("\n")


def _cmd_run(args: argparse.Namespace) -> int:
    machine = _machine(args)
    pats = _patterns(args, machine)
    if not pats:
        raise BadInput("no pattern matches the selection", "see microbench list")
    # the output file is checked before the estimate probes this host (seconds)
    prior_document(Path(args.out), machine, suite=args.suite, force=args.force,
                   resume=args.resume)
    t0 = time.monotonic()
    est, speeds = _estimate(args, machine, pats)
    doc = run_suite(machine, pats, args.out, suite=args.suite, cfg=QUICK if args.quick else NORMAL,
                    backend=args.backend, force=args.force, resume=args.resume,
                    quick=args.quick, compute_backend=args.compute_backend,
                    progress=_Progress(preface=f"{len(pats)} patterns; "
                                       f"{describe(est, speeds)}"), estimate=est,
                    sampling=_sampling(args, machine))
    elapsed = time.monotonic() - t0
    summary = results.summary(doc)
    if args.json:
        print(json.dumps({"out": args.out, "elapsed_s": round(elapsed, 1), **summary}))
    else:
        print(f"{summary['patterns']} patterns in {elapsed:.0f} s, backend {doc['backend']}, "
              f"median spread {summary['median_spread']:.3f}; flagged: "
              + (", ".join(f"{k} {v}" for k, v in summary["flags"].items()) or "none")
              + f"; wrote {args.out}")
    return 0


def _fmt(v: float | None) -> str:
    return f"{v:8.2f}" if v is not None else "       -"


def _cmd_show(args: argparse.Namespace) -> int:
    doc = results.load(args.file)
    summary = results.summary(doc)
    cols_a, tab_a, cols_b, tab_b = results.figure1_tables(doc)
    if args.json:
        print(json.dumps({**summary, "backend": doc["backend"], "suite": doc["suite"],
                          "patterns": [{"mnemonic": p["mnemonic"], "level": p["level"],
                                        "per_access_ns": p["per_access_ns"],
                                        "spread": p["time_ns"]["spread"], "flags": p["flags"]}
                                       for p in doc["patterns"]],
                          "figure1": {"vs_bkc": tab_a, "vs_procs": tab_b}}, indent=1))
        return 0
    h = doc["host"]
    print(f"{args.file}: {doc['format']} v{doc['version']}, suite {doc['suite']}, backend "
          f"{doc['backend']}, {'complete' if doc.get('complete') else 'INCOMPLETE'}, "
          f"created {doc['created']}")
    print(f"host {h.get('hostname')}: {h.get('cpu_model')}, {h.get('cpus_online')} CPUs, "
          f"governor {h.get('governor')}, THP {h.get('hugepages')}; {doc['geometry']['spec']}; "
          f"banks {doc['bank_map']['banks']} x {doc['bank_map']['interleave_bytes']} B "
          f"({doc['bank_map']['provenance'].split(':')[0]})")
    mem = doc.get("memory")
    if isinstance(mem, dict):  # results written before it was recorded have none
        with contextlib.suppress(KeyError, TypeError):
            print(f"memory: {len(mem['numa_nodes']['value'])} NUMA node(s) "
                  f"({mem['numa_nodes']['provenance']}), "
                  f"{mem['channels_per_node']['value']} channels per node "
                  f"({mem['channels_per_node']['provenance']}), interleave "
                  f"{mem['interleave_bytes']['value']} B "
                  f"({mem['interleave_bytes']['provenance']}); ranks pinned to CPUs "
                  + ",".join(map(str, doc.get("rank_cpus", [])[:16])))
    print(f"{'mnemonic':28} {'level':5} {'ns/access':>10} {'spread':>7} {'reps':>4}  flags")
    for p in doc["patterns"]:
        print(f"{p['mnemonic']:28} {p['level']:5} {p['per_access_ns']:10.3f} "
              f"{p['time_ns']['spread']:7.3f} {p['time_ns']['reps']:4d}  "
              + ",".join(p["flags"]))
    print(f"{summary['patterns']} patterns, median spread {summary['median_spread']:.3f}")
    _show_compute(doc.get("compute") or {})
    print("\nFigure 1(a) of Amato et al., \"Predicting performance on SMPs\": ns per access of "
          "memory patterns against BKC (bank contention: active processors / banks touched)")
    print(f"{'':4}" + "".join(f"{c:>9}" for c in cols_a))
    for name, row in tab_a.items():
        print(f"{name:4}" + "".join(f" {_fmt(row[c])}" for c in cols_a))
    print("\nFigure 1(b): ns per access against active processors (BKC 1 or nearest)")
    print(f"{'':4}" + "".join(f"{c:>9}" for c in cols_b))
    for name, row in tab_b.items():
        print(f"{name:4}" + "".join(f" {_fmt(row[c])}" for c in cols_b))
    return 0


def _show_compute(comp: dict[str, Any]) -> None:
    pats = comp.get("patterns") or []
    if not comp:
        return
    if not pats:
        print(f"\ncompute patterns: none ({comp.get('reason', 'skipped')})")
        return
    print(f"\ncompute patterns, counted by {comp.get('backend')}:")
    print(f"{'mnemonic':34} {'time':>9} {'spread':>7} {'instructions':>14} "
          f"{'branch misses':>14} {'page faults':>11}")
    for p in pats:
        c = p["processors"][0]["counters"]
        counts = [f"{int(c[k]['value']):,}" if k in c else "-"
                  for k in ("instructions", "branch_misses", "page_faults")]
        print(f"{p['mnemonic']:34} {p['time_ns']['median'] / 1e6:7.3f}ms "
              f"{p['time_ns']['spread']:7.3f} {counts[0]:>14} {counts[1]:>14} {counts[2]:>11}")


def _cmd_memlogp(args: argparse.Namespace) -> int:
    from microbench import memlogp

    machine = host_machine()
    plan = memlogp.quick_plan(machine) if args.quick else memlogp.default_plan(machine)
    t0 = time.monotonic()
    doc = memlogp.measure(machine, plan, args.out, force=args.force)
    elapsed = time.monotonic() - t0
    flagged = sum(1 for p in doc["points"] if p["flags"])
    if args.json:
        print(json.dumps({"out": args.out, "elapsed_s": round(elapsed, 1),
                          "points": len(doc["points"]), "flagged": flagged,
                          "call_overhead_s": doc["call_overhead_ns"] / 1e9}))
    else:
        print(f"{len(doc['points'])} memory logP points ({plan.name} plan, {plan.rounds} "
              f"round{'s' if plan.rounds > 1 else ''}) in {elapsed:.0f} s, {flagged} flagged; "
              f"wrote {args.out} (fit it: predict memlogp --results {args.out})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if args.command == "show":
            return _cmd_show(args)
        if args.command == "memlogp":
            with using(args.machine):
                return _cmd_memlogp(args)
        if args.command == "transfer":
            with using(args.machine):
                return _cmd_transfer(args)
        with using(args.machine):
            return _cmd_list(args) if args.command == "list" else _cmd_run(args)
    except CounterdError as exc:
        print(f"microbench: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("\nmicrobench: interrupted; finished patterns are kept (rerun with --resume)",
              file=sys.stderr)
        return 1
    except BrokenPipeError:
        return closed_pipe()


if __name__ == "__main__":
    sys.exit(main())
