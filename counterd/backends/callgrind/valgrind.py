"""valgrind itself: where it is, its version, its command line (:func:`valgrind_argv`), the
symbol that cuts a dump and the error of a run or a dump that went wrong.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from counterd.backends.callgrind.geometry import CallgrindGeometry
from counterd.data.errors import BadInput, CounterdError

NAME = "callgrind"
#: The symbol whose every call closes one dump (see the module docstring: call it from C).
BOUNDARY_SYMBOL = "counterd_superstep_boundary"
OUT_PREFIX = "callgrind.out."
INSTALL_FIX = "apt-get install valgrind (or your distribution's valgrind package)"
BEGIN, END = 0, 1


class CallgrindError(CounterdError):
    """Callgrind could not run the command, or its output cannot be read."""


def valgrind_argv(cmd: Sequence[str], geometry: CallgrindGeometry, outdir: str | Path,
                  valgrind: str = "valgrind", *, from_first_superstep: bool = False) -> list[str]:
    """The full argv that runs ``cmd`` under Callgrind with one dump per boundary call.

    Valgrind's own messages go to ``<outdir>/valgrind.<pid>.log`` (core option ``--log-file``,
    manual section 2.7.2) so the command's stderr is its own. ``--dump-line=no`` keeps dumps
    small: only totals are used here, never source positions.

    ``from_first_superstep``: ``--instr-atstart=no`` (sections 6.2.2 "Limiting the range of
    collected events" and 6.3.3 "Data collection options"): each process runs uninstrumented,
    at valgrind's core speed, until its first superstep mark starts the counting
    (``CALLGRIND_START_INSTRUMENTATION`` in ``counterd_superstep_mark``, where the library was
    built with valgrind's header: :func:`counterd._native.marks_start_counting`).
    A Python process's start-up and imports, counted, are most of a short counted run (on a
    2-CPU AMD EPYC guest, 2026-11-28: ``import numpy`` 22.0 s counted, 3.4 s not; a two-process
    histogram at n = 125,000 56 s, 11.5 s from the first superstep). The supersteps' counts are
    the same but for the last level: its simulated cache starts empty at the first superstep
    instead of holding the start-up's lines (the same histogram's first superstep: 2.6x the
    last-level misses, the next two 1.14x and 1.6x; instructions, loads, stores and L1 misses
    within 1.4 %).
    A process that never marks is not counted at all, so a command without markers must not
    be run so.
    """
    if not cmd:
        raise BadInput("no command given", "usage: counterd record --backend callgrind -- CMD")
    out = Path(outdir)
    return [
        valgrind, "--tool=callgrind",
        "--cache-sim=yes",
        *(["--instr-atstart=no"] if from_first_superstep else []),
        "--simulate-hwpref=yes" if geometry.prefetch else "--simulate-wb=yes",
        "--branch-sim=yes",
        f"--I1={geometry.i1.option()}", f"--D1={geometry.d1.option()}",
        f"--LL={geometry.ll.option()}",
        f"--dump-before={BOUNDARY_SYMBOL}",
        "--trace-children=yes",
        "--dump-line=no",
        f"--callgrind-out-file={out / OUT_PREFIX}%p",
        f"--log-file={out / 'valgrind.'}%p.log",
        *cmd,
    ]


def valgrind_path() -> str | None:
    return shutil.which("valgrind")


@functools.cache
def valgrind_version(exe: str) -> str | None:
    try:
        res = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    text = res.stdout.strip()
    return text if res.returncode == 0 and text else None
