"""Users read their runs through the daemon: QUERY answered, RESULT by RESULT.

The store is private to the daemon's user (:mod:`counterd.daemon.store`), so ``counterd runs``
and ``counterd report`` of a user who cannot read it ask the daemon over the marker socket
(:class:`counterd.protocol.Query`). The daemon answers from a read-only connection of its own
(:class:`Queries`, in the loop's thread), with the asking client's runs only, as SO_PEERCRED
says who it is, unless it is privileged (root, ``socket.allowed_group``), who may name any uid
or list everyone's runs. Each answer is one RESULT of at most a frame's worth of items and a
cursor; the client asks again from the cursor (:func:`ask`), so a large run streams through a
bounded buffer on both sides and the daemon keeps no state between pages.

Who can read the store file (root, the daemon's user) may pass ``--store`` and read it directly
(:func:`runs_from_store`, :func:`records_from_store`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
from collections.abc import Iterator, Mapping
from itertools import islice
from pathlib import Path
from typing import Any

from counterd import protocol
from counterd.daemon.auth import Peer
from counterd.daemon.store import RunRow, Store, StoreError, open_readonly
from counterd.errors import BadInput, CounterdError
from counterd.protocol import FrameType, ProtocolError
from counterd.records import SuperstepRecord

PAGE_SLACK_BYTES = 1024  # a RESULT's own fields, beside its items
PAGE_BYTES = 256 * 1024  # a RESULT's items at most (and max_frame): one page in a reply buffer
MAX_RESULT_BYTES = 64 * 1024 * 1024 + PAGE_SLACK_BYTES  # config's largest max_frame_bytes
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
            query = protocol.Query.decode(payload)
            if query.uid is not None and query.uid != peer.uid and not privileged:
                raise ProtocolError("forbidden", f"uid {peer.uid} may not read the runs of uid "
                                    f"{query.uid}: only root or members of "
                                    "socket.allowed_group may")
            store = self._open()
            budget = max(min(max_frame, PAGE_BYTES) - PAGE_SLACK_BYTES, 1)
            if query.what == "runs":
                return self._runs(store, query, peer, privileged, budget, version)
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
    def _runs(store: Store, query: protocol.Query, peer: Peer, privileged: bool, budget: int,
              version: int) -> bytes:
        uid = query.uid if query.uid is not None or privileged else peer.uid
        start = query.after[0] if query.after else 0
        if not isinstance(start, int) or start < 0:
            raise ProtocolError("bad_query", "a runs cursor is one offset")
        items: list[str] = []
        size = 0
        rows = store.runs(uid)
        for row in islice(rows, start, None):
            text = protocol.dumps_payload(dataclasses.asdict(row))
            if items and size + len(text) + 1 > budget:
                break
            items.append(text)
            size += len(text) + 1
        end = start + len(items)
        return protocol.encode_result(query.s, items, [end] if end < len(rows) else None,
                                      version=version)

    @staticmethod
    def _records(store: Store, query: protocol.Query, peer: Peer, privileged: bool,
                 budget: int, version: int) -> bytes:
        uid = query.uid if query.uid is not None or privileged else peer.uid
        if query.run_id is None:
            latest = store.latest(uid)
            if latest is None:
                raise ProtocolError("no_such_run", "no runs" + ("" if uid is None
                                                                else f" of uid {uid}"))
            owner, run_id = latest
        else:
            run_id = query.run_id
            found = store.run_uid(run_id, uid)
            if found is None:
                raise ProtocolError("no_such_run", f"no run {run_id!r}"
                                    + ("" if uid is None else f" of uid {uid}"))
            owner = found
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
        return protocol.encode_result(query.s, items, list(last) if more and last else None,
                                      owner, run_id, version)


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

    def send(self, frame: protocol.Hello | protocol.Query) -> None:
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
        timeout: float = 60.0) -> Iterator[protocol.Result]:
    """The RESULT pages answering a QUERY, asked page by page. Raises DaemonUnreachable, or
    BadInput with the daemon's reason when it refuses (a forbidden uid, no such run)."""
    conv = _Conversation(path, timeout)
    try:
        after: tuple[str | int, ...] | None = None
        while True:
            conv.seq += 1
            conv.send(protocol.Query(conv.seq, what, run_id, uid, after))
            ftype, payload = conv.reply()
            if ftype is FrameType.ERROR:
                err = protocol.Error.decode(payload)
                raise BadInput(f"counterd refused: {err.message}")
            if ftype is not FrameType.RESULT:
                raise CounterdError(f"counterd answered QUERY with {ftype.name}")
            try:
                page = protocol.Result.decode(payload)
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
