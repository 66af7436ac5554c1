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
                  valgrind: str = "valgrind") -> list[str]:
    """The full argv that runs ``cmd`` under Callgrind with one dump per boundary call.

    Valgrind's own messages go to ``<outdir>/valgrind.<pid>.log`` (core option ``--log-file``,
    manual section 2.7.2) so the command's stderr is its own. ``--dump-line=no`` keeps dumps
    small: only totals are used here, never source positions.
    """
    if not cmd:
        raise BadInput("no command given", "usage: counterd record --backend callgrind -- CMD")
    out = Path(outdir)
    return [
        valgrind, "--tool=callgrind",
        "--cache-sim=yes",
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
