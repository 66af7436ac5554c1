"""Cost models with parameters: F = const + max(F1, F2, F3) over named terms, and the BSP-like
bounds with their min/max parameter sets. Evaluated on :class:`predictor.inputs.Step` s through
the pure functions of :mod:`predictor.costs.costfuncs`.

Terms (:mod:`predictor.toolkit.terms`, written in their text form in profiles):

- F1 (one value per processor, then the max, seed 004 section 4.2): terms on the superstep's
  per-processor counters: ``acc`` = loads + stores (the paper's C0E2 + C0E3), any canonical
  counter (``l1d_misses`` = C1E9, ``l2_misses`` = C1EA, ``l1d_writebacks`` = C1E6,
  ``l2_writebacks`` = C0E7 in lines, ``dtlb_misses``, ``stores``...), and
  ``stream:<counter>`` = counter^2 / acc (a streaming-miss proxy, predictor/NOTES.md).
- F2 (bus): terms on each counter summed over processors and divided by the machine's
  processor count p.
- F3 (banks): terms on ``lm`` and ``wb``, last-level misses served by / lines written back to
  each bank, then the max over banks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from predictor.costs import costfuncs as cf
from predictor.errors import MissingCounter
from predictor.inputs import Step, miss_counter, writeback_counter
from predictor.toolkit import terms as tm

Array = NDArray[np.float64]

BSP_FUNCTIONS = ("QSM", "EBSP", "DXBSP")
# Declared assumptions where a step lacks what a function needs (DESIGN.md section 3).
ASSUMPTIONS = {
    "banks": "last-level misses and writebacks uniform over the banks (Amato et al., section 5.2: "
             "BKC = 1)",
    "K": "K = 1: no word is accessed more than once by all processors together (0 without "
         "accesses)",
    "M_b": "M_b = M / banks: accesses uniform over the banks (BKC = 1)",
}


Coefficients = Mapping[tm.Term, float]


def proc_features(step: Step, terms: Sequence[tm.Term]) -> Array:
    """``(K, n)`` matrix: term k for each of the step's n processors."""
    return np.array([np.broadcast_to(t.evaluate(step.counters), (step.processors,))
                     for t in terms], dtype=np.float64).reshape(len(terms), step.processors)


def bus_features(step: Step, terms: Sequence[tm.Term], processors: int) -> Array:
    """``(K,)``: each term on the counters summed over processors and divided by the
    machine's processor count (F2's sum_i C(p_i) / p)."""
    table = {c: step.counter(c).sum() / processors for c in tm.needs(terms)}
    return np.array([float(t.evaluate(table)) for t in terms], dtype=np.float64)


def bank_features(step: Step, llc_level: int, banks: int) -> tuple[Array, bool]:
    """``(2, B)``: rows ``lm``, ``wb``; and whether they were assumed uniform."""
    if step.bank_lm is not None:
        lm = step.bank_lm
        wb = step.bank_wb if step.bank_wb is not None else np.zeros_like(lm)
        return np.array([lm, wb]), False
    lm_u = cf.uniform_over_banks(step.counter(miss_counter(llc_level)).sum(), banks)
    wb_name = writeback_counter(llc_level)
    # A model without writebacks (a counter set that lacks them) reads no writeback row.
    wb_u = (cf.uniform_over_banks(step.counter(wb_name).sum(), banks)
            if wb_name in step.counters else np.zeros_like(lm_u))
    return np.array([lm_u, wb_u]), True


@dataclass(frozen=True)
class Breakdown:
    """F and its terms for one step, with where the maxima were attained."""

    f1: float
    f2: float
    f3: float
    const: float
    f: float
    dominant: str  # "F1", "F2" or "F3"
    f1_rank: int  # the processor attaining F1
    f3_bank: int  # the bank attaining F3
    assumed: tuple[str, ...]


@dataclass(frozen=True)
class FModel:
    """F = const + max(F1, F2, F3); every coefficient in the profile's unit per event."""

    f1: Coefficients
    f2: Coefficients
    f3: Coefficients  # terms in "lm" and "wb"
    const: float = 0.0
    llc_level: int = 2
    processors: int = 1
    banks: int = 1
    name: str = "F"

    def needs(self, *, bank_counts: bool = False) -> list[str]:
        """Canonical counters a step must carry for this model; without per-bank counts (any
        recorded program) F3 reads the last level's misses and writebacks."""
        out = list(tm.needs([*self.f1, *self.f2]))
        if not bank_counts:
            bank = {"lm": miss_counter(self.llc_level), "wb": writeback_counter(self.llc_level)}
            out += [bank[n] for t, c in self.f3.items() if c for n in t.needs]
        return list(dict.fromkeys(out))

    def check(self, step: Step) -> None:
        for c in self.needs(bank_counts=step.bank_lm is not None):
            if c not in step.counters:
                raise MissingCounter(c, f"superstep {step.name}", f"model {self.name}")

    def evaluate(self, step: Step) -> Breakdown:
        self.check(step)
        t1 = list(self.f1)
        v1, arg1 = cf.linear_max(proc_features(step, t1), np.array([self.f1[t] for t in t1]))
        # F2: the bus term on per-processor averages (p = the machine's processors).
        t2 = list(self.f2)
        v2 = float(np.dot(bus_features(step, t2, self.processors), [self.f2[t] for t in t2]))
        feats, assumed_banks = bank_features(step, self.llc_level, self.banks)
        t3 = list(self.f3)
        table3 = {"lm": feats[0], "wb": feats[1]}
        v3, arg3 = cf.linear_max(
            np.array([t.evaluate(table3) for t in t3]).reshape(len(t3), feats.shape[1]),
            np.array([self.f3[t] for t in t3]))
        res = cf.f_max(v1, v2, v3)
        rank = step.ranks[int(arg1)] if step.ranks else int(arg1)
        return Breakdown(float(v1), v2, float(v3), self.const, float(res.value) + self.const,
                         cf.F_TERMS[int(res.dominant)], rank, int(arg3),
                         ("banks",) if assumed_banks and any(self.f3.values()) else ())

    def predict(self, steps: Sequence[Step]) -> Array:
        return np.array([self.evaluate(s).f for s in steps])

    def to_dict(self) -> dict[str, Any]:
        return {"const": self.const, "F1": _named(self.f1), "F2": _named(self.f2),
                "F3": _named(self.f3)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, llc_level: int, processors: int, banks: int,
                  name: str) -> FModel:
        return cls(coefficients(d.get("F1", {})), coefficients(d.get("F2", {})),
                   coefficients(d.get("F3", {})),
                   float(d.get("const", 0.0)), llc_level, processors, banks, name)


def _named(c: Coefficients) -> dict[str, float]:
    return {str(t): float(v) for t, v in c.items()}


def coefficients(d: Mapping[str, Any]) -> dict[tm.Term, float]:
    """Coefficients by term from coefficients by the terms' text form."""
    return {tm.parse(k): float(v) for k, v in d.items()}


@dataclass(frozen=True)
class Contention:
    """The bank contention a calibration took as low and as high, and why.

    Bank contention (BKC, Amato et al. section 3) is active processors / distinct banks
    touched. The paper's machine had as many processors as banks, so its low-contention
    patterns (F2's, ``p8.s256.b1.-E``; DXBSP's g1) have BKC <= 1 and its high ones (F3's,
    DXBSP's g2) the highest BKC, 8. On P processors and B banks, all P processors touch at
    most B banks, so BKC >= P / B: with P > B nothing reaches BKC <= 1. Low contention is
    therefore BKC <= ``low`` = max(1, the least BKC of the all-processor exclusive memory
    patterns present), and high contention BKC = ``high``, the greatest present.
    """

    processors: int  # P, the machine's processors the patterns were classed on
    banks: int  # B, the bank map's banks
    low: float  # F2's and DXBSP g1's patterns: BKC <= low
    high: float  # F3's and DXBSP g2's patterns: BKC == high
    least: float  # the least BKC all P processors allow: P / B
    why: str  # in words: which contention was taken and why

    def is_low(self, bkc: float) -> bool:
        return bool(bkc <= self.low * (1 + 1e-9))

    def is_high(self, bkc: float) -> bool:
        return bool(abs(bkc - self.high) <= 1e-9 * max(1.0, self.high))

    def to_dict(self) -> dict[str, Any]:
        return {"processors": self.processors, "banks": self.banks, "low": self.low,
                "high": self.high, "least": self.least, "why": self.why}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Contention:
        """The record of a profile's ``contention`` table; ValueError or TypeError naming the
        field that is missing or of the wrong kind."""
        def count(k: str) -> int:
            v = d[k]
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"contention.{k} = {v!r:.40} is not a count >= 1")
            return v

        def ratio(k: str) -> float:
            v = d[k]
            if not isinstance(v, int | float) or isinstance(v, bool) or not 0 <= v < np.inf:
                raise ValueError(f"contention.{k} = {v!r:.40} is not a finite number >= 0")
            return float(v)

        why = d["why"]
        if not isinstance(why, str):
            raise TypeError(f"contention.why is {type(why).__name__}, not a string")
        return cls(count("processors"), count("banks"), ratio("low"), ratio("high"),
                   ratio("least"), why)


@dataclass(frozen=True)
class BSPQuantities:
    h: float  # max accesses of one processor
    m: float  # total accesses
    k: float  # max accesses to one word
    m_b: float  # max accesses to one bank
    assumed: tuple[str, ...]


def bsp_quantities(step: Step, banks: int) -> BSPQuantities:
    """H, M from loads + stores (section 4.1); K and M_b from the step, else as declared in
    ASSUMPTIONS (and named in ``assumed``)."""
    for c in ("loads", "stores"):
        if c not in step.counters:
            raise MissingCounter(c, f"superstep {step.name}", "the BSP-like functions")
    h, m = cf.bsp_h_m(step.counter("loads"), step.counter("stores"))
    assumed: list[str] = []
    k = step.k
    if k is None:
        k = 1.0 if m > 0 else 0.0  # no accesses, no word accessed
        assumed.append("K")
    mb = step.m_b
    if mb is None:
        mb = float(m) / banks
        assumed.append("M_b")
    return BSPQuantities(float(h), float(m), float(k), float(mb), tuple(assumed))


@dataclass(frozen=True)
class BSPModel:
    """QSM, EBSP, DXBSP with (g1, g2) for "min" and "max" each (seed 004 section 4.1)."""

    params: Mapping[str, Mapping[str, tuple[float, float]]]  # fn -> {"min"|"max": (g1, g2)}
    processors: int = 1
    banks: int = 1
    patterns: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def evaluate(self, step: Step) -> dict[str, float]:
        q = bsp_quantities(step, self.banks)
        out = {}
        for fn in BSP_FUNCTIONS:
            for bound in ("min", "max"):
                g1, g2 = self.params[fn][bound]
                if fn == "QSM":
                    v = cf.qsm(q.h, q.k, g1, g2)
                elif fn == "EBSP":
                    v = cf.ebsp(q.h, q.m, self.processors, g1, g2)
                else:
                    v = cf.dxbsp(q.h, q.m_b, g1, g2)
                out[f"{fn}_{bound}"] = float(v)
        return out

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {}
        for fn, b in self.params.items():
            d[fn] = {"min": list(b["min"]), "max": list(b["max"])}
            d[fn].update(self.patterns.get(fn, {}))
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, processors: int, banks: int) -> BSPModel:
        params = {fn: {b: (float(d[fn][b][0]), float(d[fn][b][1])) for b in ("min", "max")}
                  for fn in BSP_FUNCTIONS}
        pats = {fn: {k: v for k, v in d[fn].items() if k not in ("min", "max")}
                for fn in BSP_FUNCTIONS}
        return cls(params, processors, banks, pats)
