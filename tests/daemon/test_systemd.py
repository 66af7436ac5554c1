"""The shipped unit: systemd-analyze verify passes; security exposure is 4.0 or less."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parents[2] / "systemd" / "counterd.service"
ANALYZE = shutil.which("systemd-analyze")

pytestmark = pytest.mark.skipif(ANALYZE is None,
                                reason="systemd-analyze not installed (Debian package systemd)")


def test_verify_passes(tmp_path: Path) -> None:
    # verify checks that ExecStart= exists on this host: point it at this checkout's
    # installed entry point instead of the packaged /usr/local/bin/counterd.
    counterd = Path(sys.prefix) / "bin" / "counterd"
    if not counterd.exists():
        pytest.skip(f"{counterd} is not installed (pip install -e .)")
    unit = tmp_path / "counterd.service"
    unit.write_text(UNIT.read_text().replace("/usr/local/bin/counterd", str(counterd)))
    out = subprocess.run([ANALYZE, "verify", str(unit)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "counterd.service" not in out.stderr, out.stderr  # no warnings about the unit


def test_security_exposure_is_at_most_4() -> None:
    out = subprocess.run([ANALYZE, "security", "--offline=true", str(UNIT)],
                         capture_output=True, text=True, timeout=60)
    m = re.search(r"Overall exposure level for counterd.service: ([0-9.]+)", out.stdout)
    assert m, out.stdout + out.stderr
    assert float(m.group(1)) <= 4.0, out.stdout


def test_unit_grants_only_the_capabilities_it_needs() -> None:
    text = UNIT.read_text()
    caps = re.search(r"^CapabilityBoundingSet=(.*)$", text, re.M)
    assert caps and set(caps.group(1).split()) == {"CAP_PERFMON", "CAP_SYS_PTRACE"}
    assert "perf_event_open" in re.search(r"^SystemCallFilter=(.*)$", text, re.M).group(1)  # type: ignore[union-attr]
    assert "Type=notify" in text and "ExecReload=/bin/kill -HUP $MAINPID" in text


DROP_IN = UNIT.parent / "counterd.service.d" / "metrics-network.conf.example"


def test_the_network_drop_in_mirrors_its_metrics_allow(tmp_path: Path) -> None:
    """The example drop-in's IPAddressAllow= lists exactly the metrics.allow of the config it
    shows, and systemd-analyze verify accepts the unit with it."""
    import tomllib

    from counterd.daemon import config as config_mod

    text = DROP_IN.read_text()
    toml = "\n".join(line[4:] for line in text.splitlines()
                     if line.startswith("#   ") and not line.startswith("#   #"))
    cfg = config_mod._config(tomllib.loads(toml), None, {})
    allowed = re.search(r"^IPAddressAllow=(.*)$", text, re.M)
    assert allowed is not None
    assert set(config_mod.allowed_networks(cfg.metrics_allow)) == set(
        config_mod.allowed_networks(",".join(allowed.group(1).split())))
    counterd = Path(sys.prefix) / "bin" / "counterd"
    if not counterd.exists():
        pytest.skip(f"{counterd} is not installed (pip install -e .)")
    unit = tmp_path / "counterd.service"
    unit.write_text(UNIT.read_text().replace("/usr/local/bin/counterd", str(counterd)))
    (tmp_path / "counterd.service.d").mkdir()
    (tmp_path / "counterd.service.d" / "metrics-network.conf").write_text(text)
    out = subprocess.run([ANALYZE, "verify", str(unit)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "metrics-network" not in out.stderr, out.stderr
