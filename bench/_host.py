"""The host line every bench script prints with its figures."""

from __future__ import annotations

import datetime
import os
import platform


def host_line() -> str:
    from counterd.host import host_info

    h = host_info()
    pmu = h.core_pmu or "no PMU"
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (f"host {h.hostname}: {h.cpu_model}, {h.cpus_online} CPUs, kernel {h.kernel}, {pmu}, "
            f"python {platform.python_version()}, pid {os.getpid()}, {now}")
