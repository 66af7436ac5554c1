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
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from predictor.errors import BadInput


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


__all__ = ["Count", "column_bounds", "column_bounds_hold", "column_lines", "columns",
           "row_bounds", "row_lines", "rows"]
