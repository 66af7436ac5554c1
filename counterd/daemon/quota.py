"""What each user may make the daemon keep, and what the writer owes it (the Reliability issue).

:class:`Usage` is shared by the loop's thread and the writer's:

* **in flight**: records (and their wire bytes) each uid has queued for the writer and not yet
  committed. The loop stops serving a uid's connections while it has more than
  :data:`INFLIGHT_RECORDS` or :data:`INFLIGHT_BYTES` in flight (:meth:`Usage.congested`), so
  a flood waits in its own sockets, not in the daemon's memory, and another user's record
  waits behind at most that much of it in the writer's queue.
* **stored**: the bytes of records each uid keeps in the store (the store's ``usage`` table,
  kept by triggers), refreshed by the writer after each commit, and the free space of the
  store's file system.

:meth:`Usage.refusal` says why a record is refused, or None: beyond ``store.max_bytes_per_uid``
(the uid's stored plus in-flight bytes), or, when the file system has less than
``store.reserve_bytes`` free (at most a quarter of its size), for a uid that keeps at least the
average of what the store's users keep: whoever fills the disk is refused first, and the others'
records go on into the reserve. Root is exempt from both (as from the ``[socket]`` per-uid
limits).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from pathlib import Path

# Records of one uid queued for the writer, and their wire bytes, beyond which its connections
# wait: two of the writer's batches (writer.WRITER_BATCH), so that the loop fills the next
# while the writer commits one.
INFLIGHT_RECORDS = 4096
INFLIGHT_BYTES = 8 << 20


class Usage:
    """Per-uid bytes stored and in flight, and the store's free space (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stored: dict[int, int] = {}
        self._inflight: dict[int, list[int]] = {}  # uid -> [records, bytes]
        self._inflight_bytes = 0
        self.free: int | None = None  # bytes free on the store's file system (None: unknown)
        self.size = 0  # bytes of that file system

    # -- the writer ------------------------------------------------------------------------
    def load(self, stored: Mapping[int, int]) -> None:
        """Every uid's stored bytes (at start, and after retention deleted some)."""
        with self._lock:
            self._stored = dict(stored)

    def stat(self, path: Path) -> None:
        """Read the free space of the file system holding ``path``."""
        try:
            st = os.statvfs(path)
        except OSError:
            return
        self.free, self.size = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize

    def queued(self, uid: int, size: int) -> None:
        with self._lock:
            held = self._inflight.setdefault(uid, [0, 0])
            held[0] += 1
            held[1] += size
            self._inflight_bytes += size

    def done(self, uid: int, size: int) -> None:
        with self._lock:
            held = self._inflight.get(uid)
            if held is None:
                return
            held[0] -= 1
            held[1] -= size
            self._inflight_bytes -= size
            if held[0] <= 0:
                del self._inflight[uid]

    def committed(self, stored: Mapping[int, int]) -> None:
        """The store's bytes of these uids after a commit."""
        with self._lock:
            self._stored.update(stored)

    # -- the loop ---------------------------------------------------------------------------
    def congested(self, uid: int) -> bool:
        held = self._inflight.get(uid)
        return held is not None and (held[0] >= INFLIGHT_RECORDS or held[1] >= INFLIGHT_BYTES)

    def inflight(self, uid: int) -> tuple[int, int]:
        held = self._inflight.get(uid)
        return (held[0], held[1]) if held is not None else (0, 0)

    def stored(self, uid: int) -> int:
        return self._stored.get(uid, 0)

    def refusal(self, uid: int, size: int, max_bytes: int, reserve: int) -> str | None:
        """Why uid ``uid`` may not queue a record of ``size`` bytes more (None: it may).
        ``max_bytes``: ``store.max_bytes_per_uid`` (0: no quota); ``reserve``:
        ``store.reserve_bytes``."""
        if uid == 0:
            return None
        with self._lock:
            held = self._inflight.get(uid)
            mine = self._stored.get(uid, 0) + (held[1] if held is not None else 0)
            if max_bytes and mine + size > max_bytes:
                return (f"uid {uid} keeps {mine} bytes of records in the store, and "
                        f"store.max_bytes_per_uid is {max_bytes}: this record is not kept; "
                        "let old runs expire (store.retention_days) or ask for a larger quota")
            if self.free is None or not reserve:
                return None
            reserve = min(reserve, self.size // 4)
            free = self.free - self._inflight_bytes
            if free - size >= reserve:
                return None
            users = [b for b in self._stored.values() if b > 0]
            average = sum(users) / len(users) if users else 0.0
            if mine > 0 and mine >= average:
                return (f"the store's file system has {max(free, 0)} bytes free, under "
                        f"store.reserve_bytes ({reserve}), and uid {uid} keeps {mine} bytes "
                        f"there (the users' average is {average:.0f}): its records are "
                        "refused until space is freed, the others' go on")
        return None
