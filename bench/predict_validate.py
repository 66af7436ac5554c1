"""Calibrate every cost function on microbench results and print the paper-style validation
table (seed 004 section 5.1: function, average error, maximum error, E = max(T,P)/min(T,P))
on the validation patterns held apart from the fitting ones.

    .venv/bin/python bench/predict_validate.py [RESULTS.json] [--out PROFILE.toml]
    .venv/bin/python bench/predict_validate.py --synthetic     # no microbench results needed

Default RESULTS: out/microbench-all.json (``microbench run --suite all``). ``--synthetic``
generates results from known coefficients (predictor/synthetic.py, 2 % log-normal noise, a
per-superstep constant and a TLB term the paper's F lacks) to show the machinery works; its
figures say nothing about this host. Target on a host's validation patterns: improved F
average error <= 1.10, maximum <= 1.50.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._host import host_line  # noqa: E402
from predictor.cli import render_validation  # noqa: E402
from predictor.costs import floor  # noqa: E402
from predictor.costs.calibrate import calibrate, validate  # noqa: E402
from predictor.costs.profile import save_profile  # noqa: E402
from predictor.errors import PredictorError  # noqa: E402
from predictor.inputs import load_results, results_from_json  # noqa: E402
from predictor.synthetic import make_results, reference_model  # noqa: E402

DEFAULT = Path(__file__).resolve().parent.parent / "out" / "microbench-all.json"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="?", type=Path, default=DEFAULT)
    ap.add_argument("--synthetic", action="store_true", help="use synthetic results")
    ap.add_argument("--out", type=Path, default=None, help="also keep the fitted profile here")
    ap.add_argument("--floor", type=Path, default=None, metavar="RESULTS2",
                    help="a second run of the validation suite: the noise floor between runs "
                    "(default: between halves of each pattern's repetitions)")
    ap.add_argument("--select", choices=("brewer", "cv", "both"), default="both",
                    help="how the improved F's extra terms are chosen: t-tests at 95%% (seed "
                    "003), cross-validation, or both side by side (the default)")
    a = ap.parse_args()
    print(host_line())
    try:
        if a.synthetic:
            truth = reference_model(levels=(1, 2, 3), processors=2, banks=8, dtlb=30.0,
                                    const=1500.0)
            results = results_from_json(make_results(truth, processors=2, noise=0.02, seed=7),
                                        "<synthetic: reference_model, 2% noise>")
        else:
            results = load_results(a.results)
        print(f"results {results.path}: backend {results.backend}, {len(results.patterns)} "
              f"patterns, {results.processors} processors, levels {results.levels}, "
              f"{results.bank_map.get('banks', '?')} banks")
        t0 = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            profile = calibrate(results, select="cv" if a.select == "cv" else "brewer")
            fit_s = time.perf_counter() - t0
            table = validate(results, profile)
            other = (validate(results, calibrate(results, select="cv"))
                     if a.select == "both" else None)
        for w in caught:
            print(f"warning: {w.message}")
    except PredictorError as exc:
        print(f"predict_validate: {exc}", file=sys.stderr)
        if not a.synthetic and not Path(a.results).exists():
            print("(no microbench results yet: run `microbench run --suite all --out "
                  f"{DEFAULT}`, or pass --synthetic)", file=sys.stderr)
        return 2
    imp = profile.models["improved"]
    print(f"calibration: {fit_s:.2f} s; improved F terms: {', '.join(imp['terms'])}; terms "
          f"decided by {imp['selection']['decided_by']}; dropped: "
          + ("; ".join(f"{k} ({v})" for k, v in imp["selection"]["dropped"].items()) or "none")
          + f"; cv MRE {imp['diagnostics']['cv_mre']:.4f}")
    for name in ("paper", "improved"):
        m = profile.models[name]
        print(f"  F ({name}) coefficients, ns per event: const {m['const']:.4g}; F1 "
              + ", ".join(f"{k} {v:.4g}" for k, v in m["F1"].items())
              + "; F2 " + ", ".join(f"{k} {v:.4g}" for k, v in m["F2"].items())
              + "; F3 " + ", ".join(f"{k} {v:.4g}" for k, v in m["F3"].items()))
    print()
    nf = floor.for_validation(results, load_results(a.floor) if a.floor else None)
    print(render_validation(table, f"validation: {table.patterns} patterns held apart from "
                                   "the fit; E = max(T,P)/min(T,P)", nf))
    if other is not None:
        r = {r.function: r for r in other.rows}["F (improved)"]
        print(f"{'F (improved, terms by cv)':<14} {r.avg_error:>8.2f} "
              f"{r.max_error:>8.2f} {r.mre:>7.3f}  "
              + ", ".join(f"{n} ({e:.2f})" for n, e in r.limiting))
    row = {r.function: r for r in table.rows}["F (improved)"]
    ok = row.avg_error <= 1.10 and row.max_error <= 1.50
    print(f"\ntarget improved F avg <= 1.10 and max <= 1.50: {'met' if ok else 'NOT met'} "
          f"(avg {row.avg_error:.3f}, max {row.max_error:.3f})")
    if a.out:
        save_profile(profile, a.out, overwrite=True)
        print(f"profile written to {a.out}")
    else:
        with tempfile.TemporaryDirectory() as d:
            save_profile(profile, Path(d) / "p.toml")  # the profile must survive a round trip
    if "--json" in sys.argv:
        print(json.dumps(table.to_json()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
