"""Terms for what one processor's loads and stores do together (predictor/NOTES.md, "Where
processors contend"): ``max(loads,stores)`` (a load and a store issued together, as in a
read-modify-write) and ``rfo:<miss counter>`` (misses no load can explain: store misses), and
the improved F on the 16-CPU node's validation patterns, bounded where it is today."""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from predictor.costs import costfuncs as cf
from predictor.costs.calibrate import split_suites
from predictor.costs.costmodel import FModel, coefficients
from predictor.costs.fit import ImprovedFit, default_optional_terms
from predictor.inputs import Step, results_from_json
from predictor.synthetic import make_results, reference_model
from predictor.toolkit.terms import Larger, StoreMisses, parse

NODE16 = Path(__file__).parent / "data" / "node16-all-quick.json.gz"


def test_the_new_terms_read_back_and_evaluate():
    for text in ("max(loads,stores)", "rfo:l3_misses", "max(loads,stores)*p"):
        assert str(parse(text)) == text and parse(str(parse(text))) == parse(text)
    assert parse("max(loads,stores)") == Larger("loads", "stores")
    assert parse("max(n-3,0)") != Larger("n", "3")  # the hinge keeps its meaning
    table = {"loads": np.array([5.0, 0.0, 3.0, 4.0]), "stores": np.array([5.0, 4.0, 0.0, 1.0]),
             "l1d_misses": np.array([5.0, 4.0, 1.0, 6.0])}
    np.testing.assert_array_equal(Larger("loads", "stores").evaluate(table), [5, 4, 3, 4])
    # rmw (every load missed, the stores hit), stores only, a load hit, two store misses
    np.testing.assert_array_equal(StoreMisses("l1d_misses").evaluate(table), [0, 4, 0, 2])


def test_they_are_not_default_candidates_until_the_suite_mixes_loads_and_stores():
    # On the suite's loads-only and stores-only patterns max(loads,stores) is acc, and where
    # a counter set lacks writebacks rfo: stands in for them (predictor/NOTES.md): offered
    # by name (optional_terms), not by default.
    cand = {str(t) for t in default_optional_terms((1, 2, 3))}
    assert not {"max(loads,stores)", "rfo:l1d_misses", "rfo:l3_misses"} & cand


def _rmw(step: Step) -> Step:
    """The read-modify-write twin of a load pattern: every element loaded (and missed, as
    before) and stored back (a hit), so each level writes back what it missed."""
    c = dict(step.counters)
    c["stores"] = c["loads"].copy()
    for lv in ("l1d", "l2", "l3"):
        c[f"{lv}_writebacks"] = c[f"{lv}_misses"].copy()
    wb = step.bank_lm.copy() if step.bank_lm is not None else None
    return dataclasses.replace(step, name=step.name + ".RMW", counters=c, bank_wb=wb,
                               meta={**step.meta, "op": "rmw"})


def test_a_known_issue_and_store_miss_cost_is_recovered_where_patterns_mix_them():
    # Truth: a processor issues a load and a store together (cost per max(loads, stores),
    # nothing per access beyond), and a store miss costs 25 ns on top of a load miss.
    ref = reference_model()
    f1 = {str(k): v for k, v in ref.f1.items() if str(k) != "acc"}
    truth = dataclasses.replace(ref, f1=coefficients(
        {**f1, "max(loads,stores)": 0.8, "rfo:l3_misses": 25.0}))
    r = results_from_json(make_results(reference_model()))
    fit, _ = split_suites(r.patterns)
    steps = fit + [_rmw(s) for s in fit if s.meta["op"] == "load"]
    rng = np.random.default_rng(7)
    t = truth.predict(steps) * np.exp(rng.normal(0, 0.01, len(steps)))
    est = ImprovedFit(levels=r.levels, processors=r.processors, banks=8,
                      optional_terms=["max(loads,stores)", "rfo:l3_misses", "dtlb_misses"])
    m = est.fit(steps, t).model_
    assert parse("dtlb_misses") in est.dropped_  # its true cost is 0
    assert m.f1[parse("max(loads,stores)")] == pytest.approx(0.8, rel=0.1)
    assert m.f1[parse("rfo:l3_misses")] == pytest.approx(25.0, rel=0.1)
    assert m.f1[parse("acc")] < 0.08  # the sum of loads and stores is not what is paid
    # Without the read-modify-write patterns the two are one column on every pattern (a
    # load pattern has no stores, a store pattern no loads): nothing can tell them apart.
    only = [s for s in steps if s.meta["op"] != "rmw"]
    acc = parse("acc").evaluate
    assert all(np.array_equal(Larger("loads", "stores").evaluate(s.counters), acc(s.counters))
               for s in only)


def _node16():
    return results_from_json(json.loads(gzip.decompress(NODE16.read_bytes())), str(NODE16))


def test_node16_validation_error_of_the_improved_fit_is_bounded():
    # Measured on the 16-CPU node, the validation patterns held apart: avg 1.60, max 4.69 at
    # p1.s1.b0.RE (predictor/NOTES.md says why the issue's 1.25 / 2.0 is out of reach for
    # a fit on this suite). The bound fails if a change makes the model worse there.
    r = _node16()
    fit, val = split_suites(r.patterns)
    m: FModel = ImprovedFit(levels=r.levels, processors=16, banks=8).fit(fit).model_
    t = np.array([s.time_ns for s in val])
    e = cf.error_ratio(t, m.predict(val))
    assert len(val) == 42
    assert e.mean() < 1.70 and e.max() < 5.0


def test_the_improved_fit_takes_other_base_terms_when_given():
    # F1 without writebacks (writebacks as bandwidth only, F2 and F3): the fit keeps exactly
    # the terms given, and the default is unchanged
    r = results_from_json(make_results(reference_model(processors=2), processors=2))
    fit, _ = split_suites(r.patterns)
    base = ["acc", "l1d_misses", "l2_misses"]
    f = ImprovedFit(levels=r.levels, processors=2, banks=8, base_terms=base,
                    optional_terms=["rfo:l1d_misses"], select=None).fit(fit)
    assert [str(t) for t in f.terms_] == [*base, "rfo:l1d_misses"]
    assert not any("writebacks" in str(t) for t in f.model_.f1)
    d = ImprovedFit(levels=r.levels, processors=2, banks=8, optional_terms=[]).fit(fit)
    assert "l1d_writebacks" in {str(t) for t in d.terms_}
