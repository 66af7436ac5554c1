"""Text, JSON and CSV renderings of a report, and the table of runs (``counterd runs``)."""

from __future__ import annotations

import csv
import datetime
import io
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from counterd.data.units import NS_PER_S, count, counter_text, seconds, si_name, si_value
from counterd.prediction import BOUNDS, TERMS
from counterd.report.model import REPORT_FLAGS, START_SKEW, Report, StepRow, flags_legend

if TYPE_CHECKING:
    from counterd.daemon.store import RunRow


def _time(v_s: float | None) -> str:
    return "-" if v_s is None else seconds(v_s)


def _ratio(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _ns(v_ns: int | None) -> str:
    return _time(None if v_ns is None else v_ns / NS_PER_S)


def _s(v_ns: int | None) -> float | None:
    """Nanoseconds in seconds (JSON), None kept."""
    return None if v_ns is None else v_ns / NS_PER_S


def _csv_s(v_ns: int | None) -> str:
    return "" if v_ns is None else repr(v_ns / NS_PER_S)


def _marker_share(rep: Report, r: StepRow) -> str:
    share = r.marker_share
    return "-" if share is None else f"{share:.1%}" + (" !" if rep.markers_over(r) else "  ")


def _flags(r: StepRow, verbose: bool) -> str:
    """A row's flags, the flag exception followed by what was raised (short)."""
    flags = r.shown_flags(verbose)
    note = r.exception_note()
    if note and "exception" in flags:
        flags[flags.index("exception")] = f"exception ({note})"
    return ",".join(flags)


def render_text(rep: Report, *, verbose: bool = False) -> str:
    """The report as text; a row's flags are those that change what to believe about it (all
    of them with ``verbose``), explained below the table."""
    out = [f"counterd report: {rep.source}",
           f"runs {', '.join(rep.runs)}; hosts {', '.join(rep.hosts) or '-'}; "
           f"backends {', '.join(rep.backends)}; {len(rep.rows)} supersteps",
           f"predictions: {rep.prediction_note}" if not rep.predicted else
           f"predictions: {rep.prediction_note}", ""]
    # markers: the marker pair's share of the superstep's time, "!" over Report.MARKER_WARN
    shares = rep.marker_shares
    head = (f"{'#':>4} {'superstep':<20} {'p':>3} {'work':>9} {'span':>9} {'skew':>9} "
            f"{'F':>9} {'E':>6} "
            f"{'dom':>4} {'F1':>9} {'F2':>9} {'F3':>9} {'t_imb':>6}"
            + (f" {'markers':>8}" if shares else "") + "  flags")
    out.append(head)
    for r in rep.rows:
        p = r.prediction
        out.append(
            f"{r.index:>4} {r.name[:20]:<20} {r.processors:>3} "
            f"{_ns(r.slowest_work_ns):>9} {_ns(r.time_ns):>9} {_ns(r.skew_ns):>9} "
            f"{_time(p.total_s if p else None):>9} {_ratio(r.error_ratio):>6} "
            f"{r.dominating or '-':>4} "
            + " ".join(f"{_time(p.terms_s[t] if p else None):>9}" for t in TERMS)
            + f" {_ratio(r.time_imbalance):>6}"
            + (f" {_marker_share(rep, r):>8}" if shares else "")
            + f"  {_flags(r, verbose)}")
    legend, hidden = flags_legend(rep.rows, verbose)
    if legend:
        out.append("flags:")
        out += [f"  {flag}: {meaning}" for flag, meaning in legend]
    if hidden:
        out.append("not shown, as they say where the numbers come from (--verbose shows and "
                   "explains them): " + ", ".join(hidden))
    if note := rep.error_note():
        out.append(note)
    if rep.repeated:
        out += ["", "per superstep name: its predicted, complete occurrences (n), their median "
                    "work (least - most) and median F; E from the median of work / F"]
        out.append(f"{'first':>5} {'superstep':<20} {'p':>3} {'n':>4} {'work':>9} {'least':>9} "
                   f"{'most':>9} {'F':>9} {'work/F':>7} {'E':>6}")
        for n in rep.by_name:
            out.append(f"{n.first_index:>5} {n.name[:20]:<20} {n.processors:>3} "
                       f"{n.occurrences:>4} {_time(n.work_ns / NS_PER_S):>9} "
                       f"{_ns(n.low_ns):>9} {_ns(n.high_ns):>9} {_time(n.predicted_s):>9} "
                       f"{n.ratio:>7.2f} {_ratio(n.error_ratio):>6}")
        if note := rep.name_error_note():
            out.append(note)
    out.append("times: " + rep.TIMES)
    out += [note for flag in REPORT_FLAGS if (note := rep.flag_note(flag))]
    if note := rep.marker_note():
        out.append(note)
    if rep.counters:
        out += ["", "per-processor counters: max / sum / imbalance (max/mean)"]
        out.append(f"{'#':>4} {'superstep':<20} {'counter':<16} {'max':>12} {'sum':>12} "
                   f"{'imb':>6} source")
        for r in rep.rows:
            for k, c in r.counters.items():
                out.append(f"{r.index:>4} {r.name[:20]:<20} {k:<16} "
                           f"{counter_text(k, c.max):>12} {counter_text(k, c.sum):>12} "
                           f"{_ratio(c.imbalance):>6} {c.source}")
    return "\n".join(out) + "\n"


def to_json(rep: Report) -> dict[str, Any]:
    def row(r: StepRow) -> dict[str, Any]:
        p = r.prediction
        return {
            "index": r.index, "name": r.name, "processors": r.processors,
            "slowest_work_s": _s(r.slowest_work_ns), "span_s": _s(r.time_ns),
            "skew_s": _s(r.skew_ns),
            "work_s": {str(k): v / NS_PER_S for k, v in sorted(r.work_ns.items())},
            "time_imbalance": r.time_imbalance,
            "counters": {si_name(k): {"max": si_value(k, c.max), "sum": si_value(k, c.sum),
                                      "imbalance": c.imbalance, "source": c.source}
                         for k, c in r.counters.items()},
            "prediction": None if p is None else {
                "F1_s": p.terms_s["F1"], "F2_s": p.terms_s["F2"], "F3_s": p.terms_s["F3"],
                "F_s": p.total_s, "bounds_s": {b: list(v) for b, v in p.bounds_s.items()},
                "dominating": p.dominating, "profile": p.profile, "model": p.model,
                "accuracy": dict(p.accuracy)},
            "error_ratio": r.error_ratio,
            "flags": sorted(r.all_flags),
            # rank -> what its body raised (the flag exception), where the records kept it
            "exceptions": {str(k): v for k, v in sorted(r.exceptions.items())},
            "marker_s": None if r.marker_ns is None else r.marker_ns / NS_PER_S,
            "marker_share": r.marker_share,
        }

    summary, rated, worst = rep.error_summary(), rep.error_summary(rated=True), rep.worst_error()
    name_summary = rep.name_error_summary()
    # format 2: time_s became span_s beside slowest_work_s and skew_s; E is against the work.
    return {"format": 2, "source": rep.source, "runs": list(rep.runs), "hosts": list(rep.hosts),
            "backends": list(rep.backends), "prediction_note": rep.prediction_note,
            "times_note": rep.TIMES, "skew_note": rep.flag_note(START_SKEW),
            "flag_notes": {f: note for f in REPORT_FLAGS if (note := rep.flag_note(f))},
            "marker_note": rep.marker_note(),
            "error_ratio": None if summary is None or worst is None else {
                "average": summary[0], "maximum": summary[1], "maximum_at": worst.index,
                # over the supersteps not too short to rate (Report.is_short)
                "rated": None if rated is None else {"average": rated[0], "maximum": rated[1],
                                                     "short_s": rep.short_ns / NS_PER_S}},
            "error_note": rep.error_note(),
            "supersteps": [row(r) for r in rep.rows],
            # each name over its predicted occurrences: median work against median F
            "by_name": [{"name": n.name, "processors": n.processors,
                         "first_index": n.first_index,
                         "occurrences": n.occurrences, "work_s": n.work_ns / NS_PER_S,
                         "least_work_s": n.low_ns / NS_PER_S,
                         "most_work_s": n.high_ns / NS_PER_S, "F_s": n.predicted_s,
                         "work_over_F": n.ratio, "error_ratio": n.error_ratio}
                        for n in rep.by_name],
            "name_error_ratio": None if name_summary is None else {
                "average": name_summary[0], "maximum": name_summary[1],
                "maximum_at": name_summary[2].name, "repeated": rep.repeated}}


def render_json(rep: Report) -> str:
    return json.dumps(to_json(rep), indent=2) + "\n"


def render_csv(rep: Report) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    bounds = [b for b in BOUNDS if any(r.prediction and b in r.prediction.bounds_s
                                       for r in rep.rows)]
    w.writerow(["index", "name", "processors", "slowest_work_s", "span_s", "skew_s",
                "F1_s", "F2_s", "F3_s", "F_s",
                *[f"{b}_{m}_s" for b in bounds for m in ("min", "max")], "dominating",
                "error_ratio", "time_imbalance",
                *[f"{si_name(c)}_{s}" for c in rep.counters for s in ("max", "sum", "imbalance")],
                "flags", "marker_s", "exceptions"])
    for r in rep.rows:
        p = r.prediction
        w.writerow([
            r.index, r.name, r.processors, _csv_s(r.slowest_work_ns), _csv_s(r.time_ns),
            _csv_s(r.skew_ns),
            *(["" if p is None else repr(p.terms_s[t]) for t in TERMS]),
            "" if p is None else repr(p.total_s),
            *[("" if p is None or b not in p.bounds_s else repr(p.bounds_s[b][i]))
              for b in bounds for i in (0, 1)],
            r.dominating or "", "" if r.error_ratio is None else repr(r.error_ratio),
            "" if r.time_imbalance is None else repr(r.time_imbalance),
            *[v for c in rep.counters for v in (
                (repr(si_value(c, r.counters[c].max)), repr(si_value(c, r.counters[c].sum)),
                 "" if r.counters[c].imbalance is None else repr(r.counters[c].imbalance))
                if c in r.counters else ("", "", ""))],
            ";".join(sorted(r.all_flags)),
            "" if r.marker_ns is None else repr(r.marker_ns / NS_PER_S),
            # rank -> what it raised, as a JSON object (the texts are one line each)
            json.dumps({str(k): v for k, v in sorted(r.exceptions.items())})
            if r.exceptions else ""])
    return buf.getvalue()


def render_runs(rows: Sequence[RunRow], source: str = "the store") -> str:
    """The runs as a table; ``source`` names what listed them (empty: "no runs in <it>")."""
    from counterd.daemon.sampling import user_name

    if not rows:
        return f"no runs in {source}"
    out = [f"{'run':<24} {'job':<20} {'user':<10} {'first seen (UTC)':<19} {'records':>8} "
           f"{'supersteps':>10} {'incomplete':>10}"]
    for r in rows:
        first = datetime.datetime.fromtimestamp(r.first_seen_ns / NS_PER_S, datetime.UTC)
        out.append(f"{r.run_id[:24]:<24} {r.job[:20]:<20} {user_name(r.uid)[:10]:<10} "
                   f"{first:%Y-%m-%d %H:%M:%S} {count(r.records):>8} "
                   f"{count(r.supersteps):>10} {count(r.incomplete):>10}")
    return "\n".join(out)
