"""What the project's command lines (counterd, microbench, predict) do alike, as the tools
users know do it: ``--version``, and a quiet end when the reader of stdout goes away
(``microbench list | head -1``)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any


def version(prog: str) -> str:
    """``prog 0.1.0`` (the installed distribution's version)."""
    from importlib import metadata  # 45 ms to import: only for --version

    try:
        v = metadata.version("counterd")
    except metadata.PackageNotFoundError:  # run from a source tree without installing
        v = "unknown (not installed)"
    return f"{prog} {v}"


class VersionAction(argparse.Action):
    """``--version``: prints :func:`version` when given, and only then looks it up (reading
    the installed distribution's metadata costs 40 ms, paid by every command otherwise)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 **kwargs: Any) -> None:
        kwargs.setdefault("help", "show the version and exit")
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        print(version(parser.prog))
        parser.exit()


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
