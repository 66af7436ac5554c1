"""Per-superstep reports: the report model and its renderings (text, JSON, CSV, HTML with SVG).

``build`` turns records into a :class:`Report`; ``render`` writes it in one of the formats.
"""

from counterd.report.model import (
    CounterStats,
    Report,
    StepRow,
    build,
    records_from_store,
    render,
    render_runs,
)

__all__ = ["CounterStats", "Report", "StepRow", "build", "records_from_store", "render",
           "render_runs"]
