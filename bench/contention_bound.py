"""Where processors contend (issue 35 item 2): improved F on a node's validation patterns
beside the floor, candidate terms for coherence and contention fitted on the fitting patterns
only, and what the counts can explain at best (predictor/costs/floor.py ``explained``: F1's form
fitted on the very patterns it is judged on, a diagnostic, never a model).

    .venv/bin/python bench/contention_bound.py [--results FILE ...] [--host2 FILE] [--no-loo]

--results: microbench results of a many-core node, .json or .json.gz, one or more (e.g. the
16-CPU node's file and its re-simulations by bench/resimulate_node16.py); default the trimmed
copy in tests/predictor/data (it lacks the simulator's coherence counts, so the coherence
candidates are left out there). --host2: results of a 2-CPU host with validation patterns
(``microbench run --suite all --quick --compute-backend none``), judged the same way.
Nothing is timed here: the times are the files' own.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._host import guarded, host_line  # noqa: E402
from predictor.costs import costfuncs as cf  # noqa: E402
from predictor.costs import floor  # noqa: E402
from predictor.costs.calibrate import split_suites  # noqa: E402
from predictor.costs.costmodel import FModel  # noqa: E402
from predictor.costs.fit import ImprovedFit, base_f1_terms, default_optional_terms  # noqa: E402
from predictor.errors import BadInput  # noqa: E402
from predictor.inputs import Results, Step, miss_counter, results_from_json  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
NODE16 = ROOT / "tests" / "predictor" / "data" / "node16-all-quick.json.gz"
TARGET = (1.25, 2.0)


def _doc(path: Path) -> dict[str, Any]:
    try:
        raw = path.read_bytes()
        doc = json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)
    except (OSError, EOFError, ValueError) as exc:
        raise BadInput(f"cannot read {path} ({exc})",
                       "give microbench results, .json or .json.gz") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("patterns"), list):
        raise BadInput(f"{path} is not a microbench results object", "give microbench results")
    return doc


def _with_sim_counts(r: Results, doc: dict[str, Any]) -> tuple[list[Step], bool]:
    """The steps with the simulator's per-rank coherence counts as inputs ``coh`` (fills
    served by another core's copy) and ``inv`` (copies invalidated), ``p`` (active
    processors), ``sharers`` (processors on the same data) and ``shared`` (1 where
    another processor works on the same data): exploration inputs, not
    canonical counters (no recorded program has them). False when the file lacks them."""
    raw = {q.get("mnemonic"): q for q in doc["patterns"] if isinstance(q, dict)}
    out, have = [], False
    for s in r.patterns:
        q = raw.get(s.name) or {}
        n = s.processors
        coh = ((q.get("sim") or {}).get("coherence") or {})
        have = have or bool(coh)
        bases = q.get("bases_bytes") or []
        share = Counter(bases)
        sharers = (np.array([float(share[b]) for b in bases]) if len(bases) == n
                   else np.ones(n))
        extra = {"coh": np.array(coh.get("coherence_misses") or [0] * n, float),
                 "inv": np.array(coh.get("invalidations") or [0] * n, float),
                 "p": np.full(n, float(q.get("procs") or n)), "sharers": sharers,
                 "shared": (sharers > 1).astype(float)}
        out.append(dataclasses.replace(s, counters={**s.counters, **extra}))
    return out, have


def _e(model: FModel, steps: Sequence[Step]) -> np.ndarray:
    t = np.array([float(s.time_ns or 0) for s in steps])
    return np.asarray(cf.error_ratio(t, model.predict(steps)))


def _row(label: str, fe: np.ndarray | None, ve: np.ndarray, worst: str) -> None:
    f = f"{fe.mean():>6.2f} {fe.max():>6.2f}" if fe is not None else f"{'-':>6} {'-':>6}"
    print(f"  {label:<62} {f}   {ve.mean():>6.2f} {ve.max():>6.2f}  {worst}")


def _no_writebacks(levels: Sequence[int]) -> list[str]:
    """F1's default terms without the writebacks (they stay in F2 and F3: bandwidth)."""
    return [str(x) for x in base_f1_terms(levels) if "writebacks" not in str(x)]


def judge(path: Path, r: Results, steps: list[Step], have_coh: bool, loo: bool = True
          ) -> None:
    fit, val = split_suites(steps)
    if not val:
        raise BadInput(f"{path}: no validation patterns", "give results of --suite all")
    P, banks = r.processors, int(r.bank_map.get("banks") or 1)
    lv = r.levels
    miss = [miss_counter(x) for x in lv]
    print(f"\n== {path.name}: {r.host.get('cpus_online')} CPUs, {len(fit)} fitting and "
          f"{len(val)} validation patterns (target improved F on validation avg <= "
          f"{TARGET[0]}, max <= {TARGET[1]})")
    fl = floor.for_validation(r)
    print(f"  {'':<62} {'fitting':>13}   {'validation':>13}")
    print(f"  {'':<62} {'avg':>6} {'max':>6}   {'avg':>6} {'max':>6}  worst validation")

    def fitted(label: str, opt: Sequence[str] | None, select: str | None = None,
               base: list[str] | None = None) -> None:
        f = ImprovedFit(levels=lv, processors=P, banks=banks, optional_terms=opt,
                        select=select, base_terms=base).fit(fit)
        ve = _e(f.model_, val)
        _row(label, _e(f.model_, fit), ve, val[int(np.argmax(ve))].name)

    fitted("improved F today (the default; fitted on fitting patterns)", None, "brewer")
    if fl:
        _row("noise floor (halves of one run, predictor/costs/floor.py)", None,
             np.array(fl.e), fl.worst(1)[0][0])
    print("  candidates fitted on the fitting patterns only (all kept, unless a toolkit "
          "choice); last, the\n  others' read-modify-writes added to the fitting patterns:")
    rfo = [f"rfo:{m}" for m in miss]
    stream = [f"stream:{m}" for m in miss]
    nowb = _no_writebacks(lv)
    rows: list[tuple[str, list[str], list[str] | None]] = [
        ("+ max(loads,stores) (load and store of an element overlap)",
         ["max(loads,stores)"], None),
        ("writebacks off the critical path: rfo:<misses> in F1 instead", rfo + stream,
         nowb),
    ]
    if have_coh:
        rows += [
            ("+ coh, inv (coherence fills, invalidations per processor)", ["coh", "inv"], None),
            ("+ coh, coh*p (coherence fill cost growing with p)", ["coh", "coh*p"], None),
            ("+ coh*sharers (growing with the processors on a line)", ["coh", "coh*sharers"],
             None),
            ("rfo for writebacks, max(loads,stores), coh, coh*p",
             ["max(loads,stores)", *rfo, *stream, "coh", "coh*p"], nowb),
        ]
    for label, opt, base in rows:
        fitted("  " + label, opt, None, base)
    offered = [str(x) for x in default_optional_terms(lv)] + [
        "max(loads,stores)", *rfo, *(["coh", "inv", "coh*p", "coh*sharers"] if have_coh else [])]
    for how in ("brewer", "cv"):
        fitted(f"  toolkit's choice ({'t-tests' if how == 'brewer' else 'cross-validation'}:"
               " defaults and these)", offered, how)
    # What fitting patterns that mix loads and stores would buy: each validation pattern
    # predicted by a fit on the fitting patterns and the other validation patterns.
    loo_terms = ["max(loads,stores)", *rfo, f"stream:{miss[-1]}"]
    t = np.array([float(s.time_ns or 0) for s in val])
    for label, opt in (("today's terms and stream", [f"stream:{miss[-1]}"]),
                       ("with overlap and rfo", loo_terms)) if loo else ():
        pred = [ImprovedFit(levels=lv, processors=P, banks=banks, optional_terms=opt,
                            select=None).fit([*fit, *val[:i], *val[i + 1:]]).model_.predict(
                                [val[i]])[0] for i in range(len(val))]
        ve = np.asarray(cf.error_ratio(t, np.array(pred)))
        _row(f"  leave one validation pattern out, {label}", None, ve,
             val[int(np.argmax(ve))].name)

    today = [str(x) for x in base_f1_terms(lv)]
    wb_last = f"{miss[-1].removesuffix('_misses')}_writebacks"
    rich = [*today, "max(loads,stores)", "stores", *rfo, *stream, "dtlb_misses",
            f"p*{miss[-1]}", f"p*{wb_last}", "dtlb_misses*p"]
    if have_coh:
        rich += ["coh", "inv", "coh*p", "coh*sharers", "dtlb_misses*shared"]
    print("  what the counts explain at best (F1's form fitted on the patterns it is judged "
          "on; least average E):")
    for label, terms in ((f"today's F1 terms ({len(today)})", today),
                         (f"{len(rich)} terms: today's, overlap, rfo, stream, TLB, "
                          "p, coherence", rich)):
        ef, ev = floor.explained(fit, terms), floor.explained(val, terms)
        _row("  " + label, np.array(ef.e), np.array(ev.e), ev.worst(1)[0][0])


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--results", type=Path, action="append",
                    help="a many-core node's microbench results (.json or .json.gz); "
                         "repeatable (default: the trimmed 16-CPU node copy)")
    ap.add_argument("--host2", type=Path, help="a 2-CPU host's results with validation "
                    "patterns, judged the same way")
    ap.add_argument("--no-loo", action="store_true", help="leave out the leave-one-out rows "
                    "(a fit per validation pattern: minutes where there are hundreds)")
    a = ap.parse_args()
    files = [*(a.results or [NODE16]), *([a.host2] if a.host2 else [])]
    docs = [(p, _doc(p)) for p in files]  # bad input said before any work
    print(host_line())
    for path, doc in docs:
        r = results_from_json(doc, str(path))
        steps, have = _with_sim_counts(r, doc)
        judge(path, r, steps, have, loo=not a.no_loo)
    return 0


if __name__ == "__main__":
    sys.exit(guarded(main))
