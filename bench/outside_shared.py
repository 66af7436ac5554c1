"""Which supersteps of the outside suite's campaigns ran with two processes taking turns on one
CPU, and what it cost: read from the records ``bench/outside_suite.py`` kept, nothing run.

Per program and superstep (every program with a superstep that shared, over every set given):
in how many timed pilot runs and checking runs (at 4x) two of its processes began on one CPU
with their times overlapping (``Superstep.shared_cpus``, the ``shared_cpu`` of ``counterd
report``); where a pilot size has both kinds of run, the median work of those that shared over
the median of those that did not (geometric mean over such sizes); and on how many sets its
forecast at 4x was more than 1.5x off (the set's JSON, as ``--json`` or ``--refit`` wrote it).

    .venv/bin/python bench/outside_shared.py WORK:JSON [WORK:JSON ...]

WORK is a set's ``--work`` directory, JSON its ``--json`` output.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._host import guarded, host_line  # noqa: E402
from predictor.pilot.runs import Timing, load_timings  # noqa: E402

OFF = 1.5  # a forecast this far off, or more, counts as a miss here


def _of(timings: list[Timing], name: str) -> Timing:
    """The superstep ``name`` ("index:name") of one run's timings."""
    [t] = [t for t in timings if f"{t.index}:{t.name}" == name]
    return t


def _set(work: Path, results: Path, table: dict[tuple[str, str], dict[str, list]]) -> int:
    """Add one set's supersteps to ``table``; how many supersteps it forecast at 4x."""
    steps = 0
    for r in json.loads(results.read_text())["results"]:
        if r["label"] != "4x":
            continue
        camp = work / r["program"] / "c1"
        timed: dict[str, list[list[Timing]]] = {}
        for f in sorted(camp.glob("timed-*.jsonl")):
            timed.setdefault(f.name.split("-")[1], []).append(load_timings(f))
        checks = [load_timings(f) for f in sorted(camp.glob("check-[0-9]*.jsonl"))]
        for step in r["steps"]:  # named "index:name"; a superstep without a check is absent
            steps += 1
            row = table.setdefault((r["program"], step["name"]),
                                   {"pilot": [], "check": [], "ratio": [], "e": []})
            mine = [_of(t, step["name"]) for t in checks]
            here = [t.shared_cpu for t in mine]
            for runs in timed.values():
                got = [t for t in (_of(x, step["name"]) for x in runs) if t.work_ns]
                shared = [t.shared_cpu for t in got]
                row["pilot"] += shared
                here += shared
                if any(shared) and not all(shared):
                    row["ratio"].append(math.log(
                        statistics.median(t.work_ns or 0 for t in got if t.shared_cpu)
                        / statistics.median(t.work_ns or 0 for t in got if not t.shared_cpu)))
            row["check"] += [t.shared_cpu for t in mine]
            row["e"].append((step["e"], any(here)))
    return steps


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sets", nargs="+", metavar="WORK:JSON")
    a = ap.parse_args(argv)
    table: dict[tuple[str, str], dict[str, list]] = {}
    steps = 0
    for s in a.sets:
        work, sep, results = s.partition(":")
        if not sep or not Path(work).is_dir() or not Path(results).is_file():
            print(f"outside_shared: {s!r} is not WORK:JSON (a --work directory and its --json "
                  "file)", file=sys.stderr)
            return 2
        steps += _set(Path(work), Path(results), table)
    print(host_line())
    shown = {p for (p, _), row in table.items() if any(row["pilot"]) or any(row["check"])}
    print("| program | superstep | timed pilot runs shared | checking runs shared "
          f"| work shared / not, same size | sets at E > {OFF} |")
    print("| --- | --- | --- | --- | --- | --- |")
    for (p, name), row in sorted(table.items()):
        if p not in shown:
            continue
        ratio = (f"{math.exp(statistics.mean(row['ratio'])):.2f}x ({len(row['ratio'])} sizes)"
                 if row["ratio"] else "-")
        print(f"| {p} | {name} | {sum(row['pilot'])} of {len(row['pilot'])} | "
              f"{sum(row['check'])} of {len(row['check'])} | {ratio} | "
              f"{sum(e > OFF for e, _ in row['e'])} of {len(row['e'])} |")
    off = [here for row in table.values() for e, here in row["e"] if e > OFF]
    print(f"\n{len(off)} of {steps} supersteps forecast more than {OFF}x off at 4x; in "
          f"{sum(off)} of them, runs of that set (pilots or checks) shared a CPU")
    return 0


if __name__ == "__main__":
    sys.exit(guarded(main))
