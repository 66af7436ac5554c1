"""Per-superstep reports (``counterd report``): text, JSON, CSV, and a self-contained HTML page
with inline SVG plots (no scripts, no network).

Per superstep: measured time (max end - min begin over processors, DESIGN.md section 3); per
counter the max and sum over processors and the imbalance max/mean; and, when a machine profile
is configured, the predicted F1 (hierarchy), F2 (bus), F3 (bank), F = max(F1, F2, F3), the BSP
bounds the profile provides, the dominating term and seed 004's error ratio
E = max(T, P) / min(T, P).
"""

from __future__ import annotations

import csv
import datetime
import html
import io
import json
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from counterd.errors import BadInput
from counterd.events import NAMES
from counterd.prediction import BOUNDS, TERM_MEANING, TERMS, PredictFn, Prediction, error_ratio
from counterd.records import INFO_FLAGS, SuperstepRecord
from counterd.daemon.store import RunRow


@dataclass(frozen=True)
class CounterStats:
    max: float
    sum: float
    imbalance: float | None  # max / mean over processors (1 = balanced)
    source: str


@dataclass(frozen=True)
class StepRow:
    index: int
    name: str
    processors: int
    time_ns: int | None
    work_ns: dict[int, int]  # rank -> that processor's own duration
    counters: dict[str, CounterStats]
    flags: frozenset[str]
    prediction: Prediction | None = None

    @property
    def error_ratio(self) -> float | None:
        if self.prediction is None or self.time_ns is None:
            return None
        return error_ratio(self.time_ns / 1e9, self.prediction.total_s)

    @property
    def dominating(self) -> str | None:
        return None if self.prediction is None else self.prediction.dominating

    @property
    def slowest_rank(self) -> int | None:
        return max(self.work_ns, key=lambda r: self.work_ns[r]) if self.work_ns else None

    @property
    def time_imbalance(self) -> float | None:
        vals = list(self.work_ns.values())
        if len(vals) < 2 or sum(vals) <= 0:
            return None
        return max(vals) / (sum(vals) / len(vals))


@dataclass(frozen=True)
class Report:
    source: str
    runs: tuple[str, ...]
    hosts: tuple[str, ...]
    backends: tuple[str, ...]
    rows: tuple[StepRow, ...]
    prediction_note: str
    counters: tuple[str, ...] = field(default=())

    @property
    def predicted(self) -> bool:
        return any(r.prediction is not None for r in self.rows)

    def error_summary(self) -> tuple[float, float] | None:
        errs = [e for r in self.rows if (e := r.error_ratio) is not None]
        return (sum(errs) / len(errs), max(errs)) if errs else None


def records_from_store(path: Path, run: str | None) -> tuple[list[SuperstepRecord], str]:
    from counterd.daemon.store import open_readonly

    store = open_readonly(path)
    try:
        run_id = run or store.latest_run()
        if run_id is None:
            raise BadInput(f"the store {path} holds no runs",
                           "send supersteps to counterd run first, or pass --records FILE")
        records = store.records(run_id)
    finally:
        store.close()
    if not records:
        raise BadInput(f"no run {run_id!r} in {path}", "see counterd runs for the run ids")
    return records, f"{path} run {run_id}"


def build(records: Iterable[SuperstepRecord], *, predict: PredictFn | None = None,
          prediction_note: str = "", source: str = "") -> Report:
    recs = list(records)
    if not recs:
        raise BadInput("no superstep records to report", "record a run first")
    groups: dict[tuple[int, str], list[SuperstepRecord]] = defaultdict(list)
    for r in recs:
        groups[(r.index, r.name)].append(r)
    rows = []
    failures: dict[str, list[int]] = defaultdict(list)
    for (index, name), group in sorted(groups.items()):
        ends = [r.end_ns for r in group]
        complete = all(e is not None for e in ends)
        time_ns = (max(e for e in ends if e is not None) - min(r.begin_ns for r in group)
                   if complete else None)
        per_rank: dict[int, dict[str, float]] = defaultdict(dict)
        sources: dict[str, str] = {}
        work: dict[int, int] = {}
        for r in group:
            if r.duration_ns is not None:
                work[r.rank] = max(work.get(r.rank, 0), r.duration_ns)
            for k, cv in r.counters.items():
                per_rank[r.rank][k] = per_rank[r.rank].get(k, 0.0) + cv.value
                sources[k] = cv.source.value
        counters = {}
        for k in sorted(sources, key=_counter_order):
            vals = [v[k] for v in per_rank.values() if k in v]
            total = sum(vals)
            mean = total / len(vals) if vals else 0.0
            counters[k] = CounterStats(max(vals), total, max(vals) / mean if mean > 0 else None,
                                       sources[k])
        pred = None
        if predict is not None and complete:
            try:
                pred = predict(group)
            except Exception as exc:  # a failing prediction is a missing column, said once
                failures[str(exc)].append(index)
        rows.append(StepRow(index, name, len({r.rank for r in group}), time_ns, work, counters,
                            frozenset().union(*(r.flags for r in group)), pred))
    present = tuple(sorted({k for row in rows for k in row.counters}, key=_counter_order))
    note = prediction_note if predict is None else (
        prediction_note or "predictions from the configured profile")
    for why, steps in failures.items():
        note += f"; no prediction for supersteps {', '.join(map(str, steps))}: {why}"
    return Report(source, tuple(sorted({r.run_id for r in recs})),
                  tuple(sorted({r.host for r in recs if r.host})),
                  tuple(sorted({r.backend for r in recs})), tuple(rows), note, present)


def _counter_order(name: str) -> tuple[int, str]:
    return (NAMES.index(name) if name in NAMES else len(NAMES), name)


def render(report: Report, fmt: str) -> str:
    renderers = {"text": render_text, "json": render_json, "csv": render_csv,
                 "html": render_html}
    if fmt not in renderers:
        raise BadInput(f"unknown report format {fmt!r}", "choose text, json, csv or html")
    return renderers[fmt](report)


# -- text / json / csv ---------------------------------------------------------------------------

def _ms(ns: float | None) -> str:
    return "-" if ns is None else f"{ns / 1e6:.3f}"


def _s_ms(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e3:.3f}"


def _num(v: float | None) -> str:
    if v is None:
        return "-"
    if abs(v) >= 1e6:
        return f"{v:.3e}"
    return f"{v:,.0f}" if float(v).is_integer() or abs(v) >= 100 else f"{v:.3g}"


def render_text(rep: Report) -> str:
    out = [f"counterd report: {rep.source}",
           f"runs {', '.join(rep.runs)}; hosts {', '.join(rep.hosts) or '-'}; "
           f"backends {', '.join(rep.backends)}; {len(rep.rows)} supersteps",
           f"predictions: {rep.prediction_note}" if not rep.predicted else
           f"predictions: {rep.prediction_note}", ""]
    head = (f"{'#':>4} {'superstep':<20} {'p':>3} {'time_ms':>10} {'F_ms':>10} {'E':>6} "
            f"{'dom':>4} {'F1_ms':>9} {'F2_ms':>9} {'F3_ms':>9} {'t_imb':>6}  flags")
    out.append(head)
    for r in rep.rows:
        p = r.prediction
        e = r.error_ratio
        imb = r.time_imbalance
        out.append(
            f"{r.index:>4} {r.name[:20]:<20} {r.processors:>3} {_ms(r.time_ns):>10} "
            f"{_s_ms(p.total_s if p else None):>10} {'-' if e is None else f'{e:.2f}':>6} "
            f"{r.dominating or '-':>4} "
            + " ".join(f"{_s_ms(p.terms_s[t] if p else None):>9}" for t in TERMS)
            + f" {'-' if imb is None else f'{imb:.2f}':>6}  {','.join(sorted(r.flags))}")
    summary = rep.error_summary()
    if summary:
        out.append(f"error ratio E = max(T,P)/min(T,P): average {summary[0]:.2f}, "
                   f"maximum {summary[1]:.2f}")
    if rep.counters:
        out += ["", "per-processor counters: max / sum / imbalance (max/mean)"]
        out.append(f"{'#':>4} {'superstep':<20} {'counter':<16} {'max':>12} {'sum':>12} "
                   f"{'imb':>6} source")
        for r in rep.rows:
            for k, c in r.counters.items():
                out.append(f"{r.index:>4} {r.name[:20]:<20} {k:<16} {_num(c.max):>12} "
                           f"{_num(c.sum):>12} "
                           f"{'-' if c.imbalance is None else f'{c.imbalance:.2f}':>6} "
                           f"{c.source}")
    return "\n".join(out) + "\n"


def to_json(rep: Report) -> dict[str, Any]:
    def row(r: StepRow) -> dict[str, Any]:
        p = r.prediction
        return {
            "index": r.index, "name": r.name, "processors": r.processors,
            "time_ns": r.time_ns, "work_ns": {str(k): v for k, v in sorted(r.work_ns.items())},
            "time_imbalance": r.time_imbalance,
            "counters": {k: {"max": c.max, "sum": c.sum, "imbalance": c.imbalance,
                             "source": c.source} for k, c in r.counters.items()},
            "prediction": None if p is None else {
                "F1_s": p.terms_s["F1"], "F2_s": p.terms_s["F2"], "F3_s": p.terms_s["F3"],
                "F_s": p.total_s, "bounds_s": {b: list(v) for b, v in p.bounds_s.items()},
                "dominating": p.dominating, "profile": p.profile},
            "error_ratio": r.error_ratio,
            "flags": sorted(r.flags),
        }

    summary = rep.error_summary()
    return {"format": 1, "source": rep.source, "runs": list(rep.runs), "hosts": list(rep.hosts),
            "backends": list(rep.backends), "prediction_note": rep.prediction_note,
            "error_ratio": None if summary is None else {"average": summary[0],
                                                         "maximum": summary[1]},
            "supersteps": [row(r) for r in rep.rows]}


def render_json(rep: Report) -> str:
    return json.dumps(to_json(rep), indent=2) + "\n"


def render_csv(rep: Report) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    bounds = [b for b in BOUNDS if any(r.prediction and b in r.prediction.bounds_s
                                       for r in rep.rows)]
    w.writerow(["index", "name", "processors", "time_ns", "F1_s", "F2_s", "F3_s", "F_s",
                *[f"{b}_{m}_s" for b in bounds for m in ("min", "max")], "dominating",
                "error_ratio", "time_imbalance",
                *[f"{c}_{s}" for c in rep.counters for s in ("max", "sum", "imbalance")],
                "flags"])
    for r in rep.rows:
        p = r.prediction
        w.writerow([
            r.index, r.name, r.processors, "" if r.time_ns is None else r.time_ns,
            *(["" if p is None else repr(p.terms_s[t]) for t in TERMS]),
            "" if p is None else repr(p.total_s),
            *[("" if p is None or b not in p.bounds_s else repr(p.bounds_s[b][i]))
              for b in bounds for i in (0, 1)],
            r.dominating or "", "" if r.error_ratio is None else repr(r.error_ratio),
            "" if r.time_imbalance is None else repr(r.time_imbalance),
            *[v for c in rep.counters for v in (
                (repr(r.counters[c].max), repr(r.counters[c].sum),
                 "" if r.counters[c].imbalance is None else repr(r.counters[c].imbalance))
                if c in r.counters else ("", "", ""))],
            ";".join(sorted(r.flags))])
    return buf.getvalue()


def render_runs(rows: Sequence[RunRow]) -> str:
    from counterd.daemon.sampling import user_name

    if not rows:
        return "no runs in the store"
    out = [f"{'run':<24} {'job':<20} {'user':<10} {'first seen (UTC)':<19} {'records':>8} "
           f"{'supersteps':>10} {'incomplete':>10}"]
    for r in rows:
        first = datetime.datetime.fromtimestamp(r.first_seen_ns / 1e9, datetime.UTC)
        out.append(f"{r.run_id[:24]:<24} {r.job[:20]:<20} {user_name(r.uid)[:10]:<10} "
                   f"{first:%Y-%m-%d %H:%M:%S} {r.records:>8} {r.supersteps:>10} "
                   f"{r.incomplete:>10}")
    return "\n".join(out)


# -- HTML with inline SVG ------------------------------------------------------------------------

TERM_COLOURS = {"F1": "#4e79a7", "F2": "#f28e2b", "F3": "#59a14f"}
MEASURED = "#4e79a7"
PREDICTED = "#e15759"
_FONT = "font-family:system-ui,-apple-system,'Segoe UI',Roboto,'DejaVu Sans',sans-serif"
W, LEFT, RIGHT = 1080, 78, 20


def _esc(s: object) -> str:
    return html.escape(str(s), quote=True)


def _nice_step(v: float) -> float:
    """A tick step from {1, 2, 2.5, 5} x 10^k giving at most 5 intervals up to ``v``."""
    if v <= 0:
        return 0.25
    raw = v / 5
    exp = 10 ** math.floor(math.log10(raw))
    return next(m * exp for m in (1, 2, 2.5, 5, 10) if m * exp >= raw)


def _nice_max(v: float) -> float:
    step = _nice_step(v)
    return max(step, math.ceil(v / step - 1e-9) * step)


def _time_unit(max_s: float) -> tuple[str, float]:
    if max_s >= 1:
        return "s", 1.0
    if max_s >= 1e-3:
        return "ms", 1e3
    return "µs", 1e6


def _label_room(rows: Sequence[StepRow]) -> float:
    """Vertical room the rotated x labels need below the axis."""
    longest = max((len(f"{r.index}" if len(rows) > 12 else f"{r.index} {r.name[:14]}")
                   for r in rows), default=1)
    return 22 + 4.2 * longest


def _x_labels(rows: Sequence[StepRow], x0: float, step: float, y: float) -> list[str]:
    n = len(rows)
    every = max(1, math.ceil(n / 24))
    out = []
    for i, r in enumerate(rows):
        if i % every:
            continue
        label = f"{r.index}" if n > 12 else f"{r.index} {r.name[:14]}"
        cx = x0 + (i + 0.5) * step
        out.append(f'<text x="{cx:.1f}" y="{y:.1f}" font-size="11" text-anchor="end" '
                   f'transform="rotate(-35 {cx:.1f} {y:.1f})" fill="#444">{_esc(label)}</text>')
    return out


def _axis(top: float, height: float, vmax: float, unit: str, scale: float) -> list[str]:
    out = []
    step = _nice_step(vmax)
    ticks = round(vmax / step)
    for k in range(ticks + 1):
        v = step * k
        y = top + height - height * v / vmax
        out.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" '
                   f'stroke="#e3e3e3"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end" '
                   f'fill="#555">{v * scale:.4g}</text>')
    out.append(f'<text x="14" y="{top + height / 2:.1f}" font-size="12" fill="#333" '
               f'transform="rotate(-90 14 {top + height / 2:.1f})" text-anchor="middle">'
               f'{_esc(unit)}</text>')
    return out


def _svg(height: float, body: list[str], title: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {height:.0f}" '
            f'width="100%" role="img" aria-label="{_esc(title)}" style="{_FONT}">'
            + "".join(body) + "</svg>")


def _legend(items: Sequence[tuple[str, str, str]], x: float, y: float) -> list[str]:
    out = []
    for label, colour, style in items:
        if style == "line":
            out.append(f'<line x1="{x}" x2="{x + 18}" y1="{y - 4}" y2="{y - 4}" '
                       f'stroke="{colour}" stroke-width="3"/>'
                       f'<circle cx="{x + 9}" cy="{y - 4}" r="4" fill="{colour}"/>')
        else:
            out.append(f'<rect x="{x}" y="{y - 11}" width="18" height="12" rx="2" '
                       f'fill="{colour}" {style}/>')
        out.append(f'<text x="{x + 24}" y="{y}" font-size="12" fill="#333">{_esc(label)}</text>')
        x += 34 + 7.2 * len(label)
    return out


def plot_measured_vs_predicted(rep: Report) -> str:
    rows = rep.rows
    top, height = 34, 240
    vals = [r.time_ns / 1e9 for r in rows if r.time_ns is not None]
    vals += [r.prediction.total_s for r in rows if r.prediction is not None]
    vmax = _nice_max(max(vals, default=0.0))
    unit, scale = _time_unit(vmax)
    body = _axis(top, height, vmax, f"time ({unit})", scale)
    step = (W - LEFT - RIGHT) / max(1, len(rows))
    bw = max(1.0, min(46.0, step * 0.7))
    pts = []
    for i, r in enumerate(rows):
        cx = LEFT + (i + 0.5) * step
        if r.time_ns is not None:
            h = height * (r.time_ns / 1e9) / vmax
            tip = f"superstep {r.index} {r.name}: measured {r.time_ns / 1e6:.3f} ms"
            if r.prediction is not None:
                tip += f", predicted {r.prediction.total_s * 1e3:.3f} ms"
                if r.error_ratio is not None:
                    tip += f" (E = {r.error_ratio:.2f})"
            body.append(f'<rect x="{cx - bw / 2:.1f}" y="{top + height - h:.1f}" '
                        f'width="{bw:.1f}" height="{max(h, 0.5):.1f}" fill="{MEASURED}" '
                        f'rx="1.5"><title>{_esc(tip)}</title></rect>')
        else:
            body.append(f'<text x="{cx:.1f}" y="{top + height - 4:.1f}" font-size="10" '
                        f'text-anchor="middle" fill="#b00">incomplete</text>')
        if r.prediction is not None:
            pts.append((cx, top + height - height * r.prediction.total_s / vmax))
    if pts:
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
        body.append(f'<polyline points="{path}" fill="none" stroke="{PREDICTED}" '
                    f'stroke-width="2.5" stroke-linejoin="round"/>')
        body += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4.5" fill="{PREDICTED}" '
                 f'stroke="white" stroke-width="1.5"/>' for x, y in pts]
    body += _x_labels(rows, LEFT, step, top + height + 16)
    legend = [("measured (max end - min begin)", MEASURED, "")]
    if pts:
        legend.append(("predicted F = max(F1, F2, F3)", PREDICTED, "line"))
    body += _legend(legend, LEFT, 20)
    return _svg(top + height + _label_room(rows), body,
                "measured versus predicted time per superstep")


def _heat_colour(ratio: float) -> str:
    """White at 1 (balanced), to red for slower than the mean, to blue for faster."""
    t = max(-1.0, min(1.0, math.log2(ratio) if ratio > 0 else -1.0))
    if t >= 0:
        g = int(255 - 190 * t)
        return f"rgb(255,{g},{int(255 - 205 * t)})"
    t = -t
    return f"rgb({int(255 - 180 * t)},{int(255 - 120 * t)},255)"


def plot_imbalance(rep: Report) -> str:
    rows = rep.rows
    ranks = sorted({k for r in rows for k in r.work_ns})
    if not ranks:
        return "<p class=note>no processor finished a superstep: nothing to show.</p>"
    top = 34
    cell_h = max(8.0, min(26.0, 300 / len(ranks)))
    height = cell_h * len(ranks)
    step = (W - LEFT - RIGHT) / max(1, len(rows))
    body = []
    for j, rank in enumerate(ranks):
        y = top + j * cell_h
        if len(ranks) <= 40 or j % math.ceil(len(ranks) / 40) == 0:
            body.append(f'<text x="{LEFT - 6}" y="{y + cell_h / 2 + 4:.1f}" font-size="11" '
                        f'text-anchor="end" fill="#555">p{rank}</text>')
    for i, r in enumerate(rows):
        mean = sum(r.work_ns.values()) / len(r.work_ns) if r.work_ns else 0
        for j, rank in enumerate(ranks):
            x = LEFT + i * step
            y = top + j * cell_h
            w = r.work_ns.get(rank)
            if w is None or mean <= 0:
                body.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{step:.1f}" '
                            f'height="{cell_h:.1f}" fill="#f2f2f2"/>')
                continue
            ratio = w / mean
            tip = f"superstep {r.index} {r.name}, p{rank}: {w / 1e6:.3f} ms, {ratio:.2f}x the mean"
            body.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{step:.1f}" height="{cell_h:.1f}" '
                        f'fill="{_heat_colour(ratio)}" stroke="white" stroke-width="0.6">'
                        f'<title>{_esc(tip)}</title></rect>')
    body += _x_labels(rows, LEFT, step, top + height + 16)
    # colour scale
    sx, sy = W - RIGHT - 260, 12
    for k in range(41):
        ratio = 2 ** ((k - 20) / 20)
        body.append(f'<rect x="{sx + k * 5}" y="{sy}" width="5" height="10" '
                    f'fill="{_heat_colour(ratio)}"/>')
    body += [f'<text x="{sx - 6}" y="{sy + 9}" font-size="11" text-anchor="end" fill="#555">'
             f'0.5x</text>',
             f'<text x="{sx + 102}" y="{sy + 22}" font-size="10" text-anchor="middle" '
             f'fill="#555">mean</text>',
             f'<text x="{sx + 211}" y="{sy + 9}" font-size="11" fill="#555">2x</text>',
             f'<text x="{LEFT}" y="20" font-size="12" fill="#333">each processor\'s own time '
             f'in the superstep, relative to the mean over processors</text>']
    return _svg(top + height + _label_room(rows), body, "per-processor imbalance")


def plot_bottleneck(rep: Report) -> str:
    rows = rep.rows
    top, height = 34, 200
    step = (W - LEFT - RIGHT) / max(1, len(rows))
    body: list[str] = []
    if not rep.predicted:
        body.append(f'<text x="{W / 2}" y="{top + 40}" font-size="14" text-anchor="middle" '
                    f'fill="#777">no prediction: {_esc(rep.prediction_note)}</text>')
        body.append(f'<text x="{W / 2}" y="{top + 64}" font-size="12" text-anchor="middle" '
                    f'fill="#999">configure a machine profile (predictor.profile, --profile) '
                    f'to see which term dominates each superstep</text>')
        return _svg(top + 90, body, "bottleneck per superstep")
    vmax = _nice_max(max((max(r.prediction.terms_s.values()) for r in rows
                          if r.prediction is not None), default=0.0))
    unit, scale = _time_unit(vmax)
    body += _axis(top, height, vmax, f"predicted term ({unit})", scale)
    bw = max(1.0, min(16.0, step * 0.8 / 3))
    for i, r in enumerate(rows):
        p = r.prediction
        cx = LEFT + (i + 0.5) * step
        if p is None:
            continue
        dom = p.dominating
        for k, term in enumerate(TERMS):
            v = p.terms_s[term]
            h = height * v / vmax
            x = cx + (k - 1.5) * bw
            opacity = "1" if term == dom else "0.28"
            tip = f"superstep {r.index}: {term} ({TERM_MEANING[term]}) {v * 1e3:.3f} ms"
            body.append(f'<rect x="{x:.1f}" y="{top + height - h:.1f}" width="{bw:.1f}" '
                        f'height="{max(h, 0.5):.1f}" fill="{TERM_COLOURS[term]}" '
                        f'fill-opacity="{opacity}"><title>{_esc(tip)}</title></rect>')
        body.append(f'<rect x="{cx - 1.5 * bw:.1f}" y="{top + height + 3}" width="{3 * bw:.1f}" '
                    f'height="6" fill="{TERM_COLOURS[dom]}"/>')
    body += _x_labels(rows, LEFT, step, top + height + 24)
    body += _legend([(f"{t} {TERM_MEANING[t]}", TERM_COLOURS[t], "") for t in TERMS]
                    + [("faded: not dominating", "#999", 'fill-opacity="0.28"')], LEFT, 20)
    return _svg(top + height + 8 + _label_room(rows), body, "bottleneck per superstep")


_CSS = """
body{margin:0;background:#f6f7f9;color:#222;FONT}
main{max-width:1120px;margin:0 auto;padding:24px 20px 40px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:16px;margin:0 0 8px}
.sub{color:#666;font-size:13px;margin-bottom:18px}
.cards{display:flex;gap:12px;flex-wrap:wrap;margin-bottom:18px}
.card{background:#fff;border:1px solid #e2e4e8;border-radius:8px;padding:10px 16px;min-width:130px}
.card b{display:block;font-size:20px} .card span{color:#666;font-size:12px}
section{background:#fff;border:1px solid #e2e4e8;border-radius:8px;padding:14px 16px;
margin-bottom:16px}
.note{color:#666;font-size:12px;margin:6px 0 0}
table{border-collapse:collapse;width:100%;font-size:12px}
th,td{padding:4px 8px;border-bottom:1px solid #eee;text-align:right;white-space:nowrap}
th{background:#fafafa;position:sticky;top:0} td.l,th.l{text-align:left}
.dom{display:inline-block;padding:1px 7px;border-radius:9px;color:#fff;font-size:11px}
.flag{color:#b35c00}
""".replace("FONT", _FONT)


def render_html(rep: Report) -> str:
    rows = rep.rows
    times = [r.time_ns for r in rows if r.time_ns is not None]
    total = sum(times) / 1e9 if times else None
    summary = rep.error_summary()
    incomplete = sum(1 for r in rows if r.time_ns is None)
    doms = [r.dominating for r in rows if r.dominating]
    cards = [(f"{len(rows)}", "supersteps"),
             (f"{max((r.processors for r in rows), default=0)}", "processors"),
             ("-" if total is None else f"{total * 1e3:.2f} ms", "measured total"),
             ("-" if summary is None else f"{summary[0]:.2f} / {summary[1]:.2f}",
              "error ratio avg / max"),
             (max(set(doms), key=doms.count) if doms else "-", "most frequent bottleneck"),
             (f"{incomplete}", "incomplete supersteps")]
    pred_cols = ["F ms", "E", "dominating", "F1 ms", "F2 ms", "F3 ms"] if rep.predicted else []
    head = ["#", "superstep", "p", "time ms", *pred_cols, "time imb."] + [
        f"{c} max" for c in rep.counters] + ["flags"]
    trs = []
    for r in rows:
        p = r.prediction
        dom = (f'<span class="dom" style="background:{TERM_COLOURS[r.dominating]}">'
               f'{r.dominating} {TERM_MEANING[r.dominating]}</span>' if r.dominating else "-")
        flags = sorted(r.flags - INFO_FLAGS)
        pred_cells = [_s_ms(p.total_s if p else None),
                      "-" if r.error_ratio is None else f"{r.error_ratio:.2f}", dom,
                      *[_s_ms(p.terms_s[t] if p else None) for t in TERMS]]
        cells = [str(r.index), f'<td class="l">{_esc(r.name)}', str(r.processors),
                 _ms(r.time_ns), *(pred_cells if rep.predicted else []),
                 "-" if r.time_imbalance is None else f"{r.time_imbalance:.2f}",
                 *[(_num(r.counters[c].max) + (
                     f' <small>({r.counters[c].imbalance:.2f}x)</small>'
                     if r.counters[c].imbalance else "")) if c in r.counters else "-"
                   for c in rep.counters],
                 f'<td class="l flag">{_esc(", ".join(flags))}']
        trs.append("<tr>" + "".join(c if c.startswith("<td") else f"<td>{c}</td>"
                                    for c in cells) + "</tr>")
    ths = "".join(f'<th class="{"l" if h in ("superstep", "flags") else ""}">{_esc(h)}</th>'
                  for h in head)
    sources = sorted({f"{k}: {c.source}" for r in rows for k, c in r.counters.items()})
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>counterd report: {_esc(", ".join(rep.runs))}</title>
<style>{_CSS}</style></head>
<body><main>
<h1>Superstep report</h1>
<div class="sub">{_esc(rep.source)} &middot; runs {_esc(", ".join(rep.runs))} &middot; hosts
{_esc(", ".join(rep.hosts) or "-")} &middot; backends {_esc(", ".join(rep.backends))}</div>
<div class="cards">{"".join(f"<div class=card><b>{_esc(v)}</b><span>{_esc(k)}</span></div>"
                            for v, k in cards)}</div>
<section><h2>{"Measured and predicted time" if rep.predicted else "Measured time"} per
superstep</h2>
{plot_measured_vs_predicted(rep)}
<p class="note">Measured time is the superstep's span over all processors (max end minus min
begin). {_esc("Predictions: " + rep.prediction_note)}.</p></section>
<section><h2>Per-processor imbalance</h2>
{plot_imbalance(rep)}
<p class="note">Red cells are processors slower than the superstep's mean; the others wait for
them at the barrier.</p></section>
<section><h2>Bottleneck per superstep</h2>
{plot_bottleneck(rep)}
<p class="note">F1: memory hierarchy (per-level misses and writebacks of the busiest processor);
F2: the bus shared by all processors; F3: the busiest memory bank (seed 004). The full-colour
bar is the term that sets F = max(F1, F2, F3).</p></section>
<section><h2>Supersteps</h2><div style="overflow-x:auto"><table><thead><tr>{ths}</tr></thead>
<tbody>{"".join(trs)}</tbody></table></div>
<p class="note">Counter columns: max over processors, with the imbalance max/mean in brackets.
Sources: {_esc("; ".join(sources) or "no counters")}.</p></section>
</main></body></html>
"""
