"""Fair service and per-uid quotas (the Reliability issue, items 1 and 3), deterministically:
the loop's per-turn bounds, round-robin between uids, black boxes read a slice per turn, a
congested uid left waiting, SYNC and scratch CLOSE acknowledged without the writer, QUERY
answered off the loop, the run listing's keyset pages, the store's per-uid usage, and the
quota and reserve refusals. The server runs in-process on socket pairs (no threads: each test
turns the loop itself); the floods themselves are bench/attacks.py's "fairness and quotas".
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from counterd.daemon import quota, server
from counterd.daemon.auth import Authority, Peer
from counterd.daemon.config import Limits
from counterd.daemon.metrics_state import MetricsState
from counterd.daemon.query import Queries, QueryWorker
from counterd.daemon.quota import Usage
from counterd.daemon.server import RoundRobin, Server
from counterd.daemon.session import Session
from counterd.daemon.shared import Clients, Shared
from counterd.daemon.store import RunAnchor, RunInfo, Store
from counterd.daemon.writer import Item, Writer
from counterd.data.records import SuperstepRecord
from counterd.wire import protocol, query_frames
from counterd.wire.protocol import FrameType
from counterd.wire.spool import BOX_MAGIC, HEAD_BYTES
from tests.daemon import _queries

F = FrameType


def rec(index: int, run: str = "r", pid: int = 1, name: str = "s") -> SuperstepRecord:
    return SuperstepRecord(run_id=run, index=index, name=name, rank=0, pid=pid, cpu=0,
                           begin_ns=10 + index, end_ns=20 + index, host="h")


class Loop:
    """A Server with its sessions on socket pairs; the writer's queue is read by the test."""

    def __init__(self, limits: Limits | None = None) -> None:
        state = MetricsState()
        self.writer = Writer(state, wake=lambda: None, stopping=threading.Event())
        self.shared = Shared(state, Authority(), self.writer, Clients(),
                             limits=limits or Limits())
        self.server = Server(self.shared)
        self.clients: list[socket.socket] = []

    def connect(self, uid: int, **hello: object) -> tuple[Session, socket.socket]:
        ours, theirs = socket.socketpair()
        self.clients.append(theirs)
        session = self.server.adopt(ours, Peer(os.getpid(), uid, uid))
        theirs.sendall(protocol.encode(F.HELLO, {"pid": os.getpid(), "job": "t", **hello}))
        return session, theirs

    def queued(self) -> list[Item]:
        return [it for it in self.queued_all() if isinstance(it, Item)]

    def queued_all(self) -> list[object]:
        """Everything queued to the writer (records, anchors, samples), taken off its queue."""
        items = []
        while True:
            try:
                items.append(self.writer._queue.get_nowait())
            except Exception:
                return items

    def close(self) -> None:
        for s in list(self.server._sessions.values()):
            s.close(incomplete=False)
        for c in self.clients:
            c.close()
        self.server.close()


@pytest.fixture
def loop() -> Iterator[Loop]:
    lp = Loop()
    yield lp
    lp.close()


def syncs(first: int, n: int) -> bytes:
    return b"".join(protocol.encode(F.SYNC, {"s": s}) for s in range(first, first + n))


def replies(sock: socket.socket) -> list[tuple[FrameType, dict]]:
    dec = protocol.Decoder(1 << 24, protocol.ACCEPTED_VERSIONS)
    sock.setblocking(False)
    try:
        while True:
            dec.feed(sock.recv(1 << 20))
    except BlockingIOError:
        pass
    return list(dec.frames())


# -- the loop's bounds ----------------------------------------------------------------------
def test_a_turn_handles_at_most_a_slice_of_one_connection(loop: Loop) -> None:
    """1000 SYNCs sent at once: one turn handles at most SLICE_FRAMES frames of them (HELLO
    counts), the next turn the next slice, until all are acknowledged; the socket is read
    again only once the frames read are handled."""
    session, client = loop.connect(1000)
    client.sendall(syncs(1, 1000))
    loop.server.poll(0)  # reads (once) and serves one turn
    first = session.last_seq
    assert 0 < first <= server.SLICE_FRAMES - 1
    assert session.queued and not session.reading
    turns = 1
    while session.last_seq < 1000:
        before = session.last_seq
        loop.server.poll(0)
        assert 0 < session.last_seq - before <= server.SLICE_FRAMES
        turns += 1
    assert turns >= 1000 // server.SLICE_FRAMES
    assert session.ack_wanted == 1000 and loop.queued() == []  # SYNCs never reach the writer
    assert max(p["s"] for t, p in replies(client) if t is F.ACK) == 1000


def test_round_robin_between_uids_not_connections(loop: Loop) -> None:
    """Uid 1000 with 8 busy connections, uid 1001 with one: each turn serves one connection
    of each uid, so uid 1001's frames advance every turn while uid 1000's connections take
    turns among themselves."""
    many = [loop.connect(1000) for _ in range(8)]
    one, client = loop.connect(1001)
    for _, c in many:
        c.sendall(syncs(1, 500))
    client.sendall(syncs(1, 500))
    loop.server.poll(0)
    for _ in range(4):
        before = [s.last_seq for s, _ in many]
        mine = one.last_seq
        loop.server.turn()
        moved = [s.last_seq - b for (s, _), b in zip(many, before, strict=True)]
        assert sum(1 for m in moved if m) == 1  # one connection of uid 1000 per turn
        assert one.last_seq > mine  # uid 1001 every turn


def test_round_robin_order() -> None:
    """RoundRobin.turn: the first session of each uid, uids in turn; a skipped uid waits."""

    class S:
        def __init__(self, uid: int, name: str) -> None:
            self.uid, self.name, self.queued = uid, name, False

    rr = RoundRobin()
    a1, a2, a3, b1 = S(1, "a1"), S(1, "a2"), S(1, "a3"), S(2, "b1")
    for s in (a1, a2, a3, b1):
        rr.add(s)  # type: ignore[arg-type]
    rr.add(a1)  # type: ignore[arg-type]  # queued once
    assert [s.name for s in rr.turn(lambda uid: False)] == ["a1", "b1"]
    assert [s.name for s in rr.turn(lambda uid: uid == 1)] == []
    assert rr.ready(lambda uid: False) and not rr.ready(lambda uid: uid == 1)
    assert [s.name for s in rr.turn(lambda uid: False)] == ["a2"]
    rr.discard(a3)  # type: ignore[arg-type]
    assert len(rr) == 0 and rr.turn(lambda uid: False) == []


def test_a_congested_uid_waits_for_the_writer(loop: Loop) -> None:
    """A uid with INFLIGHT_RECORDS records queued for the writer is not served (its frames
    stay in its socket); another uid is; once the writer commits, the first is served."""
    busy, c1 = loop.connect(1000)
    other, c2 = loop.connect(1001)
    usage = loop.writer.usage
    for _ in range(quota.INFLIGHT_RECORDS):
        usage.queued(1000, 10)
    c1.sendall(syncs(1, 10))
    c2.sendall(syncs(1, 10))
    loop.server.poll(0)
    loop.server.poll(0)
    assert busy.last_seq == 0 and other.last_seq == 10
    for _ in range(quota.INFLIGHT_RECORDS):
        usage.done(1000, 10)
    loop.server.poll(0)
    assert busy.last_seq == 10


def _box(frames: bytes, base: int) -> int:
    fd = os.memfd_create("t-box", os.MFD_CLOEXEC)
    os.write(fd, struct.pack("<8sQQQ", BOX_MAGIC, len(frames), base, 7).ljust(HEAD_BYTES, b"\0")
             + frames)
    return fd


def test_a_black_box_is_read_a_slice_per_turn_after_the_end(loop: Loop) -> None:
    """A connection ends with 300 KiB of SYNCs and one RECORD unsent in its black box: each
    turn reads at most SLICE_BYTES of it, the SYNCs are skipped unread, the RECORD reaches the
    writer, and the session closes when the box is read."""
    session, client = loop.connect(1000)
    hello_len = len(protocol.encode(F.HELLO, {"pid": os.getpid(), "job": "t"}))
    buffer = protocol.encode(F.BUFFER, {"s": 1, "box": 7})
    body = syncs(2, 300 * 1024 // 14) + protocol.encode(
        F.RECORD, {"s": 10**6, "rec": rec(0, "boxed").to_json()})
    fd = _box(body, hello_len + len(buffer))
    client.sendmsg([buffer], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", fd))])
    os.close(fd)
    loop.server.poll(0)
    client.close()
    turns = 0
    while not session.closed:
        before = session.box_read
        loop.server.poll(0)
        assert session.box_read - before <= server.SLICE_BYTES
        turns += 1
        assert turns < 100
    assert turns >= len(body) // server.SLICE_BYTES
    assert session.box_read == len(body)
    [item] = loop.queued()
    assert item.record is not None and item.record.run_id == "boxed"


def test_sync_and_scratch_close_are_acknowledged_without_the_writer(loop: Loop) -> None:
    """With nothing in flight a SYNC (or a scratch CLOSE) is acknowledged at once; after a
    RECORD it waits for the writer's acknowledgement of that RECORD."""
    session, client = loop.connect(1000)
    ctx = {"s": 1, "c": 1, "run_id": "cal", "pid": 1, "host": "h", "backend": "none",
           "counters": [], "scratch": True}
    client.sendall(protocol.encode(F.CONTEXT, ctx) + protocol.encode_open(2, 1, 0, 5, 0, 0, "c")
                   + protocol.encode_close(3, 1, 0, 5, 9, 0))
    loop.server.poll(0)
    assert session.ack_wanted == 3 and loop.queued() == []
    client.sendall(protocol.encode(F.RECORD, {"s": 4, "rec": rec(0).to_json()})
                   + protocol.encode(F.SYNC, {"s": 5}))
    loop.server.poll(0)
    [item] = loop.queued()
    assert item.seq == 4 and session.ack_wanted == 3 and session.deferred == 5
    session.committed_to(4)
    assert session.ack_wanted == 5 and session.deferred == 0


def _calibration(run: str, pairs: int, scratch: bool = True) -> bytes:
    """A CONTEXT (scratch unless told) and ``pairs`` OPEN/CLOSE pairs, as a calibration sends."""
    ctx = {"s": 1, "c": 1, "run_id": run, "pid": 1, "host": "h", "backend": "none",
           "counters": [], "scratch": scratch}
    return protocol.encode(F.CONTEXT, ctx) + b"".join(
        protocol.encode_open(2 + 2 * i, 1, i, 5, 0, 0, "c")
        + protocol.encode_close(3 + 2 * i, 1, i, 5, 9, 0) for i in range(pairs))


def test_scratch_connections_cost_no_clock_work(loop: Loop, monkeypatch: pytest.MonkeyPatch
                                                ) -> None:
    """The markers' calibration connections (HELLO "scratch": true, every context scratch)
    take no clock anchor, read no process clock in /proc and queue nothing to the writer,
    however many; a scratch-only connection without the HELLO key takes its HELLO anchor
    only, and so does one that declares a real run but stores nothing. A real run's
    connection queues its start anchor (its HELLO's) just before its first record and its end
    anchor after them, its client's clock read once; a connection that said scratch and
    declares a real run after all is anchored from that CONTEXT."""
    from counterd.daemon import session as session_mod
    from counterd.daemon import writer as writer_mod
    from counterd.daemon.store import RunAnchor

    taken: list[str] = []
    real_take = session_mod.take_anchor
    for mod in (session_mod, writer_mod):
        monkeypatch.setattr(mod, "take_anchor",
                            lambda mod=mod: (taken.append(mod.__name__), real_take())[1])
    clocks: list[int] = []
    real_clock = session_mod.process_clock
    monkeypatch.setattr(session_mod, "process_clock",
                        lambda pid, mine=None: (clocks.append(pid), real_clock(pid, mine))[1])

    def serve(sessions: list[Session], last: int) -> None:
        """Turns until each session has handled its frames up to ``last``."""
        for _ in range(100):
            loop.server.poll(0)
            if all(s.last_seq >= last for s in sessions):
                return
        raise AssertionError([s.last_seq for s in sessions])

    def kinds() -> list[str]:
        return [type(x).__name__ for x in loop.queued_all()]

    conns = [loop.connect(1000, scratch=True) for _ in range(8)]
    for k, (_, c) in enumerate(conns):
        c.sendall(_calibration(f"cal-{k}", 4))
    serve([s for s, _ in conns], 9)
    for s, c in conns:
        assert max(p["s"] for t, p in replies(c) if t is F.ACK) == 9
        s.close(incomplete=True)
    assert (taken, clocks, kinds()) == ([], [], [])

    hello = ["counterd.daemon.session"]  # a HELLO's anchor, taken in the loop
    old, client = loop.connect(1000)  # an older client's calibration
    client.sendall(_calibration("cal-old", 4))
    serve([old], 9)
    old.close(incomplete=True)
    assert (taken, clocks, kinds()) == (hello, [], [])

    taken.clear()
    empty, client = loop.connect(1000)  # a real run declared, nothing of it stored
    client.sendall(_calibration("nothing", 0, scratch=False))
    serve([empty], 1)
    empty.close(incomplete=True)
    assert (taken, clocks, kinds()) == (hello, [], [])

    taken.clear()
    real, client = loop.connect(1000)
    client.sendall(_calibration("run", 2, scratch=False))
    serve([real], 5)
    real.close(incomplete=True)
    queued = loop.queued_all()
    anchors = [a for a in queued if isinstance(a, RunAnchor)]
    assert [type(x).__name__ for x in queued] == ["RunAnchor", "Item", "Item", "RunAnchor"]
    assert {(a.uid, a.run_id) for a in anchors} == {(1000, "run")}
    assert anchors[0].anchor.mono_ns < anchors[1].anchor.mono_ns
    assert anchors[0].clock == anchors[1].clock and clocks == [os.getpid()]
    assert taken == hello + ["counterd.daemon.writer"]  # the HELLO's (the start), the end's
    assert anchors[0].anchor == real._hello_anchor  # taken at HELLO, before its supersteps

    taken.clear()
    said, client = loop.connect(1000, scratch=True)
    client.sendall(_calibration("run2", 1, scratch=False))
    serve([said], 3)
    assert kinds() == ["RunAnchor", "Item"] and taken == ["counterd.daemon.session"]


# -- queries --------------------------------------------------------------------------------
def test_a_query_is_answered_off_the_loop_one_in_flight(tmp_path: Path) -> None:
    """A QUERY parks its connection (the frames after it wait) until the worker's answer;
    the worker takes queries round-robin between uids."""
    store = Store(tmp_path / "s.db")
    store.commit([(rec(0, "mine"), RunInfo("j", 1000))])
    store.close()
    lp = Loop()
    try:
        lp.shared.queries = Queries(tmp_path / "s.db")
        worker = QueryWorker(lp.shared.queries, lp.server.wake)
        lp.shared.query_worker = worker
        session, client = lp.connect(1000)
        client.sendall(protocol.encode(F.QUERY, {"s": 1, "what": "runs"}) + syncs(2, 3))
        lp.server.poll(0)
        assert session.parked and session.last_seq == 1  # the SYNCs wait
        worker.start()
        deadline = time.monotonic() + 10
        while session.last_seq < 4 and time.monotonic() < deadline:
            lp.server.poll(0.5)  # the wake: the answer is sent, the session served again
        assert session.last_seq == 4 and not session.parked
        got = replies(client)
        [result] = [query_frames.Result.decode(p) for t, p in got if t is F.RESULT]
        assert [i["run_id"] for i in result.items] == ["mine"] and result.after is None
        worker.stop()
    finally:
        lp.close()


def test_query_worker_serves_uids_in_turn(tmp_path: Path) -> None:
    worker = QueryWorker(Queries(None), lambda: None)
    for cid, uid in ((1, 1000), (2, 1000), (3, 1000), (4, 1001)):
        worker.submit(cid, {"s": 1, "what": "runs"}, Peer(1, uid, uid), False, 2, 1 << 18)
    order = []
    while (asked := worker.next_query()) is not None:
        order.append(asked.cid)
    assert order == [1, 4, 2, 3]


@pytest.fixture
def many_runs(tmp_path: Path) -> Path:
    store = Store(tmp_path / "s.db", synchronous="normal")
    store.commit([(rec(0, f"run{i:04d}"), RunInfo("j", 1000)) for i in range(700)]
                 + [(rec(0, f"other{i}"), RunInfo("j", 1001)) for i in range(5)])
    store.close()
    return tmp_path / "s.db"


def test_runs_come_in_keyset_pages_each_run_once(many_runs: Path) -> None:
    """The run listing in pages of a frame each: every run of the user once, in order; the
    cursor is the last run's key; a cursor past the end is an empty last page; a cursor of
    another shape is refused."""
    queries = Queries(many_runs)
    pages = _queries.pages(queries, "runs", Peer(1, 1000, 1000), max_frame=8192)
    assert len(pages) > 5
    got = [i["run_id"] for p in pages for i in p.items]
    assert got == [f"run{i:04d}" for i in range(700)]
    for p in pages[:-1]:
        last = p.items[-1]
        assert list(p.after or ()) == [last["first_seen_ns"], last["run_id"], last["uid"]]
    [end] = _queries.pages(queries, "runs", Peer(1, 1000, 1000), max_frame=8192,
                           after=[2**62, "~", 2**31])
    assert not end.items and end.after is None
    dec = protocol.Decoder(1 << 26)
    dec.feed(queries.answer({"s": 1, "what": "runs", "after": [5]}, Peer(1, 1000, 1000),
                            False, 2, 8192))
    [(ftype, p)] = list(dec.frames())
    assert ftype is F.ERROR and p["code"] == "bad_query"
    queries.close()


def test_a_runs_page_is_an_index_range(many_runs: Path) -> None:
    """The SELECT of a page searches an index (no scan of the runs, no sort)."""
    store = Store(many_runs, readonly=True)
    for sql, args in (("WHERE uid = ? AND (first_seen_ns, run_id, uid) > (?, ?, ?)",
                       (1000, 0, "", 0)), ("WHERE (first_seen_ns, run_id, uid) > (?, ?, ?)",
                                           (0, "", 0))):
        plan = " ".join(str(r[-1]) for r in store._conn.execute(
            "EXPLAIN QUERY PLAN SELECT uid FROM runs " + sql
            + " ORDER BY first_seen_ns, run_id, uid LIMIT 5", args))
        assert "USING COVERING INDEX runs_by_" in plan and "TEMP B-TREE" not in plan, plan
    assert len(store.runs(1000, limit=10)) == 10
    store.close()


# -- usage and quotas -----------------------------------------------------------------------
def _bytes(store: Store) -> dict[int, int]:
    return {int(u): int(b) for u, b in store._conn.execute(
        "SELECT uid, SUM(length(CAST(body AS BLOB))) FROM records GROUP BY uid")}


def test_the_store_keeps_each_uids_bytes(tmp_path: Path) -> None:
    """usage (triggers) follows inserts, an incomplete record replaced by its complete one,
    and retention's deletions."""
    store = Store(tmp_path / "s.db", synchronous="normal")
    incomplete = SuperstepRecord(run_id="r", index=0, name="s", rank=0, pid=1, cpu=0,
                                 begin_ns=10, end_ns=None, host="h", flags=frozenset(
                                     {"incomplete"}))
    store.commit([(incomplete, RunInfo("j", 1000)), (rec(1), RunInfo("j", 1001))])
    assert store.usage() == _bytes(store)
    store.commit([(rec(0, name="x" * 500), RunInfo("j", 1000))])  # replaces the incomplete
    assert store.usage() == _bytes(store) and store.usage([1000]) == {1000: _bytes(store)[1000]}
    store.prune(0, now_ns=time.time_ns() + 10**12)
    assert store.usage() == {}
    store.close()


def test_quota_and_reserve_refusals() -> None:
    usage = Usage()
    usage.load({1000: 900, 1001: 100, 0: 10**9})
    assert usage.refusal(1000, 50, 1000, 0) is None
    why = usage.refusal(1000, 200, 1000, 0)
    assert why is not None and "store.max_bytes_per_uid is 1000" in why
    usage.queued(1001, 950)  # in flight counts
    assert usage.refusal(1001, 0, 1000, 0) is not None
    usage.done(1001, 950)
    assert usage.refusal(0, 10**12, 1000, 0) is None  # root is exempt
    usage.free, usage.size = 10 << 20, 1 << 30  # 10 MiB free, under a 64 MiB reserve
    usage.load({1000: 900, 1001: 100})
    why = usage.refusal(1000, 1, 0, 64 << 20)
    assert why is not None and "store.reserve_bytes" in why  # the heavy user first
    assert usage.refusal(1001, 1, 0, 64 << 20) is None  # below the average: goes on
    assert usage.refusal(1002, 1, 0, 64 << 20) is None  # keeps nothing yet
    usage.free = 100 << 20
    assert usage.refusal(1000, 1, 0, 64 << 20) is None  # above the reserve


def test_a_record_beyond_the_quota_is_refused_with_a_reason() -> None:
    """An ERROR "quota" naming the key, for that record's frame, then the ACK covering it;
    nothing for the writer."""
    lp = Loop(Limits(max_store_bytes_per_uid=1000))
    try:
        lp.writer.usage.load({1000: 990})
        session, client = lp.connect(1000)
        client.sendall(protocol.encode(F.RECORD, {"s": 1, "rec": rec(0).to_json()}))
        lp.server.poll(0)
        assert lp.queued() == []
        got = replies(client)
        errors = [p for t, p in got if t is F.ERROR]
        assert errors and errors[0]["code"] == "quota" and errors[0]["s"] == 1
        assert "store.max_bytes_per_uid" in errors[0]["message"]
        assert [p["s"] for t, p in got if t is F.ACK] == [1]
        assert lp.shared.state.refused["quota"] == 1
    finally:
        lp.close()


def test_store_quota_keys_are_configured(tmp_path: Path) -> None:
    from counterd.daemon import config

    cfg = config.load(None, {"COUNTERD_STORE_MAX_BYTES_PER_UID": "5000",
                             "COUNTERD_STORE_RESERVE_BYTES": "0"})
    assert cfg.limits.max_store_bytes_per_uid == 5000 and cfg.limits.store_reserve_bytes == 0
    assert config.Config().limits.max_store_bytes_per_uid == 1 << 30
    path = tmp_path / "c.toml"
    path.write_text("[store]\nmax_bytes_per_uid = -1\n")
    with pytest.raises(config.BadInput, match="store.max_bytes_per_uid"):
        config.load(path, {})


def test_a_transaction_takes_the_users_records_in_turn() -> None:
    """fair_batch: one of each uid in turn, each uid's items in order, up to the caps: uid
    1001's single record goes into the next transaction behind uid 1000's thousands."""
    from collections import deque

    from counterd.daemon.writer import fair_batch

    def item(uid: int, seq: int, size: int = 10) -> Item:
        return Item(uid, seq, rec(seq), RunInfo("j", uid), size)

    pending = {1000: deque(item(1000, s) for s in range(1, 5001)), 1001: deque([item(1001, 1)])}
    batch = fair_batch(pending, max_items=100)
    assert len(batch) == 100 and [it.cid for it in batch[:2]] == [1000, 1001]
    assert [it.seq for it in batch if it.cid == 1000] == list(range(1, 100))
    assert 1001 not in pending and len(pending[1000]) == 5000 - 99
    assert len(fair_batch(pending, max_items=10_000, max_bytes=55)) == 6  # the bytes cap
    assert len(fair_batch({1: deque([item(1, 1, 10**9)])}, max_bytes=5)) == 1  # one at least


def test_schema_5_counts_what_an_older_store_holds(tmp_path: Path) -> None:
    """A store of schema 4 with records: migrating to 5 fills usage from them."""
    import sqlite3

    from counterd.daemon.schema import migrate

    path = tmp_path / "old.db"
    store = Store(path)
    store.commit([(rec(i), RunInfo("j", 1000)) for i in range(3)])
    store.close()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executescript("DROP TRIGGER usage_insert; DROP TRIGGER usage_update; "
                       "DROP TRIGGER usage_delete; DROP TABLE usage; DROP INDEX runs_by_uid; "
                       "DROP INDEX runs_by_time; DROP TABLE clock_domains; "
                       "DROP TABLE clock_anchors; DROP TRIGGER ship_record_insert; "
                       "DROP TRIGGER ship_record_update; DROP TABLE ship_queue; "
                       "DROP TABLE ship_state; DELETE FROM schema_version WHERE version >= 5;")
    assert migrate(conn, target=5) == 5  # (Store() below takes it on to the current version)
    conn.close()
    store = Store(path)
    assert store.usage() == _bytes(store) and store.usage()[1000] > 0
    store.close()


def test_a_client_killed_in_its_first_superstep_keeps_its_clock() -> None:
    """A batch job killed at its walltime inside its first superstep: its first record (the
    incomplete one made at the connection's end) reaches the writer after the client died, so
    its clock is read at the superstep's begin, while the client is alive, not from the dead
    pid's /proc (which has no time namespace, or another process's)."""
    import subprocess

    lp = Loop()
    try:
        child = subprocess.Popen(["sleep", "30"])
        ours, theirs = socket.socketpair()
        session = lp.server.adopt(ours, Peer(child.pid, 1000, 1000))
        ctx = {"s": 1, "c": 1, "run_id": "job", "pid": child.pid, "host": "h",
               "backend": "none", "counters": []}
        theirs.sendall(protocol.encode(F.HELLO, {"pid": child.pid, "job": "t"})
                       + protocol.encode(F.CONTEXT, ctx)
                       + protocol.encode_open(2, 1, 0, 5, 0, 0, "long"))
        for _ in range(50):
            lp.server.poll(0)
            if session.last_seq >= 2:
                break
        assert session.last_seq == 2
        child.kill()
        child.wait()
        session.close(incomplete=True)
        anchors = [a for a in lp.queued_all() if isinstance(a, RunAnchor)]
        assert anchors and anchors[0].clock.timens != ""
        assert anchors[0].clock.mono_offset_ns is not None, anchors[0].clock
        theirs.close()
    finally:
        lp.close()
