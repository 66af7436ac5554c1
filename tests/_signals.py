"""Ctrl-C and SIGTERM delivered to ``counterd record`` as a user delivers them (issue 34).

Ctrl-C: the terminal sends SIGINT to the whole foreground process group. ``kill`` and
``timeout``: SIGTERM to the recorder alone, which passes it on. :func:`stop_when_ready` starts
the recorder in a process group of its own, as a terminal's foreground job (SIGINT at its
default: a shell's background job, as a CI runner may start the suite, ignores it, and so would
its children), waits until the command says it is inside the superstep to interrupt (it writes
the file ``ready``), delivers the signal, and checks that the recorder ended as a shell reports
the signal (128 + N).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

HOWS = ("ctrl-c", "sigterm")


def signal_of(how: str) -> signal.Signals:
    return signal.SIGINT if how == "ctrl-c" else signal.SIGTERM


def stop_when_ready(argv: Sequence[str], ready: Path, how: str, *, cwd: Path,
                    ready_within_s: float, end_within_s: float) -> str:
    """Run ``argv``, deliver the signal ``how`` names once ``ready`` exists, and return the
    recorder's standard error (asserting that ``ready`` appeared and that it ended 128 + N).
    Whatever happens, nothing it started is left running."""
    sig = signal_of(how)
    proc = subprocess.Popen(list(argv), cwd=cwd, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + ready_within_s
        while not ready.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert ready.exists(), proc.communicate(timeout=10)
        if how == "ctrl-c":
            os.killpg(proc.pid, sig)  # as the terminal sends it: to the whole group
        else:
            os.kill(proc.pid, sig)  # to the recorder alone
        _, err = proc.communicate(timeout=end_within_s)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 128 + sig, err
    return err
