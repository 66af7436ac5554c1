"""Calibration: microbench patterns -> fitted cost models (scikit-learn estimator shape).

Two variants, both kept so they can be compared (DESIGN.md section 8):

- :class:`PaperFit` follows seed 004 section 4: F1, F2 and F3 each fitted by least squares
  (non-negative) on the patterns where it should dominate -- F1 on one-processor exclusive
  patterns at every level, F2 on all-processor exclusive memory patterns with low bank
  contention, F3 on all-processor exclusive memory patterns with the highest bank contention
  -- and the BSP-like min/max parameters taken from the extreme patterns (section 4.1).
- :class:`ImprovedFit` fits F = const + max(F1, F2, F3) jointly on every fitting pattern,
  minimising relative error (seed 003 footnote 1), with optional extra terms (TLB misses,
  streaming misses, load/store asymmetry, a per-superstep constant) each kept only if it earns
  its place. The search is the toolkit's (:mod:`predictor.toolkit.modelers`, the same code that
  chooses every other family's terms), given F as an estimator (:mod:`predictor.costs.joint`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from predictor.costs import costfuncs as cf
from predictor.costs.costmodel import (
    BSPModel,
    Contention,
    FModel,
    bank_features,
    bus_features,
    proc_features,
)
from predictor.costs.joint import LM, WB, FEstimator
from predictor.errors import BadInput, InsufficientPatterns, NotFittedError
from predictor.inputs import Step, miss_counter, writeback_counter
from predictor.toolkit import fitting, modelers
from predictor.toolkit import terms as tm

Array = NDArray[np.float64]


# -- pattern classes ----------------------------------------------------------------------

def bkc_of(step: Step) -> float:
    """Bank contention of a pattern (seed 004 section 3: active processors / distinct banks
    touched; 0 when all accesses hit in cache). Accepts numbers and "1/2"-style strings."""
    b = step.meta.get("bkc")
    if b is None:
        return float("nan")
    try:
        return float(Fraction(str(b)))
    except (ValueError, ZeroDivisionError):
        return float("nan")


def _procs(step: Step) -> int:
    return int(step.meta.get("procs") or step.processors)


def _exclusive(step: Step) -> bool:
    return step.meta.get("mode", "exclusive") == "exclusive" and not step.meta.get("coherence")


def _mem(step: Step) -> bool:
    return step.meta.get("level") == "mem"


def bkc_text(bkc: float) -> str:
    """A bank contention as the mnemonics write it: 2, 1/4."""
    return str(Fraction(bkc).limit_denominator(1 << 10))


def bank_contention(steps: Sequence[Step], *, processors: int, banks: int
                    ) -> Contention | None:
    """The least and the most bank contention of the exclusive memory patterns on all
    ``processors`` (the classes of F2 and F3, Amato et al. section 4.2) and why each was
    taken (:class:`predictor.costs.costmodel.Contention`); None where the steps have no such
    pattern.
    Low contention is the paper's BKC <= 1 where the node can reach it, else the least
    present: P processors on B banks touch at most B banks, so BKC >= P / B."""
    P = processors
    mem = [bkc_of(s) for s in steps if _procs(s) == P and _exclusive(s) and _mem(s)]
    mem = [b for b in mem if np.isfinite(b)]
    if not mem:
        return None
    banked = [bkc_of(s) for s in steps if _procs(s) == P and _exclusive(s) and _mem(s)
              and s.bank_lm is not None and np.isfinite(bkc_of(s))]
    least, lowest = P / banks, min(mem)
    high = max(banked or mem)
    low = max(1.0, lowest)
    if lowest <= 1:
        why = (f"low contention BKC <= 1 as in the paper ({P} processors on {banks} banks "
               f"reach it)")
    elif lowest <= least * (1 + 1e-9):
        why = (f"low contention BKC <= {bkc_text(low)}: {P} processors on {banks} banks "
               f"touch at most {banks} banks, so BKC cannot go below {bkc_text(least)} (the "
               "paper's BKC <= 1 needs no more processors than banks)")
    else:
        why = (f"low contention BKC <= {bkc_text(low)}, the least of the results' "
               f"all-processor exclusive memory patterns (the node allows "
               f"{bkc_text(max(1.0, least))}; the results have no pattern there)")
    why += f"; high contention BKC = {bkc_text(high)}, the greatest in the results"
    if high >= P * (1 - 1e-9):
        why += " (all processors on one bank)"
    if high <= low * (1 + 1e-9):
        why += "; no higher contention than the low one: F3 is fitted on F2's patterns"
    return Contention(P, banks, low, high, least, why)


def measured_times(steps: Sequence[Step], what: str) -> Array:
    missing = [s.name for s in steps if s.time_ns is None or not s.time_ns > 0]
    if missing:
        raise BadInput(f"{what}: no measured time for {', '.join(missing[:5])}",
                       "every calibration pattern needs time_ns.median > 0")
    return np.array([float(s.time_ns or 0.0) for s in steps])


def level_names(levels: Sequence[int]) -> list[str]:
    """Pattern levels a complete suite has: "L1".."Ln" and "mem"."""
    return [f"L{lv}" for lv in levels] + ["mem"]


def base_f1_terms(levels: Sequence[int]) -> list[tm.Term]:
    """The paper's F1 generalised: accesses, one miss and one writeback term per level."""
    acc: list[tm.Term] = [tm.Accesses()]
    return (acc + [tm.Power(miss_counter(lv)) for lv in levels]
            + [tm.Power(writeback_counter(lv)) for lv in levels])


def f2_terms(llc_level: int) -> list[tm.Term]:
    return [tm.Power(miss_counter(llc_level)), tm.Power(writeback_counter(llc_level))]


def usable(terms: Sequence[tm.Term], counters: Collection[str] | None) -> list[tm.Term]:
    """The terms whose counters are all in ``counters`` (None: every counter; a variant by
    counter set, predictor/costs/variants.py). The constant needs none."""
    if counters is None:
        return list(terms)
    return [t for t in terms if all(c in counters for c in t.needs)]


def _f3_columns(llc: int, counters: Collection[str] | None) -> tuple[tm.Term, ...]:
    """F3's terms: ``lm`` and, where the counter set has last-level writebacks, ``wb``."""
    return (LM, WB) if counters is None or writeback_counter(llc) in counters else (LM,)


def error_stats(t: Array, p: Array, names: Sequence[str]) -> dict[str, Any]:
    e = cf.error_ratio(t, p)
    worst = int(np.argmax(e)) if len(e) else 0
    return {"avg_error": float(np.mean(e)) if len(e) else float("nan"),
            "max_error": float(np.max(e)) if len(e) else float("nan"),
            "mre": fitting.mre(t, p) if len(e) else float("nan"),
            "n": len(e), "worst": names[worst] if len(e) else ""}


# -- the paper's fit ----------------------------------------------------------------------

class PaperFit:
    """Seed 004 section 4: F1, F2, F3 by least squares on the patterns each should dominate,
    the BSP-like parameters from the extreme patterns.

    Attributes after ``fit``: ``model_`` (FModel), ``bsp_`` (BSPModel), ``patterns_``
    (function -> pattern names it was fitted on).
    """

    def __init__(self, *, levels: Sequence[int] = (1, 2), processors: int = 1,
                 banks: int = 1, counters: Collection[str] | None = None,
                 name: str = "paper") -> None:
        self.levels = tuple(levels)
        self.processors = processors
        self.banks = banks
        self.counters = None if counters is None else frozenset(counters)
        self.name = name

    def fit(self, steps: Sequence[Step]) -> PaperFit:
        steps = list(steps)
        P, llc = self.processors, max(self.levels)
        f1_t = usable(base_f1_terms(self.levels), self.counters)
        f2_t = usable(f2_terms(llc), self.counters)
        f3_t = _f3_columns(llc, self.counters)
        patterns: dict[str, list[str]] = {}

        # F1: one processor, exclusive, every level (paper: p1.s1.b0.-E, p1.s8.b0.-E,
        # p1.s32.b1/8.-E, loads and stores).
        s1 = [s for s in steps if _procs(s) == 1 and _exclusive(s)]
        for lv in level_names(self.levels):
            if not any(s.meta.get("level") == lv for s in s1):
                raise InsufficientPatterns("F1", f"one-processor exclusive patterns at level "
                                           f"{lv} (p1.*.{lv}.-E)")
        if not any(s.counter("stores").sum() > 0 for s in s1):
            raise InsufficientPatterns("F1", "one-processor exclusive store patterns (p1.*.SE)")
        X1 = np.array([proc_features(s, f1_t)[:, int(np.argmax(
            s.counter("loads") + s.counter("stores")))] for s in s1])
        c1 = fitting.nnls(X1, measured_times(s1, "F1"))
        patterns["F1"] = [s.name for s in s1]

        # F2: all processors, exclusive, memory, low bank contention (paper: p8.s256.b1.-E;
        # on more processors than banks, the least contention present: Contention).
        cont = bank_contention(steps, processors=P, banks=self.banks)
        if cont is None:
            raise InsufficientPatterns("F2", f"exclusive memory patterns on all {P} "
                                       f"processors (p{P}.*.-E at level mem)")
        s2 = [s for s in steps if _procs(s) == P and _exclusive(s) and _mem(s)
              and cont.is_low(bkc_of(s))]
        X2 = np.array([bus_features(s, f2_t, P) for s in s2])
        c2 = fitting.nnls(X2, measured_times(s2, "F2"))
        patterns["F2"] = [s.name for s in s2]

        # F3: all processors, exclusive, memory, the highest bank contention (p8.s256.b8.-E).
        mem_p = [s for s in steps if _procs(s) == P and _exclusive(s) and _mem(s)
                 and s.bank_lm is not None]
        if not mem_p:
            raise InsufficientPatterns("F3", f"exclusive memory patterns on all {P} "
                                       "processors with per-bank counts")
        s3 = [s for s in mem_p if cont.is_high(bkc_of(s))]
        X3 = []
        for s in s3:
            bf, _ = bank_features(s, llc, self.banks)
            X3.append(bf[:len(f3_t), int(np.argmax(bf[:len(f3_t)].sum(axis=0)))])
        c3 = fitting.nnls(np.array(X3), measured_times(s3, "F3"))
        patterns["F3"] = [s.name for s in s3]

        self.model_ = FModel(dict(zip(f1_t, map(float, c1), strict=True)),
                             dict(zip(f2_t, map(float, c2), strict=True)),
                             dict(zip(f3_t, map(float, c3), strict=True)), 0.0, llc, P,
                             self.banks, self.name)
        self.bsp_ = fit_bsp(steps, processors=P, banks=self.banks, contention=cont)
        self.patterns_ = patterns
        self.contention_ = cont
        return self

    def predict(self, steps: Sequence[Step]) -> Array:
        if not hasattr(self, "model_"):
            raise NotFittedError("PaperFit")
        return self.model_.predict(steps)


def _extreme(vals: Sequence[tuple[float, str]], what: str, need: str
             ) -> tuple[tuple[float, str], tuple[float, str]]:
    good = [(v, n) for v, n in vals if np.isfinite(v) and v > 0]
    if not good:
        raise InsufficientPatterns(what, need)
    return min(good), max(good)


def fit_bsp(steps: Sequence[Step], *, processors: int, banks: int,
            contention: Contention | None = None) -> BSPModel:
    """Min and max parameters of QSM, EBSP and DXBSP from the extreme patterns (seed 004
    section 4.1). For each parameter the candidates are T / (its quantity) over the patterns
    that isolate it; min and max are the extremes, and the profile records which pattern gave
    each. Per access on the pattern's own H, K, M/p, M_b (bsp block of the results). Low and
    high bank contention as ``contention`` says (default: :func:`bank_contention` of ``steps``;
    BKC <= 1 where the steps have no all-processor memory pattern)."""
    P = processors
    cont = contention or bank_contention(steps, processors=P, banks=banks)
    low = cont.is_low if cont is not None else (lambda b: b <= 1)
    timed = [s for s in steps if s.time_ns]

    def h(s: Step) -> float:
        return float(s.meta.get("H") or (s.counter("loads") + s.counter("stores")).max())

    def m(s: Step) -> float:
        return float(s.meta.get("M") or (s.counter("loads") + s.counter("stores")).sum())

    def per(q: Any, subset: Sequence[Step]) -> list[tuple[float, str]]:
        return [(float(s.time_ns or 0) / q(s), s.name) for s in subset if q(s) > 0]

    params: dict[str, dict[str, tuple[float, float]]] = {}
    pats: dict[str, dict[str, Any]] = {}
    # QSM g1: cost per access of the busiest processor, over every pattern (paper: min from
    # p1.s1.b0.LE, max from p8.s256.b8.SC).
    q1 = _extreme(per(h, timed), "QSM", "timed patterns")
    # QSM g2: per access to one word, from patterns where many accesses go to one word
    # (K > H: a variant of p8.s1.b0.LC with every processor on the same word). Without them,
    # g2 = g1 / p: the paper's own values satisfy it (0.0083/8 = 0.00104 ~ 0.001 and
    # 5.35/8 = 0.669 ~ 0.67), because there T = g1*H and K = p*H (NOTES.md, QSM).
    hot = [s for s in timed if s.k is not None and s.k > h(s)]
    if hot:
        q2 = _extreme(per(lambda s: float(s.k or 0), hot), "QSM", "hot-word patterns")
    else:
        q2 = ((q1[0][0] / P, f"g1/p ({q1[0][1]})"), (q1[1][0] / P, f"g1/p ({q1[1][1]})"))
    params["QSM"] = {"min": (q1[0][0], q2[0][0]), "max": (q1[1][0], q2[1][0])}
    pats["QSM"] = {"min_patterns": [q1[0][1], q2[0][1]], "max_patterns": [q1[1][1], q2[1][1]]}

    # EBSP g1: one processor alone (p1.s1.b0.LE .. p1.s256.b1.SE); g2: all processors with
    # the same number of accesses (p8.s1.b0.LE .. p8.s256.b8.SC), per M/p.
    e1 = _extreme(per(h, [s for s in timed if _procs(s) == 1]), "EBSP",
                  "one-processor patterns")
    e2 = _extreme(per(lambda s: m(s) / P, [s for s in timed if _procs(s) == P]), "EBSP",
                  f"patterns on all {P} processors")
    params["EBSP"] = {"min": (e1[0][0], e2[0][0]), "max": (e1[1][0], e2[1][0])}
    pats["EBSP"] = {"min_patterns": [e1[0][1], e2[0][1]], "max_patterns": [e1[1][1], e2[1][1]]}

    # DXBSP g1: low bank contention, BKC <= 1 where the node reaches it (max from
    # p8.s32.b1.SC); g2: per access to the busiest bank on exclusive all-processor patterns
    # with the highest BKC (p8.s256.b8.LE/SE).
    d1 = _extreme(per(h, [s for s in timed if low(bkc_of(s))]), "DXBSP",
                  "patterns with low bank contention" + (f" (BKC <= {bkc_text(cont.low)})"
                                                         if cont else " (BKC <= 1)"))
    hi = [s for s in timed if _procs(s) == P and _exclusive(s) and _mem(s) and s.m_b]
    if not hi:
        raise InsufficientPatterns("DXBSP", f"exclusive memory patterns on all {P} processors "
                                   "with M_b")
    top = max(bkc_of(s) for s in hi)
    d2 = _extreme(per(lambda s: float(s.m_b or 0), [s for s in hi if bkc_of(s) == top]),
                  "DXBSP", "highest-contention patterns")
    params["DXBSP"] = {"min": (d1[0][0], d2[0][0]), "max": (d1[1][0], d2[1][0])}
    pats["DXBSP"] = {"min_patterns": [d1[0][1], d2[0][1]], "max_patterns": [d1[1][1], d2[1][1]]}
    return BSPModel(params, P, banks, pats)


# -- the improved, joint fit ---------------------------------------------------------------

def default_optional_terms(levels: Sequence[int]) -> list[tm.Term]:
    """Candidate extra terms of the improved F1 (each must earn its place): a per-superstep
    constant, data TLB misses, a store surcharge (load/store asymmetry) and a streaming
    proxy per cache level."""
    return ([tm.Const(), tm.Power("dtlb_misses"), tm.Power("stores")]
            + [tm.Streaming(miss_counter(lv)) for lv in levels])


class ImprovedFit:
    """F = const + max(F1, F2, F3) fitted jointly for relative error, optional terms selected
    as seed 003 does (t-tests at 95%) or by k-fold cross-validation.

    Keyword settings: ``levels``, ``processors``, ``banks`` (the machine), ``optional_terms``
    (None: :func:`default_optional_terms`), ``base_terms`` (F1's terms that are always kept;
    None: :func:`base_f1_terms`, accesses and each level's misses and writebacks), ``folds``,
    ``tol`` (under cross-validation, a term
    stays when it reduces the cross-validated relative error, MRE - 1, by more than this
    fraction), ``max_iter``, ``seed``, ``select``: ``"brewer"`` (the default: a term stays if
    its coefficient is significant at 95%; cross-validation where the patterns are too few for
    a t-test), ``"cv"`` or ``None`` (keep every candidate).

    ``select`` names one of the toolkit's searches (:data:`predictor.toolkit.modelers.MODELERS`:
    ``brewer`` is :class:`~predictor.toolkit.modelers.Significance`, ``cv``
    :class:`~predictor.toolkit.modelers.CrossValidated`, None
    :class:`~predictor.toolkit.modelers.Fixed`),
    run on F as an estimator (:meth:`estimator`, :class:`predictor.costs.joint.FEstimator`). The
    t-tests are on the model linearised at its fit: given which of F1, F2, F3 dominates each
    pattern (and at which processor and bank), F is linear in its coefficients, and the
    toolkit's weighted least squares on that design gives standard errors and p-values.

    Attributes after ``fit``: ``model_`` (FModel), ``terms_`` (F1 terms kept), ``dropped_``
    (terms dropped, in order), ``reasons_`` (why, per dropped term), ``decided_by_``,
    ``cv_mre_`` (cross-validated MRE of the kept model), ``dominant_`` (per fitting step: 0, 1,
    2 for F1, F2, F3).
    """

    def __init__(self, *, levels: Sequence[int] = (1, 2), processors: int = 1, banks: int = 1,
                 optional_terms: Sequence[str | tm.Term] | None = None, folds: int = 5,
                 tol: float = 0.02, max_iter: int = 30, seed: int = 0,
                 select: str | None = "brewer", counters: Collection[str] | None = None,
                 name: str = "improved", base_terms: Sequence[str | tm.Term] | None = None
                 ) -> None:
        self.counters = None if counters is None else frozenset(counters)
        self.name = name
        self.levels = tuple(levels)
        self.processors = processors
        self.banks = banks
        self.optional_terms = optional_terms
        self.folds = folds
        self.tol = tol
        self.max_iter = max_iter
        self.seed = seed
        self.select = select
        self.base_terms = base_terms

    def _init_assign(self, steps: Sequence[Step]) -> NDArray[np.int64]:
        """Start from the paper's classes: all-processor exclusive memory patterns go to F2
        (low BKC) or F3 (the highest BKC), everything else to F1."""
        P = self.processors
        cont = bank_contention(steps, processors=P, banks=self.banks)
        out = np.zeros(len(steps), dtype=np.int64)
        if P > 1 and cont is not None:
            for i, s in enumerate(steps):
                if _procs(s) == P and _mem(s) and _exclusive(s):
                    b = bkc_of(s)
                    out[i] = 2 if cont.is_high(b) and not cont.is_low(b) else 1
        return out

    def estimator(self, f1_terms: Sequence[tm.Term]) -> FEstimator:
        """F with these F1 terms on this machine and counter set, as the toolkit's searches
        take it (:class:`predictor.costs.joint.FEstimator`)."""
        llc = max(self.levels)
        return FEstimator(tuple(f1_terms), tuple(usable(f2_terms(llc), self.counters)),
                          _f3_columns(llc, self.counters), llc, self.processors, self.banks,
                          self._init_assign, self.max_iter, self.name)

    def cv_score(self, steps: Sequence[Step], t: Array, f1_terms: Sequence[tm.Term]) -> float:
        """k-fold cross-validated MRE of the model with these F1 terms."""
        return fitting.cross_validated_mre(self.estimator(f1_terms), list(steps), t,
                                           folds=self.folds, seed=self.seed)

    def fit(self, steps: Sequence[Step], times: ArrayLike | None = None) -> ImprovedFit:
        steps = list(steps)
        t = measured_times(steps, "improved fit") if times is None else np.asarray(times, float)
        if len(steps) < 4:
            raise InsufficientPatterns("the improved F", "four or more timed patterns")
        base = usable(base_f1_terms(self.levels) if self.base_terms is None
                      else tm.parse_all(self.base_terms), self.counters)
        candidates = (tm.parse_all(self.optional_terms) if self.optional_terms is not None
                      else default_optional_terms(self.levels))
        optional = [x for x in usable(candidates, self.counters) if x not in base]
        # A candidate needs its counters in every step; otherwise it cannot be a term here.
        optional = [x for x in optional if all(not s.missing(x.needs) for s in steps)]
        if self.select not in ("brewer", "cv", None):
            raise BadInput(f"select = {self.select!r}", "choose brewer, cv or None")
        # The toolkit's search on F: Brewer's t-tests on F linearised at its fit
        # (cross-validation where the patterns are too few), k-fold cross-validation, or none.
        search: modelers.Modeler = (
            modelers.Fixed() if self.select is None or not optional else
            modelers.make_modeler(self.select, folds=self.folds, seed=self.seed, tol=self.tol))
        est = self.estimator([*base, *optional])
        sel = search.search(est, steps, t, keep=frozenset(base), progress=fitting.no_progress)
        n = len(steps)
        if sel.modeler == modelers.CrossValidated.name:
            self.reasons_ = {d.term: f"cross-validated MRE without it {d.score:.4f}, within "
                                     f"{self.tol:.0%} of with it" for d in sel.dropped}
            self.decided_by_ = f"cross-validation ({min(self.folds, n)}-fold, MRE; {n} patterns)"
        elif sel.modeler == modelers.Significance.name:
            self.reasons_ = {d.term: d.reason for d in sel.dropped}
            self.decided_by_ = f"{sel.decided_by} ({n} patterns)"
        else:
            self.reasons_ = {}
            self.decided_by_ = "none: every candidate kept"
        self.terms_ = [est.terms[j] for j in sel.kept]
        self.dropped_ = list(self.reasons_)
        self.cv_mre_ = self.cv_score(steps, t, self.terms_)
        final = self.estimator(self.terms_).fit(steps, t)
        self.model_, self.dominant_ = final.model_, final.dominant_
        return self

    def predict(self, steps: Sequence[Step]) -> Array:
        if not hasattr(self, "model_"):
            raise NotFittedError("ImprovedFit")
        return self.model_.predict(steps)
