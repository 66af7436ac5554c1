"""Per-superstep reports: the report model and its renderings (text, JSON, CSV, HTML with SVG).

``build`` turns records into a :class:`Report`; ``render`` writes it in one of the formats.
The model is in ``model``; text, JSON, CSV and the runs table in ``text``; the HTML page in
``html``, drawing its plots with ``svg``. The report across nodes is ``nodes``.

Importing this package loads none of them: each comes with its first use (``build``,
``render``, or a name below), so that ``counterd report --central`` and ``--records`` across
nodes, which need only ``nodes``, do not pay for the model and the HTML page (about 15 ms
of a command's start).
"""

from __future__ import annotations

import importlib

from counterd.data.errors import BadInput

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (see counterd/__init__)
if TYPE_CHECKING:
    from counterd.report.model import CounterStats, Report, StepRow, build
    from counterd.report.text import render_runs

# name -> the submodule that defines it, imported when the name is first asked for (the
# renderers too, which the package named before it loaded lazily)
_LAZY = {"CounterStats": "model", "Report": "model", "StepRow": "model", "build": "model",
         "render_html": "html", "render_csv": "text", "render_json": "text",
         "render_runs": "text", "render_text": "text"}


def __getattr__(name: str) -> object:
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{where}"), name)
    globals()[name] = value
    return value


def render(report: Report, fmt: str, *, verbose: bool = False) -> str:
    """``report`` in format ``fmt``. ``verbose``: the text and HTML show every flag of a row,
    not only those that change what to believe about it (JSON and CSV always have all)."""
    if fmt == "html":
        from counterd.report.html import render_html as html

        return html(report, verbose=verbose)
    from counterd.report import text

    if fmt == "text":
        return text.render_text(report, verbose=verbose)
    renderers = {"json": text.render_json, "csv": text.render_csv}
    if fmt not in renderers:
        raise BadInput(f"unknown report format {fmt!r}", "choose text, json, csv or html")
    return renderers[fmt](report)


__all__ = ["CounterStats", "Report", "StepRow", "build", "render",
           "render_runs"]
