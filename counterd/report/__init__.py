"""Per-superstep reports: the report model and its renderings (text, JSON, CSV, HTML with SVG).

``build`` turns records into a :class:`Report`; ``render`` writes it in one of the formats.
The model is in ``model``; text, JSON, CSV and the runs table in ``text``; the HTML page in
``html``, drawing its plots with ``svg``.
"""

from counterd.errors import BadInput
from counterd.report.html import render_html
from counterd.report.model import (
    CounterStats,
    Report,
    StepRow,
    build,
)
from counterd.report.text import render_csv, render_json, render_runs, render_text


def render(report: Report, fmt: str, *, verbose: bool = False) -> str:
    """``report`` in format ``fmt``. ``verbose``: the text and HTML show every flag of a row,
    not only those that change what to believe about it (JSON and CSV always have all)."""
    if fmt == "text":
        return render_text(report, verbose=verbose)
    if fmt == "html":
        return render_html(report, verbose=verbose)
    renderers = {"json": render_json, "csv": render_csv}
    if fmt not in renderers:
        raise BadInput(f"unknown report format {fmt!r}", "choose text, json, csv or html")
    return renderers[fmt](report)


__all__ = ["CounterStats", "Report", "StepRow", "build", "render",
           "render_runs"]
