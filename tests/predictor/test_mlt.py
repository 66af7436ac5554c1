"""Memory lines touched: exact counts against enumeration, the closed forms inside the domain
found for them, and the CLI."""

from __future__ import annotations

import json
import random

import pytest

from predictor import mlt
from predictor.cli import main
from predictor.errors import BadInput


def _enumerated_columns(br: int, bc: int, line: int, d: int, o: int) -> int:
    return len({(o + i * bc + j) // line for i in range(br) for j in range(d)})


def _enumerated_rows(bc: int, line: int, d: int, o: int) -> int:
    return len({(o + k) // line for k in range(bc * d)})


SHAPES = [(br, bc, line) for br in (1, 2, 3, 7, 16) for bc in range(1, 34)
          for line in (1, 2, 3, 4, 8, 10)]


def test_exact_counts_are_the_enumerated_ones() -> None:
    for (br, bc, line), o in ((s, o) for s in SHAPES for o in range(s[2])):
        for d in range(1, bc + 1):
            assert mlt.column_lines(br, bc, line, d, o) == _enumerated_columns(br, bc, line, d, o)
        for d in range(1, br + 1):
            assert mlt.row_lines(br, bc, line, d, o) == _enumerated_rows(bc, line, d, o)


def test_closed_forms_hold_everywhere_inside_their_domain() -> None:
    for (br, bc, line), o in ((s, o) for s in SHAPES for o in range(s[2])):
        for d in range(1, br + 1):
            c = mlt.rows(br, bc, line, d, o)
            assert c.in_domain and c.lower <= c.exact <= c.upper
        for d in range(1, bc + 1):
            c = mlt.columns(br, bc, line, d, o)
            assert c.in_domain == (d <= bc - line + 1)
            assert c.lower <= c.exact <= c.upper
            if not c.in_domain:
                assert c.lower == c.exact == c.upper  # the exact count, said to be one


def test_closed_forms_on_thousands_of_random_large_shapes() -> None:
    rng = random.Random(4)
    for _ in range(3000):
        line = rng.choice([3, 7, 8, 10, 16, 32, 64, 128])
        bc = rng.randint(line, 4000)
        br = rng.randint(1, 4000)
        d = rng.randint(1, bc - line + 1)
        o = rng.randrange(line)
        lo, hi = mlt.column_bounds(br, bc, line, d)
        assert lo <= mlt.column_lines(br, bc, line, d, o) <= hi, (br, bc, line, d, o)
        dr = rng.randint(1, br)
        lo, hi = mlt.row_bounds(bc, line, dr)
        assert lo <= mlt.row_lines(br, bc, line, dr, o) <= hi


def test_the_lower_column_bound_fails_just_outside_the_domain() -> None:
    # 2 x 5 array, lines of 2, all 5 columns: 5 lines, equation 5 says at least 6 (the paper's
    # own assumption b_c > 2l holds here: the domain is d <= b_c - l + 1, not b_c > 2l).
    assert mlt.column_lines(2, 5, 2, 5) == 5
    assert mlt.column_bounds(2, 5, 2, 5)[0] == 6
    assert not mlt.columns(2, 5, 2, 5).in_domain


def test_paper_figure_3_example() -> None:
    # l = 10, b_c = 27 (Figure 4): q = gcd = 1, one group of l/q = 10 rows, A = 1:
    # LB_C = 1 (10 + 1 - 1), UB_C = 1 (10 + 1).
    assert mlt.column_bounds(10, 27, 10, 1) == (10, 11)
    assert mlt.column_lines(10, 27, 10, 1) == 10  # one column: one line per row


def test_bad_input() -> None:
    with pytest.raises(BadInput, match="d <= 5"):
        mlt.column_lines(3, 5, 2, 6)
    with pytest.raises(BadInput, match="offset"):
        mlt.row_lines(3, 5, 2, 1, offset=2)
    with pytest.raises(BadInput, match="positive"):
        mlt.columns(0, 5, 2, 1)


def test_predict_mlt_cli(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mlt", "--cols", "--shape", "100x64", "--line", "8", "--d", "4",
                 "--offset", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == {**mlt.columns(100, 64, 8, 4, 3).to_json(), "transfer": "columns",
                   "shape": [100, 64], "line": 8, "d": 4, "offset": 3}
    assert {"exact", "lower", "upper", "in_domain"} <= set(out)
    assert main(["mlt", "--rows", "--shape", "100x64", "--line", "8", "--d", "3"]) == 0
    text = capsys.readouterr().out
    assert "rows" in text and f"exact {mlt.row_lines(100, 64, 8, 3)}" in text
    assert main(["mlt", "--rows", "--shape", "100by64", "--line", "8", "--d", "3"]) == 2
    assert "--shape" in capsys.readouterr().err
