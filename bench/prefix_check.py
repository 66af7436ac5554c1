"""The prefix sum's checking runs beside ``counterd record``'s own times (issue 33's target).

``bench/prefix_sum.py`` at n = N (default 800000) with P processes (default 2), in one run:

1. ``--repeat`` runs of ``counterd record --backend none --cpu-features native --out F --
   python bench/prefix_sum.py N P`` (the program as it runs without counterd), interleaved
   (the order alternating) with as many under ``--cpu-features as-counted`` (the CPU features
   valgrind lacks, AVX-512, hidden from numpy's and glibc's code dispatch). Both flags are
   spelt out: a plain ``counterd record`` picks its backend (``auto``: Callgrind on a host
   without a PMU, which runs the command a second time under valgrind) and, beside
   Callgrind, ``as-counted``;
2. ``predict --pilot 'python bench/prefix_sum.py {n} P' --sizes 50000,100000,150000,200000
   --target N --check --json``: the forecast and its own checking runs at N (``--pilot-cpu-
   features`` passes ``--cpu-features`` to it; by default it is left out, so predict's
   default is what is measured).

Printed per superstep: the work (the slowest processor's own time, as ``counterd report``
shows it) of the native and the as-counted recordings (median and range), the checking runs'
median work, predict's work forecast, and E = max/min between the checking runs and the
native recordings; the noise floor is E between the medians of the odd and the even native
recordings.

    flock /tmp/bench.lock .venv/bin/python bench/prefix_check.py [--n 800000] [--p 2]
        [--repeat 5] [--sizes 50000,100000,150000,200000] [--pilot-cpu-features native]
        [--backend none] [--no-pilot] [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._host import guarded, host_line  # noqa: E402
from predictor.costs.costfuncs import error_ratio  # noqa: E402
from predictor.pilot.campaign import command_for  # noqa: E402
from predictor.pilot.runs import Timing, load_timings  # noqa: E402

VENV_BIN = Path(sys.executable).parent
MODES = ("native", "as-counted")


def log(msg: str) -> None:
    print(f"prefix_check: {msg}", file=sys.stderr, flush=True)


def record(template: str, n: int, out: Path, features: str, backend: str
           ) -> list[Timing]:
    """One ``counterd record --backend backend --cpu-features features`` run; its supersteps'
    times."""
    cmd = [str(VENV_BIN / "counterd"), "record", "--backend", backend, "--cpu-features",
           features, "--out", str(out), "--", *command_for(template, n)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return load_timings(out)


def _ms(ns: float) -> str:
    return f"{ns / 1e6:7.3f}"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=800000, help="the size (default 800000)")
    ap.add_argument("--p", type=int, default=2, help="processes (default 2)")
    ap.add_argument("--repeat", type=int, default=5,
                    help="recordings per mode, and predict's --repeat (default 5)")
    ap.add_argument("--sizes", default="50000,100000,150000,200000", help="pilot sizes")
    ap.add_argument("--pilot-cpu-features", default=None, choices=MODES,
                    help="give predict --pilot this --cpu-features (default: its own default)")
    ap.add_argument("--backend", default="none",
                    help="counterd record --backend of the recordings (default none: markers "
                    "only, as predict's timed runs)")
    ap.add_argument("--no-pilot", action="store_true", help="the recordings only")
    ap.add_argument("--work", type=Path, default=None, help="keep the records here")
    a = ap.parse_args(argv)
    if a.repeat < 2:
        ap.error("--repeat must be at least 2 (the floor compares halves)")
    template = f"{sys.executable} {ROOT / 'bench' / 'prefix_sum.py'} {{n}} {a.p}"
    with tempfile.TemporaryDirectory(prefix="prefix-check-") as tmp:
        work = a.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        work_ns: dict[str, dict[tuple[int, str], list[float]]] = {m: {} for m in MODES}
        for r in range(a.repeat):  # interleaved, the order alternating: a slow spell of the
            for m in MODES[::-1] if r % 2 else MODES:  # host, or the first run's, falls on both
                log(f"counterd record ({m}) {r + 1}/{a.repeat}")
                for t in record(template, a.n, work / f"record-{m}-{r}.jsonl", m, a.backend):
                    work_ns[m].setdefault(t.key, []).append(float(t.work_ns or 0))
        fc: dict[str, object] = {}
        if not a.no_pilot:
            log("predict --pilot ... --check")
            cmd = [str(VENV_BIN / "predict"), "--pilot", template, "--sizes", a.sizes,
                   "--target", str(a.n), "--repeat", str(a.repeat), "--check", "--json",
                   "--keep", str(work / "pilot")]
            if a.pilot_cpu_features:
                cmd += ["--cpu-features", a.pilot_cpu_features]
            fc = json.loads(subprocess.run(cmd, check=True, capture_output=True,
                                           text=True).stdout)
    print(host_line())
    print(f"bench/prefix_sum.py n = {a.n}, p = {a.p}; {a.repeat} counterd record --backend "
          f"{a.backend} runs per --cpu-features, interleaved"
          + (f"; predict --pilot --sizes {a.sizes} --repeat {a.repeat} --check, cpu features "
             f"{fc.get('cpu_features', 'as-counted (before the option existed)')}"
             if fc else ""))
    print(f"{'superstep':<16} {'record native':>25} {'record as-counted':>25} "
          f"{'check':>7} {'forecast':>8} {'E check':>7} {'floor':>5}   (work, ms: median "
          "[min-max])")
    steps = {(s["index"], s["name"]): s for s in fc.get("supersteps", [])}  # type: ignore[attr-defined]
    for key in work_ns["native"]:
        cells = []
        for m in MODES:
            ws = work_ns[m].get(key, [])
            cells.append(f"{_ms(statistics.median(ws))} [{_ms(min(ws)).strip()}-"
                         f"{_ms(max(ws)).strip()}]" if ws else "-")
        nat = work_ns["native"][key]
        floor = float(error_ratio(statistics.median(nat[0::2]), statistics.median(nat[1::2])))
        s = steps.get(key)
        check = (s.get("measured") or {}).get("work_s") if s else None
        fcast = s.get("predicted_s") if s else None
        e = (f"{float(error_ratio(check * 1e9, statistics.median(nat))):7.2f}"
             if check else f"{'-':>7}")
        print(f"{key[0]} {key[1]:<14} {cells[0]:>25} {cells[1]:>25} "
              f"{_ms(check * 1e9) if check else '-':>7} "
              f"{_ms(fcast * 1e9) if fcast else '-':>8} {e} {floor:5.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(guarded(main))
