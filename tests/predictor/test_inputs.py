"""Reading plain tables: counterd record JSONL, CSV, microbench results; bad values rejected."""

from __future__ import annotations

import json

import numpy as np
import pytest

from predictor.errors import BadCounterValue, BadInput, UnknownCounter
from predictor.inputs import CANONICAL, load_counters, results_from_json, steps_from_records
from predictor.synthetic import make_results, reference_model


def test_canonical_names_match_counterd():
    from counterd.data.events import NAMES  # the test may import both; the predictor may not

    assert tuple(CANONICAL) == tuple(NAMES)


# What the predictor may load of counterd: its data-only modules (DESIGN.md section 2; the
# import-linter contract in pyproject.toml checks the imports, this checks what is loaded).
COUNTERD_DATA_MODULES = {"counterd", "counterd.data", "counterd.data.records",
                         "counterd.data.events", "counterd.data.errors", "counterd.machine",
                         "counterd.data.host", "counterd.util", "counterd.util.fsutil",
                         "counterd.data.units", "counterd.util.cliutil", "counterd.data.clocks"}


def test_predictor_loads_only_counterd_data_modules():
    import subprocess
    import sys

    code = ("import sys, predictor.cli, predictor.costs.calibrate, predictor.synthetic; "
            "print(' '.join(m for m in sys.modules if m.split('.')[0] in "
            "('counterd', 'microbench')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert set(out.stdout.split()) <= COUNTERD_DATA_MODULES


def _rec(index, rank, begin, end, **counters):
    return json.dumps({"format": 1, "run_id": "r", "index": index, "name": "count", "rank": rank,
                       "begin_ns": begin, "end_ns": end,
                       "counters": {k: {"value": v, "source": "measured", "ratio": 1.0}
                                    for k, v in counters.items()}})


def test_records_group_by_superstep_and_time_is_max_end_minus_min_begin():
    lines = [_rec(0, 0, 100, 900, loads=10, stores=2), _rec(0, 1, 150, 1000, loads=20, stores=0),
             _rec(1, 0, 1000, 1500, loads=1, stores=1), _rec(1, 1, 1000, 1200, loads=1, stores=1)]
    steps = steps_from_records(lines)
    assert [s.name for s in steps] == ["0:count", "1:count"]
    assert steps[0].time_ns == 900  # 1000 - 100
    np.testing.assert_array_equal(steps[0].counter("loads"), [10, 20])
    assert steps[0].ranks == (0, 1)


@pytest.mark.parametrize("value, err", [(-1, BadCounterValue), ("nan", BadCounterValue),
                                        (None, BadCounterValue)])
def test_bad_values(value, err):
    line = json.dumps({"index": 0, "rank": 0, "begin_ns": 0, "end_ns": 1,
                       "counters": {"loads": {"value": value}}})
    with pytest.raises(err, match="loads"):
        steps_from_records([line])


def test_unknown_counter_in_records():
    with pytest.raises(UnknownCounter, match="l9_misses"):
        steps_from_records([_rec(0, 0, 0, 1, l9_misses=3)])


def test_csv(tmp_path):
    f = tmp_path / "c.csv"
    f.write_text("superstep,rank,loads,stores,time_ns\n0,0,5,1,100\n0,1,7,0,100\n")
    (s,) = load_counters(f)
    assert s.time_ns == 100 and s.processors == 2
    f.write_text("superstep,rank,loads,stores\n0,0,5,1\n0,1,7\n")
    with pytest.raises(BadInput, match="missing for rank"):
        load_counters(f)


def test_results_version_and_format():
    d = make_results(reference_model())
    r = results_from_json(d)
    assert r.levels == (1, 2, 3) and r.processors == 4
    assert r.patterns[0].bank_lm is not None and r.patterns[0].meta["suite"] == "table1"
    with pytest.raises(BadInput, match="version 2"):
        results_from_json({**d, "version": 2})
    with pytest.raises(BadInput, match="format"):
        results_from_json({**d, "format": "other"})
    d["patterns"][0]["processors"][0]["counters"]["loads"]["value"] = float("inf")
    with pytest.raises(BadCounterValue):
        results_from_json(d)
