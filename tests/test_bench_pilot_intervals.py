"""``bench/pilot_intervals.py``: its error model is the code's (``interval_half``), its
maximum-likelihood fit recovers known constants from simulated errors, and it says in one line
where there are no campaigns to fit on."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from bench import pilot_intervals as pi
from predictor.pilot.choice import SHORT_S, interval_half

SIZES = (1e5, 2e5, 3e5, 4e5)


def _point(error: float, spread: float, factor: float, work_s: float, heldout: float,
           hinge: float = 0.0) -> pi.Point:
    return pi.Point("prog", f"{factor:g}x", error, spread, math.log(factor),
                    max(0.0, math.log(SHORT_S / work_s)), heldout, hinge=hinge)


@pytest.mark.parametrize("spread, factor, work_s, heldout, hinge", [
    (0.05, 4, 1e-2, 0.0, 0.0), (0.2, 16, 1e-2, 0.1, 0.0), (0.05, 4, 1e-4, 0.3, 0.0),
    (0.0, 1, 1e-5, 0.5, 0.0), (0.05, 4, 1e-2, 0.1, 2.8), (0.0, 1, 1e-2, 0.0, 1.0)])
def test_the_bench_model_with_the_code_constants_is_interval_half(spread, factor, work_s,
                                                                   heldout, hinge):
    """The bench fits the model the code uses: with the code's constants, its half-width at
    the 90 % level is ``interval_half``'s for the same superstep (a target inside the pilot
    range: distance 0), the counts' hinge included."""
    p = _point(0.0, spread, factor, work_s, heldout, hinge)
    z = stats.norm.ppf(0.95)
    got = z * float(pi.sigma(pi.CODE, [p])[0])
    assert got == pytest.approx(interval_half(spread, SIZES, factor * SIZES[-1],
                                              work_s=work_s, heldout=heldout, hinge=hinge))


def test_fewer_terms_leave_the_later_ones_out() -> None:
    p = _point(0.0, 0.1, 4, 1e-4, 0.3)
    d = math.log(4)
    assert float(pi.sigma((0.1, 0.5), [p])[0]) == pytest.approx(math.hypot(0.1 * d, 0.05))
    assert float(pi.sigma((0.1, 0.5, 0.2), [p])[0]) == pytest.approx(
        math.sqrt((0.1 * d) ** 2 + 0.05 ** 2 + (0.2 * d * math.log(10)) ** 2))


def test_the_fit_recovers_known_constants_and_the_likelihood_prefers_the_true_terms() -> None:
    """Errors drawn from the model with A 0.12, B 0.6, C 0.15, D 0.7 over a spread of
    supersteps: the 4-term fit finds them within 15 %, and its negative log likelihood is
    lower than the 3-term fit's by more than its one extra constant costs (Akaike)."""
    rng = np.random.default_rng(7)
    truth = (0.12, 0.6, 0.15, 0.7)
    pts = []
    for _ in range(1500):
        p = _point(0.0, float(rng.uniform(0.01, 0.3)), float(rng.choice([4, 16])),
                   float(10 ** rng.uniform(-4.5, -1.5)), float(rng.uniform(0.0, 0.6)))
        s = float(pi.sigma(truth, [p])[0])
        pts.append(pi.Point(p.program, p.label, float(rng.normal(0.0, s)), p.spread,
                            p.distance, p.short, p.heldout))
    got, nll4 = pi.fit(pts, 4)
    assert got == pytest.approx(truth, rel=0.15)
    _, nll3 = pi.fit(pts, 3)
    assert 2 * nll4 + 8 < 2 * nll3 + 6


def test_no_campaigns_is_one_line_and_exit_2(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert pi.main(["--work", str(tmp_path / "none"), "--profile", "unused"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no kept campaigns" in err[0] and "outside_suite.py" in err[0]
