"""The host line every bench script prints with its figures."""

from __future__ import annotations

import datetime
import os
import platform
import sys
from collections.abc import Callable
from pathlib import Path


def host_line() -> str:
    from counterd.data.host import host_info, page_reporting

    h = host_info()
    pmu = h.core_pmu or "no PMU"
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    pr = page_reporting()
    freed = ("" if pr.state != "on" else ", free page reporting on" + (
        f" (after {pr.min_free_ms} ms free)" if pr.min_free_ms is not None else ""))
    return (f"host {h.hostname}: {h.cpu_model}, {h.cpus_online} CPUs, kernel {h.kernel}, {pmu}"
            f"{freed}, python {platform.python_version()}, pid {os.getpid()}, {now}")


def guarded(main: Callable[[], int]) -> int:
    """A bench script's ``main`` with bad input (a missing or damaged file, a bad option value)
    said in one line on stderr and exit code 2, not a traceback."""
    from counterd.data.errors import CounterdError
    from predictor.errors import PredictorError

    try:
        return main()
    except (CounterdError, PredictorError) as exc:
        print(f"{Path(sys.argv[0]).name}: {exc}", file=sys.stderr)
        return 2
