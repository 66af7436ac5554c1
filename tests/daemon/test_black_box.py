"""The black box (BUFFER frame) end to end, against a real ``counterd run``.

What is tested, with real daemon processes, real Unix sockets and real memory files:

* a real marker program killed with SIGKILL between two batches loses nothing: the daemon
  reads what was never sent from the program's black box (``server._end``);
* a BUFFER is refused (ERROR ``bad_buffer``, with its sequence number) for a descriptor that
  is not a memory file (a regular file on disk, a pipe), for no descriptor at all, and for a
  second BUFFER on one connection; the connection goes on serving;
* hostile black boxes (a head that lies, garbage committed, a file truncated under the
  daemon) take nothing and harm no one, while honest ones are read: a frame only in the box,
  or a frame whose first half came over the socket and whose rest is only in the box;
* descriptor hygiene: passed descriptors are closed when their connection ends, and a
  client passing many descriptors at once leaves the daemon holding at most one of them.
"""

from __future__ import annotations

import array
import os
import re
import signal
import socket
import struct
from pathlib import Path

from counterd.data.records import SuperstepRecord
from counterd.wire import protocol, spool
from counterd.wire.protocol import FrameType
from counterd.wire.spool import BOX_MAGIC, HEAD_BYTES, MappedWriter

from .conftest import DaemonProc, next_reply
from .test_daemon import run_py, stored, wait_for


def rec(run_id: str, index: int = 0, name: str = "s") -> SuperstepRecord:
    return SuperstepRecord(run_id=run_id, index=index, name=name, rank=0, pid=os.getpid(),
                           cpu=0, begin_ns=10 + index, end_ns=20 + index)


def box_head(committed: int, base: int, magic: bytes = BOX_MAGIC, serves: int = 0) -> bytes:
    """The 64-byte head of a black box, as ``spool.MappedWriter.memory`` writes it (serving
    connection 0, the BUFFER's ``box`` here)."""
    return struct.pack("<8sQQQ", magic, committed, base, serves).ljust(HEAD_BYTES, b"\0")


class BoxClient:
    """A hand-made client: it counts the bytes it has sent (its stream offset, what the
    daemon calls ``received``) and passes descriptors with its frames."""

    def __init__(self, d: DaemonProc) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(str(d.socket))
        self.sent = 0
        self.seq = 0
        self.decoder = protocol.Decoder()
        self.send(protocol.Hello(pid=os.getpid(), host="h", job="box").encode())
        ftype, welcome = self.reply()
        assert ftype is FrameType.WELCOME and welcome["buffer"] is True, welcome

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def send(self, data: bytes, fds: list[int] | tuple[int, ...] = ()) -> None:
        if fds:
            n = self.sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                            array.array("i", fds).tobytes())])
            self.sock.sendall(data[n:])
        else:
            self.sock.sendall(data)
        self.sent += len(data)

    def buffer(self, fds: list[int] | tuple[int, ...] = ()) -> int:
        """Send a BUFFER with ``fds`` attached; its sequence number."""
        seq = self.next_seq()
        self.send(protocol.Buffer(seq, 0).encode(), fds)
        return seq

    def record(self, r: SuperstepRecord) -> bytes:
        """A RECORD frame of ``r`` with the next sequence number (not sent)."""
        return protocol.Record(self.next_seq(), r).encode()

    def reply(self) -> tuple[FrameType, dict[str, object]]:
        return next_reply(self.sock, self.decoder)

    def sync(self) -> None:
        """SYNC, and wait for the ACK that covers it (ERRORs before it fail the test)."""
        seq = self.next_seq()
        self.send(protocol.Sync(seq).encode())
        while True:
            ftype, payload = self.reply()
            assert ftype is FrameType.ACK, (ftype, payload)
            if payload["s"] >= seq:
                return

    def expect_error(self, code: str, seq: int) -> dict[str, object]:
        """The next reply, which must be an ERROR ``code`` about frame ``seq``."""
        ftype, payload = self.reply()
        assert (ftype, payload["code"], payload["s"]) == (FrameType.ERROR, code, seq), payload
        return payload

    def still_serves(self, d: DaemonProc, run_id: str) -> list[SuperstepRecord]:
        """A RECORD then a SYNC on this connection are acknowledged and the record stored
        (returned: the run's records in the store)."""
        r = rec(run_id)
        self.send(self.record(r))
        self.sync()
        got = stored(d, run_id)
        assert got == [r]
        return got

    def close(self) -> None:
        self.sock.close()


def served(d: DaemonProc, run_id: str, still_open: int = 0) -> None:
    """The daemon is alive and a new client's record is acknowledged and stored. It connects
    once the daemon has no connection left but the ``still_open`` ones the test keeps
    (``counterd_clients``): the ends of those closed before (and what their black boxes gave,
    read a slice per turn of the loop) are handled, and queued before this record (the same
    uid's records keep their order), once it is acked. (Waiting for 0 with a connection kept
    open passed only on a /metrics page rendered before it connected: the page is cached for
    up to a second.)"""
    assert d.alive()
    wait_for(lambda: re.search(rf"^counterd_clients {still_open}(\.0)?$", d.metrics(), re.M)
             is not None, what="every connection closed before handled")
    c = BoxClient(d)
    c.still_serves(d, run_id)
    c.close()


# -- 1. a real program killed between two batches ---------------------------------------------


def test_killed_program_loses_nothing_it_wrote_to_its_black_box(daemon: DaemonProc) -> None:
    """A marker program SIGKILLed with its last batch still in its black box: the daemon
    stores every one of its 2000 supersteps, and the one still open as incomplete."""
    out = run_py("""
        import os, signal, counterd
        for i in range(2000):
            with counterd.superstep("s", i=i):
                pass
        counterd.begin("open")
        os.kill(os.getpid(), signal.SIGKILL)
    """, daemon.env(COUNTERD_RUN_ID="bb-kill"))
    assert out.returncode == -signal.SIGKILL, out.stderr
    wait_for(lambda: len(stored(daemon, "bb-kill")) >= 2001, timeout=10, what="2001 records")
    recs = stored(daemon, "bb-kill")
    assert len(recs) == 2001
    done = [r for r in recs if r.name == "s"]
    assert sorted(r.index for r in done) == list(range(2000))
    assert all(r.params == {"i": r.index} for r in done)
    assert all(r.end_ns is not None and "incomplete" not in r.flags for r in done)
    (opened,) = [r for r in recs if r.name == "open"]
    assert opened.index == 2000 and opened.end_ns is None and "incomplete" in opened.flags
    # Nothing was lost: the daemon read it from the box, and says nothing at INFO (issue 34:
    # every clean worker exit logged it).
    assert "unsent in its black box" not in daemon.log_text()
    assert "is lost" not in daemon.log_text()
    assert daemon.alive()


# -- 2. BUFFERs refused --------------------------------------------------------------------------

def test_buffer_of_a_regular_file_is_refused(daemon: DaemonProc, tmp_path: Path) -> None:
    """A regular file on disk is no black box: ERROR bad_buffer for that BUFFER, the
    connection goes on, and the frames the file holds are never read, though its head
    covers the end of the stream when the connection ends."""
    c = BoxClient(daemon)
    path = tmp_path / "box"
    path.write_bytes(b"")
    fd = os.open(path, os.O_RDWR)
    try:
        seq = c.buffer([fd])
        c.expect_error("bad_buffer", seq)
        c.still_serves(daemon, "bb-file")
        frame = protocol.Record(c.next_seq(), rec("bb-file-content")).encode()
        os.pwrite(fd, box_head(len(frame), c.sent) + frame, 0)  # what a box would hold
        c.close()
    finally:
        os.close(fd)
    served(daemon, "bb-file-after")
    assert stored(daemon, "bb-file-content") == []


def test_buffer_of_a_pipe_is_refused(daemon: DaemonProc) -> None:
    """A pipe (reading it could block the daemon) is refused with bad_buffer; the daemon
    never reads it, even when the connection ends with bytes in the pipe."""
    c = BoxClient(daemon)
    r, w = os.pipe()
    try:
        os.write(w, protocol.Record(1000, rec("bb-pipe-content")).encode())
        seq = c.buffer([r])
        c.expect_error("bad_buffer", seq)
        c.still_serves(daemon, "bb-pipe")
        c.close()
        served(daemon, "bb-pipe-after")
    finally:
        os.close(r)
        os.close(w)
    assert stored(daemon, "bb-pipe-content") == []


def test_buffer_without_a_descriptor_is_refused(daemon: DaemonProc) -> None:
    """A BUFFER with nothing attached: bad_buffer, and the connection goes on."""
    c = BoxClient(daemon)
    seq = c.buffer()
    error = c.expect_error("bad_buffer", seq)
    assert "without a descriptor" in str(error["message"])
    assert [r.run_id for r in c.still_serves(daemon, "bb-nofd")] == ["bb-nofd"]
    c.close()


def test_second_buffer_is_refused_and_the_first_box_stays(daemon: DaemonProc) -> None:
    """One black box per connection: a second BUFFER (with a memory file, or with nothing)
    is refused with bad_buffer; the first box is still the one read at the end."""
    c = BoxClient(daemon)
    first = MappedWriter.memory("bb-first")
    second = MappedWriter.memory("bb-second")
    try:
        c.buffer([first.fd])
        c.still_serves(daemon, "bb-second-0")  # the good BUFFER got no ERROR
        seq = c.buffer([second.fd])
        c.expect_error("bad_buffer", seq)
        seq = c.buffer()
        c.expect_error("bad_buffer", seq)
        c.still_serves(daemon, "bb-second-1")
        # Frames only in the boxes, never sent: the first box's is read at the end.
        base = c.sent
        first.reset(base)
        second.reset(base)
        seq = c.next_seq()
        first.append(protocol.Record(seq, rec("bb-in-first")).encode())
        second.append(protocol.Record(seq, rec("bb-in-second")).encode())
        c.close()
        wait_for(lambda: len(stored(daemon, "bb-in-first")) == 1, what="the first box's record")
        served(daemon, "bb-second-after")
        assert stored(daemon, "bb-in-first") == [rec("bb-in-first")]
        assert stored(daemon, "bb-in-second") == []
    finally:
        first.close()
        second.close()


# -- 3. hostile and honest black boxes -----------------------------------------------------------

def _box_client(d: DaemonProc, make_box) -> None:  # type: ignore[no-untyped-def]
    """Connect, pass a memory file built by ``make_box(client)`` (after its BUFFER went) and
    close the connection."""
    c = BoxClient(d)
    fd = os.memfd_create("bb-hostile", os.MFD_CLOEXEC)
    try:
        c.buffer([fd])
        make_box(c, fd)
    finally:
        os.close(fd)
    c.close()


def test_a_box_whose_head_lies_gives_nothing(daemon: DaemonProc) -> None:
    """A box with a wrong magic, a base beyond the bytes sent, a base whose frames end
    before them, or a commit count beyond the file: nothing taken from it; the daemon stays
    and serves. (An honest box built the same way is read: the control.)"""

    def honest(c: BoxClient, fd: int) -> None:
        frame = c.record(rec("bb-honest"))
        os.write(fd, box_head(len(frame), c.sent) + frame)

    def wrong_magic(c: BoxClient, fd: int) -> None:
        frame = c.record(rec("bb-lie-magic"))
        os.write(fd, box_head(len(frame), c.sent, magic=b"CDSPOOL1") + frame)

    def base_beyond(c: BoxClient, fd: int) -> None:
        frame = c.record(rec("bb-lie-base"))
        os.write(fd, box_head(len(frame), c.sent + 1) + frame)

    def ends_before(c: BoxClient, fd: int) -> None:  # the box ends before the bytes sent
        frame = c.record(rec("bb-lie-before"))
        os.write(fd, box_head(c.sent - 1, 0) + frame)

    def beyond_file(c: BoxClient, fd: int) -> None:
        frame = c.record(rec("bb-lie-size"))
        os.write(fd, box_head(len(frame) + (1 << 40), c.sent) + frame[:len(frame) // 2])

    for make in (wrong_magic, base_beyond, ends_before, beyond_file, honest):
        _box_client(daemon, make)
    served(daemon, "bb-lie-after")
    wait_for(lambda: len(stored(daemon, "bb-honest")) == 1, what="the honest box's record")
    for run in ("bb-lie-magic", "bb-lie-base", "bb-lie-before", "bb-lie-size"):
        assert stored(daemon, run) == [], run
    assert stored(daemon, "bb-honest") == [rec("bb-honest")]
    assert daemon.alive()


def test_a_box_committing_more_than_its_file_gives_what_it_holds(daemon: DaemonProc) -> None:
    """A box whose head commits far more bytes than the file holds: the daemon reads what the
    file holds (``pread`` stops at its end; at most socket.max_bytes_per_client), so the
    whole frames there are taken, as if the client had sent them, and nothing else."""

    def beyond_file(c: BoxClient, fd: int) -> None:
        frame = c.record(rec("bb-lie-size-whole"))
        os.write(fd, box_head(len(frame) + (1 << 40), c.sent) + frame)

    _box_client(daemon, beyond_file)
    served(daemon, "bb-lie-size-after")
    assert [r.run_id for r in stored(daemon, "bb-lie-size-whole")] == ["bb-lie-size-whole"]


def test_garbage_in_a_box_harms_no_other_client(daemon: DaemonProc) -> None:
    """Random bytes committed in a box (with and without a plausible frame header): the
    daemon stays, and a client connected meanwhile keeps being served."""
    import random

    rng = random.Random(13)
    other = BoxClient(daemon)
    other.still_serves(daemon, "bb-garbage-other-0")
    for i in range(20):
        junk = rng.randbytes(rng.randint(1, 5000))
        if i % 2:
            junk = struct.pack("!IBB", len(junk) + 2, 2, rng.randint(0, 40)) + junk

        def garbage(c: BoxClient, fd: int, junk: bytes = junk) -> None:
            os.write(fd, box_head(len(junk), c.sent) + junk)

        _box_client(daemon, garbage)
    # A box full of zeros: frame lengths of 0
    _box_client(daemon, lambda c, fd: os.write(fd, box_head(4096, c.sent) + bytes(4096)))
    served(daemon, "bb-garbage-after", still_open=1)  # other
    r = rec("bb-garbage-other-1")
    other.send(other.record(r))
    other.sync()
    assert stored(daemon, "bb-garbage-other-1") == [r]
    other.close()


def test_a_box_truncated_after_it_was_passed(daemon: DaemonProc) -> None:
    """The client truncates its box (to 0, or in the middle of a frame) after passing it:
    the daemon reads nothing beyond the file, stays, and serves."""

    def to_zero(c: BoxClient, fd: int) -> None:
        frame = c.record(rec("bb-trunc-0"))
        os.write(fd, box_head(len(frame), c.sent) + frame)
        os.ftruncate(fd, 0)

    def mid_frame(c: BoxClient, fd: int) -> None:
        frame = c.record(rec("bb-trunc-mid"))
        os.write(fd, box_head(len(frame), c.sent) + frame)
        os.ftruncate(fd, HEAD_BYTES + len(frame) // 2)

    for make in (to_zero, mid_frame):
        _box_client(daemon, make)
    # The real writer's box (a mapped 1 MiB file), truncated under its mapping.
    c = BoxClient(daemon)
    box = MappedWriter.memory("bb-trunc")
    try:
        c.buffer([box.fd])
        box.reset(c.sent)
        box.append(c.record(rec("bb-trunc-mapped")))
        os.ftruncate(box.fd, 0)
        c.close()
    finally:
        box.close()
    served(daemon, "bb-trunc-after")
    assert stored(daemon, "bb-trunc-0") == []
    assert stored(daemon, "bb-trunc-mid") == []
    assert stored(daemon, "bb-trunc-mapped") == []
    wait_for(lambda: "connection closed inside a frame" in daemon.log_text(),
             what="the half frame reported as truncated")


def test_a_record_only_in_the_box_is_stored(daemon: DaemonProc) -> None:
    """A RECORD written to the box (by the real writer, ``MappedWriter.memory``) and never
    sent is stored once the connection ends; so is a second one after it."""
    c = BoxClient(daemon)
    box = MappedWriter.memory("bb-only")
    try:
        c.buffer([box.fd])
        box.reset(c.sent)
        first, second = rec("bb-only", 0), rec("bb-only", 1)
        frames = c.record(first) + c.record(second)
        box.append(frames[:len(frames) // 3])  # appended in two parts, committed in full
        box.append(frames[len(frames) // 3:])
        assert box.committed == len(frames) and box.waiting == len(frames)
        c.close()
        wait_for(lambda: len(stored(daemon, "bb-only")) == 2, what="both records")
    finally:
        box.close()
    assert stored(daemon, "bb-only") == [first, second]
    assert daemon.alive()


def test_a_frame_split_between_socket_and_box_is_stored(daemon: DaemonProc) -> None:
    """A frame whose first half went over the socket and whose whole is committed in the box
    (its base the stream offset of the frame's first byte): the daemon takes the rest from
    the box and stores the record, with no 'truncated' report for that connection."""
    c = BoxClient(daemon)
    box = MappedWriter.memory("bb-split")
    try:
        c.buffer([box.fd])
        done = rec("bb-split", 0)
        c.send(c.record(done))  # a whole frame over the socket first
        c.sync()
        split = rec("bb-split", 1, name="split")
        frame = c.record(split)
        box.reset(c.sent)  # everything before this frame was sent
        box.append(frame)
        c.send(frame[:len(frame) // 2])
        c.close()
        wait_for(lambda: len(stored(daemon, "bb-split")) == 2, what="the split record")
    finally:
        box.close()
    assert stored(daemon, "bb-split") == [done, split]
    assert "truncated" not in daemon.log_text()
    assert "unsent in its black box" not in daemon.log_text()  # nothing lost: DEBUG


def test_a_bad_frame_in_the_box_does_not_cost_the_frames_after_it(daemon: DaemonProc) -> None:
    """A well-framed but bad frame (not JSON) in the box, then a RECORD: the bad frame is
    refused on its own (the protocol's decoder stays usable) and the RECORD is stored."""

    def bad_then_good(c: BoxClient, fd: int) -> None:
        frames = protocol.encode_raw(FrameType.RECORD, b"{not json") \
            + c.record(rec("bb-after-bad"))
        os.write(fd, box_head(len(frames), c.sent) + frames)

    _box_client(daemon, bad_then_good)
    served(daemon, "bb-after-bad-served")
    wait_for(lambda: "bad_json" in daemon.log_text(), what="the bad frame refused")
    assert stored(daemon, "bb-after-bad") == [rec("bb-after-bad")]


def test_a_reply_to_a_dead_client_does_not_cost_its_black_box(daemon: DaemonProc) -> None:
    """A client whose last frame earns a reply (here an ERROR) and which is gone before the
    daemon reads that frame: the daemon's reply fails (EPIPE), and the frames in its black
    box are still read and stored. (The daemon is stopped meanwhile, so the client is gone
    before the daemon reads anything: no race.)"""
    assert daemon.proc is not None
    c = BoxClient(daemon)
    box = MappedWriter.memory("bb-epipe")
    try:
        c.buffer([box.fd])
        c.sync()
        daemon.proc.send_signal(signal.SIGSTOP)
        try:
            c.buffer()  # a second BUFFER: answered with an ERROR
            box.reset(c.sent)
            box.append(c.record(rec("bb-epipe")))
            c.close()
        finally:
            daemon.proc.send_signal(signal.SIGCONT)
        served(daemon, "bb-epipe-after")
        assert "bad_buffer: a second BUFFER" in daemon.log_text()  # a reply was owed
        wait_for(lambda: len(stored(daemon, "bb-epipe")) == 1, timeout=30,
                 what="the record in the dead client's box")
    finally:
        box.close()


# -- 4. descriptor hygiene -------------------------------------------------------------------

def open_fds(d: DaemonProc) -> int:
    assert d.proc is not None
    return len(os.listdir(f"/proc/{d.proc.pid}/fd"))


def held_memory_files(d: DaemonProc, prefix: str) -> set[str]:
    """The names of the memory files (``memfd:NAME``) the daemon holds a descriptor of whose
    name starts with ``prefix``: which of a test's boxes it holds, whatever else it opens."""
    assert d.proc is not None
    out = set()
    for fd in os.listdir(f"/proc/{d.proc.pid}/fd"):
        try:
            target = os.readlink(f"/proc/{d.proc.pid}/fd/{fd}")
        except FileNotFoundError:  # closed between the listing and the read
            continue
        if target.startswith(f"/memfd:{prefix}"):
            out.add(target.removeprefix("/memfd:").split(" ")[0])
    return out


def test_passed_descriptors_are_closed_when_their_connection_ends(daemon: DaemonProc,
                                                                   tmp_path: Path) -> None:
    """30 clients each pass a box (and 10 more a descriptor the daemon refuses, or one with
    no BUFFER at all) and disconnect: the daemon's open descriptors go back to what they
    were, and every box's record is stored."""
    served(daemon, "bb-fd-warm")  # the store, the writer and the like are open by now
    before = open_fds(daemon)
    disk = tmp_path / "disk"
    disk.write_bytes(b"")
    for i in range(30):
        c = BoxClient(daemon)
        box = MappedWriter.memory(f"bb-fd-{i}")
        try:
            c.buffer([box.fd])
            box.reset(c.sent)
            box.append(c.record(rec("bb-fd", i)))
        finally:
            box.close()
        c.close()
    for i in range(10):
        c = BoxClient(daemon)
        fd = os.open(disk, os.O_RDONLY)
        try:
            if i % 2:
                c.expect_error("bad_buffer", c.buffer([fd]))
            else:  # a descriptor with a SYNC, no BUFFER: kept for one, then closed
                c.send(protocol.Sync(c.next_seq()).encode(), [fd])
                assert c.reply()[0] is FrameType.ACK
        finally:
            os.close(fd)
        c.close()
    served(daemon, "bb-fd-after")
    wait_for(lambda: len(stored(daemon, "bb-fd")) == 30, what="the 30 boxes' records")
    assert [r.index for r in stored(daemon, "bb-fd")] == list(range(30))
    wait_for(lambda: abs(open_fds(daemon) - before) <= 2,
             what=f"the daemon's descriptors back to {before}")


def test_many_descriptors_in_one_message_leave_at_most_one(daemon: DaemonProc) -> None:
    """A client sends 5 memory files in one sendmsg with its BUFFER: while it is connected the
    daemon holds a descriptor of the first (its box) and of none of the others (they never
    become its descriptors: the kernel closes what does not fit the room given), and none after
    it has gone. Read by name from /proc/PID/fd, not as a count: a count of all its
    descriptors once saw 4 more than the bound, in a fresh clone's .ci/run (the daemon opens
    and closes descriptors of its own meanwhile, /proc files among them; which ones those 4
    were was not caught)."""
    served(daemon, "bb-many-warm")
    before = open_fds(daemon)
    c = BoxClient(daemon)
    c.sync()
    boxes = [MappedWriter.memory(f"bb-many-{k}") for k in range(5)]
    try:
        c.buffer([b.fd for b in boxes])
        c.sync()  # the BUFFER is handled: no ERROR came before the ACK
        assert held_memory_files(daemon, "bb-many-") == {"bb-many-0"}
        seq = c.next_seq()
        for k, b in enumerate(boxes):
            b.reset(c.sent)
            b.append(protocol.Record(seq, rec(f"bb-many-{k}")).encode())
        c.close()
        served(daemon, "bb-many-after")
        wait_for(lambda: len(stored(daemon, "bb-many-0")) == 1, what="the first box's record")
        assert all(stored(daemon, f"bb-many-{k}") == [] for k in range(1, 5))
        wait_for(lambda: open_fds(daemon) <= before,
                 what=f"the daemon's descriptors back to {before}")
    finally:
        for b in boxes:
            b.close()


def test_read_box_reads_only_what_the_head_covers(tmp_path: Path) -> None:
    """``spool.read_box`` (the daemon's reader) on a real memory file: the bytes from
    ``received`` to the commit, bounded by ``limit``; nothing outside [base, base+committed]."""
    box = MappedWriter.memory("bb-unit")
    try:
        box.reset(100)
        box.append(b"abcdefgh")
        assert spool.read_box(box.fd, 100, 1 << 20, 0) == b"abcdefgh"
        assert spool.read_box(box.fd, 103, 1 << 20, 0) == b"defgh"
        assert spool.read_box(box.fd, 103, 2, 0) == b"de"
        assert spool.read_box(box.fd, 108, 1 << 20, 0) == b""
        assert spool.read_box(box.fd, 99, 1 << 20, 0) == b""
        assert spool.read_box(box.fd, 109, 1 << 20, 0) == b""
        box.serve(2)  # a later connection of the client: nothing for connection 0's session
        assert spool.read_box(box.fd, 100, 1 << 20, 0) == b""
        assert spool.read_box(box.fd, 100, 1 << 20, 2) == b"abcdefgh"
    finally:
        box.close()


def test_a_box_beyond_the_clients_limit_is_a_warning_that_says_what_was_lost(
        tmp_path: Path) -> None:
    """What a box holds beyond socket.max_bytes_per_client is lost: that, and only that, is
    logged above DEBUG (the ordinary end of a client with frames unsent is not)."""
    d = DaemonProc(tmp_path / "d")
    d.write_config(socket_extra="max_frame_bytes = 1024\nmax_bytes_per_client = 1024\n")
    d.start()
    try:
        c = BoxClient(d)
        box = MappedWriter.memory("bb-big")
        try:
            c.buffer([box.fd])
            box.reset(c.sent)
            frames = b"".join(c.record(rec("bb-big", i)) for i in range(40))
            assert len(frames) > 2 * 1024
            box.append(frames)
            c.close()
            wait_for(lambda: "the rest is lost" in d.log_text(), what="the warning")
        finally:
            box.close()
        # the warning may come before the kept frames are committed to the store
        wait_for(lambda: stored(d, "bb-big"), what="the kept frames stored")
        kept = stored(d, "bb-big")
        assert 0 < len(kept) < 40  # the frames within the first 1024 bytes
        [line] = [x for x in d.log_text().splitlines() if "the rest is lost" in x]
        assert "WARNING" in line and "socket.max_bytes_per_client (1024 bytes)" in line, line
        assert "unsent in its black box" not in d.log_text()
    finally:
        if d.alive():
            d.stop()
