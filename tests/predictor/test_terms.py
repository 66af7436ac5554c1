"""Terms (predictor/toolkit/terms.py): each kind evaluated on a small table against values worked
out by
hand, the text form read back (``parse(str(t)) == t``), the canonical product, growth terms and
the design checks that refuse what no least-squares fit can estimate."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from predictor.errors import BadInput
from predictor.toolkit import terms as tm
from predictor.toolkit.terms import (
    Accesses,
    CeilDiv,
    Const,
    Exp2,
    Hinge,
    Power,
    Product,
    Streaming,
    check_design,
    design,
    growth_terms,
    parse,
    parse_all,
    product,
)

# -- evaluation on a small table, against hand values -----------------------------------------

TABLE = {
    "n": np.array([1.0, 2.0, 4.0, 8.0]),
    "bpd": np.array([1.0, 2.0, 3.0, 4.0]),
    "width": np.array([10.0, 10.0, 10.0, 10.0]),
    "loads": np.array([1.0, 0.0, 3.0, 0.0]),
    "stores": np.array([2.0, 0.0, 1.0, 0.0]),
    "x": np.array([3.0, 5.0, 2.0, 0.0]),
}

HAND = [
    # log is log2: log2(1, 2, 4, 8) = 0, 1, 2, 3
    ("1", [1, 1, 1, 1]),
    ("n", [1, 2, 4, 8]),
    ("log(n)", [0, 1, 2, 3]),
    ("n*log(n)", [0, 2, 8, 24]),
    ("n^2", [1, 4, 16, 64]),
    # n^1.5 * log2(n)^2: 0; 2^1.5 * 1; 8 * 4; 8^1.5 * 9
    ("n^1.5*log(n)^2", [0, 2 ** 1.5, 32, 8 ** 1.5 * 9]),
    ("2^bpd", [2, 4, 8, 16]),
    ("ceil(width/bpd)", [10, 5, 4, 3]),  # 10/3 = 3.33 -> 4, 10/4 = 2.5 -> 3
    ("acc", [3, 0, 4, 0]),  # loads + stores
    ("stream:x", [3, 0, 1, 0]),  # x^2 / acc: 9/3, (acc 0 -> 0), 4/4, (acc 0 -> 0)
    ("2^bpd*ceil(width/bpd)", [20, 20, 32, 48]),
]


@pytest.mark.parametrize(("text", "want"), HAND, ids=[t for t, _ in HAND])
def test_each_term_kind_evaluates_to_its_hand_value(text, want):
    got = parse(text).evaluate(TABLE)
    assert got.shape == (4,)
    np.testing.assert_allclose(got, np.asarray(want, dtype=float), rtol=1e-12, atol=0)


def test_parse_builds_the_typed_term_of_each_kind():
    assert parse("1") == Const()
    assert parse("const") == Const()
    assert parse("n") == Power("n", 1.0, 0.0)
    assert parse("n^1.5*log(n)^2") == Power("n", 1.5, 2.0)
    assert parse("2^bpd") == Exp2("bpd")
    assert parse("ceil(width/bpd)") == CeilDiv("width", "bpd")
    assert parse("acc") == Accesses()
    assert parse("stream:l1d_misses") == Streaming("l1d_misses")
    assert parse("i * w * h") == Product((Power("h"), Power("i"), Power("w")))  # sorted
    t = Power("n")
    assert parse(t) is t  # a Term is returned as is


def test_streaming_is_zero_where_there_are_no_accesses_and_broadcasts():
    t = Streaming("x")
    got = t.evaluate({"loads": 0.0, "stores": 0.0, "x": np.array([1.0, 2.0])})
    np.testing.assert_array_equal(got, [0.0, 0.0])
    got = t.evaluate({"loads": np.array([2.0, 0.0]), "stores": 2.0, "x": 4.0})
    np.testing.assert_allclose(got, [16 / 4, 16 / 2], rtol=1e-12)


def test_const_takes_the_broadcast_shape_of_the_table():
    assert Const().evaluate({"n": np.arange(5.0), "m": 3.0}).tolist() == [1.0] * 5
    assert Const().evaluate({}).shape == ()


def test_a_missing_input_is_refused_naming_it_and_the_inputs_there_are():
    with pytest.raises(BadInput) as e:
        parse("n*w").evaluate({"n": [1.0], "h": [2.0]})
    assert "'w'" in str(e.value)
    assert "have: h, n" in str(e.value)


def test_log_of_a_non_positive_input_is_refused():
    for bad in (0.0, -2.0):
        with pytest.raises(BadInput) as e:
            parse("n*log(n)").evaluate({"n": np.array([4.0, bad, 8.0])})
        assert "log(n) needs n > 0" in str(e.value)
        assert f"found {bad:g}" in str(e.value)
    # a plain power of the same input is fine at 0
    assert parse("n^2").evaluate({"n": np.array([0.0, 3.0])}).tolist() == [0.0, 9.0]


def test_ceil_of_a_ratio_refuses_a_non_positive_denominator():
    with pytest.raises(BadInput) as e:
        parse("ceil(width/bpd)").evaluate({"width": [8.0, 8.0], "bpd": [2.0, 0.0]})
    assert "ceil(width/bpd) needs bpd > 0" in str(e.value)


# -- text form round trip ---------------------------------------------------------------------

_RESERVED = {"acc", "const"}  # factor keywords of the grammar, not input names
names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_.]{0,7}", fullmatch=True).filter(
    lambda s: s not in _RESERVED)
# Exponents the grammar writes in plain decimals: 0, or 1e-3 .. 1e3 (repr has no exponent).
exponents = st.one_of(
    st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, 3.0]),
    st.floats(min_value=1e-3, max_value=1e3, allow_nan=False, allow_infinity=False))
powers = st.builds(Power, names, exponents, exponents)
factors = st.one_of(
    powers,
    st.builds(Exp2, names),
    st.builds(CeilDiv, names, names),
    st.just(Accesses()),
    st.builds(Streaming, names),
    st.just(Const()),
)
terms = st.lists(factors, min_size=1, max_size=5).map(product)


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(terms)
def test_text_form_reads_back_to_the_same_term(t):
    s = str(t)
    assert parse(s) == t, s
    assert str(parse(s)) == s


@pytest.mark.parametrize("text", [
    "1", "n", "n^2", "n^0.5", "log(n)", "log(n)^2", "n*log(n)", "n^1.5*log(n)^2", "2^bpd",
    "ceil(width/bpd)", "ceil(width/bpd)*keys", "acc", "stream:l1d_misses", "h*i*w",
    "2^bpd*n", "acc*x.y^3", "stream:x*stream:y",
])
def test_canonical_texts_are_fixed_points(text):
    assert str(parse(text)) == text
    assert parse(str(parse(text))) == parse(text)


@pytest.mark.parametrize("t", [Power("n", -1.0), Power("n", 1e-5), Power("n", 1.0, -1.0)],
                         ids=str)
def test_text_form_round_trips_for_every_power(t):
    assert parse(str(t)) == t


def test_product_merges_powers_drops_constants_and_unwraps_one_factor():
    n, logn = Power("n"), Power("n", 0.0, 1.0)
    assert product([n, logn]) == Power("n", 1.0, 1.0)
    assert parse("n*log(n)") == Power("n", 1, 1)
    assert parse("log(n)*n*n") == Power("n", 2.0, 1.0)
    assert product([Const(), n]) is n  # one factor is itself
    assert product([Const(), Const()]) == Const()
    assert product([]) == Const()
    assert parse("1*w*const") == Power("w")
    # a merged power that cancels to x^0 log(x)^0 is the constant, then dropped
    assert product([Power("n", 1.0), Power("n", -1.0)]) == Const()
    # nested products flatten; factors in the canonical (sorted by text) order
    p = product([Product((Power("w"), Exp2("b"))), Power("h"), Power("w", 2.0)])
    assert p == Product((Exp2("b"), Power("h"), Power("w", 3.0)))
    assert str(p) == "2^b*h*w^3"


def test_needs_lists_inputs_in_first_use_order_without_repeats():
    # in the canonical factor order: 2^bpd, ceil(width/bpd), w
    assert parse("w*ceil(width/bpd)*2^bpd").needs == ("bpd", "width", "w")
    assert parse("stream:l2_misses").needs == ("loads", "stores", "l2_misses")
    assert parse("acc").needs == ("loads", "stores")
    assert Const().needs == ()
    assert tm.needs(parse_all(["h*w", "1", "w*i", "acc", "i"])) == (
        "h", "w", "i", "loads", "stores")


def test_parse_all_refuses_duplicates_after_canonicalisation():
    assert parse_all(["1", "n", "n*log(n)"]) == (Const(), Power("n"), Power("n", 1, 1))
    for texts in (["n", "n"], ["n*log(n)", "log(n)*n"], ["1", "const"], ["n^2", "n*n"]):
        with pytest.raises(BadInput) as e:
            parse_all(texts)
        assert "listed twice" in str(e.value)
        assert str(parse(texts[1])) in str(e.value)


def test_parse_all_refuses_a_product_listed_in_another_order():
    assert parse("n*m") == parse("m*n")
    with pytest.raises(BadInput):
        parse_all(["n*m", "m*n"])


@pytest.mark.parametrize("text", ["n^^2", "n**2", "", "log(n", "ceil(a)", "2^", "stream:",
                                  "n^x", "a+b", "3"])
def test_unreadable_text_is_refused_naming_the_text(text):
    with pytest.raises(BadInput) as e:
        parse(text)
    assert repr(text) in str(e.value)
    assert e.value.fix and "joined by '*'" in e.value.fix


# -- growth terms -----------------------------------------------------------------------------

def test_growth_terms_hold_the_constant_first_and_the_usual_forms_once():
    g = growth_terms("n")
    assert g[0] == Const()
    for text in ("n", "log(n)", "n*log(n)", "n^2", "n^0.5", "n^3*log(n)^2", "log(n)^2"):
        assert parse(text) in g, text
    assert len(set(g)) == len(g)
    # (0 plus 5 exponents) x (3 log exponents), less x^0 log^0, plus the constant
    assert len(g) == 6 * 3 - 1 + 1
    assert all(t.needs == ("n",) for t in g[1:])
    assert Const() not in growth_terms("n", const=False)
    assert growth_terms("p", (1,), (0,)) == (Const(), Power("p"))


# -- design and its checks --------------------------------------------------------------------

def test_design_stacks_columns_and_broadcasts_scalars():
    X = design(parse_all(["1", "n", "n*m"]), {"n": [1.0, 2.0, 3.0], "m": 2.0})
    np.testing.assert_array_equal(X, [[1, 1, 2], [1, 2, 4], [1, 3, 6]])
    assert design((), {"n": [1.0, 2.0]}).shape == (2, 0)


def test_design_refuses_inputs_of_different_lengths():
    with pytest.raises(BadInput) as e:
        design(parse_all(["n", "m"]), {"n": [1.0, 2.0, 3.0], "m": [1.0, 2.0]})
    assert "different numbers of samples ([2, 3])" in str(e.value)


def test_design_refuses_inputs_of_different_lengths_with_the_constant_first():
    with pytest.raises(BadInput) as e:
        design(parse_all(["1", "n", "m"]), {"n": [1.0, 2.0, 3.0], "m": [1.0, 2.0]})
    assert "different numbers of samples ([2, 3])" in str(e.value)


def _check(texts, table, independent=True):
    ts = parse_all(texts)
    check_design(ts, design(ts, table), where="here", independent=independent)


def test_check_design_refuses_a_zero_column_naming_it():
    table = {"n": np.arange(1.0, 6.0), "loads": np.zeros(5), "stores": np.zeros(5)}
    with pytest.raises(BadInput) as e:
        _check(["1", "n", "acc"], table)
    assert str(e.value).startswith("here: the term acc is zero on every sample")


def test_check_design_refuses_a_term_constant_beside_the_constant():
    table = {"n": np.full(6, 64.0), "w": np.arange(6.0)}  # a parameter grid with one n
    with pytest.raises(BadInput) as e:
        _check(["1", "w", "n*log(n)"], table)
    msg = str(e.value)
    assert "the term n*log(n) takes one value on every sample (384)" in msg
    assert "more than one value of n" in msg
    # without the constant in the list, a constant column is a legitimate term
    _check(["w", "n"], table)


def test_check_design_refuses_an_exact_linear_combination_naming_it():
    a = np.array([1.0, 2.0, 3.0, 5.0, 8.0, 13.0])
    b = np.full(6, 2.0)  # b == 2 always: a*b == 2*a
    with pytest.raises(BadInput) as e:
        _check(["a", "b", "a*b"], {"a": a, "b": b})
    assert "the term a*b is a linear combination of the terms before it" in str(e.value)
    # c = a + b exactly, through two varying inputs
    b2 = np.array([7.0, 1.0, 4.0, 4.0, 0.0, 9.0])
    with pytest.raises(BadInput) as e:
        _check(["1", "a", "b", "c"], {"a": a, "b": b2, "c": a + b2})
    assert "the term c is a linear combination" in str(e.value)
    # the same lists pass where only exact independence is waived
    _check(["a", "b", "a*b"], {"a": a, "b": b}, independent=False)
    _check(["1", "a", "b", "c"], {"a": a, "b": b2, "c": a + b2}, independent=False)
    # and with c not a combination, the check passes
    _check(["1", "a", "b", "c"], {"a": a, "b": b2, "c": a * b2 + 1.0})


def test_check_design_refuses_a_non_finite_column_naming_it_and_its_input():
    with pytest.raises(BadInput) as e, np.errstate(over="ignore"):
        _check(["1", "2^bpd"], {"bpd": np.array([1.0, 4.0, 2000.0])})
    assert "the term 2^bpd is not finite on every sample" in str(e.value)
    assert e.value.fix == "check the inputs it reads: bpd"
    X = np.array([[1.0, 2.0], [1.0, np.nan], [1.0, 3.0]])
    with pytest.raises(BadInput) as e:
        check_design((Const(), Power("q")), X, where="w")
    assert "the term q is not finite" in str(e.value)


def test_a_near_collinear_growth_list_passes_without_the_independence_check():
    n = np.geomspace(4, 4096, 40)
    g = growth_terms("n")
    X = design(g, {"n": n})
    check_design(g, X, where="growth", independent=False)  # must not raise
    # the list really is badly conditioned: this is what the check is waived for
    scaled = X / np.linalg.norm(X, axis=0)
    assert np.linalg.cond(scaled) > 1e8
    assert math.isfinite(float(np.linalg.cond(scaled)))


def test_ceil_by_a_number():
    """ceil(bpd/8): the bytes of a digit (a radix sort's 16-bit digits cost two byte passes)."""
    t = parse("ceil(bpd/8)")
    assert t == CeilDiv("bpd", 8.0) and str(t) == "ceil(bpd/8)" and t.needs == ("bpd",)
    assert t.evaluate({"bpd": np.array([1.0, 8.0, 9.0, 16.0])}).tolist() == [1, 1, 2, 2]
    with pytest.raises(BadInput, match="needs 0 > 0"):
        parse("ceil(bpd/0)").evaluate({"bpd": np.array([1.0])})


def test_hinge():
    """max(keys-20000,0): zero below the knot, the excess above it."""
    t = parse("max(keys-20000,0)")
    assert t == Hinge("keys", 20000.0) and str(t) == "max(keys-20000,0)"
    assert t.evaluate({"keys": np.array([1e3, 2e4, 2.5e4])}).tolist() == [0.0, 0.0, 5000.0]
    assert parse(str(parse("ceil(width/bpd)*max(keys-5000,0)"))) == \
        product([CeilDiv("width", "bpd"), Hinge("keys", 5000.0)])
