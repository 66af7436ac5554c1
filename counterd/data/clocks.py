"""Clock domains: how one node's CLOCK_MONOTONIC timestamps map to a time shared by nodes
(issue 32 item 2).

A record's begin and end are CLOCK_MONOTONIC, whose origin is its node's boot (and, inside a
time namespace, that namespace's offset): differences within one node are exact, across
nodes they are meaningless. A :class:`ClockDomain` names where a node's timestamps come from
(the kernel's boot id and the time namespace) and carries anchor pairs (monotonic, realtime)
read at run start, periodically and at run end. With them a monotonic time maps to
CLOCK_REALTIME, with an error bound made of:

* the read interval: each anchor reads CLOCK_REALTIME between two CLOCK_MONOTONIC reads; the
  anchor's monotonic time is their midpoint, off by at most half their distance;
* steps between anchors: Linux slews CLOCK_MONOTONIC and CLOCK_REALTIME alike (NTP's frequency
  and offset adjustments apply to both, clock_gettime(2)), so their difference changes only
  when CLOCK_REALTIME is stepped (settimeofday, a leap second). Between two anchors whose
  differences disagree, the time is put midway with half the disagreement as its error;
  outside the anchors the nearest one is used and the time is said to be unanchored.

Across nodes the realtime clocks themselves differ: not at all on one kernel (the same boot
id: namespaces on one machine share CLOCK_REALTIME), else by what NTP or PTP leaves. Each
domain carries its kernel's own statement of it (adjtimex(2)'s ``maxerror`` while the clock
is synchronised, :func:`sync_bound_ns`), or the site declares it (``counterd report
--clock-bound``).

Files: a domain is one JSON line ``{"format": "counterd-clock-domain", "version": 1, ...}``
ahead of a records file's records (``counterd record`` writes it).
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from counterd.data.errors import BadInput

CLOCK_FORMAT = "counterd-clock-domain"
CLOCK_VERSION = 1
MAX_ANCHORS = 10_000  # a day of anchors at one per 10 s; a file claiming more is not ours
MAX_READ_NS = 1_000_000_000  # an anchor read over more than a second is not an anchor
MAX_BOUND_NS = 3600 * 1_000_000_000  # a clock bound beyond an hour says nothing
INT64_MAX = (1 << 63) - 1
ANCHOR_PERIOD_S = 10.0  # how often a recorder or the daemon anchors a running run
_FIX = "give the files counterd record --out writes, unchanged"


@dataclass(frozen=True)
class Anchor:
    """One (monotonic, realtime) pair: CLOCK_REALTIME ``real_ns`` was read at CLOCK_MONOTONIC
    ``mono_ns`` +- ``read_ns`` / 2."""

    mono_ns: int
    real_ns: int
    read_ns: int

    @property
    def offset_ns(self) -> int:
        return self.real_ns - self.mono_ns

    def to_json(self) -> list[int]:
        return [self.mono_ns, self.real_ns, self.read_ns]


def take_anchor(tries: int = 3) -> Anchor:
    """An anchor now: of ``tries`` reads, the one with the narrowest monotonic bracket."""
    best: Anchor | None = None
    for _ in range(max(1, tries)):
        m1 = time.monotonic_ns()
        r = time.time_ns()
        m2 = time.monotonic_ns()
        a = Anchor((m1 + m2) // 2, r, m2 - m1 + 1)  # +1: the midpoint's rounding
        if best is None or a.read_ns < best.read_ns:
            best = a
    assert best is not None
    return best


def boot_id() -> str:
    """This kernel's boot id (random per boot), "" where unreadable."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read(64).strip()
    except OSError:
        return ""


def time_namespace() -> str:
    """This process's time namespace (``time:[INODE]``; its CLOCK_MONOTONIC offset is its
    own), "" where the kernel has none (before Linux 5.6)."""
    try:
        return os.readlink("/proc/self/ns/time")
    except OSError:
        return ""


def _monotonic_offset(pid: int | str) -> int | None:
    """The CLOCK_MONOTONIC offset of ``pid``'s time namespace (/proc/PID/timens_offsets), in
    ns; None where unreadable."""
    try:
        with open(f"/proc/{pid}/timens_offsets") as f:
            for line in f.read(4096).splitlines():
                parts = line.split()
                if len(parts) == 3 and parts[0] in ("monotonic", "1"):
                    return int(parts[1]) * 1_000_000_000 + int(parts[2])
    except (OSError, ValueError):
        return None
    return None


def process_clock(pid: int, mine: str | None = None) -> tuple[str, int | None]:
    """(the time namespace of process ``pid``, its CLOCK_MONOTONIC minus this process's in ns:
    0 in the same namespace; None where it cannot be read, e.g. another user's process).
    ``mine``: this process's :func:`time_namespace`, if the caller keeps it (else read)."""
    try:
        theirs = os.readlink(f"/proc/{pid}/ns/time")
    except OSError:
        return "", None
    if theirs == (time_namespace() if mine is None else mine):
        return theirs, 0
    off, own = _monotonic_offset(pid), _monotonic_offset("self")
    return theirs, None if off is None or own is None else off - own


def sync_bound_ns() -> int | None:
    """The kernel's maximum error of CLOCK_REALTIME (adjtimex(2) ``maxerror``, which NTP and
    PTP daemons set and the kernel grows by 500 ppm between their updates), in ns; None when
    the clock is not synchronised (``STA_UNSYNC``, ``TIME_ERROR``) or adjtimex is unavailable.
    A read (modes 0) needs no privilege."""
    import ctypes

    call = _adjtimex()
    if call is None:
        return None
    fn, timex = call
    tx = timex()
    state = fn(ctypes.byref(tx))
    sta_unsync, time_error = 0x0040, 5
    if state < 0 or state == time_error or tx.status & sta_unsync or tx.maxerror < 0:
        return None
    return min(int(tx.maxerror) * 1000, MAX_BOUND_NS)


@functools.cache
def _adjtimex() -> tuple[Any, Any] | None:
    """(libc's adjtimex, the struct timex type), made once per process (building the ctypes
    type costs ~40 us, 10x the call: the daemon reads the bound per connection); None where
    there is none."""
    import ctypes

    class Timex(ctypes.Structure):  # struct timex (include/uapi/linux/timex.h)
        _fields_ = [("modes", ctypes.c_uint), ("offset", ctypes.c_long),
                    ("freq", ctypes.c_long), ("maxerror", ctypes.c_long),
                    ("esterror", ctypes.c_long), ("status", ctypes.c_int),
                    ("rest", ctypes.c_long * 40)]  # the other fields and padding, unread

    try:
        return ctypes.CDLL(None, use_errno=True).adjtimex, Timex
    except (OSError, AttributeError):
        return None


@dataclass(frozen=True)
class ClockDomain:
    """One node's clock domain for one run, and its anchors (sorted by ``mono_ns``)."""

    run_id: str
    host: str
    boot_id: str
    timens: str
    anchors: tuple[Anchor, ...]
    sync_bound_ns: int | None = None
    run_id_source: str = "unknown"  # a key of counterd.data.jobid.SOURCES

    @property
    def key(self) -> tuple[str, str]:
        """What makes two nodes' CLOCK_MONOTONIC the same clock: kernel boot and namespace."""
        return self.boot_id, self.timens

    def to_real(self, mono_ns: int) -> tuple[int, int, bool]:
        """(CLOCK_REALTIME estimate, its error bound in ns, whether ``mono_ns`` lies between
        two anchors) for a CLOCK_MONOTONIC time of this domain."""
        a = self.anchors  # (a report maps two times a node a superstep: kept lean)
        first, last = a[0], a[-1]
        if mono_ns <= first.mono_ns or mono_ns >= last.mono_ns or len(a) == 1:
            near = first if abs(mono_ns - first.mono_ns) <= abs(mono_ns - last.mono_ns) else last
            inside = len(a) > 1 and first.mono_ns <= mono_ns <= last.mono_ns
            return mono_ns + near.real_ns - near.mono_ns, (near.read_ns + 1) // 2, inside
        lo, hi = 0, len(a) - 1
        while hi - lo > 1:  # a[lo].mono_ns < mono_ns < a[hi].mono_ns
            mid = (lo + hi) // 2
            if a[mid].mono_ns <= mono_ns:
                lo = mid
            else:
                hi = mid
        below, above = a[lo], a[hi]
        o1, o2 = below.real_ns - below.mono_ns, above.real_ns - above.mono_ns
        err = (abs(o2 - o1) + 1) // 2 + (max(below.read_ns, above.read_ns) + 1) // 2
        return mono_ns + (o1 + o2) // 2, err, True

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "format": CLOCK_FORMAT, "version": CLOCK_VERSION, "run_id": self.run_id,
            "run_id_source": self.run_id_source, "host": self.host, "boot_id": self.boot_id,
            "timens": self.timens, "anchors": [x.to_json() for x in self.anchors]}
        if self.sync_bound_ns is not None:
            out["sync_bound_ns"] = self.sync_bound_ns
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ClockDomain:
        """The domain of a JSON object as :meth:`to_json` writes it; BadInput for anything
        else (wrong types, anchors out of order or range, more than MAX_ANCHORS)."""
        from counterd.data.jobid import SOURCES

        if d.get("version") != CLOCK_VERSION:
            raise BadInput(f"clock domain version {d.get('version')!r:.20} (this counterd "
                           f"reads {CLOCK_VERSION})", "upgrade counterd, or re-record")

        def text(key: str, limit: int = 256) -> str:
            v = d.get(key)
            if not isinstance(v, str) or len(v) > limit or not v.isprintable():
                raise BadInput(f"clock domain: {key} is not a string of at most {limit} "
                               "printable characters", _FIX)
            return v

        run_id, host = text("run_id"), text("host")
        if not run_id:
            raise BadInput("clock domain without a run_id", _FIX)
        source = d.get("run_id_source", "unknown")
        if source not in SOURCES:
            raise BadInput(f"clock domain: run_id_source {source!r:.40} is not one of "
                           f"{', '.join(SOURCES)}", _FIX)
        raw = d.get("anchors")
        if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_ANCHORS:
            raise BadInput(f"clock domain of {host!r:.40}: anchors are not a list of 1 to "
                           f"{MAX_ANCHORS} [mono_ns, real_ns, read_ns]", _FIX)
        anchors = []
        for x in raw:
            if not (isinstance(x, list) and len(x) == 3
                    and all(isinstance(v, int) and not isinstance(v, bool) for v in x)):
                raise BadInput(f"clock domain of {host!r:.40}: an anchor is not "
                               "[mono_ns, real_ns, read_ns] integers", _FIX)
            if not (0 <= x[0] <= INT64_MAX and 0 <= x[1] <= INT64_MAX
                    and 0 <= x[2] <= MAX_READ_NS):
                raise BadInput(f"clock domain of {host!r:.40}: anchor {x} out of range "
                               f"(times in [0, 2^63), read interval at most {MAX_READ_NS} ns)",
                               _FIX)
            anchors.append(Anchor(*x))
        if any(b.mono_ns <= a.mono_ns for a, b in zip(anchors, anchors[1:], strict=False)):
            raise BadInput(f"clock domain of {host!r:.40}: anchors not in increasing "
                           "monotonic order", _FIX)
        bound = d.get("sync_bound_ns")
        if bound is not None and (not isinstance(bound, int) or isinstance(bound, bool)
                                  or not 0 <= bound <= MAX_BOUND_NS):
            raise BadInput(f"clock domain of {host!r:.40}: sync_bound_ns {bound!r:.30} is not "
                           f"an integer in [0, {MAX_BOUND_NS}]", _FIX)
        return cls(run_id, host, text("boot_id", 64), text("timens", 64), tuple(anchors),
                   bound, source)


def local_domain(run_id: str, anchors: Sequence[Anchor], run_id_source: str = "unknown",
                 host: str | None = None) -> ClockDomain:
    """This node's domain for ``run_id`` with ``anchors`` (:func:`kept_anchors`) and the
    kernel's sync bound now."""
    return ClockDomain(run_id, host if host is not None else os.uname().nodename, boot_id(),
                       time_namespace(), kept_anchors(anchors), sync_bound_ns(), run_id_source)


def kept_anchors(anchors: Sequence[Anchor]) -> tuple[Anchor, ...]:
    """``anchors`` sorted by monotonic time, one per time, at most MAX_ANCHORS (the first, the
    last and an even spread between)."""
    kept: list[Anchor] = []
    for a in sorted(anchors, key=lambda x: x.mono_ns):
        if not kept or a.mono_ns > kept[-1].mono_ns:
            kept.append(a)
    if len(kept) > MAX_ANCHORS:
        step = len(kept) / (MAX_ANCHORS - 1)
        kept = [kept[min(int(i * step), len(kept) - 1)] for i in range(MAX_ANCHORS - 1)] \
            + [kept[-1]]
    return tuple(kept)
