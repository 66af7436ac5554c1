"""What the project's command lines (counterd, microbench, predict) do alike, as the tools
users know do it: ``--version``, and a quiet end when the reader of stdout goes away
(``microbench list | head -1``)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (see counterd/__init__)
if TYPE_CHECKING:
    from typing import Any, NoReturn


def version(prog: str) -> str:
    """``prog 0.1.0`` (the installed distribution's version)."""
    from importlib import metadata  # 45 ms to import: only for --version

    try:
        v = metadata.version("counterd")
    except metadata.PackageNotFoundError:  # run from a source tree without installing
        v = "unknown (not installed)"
    return f"{prog} {v}"


class Formatter(argparse.HelpFormatter):
    """argparse's help layout, with the terminal's width from os rather than shutil (whose
    import loads bz2 and lzma: 3 ms, and argparse builds a formatter for every option it
    adds)."""

    def __init__(self, prog: str) -> None:
        columns = os.environ.get("COLUMNS", "")
        try:  # shutil.get_terminal_size's order: $COLUMNS, stdout's terminal, 80
            width = int(columns) if columns.isdigit() else os.get_terminal_size(1).columns
        except OSError:
            width = 80
        super().__init__(prog, width=width - 2)


class Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line on stderr and exit code 2."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


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
