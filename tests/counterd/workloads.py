"""Small workloads with known software-event counts, shared by the perf tests."""

from __future__ import annotations

import mmap
import time

PAGE = mmap.PAGESIZE


def touch_fresh_pages(n_pages: int) -> None:
    """Write one byte into each of ``n_pages`` never-touched anonymous pages (one fault each)."""
    area = mmap.mmap(-1, n_pages * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):  # a transparent huge page would fault once for 512
        area.madvise(mmap.MADV_NOHUGEPAGE)
    for offset in range(0, n_pages * PAGE, PAGE):
        area[offset] = 1
    area.close()


def spin(seconds: float) -> None:
    """Busy-wait ``seconds`` of this thread's CPU time."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass
