"""contrib/prometheus: promtool accepts the scrape configuration and the rules, and the unit
tests of every recording and alerting rule pass (promtool test rules)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

CONTRIB = Path(__file__).resolve().parents[2] / "contrib" / "prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
RULES = (CONTRIB / "counterd.rules.yml", CONTRIB / "counterd.alerts.yml")
TESTS = CONTRIB / "counterd.rules.test.yml"

needs_promtool = pytest.mark.skipif(
    not Path(PROMTOOL).exists(),
    reason="promtool not installed (Debian package prometheus; scripts/system-deps.sh "
           "installs it as root)")


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=30,
                          cwd=CONTRIB)


@needs_promtool
def test_promtool_checks_the_config_and_the_rules() -> None:
    out = _promtool("check", "config", "prometheus.yml")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 rule files found" in out.stdout + out.stderr
    out = _promtool("check", "rules", *(p.name for p in RULES))
    assert out.returncode == 0, out.stdout + out.stderr


@needs_promtool
def test_promtool_unit_tests_of_the_rules_pass() -> None:
    out = _promtool("test", "rules", TESTS.name)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def _names(kind: str) -> list[str]:
    return [m for p in RULES for m in re.findall(rf"^\s*- {kind}: (\S+)$", p.read_text(), re.M)]


def test_every_rule_has_a_unit_test_and_recording_names_are_level_metric_operations() -> None:
    tests = TESTS.read_text()
    records, alerts = _names("record"), _names("alert")
    assert len(records) >= 10 and len(alerts) >= 6
    tested_exprs = set(re.findall(r"^\s*- expr: ([a-z_:0-9]+)", tests, re.M))
    assert set(records) <= tested_exprs, set(records) - tested_exprs
    fired = set(re.findall(r"exp_alerts:[\s\S]*?(?=\n\s*- alertname|\n\s*- interval|\Z)",
                           tests))
    assert fired  # alerts expected to fire, not only silences
    for alert in alerts:
        assert re.search(rf"alertname: {alert}\n\s*eval_time: \S+\n\s*exp_alerts:", tests), \
            f"no test where {alert} fires"
    for name in records:
        assert re.fullmatch(r"[a-z_]+:[a-z0-9_]+:[a-z0-9_]+", name), name


@needs_promtool
def test_a_broken_threshold_fails_the_unit_tests(tmp_path: Path) -> None:
    """The unit tests can fail: the marker-overhead alert at 10% instead of 1% misses."""
    for p in (*RULES, TESTS):
        shutil.copy(p, tmp_path / p.name)
    alerts = tmp_path / "counterd.alerts.yml"
    text = alerts.read_text()
    assert "ratio_rate5m > 0.01" in text
    alerts.write_text(text.replace("ratio_rate5m > 0.01", "ratio_rate5m > 0.1"))
    out = subprocess.run([PROMTOOL, "test", "rules", TESTS.name], capture_output=True,
                         text=True, timeout=30, cwd=tmp_path)
    assert out.returncode != 0 and "CounterdMarkerOverhead" in out.stdout + out.stderr
