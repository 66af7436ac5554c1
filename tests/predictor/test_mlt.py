"""Memory lines touched: exact counts against enumeration, the closed forms inside the domain
found for them, and the CLI."""

from __future__ import annotations

import json
import random

import pytest

from predictor.cli import main
from predictor.errors import BadInput
from predictor.families import mlt


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


# -- the regression models of Table 1 ----------------------------------------------------------

def test_r_squared_and_ms_e_by_their_definitions() -> None:
    import numpy as np

    y = np.array([1.0, 2.0, 3.0, 6.0])
    p = np.array([1.5, 2.0, 2.0, 5.0])
    # residuals 0.25 + 0 + 1 + 1 = 2.25; mean 3, total 4 + 1 + 0 + 9 = 14
    assert mlt.r_squared(y, p) == pytest.approx(2.25 / 14)
    assert mlt.ms_e(y, p, 1) == pytest.approx(2.25 / (4 - 1 - 1))
    assert mlt.r_squared(y, y) == 0.0
    assert mlt.r_squared(y, np.full(4, y.mean())) == pytest.approx(1.0)  # the mean model
    with pytest.raises(BadInput):
        mlt.ms_e(y, p, 3)  # four samples, four coefficients: no degrees of freedom left
    with pytest.raises(BadInput):
        mlt.r_squared(np.ones(3), np.ones(3))  # nothing to explain
    with pytest.raises(BadInput):
        mlt.r_squared(y, p[:3])


def test_split_draws_100_for_training_and_tests_on_the_rest() -> None:
    import numpy as np

    tr, te = mlt.split(250, seed=4)
    assert len(tr) == 100 and len(te) == 150
    assert not set(tr) & set(te) and set(tr) | set(te) == set(range(250))
    assert np.array_equal(tr, mlt.split(250, seed=4)[0])
    with pytest.raises(BadInput):
        mlt.split(100)


def _synthetic(seed: int = 0, noise: float = 0.0):
    import numpy as np

    rng = np.random.default_rng(seed)
    rows = rng.integers(2, 4000, 300)
    d = rng.integers(1, 60, 300)
    n = 8.0 * rows * d
    lines = np.array([mlt.column_lines(int(r), 2000, 8, int(k))
                      for r, k in zip(rows, d, strict=True)], dtype=float)
    y = 3e-6 + 0.1e-9 * n + 10e-9 * lines
    return {"n": n, "mlt": lines}, y * (1 + noise * rng.standard_normal(300)), d


def test_fit_table1_recovers_known_coefficients_and_m1_beats_s1_on_mlt_data() -> None:
    table, y, d = _synthetic()
    fits = {f.name: f for f in mlt.fit_table1(table, y, narrow=d < 8)}
    assert list(fits) == list(mlt.TABLE1)
    m1 = fits["M1"]
    assert [str(t) for t in m1.model.terms] == ["1", "n", "mlt"]
    assert m1.model.coef == pytest.approx([3e-6, 0.1e-9, 10e-9], rel=1e-6)
    assert m1.r2 < 1e-12 and m1.mre == pytest.approx(1.0)
    assert m1.model.errors == "absolute" and m1.model.modeler == "fixed"
    assert fits["S1"].r2 > 100 * max(m1.r2, 1e-15)
    assert fits["M3"].n_train == 100 and fits["M3"].n_test == 200
    assert fits["S1"].n_narrow == int((d[mlt.split(300)[1]] < 8).sum())
    assert fits["S1"].narrow_r2 is not None and fits["S1"].narrow_r2 > fits["M1"].narrow_r2
    noisy = {f.name: f for f in mlt.fit_table1(*_synthetic(1, 0.05)[:2])}
    assert noisy["M1"].model.coef[2] == pytest.approx(10e-9, rel=0.1)
    with pytest.raises(BadInput):
        mlt.fit_table1(table, y, models=("M9",))
    with pytest.raises(BadInput):
        mlt.fit_table1({"n": table["n"]}, y)


def _doc(table, y, d) -> dict:
    cases = [{"kind": "cols", "n_bytes": int(n), "mlt": int(m), "time_s": float(t), "d": int(k),
              "flags": []} for n, m, t, k in zip(table["n"], table["mlt"], y, d, strict=True)]
    cases += [{"kind": "rows", "n_bytes": int(n), "mlt": int(n // 64 + 1), "time_s": 1e-6 + n
               * 1e-10, "d": 3, "flags": ["unstable"] if i % 2 else []}
              for i, n in enumerate(table["n"][:150])]
    return {"format": "microbench-transfer", "version": 1, "line_bytes": 64, "element_bytes": 8,
            "cases": cases}


def test_transfers_read_a_results_document_and_refuse_a_bad_one() -> None:
    table, y, d = _synthetic()
    doc = _doc(table, y, d)
    cols = mlt.transfers(doc, "cols")
    assert cols.times.size == 300 and cols.line == 8 and cols.flagged == 0
    assert (cols.narrow == (d < 8)).all()
    rows = mlt.transfers(doc, "rows")
    assert rows.times.size == 150 and rows.flagged == 75 and not rows.narrow.any()
    for bad in ({"format": "x"}, {**doc, "version": 9}, {**doc, "cases": None},
                {**doc, "line_bytes": 0},
                {**doc, "cases": [{**doc["cases"][0], "time_s": -1.0}]},
                {**doc, "cases": [{**doc["cases"][0], "mlt": True}]},
                {**doc, "cases": [{"kind": "diagonal"}]}):
        with pytest.raises(BadInput):
            mlt.transfers(bad, "cols")


def test_predict_mlt_results_prints_table_2(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    table, y, d = _synthetic(2, 0.02)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_doc(table, y, d)))
    assert main(["mlt", "--results", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("model") and "cols: S1's R^2 / M1's" in out
    for name in mlt.TABLE1:
        assert any(line.startswith(name) for line in out.splitlines())
    assert main(["mlt", "--results", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    models = {m["name"]: m for m in data["kinds"]["cols"]["models"]}
    assert models["S1"]["r2"] > 2 * models["M1"]["r2"]
    assert data["kinds"]["rows"]["flagged"] == 75
    assert main(["mlt", "--results", str(tmp_path / "none.json")]) == 2
    assert main(["mlt", "--cols", "--shape", "10x10"]) == 2
    assert "--line" in capsys.readouterr().err
