"""Predicting the uniform convolution's programs (:mod:`predictor.families.convolution` counts their
operations) with Table 1 models fitted per operation kind (I. Hur and C. Lin, "Incorporating
Cache Effects into a Model of Interprocessor Communication", section 7):

* :func:`fit_kinds`, :func:`predict`: one Table 1 model per operation kind, fitted with
  :func:`predictor.families.mlt.fit_table1`; a program's time is the sum over supersteps of the
  slowest
  processor's summed operation times (the BSP cost).
* :func:`reuse_lines`, :func:`cache_rule`, :func:`warm_ops`: which operations find their data
  cached (below).
* :func:`crossover`: the smallest block size at which Conv-Scan is faster;
  :func:`crossover_range`: the measured one with its uncertainty.

Cache state (the paper's section 3.1: MLT stands for compulsory and capacity misses; here the
two are told apart explicitly). Every kind is calibrated twice, cold (its lines come from
memory) and warm (its data left cached), and each operation of a program is predicted with one
of the two models by this rule, decided from the machine description and the accounting alone:

* its reuse distance (:func:`reuse_lines`) is, per region it touches, the distinct lines its
  processor touched since that region's data was last touched (the program run back to back,
  as the bench times it), counted exactly from :attr:`Op.regions`; the operation's is its
  regions' largest (its data is cached only if all of it is);
* it is warm when ``sharing x distance x 64 B <= size`` of the deciding cache level
  (:func:`cache_rule`: a :class:`counterd.machine.geometry.CacheLevel`, ``sharing`` the program's
  processors its ``shared_cpus`` covers: 1 for a per-core L2, p for a shared L3), cold
  otherwise (a capacity miss on every line, as after the calibration's eviction).

In Conv-Shift's loop the distance is three arrays' shares (acc, T_{k-1}, T_k: 3 L^2 / 2 words
per processor on 1 x 2). The bench uses the per-core L2 by default and reports the last
level's rule beside it (bench/convolution.py).

Within one operation kind the arithmetic count p is a fixed multiple of n (an add does one
operation per three loads and stores), so section 7.1's delta p folds into beta n: the models
are fitted per kind on (n, MLT) alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from numpy.typing import ArrayLike

from counterd.machine.geometry import CacheLevel
from predictor.errors import BadInput
from predictor.families import mlt as ml
from predictor.families.convolution import LINE_BYTES, Op, Superstep


class Predicts(Protocol):
    def predict(self, table: Any) -> np.ndarray: ...


def fit_kinds(samples: Mapping[str, tuple[ArrayLike, ArrayLike, ArrayLike]], *,
              models: Sequence[str] = ("S1", "M1"), train_fraction: float = 0.7,
              max_train: int = ml.TRAINING_SIZE, seed: int = 0
              ) -> dict[str, dict[str, ml.RegressionFit]]:
    """Per model name, per operation kind: the Table 1 model fitted on that kind's samples
    (n, MLT, seconds) with :func:`predictor.families.mlt.fit_table1`, ``train_fraction`` of them (at
    most the paper's 100) to train, the rest to test."""
    if not 0 < train_fraction < 1:
        raise BadInput(f"train fraction {train_fraction}", "give a fraction in (0, 1)")
    out: dict[str, dict[str, ml.RegressionFit]] = {m: {} for m in models}
    for kind, (n, lines, times) in samples.items():
        y = np.asarray(times, dtype=float).ravel()
        most_terms = max(len(ml.TABLE1.get(m, ())) for m in models)
        train = min(max_train, max(most_terms + 2, int(round(train_fraction * y.size))))
        if y.size <= train:
            raise BadInput(f"{y.size} calibration samples of {kind}",
                           f"measure more than {train}")
        fits = ml.fit_table1({"n": n, "mlt": lines}, y, train=train, seed=seed, models=models)
        for f in fits:
            out[f.name][kind] = f
    return out


# -- cache state ------------------------------------------------------------------------------

@dataclass(frozen=True)
class CacheRule:
    """Which data a cache level keeps: an operation is *warm* when ``sharing`` x its reuse
    distance (:func:`reuse_lines`) x 64 B fits in ``size_bytes``, *cold* otherwise.
    ``sharing``: the program's processors that share the level (1 for a per-core cache; the
    SPMD processors touch equal amounts, so the level holds ``sharing`` times one's)."""

    level: int
    size_bytes: int
    sharing: int = 1

    def __post_init__(self) -> None:
        if self.level < 1 or self.size_bytes < LINE_BYTES or self.sharing < 1:
            raise BadInput(f"cache rule {self}", "level >= 1, a size of a line or more, "
                           "sharing >= 1")

    def warm(self, reuse: int) -> bool:
        return self.sharing * reuse * LINE_BYTES <= self.size_bytes

    def describe(self) -> str:
        per = f"{self.size_bytes / 2**20:g} MiB"
        share = "per core" if self.sharing == 1 else f"shared by {self.sharing} processors"
        return f"L{self.level} ({per}, {share})"


def cache_rule(levels: Sequence[CacheLevel], p: int, level: int | None = None) -> CacheRule:
    """The rule of cache ``level`` of a machine description (:attr:`counterd.machine.
    description.Machine.levels`; None: the last level) for p processors pinned one per CPU: it
    is shared by as many of them as its ``shared_cpus`` lists (at most p; 1 when unknown)."""
    if not levels:
        raise BadInput("a machine without cache levels", "describe the caches (a machine "
                       "file, or sysfs)")
    if level is None:
        lv = levels[-1]
    else:
        found = [x for x in levels if x.level == level]
        if not found:
            raise BadInput(f"cache level {level}",
                           "use one of " + ", ".join(str(x.level) for x in levels))
        lv = found[0]
    sharing = max(1, min(p, len(lv.shared_cpus))) if lv.shared_cpus else 1
    return CacheRule(lv.level, lv.size_bytes, sharing)


def reuse_lines(steps: Sequence[Superstep]) -> list[list[list[int]]]:
    """Per superstep, per processor, per operation: the operation's reuse distance in lines,
    counted exactly from the regions the operations touch (:attr:`Op.regions`).

    The program runs again and again (the bench times repeated runs), so every line has been
    touched before. For each region of an operation: the distinct lines this processor touched
    since its oldest line was last touched (that line included: the LRU stack distance of the
    region); the operation's distance is its regions' largest. Operations without regions (the
    calibration shapes) get 0."""
    out = [[[0] * len(ops) for ops in s.ops] for s in steps]
    p = max((len(s.ops) for s in steps), default=0)
    for r in range(p):
        seq = [(i, j, op) for i, s in enumerate(steps) if r < len(s.ops)
               for j, op in enumerate(s.ops[r])]
        ids = [[reg.line_ids() for reg in op.regions] for _, _, op in seq]
        top = max((int(x.max()) for regs in ids for x in regs), default=-1) + 1
        if top == 0:
            continue
        last = np.full(top, -1, dtype=np.int64)
        n = len(seq)
        for t in range(2 * n):  # the first pass only records: a run follows a run
            regs = ids[t % n]
            if t >= n:
                dist = 0
                for x in regs:
                    since = int(last[x].min())
                    dist = max(dist, int(np.count_nonzero(last >= since)))
                i, j, _ = seq[t % n]
                out[i][r][j] = dist
            for x in regs:
                last[x] = t
    return out


def warm_ops(steps: Sequence[Superstep], rule: CacheRule) -> list[list[list[bool]]]:
    """Per superstep, per processor, per operation: warm under ``rule``."""
    return [[[rule.warm(d) for d in ops] for ops in step] for step in reuse_lines(steps)]


def superstep_times(steps: Sequence[Superstep], models: Mapping[str, Predicts], *,
                    warm_models: Mapping[str, Predicts] | None = None,
                    rule: CacheRule | None = None) -> np.ndarray:
    """Predicted seconds of each superstep: per processor the sum of its operations' predicted
    times, the slowest processor's. With ``warm_models`` and ``rule``, an operation that
    :func:`warm_ops` calls warm is predicted by its kind's warm model (a kind without one keeps
    its ``models`` entry), the others by ``models`` (the cold ones)."""
    warm = warm_ops(steps, rule) if warm_models is not None and rule is not None else None
    by_kind: dict[tuple[str, bool], list[tuple[int, int, Op]]] = {}
    p = max((len(s.ops) for s in steps), default=0)
    for i, s in enumerate(steps):
        for r, ops in enumerate(s.ops):
            for j, op in enumerate(ops):
                hot = warm is not None and warm[i][r][j]
                by_kind.setdefault((op.kind, hot), []).append((i, r, op))
    per = np.zeros((len(steps), max(p, 1)))
    for (kind, hot), items in by_kind.items():
        if kind not in models:
            raise BadInput(f"no fitted model for {kind} operations",
                           "calibrate every kind: " + ", ".join(sorted({k for k, _ in by_kind})))
        model = warm_models[kind] if hot and warm_models and kind in warm_models \
            else models[kind]
        t = model.predict({"n": np.array([o.n for _, _, o in items], dtype=float),
                           "mlt": np.array([o.mlt for _, _, o in items], dtype=float)})
        for (i, r, _), v in zip(items, np.asarray(t, dtype=float), strict=True):
            per[i, r] += v
    return per.max(axis=1)


def predict(steps: Sequence[Superstep], models: Mapping[str, Predicts], *,
            warm_models: Mapping[str, Predicts] | None = None,
            rule: CacheRule | None = None) -> float:
    """Predicted seconds of a program: the sum over supersteps of the slowest processor (warm
    and cold operations as :func:`superstep_times` says)."""
    return float(superstep_times(steps, models, warm_models=warm_models, rule=rule).sum())


def crossover(blocks: Iterable[int], ratios: Iterable[float]) -> int | None:
    """The smallest block size whose ratio (Conv-Shift time / Conv-Scan time) exceeds 1, that
    is where Conv-Scan is faster; None if it never is."""
    pairs = sorted(zip(blocks, ratios, strict=True))
    for b, r in pairs:
        if not np.isfinite(r):
            raise BadInput(f"ratio {r} at b = {b}", "give finite ratios")
        if r > 1.0:
            return int(b)
    return None


FIRM = 0.8  # a verdict is firm when at least this share of repetition pairs gives it


def crossover_range(blocks: Iterable[int], scan_faster: Iterable[float], *,
                    firm: float = FIRM) -> tuple[int | None, int | None]:
    """The measured crossover with its uncertainty, from the share of repetition pairs (one
    Conv-Shift and one Conv-Scan time measured together) in which Conv-Scan is faster, per
    block size. A block size is firmly Conv-Shift's when at most 1 - ``firm`` of its pairs
    say Conv-Scan, firmly Conv-Scan's when at least ``firm`` do, uncertain otherwise.

    Returns (lo, hi): lo the smallest block size that is not firmly Conv-Shift's, hi the
    smallest from which every larger one is firmly Conv-Scan's. The crossover lies in
    [lo, hi] (a single block size when lo == hi). (None, None): Conv-Shift is firmly faster
    everywhere; hi None: Conv-Scan is not firmly faster at the largest block size."""
    if not 0.5 < firm <= 1:
        raise BadInput(f"firm share {firm}", "give a share in (0.5, 1]")
    pairs = sorted(zip(blocks, scan_faster, strict=True))
    for b, s in pairs:
        if not 0 <= s <= 1:
            raise BadInput(f"share {s} at b = {b}", "give shares in [0, 1]")
    lo = next((int(b) for b, s in pairs if s > 1 - firm), None)
    if lo is None:
        return None, None
    hi: int | None = None
    for b, s in reversed(pairs):
        if s < firm:
            break
        hi = int(b)
    return lo, hi


__all__ = ["CacheRule", "cache_rule", "crossover", "crossover_range", "fit_kinds", "predict",
           "reuse_lines", "superstep_times", "warm_ops"]
