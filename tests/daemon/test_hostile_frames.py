"""Hostile frames, property-based: whatever a client sends, the daemon's side of the protocol
(:class:`~counterd.wire.protocol.Decoder`, :class:`~counterd.daemon.session.Session`) answers with a
protocol error for that client or accepts a record the store can hold, the writer's
thread never sees a record it cannot commit, and the metrics can still be rendered.

The sessions run in-process on a socket pair, with the real writer's queue and a real store
(the writer's thread is not started: the test commits what was queued itself).
"""

from __future__ import annotations

import json
import os
import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from counterd.daemon.auth import Authority, Peer
from counterd.daemon.collector import registry
from counterd.daemon.config import Limits
from counterd.daemon.metrics_state import MetricsState, Workload
from counterd.daemon.session import Session
from counterd.daemon.shared import Clients, Shared
from counterd.daemon.store import Store
from counterd.daemon.writer import Item, Writer
from counterd.data.records import SuperstepRecord
from counterd.wire import protocol
from counterd.wire.protocol import Decoder, FrameType, ProtocolError

SETTINGS = settings(max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])

# JSON values a hostile client can send: every type, huge and negative numbers, lone
# surrogates (hypothesis's text() includes them), nesting.
_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**80), 2**80),
                     st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20))
json_values = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)

# Raw JSON tokens json.dumps never writes but a client can.
_EVIL_TOKENS = ["NaN", "Infinity", "-Infinity", "1e400", "-1e999", '"\\ud800"', '"\\udfff x"',
                "[" * 5000, "1" * 5000, "10" + "0" * 30, "18446744073709551615", "-1", "true",
                "[]", "{}", '""']


class Harness:
    """One daemon's shared state, a store, and sessions on socket pairs."""

    def __init__(self, tmp: Path) -> None:
        self.state = MetricsState()
        self.writer = Writer(self.state, wake=lambda: None, stopping=threading.Event())
        self.shared = Shared(self.state, Authority(), self.writer, Clients(),
                             limits=Limits(max_bytes_per_client=1 << 20,
                                           max_bytes_per_uid=1 << 21,
                                           max_contexts_per_client=8,
                                           max_open_per_client=64))
        self.store = Store(tmp / "store.db", synchronous="normal")
        self.socks: list[socket.socket] = []
        self.queued = 0

    def errors(self) -> int:
        return sum(self.state.protocol_errors.values())

    def accounted(self, session: Session, errors_before: int, held_before: int,
                  out_before: int = 0) -> bool:
        """Whatever a client sent was refused (a protocol error counted), is waiting for the
        rest of its frame, was taken (an item queued for the writer, a superstep or context
        held), or was answered (a QUERY gets a RESULT or ERROR frame back; a SYNC an ACK,
        which the server's loop sends coalesced: owed here): never silently dropped."""
        return (self.errors() > errors_before or session.decoder.pending > 0
                or self.queued > 0 or len(session.begins) + len(session.contexts)
                > held_before or len(session.outbuf) > out_before
                or session.ack_wanted > session.ack_sent or session.deferred > 0)

    def session(self, uid: int = 1000) -> Session:
        ours, theirs = socket.socketpair()
        self.socks += [ours, theirs]
        ours.setblocking(False)
        theirs.setblocking(False)
        s = Session(1, ours, Peer(os.getpid(), uid, uid),
                    Decoder(protocol.MAX_FRAME_BYTES, protocol.ACCEPTED_VERSIONS), 0.0,
                    self.shared, lambda _s: None)
        s.handle(FrameType.HELLO, {"job": "hostile"})
        return s

    def feed(self, session: Session, data: bytes) -> None:
        """What the server does with received bytes (server.Server._on_readable)."""
        session.decoder.feed(data)
        while True:
            try:
                for ftype, payload in session.decoder.frames():
                    session.handle(ftype, payload)
                return
            except ProtocolError as exc:
                session.violation(exc.code, exc.message)
                if session.decoder.broken:
                    return

    def commit_queued(self) -> list[SuperstepRecord]:
        """Commit what the sessions queued, as the writer's thread would; every record must
        be one the store holds and JSON can write."""
        items: list[Item] = []
        while True:
            try:
                item = self.writer._queue.get_nowait()
            except Exception:
                break
            if isinstance(item, Item):
                items.append(item)
        self.queued = len(items)
        records = [(it.record, it.info) for it in items if it.record is not None
                   and it.info is not None]
        for rec, _ in records:  # what the writer gets is a record JSON and the store hold
            assert SuperstepRecord.from_json(json.loads(json.dumps(
                rec.to_json(), allow_nan=False).encode("utf-8"))) == rec
        self.store.commit(records, [])
        self.state.observe_records([(r, Workload(i.uid, i.job)) for r, i in records], 0.0)
        return [r for r, _ in records]

    def close(self) -> None:
        for s in self.socks:
            s.close()
        self.store.close()


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(tmp_path)
    yield h
    h.close()


def _json_frame(ftype: FrameType, body: bytes, version: int = 2) -> bytes:
    return protocol.HEADER.pack(len(body) + 2, version, ftype) + body


def _valid_record(**changes: object) -> dict[str, object]:
    rec = SuperstepRecord(run_id="r", index=0, name="s", rank=0, pid=1, cpu=0, begin_ns=10,
                          end_ns=20).to_json()
    rec.update(changes)
    return rec


@SETTINGS
@given(st.binary(max_size=512))
def test_random_bytes_are_protocol_errors(harness: Harness, data: bytes) -> None:
    session = harness.session()
    before = harness.errors()
    harness.feed(session, data)
    harness.commit_queued()
    assert not data or harness.accounted(session, before, 0)


@SETTINGS
@given(ftype=st.sampled_from(sorted(protocol.CLIENT_TYPES - {FrameType.OPEN,
                                                           FrameType.CLOSE})),
       payload=st.dictionaries(st.sampled_from(["s", "c", "pid", "tid", "run_id", "line",
                                                "rec", "count", "host", "backend",
                                                "counters", "job"]),
                               json_values, max_size=6))
@example(ftype=FrameType.SYNC, payload={"s": 1})  # answered by an ACK the loop sends later
def test_random_json_frames_are_refused_or_stored(harness: Harness, ftype: FrameType,
                                                  payload: dict[str, object]) -> None:
    session = harness.session()
    try:
        body = json.dumps(payload).encode("utf-8", "surrogatepass")
    except ValueError:
        return
    before, out = harness.errors(), len(session.outbuf)
    harness.feed(session, _json_frame(ftype, body))
    harness.commit_queued()
    assert harness.accounted(session, before, 0, out), (ftype, payload)


@SETTINGS
@given(field=st.sampled_from(["run_id", "index", "name", "rank", "pid", "cpu", "begin_ns",
                              "end_ns", "counters", "params", "flags", "unsupported",
                              "backend", "host", "exception"]),
       token=st.sampled_from(_EVIL_TOKENS), ftype=st.sampled_from([FrameType.RECORD,
                                                                   FrameType.BEGIN]))
def test_a_record_field_replaced_by_any_token(harness: Harness, field: str, token: str,
                                             ftype: FrameType) -> None:
    rec = _valid_record()
    marker = "\x00TOKEN\x00"
    rec[field] = marker
    inner = json.dumps(rec).replace(json.dumps(marker), token)
    key = "rec" if ftype is FrameType.RECORD else "line"
    body = f'{{"s":1,"{key}":{inner}}}'.encode("utf-8", "surrogatepass")
    session = harness.session()
    harness.feed(session, _json_frame(ftype, body))
    stored = harness.commit_queued()
    for r in stored:  # whatever was accepted is a valid record
        assert 0 <= r.index < 2**63 and 0 <= r.begin_ns < 2**63


@SETTINGS
@given(seq=st.integers(0, 2**64 - 1), ctx=st.integers(0, 0xFFFF),
       index=st.integers(0, 2**64 - 1), begin=st.integers(0, 2**64 - 1),
       end=st.integers(0, 2**64 - 1), flags=st.integers(0, 2**32 - 1),
       name=st.binary(max_size=8), tail=st.binary(max_size=64),
       values=st.lists(st.tuples(st.integers(0, 255), st.floats(), st.floats(),
                                 st.integers(-(2**63), 2**63 - 1)), max_size=3))
def test_random_binary_open_and_close(harness: Harness, seq: int, ctx: int, index: int,
                                      begin: int, end: int, flags: int, name: bytes,
                                      tail: bytes, values: list[tuple[int, float, float, int]]
                                      ) -> None:
    session = harness.session()
    harness.feed(session, protocol.Context(1, 1, "r", 1, "h", "none", ("a", "b", "c")
                                           ).encode())
    before = harness.errors()
    head = protocol.OPEN_HEAD.pack(seq, ctx, index, begin, 0, 0, len(name))
    harness.feed(session, _json_frame(FrameType.OPEN, head + name + tail))
    assert harness.accounted(session, before, 1)  # the context is held already
    before, held = harness.errors(), len(session.begins)
    counters = b"".join(struct.pack("!Bddq", *v) for v in values)
    close = protocol.CLOSE_HEAD.pack(seq + 1 if seq < 2**64 - 1 else seq, ctx, index, begin,
                                     end, flags, len(tail))
    harness.feed(session, _json_frame(FrameType.CLOSE, close + counters + tail))
    stored = harness.commit_queued()
    assert harness.errors() > before or (len(stored) == 1 and len(session.begins) < held)
    open_before = len(session.begins)
    session.close(incomplete=True)  # open supersteps become incomplete records
    assert len(harness.commit_queued()) == open_before


def test_the_reported_attacks_are_protocol_errors(harness: Harness) -> None:
    """Each payload that stopped or blinded the daemon (the Reliability issue): refused with
    an ERROR, nothing queued the store cannot hold, the metrics still render."""
    attacks = {
        "nesting before HELLO": b"[" * 100_000,
        "RECORD counters []": json.dumps({"s": 1, "rec": _valid_record(counters=[])}).encode(),
        "begin_ns Infinity": json.dumps({"s": 1, "rec": _valid_record()}).replace(
            '"begin_ns": 10', '"begin_ns": Infinity').encode(),
        "READ pid 1e400": b'{"s":1,"pid":1e400}',
        "BEGIN index 1e999": json.dumps({"s": 1, "line": _valid_record()}).replace(
            '"index": 0', '"index": 1e999').encode(),
        "RECORD name lone surrogate": json.dumps({"s": 1, "rec": _valid_record()}).replace(
            '"name": "s"', '"name": "\\ud800"').encode(),
        "RECORD name encoded surrogate": json.dumps({"s": 1, "rec": _valid_record()}).replace(
            '"name": "s"', '"name": "\xed\xa0\x80"').encode("latin-1"),
        "RECORD index 10**30": json.dumps({"s": 1, "rec": _valid_record(index=10**30)}
                                          ).encode(),
    }
    types = {"READ pid 1e400": FrameType.READ, "BEGIN index 1e999": FrameType.BEGIN}
    for name, body in attacks.items():
        session = harness.session()
        before = sum(harness.state.protocol_errors.values())
        harness.feed(session, _json_frame(types.get(name, FrameType.RECORD), body))
        assert sum(harness.state.protocol_errors.values()) > before, name
        assert harness.commit_queued() == [], name
    # OPEN and CLOSE of index 2^64 - 1, a HELLO job with a lone surrogate
    session = harness.session()
    harness.feed(session, protocol.Context(1, 1, "r", 1, "h", "none").encode())
    harness.feed(session, _json_frame(FrameType.OPEN, protocol.OPEN_HEAD.pack(
        2, 1, 2**64 - 1, 5, 0, 0, 0)))
    harness.feed(session, _json_frame(FrameType.CLOSE, protocol.CLOSE_HEAD.pack(
        3, 1, 2**64 - 1, 5, 6, 0, 0)))
    assert harness.state.protocol_errors["bad_begin"] >= 1
    assert harness.state.protocol_errors["unknown_begin"] >= 1
    ours, theirs = socket.socketpair()
    harness.socks += [ours, theirs]
    fresh = Session(2, ours, Peer(os.getpid(), 1000, 1000), Decoder(), 0.0, harness.shared,
                    lambda _s: None)
    harness.feed(fresh, _json_frame(FrameType.HELLO, b'{"job":"\\ud800x"}'))
    assert not fresh.hello and harness.state.protocol_errors["bad_json"] >= 1
    assert harness.commit_queued() == []
    # a valid record still goes through, and the metrics render
    good = harness.session()
    harness.feed(good, protocol.Record(5, SuperstepRecord("ok", 0, "s", 0, 1, 0, 1, 2)).encode())
    assert [r.run_id for r in harness.commit_queued()] == ["ok"]
    from prometheus_client import generate_latest

    assert b"counterd_" in generate_latest(registry(harness.state))


def test_an_exception_text_beyond_its_bounds_is_refused(harness: Harness) -> None:
    """A RECORD's exception (issue 34) is held to what the markers write: text, one line of
    printable characters, at most MAX_EXCEPTION_CHARS, with the flag exception; anything else
    is refused as a malformed record, as a name or param beyond its bounds is."""
    from counterd.data.records import MAX_EXCEPTION_CHARS

    raised = ["exception"]
    attacks = {
        "huge": _valid_record(flags=raised, exception="E" * 200_000),
        "one beyond": _valid_record(flags=raised, exception="E" * (MAX_EXCEPTION_CHARS + 1)),
        "a number": _valid_record(flags=raised, exception=3),
        "a list": _valid_record(flags=raised, exception=["ValueError"]),
        "an object": _valid_record(flags=raised, exception={"type": "ValueError"}),
        "a traceback": _valid_record(flags=raised, exception="Traceback:\n  File x\nE: y"),
        "a terminal escape": _valid_record(flags=raised, exception="E: \x1b[2J"),
        "without the flag": _valid_record(exception="ValueError: x"),
    }
    for name, rec in attacks.items():
        session = harness.session()
        before = harness.state.protocol_errors["bad_record"]
        body = json.dumps({"s": 1, "rec": rec}).encode()
        assert len(body) < protocol.MAX_FRAME_BYTES
        harness.feed(session, _json_frame(FrameType.RECORD, body))
        assert harness.state.protocol_errors["bad_record"] == before + 1, name
        assert harness.commit_queued() == [], name
    session = harness.session()  # a lone surrogate, as JSON escapes it
    harness.feed(session, _json_frame(FrameType.RECORD, json.dumps(
        {"s": 1, "rec": _valid_record(flags=raised, exception="E: \udc80")}).encode()))
    assert harness.commit_queued() == []
    good = _valid_record(flags=raised, exception="E" * MAX_EXCEPTION_CHARS)
    harness.feed(harness.session(), _json_frame(FrameType.RECORD,
                                                json.dumps({"s": 1, "rec": good}).encode()))
    assert [r.exception for r in harness.commit_queued()] == ["E" * MAX_EXCEPTION_CHARS]


def test_limits_refuse_what_would_be_held_beyond_them(harness: Harness) -> None:
    session = harness.session()
    big = {"p": "x" * 4000}
    for i in range(300):  # 300 supersteps of ~4 KB: beyond 64 open
        harness.feed(session, protocol.encode_open(i + 1, 1, i, 5, 0, 0, "s", big))
    harness.feed(session, protocol.Context(1000, 1, "r", 1, "h", "none").encode())
    for i in range(300):
        harness.feed(session, protocol.encode_open(1001 + i, 1, i, 5, 0, 0, "s", big))
    assert len(session.begins) == 64
    assert harness.state.protocol_errors["too_many_open"] > 0
    assert session.held == harness.shared.held[1000] < 1 << 20
    for c in range(2, 20):
        harness.feed(session, protocol.Context(2000 + c, c, f"run{c}", 1, "h", "none").encode())
    assert len(session.contexts) == 8 and harness.state.protocol_errors["too_many_contexts"]
    session.close(incomplete=False)
    assert 1000 not in harness.shared.held  # released at close
