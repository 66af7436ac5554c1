"""Synthetic microbench results from known coefficients, in the shape of the issue-4 contract
(format "counterd-microbench", version 1). For tests and for showing the calibration works
before real results exist: counters follow from the pattern's stride, level and bank
placement exactly; times come from a given FModel (plus optional log-normal noise), so a fit
must recover the model's coefficients.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import numpy as np

from predictor.costs.costmodel import FModel, coefficients
from predictor.inputs import (
    RESULTS_FORMAT,
    RESULTS_VERSIONS,
    Step,
    miss_counter,
    writeback_counter,
)
from predictor.toolkit.terms import Power


def _pattern(procs: int, stride: int, level: str, op: str, mode: str, place: str, *,
             levels: tuple[int, ...], banks: int, line: int, word: int, page: int, n: int,
             suite: str) -> tuple[dict[str, Any], Step]:
    """One pattern's results entry and its Step (the model's input, built from the same
    numbers without parsing the entry back)."""
    depth = len(levels) + 1 if level == "mem" else int(level[1:])
    frac = min(1.0, stride * word / line)  # lines touched per access
    stores = float(n) if op == "store" else 0.0
    loads = float(n) - stores
    step_lines = max(1, stride * word // line)
    nb = banks // math.gcd(banks, step_lines)  # banks one processor's lines rotate through
    # Every processor counts the same; only the banks its lines fall in differ.
    c: dict[str, float] = {"loads": loads, "stores": stores}
    for lv in levels:
        miss = n * frac if lv < depth else 0.0
        c[miss_counter(lv)] = miss
        c[writeback_counter(lv)] = miss if op == "store" else 0.0
    big = level == "mem" or depth > len(levels) - 1
    c["dtlb_misses"] = n * min(1.0, stride * word / page) if big else 0.0
    llc, llc_wb = c[miss_counter(levels[-1])], c[writeback_counter(levels[-1])]
    counters = {k: {"value": v, "source": "simulated"} for k, v in c.items()}
    same = mode == "concurrent" or place == "same"
    ranks = np.arange(procs)
    starts = np.zeros(procs, dtype=np.int64) if same else (ranks * nb) % banks
    bsets = (starts[:, None] + np.arange(nb)[None, :] * step_lines) % banks  # (procs, nb)
    hits = np.zeros((procs, banks))  # lines of each processor per bank, as a share of 1
    np.add.at(hits, (np.repeat(ranks, nb), bsets.ravel()), 1.0 / nb)
    all_lm, all_wb, acc_bank = (hits * llc).sum(axis=0), (hits * llc_wb).sum(axis=0), \
        (hits * n).sum(axis=0)
    procs_out = [{"rank": r, "cpu": r, "time_ns_samples": [], "counters": counters,
                  "banks": {"lm": (h * llc).tolist(), "wb": (h * llc_wb).tolist()}}
                 for r, h in enumerate(hits)]
    touched = len(np.unique(bsets))
    bkc = procs / touched if level == "mem" else 0.0
    code = f"{'L' if op == 'load' else 'S'}{'E' if mode == 'exclusive' else 'C'}"
    bkc_text = Fraction(bkc).limit_denominator(64)
    name = f"p{procs}.s{stride}.b{bkc_text}.{level}.{place}.{code}"
    bsp = {"H": float(n), "K": float(procs if mode == "concurrent" else 1),
           "M": float(n * procs), "M_b": float(acc_bank.max())}
    meta: dict[str, Any] = {
        "mnemonic": name, "suite": suite, "op": op, "mode": mode, "level": level,
        "coherence": None, "bkc": bkc, "stride_words": stride, "accesses_per_proc": n,
        "procs": procs, "flags": [], "H": bsp["H"], "M": bsp["M"]}
    step = Step(name, {k: np.full(procs, v) for k, v in c.items()}, tuple(range(procs)),
                all_lm, all_wb, bsp["K"], bsp["M_b"], None, meta)
    return {
        "mnemonic": name, "suite": suite,
        "procs": procs, "stride_words": stride, "bkc": bkc, "op": op, "mode": mode,
        "level": level, "coherence": None, "accesses_per_proc": n,
        "processors": procs_out, "banks": {"lm": all_lm.tolist(), "wb": all_wb.tolist()},
        "bsp": bsp, "flags": [],
    }, step


def make_results(model: FModel, *, levels: tuple[int, ...] = (1, 2, 3), processors: int = 4,
                 banks: int = 8, line: int = 64, word: int = 8, page: int = 4096,
                 n: int = 10000, noise: float = 0.0, seed: int = 0,
                 host: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A complete synthetic results document whose times follow ``model`` exactly (times
    ``exp(noise * N(0, 1))``). Table-1 patterns use strides 1, 8, 32, 128 and both bank
    placements; validation patterns other strides and half the accesses; successive patterns
    take n, n/2 and n/4 accesses in turn."""
    rng = np.random.default_rng(seed)
    procs_list = sorted({1, *[1 << i for i in range(1, 8) if 1 << i <= processors],
                         processors})
    lv_names = [f"L{lv}" for lv in levels] + ["mem"]
    pats: list[dict[str, Any]] = []
    steps: list[Step] = []
    for suite, strides, nn in (("table1", (1, 8, 32, 128), n), ("validation", (2, 16, 64), n // 2)):
        for p in procs_list:
            for level in lv_names:
                for stride in strides:
                    if level != "mem" and stride > 8 and suite == "table1":
                        continue
                    for op in ("load", "store"):
                        for mode in ("exclusive", "concurrent"):
                            if p == 1 and mode == "concurrent":
                                continue
                            places = ("spread", "same") if (level == "mem" and p > 1
                                                            and mode == "exclusive") \
                                else ("spread",)
                            for place in places:
                                # Three sizes in turn, so a per-superstep constant is
                                # distinguishable from a per-access cost.
                                size = nn >> (len(pats) % 3)
                                d, st = _pattern(p, stride, level, op, mode, place,
                                                 levels=levels, banks=banks, line=line,
                                                 word=word, page=page, n=size, suite=suite)
                                pats.append(d)
                                steps.append(st)
    for d, st in zip(pats, steps, strict=True):
        t = float(model.evaluate(st).f) * math.exp(noise * rng.normal())
        d["time_ns"] = {"samples": [t], "median": t, "spread": 0.0, "warmup_dropped": 1}
        d["per_access_ns"] = t / d["accesses_per_proc"]
    geo_levels = [{"level": lv, "size_bytes": (32 << 10) << (4 * (lv - 1)), "ways": 8,
                   "line_bytes": line} for lv in levels]
    return {
        "format": RESULTS_FORMAT, "version": max(RESULTS_VERSIONS), "created": "synthetic",
        "backend": "sim", "suite": "all",
        "host": dict(host or {"hostname": "synthetic", "cpu_model": "synthetic CPU",
                              "cpus_online": processors, "page_bytes": page}),
        "geometry": {"spec": "synthetic", "levels": geo_levels, "source": "synthetic"},
        "bank_map": {"banks": banks, "interleave_bytes": line, "provenance": "synthetic"},
        "word_bytes": word, "patterns": pats,
    }


def reference_model(*, levels: tuple[int, ...] = (1, 2, 3), processors: int = 4,
                    banks: int = 8, dtlb: float = 0.0, const: float = 0.0) -> FModel:
    """A plausible modern-host model in ns per event (used as the truth in tests)."""
    llc = levels[-1]
    miss = {1: 2.0, 2: 6.0, 3: 40.0, 4: 60.0}
    wb = {1: 1.0, 2: 3.0, 3: 10.0, 4: 15.0}
    f1 = {"acc": 0.5, **{miss_counter(lv): miss[lv] for lv in levels},
          **{writeback_counter(lv): wb[lv] for lv in levels}}
    if dtlb:
        f1["dtlb_misses"] = dtlb
    return FModel(coefficients(f1),
                  coefficients({miss_counter(llc): 60.0, writeback_counter(llc): 25.0}),
                  coefficients({"lm": 30.0, "wb": 15.0}), const, llc, processors, banks, "truth")


def contended_model(*, processors: int, banks: int = 8, levels: tuple[int, ...] = (1, 2, 3),
                    dtlb: float = 0.0, const: float = 0.0) -> FModel:
    """:func:`reference_model` for P processors on B banks, with the per-bank costs set so
    that each of F1, F2, F3 dominates the patterns the paper fits it on (the truth of the
    many-core recovery tests).

    On all P processors with m last-level misses each, F2 = g2 m; at the least contention
    (P / B processors per bank, every bank busy) F3 = g3 (P / B) m, at the most (every
    processor on one bank) F3 = g3 P m. F2 dominates the first and F3 the second when
    g2 / P < g3 < g2 B / P; g3 = g2 sqrt(B) / P is the geometric middle, for misses and
    writebacks alike. (With P > B and the reference's g3 = g2 / 2, F2 would dominate no
    pattern at all, and no fit could recover it.)"""
    ref = reference_model(levels=levels, processors=processors, banks=banks, dtlb=dtlb,
                          const=const)
    share = math.sqrt(banks) / processors
    llc = levels[-1]
    f3 = {"lm": ref.f2[Power(miss_counter(llc))] * share,
          "wb": ref.f2[Power(writeback_counter(llc))] * share}
    return FModel(ref.f1, ref.f2, coefficients(f3), const, llc, processors, banks, "truth")
