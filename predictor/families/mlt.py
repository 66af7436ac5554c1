"""Memory lines touched (MLT) by row and column transfers of a row-major array.

Stricker-style communication models count the memory lines a message touches (MLT) beside its
length: the paper of the "memory lines touched" family (two scans of it are among this
project's sources; its section 3.2.1, Theorems 1 and 2, equations 3-6) gives closed-form lower
and upper bounds for a b_r x b_c array of elements stored row-major, lines of l elements, when
d rows or the d leftmost columns are transferred. Here: the exact count for an array that
starts ``offset`` elements into a line, and those bounds with the domain in which they hold,
found by brute force against the exact count (``tests/predictor/test_mlt.py`` checks every
shape of a grid and thousands of random ones):

* Rows (eq. 3, 4): LB_R = ceil(b_c d / l), UB_R = LB_R + 1. The exact count is
  floor((o + b_c d - 1) / l) + 1 for an offset 0 <= o < l, which lies in [LB_R, UB_R] for every
  shape: the bounds hold everywhere. (The second scan prints LB_R with a floor, a weaker bound
  that also holds; the ceiling is the tight one and is what is implemented.)
* Columns (eq. 5, 6), q = gcd(b_c, l), A = b_r q / l:
  LB_C = floor(A) (l/q + ceil(d/q) - 1), UB_C = ceil(A) (l/q + ceil(d/q)). The paper assumes
  b_c > 2l. The brute force found that assumption neither needed nor enough: the bounds hold,
  for every offset, exactly when d <= b_c - l + 1 (every pair of consecutive rows keeps at
  least l - 1 untransferred elements between their transferred parts, so no line holds data
  of two rows' transfers, which the proof's per-row groups assume), whatever b_c; at
  d = b_c - l + 2 the lower bound fails (2 x 5 array, l = 2, d = 5: 5 lines, LB_C = 6). The
  upper bound held in every case tried. Outside that domain the exact count is the answer,
  and ``in_domain`` says so.

The paper's cost model (its eq. 2) is t = alpha + beta n + f(MLT) for a message of n bytes; its
Table 1 lists six linear regression models, :data:`TABLE1`, fitted here with the project's
modelling toolkit as the paper fits them (eq. 9: ordinary least squares on normalised columns,
so ``errors="absolute"``; every term kept). They are judged on a test set apart from the 100
training measurements by the paper's two statistics, :func:`r_squared` (eq. 11, the residual
over the total sum of squares: 0 is exact, 1 is no better than the mean, below 0.01 is what the
paper calls acceptable) and :func:`ms_e` (eq. 10).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from predictor.errors import BadInput
from predictor.toolkit import fitting
from predictor.toolkit import model as md
from predictor.toolkit import terms as tm


@dataclass(frozen=True)
class Count:
    exact: int
    lower: int
    upper: int
    in_domain: bool  # the closed-form bounds are proven here to hold for this shape

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _check(b_r: int, b_c: int, line: int, d: int, offset: int, limit: int, what: str) -> None:
    for name, v in (("rows", b_r), ("columns", b_c), ("line", line), ("d", d)):
        if not isinstance(v, int) or v < 1:
            raise BadInput(f"{name} = {v!r}", "give a positive integer")
    if d > limit:
        raise BadInput(f"d = {d} {what} of a {b_r}x{b_c} array", f"give d <= {limit}")
    if not 0 <= offset < line:
        raise BadInput(f"offset {offset} with lines of {line} elements",
                       f"give 0 <= offset < {line}")


def row_lines(b_r: int, b_c: int, line: int, d: int, offset: int = 0) -> int:
    """Exact: lines touched by the first d rows (b_c d contiguous elements from ``offset``)."""
    _check(b_r, b_c, line, d, offset, b_r, "rows")
    return (offset + b_c * d - 1) // line + 1


def column_lines(b_r: int, b_c: int, line: int, d: int, offset: int = 0) -> int:
    """Exact: lines touched by the d leftmost columns. Row i covers elements
    [o + i b_c, o + i b_c + d) and so lines floor(start/l) .. floor(end/l); the rows' ranges
    come in increasing order, so their union is counted by merging neighbours in one pass."""
    _check(b_r, b_c, line, d, offset, b_c, "columns")
    total, last = 0, -1
    for i in range(b_r):
        start = offset + i * b_c
        first, end = start // line, (start + d - 1) // line
        first = max(first, last + 1)
        if end >= first:
            total += end - first + 1
            last = end
    return total


def row_bounds(b_c: int, line: int, d: int) -> tuple[int, int]:
    """Equations 3 and 4 (ceiling form)."""
    lb = -(-b_c * d // line)
    return lb, lb + 1


def column_bounds(b_r: int, b_c: int, line: int, d: int) -> tuple[int, int]:
    """Equations 5 and 6."""
    q = math.gcd(b_c, line)
    per_group = line // q + -(-d // q)
    return (b_r * q // line) * (per_group - 1), -(-(b_r * q) // line) * per_group


def column_bounds_hold(b_r: int, b_c: int, line: int, d: int) -> bool:
    """The domain in which equations 5 and 6 bound the exact count for every offset, as the
    brute force found it (module docstring): d <= b_c - l + 1."""
    return d <= b_c - line + 1


def rows(b_r: int, b_c: int, line: int, d: int, offset: int = 0) -> Count:
    lo, hi = row_bounds(b_c, line, d)
    return Count(row_lines(b_r, b_c, line, d, offset), lo, hi, True)


def columns(b_r: int, b_c: int, line: int, d: int, offset: int = 0) -> Count:
    exact = column_lines(b_r, b_c, line, d, offset)
    if column_bounds_hold(b_r, b_c, line, d):
        lo, hi = column_bounds(b_r, b_c, line, d)
        return Count(exact, lo, hi, True)
    return Count(exact, exact, exact, False)  # outside the domain: the exact count


# -- the regression models of Table 1 -----------------------------------------------------------

# Inputs: n (bytes transferred, or loads and stores for a computation) and mlt (memory lines
# touched). The paper's Table 1, term for term.
TABLE1: dict[str, tuple[str, ...]] = {
    "S1": ("1", "n"),
    "S2": ("1", "n", "n^2"),
    "S3": ("1", "n", "n^2", "n^3"),
    "M1": ("1", "n", "mlt"),
    "M2": ("1", "n", "mlt", "mlt*n"),
    "M3": ("1", "n", "mlt", "mlt*n", "n^2", "mlt^2"),
}
TRAINING_SIZE = 100  # the paper's training set; the rest of the measurements are the test set


def _pair(y: ArrayLike, y_hat: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    a, b = np.asarray(y, dtype=float).ravel(), np.asarray(y_hat, dtype=float).ravel()
    if a.shape != b.shape or a.size == 0:
        raise BadInput(f"{a.size} measured values and {b.size} predictions",
                       "give one prediction per measured value")
    return a, b


def r_squared(y: ArrayLike, y_hat: ArrayLike) -> float:
    """The paper's eq. 11 (after Mason et al.): sum (y - y_hat)^2 / sum (y - mean y)^2. Smaller
    is better: 0 predicts exactly, 1 is as good as predicting the mean. (Not the usual R^2,
    which is one minus this.)"""
    a, b = _pair(y, y_hat)
    total = float(np.sum((a - a.mean()) ** 2))
    if total == 0:
        raise BadInput("every measured value is the same", "measure over varied sizes")
    return float(np.sum((a - b) ** 2)) / total


def ms_e(y: ArrayLike, y_hat: ArrayLike, p: int) -> float:
    """The paper's eq. 10: sum (y - y_hat)^2 / (n - p - 1), n samples, p + 1 coefficients."""
    a, b = _pair(y, y_hat)
    dof = a.size - p - 1
    if dof <= 0:
        raise BadInput(f"{a.size} samples for a model of {p + 1} coefficients",
                       "test on more samples than coefficients")
    return float(np.sum((a - b) ** 2)) / dof


@dataclass(frozen=True)
class RegressionFit:
    """One Table 1 model fitted on the training set and judged on the test set."""

    name: str
    model: md.Model
    r2: float  # eq. 11 on the test set
    mse: float  # eq. 10 on the test set
    mre: float  # Brewer's mean relative error on the test set (1.0 is exact)
    n_train: int
    n_test: int
    narrow_r2: float | None = None  # eq. 11 on the test set's narrow messages (see fit_table1)
    n_narrow: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "formula": self.model.formula(),
                "terms": [str(t) for t in self.model.terms],
                "coef": self.model.coef.tolist(), "r2": self.r2, "ms_e": self.mse,
                "mre": self.mre, "n_train": self.n_train, "n_test": self.n_test,
                "narrow_r2": self.narrow_r2, "n_narrow": self.n_narrow}


def split(n_samples: int, train: int = TRAINING_SIZE, seed: int = 0
          ) -> tuple[np.ndarray, np.ndarray]:
    """(training, test) indices: ``train`` samples drawn at random for training, the rest for
    testing (the paper's section 4.4)."""
    if n_samples <= train:
        raise BadInput(f"{n_samples} measurements, {train} needed for training alone",
                       f"measure more than {train} transfers")
    order = np.random.default_rng(seed).permutation(n_samples)
    return np.sort(order[:train]), np.sort(order[train:])


def fit_table1(table: Mapping[str, ArrayLike], times: ArrayLike, *,
               train: int = TRAINING_SIZE, seed: int = 0,
               models: Sequence[str] = tuple(TABLE1),
               narrow: ArrayLike | None = None) -> tuple[RegressionFit, ...]:
    """Every model of ``models`` (names of :data:`TABLE1`) fitted on ``train`` measurements
    drawn from ``table`` (inputs n and mlt, one value per measurement) and ``times``, judged on
    the others. ``narrow``: a mask of the measurements whose R^2 is also reported apart (the
    column messages narrower than a line, where lines and bytes are far from proportional)."""
    unknown = [m for m in models if m not in TABLE1]
    if unknown:
        raise BadInput(f"no regression model {unknown[0]!r}", "choose from " + ", ".join(TABLE1))
    y = fitting.check_times(times, where="transfer times")
    data = {k: np.asarray(v, dtype=float).ravel() for k, v in table.items()}
    for k in ("n", "mlt"):
        if k not in data or data[k].size != y.size:
            raise BadInput(f"the measurements need {k!r} for every one of {y.size} times",
                           "give n and mlt per measurement")
    tr, te = split(y.size, train, seed)
    out = []
    for name in models:
        terms = tm.parse_all(TABLE1[name])
        model = md.fit_model(terms, {k: v[tr] for k, v in data.items()}, y[tr],
                             modeler="fixed", errors="absolute",
                             validation=({k: v[te] for k, v in data.items()}, y[te]),
                             where=f"model {name}")
        pred = model.predict({k: v[te] for k, v in data.items()})
        sub = None if narrow is None else np.asarray(narrow, dtype=bool).ravel()[te]
        many = sub is not None and sub.sum() > 1 and np.ptp(y[te][sub]) > 0
        out.append(RegressionFit(
            name, model, r_squared(y[te], pred), ms_e(y[te], pred, len(terms) - 1),
            fitting.mre(y[te], pred), len(tr), len(te),
            r_squared(y[te][sub], pred[sub]) if many and sub is not None else None,
            int(sub.sum()) if sub is not None else 0))
    return tuple(out)


# -- measured transfers (the file ``microbench transfer`` writes) ---------------------------------

TRANSFER_FORMAT = "microbench-transfer"
TRANSFER_VERSIONS = (1,)
TRANSFER_KINDS = ("rows", "cols")


@dataclass(frozen=True)
class Transfers:
    """The measured messages of one kind: inputs n (bytes) and mlt (lines), times (seconds)."""

    kind: str
    n: np.ndarray
    mlt: np.ndarray
    times: np.ndarray
    d: np.ndarray  # rows or columns per message
    line: int  # elements per line
    flagged: int  # measurements the runner flagged (unstable, loaded, steal, preempted)

    @property
    def narrow(self) -> np.ndarray:
        """Column messages narrower than a line: a line (or two) per element row, whatever
        the bytes (none for rows)."""
        return (self.d < self.line) if self.kind == "cols" else np.zeros(self.d.size, bool)

    @property
    def table(self) -> dict[str, np.ndarray]:
        return {"n": self.n, "mlt": self.mlt}


def transfers(doc: Any, kind: str, where: str = "transfers") -> Transfers:
    """The ``kind`` messages of a transfer results document; BadInput naming the first bad
    entry."""
    from predictor.inputs import check_format

    fix = "give the file `microbench transfer --out` wrote"
    doc = check_format(doc, TRANSFER_FORMAT, TRANSFER_VERSIONS, where, "microbench transfer")
    if kind not in TRANSFER_KINDS:
        raise BadInput(f"transfer kind {kind!r}", "choose rows or cols")
    cases = doc.get("cases")
    if not isinstance(cases, list):
        raise BadInput(f"{where} has no list of cases", fix)
    line_b, elem_b = doc.get("line_bytes"), doc.get("element_bytes")
    if not (isinstance(line_b, int) and isinstance(elem_b, int) and 0 < elem_b <= line_b):
        raise BadInput(f"{where} has line_bytes {line_b!r}, element_bytes {elem_b!r}", fix)
    n, lines, times, ds, flagged = [], [], [], [], 0
    for i, c in enumerate(cases):
        if not isinstance(c, dict) or c.get("kind") not in TRANSFER_KINDS:
            raise BadInput(f"{where}: case {i} is not a rows or cols transfer", fix)
        if c["kind"] != kind:
            continue
        raw = [c.get(k) for k in ("n_bytes", "mlt", "time_s", "d")]
        vals = [float(v) for v in raw if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if len(vals) < 4 or not all(math.isfinite(v) and v > 0 for v in vals):
            raise BadInput(f"{where}: case {i} has n_bytes, mlt, time_s, d = {raw}",
                           "every case needs positive, finite values: " + fix)
        n.append(vals[0])
        lines.append(vals[1])
        times.append(vals[2])
        ds.append(vals[3])
        flagged += bool(c.get("flags"))
    return Transfers(kind, np.array(n), np.array(lines), np.array(times), np.array(ds),
                     line_b // elem_b, flagged)


__all__ = ["TABLE1", "TRAINING_SIZE", "TRANSFER_KINDS", "Count", "RegressionFit", "Transfers",
           "column_bounds",
           "column_bounds_hold", "column_lines", "columns", "fit_table1", "ms_e", "r_squared",
           "row_bounds", "row_lines", "rows", "split", "transfers"]
