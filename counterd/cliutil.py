"""What the project's command lines (counterd, microbench, predict) do alike, as the tools
users know do it: ``--version``, and a quiet end when the reader of stdout goes away
(``microbench list | head -1``)."""

from __future__ import annotations

import os
import signal
import sys


def version(prog: str) -> str:
    """``prog 0.1.0`` (the installed distribution's version)."""
    from importlib import metadata  # 45 ms to import: only for --version

    try:
        v = metadata.version("counterd")
    except metadata.PackageNotFoundError:  # run from a source tree without installing
        v = "unknown (not installed)"
    return f"{prog} {v}"


def closed_pipe() -> int:
    """What a command does when stdout's reader went away (``microbench list | head -1``):
    nothing more on stdout and no traceback, as ``cat`` does, and the exit status of a
    process ended by SIGPIPE. Called from the commands' ``except BrokenPipeError``; stdout is
    pointed at /dev/null so that the interpreter's final flush cannot fail again. (Resetting
    SIGPIPE to its default action would do the same for a console script, but it would also
    end any process that calls ``main()`` in-process, a test runner included, at the first
    write to a closed socket.)"""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + signal.SIGPIPE
