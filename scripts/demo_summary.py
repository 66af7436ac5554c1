"""The end of ``make demo``: the pilot forecast against what the checking runs measured, then
two lines a newcomer can judge the tool by.

    python scripts/demo_summary.py REPORT.json PILOT.json

REPORT.json is ``counterd report --format json`` of the recorded example, PILOT.json is
``predict --pilot ... --check --json``. Both are read as those commands write them; a file
that is not one of them is one line on stderr and exit 2.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

E_NOTE = "E = max(T, P) / min(T, P) of the measured time T and the prediction P; 1 is exact"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def _load(path: str, key: str, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SystemExit(f"demo_summary: cannot read {path} ({exc}): give {what}") from None
    if not isinstance(doc, dict) or key not in doc:
        raise SystemExit(f"demo_summary: {path} is not {what}")
    return doc


def pilot_table(pilot: dict[str, Any]) -> list[str]:
    """Per superstep and in total: the work forecast, what the checking runs measured, E."""
    sizes = ", ".join(f"{n:g}" for n in pilot["sizes"])
    lines = [f"pilot forecast of the work at n = {pilot['target']:g} (from pilot runs at "
             f"{sizes}), checked by running it there:",
             f"  {'superstep':12} {'forecast':>10} {'measured':>10} {'E':>6}  in its 90% interval"]
    rows = [(f"{s['index']} {s['name']}", s["check"]["work"]) for s in pilot["supersteps"]
            if s.get("check")]
    rows.append(("total", pilot["total"]["check"]["work"]))
    for name, c in rows:
        lines.append(f"  {name:12} {_ms(c['forecast_s']):>10} {_ms(c['measured_s']):>10} "
                     f"{c['E']:6.2f}  {'yes' if c['inside'] else 'no'}")
    return lines


def summary(report: dict[str, Any], pilot: dict[str, Any]) -> list[str]:
    """Two lines: how well the calibrated F priced the recorded supersteps, and how well the
    pilot forecast held at the target size."""
    steps = report["supersteps"]
    rated = [s for s in steps if s.get("error_ratio") is not None]
    e = report["error_ratio"]
    names = report.get("by_name") or []
    by_name = report.get("name_error_ratio")
    if by_name and by_name.get("repeated"):
        # An iterative run: each name is judged by the median of its occurrences (one
        # occurrence's time varies from one to the next; counterd report says so).
        runs = sorted({n["occurrences"] for n in names})
        each = f"{runs[0]}" if len(runs) == 1 else f"{runs[0]}-{runs[-1]}"
        first = (f"summary: {len({n['name'] for n in names})} of "
                 f"{len({s['name'] for s in steps})} supersteps predicted by the F calibrated "
                 f"on this host, each {each} times in the run: the median of its work over F, "
                 f"average E {by_name['average']:.2f}, worst {by_name['maximum']:.2f} "
                 f"({by_name['maximum_at']}); one occurrence at a time, average "
                 f"{e['average']:.2f}, worst {e['maximum']:.2f}; {E_NOTE}")
    elif rated and e.get("average") is not None:
        worst = steps[e["maximum_at"]]["name"] if e.get("maximum_at") is not None else "?"
        first = (f"summary: {len(rated)} of {len(steps)} supersteps predicted by the F "
                 f"calibrated on this host: average E {e['average']:.2f}, worst "
                 f"{e['maximum']:.2f} ({worst}); {E_NOTE}")
    else:
        first = (f"summary: none of the {len(steps)} supersteps was predicted "
                 f"({report.get('prediction_note', 'no profile')})")
    w = pilot["total"]["check"]["work"]
    second = (f"summary: forecast from small runs, checked at n = {pilot['target']:g}: total "
              f"work {_ms(w['forecast_s'])} forecast, {_ms(w['measured_s'])} measured, E "
              f"{w['E']:.2f} ({'inside' if w['inside'] else 'outside'} its 90% interval)")
    return [first, second]


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: demo_summary.py REPORT.json PILOT.json", file=sys.stderr)
        return 2
    try:
        report = _load(argv[0], "error_ratio", "the JSON of counterd report --format json")
        pilot = _load(argv[1], "total", "the JSON of predict --pilot --check --json")
        if not isinstance(pilot["total"], dict) or "check" not in pilot["total"]:
            raise SystemExit(f"demo_summary: {argv[1]} has no checking runs: run predict "
                             "--pilot with --check")
        lines = pilot_table(pilot) + [""] + summary(report, pilot)
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        return 2
    except (KeyError, TypeError, IndexError) as exc:
        print(f"demo_summary: a field is missing or of the wrong type ({exc!r}): give the "
              "files counterd report and predict --pilot wrote", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
