"""The compute calibration patterns (microbench/compute.py)."""

from __future__ import annotations

import shutil

import pytest

from counterd.backends.base import Capability
from counterd.data.errors import BadInput
from microbench import compute


def test_sizes_quick_and_full() -> None:
    loop = compute.BY_NAME["py-loop"]
    assert compute.sizes(loop, quick=True) == (loop.size // 2,)
    assert compute.sizes(loop, quick=False) == (loop.size, 4 * loop.size)
    pages = compute.BY_NAME["fresh-pages"]
    assert compute.sizes(pages, quick=True) == (100, 300, 1000, 2000)  # the page-fault term
    assert compute.sizes(pages, quick=False) == (100, 300, 1000, 3000)  # rests on these
    assert compute.mnemonic(loop, 7) == "compute.py-loop.n7"


def test_plan_takes_the_first_source_that_counts_instructions(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from counterd import backends

    caps = {"perf": Capability("perf", True, "software events only",
                               {"instructions": "no PMU"}),
            "papi": Capability("papi", False, "not installed"),
            "callgrind": Capability("callgrind", True, "valgrind 3.19",
                                    {"instructions": None})}
    monkeypatch.setattr(backends, "capability", lambda name: caps[name])
    assert compute.plan().backend == "callgrind"
    assert compute.plan("none").backend is None
    caps["callgrind"] = Capability("callgrind", False, "valgrind not found")
    p = compute.plan()
    assert p.backend is None
    assert "perf: counts no instructions" in p.reason and "install valgrind" in p.reason


def test_program_runs_every_kernel_and_refuses_unknown_ones(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert compute.main(["--quick", "--reps", "2", "--only", "empty,np-tiny,py-loop"]) == 0
    assert compute.main(["--only", "nope"]) == 2
    assert "unknown kernel 'nope'" in capsys.readouterr().err
    for spec in compute.SPECS:  # every kernel runs on its quick input
        import numpy as np

        for n in compute.sizes(spec, quick=True):
            assert np.isfinite(spec.run(spec.prepare(min(n, 2000), np.random.default_rng(0))))


def test_measure_needs_a_warm_up_repetition() -> None:
    with pytest.raises(BadInput, match="at least 2"):
        compute.measure(quick=True, reps=1)


@pytest.mark.callgrind
def test_measure_under_callgrind_gives_counted_patterns_with_real_times() -> None:
    if shutil.which("valgrind") is None:
        pytest.skip("valgrind is not on PATH (apt-get install valgrind)")
    pats = compute.measure(quick=True, reps=3, backend="callgrind",
                           only=["empty", "np-tiny", "fresh-pages"])
    by = {p["mnemonic"]: p for p in pats}
    assert set(by) == {"compute.empty.n1", "compute.np-tiny.n5",
                       *(f"compute.fresh-pages.n{n}" for n in (100, 300, 1000, 2000))}
    for p in pats:
        assert p["suite"] == "compute" and p["counted_by"] == "callgrind"
        assert p["time_ns"]["reps"] == 2 and len(p["time_ns"]["warmup_samples"]) == 1
        assert p["time_ns"]["median"] > 0
        c = p["processors"][0]["counters"]
        assert c["instructions"]["source"] == "simulated" and c["instructions"]["value"] > 0
        assert "cpu_features_hidden" in p["flags"] or not any(
            f.startswith("avx512") for f in __import__("counterd.data.host").data.host.cpu_flags())
    tiny, empty = (by[k]["processors"][0]["counters"]["instructions"]["value"]
                   for k in ("compute.np-tiny.n5", "compute.empty.n1"))
    assert tiny > 10 * empty  # five rounds of numpy calls against an empty body
    faults = {n: by[f"compute.fresh-pages.n{n}"]["processors"][0]["counters"]["page_faults"]
              for n in (300, 1000)}
    assert faults[300]["source"] == "measured"
    assert 300 <= faults[300]["value"] < 450 and 1000 <= faults[1000]["value"] < 1200
