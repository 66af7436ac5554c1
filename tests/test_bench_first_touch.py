"""bench/first_touch.py: the first touch's cost by how long memory lay free (a tiny run: the
figures are the bench's to take, not this test's), and its bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "first_touch.py"


def test_a_tiny_run_prints_each_wait_and_writes_its_json(tmp_path: Path) -> None:
    out = tmp_path / "ft.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--mib", "1", "--rounds", "2",
                           "--waits", "0,0.01", "--json", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "free page reporting: " in proc.stdout
    data = json.loads(out.read_text())
    assert [r["wait_s"] for r in data["rows"]] == [0.0, 0.01]
    assert all(len(r["ms"]) == 2 and r["min_ms"] <= r["median_ms"] <= r["max_ms"]
               for r in data["rows"])
    assert data["rows"][0]["ratio"] == 1.0
    assert data["page_reporting"]["state"] in ("on", "off", "unknown")


def test_bad_options_get_one_line_and_exit_2() -> None:
    for args in (["--waits", "soon"], ["--waits", "-1"], ["--mib", "0"], ["--rounds", "x"]):
        proc = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 2, args
        assert proc.stderr.strip().splitlines()[-1].startswith("first_touch.py: error:")
