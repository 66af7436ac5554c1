"""Pilot forecasts on synthetic programs whose counters grow by a known law: extrapolation within
tolerance, the growth term found, interval coverage measured, F on extrapolated counters, and
every bad input of the Pilot issue."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from predictor.costs.profile import load_profile
from predictor.errors import BadInput
from predictor.inputs import Step
from predictor.pilot.campaign import (
    TIMING_FEATURES,
    load_campaign,
    measure_target,
    pilot_run,
    record_path,
    run_campaign,
)
from predictor.pilot.check import Comparison, Measured, measured
from predictor.pilot.extrapolation import (
    Extrapolated,
    extrapolate,
    extrapolate_count,
    extrapolate_extra,
    scale_by_work,
)
from predictor.pilot.forecast import StepForecast, forecast
from predictor.pilot.mixed import SHARED_CPU_ADVICE
from predictor.pilot.runs import PilotRun, Timing, check_runs, load_timings

SIZES = [1e5, 2e5, 3e5, 4e5, 5e5]


def _law(n: float) -> float:
    return 3e3 + 2.0 * n + 0.5 * n * math.log2(n)


def test_extrapolation_of_a_two_term_law_within_tolerance():
    """a + b*n + c*n*log(n), 1% noise, 5 sizes x 3 repeats, target 2x the largest pilot: the
    one-term model is within 2% of the truth, and its 90% interval holds the truth."""
    rng = np.random.default_rng(3)
    ns = [n for n in SIZES for _ in range(3)]
    ys = [_law(n) * (1 + 0.01 * rng.standard_normal()) for n in ns]
    e = extrapolate(ns, ys, 1e6)
    assert e.value == pytest.approx(_law(1e6), rel=0.02)
    assert e.lower <= _law(1e6) <= e.upper


@pytest.mark.parametrize("law, term", [
    (lambda n: 50.0 + 3.0 * n * math.log2(n), "n*log(n)"),
    (lambda n: 1e4 + 1e-5 * n ** 2, "n^2"),
    (lambda n: 10.0 + 7.0 * n, "n"),
])
def test_the_growth_term_is_found(law, term):
    rng = np.random.default_rng(5)
    ns = [n for n in SIZES for _ in range(3)]
    ys = [law(n) * (1 + 0.01 * rng.standard_normal()) for n in ns]
    e = extrapolate(ns, ys, 2e6)
    assert e.how.endswith(f"*{term}"), e.how  # the constant may go: costs are kept >= 0
    assert e.value == pytest.approx(law(2e6), rel=0.03)


def test_interval_coverage_at_the_target_is_measured():
    """200 pilot campaigns (1% noise, law within the model family): the 90% interval at 2x the
    largest pilot holds a fresh observation there at 0.845 (measured), a little below nominal:
    the interval does not account for the choice of the growth term among 17."""
    rng = np.random.default_rng(11)
    law = lambda n: 50.0 + 3.0 * n * math.log2(n)  # noqa: E731
    ns = [n for n in SIZES for _ in range(3)]
    inside = 0
    reps = 200
    for _ in range(reps):
        ys = [law(n) * (1 + 0.01 * rng.standard_normal()) for n in ns]
        e = extrapolate(ns, ys, 1e6, level=0.9)
        inside += e.lower <= law(1e6) * (1 + 0.01 * rng.standard_normal()) <= e.upper
    assert 0.82 <= inside / reps <= 0.97, inside / reps


def test_zero_counters_stay_zero_and_sparse_ones_are_scaled():
    zero = extrapolate(SIZES, [0.0] * 5, 1e6)
    assert (zero.value, zero.lower, zero.upper) == (0.0, 0.0, 0.0) and "zero" in zero.how
    sparse = extrapolate(SIZES, [0, 0, 0, 4.0, 5.0], 1e6)
    assert sparse.value == pytest.approx(10.0) and "linearly" in sparse.how


# -- forecasts with a profile ---------------------------------------------------------------------

PROFILE = load_profile("sgi-power-challenge")  # the paper's machine: 8 processors
P = 4  # processors used by the synthetic program


def _counters(n: float, rng: np.random.Generator, noise: float) -> dict[str, np.ndarray]:
    """Per processor: loads n/P, stores n/P, misses and writebacks at fixed rates (a streaming
    sort-like step)."""
    base = {"loads": n / P, "stores": n / P, "l1d_misses": n / P / 8, "l2_misses": n / P / 32,
            "l1d_writebacks": n / P / 16, "l2_writebacks": n / P / 64}
    return {k: np.full(P, v) * (1 + noise * rng.standard_normal(P)) for k, v in base.items()}


def _run(n: float, rng: np.random.Generator, noise: float = 0.01) -> PilotRun:
    steps = []
    for i, name in enumerate(("count elements", "move elements")):
        c = _counters(n * (1 + i), rng, noise)
        s = Step(f"{i}:{name}", c, tuple(range(P)))
        t = PROFILE.f_model("paper").evaluate(s).f * (1 + noise * rng.standard_normal())
        steps.append(Step(s.name, c, s.ranks, time_ns=t))
    return PilotRun(n, tuple(steps), f"run-{n:g}")


def test_forecast_evaluates_f_on_extrapolated_counters():
    rng = np.random.default_rng(7)
    runs = [_run(n, rng) for n in SIZES for _ in range(2)]
    fc = forecast(runs, 2e6, PROFILE, level=0.9)
    truth = [PROFILE.f_model("paper").evaluate(Step("x", _counters(2e6 * (1 + i),
                                                                  np.random.default_rng(0), 0.0),
                                                    tuple(range(P)))) for i in range(2)]
    assert [(s.index, s.name) for s in fc.steps] == [(0, "count elements"),
                                                     (1, "move elements")]
    for s, t in zip(fc.steps, truth, strict=True):
        assert s.f is not None and s.variant == "paper"
        assert s.f.f == pytest.approx(t.f, rel=0.03)
        assert s.f.dominant == t.dominant
        lo, hi = s.f_interval_ns or (0, 0)
        assert lo <= s.f.f <= hi
        assert s.time_only.value == pytest.approx(t.f * 1e-9, rel=0.05)
        assert s.pilot_f_error is not None and s.pilot_f_error < 1.05
        assert s.counters["loads"].value == pytest.approx(2e6 * (1 + s.index), rel=0.03)
    j = fc.to_json()
    assert j["target"] == 2e6 and j["sizes"] == SIZES and j["profile"] == PROFILE.name
    assert set(j["supersteps"][0]) >= {"index", "name", "predicted_s", "interval_s",
                                       "dominating", "time_only_s", "counters"}
    total, lo, hi = fc.total()
    assert lo <= total <= hi and total == pytest.approx(sum(s.predicted_s for s in fc.steps))


def test_without_a_profile_the_time_only_forecast_remains():
    """No profile: no F, and the forecast printed is one of the others, chosen by the held-out
    largest pilot; time-only is always there."""
    rng = np.random.default_rng(8)
    fc = forecast([_run(n, rng) for n in SIZES], 1e6, None)
    assert all(s.f is None and s.why == "no profile given" for s in fc.steps)
    for s in fc.steps:
        assert s.time_only.value > 0 and s.choice is not None and s.basis != "F"
        assert s.basis in s.choice.holdouts and "F" not in s.choice.holdouts
        assert s.predicted_s == {"time": s.time_only.value,
                                 "fit": s.fit.value if s.fit else None}[s.basis]


def _step_forecast(f_error, t_mre, w_mre=False):
    b = PROFILE.f_model("paper").evaluate(Step("0:x", _counters(1e6, np.random.default_rng(0),
                                                                 0.0), tuple(range(P))))
    t = Extrapolated(2e-3, 1e-3, 3e-3, "c*n", t_mre)
    w = None if w_mre is False else Extrapolated(4e-3, 3e-3, 5e-3, "scaled", w_mre)
    return StepForecast(0, "x", t, {}, "paper", b, (b.f * 0.5, b.f * 2), None, f_error,
                        scaled=w)


@pytest.mark.parametrize("f_error, t_mre, w_mre, basis", [
    # F's average E on the pilots against the other's MRE there (both 1 + relative error)
    (1.05, 1.10, False, "F"),    # F fits the pilots within 5 %, time-only within 10 %: F
    (1.30, 1.10, False, "time"),  # F off by 30 % on the pilots' own counters: time-only
    (1.09, 1.10, False, "F"),    # F a little better on the pilots: F
    (None, 1.10, False, "time"),  # F could not be checked on the pilots: time-only
    (1.50, None, False, "F"),    # time-only scaled linearly (no cross-validation): F
    (1.30, 1.10, 1.20, "scaled"),  # instructions counted: scaled, whatever time-only's error
    (1.05, 1.01, 1.10, "F"),     # F against scaled, not against time-only
    (1.15, 1.01, 1.10, "scaled"),
])
def test_the_forecast_is_the_one_the_pilot_runs_trust(f_error, t_mre, w_mre, basis):
    s = _step_forecast(f_error, t_mre, w_mre)
    assert s.basis == basis
    if basis == "F":
        assert s.predicted_s == s.f_s and s.interval_s == s.f_interval_s
    elif basis == "scaled":
        assert s.predicted_s == 4e-3 and s.interval_s == (3e-3, 5e-3)
    else:
        assert s.predicted_s == 2e-3 and s.interval_s == (1e-3, 3e-3)
    j = s.to_json()
    assert j["basis"] == basis and j["F_s"] == s.f_s and j["predicted_s"] == s.predicted_s


def _work_campaign(rng, noise, bend=0.0):
    """Instructions grow as n log n (counted exactly); the time per instruction is 2 ns, times
    (1 + bend * n / 5e5) (a cache level crossed inside the pilot range), with noise."""
    ns = np.array(SIZES)
    work = 40 * ns * np.log2(ns)
    times = 2e-9 * work * (1 + bend * ns / 5e5) * np.exp(noise * rng.standard_normal(len(ns)))
    return ns, times, work


def test_work_scaling_extrapolates_the_counted_work_from_the_largest_pilot():
    rng = np.random.default_rng(21)
    ns, times, work = _work_campaign(rng, 0.0)
    w_at = extrapolate(ns, work, 2e6)
    e = scale_by_work(ns, times, work, w_at)
    assert e is not None
    assert e.value == pytest.approx(2e-9 * 40 * 2e6 * math.log2(2e6), rel=1e-3)
    assert e.pilot_mre == pytest.approx(1.0, abs=1e-9) and e.lower <= e.value <= e.upper
    assert "instructions" in e.how and "n = 500000" in e.how
    assert scale_by_work(ns, times, [0.0] * 5, w_at) is None  # nothing counted


def test_work_scaling_beats_a_growth_model_of_a_bent_time_curve():
    """A time per instruction that rises by 60 % across the pilots, then stays (the cache was
    left behind at the largest pilot): the growth model of the time extrapolates the bend and
    misses; work scaling from the largest pilot does not."""
    ns, times, work = _work_campaign(np.random.default_rng(0), 0.0, bend=0.6)
    truth = times[-1] / work[-1] * 40 * 2e6 * math.log2(2e6)
    e = scale_by_work(ns, times, work, extrapolate(ns, work, 2e6))
    t = extrapolate(ns, times, 2e6)
    assert e is not None and e.value == pytest.approx(truth, rel=1e-3)
    assert t.value > 1.3 * truth


def test_work_scaling_interval_coverage_is_measured():
    """300 campaigns with 5 % log-normal noise on each pilot time and on the target's: the 90 %
    interval holds the target's time at 0.90 (measured; the assertion allows 0.85-0.99)."""
    rng = np.random.default_rng(4)
    inside = 0
    reps = 300
    for _ in range(reps):
        ns, times, work = _work_campaign(rng, 0.05)
        e = scale_by_work(ns, times, work, extrapolate(ns, work, 1e6), level=0.9)
        truth = 2e-9 * 40 * 1e6 * math.log2(1e6) * math.exp(0.05 * rng.standard_normal())
        inside += e.lower <= truth <= e.upper
    assert 0.85 <= inside / reps <= 0.99, inside / reps


def _write_records(path, steps, skew=0):
    """A ``counterd record`` file of one run: per (name, work ns) two ranks, rank 1 beginning
    ``skew`` ns after rank 0 and working the whole ``work``, rank 0 half of it."""
    import json

    from counterd.data.events import CounterValue, Source
    from counterd.data.records import SuperstepRecord, write_jsonl

    t0, records = 1_000_000, []
    for i, (name, work) in enumerate(steps):
        for rank, begin, own in ((0, t0, int(work) // 2), (1, t0 + int(skew), int(work))):
            records.append(SuperstepRecord(
                "r", i, name, rank, 100 + rank, rank, begin, begin + own,
                {"loads": CounterValue(5.0 * (i + 1), Source.SIMULATED)}, host="h"))
        t0 += int(skew) + int(work) + 1000
    write_jsonl(records, path)
    assert json.loads(path.read_text().splitlines()[0])["format"] == 1


def test_a_kept_campaign_loads_back_as_its_pilot_runs(tmp_path):
    """``--keep DIR`` records, read back: the counted run's counters with the timed runs'
    median span and work, every timed run's span and work kept (as counterd.data.records.Superstep
    gives them); a timed run with other supersteps is refused."""
    for n in SIZES[:3]:
        _write_records(record_path(tmp_path, "counted", n), [("a", 9e9), ("b", 9e9)])
        for r, t in enumerate((1e6, 3e6, 2e6)):
            _write_records(record_path(tmp_path, "timed", n, r),
                           [("a", t * n / 1e5), ("b", t)], skew=5e5 * (r + 1))
    runs = load_campaign(tmp_path, SIZES[:3], 3)
    assert [r.size for r in runs] == SIZES[:3]
    assert runs[1].step_work(0) == [2e6, 6e6, 4e6]
    assert runs[1].step_times(0) == [2.5e6, 7e6, 5.5e6]  # work + skew (rank 1 ends last)
    assert runs[1].steps[0].time_ns == 5.5e6 and runs[1].steps[0].meta["work_ns"] == 4e6
    assert runs[0].steps[1].counter("loads").sum() == 20.0
    _write_records(record_path(tmp_path, "timed", SIZES[2], 1), [("a", 1e6), ("c", 1e6)])
    with pytest.raises(BadInput, match="different supersteps"):
        load_campaign(tmp_path, SIZES[:3], 3)


# -- work and span apart ----------------------------------------------------------------------

SKEW_S = 0.020  # start skew of the synthetic program's processors: 20 ms whatever n is


def _skewed_runs(rng, repeat=5, skew_noise=0.002, work_noise=0.01):
    """Two processors: the slowest one's own time is 10 ns per element (linear in n), and the
    span adds a start skew of 20 ms (+-2 ms), the same at every size."""
    runs = []
    for n in SIZES:
        work = [1e-8 * n * 1e9 * (1 + work_noise * rng.standard_normal())
                for _ in range(repeat)]
        span = [w + (SKEW_S + skew_noise * rng.standard_normal()) * 1e9 for w in work]
        step = Step("0:local scan", {}, (0, 1), time_ns=float(np.median(span)),
                    meta={"work_ns": float(np.median(work))})
        runs.append(PilotRun(n, (step,), f"run-{n:g}", (tuple(span),), (tuple(work),)))
    return runs


def test_processes_that_took_turns_on_one_cpu_are_noted_with_their_cost():
    """Timed pilot runs whose two processes shared a CPU (2 of 5 at the two largest sizes,
    their work twice the others'): a note per superstep gives the counts per size and the
    ratio, and the advice to pin them comes once; runs that never shared give no note."""
    runs = _skewed_runs(np.random.default_rng(5), work_noise=0.0)
    shared = [tuple(k < 2 and n >= 4e5 for k in range(5)) for n in SIZES]
    doubled = [replace(r, work_ns=(tuple(w * (2 if x else 1) for w, x in
                                         zip(r.work_ns[0], sh, strict=True)),),
                       shared=(sh,))
               for r, sh in zip(runs, shared, strict=True)]
    target = 4 * SIZES[-1]
    fc = forecast(doubled, target, None)
    (mine,) = [n for n in fc.notes if "took turns on one CPU in timed pilot runs" in n]
    assert mine.startswith(
        "superstep 0:local scan: two of its processes took turns on one CPU in timed pilot "
        "runs (0 of 5 at 100000, 0 of 5 at 200000, 0 of 5 at 300000, 2 of 5 at 400000, 2 of 5 "
        "at 500000); where a size has both, those runs' work took 2 times the others'; its "
        "interval reaches over the forecast from the runs that did not share, ")
    # the interval reaches over the work alone (10 ns an element) and that plus the wait
    # (the shared runs' work less the others': 4 and 5 ms, median 4.5 ms)
    (s,) = fc.steps
    alone = 1e-8 * target
    (apart,) = forecast([r.separate(0) for r in doubled], target, None).steps
    assert s.reach_s == pytest.approx((apart.interval_s[0], apart.interval_s[1] + 4.5e-3))
    assert s.reach_s[0] <= alone <= s.reach_s[1] - 4.5e-3
    assert s.interval_s[0] <= s.reach_s[0] and s.interval_s[1] >= s.reach_s[1] and s.reached
    assert [n for n in fc.notes if "os.sched_setaffinity" in n] == [SHARED_CPU_ADVICE]
    assert not any("one CPU" in n for n in forecast(runs, 4 * SIZES[-1], None).notes)


def test_the_separate_runs_of_a_superstep_keep_every_step_of_those_runs():
    """``PilotRun.separate(i)``: the timed runs in which superstep i did not share a CPU, with
    every step's times and medians from them; None where every run shared."""
    steps = (Step("0:a", {}, (0, 1), time_ns=6.0, meta={"work_ns": 5.0}),
             Step("1:b", {}, (0, 1), time_ns=7.0, meta={"work_ns": 6.0}))
    run = PilotRun(1e3, steps, "r", ((10.0, 5.0, 6.0), (7.0, 7.0, 9.0)),
                   ((9.0, 4.0, 5.0), (6.0, 6.0, 8.0)), ((True, False, False), (False,) * 3))
    apart = run.separate(0)
    assert apart is not None
    assert apart.times_ns == ((5.0, 6.0), (7.0, 9.0)) and apart.work_ns == ((4.0, 5.0), (6.0, 8.0))
    assert apart.shared == ((False, False), (False, False))
    assert [s.time_ns for s in apart.steps] == [5.5, 8.0]
    assert [s.meta["work_ns"] for s in apart.steps] == [4.5, 7.0]
    same = run.separate(1)  # none shared: the same times and medians
    assert same is not None and same.times_ns == run.times_ns and same.work_ns == run.work_ns
    assert [(s.time_ns, s.meta) for s in same.steps] == [(s.time_ns, s.meta) for s in steps]
    assert replace(run, shared=((True,) * 3, (False,) * 3)).separate(0) is None
    unknown = replace(run, shared=())
    assert unknown.separate(0) is unknown  # not known: every run stays
    no_work = replace(run, work_ns=()).separate(0)  # times and who shared, no work times
    assert no_work is not None and no_work.times_ns == apart.times_ns


def test_a_timed_run_knows_its_processes_shared_a_cpu(tmp_path):
    """From a record file to the pilot run: two ranks on CPU 3 overlapping in superstep 0,
    on CPUs 3 and 4 in superstep 1."""
    from counterd.data.records import SuperstepRecord, write_jsonl

    recs = [SuperstepRecord(run_id="r", index=i, name=f"s{i}", rank=rank, pid=10 + rank,
                            cpu=3 + (rank if i == 1 else 0), begin_ns=1000 * i + 10 * rank,
                            end_ns=1000 * i + 500) for i in (0, 1) for rank in (0, 1)]
    write_jsonl(recs, tmp_path / "t.jsonl")
    timings = load_timings(tmp_path / "t.jsonl")
    assert [t.shared_cpu for t in timings] == [True, False]
    counted = [Step("0:s0", {}, (0, 1)), Step("1:s1", {}, (0, 1))]
    run = pilot_run(1e3, counted, [timings, timings])
    assert [run.step_shared(0), run.step_shared(1)] == [[True, True], [False, False]]


def test_a_constant_start_skew_is_not_scaled_with_the_work():
    """Work linear in n, a 20 ms start skew at every size, target 16x the largest pilot: the
    work forecast follows the work (80 ms at 8e6), the span forecast is that plus 20 ms (not
    the skew scaled up with the work, which would be 320 ms more) and its interval holds it."""
    target = 16 * SIZES[-1]
    fc = forecast(_skewed_runs(np.random.default_rng(31)), target, None)
    (s,) = fc.steps
    work, span = 1e-8 * target, 1e-8 * target + SKEW_S
    assert s.predicted_s == pytest.approx(work, rel=0.05)
    assert s.interval_s[0] <= work <= s.interval_s[1]
    assert s.extra is not None and s.extra.value == pytest.approx(SKEW_S, rel=0.15)
    assert "not scaled with n" in s.extra.how and not fc.notes
    assert s.span_s == pytest.approx(span, rel=0.05)
    assert s.span_s == s.predicted_s + s.extra.value
    lo, hi = s.span_interval_s
    assert lo <= span <= hi and lo == s.interval_s[0] + s.extra.lower
    # what the pilot did when it fitted the span itself: the skew scaled with the work
    spans = [(r.size, t * 1e-9) for r in _skewed_runs(np.random.default_rng(31))
             for t in r.step_times(0)]
    by_span = extrapolate([n for n, _ in spans], [t for _, t in spans], target)
    assert by_span.value > 1.5 * span
    j = s.to_json()
    assert j["span_s"] == s.span_s and j["extra_s"] == s.extra.value
    assert j["predicted_s"] == s.predicted_s and "not scaled" in j["extra_model"]
    p, plo, phi = fc.span_total()
    assert fc.to_json()["total"]["span_s"] == p and plo <= p <= phi


def test_the_work_is_judged_against_f_not_the_span():
    """F fits the pilot runs' work exactly while their spans carry 20 ms of skew: F's error
    on the pilots is that of the work (about 1), not of the span. The fit of fixed cost and
    counted work fits the same work exactly too: which of the two misses the held-out pilots
    least is decided by rounding (1.8e-16 against 1.9e-16 in log on an AMD EPYC host, the
    other way round on an Intel Xeon), so either may be printed, with F's value."""
    rng = np.random.default_rng(12)
    runs = []
    for n in SIZES:
        r = _run(n, rng, noise=0.0)
        work = tuple((s.time_ns,) * 3 for s in r.steps)
        span = tuple(tuple(w + SKEW_S * 1e9 for w in ws) for ws in work)
        runs.append(PilotRun(n, r.steps, r.source, span, work))
    fc = forecast(runs, 2e6, PROFILE)
    for s in fc.steps:
        assert s.pilot_f_error == pytest.approx(1.0, abs=1e-6)
        assert s.choice is not None and s.choice.holdouts["F"].miss < 1e-9
        assert s.basis in ("F", "fit")
        assert s.predicted_s == pytest.approx(s.f_s, rel=1e-9)
        assert s.extra is not None and s.extra.value == pytest.approx(SKEW_S)
        assert s.span_s == pytest.approx(s.f_s + SKEW_S)


def test_an_extra_that_grows_with_n_is_extrapolated_and_said():
    """A wait that grows with n (here 5 % of the work, +-0.2 % of it): the pilots show the
    trend (Kendall's tau), so the extra is extrapolated rather than held at the pilots'
    median, and a note says so."""
    rng = np.random.default_rng(2)
    runs = []
    for n in SIZES:
        work = [1e-8 * n * 1e9 * (1 + 0.01 * rng.standard_normal()) for _ in range(5)]
        span = [w * (1.05 + 0.002 * rng.standard_normal()) for w in work]
        runs.append(PilotRun(n, (Step("0:x", {}, (0, 1), time_ns=float(np.median(span))),),
                             "r", (tuple(span),), (tuple(work),)))
    fc = forecast(runs, 2e6, None)
    (s,) = fc.steps
    assert s.extra is not None and s.extra.how.startswith("grows with n")
    assert "median at each pilot size" in s.extra.how
    # within 23 % over 30 seeds (the growth term is chosen among 17 on five medians)
    assert s.extra.value == pytest.approx(0.05 * 1e-8 * 2e6, rel=0.3)
    assert any("grows with n" in note and "0:x" in note for note in fc.notes)


def test_an_extra_growing_faster_than_the_work_is_capped_at_the_works_growth():
    """Medians that a cubic fits (1, 8, 27, 64 us at n = 1..4e5) while the work grows 2.5x
    from the largest pilot to the target: the extra is extrapolated (it grows), but no
    faster than the work, and says so; without the work's growth the cubic stands."""
    sizes = [1e5, 2e5, 3e5, 4e5]
    ns = [n for n in sizes for _ in range(5)]
    xs = [(n / 1e5) ** 3 * 1e-6 * (1 + 0.01 * k) for n in sizes for k in range(5)]
    free, grows = extrapolate_extra(ns, xs, 1e6)
    assert grows and free.value > 10 * 64e-6  # the cubic: about 1000 us at 1e6
    capped, grows = extrapolate_extra(ns, xs, 1e6, work_growth=2.5)
    median_at_largest = float(np.median(xs[-5:]))
    assert grows and capped.value == pytest.approx(median_at_largest * 2.5)
    assert capped.lower <= capped.value <= capped.upper
    assert "grows no faster than the work" in capped.how


def test_a_trend_in_the_tails_alone_does_not_scale_the_extra():
    """Every pilot size has the same median extra (1 ms) while its low and high runs move up
    with n: Kendall's tau sees a trend, but no growth model of the medians grows, so the extra
    stays the median, and says why."""
    ns, xs = [], []
    for k, n in enumerate(SIZES, 1):
        for v in [0.1 * k] * 4 + [1.0] + [1.0 + k] * 4:
            ns.append(n)
            xs.append(v * 1e-3)
    e, grows = extrapolate_extra(ns, xs, 1e6)
    assert not grows and e.value == pytest.approx(1e-3)
    assert "p = 0.00" in e.how and "no growth model of its medians grows" in e.how


def test_extra_without_skew_is_zero_and_bad_extras_are_refused():
    e, grows = extrapolate_extra(SIZES, [0.0] * 5, 1e6)
    assert (e.value, e.lower, e.upper, grows) == (0.0, 0.0, 0.0, False)
    e, grows = extrapolate_extra(SIZES, [3e-3] * 5, 1e6)
    assert (e.value, e.lower, e.upper, grows) == (3e-3, 3e-3, 3e-3, False)
    with pytest.raises(BadInput, match="extra"):
        extrapolate_extra(SIZES, [1e-3, -1e-3, 0, 0, 0], 1e6)
    runs = _skewed_runs(np.random.default_rng(1))
    r = runs[0]
    runs[0] = PilotRun(r.size, r.steps, "bad-run", r.work_ns, r.times_ns)  # swapped
    with pytest.raises(BadInput, match="worked longer than the superstep's span"):
        forecast(runs, 1e6, None)


def test_check_compares_work_with_work_and_span_with_span():
    """``--check``: each forecast against its measured counterpart, E for each, and the totals
    alike."""
    fc = forecast(_skewed_runs(np.random.default_rng(31)), 1e6, None)
    (s,) = fc.steps
    m = Measured(work_ns=1e7, span_ns=5e7, skew_ns=4e7)
    per, whole = fc.compare({(0, "local scan"): m})
    c = per[(0, "local scan")]
    assert c["work"].measured_s == 1e-2 and c["work"].forecast_s == s.predicted_s
    assert c["span"].measured_s == 5e-2 and c["span"].forecast_s == s.span_s
    assert c["work"].e == pytest.approx(max(1e-2, s.predicted_s) / min(1e-2, s.predicted_s))
    assert c["span"].e == pytest.approx(5e-2 / s.span_s)  # the span forecast is ~30 ms
    assert c["work"].inside == (s.interval_s[0] <= 1e-2 <= s.interval_s[1])
    assert not c["span"].inside
    assert whole["span"].measured_s == 5e-2 and whole["span"].forecast_s == fc.span_total()[0]
    j = c["span"].to_json()
    assert j["E"] == c["span"].e and j["interval_s"] == list(s.span_interval_s)
    assert Comparison(0.0, 0.0, 1.0, 1.0).e is None


def test_a_target_inside_the_pilot_range_is_interpolated_and_said():
    rng = np.random.default_rng(9)
    fc = forecast([_run(n, rng) for n in SIZES], 2.5e5, PROFILE)
    assert any("inside the pilot range" in n for n in fc.notes)


# -- bad input --------------------------------------------------------------------------------

def _runs(sizes, rng=None):
    rng = rng or np.random.default_rng(1)
    return [_run(n, rng) for n in sizes]


def test_bad_pilot_campaigns_are_refused_naming_what():
    with pytest.raises(BadInput, match="not increasing"):
        check_runs(_runs([1e5, 3e5, 2e5]))
    with pytest.raises(BadInput, match="2 distinct pilot sizes"):
        check_runs(_runs([1e5, 2e5, 2e5]))
    with pytest.raises(BadInput, match="no pilot runs"):
        check_runs([])
    runs = _runs(SIZES[:3])
    runs[1] = PilotRun(runs[1].size, (), "empty-run")
    with pytest.raises(BadInput, match="empty-run .* recorded no supersteps"):
        check_runs(runs)
    runs = _runs(SIZES[:3])
    s = runs[2].steps
    runs[2] = PilotRun(runs[2].size, (s[0], Step("1:other", s[1].counters, s[1].ranks,
                                                  time_ns=s[1].time_ns)), "odd-run")
    with pytest.raises(BadInput, match="odd-run .* has superstep \\(1, 'other'\\)"):
        check_runs(runs)
    with pytest.raises(BadInput, match="not a size > 0"):
        forecast(_runs(SIZES[:3]), -5, None)


# -- predict --pilot ------------------------------------------------------------------------------

PROG = """
import sys
import numpy as np
import counterd
n = int(sys.argv[1])
a = np.ones(n)
with counterd.superstep("sum", n=n):
    a.sum()
with counterd.superstep("sort", n=n):
    np.sort(np.random.default_rng(0).random(n))
"""


# The same two supersteps in pure Python, for the pilot counted under Callgrind: there each
# counted run of PROG paid numpy's import (about 280 M of its 590 M instructions, 14 s of its
# 30 s of CPU on the 2-CPU test host; bench/callgrind_startup.py measures the rest of a
# start-up), three runs per pilot. These count 260-360 M at 20000-80000 (a permutation of
# range(n) summed, then sorted: work that grows with n, as PROG's does).
PURE_PROG = """
import sys
import counterd
n = int(sys.argv[1])
a = [(i * 7919) % n for i in range(n)]
with counterd.superstep("sum", n=n):
    sum(a)
with counterd.superstep("sort", n=n):
    sorted(a)
"""


def _prog(tmp_path, prog=PROG):
    import sys

    (tmp_path / "prog.py").write_text(prog)
    return f"{sys.executable} {tmp_path / 'prog.py'} {{n}}"


def test_cli_pilot_runs_the_campaign_and_forecasts(tmp_path, capsys):
    """Time-only forecasts (counted runs with --backend none count nothing), with --check: the
    target is run and compared."""
    import json

    from predictor.cli import main

    rc = main(["--pilot", _prog(tmp_path), "--sizes", "20000,40000,80000", "--target",
               "160000", "--backend", "none", "--repeat", "2", "--check", "--json",
               "--keep", str(tmp_path / "runs")])
    out = capsys.readouterr()
    assert rc == 0, out.err
    d = json.loads(out.out)
    assert d["target"] == 160000 and d["sizes"] == [20000, 40000, 80000]
    assert [(s["index"], s["name"]) for s in d["supersteps"]] == [(0, "sum"), (1, "sort")]
    for s in d["supersteps"]:
        assert s["predicted_s"] == s["time_only_s"] > 0 and s["dominating"] is None
        assert s["span_s"] == pytest.approx(s["predicted_s"] + s["extra_s"])
        for time in ("work", "span"):
            c = s["check"][time]
            assert c["measured_s"] > 0 and c["E"] >= 1.0
            assert c["forecast_s"] == s["predicted_s" if time == "work" else "span_s"]
        # one process: the span is its own time
        assert s["check"]["work"]["measured_s"] == s["check"]["span"]["measured_s"]
        assert s["extra_s"] == 0.0 and s["measured"]["skew_s"] == 0.0
    assert set(d["total"]["check"]) == {"work", "span"}
    assert "timed run 1/2" in out.err and "s left" in out.err  # progress on stderr
    assert "n = 160000: checking run 2/2" in out.err
    assert len(list((tmp_path / "runs").glob("timed-*.jsonl"))) == 6
    # the checking runs went in the rounds of the timed runs, as their largest size: the
    # last of round 1 and the first of round 2 (files are written in the order they ran)
    order = sorted((tmp_path / "runs").glob("[tc][ih]*-*.jsonl"),
                   key=lambda f: f.stat().st_mtime_ns)
    assert [f.name for f in order] == [
        "timed-20000-0.jsonl", "timed-40000-0.jsonl", "timed-80000-0.jsonl", "check-0.jsonl",
        "check-1.jsonl", "timed-80000-1.jsonl", "timed-40000-1.jsonl", "timed-20000-1.jsonl"]


SKEWED_PROG = """
import multiprocessing as mp
import sys
import time
import numpy as np
import counterd


def worker(rank, n, barrier):
    counterd.set_rank(rank)
    a = np.ones(n)
    barrier.wait()
    if rank == 1:
        time.sleep(0.03)  # a start skew of 30 ms, whatever n is
    with counterd.superstep("local sum", n=n):
        a.sum()
    barrier.wait()
    with counterd.superstep("second sum", n=n):
        a.sum()


if __name__ == "__main__":
    n = int(sys.argv[1])
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=worker, args=(r, n, barrier)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    sys.exit(max(p.exitcode for p in procs))
"""


def test_cli_pilot_forecasts_and_checks_work_and_span_of_two_processes(tmp_path, capsys):
    """Two processes, the second beginning its first superstep 30 ms after the first: the
    checking runs measure a span of 30 ms or more beside a work of well under it; the forecast
    carries the skew as the span's extra (the span forecast is the work's plus it), and both
    are checked, each against its own."""
    import json
    import sys

    from predictor.cli import main

    (tmp_path / "prog.py").write_text(SKEWED_PROG)
    rc = main(["--pilot", f"{sys.executable} {tmp_path / 'prog.py'} {{n}}", "--sizes",
               "20000,40000,80000", "--target", "160000", "--backend", "none", "--repeat", "2",
               "--check", "--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    first = json.loads(out.out)["supersteps"][0]
    assert (first["index"], first["name"]) == (0, "local sum")
    assert first["extra_s"] >= 0.01  # the sleep: at least a third of it on a busy host
    assert first["span_s"] == pytest.approx(first["predicted_s"] + first["extra_s"])
    m, c = first["measured"], first["check"]
    assert m["skew_s"] >= 0.01 and m["span_s"] >= m["work_s"] + 0.01
    assert c["work"]["measured_s"] == m["work_s"] and c["span"]["measured_s"] == m["span_s"]
    assert c["work"]["forecast_s"] == first["predicted_s"]
    assert c["span"]["forecast_s"] == first["span_s"]


def test_the_checking_runs_are_summed_up_by_their_medians():
    """Work, span and skew: each the median over the checking runs; a superstep one run did
    not end, or lacks, is left out rather than measured as 0."""
    runs = [[Timing(0, "a", 10 + r, 4 + r, 6, r == 0), Timing(1, "b", 5, 5, 0),
             Timing(2, "c", None if r == 1 else 3, 3, 0)] for r in range(3)]
    runs[2] = runs[2][1:]
    m = measured(runs)
    assert set(m) == {(1, "b")}
    runs[2] = [Timing(0, "a", 12, 6, 6, True), *runs[2]]
    m = measured(runs)
    assert set(m) == {(0, "a"), (1, "b")}
    assert m[(0, "a")] == Measured(work_ns=5.0, span_ns=11.0, skew_ns=6.0, shared_cpu_runs=2,
                                   runs=3)
    assert m[(1, "b")].shared_cpu_runs == 0
    assert measured([]) == {}


def test_cli_pilot_text_shows_work_and_span_each_checked(monkeypatch, capsys):
    """The text output: per superstep a work row and a span row, each with its forecast,
    interval, measured time, E and whether it fell inside; the extra on its own line."""
    from predictor.cli import main

    monkeypatch.setattr("predictor.pilot.campaign.run_campaign",
                        lambda *a, **k: _skewed_runs(np.random.default_rng(31)))
    monkeypatch.setattr("predictor.pilot.campaign.load_checks", lambda *a, **k: {
        (0, "local scan"): Measured(work_ns=4e7, span_ns=6e7, skew_ns=2e7)})
    rc = main(["--pilot", "prog {n}", "--sizes", ",".join(f"{n:g}" for n in SIZES),
               "--target", "4e6", "--backend", "none", "--check"])
    out = capsys.readouterr().out.splitlines()
    assert rc == 0
    head = next(i for i, line in enumerate(out) if line.startswith("superstep"))
    assert out[head].split()[:4] == ["superstep", "time", "forecast", "90%"]
    # measured, E, inside last: the forecasts (40 ms of work, 20 ms of skew) hold both
    work, span = out[head + 1].split(), out[head + 2].split()
    assert work[:4] == ["0", "local", "scan", "work"] and work[-4:-2] == ["40.0", "ms"]
    assert 1.0 <= float(work[-2]) < 1.1 and work[-1] == "yes"
    assert span[0] == "span" and "+extra" in span and span[-4:-2] == ["60.0", "ms"]
    assert 1.0 <= float(span[-2]) < 1.1 and span[-1] == "yes"
    assert any(line.strip().startswith("extra (span less work)") for line in out)
    assert any(line.startswith("measured in all: work 40.0 ms, E ") and "; span 60.0 ms, E "
               in line for line in out)
    assert not any("one CPU" in line for line in out)


def test_cli_pilot_says_which_checking_runs_shared_a_cpu(monkeypatch, capsys):
    """Checking runs whose processes took turns on one CPU, the pilots' never: a note names
    the superstep and the count, and gives the advice itself (the forecast's notes have not)."""
    from predictor.cli import main

    monkeypatch.setattr("predictor.pilot.campaign.run_campaign",
                        lambda *a, **k: _skewed_runs(np.random.default_rng(31)))
    monkeypatch.setattr("predictor.pilot.campaign.load_checks", lambda *a, **k: {
        (0, "local scan"): Measured(4e7, 6e7, 2e7, shared_cpu_runs=3, runs=5)})
    rc = main(["--pilot", "prog {n}", "--sizes", ",".join(f"{n:g}" for n in SIZES),
               "--target", "4e6", "--backend", "none", "--check"])
    text = " ".join(capsys.readouterr().out.split())
    assert rc == 0
    assert ("note: two processes took turns on one CPU in checking runs: superstep "
            "0:local scan in 3 of 5; processes that took turns") in text
    assert text.count("os.sched_setaffinity") == 1


@pytest.mark.parametrize("args, message", [
    (["--sizes", "3,2,1"], "three or more increasing sizes"),
    (["--sizes", "1,2"], "three or more increasing sizes"),
    (["--sizes", "a,b,c"], "not a list of numbers"),
])
def test_cli_pilot_bad_sizes_exit_2(tmp_path, capsys, args, message):
    from predictor.cli import main

    rc = main(["--pilot", _prog(tmp_path), "--target", "1e6", "--backend", "none", *args])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and err.count("\n") == 1


def test_cli_pilot_refuses_a_command_without_n_and_a_failing_run(tmp_path, capsys):
    import sys

    from predictor.cli import main

    rc = main(["--pilot", f"{sys.executable} -c pass", "--sizes", "1,2,3", "--target", "9"])
    assert rc == 2 and "has no {n}" in capsys.readouterr().err
    rc = main(["--pilot", f"{sys.executable} -c 'import sys; sys.exit(3)' {{n}}", "--sizes",
               "1,2,3", "--target", "9", "--backend", "none", "--repeat", "1"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert rc == 2 and "timed pilot run 1 (n = 1) failed with exit code 3" in err


def test_cli_pilot_refuses_a_profile_of_another_host(tmp_path, capsys):
    """The pilots run here: the paper's SGI profile cannot price them; nothing runs."""
    from predictor.cli import main

    rc = main(["--pilot", _prog(tmp_path), "--sizes", "1,2,3", "--target", "9", "--profile",
               "sgi-power-challenge", "--keep", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert rc == 2 and "profile sgi-power-challenge is not for this host" in err
    assert "leave --profile out" in err and not (tmp_path / "runs").exists()


@pytest.mark.callgrind
@pytest.mark.slow
@pytest.mark.skipif(__import__("shutil").which("valgrind") is None, reason="needs valgrind")
def test_cli_pilot_with_callgrind_forecasts_from_the_counted_work(tmp_path, capsys):
    """End to end with the host's counting source: instructions counted at every pilot size,
    every superstep's work scaled with the instructions (and printed unless another forecast
    predicted the largest pilot better), every counter extrapolated and labelled."""
    import json

    from predictor.cli import main

    rc = main(["--pilot", _prog(tmp_path, PURE_PROG), "--sizes", "20000,40000,80000",
               "--target", "160000", "--backend", "callgrind", "--repeat", "2", "--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    d = json.loads(out.out)
    for s in d["supersteps"]:
        # scaled stands unless another forecast predicted the largest pilot better by more
        # than the timing noise (tests/predictor/test_pilot_choice.py)
        assert s["scaled_s"] > 0 and s["choice"]["basis"] == s["basis"]
        assert s["predicted_s"] == {"scaled": s["scaled_s"], "fit": s["fit_s"],
                                    "time": s["time_only_s"], "F": s["F_s"]}[s["basis"]]
        lo, hi = s["interval_s"]
        assert lo <= s["predicted_s"] <= hi
        assert s["counters"]["instructions"] > 0 and "instructions" in s["scaled_model"]
    assert d["total"]["scaled_s"] > 0
    assert "counted run (callgrind)" in out.err


def _spy_records(monkeypatch):
    """Every ``counterd record`` command the campaign runs, as built; each run for real, with
    ``--backend callgrind`` run as ``--backend none`` and without Callgrind's ``--prefetch``
    (no valgrind needed: the commands are what is checked)."""
    import subprocess

    real = subprocess.run
    seen: list[list[str]] = []

    def spy(cmd, *args, **kwargs):
        cmd = list(cmd)
        if "record" in cmd[:2]:
            seen.append(cmd)
            cmd = ["none" if c == "callgrind" else c for c in cmd if c != "--prefetch"]
        return real(cmd, *args, **kwargs)

    monkeypatch.setattr(subprocess, "run", spy)
    return seen


def _features(cmd: list[str]) -> tuple[str, str]:
    """(backend, --cpu-features) of one record command."""
    return cmd[cmd.index("--backend") + 1], cmd[cmd.index("--cpu-features") + 1]


@pytest.mark.parametrize("given, timed, counted", [
    ([], "native", "auto"),  # the default: the program as the user runs it
    (["--cpu-features", "native"], "native", "auto"),
    (["--cpu-features", "as-counted"], "as-counted", "as-counted"),
])
def test_cli_pilot_times_natively_unless_told_and_says_which(tmp_path, capsys, monkeypatch,
                                                             given, timed, counted):
    """The timed runs (pilots and checking runs) carry --cpu-features native by default and
    as-counted when asked; the counted runs (Callgrind) are left to record's default (auto:
    only their counts, of the code valgrind runs, are used), or as-counted with the timed ones;
    --json says which."""
    import json

    from counterd import machine
    from counterd.machine.files import ENV_MACHINE
    from predictor.cli import main
    from tests import machine_files

    seen = _spy_records(monkeypatch)
    name = "intel-2cpu-300m"  # any host: a machine with an L2 for the L2 runs
    monkeypatch.setenv(ENV_MACHINE, str(machine_files.path(name)))
    with machine.using(machine_files.load(name)):
        rc = main(["--pilot", _prog(tmp_path), "--sizes", "2000,4000,8000", "--target",
                   "16000", "--backend", "callgrind", "--repeat", "1", "--check", *given,
                   "--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert json.loads(out.out)["cpu_features"] == timed
    kinds = [_features(c) for c in seen]
    # the timed run at each size and the checking run at the target, in one round; then the
    # counted runs (side by side: in any order); then the two L2 runs at the largest size,
    # with the prefetcher and a machine file each
    assert kinds == [("none", timed)] * 4 + [("callgrind", counted)] * 5
    sizes = [c[-1] for c in seen]
    assert sizes[:4] == ["2000", "4000", "8000", "16000"] and sorted(sizes[4:7]) == sizes[:3]
    assert sizes[7:] == ["8000", "8000"]
    assert all("--prefetch" in c for c in seen[7:]) and not any("--prefetch" in c
                                                               for c in seen[:7])
    assert len({c[c.index("--machine") + 1] for c in seen[7:]}) == 2


@pytest.mark.parametrize("mode, says", [
    ("native", "ran the program natively, as it runs without counterd (--cpu-features native"),
    ("as-counted", "ran the code Callgrind counts (--cpu-features as-counted)"),
])
def test_cli_pilot_notes_say_how_the_timed_runs_ran(monkeypatch, capsys, mode, says):
    """The text's notes name the mode the campaign and the checking runs were given."""
    from predictor.cli import main

    given = {}

    def campaign(*a, **k):
        given["campaign"] = (k["cpu_features"], k["check"])  # the checking runs are its own
        return _skewed_runs(np.random.default_rng(31))

    def check(*a, **k):
        return {(0, "local scan"): Measured(work_ns=4e7, span_ns=6e7, skew_ns=2e7)}

    monkeypatch.setattr("predictor.pilot.campaign.run_campaign", campaign)
    monkeypatch.setattr("predictor.pilot.campaign.load_checks", check)
    rc = main(["--pilot", "prog {n}", "--sizes", ",".join(f"{n:g}" for n in SIZES),
               "--target", "4e6", "--check", "--cpu-features", mode])
    text = " ".join(capsys.readouterr().out.split())
    assert rc == 0 and given == {"campaign": (mode, 4e6)}
    assert says in text
    assert ("counted another code path" in text) == (mode == "native")


@pytest.mark.parametrize("state", ["on", "off"])
def test_cli_pilot_says_when_the_hypervisor_takes_back_freed_memory(monkeypatch, capsys, state):
    """Free page reporting (counterd.data.host.page_reporting, read from sysfs, here given):
    a note in the text where it is on, and its state in the JSON either way."""
    import json

    from counterd.data.host import PageReporting
    from predictor.cli import main

    monkeypatch.setattr("predictor.pilot.campaign.run_campaign",
                        lambda *a, **k: _skewed_runs(np.random.default_rng(31)))
    monkeypatch.setattr("counterd.data.host.page_reporting",
                        lambda *a: PageReporting(state, "the virtio balloon (virtio0) ...",
                                                 "virtio0", 9))
    args = ["--pilot", "prog {n}", "--sizes", ",".join(f"{n:g}" for n in SIZES),
            "--target", "4e6"]
    assert main(args) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert ("takes back the memory the guest frees" in text) == (state == "on")
    assert main([*args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["page_reporting"]["state"] == state


def test_pilot_timed_and_counted_features_without_callgrind(tmp_path, monkeypatch):
    """With another counting source, native timed runs leave the counted run native too
    (record's auto); as-counted hides the features from both, so the timed code is the
    counted code."""
    seen = _spy_records(monkeypatch)
    prog = _prog(tmp_path)
    for mode in TIMING_FEATURES:
        (tmp_path / mode).mkdir()
        run_campaign(prog, [2000, 4000, 8000], repeat=1, backend="none",
                     workdir=tmp_path / mode, cpu_features=mode)
    kinds = [_features(c)[1] for c in seen]  # the timed runs first, then the counted ones
    assert kinds == ["native"] * 3 + ["auto"] * 3 + ["as-counted"] * 6


@pytest.mark.parametrize("backend, width", [("callgrind", 3), ("sim", 3), ("perf", 1),
                                            ("papi", 1)])
def test_counted_runs_go_side_by_side_where_no_run_can_change_anothers_counts(
        tmp_path, monkeypatch, backend, width):
    """Every timed run ends before the first counted one starts; Callgrind's and sim's counted
    runs (simulated caches of their own) run together, perf's and PAPI's (a shared L3, one
    PMU) one at a time."""
    import threading
    import time

    events: list[tuple[str, float]] = []
    running, most, lock = [0], [0], threading.Lock()

    def timed(template, n, out, **kw):
        events.append(("timed", n))
        return [Timing(0, "s", 1000, 1000, 0)]

    def counted(template, n, b, out, **kw):
        assert b == backend
        with lock:
            events.append(("counted", n))
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.2)  # long enough for the others to start, if they may
        with lock:
            running[0] -= 1
        return [Step("0:s", {}, (0,), time_ns=1e6)]

    monkeypatch.setattr("predictor.pilot.campaign.record_timed", timed)
    monkeypatch.setattr("predictor.pilot.campaign.record_run", counted)
    runs = run_campaign("prog {n}", [1, 2, 3], repeat=2, backend=backend,
                        workdir=tmp_path, parallel=4)
    # the timed runs in rounds over the sizes, up and down: a drift of the host lands on every
    # size alike instead of on one size's runs taken back to back
    assert [n for kind, n in events if kind == "timed"] == [1, 2, 3, 3, 2, 1]
    assert [e[0] for e in events] == ["timed"] * 6 + ["counted"] * 3
    assert most[0] == width
    assert [r.size for r in runs] == [1, 2, 3]


def test_timed_runs_go_in_rounds_over_the_sizes_each_file_its_own_run():
    """Every (run, size) once, rounds ascending then descending; each round visits every
    size before the next round begins."""
    from predictor.pilot.campaign import timing_order

    order = timing_order(4, 3)
    assert order == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 3), (1, 2), (1, 1), (1, 0),
                     (2, 0), (2, 1), (2, 2), (2, 3)]
    assert sorted(order) == [(r, i) for r in range(3) for i in range(4)]
    assert timing_order(1, 2) == [(0, 0), (1, 0)] and timing_order(3, 0) == []


def test_pilot_bad_cpu_features_exit_2_before_anything_runs(tmp_path, capsys, monkeypatch):
    from predictor.cli import main

    seen = _spy_records(monkeypatch)
    rc = main(["--pilot", _prog(tmp_path), "--sizes", "1,2,3", "--target", "9",
               "--cpu-features", "avx2"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    assert "--cpu-features" in err and "'native', 'as-counted'" in err
    for call in (lambda: run_campaign(_prog(tmp_path), [1, 2, 3], backend="none",
                                      workdir=tmp_path, cpu_features="auto"),
                 lambda: measure_target(_prog(tmp_path), 9, repeat=1, workdir=tmp_path,
                                        cpu_features="avx2")):
        with pytest.raises(BadInput, match="cpu-features .* choose native or as-counted"):
            call()
    assert seen == []


def test_a_count_that_barely_moves_over_the_pilots_grows_at_most_linearly():
    """The outside suite's histogram reduce: its instructions (two processes summed) rose
    0.8 % over pilots 4x apart, within the counts' run-to-run variation; every growth term
    let a steep one through that noise (25x the count at 16x), a line does not. A large
    fixed count plus a small exact term in n moves as little and is still extrapolated; a
    count that grows by more is extrapolated as before."""
    ns = [125000, 250000, 375000, 500000]
    flat = [85955.0, 86058.0, 86215.0, 86723.0]
    assert extrapolate(ns, flat, 8e6).value > 10 * flat[-1]  # the steep term, without the rule
    noisy = extrapolate_count(ns, flat, 8e6)
    assert 0.9 * flat[-1] < noisy.value < 1.5 * flat[-1] and "at most linear" in noisy.how
    assert noisy.lower < noisy.value < noisy.upper  # an interval, not a point
    small = [1e9 + 90 * n for n in (25000, 50000, 75000, 100000)]  # moves 0.67 %
    got = extrapolate_count([25000, 50000, 75000, 100000], small, 1e7)
    assert got.value == pytest.approx(1e9 + 90 * 1e7, rel=0.01)
    grows = [1e5 + 2 * n for n in ns]
    assert extrapolate_count(ns, grows, 8e6) == extrapolate(ns, grows, 8e6)
    assert extrapolate_count(ns, [0.0] * 4, 8e6).how == "zero in every pilot run"


def test_a_count_whose_growth_hinges_on_one_pilot_is_the_mean_of_the_fits_with_and_without_it():
    """The outside suite's splu "assemble": its counted instructions jumped by about 1.5
    million in the largest pilot's counted run (other sets counted 9.15 million there); the
    growth terms put n^3 log(n)^2 through the jump, 26.9x the largest pilot's count at 4x,
    where the three smaller pilots give 1.6x. The forecast is their geometric mean and its
    interval spans both."""
    ns = [1250, 2500, 3750, 5000]
    jumped = [7294032.0, 7934293.0, 8552730.0, 10604934.0]
    full = extrapolate(ns, jumped, 20000)
    part = extrapolate(ns[:3], jumped[:3], 20000)
    assert full.value > 20 * jumped[-1] and part.value < 2 * jumped[-1]
    got = extrapolate_count(ns, jumped, 20000)
    assert got.value == pytest.approx(math.sqrt(full.value * part.value))
    assert got.hinge == pytest.approx(math.log(full.value / part.value))
    assert got.lower <= part.value and got.upper >= full.value
    assert "hinges on one pilot's count" in got.how and got.to_json()["hinge"] == got.hinge


def test_a_count_without_the_largest_pilot_is_taken_no_lower_than_that_pilot():
    """cg's "assemble": its smallest pilot's count jumped (9.16 million where other sets
    counted 7.67), the three smaller pilots' fit extrapolates below the largest pilot's count
    at 4x; a count does not shrink as n grows, so the mean is taken with that count."""
    ns = [4000, 8000, 12000, 16000]
    jumped = [9159000.0, 9483000.0, 11309000.0, 13110000.0]
    full = extrapolate(ns, jumped, 64000)
    assert extrapolate(ns[:3], jumped[:3], 64000).value < jumped[-1] < full.value
    got = extrapolate_count(ns, jumped, 64000)
    assert got.value == pytest.approx(math.sqrt(full.value * jumped[-1]))
    assert got.lower <= jumped[-1]


def test_a_count_whose_fits_with_and_without_the_largest_pilot_agree_is_left_as_it_is():
    """A fixed count and a small exact n^2 term: steep at the target, and the three smaller
    pilots say so too (no averaging); with three pilot sizes there is nothing to leave out."""
    ns = [1000, 2000, 3000, 4000]
    steep = [5e6 + 0.05 * n * n for n in ns]
    got = extrapolate_count(ns, steep, 16000)
    assert got == extrapolate(ns, steep, 16000) and got.hinge == 0.0
    assert got.value == pytest.approx(5e6 + 0.05 * 16000 ** 2, rel=0.05)
    jumped = [7294032.0, 7934293.0, 10604934.0]
    assert extrapolate_count(ns[:3], jumped, 20000) == extrapolate(ns[:3], jumped, 20000)


def test_a_count_whose_largest_pilot_bends_the_growth_down_is_left_as_it_is():
    """groupby_pandas "rank": pandas' groups saturate, the fit with the largest pilot is 0.6
    times the one without it at 4x, and it was the better forecast: only a steeper growth
    hinges."""
    ns = [31250, 62500, 93750, 125000]
    rank = [25077000.0, 43804000.0, 59818000.0, 73378000.0]
    full = extrapolate(ns, rank, 500000)
    assert full.value < extrapolate(ns[:3], rank[:3], 500000).value / 1.5
    assert extrapolate_count(ns, rank, 500000) == full


def test_a_count_of_zero_at_the_largest_pilot_is_not_checked():
    """Nothing counted at the largest pilot (the smaller ones flat): no line to leave, and no
    error (the log of zero)."""
    ns = [125000, 250000, 375000, 500000, 625000]
    counts = [85955.0, 86058.0, 86215.0, 86723.0, 0.0]
    got = extrapolate_count(ns, counts, 8e6)
    assert got == extrapolate(ns, counts, 8e6) and got.hinge == 0.0


def test_a_smooth_count_steepening_on_the_smaller_pilots_line_is_left_as_it_is():
    """The held-out dense_solve's QR: its fit with the largest pilot is 1.69x the one without
    it at 16x, but the largest pilot's count is within 5.5 % of what the three smaller ones'
    fit predicts there (a smooth count, not a jump), and its forecast with the largest pilot
    was the better one."""
    ns = [24, 48, 72, 96]
    qr = [335000.0, 802000.0, 1614000.0, 2864000.0]
    full, part = extrapolate(ns, qr, 16 * 96), extrapolate(ns[:3], qr[:3], 16 * 96)
    assert full.value > 1.5 * part.value
    assert abs(math.log(qr[-1] / extrapolate(ns[:3], qr[:3], 96).value)) < 0.1
    assert extrapolate_count(ns, qr, 16 * 96) == full


def _jumped_runs() -> list[PilotRun]:
    """splu's "assemble" counts (the largest pilot's jumped), the time in proportion to them,
    one run's spread 20 % as splu's."""
    runs = []
    jumped = [7294032.0, 7934293.0, 8552730.0, 10604934.0]
    for n, c in zip([1250, 2500, 3750, 5000], jumped, strict=True):
        t = 2.5e6 * c / jumped[-1]
        work = (t, 1.25 * t, 0.8 * t)
        step = Step("0:assemble", {"instructions": np.array([c])}, (0,),
                    time_ns=t, meta={"work_ns": t})
        runs.append(PilotRun(float(n), (step,), f"run-{n:g}", (work,), (work,)))
    return runs


def test_a_forecast_whose_instructions_hinge_on_the_largest_pilot_says_so_and_is_wide():
    """splu's "assemble" counts, the time in proportion to them and as noisy as splu's (one
    run's spread 20 %): scaled's forecast uses the averaged count, and the printed interval
    reaches over both of its fits."""
    ns = [1250, 2500, 3750, 5000]
    jumped = [7294032.0, 7934293.0, 8552730.0, 10604934.0]
    runs = _jumped_runs()
    (s,) = forecast(runs, 20000, None).steps
    count = s.counters["instructions"]
    assert count.hinge > math.log(10) and "hinges on one pilot's count" in count.how
    assert s.basis == "scaled" and s.choice is not None and s.choice.hinge == count.hinge
    lo, hi = s.interval_s
    full = extrapolate(ns, jumped, 20000).value / jumped[-1] * 2.5e-3
    part = extrapolate(ns[:3], jumped[:3], 20000).value / jumped[-1] * 2.5e-3
    assert lo <= part and hi >= full
    (note,) = [n for n in forecast(runs, 20000, None).notes if "hinges" in n]
    assert note.startswith("superstep 0:assemble: the growth of its instructions hinges")


def test_cli_text_says_how_far_apart_the_hinging_counts_fits_were(pilot_text):
    """The text's interval line names the fits' ratio, and the note is printed."""
    runs = _jumped_runs()
    rc, text, out = pilot_text(runs, "1250,2500,3750,5000", "20000")
    assert rc == 0, out.err
    ratio = math.exp(forecast(runs, 20000, None).steps[0].counters["instructions"].hinge)
    assert (f"and its counts' fit with the largest pilot {ratio:.3g}x the fit without it)"
            in text)
    assert "note: superstep 0:assemble: the growth of its instructions hinges" in text


def test_the_forecast_extrapolates_its_counts_through_extrapolate_count():
    """A forecast of a superstep whose instructions rise 0.8 % over the pilots (the histogram
    reduce's counts) and whose time is flat: its instructions at 16x are a line's, and the
    scaled forecast stays within 1.5x of the largest pilot's time (a steep term through the
    counts made it 25x)."""
    ns = [125000, 250000, 375000, 500000]
    flat = [85955.0, 86058.0, 86215.0, 86723.0]
    runs = []
    for n, c in zip(ns, flat, strict=True):
        work = (1.0e5, 1.05e5, 0.95e5)
        step = Step("0:reduce", {"instructions": np.array([c])}, (0,),
                    time_ns=1.0e5, meta={"work_ns": 1.0e5})
        runs.append(PilotRun(float(n), (step,), f"run-{n:g}", (work,), (work,)))
    (s,) = forecast(runs, 16 * ns[-1], None).steps
    assert "at most linear" in s.counters["instructions"].how
    assert s.scaled is not None and s.scaled.value < 1.5 * 1e-4
