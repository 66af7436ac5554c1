"""counterd probe's noise checks (counterd/commands/noise.py): pyperf's system checks run
against a fake /sys and /proc, so that nothing depends on this host's settings."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from counterd.commands.noise import (
    NoiseCheck,
    noise_checks,
    page_reporting_check,
    render_lines,
)
from counterd.data.host import page_reporting

_system = pytest.importorskip("pyperf._system")
_cpu_utils = pytest.importorskip("pyperf._cpu_utils")


def _fake_root(monkeypatch: pytest.MonkeyPatch, root: Path, cpus: int = 2) -> None:
    """pyperf's checks read ``root``/sys and ``root``/proc instead of the host's, see ``cpus``
    logical CPUs and no x86 MSR (pyperf computes some paths at import: those are patched)."""
    def sysfs(p: str) -> str:
        return os.path.join(root, "sys", p)

    def procfs(p: str) -> str:
        return os.path.join(root, "proc", p)

    for mod in (_system, _cpu_utils):
        monkeypatch.setattr(mod, "sysfs_path", sysfs)
        monkeypatch.setattr(mod, "proc_path", procfs)
    monkeypatch.setattr(_system.ASLR, "path", procfs("sys/kernel/randomize_va_space"))
    monkeypatch.setattr(_system.PerfEvent, "path", procfs("sys/kernel/perf_event_max_sample_rate"))
    monkeypatch.setattr(_system.PowerSupply, "path", sysfs("class/power_supply"))
    monkeypatch.setattr(_system.IRQAffinity, "irq_path", procfs("irq"))
    monkeypatch.setattr(_system, "PLATFORM_X86", False)
    monkeypatch.setattr(_system, "get_logical_cpu_count", lambda: cpus)


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")


def _by_check(checks: list[NoiseCheck]) -> dict[str, NoiseCheck]:
    return {c.check: c for c in checks}


def test_a_noisy_host_gets_a_warning_and_a_fix_per_setting(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path, {
        "sys/devices/system/cpu/cpu0/cpufreq/scaling_governor": "powersave",
        "sys/devices/system/cpu/cpu1/cpufreq/scaling_governor": "performance",
        "sys/devices/system/cpu/cpu0/cpufreq/scaling_min_freq": "800000",
        "sys/devices/system/cpu/cpu0/cpufreq/scaling_max_freq": "3000000",
        "sys/devices/system/cpu/cpu1/cpufreq/scaling_min_freq": "800000",
        "sys/devices/system/cpu/cpu1/cpufreq/scaling_max_freq": "3000000",
        "sys/class/power_supply/AC/type": "Mains",
        "sys/class/power_supply/AC/online": "0",
        "proc/cmdline": "root=/dev/sda1 quiet",
        "proc/sys/kernel/randomize_va_space": "0",
        "proc/sys/kernel/perf_event_max_sample_rate": "1",
    })
    _fake_root(monkeypatch, tmp_path)
    got = _by_check(noise_checks(str(tmp_path / "sys")))
    gov = got["CPU scaling governor"]
    assert gov.status == "noise" and "powersave" in gov.state
    assert gov.fix is not None and "performance" in gov.fix and "pyperf system tune" in gov.fix
    aslr = got["ASLR"]
    assert aslr.status == "noise" and aslr.state == "No randomization"
    assert aslr.fix is not None and "randomize_va_space" in aslr.fix
    sched = got["Linux scheduler"]
    assert sched.status == "noise" and sched.fix is not None and "isolcpus=" in sched.fix
    assert got["Perf event"].status == "ok"
    power = got["Power supply"]
    assert power.status == "noise" and "unplugged" in power.state
    assert got["Turbo Boost"].status == "unknown"  # neither intel_pstate nor x86 here
    assert "IRQ affinity" not in got  # left out: state only, and it runs systemctl
    text = "\n".join(render_lines(list(got.values())))
    assert "CPU scaling governor: " in text and "fix: Use CPU scaling governor" in text
    assert "fine: Perf event (Maximum sample rate: 1 per second)" in text


def test_isolated_cpus_and_a_tuned_host_are_fine(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path, {
        "sys/devices/system/cpu/isolated": "2-3",
        **{f"sys/devices/system/cpu/cpu{c}/cpufreq/scaling_governor": "performance"
           for c in range(4)},
        "proc/cmdline": "isolcpus=2-3 rcu_nocbs=2-3",
        "proc/sys/kernel/randomize_va_space": "2",
        "proc/sys/kernel/perf_event_max_sample_rate": "1",
    })
    _fake_root(monkeypatch, tmp_path, cpus=4)
    got = _by_check(noise_checks(str(tmp_path / "sys")))
    for name in ("CPU scaling governor", "ASLR", "Linux scheduler", "Perf event"):
        assert got[name].status == "ok", got[name]
    assert "Isolated CPUs (2/4): 2-3" in got["Linux scheduler"].state
    lines = render_lines(list(got.values()))
    assert not any("fix:" in line for line in lines)


def test_missing_sysfs_and_procfs_say_which_check_cannot_be_made(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A container or VM: no cpufreq, no power_supply, no /proc/sys/kernel files."""
    _fake_root(monkeypatch, tmp_path)
    got = _by_check(noise_checks(str(tmp_path / "sys")))
    for name, why in (("CPU scaling governor", "cpufreq"), ("ASLR", "randomize_va_space"),
                      ("Perf event", "perf_event_max_sample_rate"),
                      ("Power supply", "power_supply")):
        assert got[name].status == "unknown" and why in got[name].state, got[name]
    text = "\n".join(render_lines(list(got.values())))
    assert "ASLR: cannot check: no /proc/sys/kernel/randomize_va_space" in text


def test_a_damaged_sysfs_file_makes_its_check_unknown(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path, {
        "sys/devices/system/cpu/cpu0/cpufreq/scaling_min_freq": "fast",
        "sys/devices/system/cpu/cpu0/cpufreq/scaling_max_freq": "3000000",
        "sys/devices/system/cpu/cpu0/cpufreq/scaling_governor": "performance",
        "proc/sys/kernel/randomize_va_space": "7",
    })
    _fake_root(monkeypatch, tmp_path, cpus=1)
    got = _by_check(noise_checks(str(tmp_path / "sys")))
    assert got["CPU Frequency"].status == "unknown"
    assert "ValueError" in got["CPU Frequency"].state
    assert got["ASLR"].status == "unknown" and "randomize_va_space" in got["ASLR"].state
    assert got["CPU scaling governor"].status == "ok"


def test_an_unreadable_check_says_it_needs_root(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading an MSR as a user: permission denied, said as such (not noise, not fine)."""
    def denied(op: Any, cpu: int) -> bool:
        op.permission_error = True
        op.warning("Failed to read MSR 0x1a0 from /dev/cpu/0/msr: [Errno 13] Permission denied")
        return False

    _fake_root(monkeypatch, tmp_path)
    monkeypatch.setattr(_system.TurboBoostMSR, "available", staticmethod(lambda: True))
    monkeypatch.setattr(_system.TurboBoostMSR, "read_cpu", denied)
    got = _by_check(noise_checks(str(tmp_path / "sys")))
    turbo = got["Turbo Boost (MSR)"]
    assert turbo.status == "unknown" and turbo.state.startswith("permission denied")


def test_without_pyperf_or_with_changed_internals_the_probe_still_answers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def changed() -> None:
        raise AttributeError("module 'pyperf._system' has no attribute 'System'")

    monkeypatch.setattr(_system, "System", changed)
    only, freed = noise_checks()
    assert only.status == "unknown" and "system checks changed" in only.state
    assert freed.check == "Free page reporting"  # not pyperf's: made all the same
    monkeypatch.undo()
    monkeypatch.setitem(sys.modules, "pyperf", None)
    monkeypatch.delitem(sys.modules, "pyperf._system")
    only, freed = noise_checks()
    assert only.status == "unknown" and only.fix is not None and "pyperf" in only.fix
    assert freed.check == "Free page reporting"


def _virtio(root: Path, name: str, device: str, features: str) -> None:
    _write(root, {f"bus/virtio/devices/{name}/device": device,
                  f"bus/virtio/devices/{name}/features": features})


# Feature strings as sysfs prints them, bit 0 first: a balloon with bits 1, 2, 5 and 7 (free
# page reporting is bit 5) and one with bits 1, 2 and 7 only.
REPORTING = "01100101" + "0" * 24 + "1" + "0" * 31
NOT_REPORTING = "01100001" + "0" * 56


def test_free_page_reporting_is_read_from_the_virtio_balloons_features(tmp_path: Path) -> None:
    _virtio(tmp_path, "virtio1", "0x0002", REPORTING)  # a block device: bit 5 is not its own
    _virtio(tmp_path, "virtio0", "0x0005", REPORTING)
    _write(tmp_path, {"module/page_reporting/parameters/page_reporting_order": "9"})
    got = page_reporting(tmp_path)
    assert (got.state, got.device, got.order) == ("on", "virtio0", 9)
    check = page_reporting_check(str(tmp_path))
    assert check.status == "noise" and "2^9 pages" in check.state
    assert check.fix is not None and "free-page-reporting=off" in check.fix
    assert check.to_json()["status"] == "noise"


def test_a_balloon_without_reporting_or_no_balloon_is_fine(tmp_path: Path) -> None:
    assert page_reporting(tmp_path).state == "off"  # no virtio bus at all: bare metal
    assert page_reporting_check(str(tmp_path)).status == "ok"
    _virtio(tmp_path, "virtio3", "0x0002", REPORTING)
    assert page_reporting(tmp_path).state == "off"  # only a block device
    _virtio(tmp_path, "virtio0", "0x0005", NOT_REPORTING)
    got = page_reporting(tmp_path)
    assert got.state == "off" and "did not negotiate" in got.why
    assert "off" in page_reporting_check(str(tmp_path)).state


@pytest.mark.parametrize("features", ["", "0110x101", "\x00\xff", "2" * 64])
def test_damaged_balloon_features_make_the_check_unknown(tmp_path: Path, features: str) -> None:
    _virtio(tmp_path, "virtio0", "0x0005", features)
    got = page_reporting(tmp_path)
    assert got.state == "unknown" and "features" in got.why
    assert page_reporting_check(str(tmp_path)).status == "unknown"


def test_an_order_the_kernel_leaves_unset_is_not_printed(tmp_path: Path) -> None:
    """page_reporting_order reads as 2**32 - 1 until the driver sets it (mm/page_reporting.c);
    missing on kernels without the parameter."""
    _virtio(tmp_path, "virtio0", "0x0005", REPORTING)
    assert page_reporting(tmp_path).order is None
    _write(tmp_path, {"module/page_reporting/parameters/page_reporting_order": "4294967295"})
    got = page_reporting(tmp_path)
    assert got.state == "on" and got.order is None
    assert "2^" not in page_reporting_check(str(tmp_path)).state


def test_a_kernel_that_can_delay_reporting_is_told_how_and_a_delay_of_a_minute_is_fine(
        tmp_path: Path) -> None:
    """min_free_ms: how long a block stays free before it is reported, on guest kernels that
    have the parameter (upstream Linux does not)."""
    _virtio(tmp_path, "virtio0", "0x0005", REPORTING)
    params = "module/page_reporting/parameters/"
    _write(tmp_path, {params + "min_free_ms": "0"})
    got = page_reporting(tmp_path)
    assert got.min_free_ms == 0 and got.noisy and got.to_json()["noisy"] is True
    check = page_reporting_check(str(tmp_path))
    assert check.status == "noise" and check.fix is not None
    assert "echo 60000 > /sys/module/page_reporting/parameters/min_free_ms" in check.fix
    assert "echo 0 restores it" in check.fix
    _write(tmp_path, {params + "min_free_ms": "60000"})
    got = page_reporting(tmp_path)
    assert got.state == "on" and not got.noisy
    check = page_reporting_check(str(tmp_path))
    assert check.status == "ok" and "after 60000 ms free" in check.state
    _write(tmp_path, {params + "min_free_ms": "soon"})  # damaged: as if absent
    assert page_reporting(tmp_path).min_free_ms is None and page_reporting(tmp_path).noisy
