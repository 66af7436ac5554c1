"""The demo's own report, repeated: what `make demo` says about its supersteps, run after run.

Each round runs `make demo OUT=DIR` (the Makefile's demo target, the very commands a newcomer
runs, install excluded: the venv must exist) into a directory of its own, and reads what it
wrote: the report's JSON (``example.json``) and the pilot forecast's (``pilot.json``). It prints
per round every superstep's work, F and E, the report's average and maximum E, the forecast's
E at the target, and how long the round took. Where the example runs its supersteps several
times (the Makefile's ``DEMO_ITERATIONS``), E is the report's per name: the median work of a
name's occurrences against its median F (one at a time beside it). ``--calibrate once`` runs
the whole demo in the first round only, and in the others records and reports the example
again with that profile: the example's spread alone.

    python bench/demo_report.py [--rounds 3] [--calibrate each|once] [--keep DIR]

Issue targets (Superstep time; First impression): every superstep predicted, average E <= 1.3,
maximum <= 2, within 60 s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _host import guarded, host_line  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def _run(*cmd: str) -> str:
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-500:]}")
    return proc.stdout


def _makefile_var(name: str) -> str:
    """The value of ``name := value`` in the Makefile (the demo's own settings)."""
    for line in (ROOT / "Makefile").read_text().splitlines():
        key, sep, value = line.partition(":=")
        if sep and key.strip() == name:
            return value.strip()
    raise SystemExit(f"the Makefile sets no {name}")


def round_(out: Path, calibrate: bool) -> tuple[dict[str, Any], dict[str, Any] | None, float]:
    """(report JSON, pilot JSON or None, seconds) of one round into ``out``."""
    t0 = time.monotonic()
    if calibrate:
        _run("make", "-s", "demo", f"OUT={out}")
        pilot = json.loads((out / "pilot.json").read_text())
    else:  # the demo's record and report commands, with the first round's profile
        _run(str(BIN / "counterd"), "record", "--backend", "sim", "--out",
             str(out / "example.jsonl"), "--", sys.executable, "examples/bsp_sum.py",
             "4000000", "0", _makefile_var("DEMO_ITERATIONS"))
        _run(str(BIN / "counterd"), "report", "--records", str(out / "example.jsonl"),
             "--profile", str(out / "node.toml"), "--format", "json", "--out",
             str(out / "example.json"))
        pilot = None
    return json.loads((out / "example.json").read_text()), pilot, time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calibrate", choices=("each", "once"), default="each")
    ap.add_argument("--keep", type=Path, help="keep each round's files in this directory")
    a = ap.parse_args()
    if a.rounds < 1:
        ap.error("--rounds must be 1 or more")
    print(host_line())
    print(f"load average {os.getloadavg()[0]:.2f}; calibration: {a.calibrate}")
    averages, maxima = [], []
    with tempfile.TemporaryDirectory(prefix="demo-report-") as tmp_dir:
        tmp = a.keep or Path(tmp_dir)
        for r in range(a.rounds):
            out = Path(tmp) / ("r0" if a.calibrate == "once" else f"r{r}")
            out.mkdir(parents=True, exist_ok=True)
            rep, pilot, took = round_(out, a.calibrate == "each" or r == 0)
            steps = rep["supersteps"]
            er, by_name = rep["error_ratio"], rep.get("name_error_ratio") or {}
            rows = []
            if by_name.get("repeated"):  # each name: median work / median F over its runs
                for n in rep["by_name"]:
                    e = "-" if n["error_ratio"] is None else f"{n['error_ratio']:.2f}"
                    rows.append(f"{n['name']} x{n['occurrences']} {n['work_s'] * 1e3:.2f}/"
                                f"{n['F_s'] * 1e3:.2f} ms E {e}")
                judged = (by_name["average"], by_name["maximum"])
                each = f" (one at a time {er['average']:.2f} / {er['maximum']:.2f})"
            else:
                for s in steps:
                    pred = s["prediction"]
                    f = "-" if pred is None else f"{pred['F_s'] * 1e3:.2f}"
                    e = "-" if s["error_ratio"] is None else f"{s['error_ratio']:.2f}"
                    rows.append(f"{s['name']} {s['slowest_work_s'] * 1e3:.2f}/{f} ms E {e}")
                judged, each = (er["average"], er["maximum"]), ""
            unpredicted = sum(s["prediction"] is None for s in steps)
            averages.append(judged[0])
            maxima.append(judged[1])
            fc = "" if pilot is None else \
                f"  forecast E {pilot['total']['check']['work']['E']:.2f}"
            print(f"round {r + 1}: {took:5.1f} s  avg E {judged[0]:.2f} max "
                  f"{judged[1]:.2f}{each}  unpredicted {unpredicted}{fc}  | "
                  + "; ".join(rows))
    print(f"over {a.rounds} rounds: average E median {statistics.median(averages):.2f} "
          f"(range {min(averages):.2f}-{max(averages):.2f}), maximum E median "
          f"{statistics.median(maxima):.2f} (range {min(maxima):.2f}-{max(maxima):.2f}); "
          f"rounds with avg <= 1.3 and max <= 2: "
          f"{sum(x <= 1.3 and y <= 2 for x, y in zip(averages, maxima, strict=True))}")
    return 0


if __name__ == "__main__":
    sys.exit(guarded(main))
