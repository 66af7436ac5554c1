"""Memory logP (Cameron, Sun, Byna and Ge): the geometry-derived terms against brute force,
the fit recovering known costs from synthetic data, the section 4 / 6.5 cost formulas against
their derivation, bad input, and the CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from counterd.machine.geometry import CacheLevel
from predictor.cli import main as predict_main
from predictor.errors import BadInput
from predictor.families import memlogp as ml
from predictor.families import memlogp_costs as mc

L1 = CacheLevel(1, 32 * 1024, 8, 64)
L2 = CacheLevel(2, 1 << 20, 8, 64)
L3 = CacheLevel(3, 32 << 20, 16, 64)
H = ml.Hierarchy((L1, L2, L3), 4096, 64)


@pytest.mark.parametrize("d", [8, 64, 128, 256, 2048, 4096, 8192, 192])
def test_line_slots_by_brute_force(d: int) -> None:
    addresses = np.arange(4096) * d
    slots = {int(a % 4096) // 64 for a in addresses}
    assert ml.line_slots(d, 64, 4096) == len(slots)


@pytest.mark.parametrize("d", [64, 256, 2048, 8192])
def test_effective_capacity_by_brute_force(d: int) -> None:
    # Physically indexed L2: a word's set = (page frame colour, line slot in the page);
    # with frames of every colour the reachable sets are colours x slots.
    rng = np.random.default_rng(0)
    addresses = np.arange(200_000) * d
    frames = rng.integers(0, 1 << 20, size=int(addresses[-1] // 4096) + 1)
    phys = frames[addresses // 4096] * 4096 + addresses % 4096
    sets = {int(x // 64) % L2.sets for x in phys}
    assert ml.effective_capacity(L2, d, 4096) == len(sets) * L2.ways * 64
    # L1 (64 sets = one page of lines): virtual = physical index bits
    l1_sets = {int(a // 64) % L1.sets for a in addresses}
    assert ml.effective_capacity(L1, d, 4096) == len(l1_sets) * L1.ways * 64


def test_miss_fraction() -> None:
    assert ml.miss_fraction([0.5, 1.0, 2.0, 4.0]).tolist() == [0.0, 0.0, 0.5, 0.75]


def _lru_cycle_misses(set_of_line: list[int], ways: int) -> int:
    """Brute force: an LRU cache of ``ways`` per set, the lines read in order twice; the
    misses of the second pass (the steady state of a cyclic reference string)."""
    from collections import OrderedDict

    sets: dict[int, OrderedDict[int, None]] = {}
    misses = 0
    for rep in range(2):
        for line, s in enumerate(set_of_line):
            q = sets.setdefault(s, OrderedDict())
            if line in q:
                q.move_to_end(line)
                continue
            misses += rep
            q[line] = None
            if len(q) > ways:
                q.popitem(last=False)
    return misses


@pytest.mark.parametrize("lines,sets,ways", [(64, 16, 4), (64, 16, 3), (70, 16, 4),
                                             (72, 16, 4), (80, 16, 4), (200, 16, 8),
                                             (2100, 1, 2048), (4096, 1, 4096)])
def test_lru_step_by_simulation(lines: int, sets: int, ways: int) -> None:
    # The index within the page (L1) or a fully associative TLB: lines spread evenly.
    got = _lru_cycle_misses([i % sets for i in range(lines)], ways) / lines
    assert float(ml.lru_miss_fraction(lines / sets, ways, False)) == pytest.approx(got)


@pytest.mark.parametrize("pages,ways", [(64, 2), (128, 2), (192, 4), (256, 4), (384, 4),
                                        (512, 8)])
def test_lru_random_frames_by_simulation(pages: int, ways: int) -> None:
    # Physically indexed: one line per page at the same slot (d a multiple of the page), the
    # set = the random colour of the page's frame; averaged over frame draws.
    colours, trials = 64, 60
    rng = np.random.default_rng(pages)
    got = np.mean([_lru_cycle_misses(rng.integers(0, colours, pages).tolist(), ways) / pages
                   for _ in range(trials)])
    want = float(ml.lru_miss_fraction(pages / colours, ways, True))
    assert want == pytest.approx(got, abs=0.04)  # Poisson for Binomial(pages - 1, 1/64)
    assert 0.0 < want < 1.0


def test_poisson_tail() -> None:
    lam, k = 3.0, 4
    want = 1 - sum(math.exp(-lam) * lam ** i / math.factorial(i) for i in range(k))
    assert float(ml.poisson_tail(lam, k)) == pytest.approx(want)
    assert ml.poisson_tail([0.0, 1e4], 16).tolist() == [0.0, 1.0]


def test_features_lines_per_byte() -> None:
    # Far beyond every level: the miss fractions tend to 1 and the terms to lines per byte.
    f = ml.features("pack", 1 << 30, 4096, H)
    assert f["m1p"] == pytest.approx(1 / 8, rel=1e-3)  # one line per 8-byte word (loads)
    assert f["m1s"] == pytest.approx(1 / 64, rel=1e-3)  # contiguous stores: a line per 64 B
    assert ml.features("copy", 4096, 8, H)["m1s"] == 0.0  # 8 KiB of data fit in L1
    # the vector copy's lines: both sides streamed, 2 lines per 64 B beyond L1 and L2
    big = ml.features("copy", 4 << 20, 8, H)
    assert big["m1v"] == pytest.approx(2 / 64) and big["m2v"] == pytest.approx(2 / 64)
    assert big["m1s"] == 0.0 and ml.features("copy", 4 << 20, 64, H)["m1v"] == 0.0
    assert ml.features("copy", 4096, 8, H)["m1v"] == 0.0
    # page walks: a page per word at d = 8192, its entries (and data) far beyond L2
    walk = ml.features("pack", 1 << 24, 8192, H)
    assert walk["w2"] == pytest.approx(1 / 8 + 1 / 4096, rel=1e-3)
    assert ml.features("pack", 4096, 8192, H)["w3"] == 0.0
    # the TLB: a step at its reach (the span's pages of both sides)
    tlb = ml.features("pack", 4096 * 8, 8192, H)["tlb4096"]  # 8192 + 8 pages
    assert tlb == pytest.approx(1 / 8 + 1 / 4096)
    assert ml.features("pack", 4096 * 2, 8192, H)["tlb4096"] == 0.0  # 2048 + 2 pages
    assert ml.features("copy", 4096, 8, H)["loop"] == 0.0
    assert ml.features("unpack", 4096, 8, H)["loop"] == 1.0


def _synthetic(coef: dict[str, float], op: str = "pack") -> ml.Measurements:
    pts = []
    for s in (4096, 16384, 65536, 1 << 18, 1 << 20, 1 << 22, 1 << 24, 1 << 26):
        for d in (8, 32, 64, 256, 2048, 8192):
            if (s // 8) * d > 1 << 28:
                continue
            f = ml.features(op, s, d, H)
            y = coef["1"] + sum(v * float(f[k]) for k, v in coef.items() if k != "1")
            pts.append(ml.Point(op, s, d, y))
            if op == "pack" and d == 8:
                pts.append(ml.Point("copy", s, 8, coef["1"] / 20))
    return ml.Measurements(tuple(pts), H, {"hostname": "synthetic"}, "synthetic")


def test_fit_recovers_known_costs() -> None:
    coef = {"1": 2.5e-10, "m3p": 6e-9, "m3s_2": 1.2e-9, "tlb1024": 2e-9}
    m = _synthetic(coef)
    model = ml.fit(m, modeler="fixed", ops=["pack"])
    got = dict(zip(map(str, model.curves["pack"].model.terms),
                   model.curves["pack"].model.coef, strict=True))
    for k, v in coef.items():
        assert got[k] == pytest.approx(v, rel=1e-6)
    for k, v in got.items():
        if k not in coef:
            assert abs(v) < 1e-15
    assert ml.compare(model, m).within(1e-6)
    # alpha: the contiguous copies whose source and destination fit L1 (4 KiB, 16 KiB)
    assert model.alpha_s_per_byte == pytest.approx(coef["1"] / 20)


def test_brewer_prunes_to_the_true_terms() -> None:
    coef = {"1": 2.5e-10, "m3p": 6e-9}
    m = _synthetic(coef)
    # a little noise, so the t-tests have a residual to judge
    rng = np.random.default_rng(1)
    pts = tuple(ml.Point(p.op, p.s_bytes, p.d_bytes,
                         p.per_byte_s * (1 + 0.01 * rng.standard_normal())) for p in m.points)
    model = ml.fit(ml.Measurements(pts, H), ops=["pack"])
    kept = {str(t) for t in model.curves["pack"].model.terms}
    assert {"1", "m3p"} <= kept and len(kept) <= 4


def _model(alpha: float = 1e-10, pack: float = 3e-10, unpack: float = 5e-10) -> ml.MemLogP:
    pts = []
    for op, c in (("pack", pack), ("unpack", unpack), ("copy", alpha)):
        for s in (4096, 8192, 65536, 1 << 20, 1 << 22, 1 << 24):
            for d in (8, 256, 2048):
                pts.append(ml.Point(op, s, d, c if op != "copy" or d == 8 else 2 * c))
    return ml.fit(ml.Measurements(tuple(pts), H), modeler="fixed")


def test_p2p_and_broadcast_against_the_derivation() -> None:
    model = _model()
    a = model.alpha_s_per_byte
    assert a == pytest.approx(1e-10)
    s, d, L = 8192, 256, 1e-6
    ell_p = float(model.ell("pack", s, d))
    ell_u = float(model.ell("unpack", s, d))
    assert ell_p == pytest.approx(2e-10, rel=1e-6) and ell_u == pytest.approx(4e-10, rel=1e-6)
    p2p = mc.p2p_cost(model, s, d, L)
    assert p2p.total_s == pytest.approx(s * (a + ell_p) + L + s * (a + ell_u))
    # Brute force of the broadcast: the root packs P - 1 messages, one every max(alpha, g)
    # s; each travels L and is unpacked; the cost is the last receiver's finish.
    for procs in (2, 3, 8):
        finish = 0.0
        for k in range(procs - 1):
            start = k * s * a
            finish = max(finish, start + s * (a + ell_p) + L + s * (a + ell_u))
        assert mc.broadcast_cost(model, s, d, procs, L).total_s == pytest.approx(finish)
    # P = 2 is the point-to-point cost; the printed formula is not (one gap too many).
    assert mc.broadcast_cost(model, s, d, 2, L).total_s == pytest.approx(p2p.total_s)
    printed = mc.paper_broadcast_cost(model, s, d, 2, L).total_s
    assert printed - p2p.total_s == pytest.approx(s * a)


def test_ell_is_never_negative() -> None:
    model = _model()
    assert float(model.ell("copy", 4096, 8)) >= 0.0


@pytest.mark.parametrize("s,d", [(12, 8), (4096, 12), (0, 8), (4096, 0), (math.nan, 8)])
def test_bad_message_is_bad_input(s: float, d: float) -> None:
    with pytest.raises(BadInput):
        ml.features("pack", s, d, H)


def test_bad_input() -> None:
    model = _model()
    with pytest.raises(BadInput):
        mc.broadcast_cost(model, 8192, 256, 1)
    with pytest.raises(BadInput):
        mc.p2p_cost(model, 8192, 256, -1.0)
    with pytest.raises(BadInput):
        ml.features("scatter", 4096, 8, H)
    with pytest.raises(BadInput):
        ml.Point("pack", 4096, 8, 0.0)
    with pytest.raises(BadInput):
        ml.measurements_from_json({"format": "counterd-microbench", "version": 1})
    with pytest.raises(BadInput):
        ml.measurements_from_json({"format": ml.FORMAT, "version": 99})
    no_copy = ml.Measurements((ml.Point("pack", 4096, 8, 1e-10),), H)
    with pytest.raises(BadInput):
        ml.fit(no_copy)


def _doc(m: ml.Measurements) -> dict[str, object]:
    return {"format": ml.FORMAT, "version": ml.VERSION, "host": {"hostname": "synthetic"},
            "geometry": H.to_json(), "points": [p.to_json() for p in m.points]}


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    coef = {"1": 2.5e-10, "m3p": 6e-9, "tlb1024": 2e-9}
    m = _synthetic(coef)
    m = ml.Measurements(m.points + _synthetic(coef, "unpack").points, H)
    f = tmp_path / "m.json"
    f.write_text(json.dumps(_doc(m)))
    assert predict_main(["memlogp", "--results", str(f), "--modeler", "fixed", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["within_25_percent"] is True
    assert out["comparison"]["worst"]["error"] == pytest.approx(0.0, abs=1e-6)
    assert out["costs"]["estimates"][0]["what"] == "point-to-point"
    assert predict_main(["memlogp", "--results", str(f), "--size", "12"]) == 2
    assert predict_main(["memlogp", "--results", str(tmp_path / "missing.json")]) == 2
    assert predict_main(["memlogp", "--results", str(f)]) == 0
    text = capsys.readouterr().out
    assert "alpha = " in text and "worst:" in text and "broadcast to 7" in text
