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

from predictor.inputs import _pattern_step, miss_counter, writeback_counter
from predictor.model import FModel, coefficients


def _pattern(procs: int, stride: int, level: str, op: str, mode: str, place: str, *,
             levels: tuple[int, ...], banks: int, line: int, word: int, page: int, n: int,
             suite: str) -> dict[str, Any]:
    depth = len(levels) + 1 if level == "mem" else int(level[1:])
    frac = min(1.0, stride * word / line)  # lines touched per access
    stores = float(n) if op == "store" else 0.0
    loads = float(n) - stores
    step_lines = max(1, stride * word // line)
    nb = banks // math.gcd(banks, step_lines)  # banks one processor's lines rotate through
    procs_out = []
    all_lm = np.zeros(banks)
    all_wb = np.zeros(banks)
    acc_bank = np.zeros(banks)
    touched: set[int] = set()
    for r in range(procs):
        start = 0 if (mode == "concurrent" or place == "same") else (r * nb) % banks
        bset = [(start + i * step_lines) % banks for i in range(nb)]
        touched.update(bset)
        c: dict[str, float] = {"loads": loads, "stores": stores}
        for lv in levels:
            miss = n * frac if lv < depth else 0.0
            c[miss_counter(lv)] = miss
            c[writeback_counter(lv)] = miss if op == "store" else 0.0
        big = level == "mem" or depth > len(levels) - 1
        c["dtlb_misses"] = n * min(1.0, stride * word / page) if big else 0.0
        llc = c[miss_counter(levels[-1])]
        lm = np.zeros(banks)
        wb = np.zeros(banks)
        for b in bset:
            lm[b] += llc / nb
            wb[b] += c[writeback_counter(levels[-1])] / nb
            acc_bank[b] += n / nb
        all_lm += lm
        all_wb += wb
        procs_out.append({"rank": r, "cpu": r, "time_ns_samples": [],
                          "counters": {k: {"value": v, "source": "simulated"}
                                       for k, v in c.items()},
                          "banks": {"lm": lm.tolist(), "wb": wb.tolist()}})
    bkc = procs / len(touched) if level == "mem" else 0.0
    code = f"{'L' if op == 'load' else 'S'}{'E' if mode == 'exclusive' else 'C'}"
    bkc_text = Fraction(bkc).limit_denominator(64)
    return {
        "mnemonic": f"p{procs}.s{stride}.b{bkc_text}.{level}.{place}.{code}", "suite": suite,
        "procs": procs, "stride_words": stride, "bkc": bkc, "op": op, "mode": mode,
        "level": level, "coherence": None, "accesses_per_proc": n,
        "processors": procs_out, "banks": {"lm": all_lm.tolist(), "wb": all_wb.tolist()},
        "bsp": {"H": float(n), "K": float(procs if mode == "concurrent" else 1),
                "M": float(n * procs), "M_b": float(acc_bank.max())},
        "flags": [],
    }


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
                                pats.append(_pattern(p, stride, level, op, mode, place,
                                                     levels=levels, banks=banks, line=line,
                                                     word=word, page=page, n=size,
                                                     suite=suite))
    for i, d in enumerate(pats):
        t = float(model.evaluate(_pattern_step(i, d)).f) * math.exp(noise * rng.normal())
        d["time_ns"] = {"samples": [t], "median": t, "spread": 0.0, "warmup_dropped": 1}
        d["per_access_ns"] = t / d["accesses_per_proc"]
    geo_levels = [{"level": lv, "size_bytes": (32 << 10) << (4 * (lv - 1)), "ways": 8,
                   "line_bytes": line} for lv in levels]
    return {
        "format": "counterd-microbench", "version": 1, "created": "synthetic",
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
