"""The bench scripts' timing samples as a pyperf benchmark suite (``--pyperf FILE``).

A script adds the option with :func:`add_option`, makes a :class:`PyperfOut` when it starts
(the metadata are collected then, by pyperf and with the script's host line and
command: date, load average, CPU, Python, host, command), hands it each series of
timing samples under a stable name (``script/part/part``: no commas or colons, which pyperf's
listings use as separators) with :meth:`PyperfOut.add`, and calls
:meth:`PyperfOut.dump` at the end; without ``--pyperf`` these do nothing. Two runs' files
compare with ``python -m pyperf compare_to old.json new.json`` (benchmarks matched by name;
``--table``, ``-G`` to group faster and slower), one is described by ``python -m pyperf stats
FILE`` or ``python -m pyperf hist FILE``.

Each sample is one pyperf run of one value (a sample is a process, a batch or a pair the
script timed on its own): pyperf's statistics are then over the samples. Values are in
seconds (pyperf's unit ``second``), per timed thing: a batch of N marker pairs gives the time
per pair with ``loops`` = N in its metadata. pyperf takes only values > 0: a timing of 0
(below the clock's resolution) is written as the resolution (1 ns) and counted in the
benchmark's ``values_at_resolution`` metadata; a negative one is refused as a bug of the
script. The suite is built and written with pyperf's own API (pyperf.Run, pyperf.Benchmark,
pyperf.BenchmarkSuite.dump), never by hand.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

RESOLUTION_S = 1e-9  # CLOCK_MONOTONIC through time.monotonic_ns


def _json_path(text: str) -> Path:
    path = Path(text)
    if path.suffix != ".json":
        raise argparse.ArgumentTypeError(f"{text}: name a .json file (pyperf reads JSON)")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: no directory {path.parent}")
    return path


def add_option(ap: argparse.ArgumentParser) -> None:
    """``--pyperf FILE``; a name that is not .json or not in a directory: argparse's error."""
    ap.add_argument("--pyperf", metavar="FILE", type=_json_path, default=None,
                    help="also write the timing samples as pyperf JSON (compare two runs with "
                    "python -m pyperf compare_to OLD NEW)")


class PyperfOut:
    """The benchmarks of one bench run, written to ``path`` (nothing if ``path`` is None)."""

    def __init__(self, path: Path | None, host: str | None = None,
                 command: list[str] | None = None) -> None:
        self.path = path
        self._benchmarks: list[Any] = []
        self._names: set[str] = set()
        self._metadata: dict[str, Any] = {}
        if path is None:
            return
        from pyperf._collect_metadata import collect_metadata

        meta = collect_metadata()  # pyperf's own: date, load_avg_1min, cpu_*, python_*, ...
        meta.pop("mem_max_rss", None)  # this script's, not the timed programs'
        if host is None:
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            from _host import host_line

            host = host_line()
        meta["host"] = host
        meta["command"] = shlex.join(command if command is not None else
                                     [Path(sys.executable).name, *sys.argv])
        meta["load_avg_1min"] = os.getloadavg()[0]  # now, at the start (pyperf's: the same)
        self._metadata = meta

    def add(self, name: str, seconds: Iterable[float], *, loops: int = 1,
            backend: str | None = None, **metadata: str | int | float) -> None:
        """One benchmark: ``seconds``, one sample each, under ``name`` (unique in the file)."""
        if self.path is None:
            return
        import pyperf

        if name in self._names:
            raise ValueError(f"benchmark {name!r} added twice")
        if "," in name or ":" in name:
            raise ValueError(f"benchmark {name!r}: no commas or colons in a name")
        values = list(seconds)
        if not values:
            return
        if any(v < 0 for v in values):
            raise ValueError(f"benchmark {name!r}: a negative time {min(values)}")
        clamped = sum(v < RESOLUTION_S for v in values)
        meta = {**self._metadata, **metadata, "name": name, "unit": "second", "loops": loops}
        if backend is not None:
            meta["backend"] = backend
        if clamped:
            meta["values_at_resolution"] = clamped
        runs = [pyperf.Run([max(v, RESOLUTION_S)], metadata=meta, collect_metadata=False)
                for v in values]
        self._benchmarks.append(pyperf.Benchmark(runs))
        self._names.add(name)

    def dump(self) -> None:
        """Write the file (replacing one there); say where on stdout."""
        if self.path is None:
            return
        import pyperf

        if not self._benchmarks:
            print(f"pyperf: no timing samples to write to {self.path}", file=sys.stderr)
            return
        pyperf.BenchmarkSuite(self._benchmarks).dump(str(self.path), replace=True)
        print(f"pyperf: {len(self._benchmarks)} benchmarks written to {self.path} "
              "(python -m pyperf compare_to OLD NEW; python -m pyperf stats FILE)")
