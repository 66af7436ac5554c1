"""Users read their runs through the daemon: QUERY answered, RESULT by RESULT.

The store is private to the daemon's user (:mod:`counterd.daemon.store`), so ``counterd runs``
and ``counterd report`` of a user who cannot read it ask the daemon over the marker socket
(:class:`counterd.wire.query_frames.Query`). The daemon answers from a read-only connection of
its own (:class:`Queries`, in a thread of its own: :class:`QueryWorker`), with the asking client's
runs only, as SO_PEERCRED says who it is, unless it is privileged (root,
``socket.allowed_group``), who may name any uid or list everyone's runs. Each answer is one
RESULT of at most a frame's worth of items and a cursor; the client asks again from the cursor
(:func:`ask`), so a large run streams through a bounded buffer on both sides and the daemon
keeps no state between pages. A page is a range of an index (keyset pagination: the cursor is
the last key sent), so a page costs the same wherever it starts, and a cursor past the end
costs one index probe.

Who can read the store file (root, the daemon's user) may pass ``--store`` and read it directly
(:func:`runs_from_store`, :func:`records_from_store`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import socket
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from counterd.daemon.auth import Peer
from counterd.daemon.store import RunKey, RunRow, Store, open_readonly
from counterd.data.errors import BadInput, CounterdError, StoreError
from counterd.data.records import SuperstepRecord
from counterd.wire import protocol, query_frames
from counterd.wire.protocol import FrameType, ProtocolError

if TYPE_CHECKING:
    from counterd.data.clocks import ClockDomain

PAGE_SLACK_BYTES = 1024  # a RESULT's own fields, beside its items
PAGE_BYTES = 256 * 1024  # a RESULT's items at most (and max_frame): one page in a reply buffer
MAX_RESULT_BYTES = 64 * 1024 * 1024 + PAGE_SLACK_BYTES  # config's largest max_frame_bytes
log = logging.getLogger("counterd.daemon")

RUNS_PER_SELECT = 256  # runs read per SELECT of a runs page (keyset: an index range each)
_RUN_FIELDS = tuple(f.name for f in dataclasses.fields(RunRow))


class Queries:
    """The daemon's answers to QUERY frames, from a read-only connection to the store at
    ``path`` (opened at the first QUERY; None: the daemon has no store to answer from)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._store: Store | None = None

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None

    def answer(self, payload: Mapping[str, Any], peer: Peer, privileged: bool, version: int,
               max_frame: int) -> bytes:
        """The RESULT (or ERROR) frame answering a QUERY from ``peer``."""
        seq = payload.get("s")
        seq = seq if isinstance(seq, int) and not isinstance(seq, bool) else None
        try:
            query = query_frames.Query.decode(payload)
            if query.uid is not None and query.uid != peer.uid and not privileged:
                raise ProtocolError("forbidden", f"uid {peer.uid} may not read the runs of uid "
                                    f"{query.uid}: only root or members of "
                                    "socket.allowed_group may")
            store = self._open()
            budget = max(min(max_frame, PAGE_BYTES) - PAGE_SLACK_BYTES, 1)
            if query.what == "runs":
                return self._runs(store, query, peer, privileged, budget, version)
            if query.what == "clock":
                return self._clock(store, query, peer, privileged, version)
            return self._records(store, query, peer, privileged, budget, version)
        except ProtocolError as exc:
            return protocol.Error(exc.code, exc.message, seq).encode(version)
        except CounterdError as exc:  # BadInput (an ambiguous run id), StoreError
            return protocol.Error("unavailable" if isinstance(exc, StoreError)
                                  else "bad_query", str(exc), seq).encode(version)

    def _open(self) -> Store:
        if self._store is None:
            if self.path is None:
                raise ProtocolError("unavailable", "this daemon has no store")
            self._store = open_readonly(self.path)
        return self._store

    @staticmethod
    def _runs(store: Store, query: query_frames.Query, peer: Peer, privileged: bool, budget: int,
              version: int) -> bytes:
        uid = query.uid if query.uid is not None or privileged else peer.uid
        after: RunKey | None = None
        if query.after is not None:
            first, run_id, owner = (*query.after, None, None, None)[:3]
            if len(query.after) != 3 or not (isinstance(first, int) and isinstance(run_id, str)
                                             and isinstance(owner, int)):
                raise ProtocolError("bad_query", "a runs cursor is [first_seen_ns, run_id, "
                                    "uid], as the previous RESULT gave it")
            after = (first, run_id, owner)
        items: list[str] = []
        size = 0
        last: RunKey | None = None
        while True:  # pages of RUNS_PER_SELECT rows until the frame is full or no run is left
            rows = store.runs(uid, after, RUNS_PER_SELECT)
            for row in rows:
                text = protocol.dumps_payload(dataclasses.asdict(row))
                if items and size + len(text) + 1 > budget:
                    return query_frames.encode_result(query.s, items, list(last) if last else None,
                                                  version=version)
                items.append(text)
                size += len(text) + 1
                last = row.key()
            if len(rows) < RUNS_PER_SELECT:
                return query_frames.encode_result(query.s, items, None, version=version)
            after = last

    @staticmethod
    def _clock(store: Store, query: query_frames.Query, peer: Peer, privileged: bool,
               version: int) -> bytes:
        """The run's clock domains, one per host of its records (a handful: one RESULT)."""
        owner, run_id = Queries._run_of(store, query, peer, privileged)
        items = []
        for host in store.run_hosts(run_id, owner)[:64]:
            domain, _ = store.clock_domain(run_id, owner, host)
            if domain is not None:
                items.append(protocol.dumps_payload(domain.to_json()))
        return query_frames.encode_result(query.s, items, None, owner, run_id, version)

    @staticmethod
    def _run_of(store: Store, query: query_frames.Query, peer: Peer, privileged: bool
                ) -> tuple[int, str]:
        """(owner uid, run id) a records or clock QUERY names (the latest run if none)."""
        uid = query.uid if query.uid is not None or privileged else peer.uid
        if query.run_id is None:
            latest = store.latest(uid)
            if latest is None:
                raise ProtocolError("no_such_run", "no runs" + ("" if uid is None
                                                                else f" of uid {uid}"))
            return latest
        found = store.run_uid(query.run_id, uid)
        if found is None:
            raise ProtocolError("no_such_run", f"no run {query.run_id!r}"
                                + ("" if uid is None else f" of uid {uid}"))
        return found, query.run_id

    @staticmethod
    def _records(store: Store, query: query_frames.Query, peer: Peer, privileged: bool,
                 budget: int, version: int) -> bytes:
        owner, run_id = Queries._run_of(store, query, peer, privileged)
        after: tuple[str, int, int] | None = None
        if query.after is not None:
            host, pid, index = (*query.after, None, None, None)[:3]
            if len(query.after) != 3 or not (isinstance(host, str) and isinstance(pid, int)
                                             and isinstance(index, int)):
                raise ProtocolError("bad_query", "a records cursor is [host, pid, index]")
            after = (host, pid, index)
        items: list[str] = []
        size = 0
        last: tuple[str, int, int] | None = None
        more = False
        with contextlib.closing(store.record_bodies(owner, run_id, after)) as rows:
            for key, body in rows:
                if items and size + len(body) + 1 > budget:
                    more = True
                    break
                items.append(body)
                size += len(body) + 1
                last = key
        return query_frames.encode_result(query.s, items, list(last) if more and last else None,
                                      owner, run_id, version)


class QueryWorker:
    """Answers QUERY frames off the loop's thread: a QUERY reads the store (a page may count a
    large run's records), and the loop must not wait for it. ``submit`` queues one for a
    connection (the session waits for its answer before it handles the next frame: one query
    in flight per connection); the worker answers them round-robin between uids (one uid's
    connections cannot queue ahead of another's), then hands each answer back
    (:meth:`take_answers`) after waking the loop (``wake``)."""

    def __init__(self, queries: Queries, wake: Callable[[], None]) -> None:
        self.queries = queries
        self._wake = wake
        self._cond = threading.Condition()
        self._waiting: dict[int, deque[_Asked]] = {}  # uid -> queries, in the uids' turn
        self._answers: list[tuple[int, bytes]] = []
        self._stop = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="counterd-queries", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.queries.close()

    def submit(self, cid: int, payload: Mapping[str, Any], peer: Peer, privileged: bool,
               version: int, max_frame: int) -> None:
        with self._cond:
            self._waiting.setdefault(peer.uid, deque()).append(
                _Asked(cid, payload, peer, privileged, version, max_frame))
            self._cond.notify()

    def take_answers(self) -> list[tuple[int, bytes]]:
        """(connection id, RESULT or ERROR frame) answered since the last call."""
        with self._cond:
            answers, self._answers = self._answers, []
        return answers

    def next_query(self) -> _Asked | None:
        """The next query to answer (None: none waits): the first of the uid whose turn it
        is, that uid's turn then going to the back."""
        with self._cond:
            for uid in self._waiting:
                queue = self._waiting.pop(uid)
                asked = queue.popleft()
                if queue:
                    self._waiting[uid] = queue  # back of the line
                return asked
        return None

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._stop:
                    self._cond.wait()
                if self._stop:
                    return
            asked = self.next_query()
            if asked is None:
                continue
            try:
                answer = self.queries.answer(asked.payload, asked.peer, asked.privileged,
                                             asked.version, asked.max_frame)
            except Exception as exc:  # a bug: that query fails, the worker goes on
                log.exception("answering a QUERY of uid %d", asked.peer.uid)
                answer = protocol.Error("unavailable", f"the daemon could not answer ({exc})",
                                        asked.payload.get("s") if isinstance(
                                            asked.payload.get("s"), int) else None
                                        ).encode(asked.version)
            with self._cond:
                self._answers.append((asked.cid, answer))
            self._wake()


@dataclasses.dataclass(frozen=True)
class _Asked:
    cid: int
    payload: Mapping[str, Any]
    peer: Peer
    privileged: bool
    version: int
    max_frame: int


# -- the client side: counterd runs / counterd report -------------------------------------------
class _Conversation:
    """A connection to the daemon that only asks queries."""

    def __init__(self, path: Path, timeout: float) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(str(path))
        except OSError as exc:
            self.sock.close()
            raise DaemonUnreachable(path, exc.strerror or str(exc)) from None
        self.decoder = protocol.Decoder(MAX_RESULT_BYTES)
        self.seq = 0
        self.send(protocol.Hello(pid=os.getpid(), job="counterd-query"))
        ftype, _ = self.reply()
        if ftype is not FrameType.WELCOME:
            raise CounterdError(f"counterd at {path} answered HELLO with {ftype.name}")

    def send(self, frame: protocol.Hello | query_frames.Query) -> None:
        try:
            self.sock.sendall(frame.encode())
        except OSError as exc:
            raise CounterdError(f"lost the connection to counterd at {self.path}: {exc}") \
                from None

    def reply(self) -> tuple[FrameType, Any]:
        try:
            while True:
                for frame in self.decoder.frames():
                    return frame
                data = self.sock.recv(1 << 20)
                if not data:
                    raise CounterdError(f"counterd at {self.path} closed the connection")
                self.decoder.feed(data)
        except ProtocolError as exc:
            raise CounterdError(f"counterd at {self.path} sent a malformed reply: {exc}") \
                from None
        except OSError as exc:
            raise CounterdError(f"lost the connection to counterd at {self.path}: {exc}") \
                from None

    def close(self) -> None:
        self.sock.close()


class DaemonUnreachable(CounterdError):
    """No daemon answers at the socket."""

    def __init__(self, path: Path, why: str) -> None:
        self.path = path
        super().__init__(f"cannot reach counterd at {path} ({why})",
                         "start counterd run, or pass --store PATH if you may read the store")


def ask(path: Path, what: str, run_id: str | None = None, uid: int | None = None,
        timeout: float = 60.0) -> Iterator[query_frames.Result]:
    """The RESULT pages answering a QUERY, asked page by page. Raises DaemonUnreachable, or
    BadInput with the daemon's reason when it refuses (a forbidden uid, no such run)."""
    conv = _Conversation(path, timeout)
    try:
        after: tuple[str | int, ...] | None = None
        while True:
            conv.seq += 1
            conv.send(query_frames.Query(conv.seq, what, run_id, uid, after))
            ftype, payload = conv.reply()
            if ftype is FrameType.ERROR:
                err = protocol.Error.decode(payload)
                raise BadInput(f"counterd refused: {err.message}")
            if ftype is not FrameType.RESULT:
                raise CounterdError(f"counterd answered QUERY with {ftype.name}")
            try:
                page = query_frames.Result.decode(payload)
            except ProtocolError as exc:
                raise CounterdError(f"counterd sent a malformed RESULT: {exc}") from None
            yield page
            if page.after is None:
                return
            after = page.after
    finally:
        conv.close()


def runs_via_daemon(path: Path, uid: int | None = None) -> list[RunRow]:
    """The runs the daemon at socket ``path`` shows this user (all, for privileged users)."""
    rows: list[RunRow] = []
    for page in ask(path, "runs", uid=uid):
        for item in page.items:
            try:
                rows.append(RunRow(**{k: item[k] for k in _RUN_FIELDS}))
            except (KeyError, TypeError) as exc:
                raise CounterdError(f"counterd sent a malformed run row ({exc})") from None
    return rows


def records_via_daemon(path: Path, run_id: str | None, uid: int | None = None
                       ) -> tuple[list[SuperstepRecord], str]:
    """Run ``run_id``'s records (None: the latest run) as the daemon at ``path`` gives them to
    this user, and the source to name in the report."""
    records: list[SuperstepRecord] = []
    source = f"counterd at {path}"
    for page in ask(path, "records", run_id, uid):
        source = f"counterd at {path} run {page.run_id} (uid {page.uid})"
        for item in page.items:
            records.append(SuperstepRecord.from_json(item))  # BadInput for a bad one
    if not records:
        raise BadInput(f"no records in run {run_id!r}", "see counterd runs for the run ids")
    records.sort(key=lambda r: (r.index, r.rank, r.pid))
    return records, source


def clock_via_daemon(path: Path, run_id: str, uid: int | None = None
                     ) -> tuple[list[ClockDomain], str]:
    """Run ``run_id``'s clock domains as the daemon at ``path`` gives them ([] and why
    from a daemon before them)."""
    from counterd.data.clocks import ClockDomain

    try:
        pages = list(ask(path, "clock", run_id, uid))
    except BadInput as exc:
        if "not one of" in exc.what:
            return [], "the daemon is older than clock domains (upgrade it)"
        raise
    domains = [ClockDomain.from_json(item) for page in pages for item in page.items]
    return domains, "" if domains else "the daemon took no clock anchors for this run"


def export_run(path: Path | None, socket_path: Path | None, run_id: str | None,
               uid: int | None = None) -> tuple[list[SuperstepRecord], list[ClockDomain],
                                                list[str]]:
    """A run's records and clock domains (the file convention of ``counterd report --records
    a b ...``) from the store file ``path`` or else the daemon at ``socket_path``, and what
    could not be anchored (one line each)."""

    why: list[str] = []
    domains: list[ClockDomain] = []
    if path is not None:
        records, _ = records_from_store(path, run_id, uid)
        store = open_readonly(path)
        try:
            owner = store.run_uid(records[0].run_id, uid)
            for host in sorted({r.host for r in records}):
                d, reason = store.clock_domain(records[0].run_id, owner or 0, host)
                if d is None:
                    why.append(f"{host}: {reason}")
                else:
                    domains.append(d)
        finally:
            store.close()
        return records, domains, why
    assert socket_path is not None
    records, _ = records_via_daemon(socket_path, run_id, uid)
    domains, reason = clock_via_daemon(socket_path, records[0].run_id, uid)
    return records, domains, [reason] if reason else []


def runs_from_store(path: Path, uid: int | None = None) -> list[RunRow]:
    """The runs in a store file this user may read (root, the daemon's user)."""
    store = open_readonly(path)
    try:
        return store.runs(uid)
    finally:
        store.close()


def records_from_store(path: Path, run_id: str | None, uid: int | None = None
                       ) -> tuple[list[SuperstepRecord], str]:
    """Run ``run_id``'s records (None: the latest run) of ``uid`` (None: whoever has that run
    id; BadInput when several users do) from a store file, and the source to name."""
    store = open_readonly(path)
    try:
        if run_id is None:
            latest = store.latest(uid)
            if latest is None:
                raise BadInput(f"the store {path} holds no runs",
                               "record a program while the daemon runs first; counterd "
                               "report also reads a records file (--records FILE)")
            uid, run_id = latest
        records = store.records(run_id, uid)
    finally:
        store.close()
    if not records:
        raise BadInput(f"no run {run_id!r} in {path}", "see counterd runs for the run ids")
    return records, f"{path} run {run_id}"
