"""The PAPI backend: the same canonical names through presets; honest about what it lacks."""

from __future__ import annotations

import pytest

from counterd.backends.papi import NO_PRESET, PRESETS, PapiBackend
from counterd.data.errors import EventNotSupported, UnknownCounter
from counterd.data.events import NAMES


def test_every_canonical_counter_has_a_preset_or_a_reason() -> None:
    assert set(PRESETS) == set(NAMES)
    for name, preset in PRESETS.items():
        if preset is None:
            assert NO_PRESET[name], name
        else:
            assert preset.startswith("PAPI_"), name


def test_capability_never_raises_and_explains_every_counter() -> None:
    cap = PapiBackend().available()
    assert cap.backend == "papi" and cap.reason
    assert set(cap.counters) == set(NAMES)
    for name, why in cap.counters.items():
        assert why is None or len(why) > 10, name
    assert "writeback" in (cap.counters["l2_writebacks"] or "")


def test_no_preset_on_a_host_without_pmu_says_why() -> None:
    pytest.importorskip("pypapi", reason="python-papi is in the [test] extra")
    from counterd.data.host import host_info

    if host_info().core_pmu is not None:
        pytest.skip("this host has a PMU: presets may exist")
    cap = PapiBackend().available()
    assert not cap.available
    assert "PAPI_L1_DCM" in (cap.counters["l1d_misses"] or "")
    assert "perf_event" in cap.reason  # PAPI's own component status is quoted


def test_open_rejects_unknown_and_unsupported_counters() -> None:
    pytest.importorskip("pypapi", reason="python-papi is in the [test] extra")
    with pytest.raises(UnknownCounter):
        PapiBackend().open(["loadz"])
    with pytest.raises(EventNotSupported, match="no preset for cache writebacks"):
        PapiBackend().open(["l2_writebacks"], strict=True)
    group = PapiBackend().open(["l2_writebacks"], strict=False)
    try:
        reading = group.read()
        assert reading.values == {}
        assert "l2_writebacks" in reading.unsupported
    finally:
        group.close()
        group.close()  # idempotent
