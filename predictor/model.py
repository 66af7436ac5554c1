"""Cost models with parameters: F = const + max(F1, F2, F3) over named terms, and the BSP-like
bounds with their min/max parameter sets. Evaluated on :class:`predictor.inputs.Step` s through
the pure functions of :mod:`predictor.costfuncs`.

Term names (the vocabulary shared by fitting, profiles and evaluation):

- F1 (one value per processor, then the max, seed 004 section 4.2): ``acc`` = loads + stores
  (the paper's C0E2 + C0E3), any canonical counter (``l1d_misses`` = C1E9, ``l2_misses`` =
  C1EA, ``l1d_writebacks`` = C1E6, ``l2_writebacks`` = C0E7 in lines, ``dtlb_misses``,
  ``stores``...), and ``stream:<counter>`` = counter^2 / acc, a counter-only proxy for
  streaming misses (a miss per line of a stride-1 stream gives counter/acc = word/line, a miss
  per access gives 1, so ``a*m + b*m^2/acc`` charges prefetched streams less; predictor/NOTES.md).
- F2 (bus): canonical last-level counters, each summed over processors and divided by the
  machine's processor count p.
- F3 (banks): ``lm`` and ``wb``, last-level misses served by / lines written back to a bank,
  then the max over banks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from predictor import costfuncs as cf
from predictor.errors import MissingCounter
from predictor.inputs import Step, miss_counter, writeback_counter

Array = NDArray[np.float64]

BSP_FUNCTIONS = ("QSM", "EBSP", "DXBSP")
# Declared assumptions where a step lacks what a function needs (DESIGN.md section 3).
ASSUMPTIONS = {
    "banks": "last-level misses and writebacks uniform over the banks (seed 004 section 5.2: "
             "BKC = 1)",
    "K": "K = 1: no word is accessed more than once by all processors together (0 without "
         "accesses)",
    "M_b": "M_b = M / banks: accesses uniform over the banks (BKC = 1)",
}


def counters_needed(term: str) -> list[str]:
    if term == "acc":
        return ["loads", "stores"]
    if term.startswith("stream:"):
        return ["loads", "stores", term[7:]]
    return [term]


def proc_features(step: Step, terms: Sequence[str]) -> Array:
    """``(K, n)`` matrix: term k for each of the step's n processors."""
    acc = step.counter("loads") + step.counter("stores")
    rows = []
    for t in terms:
        if t == "acc":
            rows.append(acc)
        elif t.startswith("stream:"):
            c = step.counter(t[7:])
            rows.append(np.divide(c * c, acc, out=np.zeros_like(c), where=acc > 0))
        else:
            rows.append(step.counter(t))
    return np.array(rows, dtype=np.float64).reshape(len(terms), step.processors)


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

    f1: Mapping[str, float]
    f2: Mapping[str, float]
    f3: Mapping[str, float]
    const: float = 0.0
    llc_level: int = 2
    processors: int = 1
    banks: int = 1
    name: str = "F"

    def needs(self, *, bank_counts: bool = False) -> list[str]:
        """Canonical counters a step must carry for this model; without per-bank counts (any
        recorded program) F3 reads the last level's misses and writebacks."""
        out: list[str] = []
        terms = [*self.f1, *self.f2]
        if not bank_counts:
            terms += [c for t, c in (("lm", miss_counter(self.llc_level)),
                                     ("wb", writeback_counter(self.llc_level)))
                      if self.f3.get(t)]
        for t in terms:
            for c in counters_needed(t):
                if c not in out:
                    out.append(c)
        return out

    def check(self, step: Step) -> None:
        for c in self.needs(bank_counts=step.bank_lm is not None):
            if c not in step.counters:
                raise MissingCounter(c, f"superstep {step.name}", f"model {self.name}")

    def evaluate(self, step: Step) -> Breakdown:
        self.check(step)
        t1 = list(self.f1)
        v1, arg1 = cf.linear_max(proc_features(step, t1), np.array([self.f1[t] for t in t1]))
        # F2: the bus term on per-processor averages (p = the machine's processors).
        sums = np.array([step.counter(c).sum() for c in self.f2])
        v2 = float(np.dot(sums, [self.f2[c] for c in self.f2]) / self.processors)
        feats, assumed_banks = bank_features(step, self.llc_level, self.banks)
        v3, arg3 = cf.linear_max(feats, np.array([self.f3.get("lm", 0.0),
                                                  self.f3.get("wb", 0.0)]))
        res = cf.f_max(v1, v2, v3)
        rank = step.ranks[int(arg1)] if step.ranks else int(arg1)
        return Breakdown(float(v1), v2, float(v3), self.const, float(res.value) + self.const,
                         cf.F_TERMS[int(res.dominant)], rank, int(arg3),
                         ("banks",) if assumed_banks and any(self.f3.values()) else ())

    def predict(self, steps: Sequence[Step]) -> Array:
        return np.array([self.evaluate(s).f for s in steps])

    def to_dict(self) -> dict[str, Any]:
        return {"const": self.const, "F1": dict(self.f1), "F2": dict(self.f2),
                "F3": dict(self.f3)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, llc_level: int, processors: int, banks: int,
                  name: str) -> FModel:
        return cls({k: float(v) for k, v in d.get("F1", {}).items()},
                   {k: float(v) for k, v in d.get("F2", {}).items()},
                   {k: float(v) for k, v in d.get("F3", {}).items()},
                   float(d.get("const", 0.0)), llc_level, processors, banks, name)


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
