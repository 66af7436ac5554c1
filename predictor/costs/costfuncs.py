"""The cost functions of seed 004 (Amato et al., "Predicting performance on SMPs"), sections
4.1 and 4.2: pure functions of counter arrays, vectorised with numpy.

Shapes: every per-processor argument is an array ``(..., p)`` (the last axis runs over the
processors ``p_i``, idle processors may be present with zero counts), per-level arguments are
``(..., L, p)``, per-bank arguments ``(..., B)``; leading axes (e.g. supersteps) broadcast.
Results have the leading shape ``(...)``. Units: whatever unit the ``g`` parameters carry per
event (the paper: microseconds; machine profiles: nanoseconds).

Every formula was checked against the OCR'd seed by derivation; the deviations found are
written next to the code and collected in predictor/NOTES.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

Array = NDArray[np.float64]

# Order of the terms of F = max(F1, F2, F3): index 0, 1, 2 in ``f_max``'s ``dominant``.
F_TERMS = ("F1", "F2", "F3")


def _a(x: ArrayLike) -> Array:
    return np.asarray(x, dtype=np.float64)


def f1_per_processor(loads: ArrayLike, stores: ArrayLike, misses: ArrayLike,
                     writebacks: ArrayLike, g_acc: float, g_miss: ArrayLike,
                     g_wb: ArrayLike) -> Array:
    """The bracket of F1 for every processor, shape ``(..., p)``.

    Seed 004 section 4.2, generalised to L cache levels (DESIGN.md section 3)::

        g1_F1*(C0E2(p_i) + C0E3(p_i))                 g_acc * (loads + stores)
        + g2_F1*C1E9(p_i) + g3_F1*C1EA(p_i)           + sum_l g_miss[l] * misses[l]
        + g4_F1*C1E6(p_i) + g5_F1*C0E7(p_i)           + sum_l g_wb[l] * writebacks[l]

    ``misses`` and ``writebacks``: ``(..., L, p)``, level l = 0 is L1 (C1E9, C1E6), l = 1 is
    L2 (C1EA, C0E7), ...; ``g_miss``, ``g_wb``: ``(L,)``. Writebacks are in cache lines of
    the level they leave: the paper's C0E7 counts 16-byte quadwords, so its g5 per quadword is
    ``line/16`` times larger per line (128/16 = 8 on the R10000's L2; see
    predictor/costs/profile.py).
    """
    m, w = _a(misses), _a(writebacks)
    gm, gw = _a(g_miss), _a(g_wb)
    if m.shape[-2] != gm.shape[-1] or w.shape[-2] != gw.shape[-1]:
        raise ValueError(f"{m.shape[-2]} miss levels and {w.shape[-2]} writeback levels for "
                         f"{gm.shape[-1]} and {gw.shape[-1]} parameters")
    return (g_acc * (_a(loads) + _a(stores))
            + np.einsum("...lp,l->...p", m, gm) + np.einsum("...lp,l->...p", w, gw))


def f1(loads: ArrayLike, stores: ArrayLike, misses: ArrayLike, writebacks: ArrayLike,
       g_acc: float, g_miss: ArrayLike, g_wb: ArrayLike) -> Array:
    """F1 = max over processors 0 <= i < p of the bracket (``f1_per_processor``).

    Seed 004 section 4.2: "F1 accounts for the usage of the memory hierarchy by individual
    processors": the slowest processor's own accesses, at every level, bound the superstep.
    """
    return np.max(f1_per_processor(loads, stores, misses, writebacks, g_acc, g_miss, g_wb),
                  axis=-1)


def f2(last_misses: ArrayLike, last_writebacks: ArrayLike, g_miss: float, g_wb: float,
       p: int | None = None) -> Array:
    """F2, the bus term: ``g1_F2 * sum_i C1EA(p_i)/p + g2_F2 * sum_i C0E7(p_i)/p``.

    ``last_misses`` / ``last_writebacks``: ``(..., n)`` last-level misses and writebacks
    (lines) of the n processors given. ``p`` is the machine's processor count (the paper's 8),
    not the number of active processors: checked by derivation (NOTES.md, F2): with p = active
    processors, a one-processor memory pattern would get F2 = 1.17 us per miss > F1 = 1.03 us,
    so F2, not F1, would dominate p1.s32.b1/8 on which the paper fitted F1; and with p = 8,
    1.17 us per 8 misses is 128 B * 8 / 1.17 us = 875 MB/s on the 1.2 GB/s bus, as a bus term
    should be. ``p=None`` uses n (all processors of the machine are in the arrays).
    """
    lm, wb = _a(last_misses), _a(last_writebacks)
    n = lm.shape[-1] if p is None else p
    if n <= 0:
        raise ValueError(f"processor count {n} <= 0")
    return (g_miss * lm.sum(axis=-1) + g_wb * wb.sum(axis=-1)) / n


def f3(lm: ArrayLike, wb: ArrayLike, g_miss: float, g_wb: float) -> Array:
    """F3, the bank term: ``max over banks 0 <= j < B of g1_F3*LM(b_j) + g2_F3*WB(b_j)``.

    ``lm``: ``(..., B)`` last-level misses served by each bank; ``wb``: ``(..., B)``
    writebacks to each bank, in lines. The OCR'd seed writes the range as ``0 <= j < p``,
    conflating banks with processors (the SGI had 8 of each); the maximum runs over the B
    banks of the bank map (NOTES.md, F3). The paper's WB(b_j) is in quadwords like C0E7.
    """
    return np.max(g_miss * _a(lm) + g_wb * _a(wb), axis=-1)


class FResult(NamedTuple):
    value: Array  # F = max(F1, F2, F3)
    dominant: NDArray[np.int64]  # 0, 1, 2: which of F_TERMS attains the maximum (first on ties)


def f_max(f1_value: ArrayLike, f2_value: ArrayLike, f3_value: ArrayLike) -> FResult:
    """F = max(F1, F2, F3) and which term dominates (seed 004 section 4.2)."""
    stacked = np.stack(np.broadcast_arrays(_a(f1_value), _a(f2_value), _a(f3_value)), axis=-1)
    return FResult(stacked.max(axis=-1), stacked.argmax(axis=-1))


# -- BSP-like functions, seed 004 section 4.1 ------------------------------------------------

def bsp_h_m(loads: ArrayLike, stores: ArrayLike) -> tuple[Array, Array]:
    """``H`` = max over processors of the accesses (loads + stores) of one processor, ``M`` =
    the total over all processors (section 4.1). Arrays ``(..., p)`` -> ``(...)``, ``(...)``."""
    acc = _a(loads) + _a(stores)
    return acc.max(axis=-1), acc.sum(axis=-1)


def qsm(h: ArrayLike, k: ArrayLike, g1: float, g2: float) -> Array:
    """QSM = max{g1_QSM * H, g2_QSM * K}; K = the maximum number of accesses to one word by
    all processors (section 4.1)."""
    return np.maximum(g1 * _a(h), g2 * _a(k))


def ebsp(h: ArrayLike, m: ArrayLike, p: int, g1: float, g2: float) -> Array:
    """EBSP = max{g1_EBSP * H, g2_EBSP * M/p}; M = total accesses of all p processors.

    ``p`` is the machine's processor count, as in F2 (NOTES.md, EBSP): g1_EBSP is "the cost
    per access ... when no other processor accesses memory", measured on p1 patterns; if p
    were the active count, M/p = H there and the larger g2 would always dominate them.
    """
    if p <= 0:
        raise ValueError(f"processor count {p} <= 0")
    return np.maximum(g1 * _a(h), g2 * _a(m) / p)


def dxbsp(h: ArrayLike, m_b: ArrayLike, g1: float, g2: float) -> Array:
    """DXBSP = max{g1_DXBSP * H, g2_DXBSP * M_b}. The seed says "M_b is the total number of
    accesses directed to the same bank"; what the (d,x)-BSP charges is the busiest bank, so
    M_b = max over banks of the accesses to that bank (NOTES.md, DXBSP)."""
    return np.maximum(g1 * _a(h), g2 * _a(m_b))


def uniform_over_banks(total: ArrayLike, banks: int) -> Array:
    """The declared assumption where per-bank counts are unknown (seed 004 section 5.2: "all
    such accesses are equally distributed among the eight banks (i.e., BKC = 1)"): ``total``
    ``(...)`` -> ``(..., banks)`` each ``total / banks``."""
    t = _a(total)
    return np.repeat(t[..., None] / banks, banks, axis=-1)


def linear_max(features: ArrayLike, coef: ArrayLike) -> tuple[Array, NDArray[np.int64]]:
    """``max over the last axis of sum_k coef[k] * features[..., k, j]`` and its argmax.

    The common shape of F1 (j over processors) and F3 (j over banks) with any term list;
    ``features``: ``(..., K, J)``, ``coef``: ``(K,)``.
    """
    v = np.einsum("...kj,k->...j", _a(features), _a(coef))
    return v.max(axis=-1), v.argmax(axis=-1)


def error_ratio(t: ArrayLike, p: ArrayLike) -> Array:
    """The paper's error (section 5.1): E = max{T, P} / min{T, P} >= 1; inf when one is 0."""
    ta, pa = _a(t), _a(p)
    lo, hi = np.minimum(ta, pa), np.maximum(ta, pa)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(lo > 0, hi / np.where(lo > 0, lo, 1.0), np.where(hi > 0, np.inf, 1.0))


def predict_superstep(profile: Any, counters: Mapping[str, ArrayLike],
                      variant: str | None = None) -> dict[str, Any]:
    """The entry point counterd calls (counterd/prediction.py): ``counters`` maps canonical
    names to arrays over processors; returns ``F1``, ``F2``, ``F3``, ``F`` and the BSP bounds
    ``<fn>_min`` / ``<fn>_max`` in **seconds** (profiles hold ns), ``model`` (the variant used:
    ``variant``, else the most complete one whose counters are present) and ``accuracy`` (its
    average and maximum E as calibration measured them, where the profile has them). Raises
    NoVariant or MissingCounter when the counters cannot support a prediction."""
    from predictor.inputs import Step  # lazy: model and inputs import this module

    step = Step("superstep", {k: np.atleast_1d(_a(v)) for k, v in counters.items()})
    name = variant or profile.select_model(step.counters)
    br = profile.f_model(name).evaluate(step)
    out: dict[str, Any] = {"F1": br.f1 * 1e-9, "F2": br.f2 * 1e-9, "F3": br.f3 * 1e-9,
                           "F": br.f * 1e-9, "model": name,
                           "accuracy": dict(profile.accuracy(name))}
    out.update({k: v * 1e-9 for k, v in profile.bsp_model().evaluate(step).items()})
    return out
