"""Hand-computed F1, F2, F3, F and BSP bounds for the paper's own patterns (seed 004 section 4)
with its published parameters (microseconds; the profile holds ns, 1000x).

SGI Power Challenge (section 2): 8 processors, 4-byte words, L1 lines 32 B (8 words), L2 lines
128 B (32 words), 8 banks interleaved on 128 B (Table 1). Every pattern does N accesses per
active processor in one superstep (one repetition).
"""

from __future__ import annotations

import numpy as np
import pytest

from predictor.costs import costfuncs as cf
from predictor.costs.profile import sgi_power_challenge
from predictor.inputs import Step

N = 1000.0
# Section 4.2 table, us per event; g5_F1, g2_F2, g2_F3 per 16-byte quadword.
G_F1 = (0.0088, 0.055, 0.97, 0.013, 0.026)
G_F2 = (1.17, 0.18)
G_F3 = (0.26, 0.051)
QW = 8  # quadwords per 128-byte L2 line


def sgi_f(loads, stores, l1m, l2m, l1wb, l2wb_lines, lm, wb_lines):
    """The paper's F from the explicit cost functions, in us, writebacks given in lines."""
    g1, g2, g3, g4, g5 = G_F1
    v1 = cf.f1(loads, stores, np.array([l1m, l2m]), np.array([l1wb, l2wb_lines]), g1,
               [g2, g3], [g4, g5 * QW])
    v2 = cf.f2(l2m, l2wb_lines, G_F2[0], G_F2[1] * QW, p=8)
    v3 = cf.f3(lm, wb_lines, G_F3[0], G_F3[1] * QW)
    return v1, v2, v3, cf.f_max(v1, v2, v3)


def step(name, loads, stores, l1m, l2m, l1wb, l2wb, lm, wb, k=1.0, m_b=None):
    c = {"loads": loads, "stores": stores, "l1d_misses": l1m, "l2_misses": l2m,
         "l1d_writebacks": l1wb, "l2_writebacks": l2wb}
    return Step(name, {k_: np.asarray(v, float) for k_, v in c.items()},
                tuple(range(len(loads))), np.asarray(lm, float), np.asarray(wb, float), k, m_b)


def p8_b8(op):
    """p8.s256.b8.{L,S}E: stride 256 words = 1 KB = 8 L2 lines, so every access misses L1 and
    L2 and all 8 processors' lines fall in bank 0 (Table 1): LM(0) = 8N. A store also writes
    back one dirty L1 line and one dirty L2 line (= 8 quadwords) in steady state."""
    st = op == "S"
    n8 = np.full(8, N)
    z8 = np.zeros(8)
    lm = np.array([8 * N] + [0.0] * 7)
    wb = lm if st else np.zeros(8)
    return (z8 if st else n8), (n8 if st else z8), n8, n8, (n8 if st else z8), \
        (n8 if st else z8), lm, wb


def test_p8_s256_b8_loads():
    v1, v2, v3, res = sgi_f(*p8_b8("L"))
    assert v1 == pytest.approx((0.0088 + 0.055 + 0.97) * N)  # 1.0338 N: g1 + g2 + g3
    assert v2 == pytest.approx(1.17 * (8 * N) / 8)  # bus: 8N misses over p = 8
    assert v3 == pytest.approx(0.26 * 8 * N)  # bank 0 serves all 8N misses: 2.08 N
    assert res.value == pytest.approx(2.08 * N)
    assert cf.F_TERMS[int(res.dominant)] == "F3"


def test_p8_s256_b8_stores():
    v1, v2, v3, res = sgi_f(*p8_b8("S"))
    # F1: 0.0088 + 0.055 + 0.97 + 0.013 (one L1 line back) + 0.026 * 8 quadwords = 1.2548
    assert v1 == pytest.approx((0.0088 + 0.055 + 0.97 + 0.013 + 0.026 * 8) * N)
    assert v2 == pytest.approx((1.17 + 0.18 * 8) * N)  # 2.61 N
    # F3: 0.26 * 8N + 0.051 * (8N lines * 8 quadwords) = 2.08 N + 3.264 N = 5.344 N, which is
    # the paper's g1_QSM max (5.35, from p8.s256.b8.SC): a consistency check of the x8.
    assert v3 == pytest.approx((0.26 * 8 + 0.051 * 64) * N)
    assert res.value == pytest.approx(5.344 * N)
    assert cf.F_TERMS[int(res.dominant)] == "F3"


def test_p8_s256_b1_loads_bus_dominates():
    # p8.s256.b1.LE: processor i on bank i (Table 1), LM(b) = N for every bank.
    n8, z8 = np.full(8, N), np.zeros(8)
    v1, v2, v3, res = sgi_f(z8 + n8, z8, n8, n8, z8, z8, n8, z8)
    assert v1 == pytest.approx(1.0338 * N)
    assert v2 == pytest.approx(1.17 * N)
    assert v3 == pytest.approx(0.26 * N)
    assert cf.F_TERMS[int(res.dominant)] == "F2"


def test_p1_s8_l2_hits():
    # p1.s8.b0.LE: stride 8 words = one 32-B L1 line: every load misses L1, hits L2.
    one = np.array([N] + [0.0] * 7)  # processor 0 active, 7 idle
    z = np.zeros(8)
    v1, v2, v3, res = sgi_f(one, z, one, z, z, z, z, z)
    assert v1 == pytest.approx((0.0088 + 0.055) * N)  # 0.0638 N
    assert v2 == 0.0 and v3 == 0.0
    assert cf.F_TERMS[int(res.dominant)] == "F1"


def test_p1_s32_memory_is_f1_not_f2():
    # p1.s32.b1/8.LE: every load misses L1 and L2; lines rotate over all 8 banks.
    one = np.array([N] + [0.0] * 7)
    z = np.zeros(8)
    v1, v2, v3, res = sgi_f(one, z, one, one, z, z, np.full(8, N / 8), z)
    assert v1 == pytest.approx(1.0338 * N)
    assert v2 == pytest.approx(1.17 * N / 8)  # p = 8 machine processors, not 1 active
    assert v3 == pytest.approx(0.26 * N / 8)
    assert cf.F_TERMS[int(res.dominant)] == "F1"  # the paper fitted F1 on this pattern


def test_bsp_bounds_by_hand():
    # p8.s256.b8.LE: H = N, M = 8N, K = 1 (exclusive), M_b = 8N (all on bank 0).
    h, m = cf.bsp_h_m(np.full(8, N), np.zeros(8))
    assert (h, m) == (N, 8 * N)
    assert cf.qsm(h, 1, 0.0083, 0.001) == pytest.approx(0.0083 * N)
    assert cf.qsm(h, 1, 5.35, 0.67) == pytest.approx(5.35 * N)
    assert cf.ebsp(h, m, 8, 0.0083, 0.0083) == pytest.approx(0.0083 * N)
    assert cf.ebsp(h, m, 8, 1.31, 5.35) == pytest.approx(5.35 * N)  # 5.35 * 8N / 8
    assert cf.dxbsp(h, 8 * N, 0.0083, 0.26) == pytest.approx(2.08 * N)  # bank term
    assert cf.dxbsp(h, 8 * N, 3.40, 0.33) == pytest.approx(3.40 * N)  # 3.40 N > 2.64 N
    # p1.s8.b0.LE: H = M = N; EBSP max = max(1.31 N, 5.35 N / 8) = 1.31 N.
    assert cf.ebsp(N, N, 8, 1.31, 5.35) == pytest.approx(1.31 * N)
    # QSM with a hot word: K = 8N (every processor on one word) -> 0.67 * 8N = 5.36 N.
    assert cf.qsm(N, 8 * N, 5.35, 0.67) == pytest.approx(5.36 * N)


def test_profile_model_equals_hand_values_in_ns():
    prof = sgi_power_challenge()
    model, bsp = prof.f_model("paper"), prof.bsp_model()
    s = step("p8.s256.b8.SE", *p8_b8("S"), k=1.0, m_b=8 * N)
    br = model.evaluate(s)
    assert br.f1 == pytest.approx(1.2548 * N * 1000)
    assert br.f2 == pytest.approx(2.61 * N * 1000)
    assert br.f3 == pytest.approx(5.344 * N * 1000)
    assert (br.dominant, br.f3_bank, br.assumed) == ("F3", 0, ())
    b = bsp.evaluate(s)
    assert b["QSM_max"] == pytest.approx(5.35 * N * 1000)
    assert b["EBSP_max"] == pytest.approx(5.35 * N * 1000)
    assert b["DXBSP_min"] == pytest.approx(0.26 * 8 * N * 1000)
    assert b["DXBSP_max"] == pytest.approx(3.40 * N * 1000)


def test_missing_banks_are_assumed_uniform():
    prof = sgi_power_challenge()
    n8, z8 = np.full(8, N), np.zeros(8)
    s = Step("no banks", {"loads": n8, "stores": z8, "l1d_misses": n8, "l2_misses": n8,
                          "l1d_writebacks": z8, "l2_writebacks": z8})
    br = prof.f_model().evaluate(s)
    assert br.f3 == pytest.approx(0.26 * N * 1000)  # 8N misses / 8 banks = N per bank
    assert br.assumed == ("banks",)


def test_vectorised_over_supersteps():
    loads = np.array([[1.0, 2.0], [3.0, 1.0]])  # 2 supersteps x 2 processors
    z = np.zeros((2, 2))
    misses = np.stack([loads, z], axis=1)  # (2, L=2, 2)
    v = cf.f1(loads, z, misses, np.zeros_like(misses), 1.0, [10.0, 0.0], [0.0, 0.0])
    np.testing.assert_allclose(v, [22.0, 33.0])
    np.testing.assert_allclose(cf.f3(np.array([[1.0, 5.0], [2.0, 0.0]]), z, 2.0, 0.0),
                               [10.0, 4.0])
    r = cf.f_max([1.0, 5.0], [2.0, 1.0], [0.0, 7.0])
    np.testing.assert_allclose(r.value, [2.0, 7.0])
    assert list(r.dominant) == [1, 2]


def test_error_ratio():
    np.testing.assert_allclose(cf.error_ratio([2.0, 3.0, 4.0], [1.0, 3.0, 8.0]), [2, 1, 2])
    assert cf.error_ratio(0.0, 1.0) == np.inf


def test_predict_superstep_for_the_daemon_in_seconds():
    from predictor.costs.costfuncs import predict_superstep

    # p1.s8-like on the paper's machine: F1 = 0.0638 us per load.
    out = predict_superstep(sgi_power_challenge(), {
        "loads": [N], "stores": [0.0], "l1d_misses": [N], "l2_misses": [0.0],
        "l1d_writebacks": [0.0], "l2_writebacks": [0.0]})
    assert out["F"] == pytest.approx(0.0638 * N * 1e-6)
    assert out["F1"] == out["F"] and out["F2"] == 0.0
    assert out["EBSP_max"] == pytest.approx(1.31 * N * 1e-6)
