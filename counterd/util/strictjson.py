"""Strict JSON for what crosses a boundary: marker frames, record files, results, profiles.

The standard library's :func:`json.loads` accepts what no counterd writer produces and what
breaks the code behind the boundary: ``NaN`` and ``Infinity``, numbers that overflow to
infinity (``1e400``), lone UTF-16 surrogates (``"\\ud800"``, and raw bytes ``ED A0 80``, which
``json.loads(bytes)`` decodes with ``surrogatepass``) that no UTF-8 writer can encode again,
and nesting deep enough to raise :class:`RecursionError`. :func:`loads` refuses all of these
with :class:`Malformed` (a ValueError), so a caller has one exception to turn into a protocol
error or an exit-2 message. The parser stays the standard library's C scanner: the checks are
its hooks plus a depth walk that runs only when the text could be nested deeper than allowed.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MAX_DEPTH = 32  # objects and arrays inside each other; no counterd format nests beyond 4

# A \uD800-\uDFFF escape: the only way a valid UTF-8 text can produce a surrogate.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


class Malformed(ValueError):
    """Input that is not strict JSON (see the module's docstring); the message says why."""


def _no_constant(name: str) -> Any:
    raise Malformed(f"{name} is not a number JSON allows")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise Malformed(f"number {text[:40]} overflows a double")
    return value


_decoder = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite)


def loads(data: str | bytes | bytearray, *, max_depth: int = MAX_DEPTH) -> Any:
    """The value of one JSON text; :class:`Malformed` for anything the module's docstring
    lists, for text that is not JSON, and for bytes that are not UTF-8."""
    text = utf8_text(data)
    try:
        value = _decoder.decode(text)
    except RecursionError:
        raise Malformed(f"nested deeper than {max_depth} levels") from None
    except Malformed:
        raise
    except ValueError as exc:  # JSONDecodeError, and int() beyond its digit limit
        raise Malformed(str(exc)) from None
    if _SURROGATE_ESCAPE.search(text):
        _check_strings(value)
    if text.count("[") + text.count("{") > max_depth:
        for _ in nodes(value, max_depth):
            pass
    return value


def load_file(path: str | Path, max_bytes: int) -> Any:
    """:func:`loads` of a file of at most ``max_bytes`` (:class:`Malformed` beyond); OSError
    when it cannot be read."""
    with Path(path).open("rb") as fh:
        raw = fh.read(max_bytes + 1)
    if len(raw) > max_bytes:
        raise Malformed(f"larger than {max_bytes} bytes")
    return loads(raw)


def utf8_text(data: str | bytes | bytearray) -> str:
    """``data`` as text; Malformed for bytes that are not UTF-8 (strict: encoded surrogates
    are refused too)."""
    if not isinstance(data, (bytes, bytearray)):
        return data
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Malformed(f"not UTF-8 (byte 0x{data[exc.start]:02x} at offset "
                        f"{exc.start})") from None


def nodes(value: Any, max_depth: int) -> Iterator[Any]:
    """Every value inside ``value`` (itself included), without recursion; Malformed for a
    container nested deeper than ``max_depth``."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        yield v
        if isinstance(v, (dict, list)):
            if depth > max_depth:
                raise Malformed(f"nested deeper than {max_depth} levels")
            stack.extend((item, depth + 1) for item in (v.values() if isinstance(v, dict)
                                                        else v))


def _check_strings(value: Any) -> None:
    """Malformed if a string or key of ``value`` holds a lone surrogate (a valid pair was
    joined by the parser into one character, so any surrogate left is lone)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            _utf8(v)
        elif isinstance(v, dict):
            for k, item in v.items():
                _utf8(k)
                stack.append(item)
        elif isinstance(v, list):
            stack.extend(v)


def _utf8(s: str) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise Malformed(f"string {s[:40]!r} holds a lone UTF-16 surrogate") from None
