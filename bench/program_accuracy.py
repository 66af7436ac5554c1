"""F on real programs: the shipped BSP programs (and four outside ones), superstep by superstep.

The Accuracy issue's third part: the cost function calibrated on the microbenchmarks (memory
patterns, and the compute patterns of microbench/compute.py) predicts the supersteps of
programs it never saw, from their counters:

* the shipped programs: the demo (examples/bsp_sum.py) and the three BSP sorts of Amato et
  al. (examples/bsp_sort.py radix, sample, column), at two sizes each, p = 2;
* four numpy/scipy programs outside the project (bench/pilot_programs.py), at two sizes.

Counters come from one Callgrind run per program and size (and, for the demo, whose markers
feed its address streams to the simulator, one run with the sim backend as well); times from
``--repeat`` timed runs, interleaved across programs so that a slow spell of the host falls on
all of them, run natively as the programs run without counterd (``--cpu-features native``, the
default, as ``predict --pilot``'s), or with ``--cpu-features as-counted`` with the CPU features
valgrind lacks (AVX-512) hidden from code dispatch (the code the counts describe). Per
superstep, E = max(T,P)/min(T,P) against the median time, for

* F (memory): the profile's memory model for the counters (improved.l1_llc under Callgrind,
  improved under sim),
* F (+compute): the same with the compute terms (improved.l1_llc.compute),
* the noise floor: E between the medians of the odd and the even timed runs.

T is the slowest processor's own time (begin to end of its marker, ``work``), the quantity F
models; ``--time span`` uses the superstep's span (first begin to last end), which also holds
the skew of the processors' starts after the barrier.

    .venv/bin/python bench/program_accuracy.py [--work DIR] [--profile P] [--repeat 10]
        [--only radix,...] [--time work|span] [--cpu-features native|as-counted] [--detail]
        [--json OUT]

Records are kept under --work (default out/program-accuracy, with -as-counted after it for
--cpu-features as-counted); a rerun measures only what is missing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._host import host_line  # noqa: E402
from bench.pilot_forecast import ensure_profile, log, other_case  # noqa: E402
from predictor.costs.costfuncs import error_ratio  # noqa: E402
from predictor.costs.profile import MachineProfile  # noqa: E402
from predictor.errors import PredictorError  # noqa: E402
from predictor.inputs import Step, load_counters  # noqa: E402
from predictor.pilot.campaign import TIMING_FEATURES, record_path, record_run  # noqa: E402

PY = sys.executable


@dataclass(frozen=True)
class Case:
    name: str
    template: str
    sizes: tuple[float, ...]
    backends: tuple[str, ...]  # counting sources
    shipped: bool


def cases() -> list[Case]:
    sort = f"{PY} {ROOT / 'examples' / 'bsp_sort.py'} {{algo}} --keys {{n}} -p 2"
    out = [Case("demo", f"{PY} {ROOT / 'examples' / 'bsp_sum.py'} {{n}} 2", (1e6, 4e6),
                ("callgrind", "sim"), True)]
    out += [Case(a, sort.replace("{algo}", a), (2e5, 5e5), ("callgrind",), True)
            for a in ("radix", "sample", "column")]
    for prog in ("fft", "dense", "sparse", "stats"):
        c = other_case(prog)
        out.append(Case(prog, c.template, (c.pilots[1], c.pilots[4]), ("callgrind",), False))
    return out


def measure(cs: Sequence[Case], work: Path, repeat: int, features: str) -> None:
    """Timed runs interleaved (repetition r of every case before r + 1), then counted runs."""
    for r in range(repeat):
        for c in cs:
            for n in c.sizes:
                out = record_path(work / c.name, "timed", n, r)
                if not out.exists():
                    out.parent.mkdir(parents=True, exist_ok=True)
                    log(f"{c.name} n = {n:g}: timed run {r + 1}/{repeat}")
                    record_run(c.template, n, "none", out, what="timed run",
                               cpu_features=features)
    for c in cs:
        for n in c.sizes:
            for b in c.backends:
                out = record_path(work / c.name, f"counted-{b}", n)
                if not out.exists():
                    out.parent.mkdir(parents=True, exist_ok=True)
                    log(f"{c.name} n = {n:g}: counted run ({b})")
                    record_run(c.template, n, b, out, what=f"counted run ({b})")


@dataclass
class Row:
    case: str
    n: float
    source: str
    step: str
    t_ns: float
    floor: float
    e: dict[str, float]  # model label -> E


MODELS = {"callgrind": (("F (memory)", "improved.l1_llc"),
                        ("F (+compute)", "improved.l1_llc.compute")),
          "sim": (("F (memory)", "improved"),)}


def _time(s: Step, how: str) -> float:
    return float(s.meta["work_ns"] if how == "work" else s.time_ns or 0)


def analyse(cs: Sequence[Case], work: Path, repeat: int, profile: MachineProfile,
            how: str) -> list[Row]:
    rows = []
    for c in cs:
        for n in c.sizes:
            timed = [load_counters(record_path(work / c.name, "timed", n, r))
                     for r in range(repeat)]
            for b in c.backends:
                counted = load_counters(record_path(work / c.name, f"counted-{b}", n))
                for i, s in enumerate(counted):
                    ts = [_time(t[i], how) for t in timed]
                    t = statistics.median(ts)
                    floor = float(error_ratio(statistics.median(ts[0::2]),
                                              statistics.median(ts[1::2])))
                    e = {}
                    for label, variant in MODELS[b]:
                        try:
                            p = profile.f_model(variant).predict([s])[0]
                        except PredictorError:
                            continue
                        e[label] = float(error_ratio(t, p))
                    rows.append(Row(c.name, n, b, s.name, t, floor, e))
    return rows


def _stats(es: Sequence[float]) -> str:
    a = np.asarray(es)
    return (f"{a.mean():6.2f} {np.median(a):6.2f} {a.max():7.2f} {np.mean(a <= 1.25):5.0%}"
            if a.size else f"{'-':>6} {'-':>6} {'-':>7} {'-':>5}")


def report(rows: Sequence[Row], cs: Sequence[Case], detail: bool) -> list[str]:
    labels = ["F (memory)", "F (+compute)", "floor"]
    head = (f"{'program':<10} {'n':>7} {'counts':<9} {'steps':>5} | "
            + " | ".join(f"{lab + ': avg   med     max  <=1.25':<33}" for lab in labels))
    lines = [head]

    def block(sel: list[Row], name: str, n: str, src: str) -> str:
        cols = []
        for lab in labels:
            es = [r.floor for r in sel] if lab == "floor" else [r.e[lab] for r in sel
                                                                if lab in r.e]
            cols.append(f"{'':>12}{_stats(es)}")
        return f"{name:<10} {n:>7} {src:<9} {len(sel):>5} | " + " | ".join(cols)

    for c in cs:
        for n in c.sizes:
            for b in c.backends:
                sel = [r for r in rows if (r.case, r.n, r.source) == (c.name, n, b)]
                lines.append(block(sel, c.name, f"{n:g}", b))
                if detail:
                    for r in sel:
                        es = "  ".join(f"{k} {v:.2f}" for k, v in r.e.items())
                        lines.append(f"    {r.step:<32} T {r.t_ns / 1e6:8.3f} ms  {es}  "
                                     f"floor {r.floor:.2f}")
    for what, keep in (("shipped, callgrind", lambda c: c.shipped),
                       ("others, callgrind", lambda c: not c.shipped)):
        names = {c.name for c in cs if keep(c)}
        sel = [r for r in rows if r.case in names and r.source == "callgrind"]
        if sel:
            lines.append(block(sel, "all", "", what.split(",")[0]))
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=None,
                    help="where records are kept (default out/program-accuracy)")
    ap.add_argument("--profile", help="machine profile (default: calibrate the quick suite "
                    "into --work, as make demo does)")
    ap.add_argument("--repeat", type=int, default=10, help="timed runs per program and size")
    ap.add_argument("--only", default="", help="comma-separated program names")
    ap.add_argument("--time", choices=("work", "span"), default="work")
    ap.add_argument("--cpu-features", choices=TIMING_FEATURES, default="native",
                    help="how the timed runs run (default native, as the programs run without "
                    "counterd; as-counted: AVX-512 hidden, the code Callgrind counts)")
    ap.add_argument("--detail", action="store_true", help="every superstep")
    ap.add_argument("--json", type=Path, help="write the rows here")
    a = ap.parse_args(argv)
    if a.repeat < 2:
        ap.error("--repeat must be at least 2 (the floor compares halves)")
    cs = [c for c in cases() if not a.only or c.name in a.only.split(",")]
    a.work = a.work or ROOT / "out" / ("program-accuracy"
                                       + ("-as-counted" if a.cpu_features == "as-counted" else ""))
    a.work.mkdir(parents=True, exist_ok=True)
    profile = ensure_profile(a.profile, a.work)
    measure(cs, a.work, a.repeat, a.cpu_features)
    rows = analyse(cs, a.work, a.repeat, profile, a.time)
    print(host_line())
    how = ("AVX-512 hidden as under valgrind" if a.cpu_features == "as-counted"
           else "native, as the programs run without counterd")
    print(f"profile {profile.name}; {a.repeat} timed runs per program and size (interleaved, "
          f"{how}); T = median {a.time} time; E per superstep")
    print("\n".join(report(rows, cs, a.detail)))
    if a.json:
        a.json.write_text(json.dumps([r.__dict__ for r in rows], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
