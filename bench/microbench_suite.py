"""Run the microbench suite on this host (quick and full) and print the figures issue 4 asks
for: wall time, number of patterns, median spread of the timings, flags, and seed 004 Figure 1
as tables (ns per access of memory patterns against BKC and against active processors).

    .venv/bin/python bench/microbench_suite.py                 # quick + full, writes out/
    .venv/bin/python bench/microbench_suite.py --only quick
    .venv/bin/python bench/microbench_suite.py --summarise out/microbench-all.json

Writes out/microbench-quick.json and out/microbench-all.json (overwriting them).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _host import host_line  # noqa: E402

from microbench import results  # noqa: E402
from microbench.catalogue import catalogue  # noqa: E402
from microbench.cli import QUICK_MIN_ACCESSES  # noqa: E402
from microbench.patterns import host_machine  # noqa: E402
from microbench.repetition import NORMAL, QUICK  # noqa: E402
from microbench.suite import run_suite  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "out"


def _progress(done: int, total: int, mnemonic: str, eta: float | None) -> None:
    eta_text = f"{eta:.0f}s left" if eta is not None else ""
    sys.stderr.write(f"\r{done}/{total} {eta_text:12} {mnemonic:32}")
    if done == total:
        sys.stderr.write("\n")


def summarise(doc: dict[str, Any], elapsed: float | None, label: str) -> None:
    pats = doc["patterns"]
    s = results.summary(doc)
    took = elapsed if elapsed is not None else doc.get("duration_s")
    print(f"\n== {label}: suite {doc['suite']}, backend {doc['backend']}, "
          f"{'complete' if s['complete'] else 'INCOMPLETE'}")
    print(f"patterns: {s['patterns']}  wall time: {took:.0f} s  median spread (p90-p10)/median: "
          f"{s['median_spread']:.3f}  (p90 of spreads {s['p90_spread']:.3f})")
    print("flags: " + (", ".join(f"{k} {v}" for k, v in s["flags"].items()) or "none"))
    by_level: dict[str, list[float]] = {}
    for p in pats:
        if p["suite"] == "table1" and p["op"] in ("load", "store"):
            by_level.setdefault(f"{p['level']} {p['op']}", []).append(p["per_access_ns"])
    print("table1 median ns per access by level: " + ", ".join(
        f"{k} {sorted(v)[len(v) // 2]:.2f}" for k, v in sorted(by_level.items())))
    cols_a, tab_a, cols_b, tab_b = results.figure1_tables(doc)
    print("Figure 1(a): ns/access of table1 memory patterns against BKC (median over strides)")
    print("     " + "".join(f"{c:>8}" for c in cols_a))
    for name, row in tab_a.items():
        print(f"{name:5}" + "".join(f"{row[c]:8.2f}" if row[c] is not None else "       -"
                                    for c in cols_a))
    print("Figure 1(b): ns/access against active processors (BKC 1, or nearest)")
    print("     " + "".join(f"{c:>8}" for c in cols_b))
    for name, row in tab_b.items():
        print(f"{name:5}" + "".join(f"{row[c]:8.2f}" if row[c] is not None else "       -"
                                    for c in cols_b))


def run(kind: str) -> None:
    machine = host_machine()
    if kind == "quick":
        pats = catalogue(machine, "table1", min_accesses=QUICK_MIN_ACCESSES)
        out, cfg, suite = OUT / "microbench-quick.json", QUICK, "table1"
    else:
        pats = catalogue(machine, "all")
        out, cfg, suite = OUT / "microbench-all.json", NORMAL, "all"
    OUT.mkdir(exist_ok=True)
    t0 = time.monotonic()
    doc = run_suite(machine, pats, out, suite=suite, cfg=cfg, backend="auto", force=True,
                    quick=kind == "quick", progress=_progress)
    summarise(doc, time.monotonic() - t0, f"{kind} -> {out}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=("quick", "full"))
    ap.add_argument("--summarise", nargs="*", help="print the figures of existing files")
    args = ap.parse_args()
    print(host_line())
    if args.summarise:
        for f in args.summarise:
            summarise(results.load(f), None, f)
        return 0
    for kind in ("quick", "full"):
        if args.only in (None, kind):
            run(kind)
    return 0


if __name__ == "__main__":
    sys.exit(main())
