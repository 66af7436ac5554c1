"""The three things ``predict`` does, as library calls that return data (never print):

- :func:`calibrate`: microbench results -> MachineProfile (both the paper's and the improved
  fit, BSP min/max, diagnostics, provenance);
- :func:`validate`: the paper's accuracy table (seed 004 section 5.1) on the validation
  patterns held apart from the fitting patterns;
- :func:`forecast`: per superstep F1, F2, F3, F, the dominating term, every BSP bound and,
  where a time was measured, the error ratio.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from predictor import costfuncs as cf
from predictor import terms as tm
from predictor.errors import BadInput, InsufficientPatterns
from predictor.fit import fit_all, split_suites
from predictor.inputs import Results, Step
from predictor.model import ASSUMPTIONS, BSP_FUNCTIONS, bsp_quantities
from predictor.profile import MachineProfile, caches_spec, check_host, new_profile


def results_host(results: Results) -> dict[str, Any]:
    """The fingerprint of the host the results were measured on."""
    h = results.host
    return {"hostname": h.get("hostname"), "cpu_model": h.get("cpu_model"),
            "cpus_online": h.get("cpus_online"), "page_bytes": h.get("page_bytes"),
            "caches": caches_spec(results.geometry.get("levels", []))}


def calibrate(results: Results, *, name: str | None = None, folds: int = 5,
              tol: float = 0.02, seed: int = 0) -> MachineProfile:
    levels = results.levels
    if not levels:
        raise BadInput(f"{results.path}: no cache geometry (geometry.levels)",
                       "the microbench results must describe the caches they ran on")
    P = results.processors
    banks = int(results.bank_map.get("banks") or 1)
    fits = fit_all(results.patterns, levels=levels, processors=P, banks=banks, folds=folds,
                   tol=tol, seed=seed)
    paper, improved, diag = fits["paper"], fits["improved"], fits["diagnostics"]
    fit_names = [s.name for s in split_suites(results.patterns)[0]]
    models = {
        "paper": {**paper.model_.to_dict(), "patterns": paper.patterns_,
                  "diagnostics": diag["paper"]},
        "improved": {**improved.model_.to_dict(),
                     "terms": improved.terms_, "dropped_terms": improved.dropped_,
                     "selection": [f"{t}: cv_mre {s:.4f}" for t, s in improved.selection_.history],
                     "patterns": {"F": fit_names}, "diagnostics": diag["improved"]},
    }
    host = results_host(results)
    return new_profile(
        name or f"{host.get('hostname') or 'host'}-{results.backend}",
        host={k: v for k, v in host.items() if v is not None},
        geometry=results.geometry,
        bank_map=results.bank_map or {"banks": 1, "provenance": "none given: one bank"},
        processors=P, word_bytes=results.word_bytes, llc_level=max(levels),
        models=models, bsp=paper.bsp_.to_dict(),
        notes=(f"fitted on {len(fit_names)} patterns of {results.path} "
               f"(backend {results.backend})",))


# -- validation -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Row:
    function: str
    avg_error: float
    max_error: float
    mre: float
    limiting: tuple[tuple[str, float], ...]  # the worst patterns and their E


@dataclass(frozen=True)
class ValidationTable:
    rows: tuple[Row, ...]
    patterns: int
    differences: tuple[str, ...]  # fingerprint fields that differ (profile vs results)

    def to_json(self) -> dict[str, Any]:
        return {"patterns": self.patterns, "host_differences": list(self.differences),
                "rows": [{"function": r.function, "avg_error": r.avg_error,
                          "max_error": r.max_error, "mre": r.mre,
                          "limiting": [{"pattern": n, "error": e} for n, e in r.limiting]}
                         for r in self.rows]}


def _row(name: str, t: np.ndarray, p: np.ndarray, names: Sequence[str], worst: int) -> Row:
    e = cf.error_ratio(t, p)
    order = np.argsort(-e)[:worst]
    return Row(name, float(e.mean()), float(e.max()), tm.mre(t, p),
               tuple((names[i], float(e[i])) for i in order))


def validate(results: Results, profile: MachineProfile, *, worst: int = 3) -> ValidationTable:
    """E = max(T, P) / min(T, P) on the validation suite (seed 004 section 5.1 layout)."""
    diffs = check_host(profile, results_host(results))
    _, val = split_suites(results.patterns)
    val = [s for s in val if s.time_ns]
    if not val:
        raise InsufficientPatterns("a validation table", "validation patterns with times "
                                   "(suite 'validation'), held apart from the fitting ones")
    t = np.array([float(s.time_ns or 0) for s in val])
    names = [s.name for s in val]
    bsp = profile.bsp_model()
    b = [bsp.evaluate(s) for s in val]
    rows = [_row(f"{fn}-{bound.upper()}", t, np.array([x[f"{fn}_{bound}"] for x in b]), names,
                 worst)
            for fn in BSP_FUNCTIONS for bound in ("min", "max")]
    for variant in ("paper", "improved"):
        if variant in profile.models:
            rows.append(_row(f"F ({variant})", t, profile.f_model(variant).predict(val), names,
                             worst))
    return ValidationTable(tuple(rows), len(val), tuple(diffs))


# -- forecasts for recorded supersteps --------------------------------------------------------

def forecast(profile: MachineProfile, steps: Sequence[Step], *, variant: str | None = None
             ) -> list[dict[str, Any]]:
    """One dict per superstep: F terms, the dominating one, every BSP bound, the quantities
    used (with what was assumed) and, where the time is known, E."""
    model = profile.f_model(variant)
    bsp = profile.bsp_model()
    out = []
    for s in steps:
        br = model.evaluate(s)
        q = bsp_quantities(s, profile.banks)
        row: dict[str, Any] = {
            "superstep": s.name, "processors": s.processors, "F1_ns": br.f1, "F2_ns": br.f2,
            "F3_ns": br.f3, "const_ns": br.const, "F_ns": br.f, "dominant": br.dominant,
            "F1_rank": br.f1_rank, "F3_bank": br.f3_bank,
            "H": q.h, "M": q.m, "K": q.k, "M_b": q.m_b,
            **{f"{k}_ns": v for k, v in bsp.evaluate(s).items()},
            "assumed": sorted({*br.assumed, *q.assumed}),
            "time_ns": s.time_ns,
            "error": (float(cf.error_ratio(s.time_ns, br.f)) if s.time_ns else None),
        }
        out.append(row)
    return out


def assumptions_used(rows: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    used = sorted({a for r in rows for a in r["assumed"]})
    return {a: ASSUMPTIONS[a] for a in used}
