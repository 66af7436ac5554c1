"""The three things ``predict`` does, as library calls that return data (never print):

- :func:`calibrate`: microbench results -> MachineProfile (both the paper's and the improved
  fit, BSP min/max, diagnostics, provenance);
- :func:`validate`: the paper's accuracy table (seed 004 section 5.1) on the validation
  patterns held apart from the fitting patterns;
- :func:`forecast`: per superstep F1, F2, F3, F, the dominating term, every BSP bound and,
  where a time was measured, the error ratio.

Also here, the whole calibration's fits: which patterns fit and which validate
(:func:`split_suites`), both memory fits of :mod:`predictor.costs.fit` on them (:func:`fit_all`) and
the compute terms priced on top (:class:`ComputeFit`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from predictor.costs import costfuncs as cf
from predictor.costs.costmodel import (
    ASSUMPTIONS,
    BSP_FUNCTIONS,
    FModel,
    bsp_quantities,
    proc_features,
)
from predictor.costs.fit import Array, ImprovedFit, PaperFit, error_stats, measured_times
from predictor.costs.profile import (
    COMPUTE_SUFFIX,
    MachineProfile,
    check_host,
    new_profile,
)
from predictor.costs.variants import BY_NAME as VARIANT_SETS
from predictor.costs.variants import distinct_sets, model_key
from predictor.errors import BadInput, InsufficientPatterns, PredictorError
from predictor.inputs import Results, Step
from predictor.toolkit import modelers
from predictor.toolkit import terms as tm
from predictor.toolkit.fitting import cv_splits, fit_columns, mre, no_progress

# -- the whole calibration ----------------------------------------------------------------

COMPUTE_SUITE = "compute"  # microbench/compute.py: priced on top of the memory model


def split_suites(steps: Sequence[Step]) -> tuple[list[Step], list[Step]]:
    """(fitting patterns, validation patterns) of the memory model: the validation suite is
    held apart; compute patterns (:func:`compute_patterns`) are in neither."""
    fit = [s for s in steps if s.meta.get("suite") not in ("validation", COMPUTE_SUITE)]
    val = [s for s in steps if s.meta.get("suite") == "validation"]
    return fit, val


def compute_patterns(steps: Sequence[Step]) -> list[Step]:
    """The timed compute patterns (suite ``compute``)."""
    return [s for s in steps if s.meta.get("suite") == COMPUTE_SUITE and s.time_ns]


COMPUTE_TERMS: tuple[tm.Term, ...] = (tm.Const(), tm.Accesses(), tm.Power("instructions"),
                                      tm.Power("branch_misses"), tm.Power("page_faults"))


class ComputeFit:
    """What a superstep costs beyond its memory traffic, priced on the compute patterns on top
    of a fitted memory model (the paper's F or the improved one, of one counter set).

    F1 gains per-processor terms in ``instructions`` and ``branch_misses`` and F a
    per-superstep constant, each kept only if significant at 95% (seed 003's test, the
    toolkit's :class:`predictor.toolkit.modelers.Significance`; cross-validation where the patterns
    are too few). The memory model's coefficients are not refitted: its prediction is the
    known part of every compute pattern's time (the fit's offset), so the microbenchmarks
    alone price memory, as seed 004 calibrates it, and the compute patterns price only what
    the memory model leaves. The fit is linear given the processor at which F1 is largest
    (the compute patterns run on one).

    Attributes after ``fit``: ``model_`` (the base model with the kept terms added),
    ``terms_`` (kept), ``reasons_`` (why each other candidate went), ``decided_by_``.
    """

    def __init__(self, *, folds: int = 5, seed: int = 0, name: str | None = None) -> None:
        self.folds = folds
        self.seed = seed
        self.name = name

    def fit(self, base: FModel, steps: Sequence[Step]) -> ComputeFit:
        steps = list(steps)
        cand = [x for x in COMPUTE_TERMS if all(not s.missing(x.needs) for s in steps)]
        if tm.Power("instructions") not in cand:
            raise InsufficientPatterns("the compute terms", "compute patterns with counted "
                                       "instructions (microbench run with callgrind or a PMU)")
        if len(steps) < len(cand) + 1:
            raise InsufficientPatterns("the compute terms", f"{len(cand) + 1} or more "
                                       "timed compute patterns")
        t = measured_times(steps, "compute fit")
        base = FModel({k: v for k, v in base.f1.items() if k not in cand}, base.f2, base.f3,
                      base.const, base.llc_level, base.processors, base.banks, base.name)
        X = np.array([self._row(base, s, cand) for s in steps])
        offset = base.predict(steps)
        sel = modelers.Significance(folds=self.folds, seed=self.seed).select(
            cand, X, t, nonnegative=True, keep=frozenset(), progress=no_progress,
            offset=offset)
        cols = list(sel.kept)
        coef = fit_columns(X[:, cols], t, nonnegative=True, offset=offset)
        kept = {cand[c]: float(v) for c, v in zip(cols, coef, strict=True) if v > 0}
        self.terms_ = list(kept)
        self.reasons_ = {d.term: d.reason for d in sel.dropped}
        self.reasons_.update({cand[c]: "its least-squares cost is zero"
                              for c, v in zip(cols, coef, strict=True) if not v > 0})
        self.decided_by_ = f"{sel.decided_by} ({len(steps)} compute patterns)"
        const = kept.pop(tm.Const(), 0.0)
        self.model_ = FModel({**base.f1, **kept}, base.f2, base.f3, base.const + const,
                             base.llc_level, base.processors, base.banks,
                             self.name or f"{base.name}.compute")
        return self

    @staticmethod
    def _row(base: FModel, step: Step, cand: Sequence[tm.Term]) -> Array:
        """The candidates' values at the processor where the memory model's F1 is largest."""
        t1 = list(base.f1)
        _, arg = cf.linear_max(proc_features(step, t1), np.array([base.f1[x] for x in t1]))
        return proc_features(step, cand)[:, int(arg)]


def diagnostics(model: FModel | None, steps: Sequence[Step], t: Array) -> dict[str, Any]:
    if model is None:
        return {}
    return error_stats(t, model.predict(steps), [s.name for s in steps])


def fit_all(steps: Sequence[Step], *, levels: Sequence[int], processors: int, banks: int,
            folds: int = 5, tol: float = 0.02, seed: int = 0,
            counters: Collection[str] | None = None, suffix: str = "",
            select: str | None = "brewer") -> Mapping[str, Any]:
    """Both fits on the fitting patterns: {"paper": PaperFit, "improved": ImprovedFit,
    "diagnostics": {...}}; ``counters`` limits the terms to a counter set (a model variant,
    predictor/costs/variants.py) and ``suffix`` names it (``improved.misses``)."""
    fit_steps, _ = split_suites(steps)
    if not fit_steps:
        raise InsufficientPatterns("any function", "fitting patterns (suite 'table1')")
    t = measured_times(fit_steps, "calibration")
    paper = PaperFit(levels=levels, processors=processors, banks=banks, counters=counters,
                     name="paper" + suffix).fit(fit_steps)
    improved = ImprovedFit(levels=levels, processors=processors, banks=banks, folds=folds,
                           tol=tol, seed=seed, counters=counters, select=select,
                           name="improved" + suffix).fit(fit_steps, t)
    diag = {"paper": diagnostics(paper.model_, fit_steps, t),
            "improved": {**diagnostics(improved.model_, fit_steps, t),
                         "cv_mre": improved.cv_mre_, "decided_by": improved.decided_by_,
                         "dropped_terms": [str(t) for t in improved.dropped_]}}
    return {"paper": paper, "improved": improved, "diagnostics": diag}


def results_host(results: Results) -> dict[str, Any]:
    """The fingerprint of the host the results were measured on."""
    h = results.host
    return {"hostname": h.get("hostname"), "cpu_model": h.get("cpu_model"),
            "cpus_online": h.get("cpus_online"), "page_bytes": h.get("page_bytes"),
            "caches": results.geometry.caches_spec}


def cache_levels(results: Results) -> tuple[int, ...]:
    """The results' cache levels, which every fit of F needs (its last level is F1's memory
    term); BadInput where the geometry names none."""
    if not results.levels:
        raise BadInput(f"{results.path}: no cache geometry (geometry.levels)",
                       "the microbench results must describe the caches they ran on")
    return results.levels


def calibrate(results: Results, *, name: str | None = None, folds: int = 5,
              tol: float = 0.02, seed: int = 0, select: str | None = "brewer"
              ) -> MachineProfile:
    """Fit every cost function and model variant on the results' fitting patterns.
    ``select``: how the improved F's optional terms are chosen (:class:`ImprovedFit`)."""
    levels = cache_levels(results)
    P = results.processors
    banks = results.bank_map.banks
    _, val = split_suites(results.patterns)
    val = [s for s in val if s.time_ns]
    models: dict[str, Any] = {}
    bsp = None
    contention = None
    for cs in distinct_sets(levels):
        full = cs.name == "full"
        suffix = "" if full else f".{cs.name}"
        fits = fit_all(results.patterns, levels=levels, processors=P, banks=banks, folds=folds,
                       tol=tol, seed=seed, counters=None if full else cs.counters(levels),
                       suffix=suffix, select=select)
        paper, improved, diag = fits["paper"], fits["improved"], fits["diagnostics"]
        bsp = bsp or paper.bsp_
        contention = contention or paper.contention_
        fit_steps = split_suites(results.patterns)[0]
        fit_names = [s.name for s in fit_steps]
        common = {"counter_set": cs.name, "sources": cs.sources}
        models[model_key("paper", cs.name)] = {
            **paper.model_.to_dict(), **common, "needs": paper.model_.needs(),
            "accuracy": _accuracy(paper.model_, val, fit_steps, folds, seed, partial(
                PaperFit, levels=levels, processors=P, banks=banks, counters=paper.counters)),
            "patterns": paper.patterns_, "diagnostics": diag["paper"]}
        models[model_key("improved", cs.name)] = {
            **improved.model_.to_dict(), **common, "needs": improved.model_.needs(),
            "accuracy": _accuracy(improved.model_, val, fit_steps, folds, seed,
                                  partial(ImprovedFit, levels=levels, processors=P,
                                          banks=banks, counters=improved.counters,
                                          select=None, optional_terms=improved.terms_)),
            "terms": [str(t) for t in improved.terms_],
            "dropped_terms": [str(t) for t in improved.dropped_],
            "selection": {"decided_by": improved.decided_by_,
                          "dropped": {str(x): why for x, why in improved.reasons_.items()}},
            "patterns": {"F": fit_names}, "diagnostics": diag["improved"]}
    assert bsp is not None  # distinct_sets always has the full set
    compute, not_extended = _compute_models(models, results, P, banks, folds, seed)
    models.update(compute)
    host = results_host(results)
    return new_profile(
        name or f"{host.get('hostname') or 'host'}-{results.backend}",
        host={k: v for k, v in host.items() if v is not None},
        geometry=results.geometry,
        bank_map=results.bank_map or {"banks": 1, "provenance": "none given: one bank"},
        processors=P, word_bytes=results.word_bytes, llc_level=max(levels),
        models=models, bsp=bsp.to_dict(), contention=contention,
        notes=(f"fitted on {len(split_suites(results.patterns)[0])} patterns of {results.path} "
               f"(backend {results.backend})",
               *(f"no {k}{COMPUTE_SUFFIX}: {why}" for k, why in not_extended.items())))


def _accuracy(model: FModel, validation: Sequence[Step], fitting: Sequence[Step], folds: int,
              seed: int, refit: Callable[[], PaperFit | ImprovedFit]) -> dict[str, Any]:
    """A variant's accuracy as prediction reports it beside its forecasts: E = max(T,P)/min(T,P)
    on the validation patterns held apart from the fit; where the results have none (the quick
    suite), on the fitting patterns by k-fold cross-validation (each fold predicted by the same
    variant refitted without it, the kept terms fixed); where a fold lacks the patterns a fit
    needs, on the fitting patterns themselves -- and ``on`` says which."""
    if validation:
        t = np.array([float(s.time_ns or 0) for s in validation])
        e = cf.error_ratio(t, model.predict(validation))
        on = "validation patterns"
    else:
        t = np.array([float(s.time_ns or 0) for s in fitting])
        pred, on = _cv_predictions(model, fitting, folds, seed, refit)
        e = cf.error_ratio(t, pred)
    return {"on": on, "n": len(e), "avg_error": float(e.mean()), "max_error": float(e.max())}


def _cv_predictions(model: FModel, fitting: Sequence[Step], folds: int, seed: int,
                    refit: Callable[[], PaperFit | ImprovedFit]) -> tuple[np.ndarray, str]:
    """Each fitting pattern predicted by the variant refitted without its fold (the kept
    terms fixed), and what the predictions are; in-sample where a fold lacks the patterns a
    fit needs."""
    pred = np.zeros(len(fitting))
    try:
        for train, test in cv_splits(len(fitting), folds, seed):
            pred[test] = refit().fit([fitting[i] for i in train]).predict(
                [fitting[i] for i in test])
        return pred, f"fitting patterns, {min(folds, len(fitting))}-fold cross-validated"
    except InsufficientPatterns:
        return model.predict(fitting), "fitting patterns (too few for cross-validation)"


def _refit(profile: MachineProfile, variant: str, results: Results
           ) -> Callable[[], PaperFit | ImprovedFit]:
    """How ``calibrate`` fitted a variant of the profile, on the machine of ``results``: the
    fit to repeat in each cross-validation fold."""
    m = profile.models[variant]
    cs = VARIANT_SETS[str(m.get("counter_set", "full"))]
    levels, P = cache_levels(results), results.processors
    counters = None if cs.name == "full" else cs.counters(levels)
    banks = results.bank_map.banks
    if variant.split(".")[0] == "paper":
        return partial(PaperFit, levels=levels, processors=P, banks=banks, counters=counters)
    return partial(ImprovedFit, levels=levels, processors=P, banks=banks, counters=counters,
                   select=None, optional_terms=list(m.get("terms", ())))


def compute_cv(base: FModel, steps: Sequence[Step], folds: int = 5, seed: int = 0
               ) -> np.ndarray:
    """Each compute pattern predicted by the compute terms fitted without its fold (the memory
    model ``base`` fixed)."""
    pred = np.zeros(len(steps))
    for train, test in cv_splits(len(steps), folds, seed):
        f = ComputeFit(folds=folds, seed=seed).fit(base, [steps[i] for i in train])
        pred[test] = f.model_.predict([steps[i] for i in test])
    return pred


def _compute_models(models: Mapping[str, Mapping[str, Any]], results: Results, P: int,
                    banks: int, folds: int, seed: int
                    ) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Every memory model whose counters the compute patterns carry, extended by
    :class:`ComputeFit` with what those patterns price beyond memory (``<model>.compute``);
    accuracy by k-fold cross-validation over the compute patterns (each fold refits the
    compute terms, the memory model fixed). None where the results have no compute patterns.
    Second, why a model the compute patterns could extend was not: the fit refused the
    patterns, or kept no term (as when the memory model alone already prices the compute
    patterns at or above their measured times, e.g. timed on a loaded host)."""
    steps = compute_patterns(results.patterns)
    out: dict[str, dict[str, Any]] = {}
    not_extended: dict[str, str] = {}
    if not steps:
        return out, not_extended
    llc = max(results.levels)
    for key, m in models.items():
        base = FModel.from_dict(m, llc_level=llc, processors=P, banks=banks, name=key)
        if any(s.missing(base.needs()) for s in steps):
            continue
        try:
            cfit = ComputeFit(folds=folds, seed=seed, name=key + COMPUTE_SUFFIX).fit(base, steps)
        except (InsufficientPatterns, BadInput) as exc:
            not_extended[key] = str(exc)
            continue
        if not cfit.terms_:
            not_extended[key] = ("the compute terms' fit kept no term (" + "; ".join(
                f"{x}: {why}" for x, why in cfit.reasons_.items()) + ")")
            continue
        t = np.array([float(s.time_ns or 0) for s in steps])
        e = cf.error_ratio(t, compute_cv(base, steps, folds, seed))
        out[key + COMPUTE_SUFFIX] = {
            **cfit.model_.to_dict(), "counter_set": f"{m.get('counter_set', 'full')}+compute",
            "sources": f"{m.get('sources', '')}; instructions, branch mispredictions and page "
                       "faults (compute patterns)",
            "needs": cfit.model_.needs(),
            "accuracy": {"on": f"compute patterns, {min(folds, len(steps))}-fold "
                               "cross-validated", "n": len(e), "avg_error": float(e.mean()),
                         "max_error": float(e.max())},
            "terms": [str(x) for x in cfit.terms_],
            "dropped_terms": [str(x) for x in cfit.reasons_],
            "selection": {"decided_by": cfit.decided_by_,
                          "dropped": {str(x): why for x, why in cfit.reasons_.items()}},
            "patterns": {"compute": [s.name for s in steps]}}
    return out, not_extended


# -- validation -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Row:
    function: str
    avg_error: float
    max_error: float
    mre: float
    limiting: tuple[tuple[str, float], ...]  # the worst patterns and their E
    dominating: tuple[str, ...] = ()  # F's term (F1, F2, F3) that dominated each of them


@dataclass(frozen=True)
class ValidationTable:
    rows: tuple[Row, ...]
    patterns: int
    differences: tuple[str, ...]  # fingerprint fields that differ (profile vs results)
    # The compute variants on the compute patterns, cross-validated (their held-apart test is
    # the shipped programs: bench/program_accuracy.py).
    compute_rows: tuple[Row, ...] = ()
    compute_patterns: int = 0
    on: str = "validation patterns held apart from the fit"  # or cross-validated fitting ones

    def to_json(self) -> dict[str, Any]:
        return {"patterns": self.patterns, "on": self.on,
                "host_differences": list(self.differences),
                "rows": [_row_json(r) for r in self.rows],
                "compute": {"patterns": self.compute_patterns,
                            "on": "compute patterns, cross-validated",
                            "rows": [_row_json(r) for r in self.compute_rows]}}


def _row_json(r: Row) -> dict[str, Any]:
    return {"function": r.function, "avg_error": r.avg_error, "max_error": r.max_error,
            "mre": r.mre,
            "limiting": [{"pattern": n, "error": e, "dominating": d}
                         for (n, e), d in zip(r.limiting, r.dominating or
                                              (None,) * len(r.limiting), strict=True)]}


def _row(name: str, t: np.ndarray, p: np.ndarray, names: Sequence[str], worst: int,
         dominating: Sequence[str] = ()) -> Row:
    e = cf.error_ratio(t, p)
    order = np.argsort(-e)[:worst]
    return Row(name, float(e.mean()), float(e.max()), mre(t, p),
               tuple((names[i], float(e[i])) for i in order),
               tuple(dominating[i] for i in order) if dominating else ())


def validate(results: Results, profile: MachineProfile, *, worst: int = 3,
             folds: int = 5, seed: int = 0) -> ValidationTable:
    """E = max(T, P) / min(T, P) on the validation suite (seed 004 section 5.1 layout). Where
    the results have no validation patterns (the quick suite), F's variants are judged on the
    fitting patterns by k-fold cross-validation instead, and ``on`` says so (the BSP bounds,
    whose parameters come from those very patterns, are then left out)."""
    diffs = check_host(profile, results_host(results))
    fitting, val = split_suites(results.patterns)
    val = [s for s in val if s.time_ns]
    held_apart = bool(val)
    if not held_apart:
        val = [s for s in fitting if s.time_ns]
        if not val:
            raise InsufficientPatterns("a validation table", "timed patterns (run microbench "
                                       "run --suite all for held-apart validation patterns)")
    t = np.array([float(s.time_ns or 0) for s in val])
    names = [s.name for s in val]
    rows = []
    if held_apart:
        bsp = profile.bsp_model()
        b = [bsp.evaluate(s) for s in val]
        rows = [_row(f"{fn}-{bound.upper()}", t, np.array([x[f"{fn}_{bound}"] for x in b]),
                     names, worst)
                for fn in BSP_FUNCTIONS for bound in ("min", "max")]
    on = "validation patterns held apart from the fit"
    compute = [v for v in profile.models if v.endswith(COMPUTE_SUFFIX)]
    for variant in profile.models:  # paper, improved and their variants by counter set
        if variant in compute:
            continue
        model = profile.f_model(variant)
        if held_apart:
            pred = np.array([model.evaluate(s).f for s in val])
        else:
            pred, on = _cv_predictions(model, val, folds, seed,
                                       _refit(profile, variant, results))
        dom = [model.evaluate(s).dominant for s in val]
        rows.append(_row(f"F ({variant})", t, pred, names, worst, dom))
    steps = compute_patterns(results.patterns)
    crows = []
    for variant in compute if steps else ():
        base = profile.f_model(variant[:-len(COMPUTE_SUFFIX)])
        if any(s.missing(profile.f_model(variant).needs()) for s in steps):
            continue
        ct = np.array([float(s.time_ns or 0) for s in steps])
        crows.append(_row(f"F ({variant})", ct, compute_cv(base, steps),
                          [s.name for s in steps], worst))
    return ValidationTable(tuple(rows), len(val), tuple(diffs), tuple(crows), len(steps), on)


# -- forecasts for recorded supersteps --------------------------------------------------------

def forecast(profile: MachineProfile, steps: Iterable[Step], *, variant: str | None = None
             ) -> list[dict[str, Any]]:
    """One dict per superstep: the model variant used (``variant``, else the most complete
    one whose counters the superstep has) with its calibrated accuracy, F terms, the
    dominating one, every BSP bound, the quantities used (with what was assumed) and, where
    the time is known, E. A superstep no variant can predict gets ``F_ns`` None and
    ``why``; when no superstep can be predicted, the first one's reason is raised."""
    out = []
    first_error: PredictorError | None = None
    for row, error in iter_forecast(profile, steps, variant=variant):
        first_error = first_error or error
        out.append(row)
    if first_error is not None and all(r["F_ns"] is None for r in out):
        raise first_error
    return out


def iter_forecast(profile: MachineProfile, steps: Iterable[Step], *,
                  variant: str | None = None
                  ) -> Iterator[tuple[dict[str, Any], PredictorError | None]]:
    """:func:`forecast`'s rows one at a time, each with the error that left it without a
    prediction (None if predicted): a caller that renders and drops each row holds no list
    (``predict --counters`` on a large file)."""
    bsp = profile.bsp_model()
    for s in steps:
        try:
            name = variant or profile.select_model(
                s.counters, where=f"superstep {s.name}", bank_counts=s.bank_lm is not None)
            br = profile.f_model(name).evaluate(s)
            q = bsp_quantities(s, profile.banks)
            bounds = bsp.evaluate(s)
        except PredictorError as exc:
            yield ({"superstep": s.name, "processors": s.processors, "model": None,
                    "F_ns": None, "why": str(exc), "time_ns": s.time_ns, "error": None,
                    "assumed": []}, exc)
            continue
        row: dict[str, Any] = {
            "superstep": s.name, "processors": s.processors, "model": name,
            "accuracy": dict(profile.accuracy(name)),
            "F1_ns": br.f1, "F2_ns": br.f2,
            "F3_ns": br.f3, "const_ns": br.const, "F_ns": br.f, "dominant": br.dominant,
            "F1_rank": br.f1_rank, "F3_bank": br.f3_bank,
            "H": q.h, "M": q.m, "K": q.k, "M_b": q.m_b,
            **{f"{k}_ns": v for k, v in bounds.items()},
            "assumed": sorted({*br.assumed, *q.assumed}),
            "time_ns": s.time_ns,
            "error": (float(cf.error_ratio(s.time_ns, br.f)) if s.time_ns else None),
        }
        yield row, None


def assumptions_used(names: Iterable[str]) -> dict[str, str]:
    """What each assumption a forecast made (the rows' ``assumed``) means, by name."""
    return {a: ASSUMPTIONS[a] for a in sorted(set(names))}
