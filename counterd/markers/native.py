"""The markers' compiled hot path: a thread's lane (counterd/_native/hotpath_src/).

Where the ``_hotpath`` extension is built (and ``COUNTERD_NATIVE`` is not ``0``), a thread whose
markers need nothing but a clock, its CPU, one perf group read and a store gets a *lane*: its
``begin`` and ``end`` run in compiled code, with no Python objects built on the way, and write
the same things the Python path writes (the same steps in memory, the same OPEN and CLOSE
frames in the spool's mapping). Everything the lane does not do itself it hands back to the
Python recorder, which stays the one definition of a record: materialising records, params
that need cleaning, ends that match nothing, a read of another layout, a spool that cannot grow.

A lane reads its perf group in user space where the kernel allows it: ``rdpmc`` on each
member's mmap page, the self-monitoring read that include/uapi/linux/perf_event.h documents,
when every member's page allows user-space reads and time, in the thread whose counters they
are, while they are on the PMU; with one ``read(2)`` of the leader otherwise (software events
never allow it). ``Lane.user_read_off`` says why a lane reads by ``read(2)`` only, and
``counterd probe`` prints it for the markers' counters.

What a lane writes into, and where the steps it closed go, its sink says
(:meth:`counterd.markers.sinks.base.Sink.lane_args`): memory, the spool's mapping, or under the
daemon's socket the client's black box (:class:`counterd.markers.sinks.socket.SocketSink`),
which leaves in batches; a step it closed goes to the sink, held until the daemon acknowledges
it. This module imports the sink interface and :mod:`counterd.markers.step` only: the recorder
and the API above it are reached through what they pass (``step.Owner``, :func:`track`).

A thread gets no lane, and keeps the Python path, for: the sim, papi and callgrind backends
(streams to simulate, a library's read, counter dumps), perf groups split over several kernel
groups or opened with ``inherit``, a backend that failed (its records say why), a daemon that
takes no black box (or none connected when the thread first marks), and a spool written as
JSON lines.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, Protocol

from counterd import _native
from counterd.data.records import MAX_NAME_CHARS, MAX_PARAMS, MAX_VALUE_CHARS, exception_text
from counterd.markers import identity, sampling
from counterd.markers.sinks.base import Sink
from counterd.markers.step import Owner, ThreadState, clean_marker
from counterd.wire import framing as protocol  # the framing, not the typed frames: cheap to import


class LaneOwner(Owner, Protocol):
    """What a lane reads of its recorder (:class:`counterd.markers.recorder.Recorder`), once,
    when it is made; the lane calls back ``_end_python``, ``_unmatched_end`` and
    ``_materialise`` (counterd/_native/hotpath_src/)."""

    sink: Sink
    sample: sampling.Sampling | None
    backend_name: str
    _native: Any  # the callgrind client library: its markers are counter dumps, no lane
    _indices: Any  # the process's superstep numbers (a hot.Counter where lanes may share it)
    _ctx: identity.Ctx

    def rank(self) -> int: ...


def module() -> Any:
    """The extension, set up with the wire and record constants; None where it is not used."""
    hot = _native.hotpath()
    if hot is not None and not _ready:
        _setup(hot)
    return hot


_ready = False


def _setup(hot: Any) -> None:
    global _ready
    bit = protocol.FLAG_BIT
    hot.setup(version=protocol.PROTOCOL_VERSION, open_type=int(protocol.FrameType.OPEN),
              close_type=int(protocol.FrameType.CLOSE), nested=bit["nested"],
              exception=bit["exception"], multiplexed=bit["multiplexed"],
              migrated=bit["migrated"], sampled=bit["sampled"],
              sampled_source=protocol.SOURCE_INDEX["sampled"], max_name=MAX_NAME_CHARS,
              max_params=MAX_PARAMS, max_value=MAX_VALUE_CHARS, flags_of=protocol.bit_flags,
              basis=sampling.Basis, max_names=sampling.MAX_NAMES,
              exception_text=exception_text)
    _ready = True


def _nobody() -> object:
    return None


_current: Callable[[], object] = _nobody  # the process's recorder, as the API keeps it


def track(current: Callable[[], object]) -> None:
    """``current()`` is the process's recorder (:mod:`counterd.markers.api` gives it, once):
    only its lanes take ``superstep()``."""
    global _current
    _current = current


def set_current(rec: object) -> None:
    """``rec`` is now the process's recorder (counterd.markers.api's): only its lanes take
    ``superstep()`` from now on."""
    hot = sys.modules.get("counterd._native._hotpath")
    if hot is not None:
        hot.set_current(rec)


def invalidate() -> None:
    """Every thread's current lane forgotten: each thread's next ``superstep()`` goes through
    the Python recorder once, which installs the thread's lane again (for whoever changes a
    thread's state by hand, as tests do)."""
    # The module as loaded, whatever COUNTERD_NATIVE says now: lanes made before it changed
    # must be forgotten too.
    hot = sys.modules.get("counterd._native._hotpath")
    if hot is not None:
        hot.invalidate()


def indices() -> Any:
    """A process's superstep numbers: shared by its lanes and its Python path."""
    hot = module()
    if hot is None:
        import itertools

        return itertools.count()
    return hot.Counter()


def attach(rec: LaneOwner, st: ThreadState) -> Any:
    """A lane for thread state ``st`` of ``rec`` (its counters opened, its context fixed), or
    None where the Python path must serve it (see the module docstring). A lane of the
    process's recorder becomes the calling thread's current one (``superstep()`` begins
    through it without passing through Python); another recorder's is only called directly."""
    hot = module()
    if hot is None or rec._native is not None or not isinstance(rec._indices, hot.Counter):
        return None
    counters = _counters(rec, st)
    if counters is None:
        return None
    fd, fds, ids, perm, names, decode, group_unsupported = counters
    unsupported = dict(st.unsupported)
    unsupported.update(group_unsupported)  # as step.parts joins them
    sink = rec.sink
    kw = sink.lane_args(rec._ctx, names)  # what the lane writes into, where its steps go
    if kw is None:
        return None
    tail = protocol.dumps_payload(unsupported).encode() if unsupported else b""
    if len(tail) > 0xFFFF:
        return None
    sample = rec.sample if names else None  # nothing to sample without counters
    install = _installs(rec)
    lane = hot.Lane(recorder=rec, indices=rec._indices,
                    rank=st.rank if st.rank is not None else rec.rank(), fd=fd, ids=ids,
                    perm=perm, delta=st.delta, decode=decode, unsupported=st.unsupported,
                    clean=clean_marker, ctx=rec._ctx, close_tail=tail,
                    close_flags=protocol.FLAG_BIT["unsupported_counters"] if unsupported else 0,
                    install=install, sample_below=sample.below_ns if sample else 0,
                    sample_every=sample.every if sample else 1, names=names,
                    group_unsupported=dict(group_unsupported), fds=fds, **kw)
    sink.lane_made(lane)  # the daemon's: its open steps are begun again on a new connection
    if install:
        lane.install()
    return lane


def _installs(rec: LaneOwner) -> bool:
    """Whether ``rec``'s lanes may take ``superstep()``: only the process's own recorder's
    (another Recorder, a scratch one or a forked child's copy of its parent's, is called
    directly)."""
    return _current() is rec and rec.pid == identity.pid


def _counters(rec: LaneOwner, st: ThreadState
              ) -> tuple[int, tuple[int, ...] | None, tuple[int, ...], tuple[int, ...],
                         tuple[str, ...], Any, dict[str, str]] | None:
    """The lane's view of the thread's counters: the group leader's fd, its members' fds and
    event ids in the kernel's order (the lane maps each member's page and reads them in user
    space where the kernel allows it), the CLOSE's counter order as positions in that order,
    the CLOSE's counter names, the group's decoder for a read of another layout and the
    group's unsupported counters; None where a lane cannot read them."""
    group = st.group
    if group is None:
        if rec.backend_name != "none":
            return None  # a backend that could not count: the Python path says why per record
        return -1, None, (), (), (), None, {}
    from counterd.backends.perf.group import PerfGroup

    single = getattr(group, "_single", None)
    if not isinstance(group, PerfGroup) or single is None or group.closed \
            or st.read != group.read_raw or single.n > 64 or min(single.ids, default=0) < 0:
        return None
    zero = (0,) * (2 + single.n)
    values, group_unsupported = group.delta_raw(zero, zero)  # names in the order records list them
    names = tuple(values)
    perm = tuple(single.names.index(n) for n in names)
    return (single.leader, tuple(single.fds), tuple(single.ids), perm, names, group._decode,
            dict(group_unsupported))
