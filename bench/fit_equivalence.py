"""Do two revisions fit the same models? The improved F and the toolkit's linear searches, side
by side on the calibration fixtures the tests use.

For each fixture -- synthetic results (paper form, with a constant and a TLB term, 2 and 16
processors, three cache levels, a contended 16-processor node), the 16-CPU node's measured
suite (tests/predictor/data), and ``--results`` files if given -- this tree and ``--against
REV`` (a commit, tag or ``HEAD~1``; only its ``predictor`` and ``counterd`` Python sources)
each fit ``ImprovedFit`` under every search (``brewer``, ``cv``, none; default and three
optional terms; too few patterns for a t-test; a counter set without writebacks), calibrate
whole profiles (every counter set, their accuracy refits), and fit the linear toolkit with
every modeler. The script prints how many results differ in anything but a float (terms,
dropped terms, reasons, who decided, dominating terms) and the largest relative difference of
a float (coefficients, cross-validated MREs), with where it is.

    .venv/bin/python bench/fit_equivalence.py --against main [--results out/quick.json]

Written for the change that made ImprovedFit's term search the toolkit's (issue 30): a
restructuring must give 0 differences.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
NODE16 = ROOT / "tests" / "predictor" / "data" / "node16-all-quick.json.gz"


# -- one revision's fits (run with that revision first on PYTHONPATH) ------------------------

def _improved(est: Any) -> dict[str, Any]:
    m = est.model_
    return {"f1": {str(k): v for k, v in m.f1.items()},
            "f2": {str(k): v for k, v in m.f2.items()},
            "f3": {str(k): v for k, v in m.f3.items()}, "const": m.const,
            "terms": [str(t) for t in est.terms_], "dropped": [str(t) for t in est.dropped_],
            "reasons": {str(k): v for k, v in est.reasons_.items()},
            "decided_by": est.decided_by_, "cv_mre": est.cv_mre_,
            "dominant": [int(x) for x in est.dominant_]}


def dump(results: list[str]) -> dict[str, Any]:
    import numpy as np

    from predictor.costs.calibrate import calibrate, split_suites
    from predictor.costs.fit import ImprovedFit
    from predictor.inputs import load_results, miss_counter, results_from_json
    from predictor.synthetic import contended_model, make_results, reference_model
    from predictor.toolkit.model import fit_model

    def models(prof: Any) -> Any:
        return json.loads(json.dumps(prof.models, default=str))

    syn = {
        "const-dtlb": results_from_json(make_results(
            reference_model(dtlb=40.0, const=2000.0), noise=0.01, seed=3)),
        "const": results_from_json(make_results(reference_model(const=3000.0), noise=0.01,
                                                seed=5)),
        "p2": results_from_json(make_results(reference_model(processors=2), processors=2)),
        "contended-p16": results_from_json(make_results(contended_model(processors=16),
                                                        processors=16, banks=8)),
    }
    node16 = results_from_json(json.loads(gzip.decompress(NODE16.read_bytes())), str(NODE16))
    out: dict[str, Any] = {}
    cases: list[tuple[str, Any, dict[str, Any]]] = []
    for key, r in [*syn.items(), ("node16", node16)]:
        fit, _ = split_suites(r.patterns)
        machine = {"levels": r.levels, "processors": r.processors, "banks": 8}
        for sel in ("brewer", "cv", None):
            cases.append((f"{key}/{sel}", fit, {**machine, "select": sel}))
            cases.append((f"{key}/{sel}/three", fit, {
                **machine, "select": sel, "optional_terms": ["const", "dtlb_misses", "stores"]}))
        cases.append((f"{key}/brewer/few", fit[:14], machine))
        cases.append((f"{key}/brewer/misses", fit, {**machine, "counters": [
            "loads", "stores", *map(miss_counter, r.levels)]}))
    for name, steps, kw in cases:
        try:
            out[name] = _improved(ImprovedFit(**kw).fit(steps))
        except Exception as e:  # noqa: BLE001 - an error is a result to compare too
            out[name] = {"error": f"{type(e).__name__}: {e}"}
    out["calibrate/const"] = models(calibrate(syn["const"]))
    out["calibrate/node16"] = models(calibrate(node16))
    for path in results:
        out[f"calibrate/{path}"] = models(calibrate(load_results(path)))
    rng = np.random.default_rng(1)
    n = np.linspace(10.0, 100.0, 30)
    y = (5.0 + 2.0 * n + 0.01 * n ** 2) * np.exp(rng.normal(0, 0.02, n.size))
    for modeler in ("brewer", "cv", "single", "fixed"):
        for k, terms in ((30, ["1", "n", "n^2", "n^3", "log(n)"]), (6, ["1", "n", "n^2", "n^3"])):
            m = fit_model(terms, {"n": n[:k]}, y[:k], modeler=modeler,
                          nonnegative=modeler != "single")
            out[f"linear/{modeler}/{k}"] = m.to_dict()
    return out


# -- the comparison ----------------------------------------------------------------------------

def compare(a: Any, b: Any) -> tuple[list[str], float, str]:
    """(differences other than in floats, the largest relative float difference, where)."""
    other: list[str] = []
    worst = [0.0, "-"]

    def walk(x: Any, y: Any, at: str) -> None:
        if isinstance(x, dict) and isinstance(y, dict):
            other.extend(f"{at}/{k}: only in one" for k in sorted(set(x) ^ set(y)))
            for k in sorted(set(x) & set(y)):
                walk(x[k], y[k], f"{at}/{k}")
        elif isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
            for i, (u, v) in enumerate(zip(x, y, strict=True)):
                walk(u, v, f"{at}[{i}]")
        elif (isinstance(x, float) and isinstance(y, int | float)
              or isinstance(y, float) and isinstance(x, int | float)):
            if x != y and not (math.isnan(x) and math.isnan(y)):
                d = abs(x - y) / max(abs(x), abs(y))
                if not d <= worst[0]:
                    worst[:] = [d, at]
        elif x != y:
            other.append(f"{at}: {x!r} != {y!r}")

    walk(a, b, "")
    return other, float(worst[0]), str(worst[1])


def _run(pythonpath: Path, results: list[str], out: Path) -> Any:
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    subprocess.run([sys.executable, __file__, "--dump", str(out), *sum(
        (["--results", r] for r in results), [])], env=env, check=True)
    return json.loads(out.read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against", metavar="REV", help="the revision to compare with")
    ap.add_argument("--results", action="append", default=[], metavar="PATH",
                    help="also calibrate these microbench results (repeatable)")
    ap.add_argument("--dump", metavar="OUT", help=argparse.SUPPRESS)
    a = ap.parse_args()
    results = [str(Path(r).resolve()) for r in a.results]
    if a.dump:
        Path(a.dump).write_text(json.dumps(dump(results), default=str))
        return 0
    if not a.against:
        print("fit_equivalence.py: --against REV is required (e.g. --against main)",
              file=sys.stderr)
        return 2
    for r in results:
        if not Path(r).is_file():
            print(f"fit_equivalence.py: no results file {r}", file=sys.stderr)
            return 2
    sys.path.insert(0, str(ROOT))
    from bench._host import host_line

    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "against"
        old.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", a.against, "predictor",
                                  "counterd"], capture_output=True)
        if archive.returncode:
            print(f"fit_equivalence.py: cannot export {a.against}: "
                  f"{archive.stderr.decode().strip()}", file=sys.stderr)
            return 2
        subprocess.run(["tar", "-x", "-C", str(old)], input=archive.stdout, check=True)
        before = _run(old, results, Path(tmp) / "before.json")
        after = _run(ROOT, results, Path(tmp) / "after.json")
    other, worst, where = compare(before, after)
    print(host_line())
    print(f"{len(after)} results against {a.against}: {len(other)} differ in other than a "
          f"float; largest relative float difference {worst:.3g} (at {where})")
    for line in other[:20]:
        print("  " + line)
    return 1 if other else 0


if __name__ == "__main__":
    raise SystemExit(main())
