"""Strict TOML for the files counterd and its tools read: machine files, profiles, configs.

:func:`tomllib.loads` is recursive: an array nested 100k deep (``a = [[[[...``) raises
:class:`RecursionError`; it accepts ``nan``, ``inf`` and ``1e400`` (which it turns into
infinity), and dates and times: no counterd writer produces these and no parameter may hold
them. :func:`loads` refuses them, bytes that are not UTF-8, and nesting deeper than
:data:`strictjson.MAX_DEPTH`, with :class:`strictjson.Malformed` (the one error of strict
parsing, JSON or TOML), so each reader turns one exception into its own exit-2 message.
"""

from __future__ import annotations

import datetime
import math
import tomllib
from typing import Any

from counterd.util.strictjson import MAX_DEPTH, Malformed, nodes, utf8_text


def loads(data: str | bytes, *, max_depth: int = MAX_DEPTH,
          finite: bool = True) -> dict[str, Any]:
    """The table of one TOML document; :class:`Malformed` for anything the module's docstring
    lists and for text that is not TOML. ``finite=False`` lets non-finite floats through, for
    a format that records them on purpose (a profile's fit diagnostics: E is infinite when a
    prediction is 0); its reader checks the fields that must be finite."""
    text = utf8_text(data)
    try:
        doc = tomllib.loads(text)
    except RecursionError:
        raise Malformed(f"nested deeper than {max_depth} levels") from None
    except tomllib.TOMLDecodeError as exc:
        raise Malformed(f"not TOML ({exc})") from None
    _check(doc, max_depth, finite)
    return doc


def _check(doc: Any, max_depth: int, finite: bool) -> None:
    """Malformed for a non-finite float or nesting beyond ``max_depth`` (iterative: the
    parser's own recursion limit is far above ours)."""
    for v in nodes(doc, max_depth):
        if isinstance(v, (datetime.date, datetime.time)):  # datetime is a date
            raise Malformed(f"{v.isoformat()} is a TOML date or time (no counterd file holds "
                            "one: dates are strings)")
        if finite and isinstance(v, float) and not math.isfinite(v):
            raise Malformed(f"{v} is not a finite number (TOML allows it; no counterd file "
                            "holds one)")
