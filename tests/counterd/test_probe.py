"""counterd probe on this host: every counter has a source or the exact reason it has none."""

from __future__ import annotations

from counterd.commands.probe import probe, render_text
from counterd.data.host import host_info


def test_probe_labels_sources_and_explains_missing_hardware() -> None:
    result = probe()
    st = result.counters
    # Software events go through perf_event_open on every Linux host.
    assert st["task_clock_ns"].backend == "perf" and st["task_clock_ns"].source == "measured"
    if host_info().core_pmu is None:
        assert not st["cycles"].available
        assert "no hardware PMU" in (st["cycles"].reason or "")
        # Memory counters still exist, simulated, never passed off as measured.
        for name in ("loads", "stores", "l1d_misses", "l1d_writebacks", "dtlb_misses"):
            assert st[name].available and st[name].source == "simulated", name
    text = render_text(result)
    assert "task_clock_ns" in text and "backends" in text
    # pyperf's system checks: a list in the JSON, a section in the text (what they find
    # depends on the host: tests/counterd/test_noise.py checks them on a fake /sys).
    noise = result.to_json()["noise"]
    assert noise and all(c["status"] in ("noise", "ok", "unknown") and c["check"]
                         for c in noise)
    assert all(c["fix"] for c in noise if c["status"] == "noise")
    assert "\nnoise     what would add timing noise here" in text
