"""Inline SVG plots for the HTML report (no scripts, no network): escaping, nice axis steps,
axes, legends, the three plots (measured versus predicted time, per-processor imbalance,
bottleneck per superstep) and their colours.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

from counterd.prediction import TERM_MEANING, TERMS
from counterd.report.model import START_SKEW, Report, StepRow

TERM_COLOURS = {"F1": "#4e79a7", "F2": "#f28e2b", "F3": "#59a14f"}
MEASURED = "#4e79a7"
SPAN_EXTRA = "#c5d3e6"  # the span beyond the work: start skew and waiting
PREDICTED = "#e15759"
SHORT = "#e4e4e4"  # heat map cells of supersteps too short to rate (Report.short_ns)
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


def _gap_label(cx: float, y: float, step: float, text: str, colour: str) -> str:
    """Why a superstep has no bar, on the axis: across its slot where it fits, else upwards."""
    turn = "" if step >= 7 * len(text) else f' transform="rotate(-90 {cx + 3:.1f} {y:.1f})"'
    return (f'<text x="{cx + (3 if turn else 0):.1f}" y="{y:.1f}" font-size="10" '
            f'text-anchor="{"start" if turn else "middle"}" fill="{colour}"{turn}>{text}</text>')


def _top_label(cx: float, top: float, step: float, text: str) -> str:
    """A label at the top of a bar cut by the axis: across its slot where it fits, else
    downwards along the bar."""
    if step >= 6.5 * len(text):
        return (f'<text x="{cx:.1f}" y="{top + 12:.1f}" font-size="10" text-anchor="middle" '
                f'fill="#333">{_esc(text)}</text>')
    return (f'<text x="{cx - 3:.1f}" y="{top + 4:.1f}" font-size="10" text-anchor="start" '
            f'fill="#333" transform="rotate(90 {cx - 3:.1f} {top + 4:.1f})">{_esc(text)}</text>')


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
    """Per superstep a bar of its work (the slowest processor's own time, what F predicts)
    with the rest of its span (start skew and waiting) stacked on it in a pale colour, and F
    as a line. The axis is scaled to the work and F: a span beyond it is cut at the top and
    says its length there, so one skewed superstep does not flatten all the others."""
    rows = rep.rows
    top, height = 34, 240
    vals = [w / 1e9 for r in rows if (w := r.slowest_work_ns) is not None]
    vals += [r.prediction.total_s for r in rows if r.prediction is not None]
    spans = [r.time_ns / 1e9 for r in rows if r.time_ns is not None]
    # Spans set the scale too unless one would squash the rest (over twice the rest's top).
    vmax = max(vals, default=0.0)
    vmax = _nice_max(max([vmax, *(t for t in spans if t <= 2 * vmax)]) if vmax > 0 else
                     max(spans, default=0.0))
    unit, scale = _time_unit(vmax)
    body = _axis(top, height, vmax, f"time ({unit})", scale)
    step = (W - LEFT - RIGHT) / max(1, len(rows))
    bw = max(1.0, min(46.0, step * 0.7))
    pts = []
    cut = False
    for i, r in enumerate(rows):
        cx = LEFT + (i + 0.5) * step
        work = r.slowest_work_ns
        if r.time_ns is not None and work is not None:
            tip = (f"superstep {r.index} {r.name}: work {work / 1e6:.3f} ms (slowest "
                   f"processor), span {r.time_ns / 1e6:.3f} ms, start skew "
                   f"{r.skew_ns / 1e6:.3f} ms")
            if r.prediction is not None:
                tip += f", predicted F {r.prediction.total_s * 1e3:.3f} ms"
                if r.error_ratio is not None:
                    tip += f" (E = {r.error_ratio:.2f} against the work)"
            if r.skewed:
                tip += f"; {START_SKEW}: the span is mostly waiting, not work"
            x = f'x="{cx - bw / 2:.1f}" width="{bw:.1f}"'
            span_h = min(height, height * (r.time_ns / 1e9) / vmax)
            work_h = min(height, height * (work / 1e9) / vmax)
            if span_h - work_h >= 0.5:
                body.append(f'<rect {x} y="{top + height - span_h:.1f}" '
                            f'height="{span_h - work_h:.1f}" fill="{SPAN_EXTRA}" rx="1.5">'
                            f'<title>{_esc(tip)}</title></rect>')
            body.append(f'<rect {x} y="{top + height - work_h:.1f}" '
                        f'height="{max(work_h, 0.5):.1f}" fill="{MEASURED}" rx="1.5">'
                        f'<title>{_esc(tip)}</title></rect>')
            if r.time_ns / 1e9 > vmax:  # cut at the top: a break, and how long it is
                cut = True
                y = top + 22
                body.append(f'<path d="M{cx - bw / 2:.1f},{y + 3:.1f} l{bw / 4:.1f},-6 '
                            f'l{bw / 4:.1f},6 l{bw / 4:.1f},-6 l{bw / 4:.1f},6" fill="none" '
                            f'stroke="white" stroke-width="2"/>')
                label = f"span {r.time_ns * scale / 1e9:.3g} {unit}"
                body.append(_top_label(cx, top, step, label))
        else:
            body.append(_gap_label(cx, top + height - 4, step, "incomplete", "#b00"))
        if r.prediction is not None:
            pts.append((cx, top + height - height * min(1.0, r.prediction.total_s / vmax)))
    if pts:
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
        body.append(f'<polyline points="{path}" fill="none" stroke="{PREDICTED}" '
                    f'stroke-width="2.5" stroke-linejoin="round"/>')
        body += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4.5" fill="{PREDICTED}" '
                 f'stroke="white" stroke-width="1.5"/>' for x, y in pts]
    body += _x_labels(rows, LEFT, step, top + height + 16)
    legend = [("work (slowest processor)", MEASURED, ""),
              ("rest of the span (start skew, waiting)" + (": cut at the top" if cut else ""),
               SPAN_EXTRA, "")]
    if pts:
        legend.append(("predicted F = max(F1, F2, F3)", PREDICTED, "line"))
    body += _legend(legend, LEFT, 20)
    return _svg(top + height + _label_room(rows), body,
                "work, span and predicted time per superstep")


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
        short = rep.is_short(r)
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
            if short:
                tip += " (too short a part of the run to rate: grey)"
            body.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{step:.1f}" height="{cell_h:.1f}" '
                        f'fill="{SHORT if short else _heat_colour(ratio)}" stroke="white" '
                        f'stroke-width="0.6"><title>{_esc(tip)}</title></rect>')
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
    if any(map(rep.is_short, rows)):
        body += _legend([("too short to rate", SHORT, "")], sx - 200, sy + 10)
    return _svg(top + height + _label_room(rows), body, "per-processor imbalance")


def plot_bottleneck(rep: Report) -> str:
    """Each superstep's three predicted terms side by side, the dominating one in full colour
    (call only when some superstep is predicted; the page says why otherwise)."""
    rows = rep.rows
    top, height = 34, 200
    step = (W - LEFT - RIGHT) / max(1, len(rows))
    vmax = _nice_max(max((max(r.prediction.terms_s.values()) for r in rows
                          if r.prediction is not None), default=0.0))
    unit, scale = _time_unit(vmax)
    body = _axis(top, height, vmax, f"predicted term ({unit})", scale)
    bw = max(1.0, min(16.0, step * 0.8 / 3))
    for i, r in enumerate(rows):
        p = r.prediction
        cx = LEFT + (i + 0.5) * step
        dom = r.dominating
        if p is None or dom is None:
            body.append(_gap_label(cx, top + height - 4, step,
                                   "no prediction" if p is None else "all terms 0", "#888"))
            continue
        for k, term in enumerate(TERMS):
            v = p.terms_s[term]
            h = height * v / vmax
            x = cx + (k - 1.5) * bw
            opacity = "1" if term == dom else "0.28"
            tip = f"superstep {r.index}: {term} ({TERM_MEANING[term]}) {v * 1e3:.3f} ms"
            body.append(f'<rect x="{x:.1f}" y="{top + height - h:.1f}" width="{bw:.1f}" '
                        f'height="{max(h, 0.5):.1f}" fill="{TERM_COLOURS[term]}" '
                        f'fill-opacity="{opacity}"><title>{_esc(tip)}</title></rect>')
    body += _x_labels(rows, LEFT, step, top + height + 16)
    body += _legend([(f"{t} {TERM_MEANING[t]}", TERM_COLOURS[t], "") for t in TERMS]
                    + [("faded: not dominating", "#999", 'fill-opacity="0.28"')], LEFT, 20)
    return _svg(top + height + _label_room(rows), body, "bottleneck per superstep")
