"""Wire protocol: framing, limits, versions, typed frames (counterd/wire/protocol.py)."""

from __future__ import annotations

import random
import struct
from collections.abc import Callable

import pytest

from counterd.data.events import CounterValue, Source
from counterd.data.records import SuperstepRecord
from counterd.wire import binary_frames, json_frame, protocol, query_frames
from counterd.wire.protocol import Decoder, FrameType, ProtocolError


def test_frames_survive_any_split() -> None:
    frames = [(FrameType.HELLO, {"pid": 1, "job": "j"}),
              (FrameType.RECORD, {"s": 1, "rec": {"name": "é" * 300}}),
              (FrameType.SYNC, {"s": 2})]
    stream = b"".join(protocol.encode(t, p) for t, p in frames)
    rng = random.Random(7)
    for _ in range(50):
        dec = Decoder()
        got = []
        pos = 0
        while pos < len(stream):
            step = rng.randint(1, 40)
            dec.feed(stream[pos:pos + step])
            pos += step
            got.extend(dec.frames())
        assert got == frames
        assert dec.pending == 0


def test_header_layout_is_big_endian_length_version_type() -> None:
    frame = protocol.encode(FrameType.SYNC, {"s": 5})
    length, version, ftype = struct.unpack("!IBB", frame[:6])
    assert (length, version, ftype) == (len(frame) - 4, protocol.PROTOCOL_VERSION, 6)
    assert frame[6:] == b'{"s":5}'


def test_oversized_length_is_rejected_before_the_body() -> None:
    dec = Decoder(max_frame=1024)
    dec.feed(struct.pack("!I", 10_000_000))  # no body follows: must not wait for it
    with pytest.raises(ProtocolError) as err:
        list(dec.frames())
    assert err.value.code == "oversized" and dec.broken


def test_other_version_and_bad_payloads() -> None:
    dec = Decoder()
    dec.feed(struct.pack("!IBB", 4, 99, 1) + b"{}")
    with pytest.raises(ProtocolError) as err:
        list(dec.frames())
    assert err.value.code == "version" and dec.broken
    for body, code in ((b"\xff\xfe", "bad_json"), (b"[1]", "bad_json"), (b"{", "bad_json")):
        dec = Decoder()
        dec.feed(protocol.encode_raw(FrameType.RECORD, body) + protocol.encode(
            FrameType.SYNC, {"s": 1}))
        with pytest.raises(ProtocolError) as err:
            list(dec.frames())
        assert err.value.code == code and not dec.broken
        assert list(dec.frames()) == [(FrameType.SYNC, {"s": 1})]  # the stream goes on


def test_unknown_type_and_nan_payload() -> None:
    dec = Decoder()
    dec.feed(struct.pack("!IBB", 4, protocol.PROTOCOL_VERSION, 77) + b"{}")
    with pytest.raises(ProtocolError) as err:
        list(dec.frames())
    assert err.value.code == "bad_type"
    with pytest.raises(ValueError):
        protocol.encode(FrameType.SYNC, {"x": float("nan")})


def test_flag_bits_cover_every_record_flag_and_round_trip() -> None:
    from counterd.data.records import FLAGS

    assert set(protocol.FLAG_BITS) == set(FLAGS)
    flags = frozenset({"nested", "migrated", "unsupported_counters"})
    bits = protocol.flag_bits(flags)
    assert bits == (1 << 2) | (1 << 5) | (1 << 6)
    assert protocol.bit_flags(bits) == flags
    assert protocol.flag_bits(frozenset({"no such flag"})) is None
    with pytest.raises(ProtocolError):
        protocol.bit_flags(1 << len(protocol.FLAG_BITS))


def test_sources_on_the_wire_are_the_record_sources() -> None:
    from counterd.data.events import Source

    assert set(protocol.SOURCES) == {s.value for s in Source}


def test_binary_frames_are_version_2_only_and_a_stream_keeps_its_version() -> None:
    body = protocol.OPEN_HEAD.pack(1, 1, 0, 5, 0, 0, 1) + b"s"
    dec = Decoder(versions=protocol.ACCEPTED_VERSIONS)
    dec.feed(protocol.encode_raw(FrameType.OPEN, body))
    assert list(dec.frames()) == [(FrameType.OPEN, body)]  # bytes, not JSON
    assert dec.version == 2
    dec.feed(protocol.encode(FrameType.SYNC, {"s": 2}, version=1))
    with pytest.raises(ProtocolError) as err:
        list(dec.frames())
    assert err.value.code == "version" and "upgrade" in err.value.message
    v1 = Decoder(versions=protocol.ACCEPTED_VERSIONS)
    v1.feed(protocol.encode_raw(FrameType.OPEN, body, version=1))
    with pytest.raises(ProtocolError) as err:
        list(v1.frames())
    assert err.value.code == "bad_type" and not v1.broken
    v1.feed(protocol.encode(FrameType.SYNC, {"s": 2}, version=1))
    assert list(v1.frames()) == [(FrameType.SYNC, {"s": 2})]


# -- typed frames ------------------------------------------------------------------------------
# Each typed frame must encode to exactly the bytes the protocol had before typed frames: JSON
# frames as the daemon and SocketSink built their payloads, OPEN and CLOSE as SocketSink packed
# them by hand. GOLDEN holds those bytes (hex), recorded from the code before the change.

GOLDEN = {  # captured from protocol.py and SocketSink before the typed frames existed
    "hello_v1": "0000002101017b22706964223a34322c22686f7374223a2268222c226a6f62223a226a227d",
    "hello_nohost_v1": "0000001801017b22706964223a34322c226a6f62223a226f6c64227d",
    "welcome_v1": (
        "0000003601027b2276657273696f6e223a312c226d61785f6672616d65223a3236323134342c22756964"
        "223a313030302c22706964223a34327d"),
    "begin_v1": (
        "0000008301037b2273223a312c226c696e65223a7b2272756e5f6964223a2272222c22696e646578223a"
        "302c226e616d65223a2273222c2272616e6b223a302c22706964223a34322c22637075223a312c226265"
        "67696e5f6e73223a352c22706172616d73223a7b7d2c226261636b656e64223a226e6f6e65222c22686f"
        "7374223a2268227d7d"),
    "begin_count_v1": (
        "0000004c01037b2273223a322c226c696e65223a7b2272756e5f6964223a2272222c22696e646578223a"
        "312c22746964223a34337d2c22636f756e74223a5b227461736b5f636c6f636b5f6e73225d7d"),
    "record_v1": (
        "0000013b01047b2273223a332c22726563223a7b22666f726d6174223a312c2272756e5f6964223a2272"
        "222c22696e646578223a332c226e616d65223a22c3a92073746570222c2272616e6b223a312c22706964"
        "223a34322c22637075223a322c22626567696e5f6e73223a31302c22656e645f6e73223a32352c226475"
        "726174696f6e5f6e73223a31352c22636f756e74657273223a7b226c6f616473223a7b2276616c756522"
        "3a352e302c22736f75726365223a226d65617375726564222c22726174696f223a302e352c2272617722"
        "3a347d7d2c226d756c7469706c65785f726174696f223a302e352c22706172616d73223a7b226e223a33"
        "7d2c22666c616773223a5b226e6573746564225d2c22756e737570706f72746564223a7b7d2c22626163"
        "6b656e64223a2270657266222c22686f7374223a2268227d7d"),
    "read_v1": (
        "0000002f01057b2273223a342c22706964223a34322c22746964223a6e756c6c2c22636f756e74223a5b"
        "226c6f616473225d7d"),
    "read_tid_v1": (
        "0000002601057b2273223a352c22706964223a34322c22746964223a34332c22636f756e74223a5b5d7d"),
    "sync_v1": "0000000901067b2273223a367d",
    "ack_v1": "0000000901107b2273223a367d",
    "started_v1": "0000000901117b2273223a327d",
    "started_unsupported_v1": (
        "0000002101117b2273223a322c22756e737570706f72746564223a226e6f2070657266227d"),
    "reading_v1": (
        "0000004301127b2273223a342c2276616c756573223a7b226c6f616473223a5b372e302c312e305d7d2c"
        "22756e737570706f72746564223a7b2278223a226e6f20504d55227d7d"),
    "error_v1": (
        "00000044011f7b22636f6465223a226261645f736571222c226d657373616765223a2273657175656e63"
        "65206e756d626572203120646f6573206e6f7420666f6c6c6f772031227d"),
    "error_seq_v1": (
        "00000046011f7b22636f6465223a22666f7262696464656e222c226d657373616765223a2272756e2072"
        "2062656c6f6e677320746f20616e6f746865722075736572222c2273223a397d"),
    "hello_v2": "0000002102017b22706964223a34322c22686f7374223a2268222c226a6f62223a226a227d",
    "hello_nohost_v2": "0000001802017b22706964223a34322c226a6f62223a226f6c64227d",
    "welcome_v2": (
        "0000003602027b2276657273696f6e223a322c226d61785f6672616d65223a3236323134342c22756964"
        "223a313030302c22706964223a34327d"),
    "begin_v2": (
        "0000008302037b2273223a312c226c696e65223a7b2272756e5f6964223a2272222c22696e646578223a"
        "302c226e616d65223a2273222c2272616e6b223a302c22706964223a34322c22637075223a312c226265"
        "67696e5f6e73223a352c22706172616d73223a7b7d2c226261636b656e64223a226e6f6e65222c22686f"
        "7374223a2268227d7d"),
    "begin_count_v2": (
        "0000004c02037b2273223a322c226c696e65223a7b2272756e5f6964223a2272222c22696e646578223a"
        "312c22746964223a34337d2c22636f756e74223a5b227461736b5f636c6f636b5f6e73225d7d"),
    "record_v2": (
        "0000013b02047b2273223a332c22726563223a7b22666f726d6174223a312c2272756e5f6964223a2272"
        "222c22696e646578223a332c226e616d65223a22c3a92073746570222c2272616e6b223a312c22706964"
        "223a34322c22637075223a322c22626567696e5f6e73223a31302c22656e645f6e73223a32352c226475"
        "726174696f6e5f6e73223a31352c22636f756e74657273223a7b226c6f616473223a7b2276616c756522"
        "3a352e302c22736f75726365223a226d65617375726564222c22726174696f223a302e352c2272617722"
        "3a347d7d2c226d756c7469706c65785f726174696f223a302e352c22706172616d73223a7b226e223a33"
        "7d2c22666c616773223a5b226e6573746564225d2c22756e737570706f72746564223a7b7d2c22626163"
        "6b656e64223a2270657266222c22686f7374223a2268227d7d"),
    "read_v2": (
        "0000002f02057b2273223a342c22706964223a34322c22746964223a6e756c6c2c22636f756e74223a5b"
        "226c6f616473225d7d"),
    "read_tid_v2": (
        "0000002602057b2273223a352c22706964223a34322c22746964223a34332c22636f756e74223a5b5d7d"),
    "sync_v2": "0000000902067b2273223a367d",
    "ack_v2": "0000000902107b2273223a367d",
    "started_v2": "0000000902117b2273223a327d",
    "started_unsupported_v2": (
        "0000002102117b2273223a322c22756e737570706f72746564223a226e6f2070657266227d"),
    "reading_v2": (
        "0000004302127b2273223a342c2276616c756573223a7b226c6f616473223a5b372e302c312e305d7d2c"
        "22756e737570706f72746564223a7b2278223a226e6f20504d55227d7d"),
    "error_v2": (
        "00000044021f7b22636f6465223a226261645f736571222c226d657373616765223a2273657175656e63"
        "65206e756d626572203120646f6573206e6f7420666f6c6c6f772031227d"),
    "error_seq_v2": (
        "00000046021f7b22636f6465223a22666f7262696464656e222c226d657373616765223a2272756e2072"
        "2062656c6f6e677320746f20616e6f746865722075736572222c2273223a397d"),
    "context": (
        "0000005e02077b2273223a372c2263223a312c2272756e5f6964223a2272222c22706964223a34322c22"
        "686f7374223a2268222c226261636b656e64223a2270657266222c22636f756e74657273223a5b226c6f"
        "616473222c2273696d5f78225d7d"),
    # Added with the black box (not in the protocol before): built by hand from the layout.
    "buffer": "00000012020b7b2273223a31322c22626f78223a317d",
    "welcome_buffer": (
        "0000004402027b2276657273696f6e223a322c226d61785f6672616d65223a3236323134342c22756964"
        "223a313030302c22706964223a34322c22627566666572223a747275657d"),
    "context_empty": (
        "0000004f02077b2273223a372c2263223a322c2272756e5f6964223a2272222c22706964223a34322c22"
        "686f7374223a2268222c226261636b656e64223a226e6f6e65222c22636f756e74657273223a5b5d7d"),
    "open": (
        "0000002e0208000000000000000800010000000000000000000000000000006400000002000000010008"
        "65786368616e6765"),
    "open_params": (
        "0000004a020800000000000000090001000000000000000100000000000000c8ffffffffffffffff0002"
        "c3a97b226e223a332c22746167223a2278222c2266223a302e352c2262223a747275657d"),
    "close_empty": (
        "0000002a0209000000000000000a00020000000000000000000000000000009600000000000001900000"
        "00000000"),
    "close": (
        "000000720209000000000000000b00010000000000000000000000000000009600000000000001900000"
        "0054001600409f4000000000003fe000000000000000000000000003e801401c0000000000003ff00000"
        "0000000080000000000000007b226c325f6d6973736573223a226e6f20504d55227d"),
    # QUERY and RESULT came after the typed frames: their bytes as first released.
    "query": (
        "00000046020a7b2273223a31332c2277686174223a227265636f726473222c2272756e5f6964223a2272"
        "222c22756964223a313030302c226166746572223a5b2268222c34322c335d7d"),
    "result": (
        "0000004702137b2273223a31342c226974656d73223a5b7b2261223a317d5d2c226166746572223a5b22"
        "68222c34322c335d2c22756964223a313030302c2272756e5f6964223a2272227d"),
}

_REC = SuperstepRecord(
    run_id="r", index=3, name="é step", rank=1, pid=42, cpu=2, begin_ns=10, end_ns=25,
    counters={"loads": CounterValue(5.0, Source.MEASURED, 0.5, 4)}, params={"n": 3},
    flags=frozenset({"nested"}), backend="perf", host="h")
_LINE = {"run_id": "r", "index": 0, "name": "s", "rank": 0, "pid": 42, "cpu": 1, "begin_ns": 5,
         "params": {}, "backend": "none", "host": "h"}


def _json_frames(v: int) -> dict[str, protocol.Frame]:
    return {
        f"hello_v{v}": protocol.Hello(pid=42, host="h", job="j"),
        f"hello_nohost_v{v}": protocol.Hello(pid=42, job="old"),
        f"welcome_v{v}": protocol.Welcome(version=v, max_frame=262144, uid=1000, pid=42),
        f"begin_v{v}": protocol.Begin(1, _LINE),
        f"begin_count_v{v}": protocol.Begin(2, {"run_id": "r", "index": 1, "tid": 43},
                                            ["task_clock_ns"]),
        f"record_v{v}": protocol.Record(3, _REC),
        f"read_v{v}": protocol.Read(4, pid=42, tid=None, count=("loads",)),
        f"read_tid_v{v}": protocol.Read(5, pid=42, tid=43),
        f"sync_v{v}": protocol.Sync(6),
        f"ack_v{v}": protocol.Ack(6),
        f"started_v{v}": protocol.Started(2),
        f"started_unsupported_v{v}": protocol.Started(2, unsupported="no perf"),
        f"reading_v{v}": protocol.Reading(4, {"loads": (7.0, 1.0)}, {"x": "no PMU"}),
        f"error_v{v}": protocol.Error("bad_seq", "sequence number 1 does not follow 1"),
        f"error_seq_v{v}": protocol.Error("forbidden", "run r belongs to another user", s=9),
    }


_CLOSE_FLAGS = frozenset({"nested", "multiplexed", "unsupported_counters"})
_V2_FRAMES: dict[str, protocol.Frame] = {
    "context": protocol.Context(7, 1, "r", 42, "h", "perf", ("loads", "sim_x")),
    "context_empty": protocol.Context(7, 2, "r", 42, "h", "none"),
    "open": binary_frames.Open(8, 1, 0, 100, 2, 1, "exchange"),
    "open_params": binary_frames.Open(9, 1, 1, 200, -1, -1, "é",
                                 {"n": 3, "tag": "x", "f": 0.5, "b": True}),
    "close_empty": binary_frames.Close(10, 2, 0, 150, 400),
    "close": binary_frames.Close(
        11, 1, 0, 150, 400, _CLOSE_FLAGS,
        (binary_frames.WireCounter("loads", "measured", 2000.0, 0.5, 1000),
         binary_frames.WireCounter("sim_x", "simulated", 7.0, 1.0, None)),
        {"l2_misses": "no PMU"}),
    "query": query_frames.Query(13, "records", "r", 1000, ("h", 42, 3)),
    "buffer": protocol.Buffer(12, 1),
    "welcome_buffer": protocol.Welcome(version=2, max_frame=262144, uid=1000, pid=42,
                                       buffer=True),
    "result": query_frames.Result(14, ({"a": 1},), ("h", 42, 3), 1000, "r"),
}


def test_every_typed_frame_encodes_to_the_bytes_of_before() -> None:
    cases = {**_json_frames(1), **_json_frames(2), **_V2_FRAMES}
    assert set(cases) == set(GOLDEN)
    assert {type(f).TYPE for f in cases.values()} == set(FrameType)  # every frame type
    for name, frame in cases.items():
        version = 1 if name.endswith("_v1") else 2
        want = bytes.fromhex("".join(GOLDEN[name]))
        assert frame.encode(version) == want, name
        if isinstance(frame, json_frame.JsonFrame):  # and the untyped encoder agrees
            assert protocol.encode(type(frame).TYPE, frame.payload(), version) == want, name


def test_fast_open_and_close_encoders_are_the_typed_frames_bytes() -> None:
    op = _V2_FRAMES["open_params"]
    assert isinstance(op, binary_frames.Open)
    assert protocol.encode_open(9, 1, 1, 200, -1, -1, "é", op.params) == op.encode()
    assert protocol.encode_open(8, 1, 0, 100, 2, 1, "exchange") == _V2_FRAMES["open"].encode()
    # a CLOSE takes the client's CounterValues as they are (source: a Source)
    bits = protocol.flag_bits(_CLOSE_FLAGS)
    assert bits is not None
    values = [CounterValue(2000.0, Source.MEASURED, 0.5, 1000),
              CounterValue(7.0, Source.SIMULATED, 1.0, None)]
    assert protocol.encode_close(11, 1, 0, 150, 400, bits, values, {"l2_misses": "no PMU"}) \
        == _V2_FRAMES["close"].encode()
    assert protocol.encode_close(10, 2, 0, 150, 400, 0) == _V2_FRAMES["close_empty"].encode()
    with pytest.raises(struct.error):  # beyond the packed range: the client sends JSON
        protocol.encode_open(1, 1, 1 << 64, 0, 0, 0, "s")
    with pytest.raises(KeyError):
        protocol.encode_close(1, 1, 0, 0, 1, 0, [binary_frames.WireCounter("x", "guessed", 1.0)])
    with pytest.raises(ValueError):
        binary_frames.Close(1, 1, 0, 0, 1, frozenset({"no such flag"})).encode()


def test_typed_frames_decode_to_what_was_encoded() -> None:
    for version, frames in ((1, _json_frames(1)), (2, {**_json_frames(2), **_V2_FRAMES})):
        dec = Decoder(versions=protocol.ACCEPTED_VERSIONS)
        dec.feed(b"".join(f.encode(version) for f in frames.values()))
        assert list(dec.typed_frames()) == list(frames.values())
        assert dec.pending == 0
    # decode() is what typed_frames() uses; a CLOSE needs its context's counter names
    close = _V2_FRAMES["close"]
    body = close.encode()[protocol.HEADER_BYTES:]
    assert protocol.decode(FrameType.CLOSE, body, ("loads", "sim_x")) == close
    assert binary_frames.head(FrameType.CLOSE, body) == binary_frames.Head(s=11, c=1, index=0)
    with pytest.raises(ProtocolError) as err:
        protocol.decode(FrameType.CLOSE, body)
    assert err.value.code == "unknown_context"
    dec = Decoder()
    dec.feed(close.encode() + protocol.Sync(12).encode())  # no CONTEXT 1 in this stream
    with pytest.raises(ProtocolError) as err:
        list(dec.typed_frames())
    assert err.value.code == "unknown_context"
    assert list(dec.typed_frames()) == [protocol.Sync(12)]  # the stream goes on


def test_typed_decoding_refuses_with_the_daemons_codes() -> None:
    def code(fn: Callable[[], object]) -> tuple[str, str]:
        with pytest.raises(ProtocolError) as err:
            fn()
        return err.value.code, err.value.message

    assert code(lambda: protocol.Context.decode({"s": 1, "c": 0, "run_id": "r", "pid": 1,
                                                 "host": "h", "backend": "b"})) == (
        "bad_context", "malformed CONTEXT (fields of the wrong type or beyond their limits)")
    assert code(lambda: protocol.Context.decode({"s": 1})) == (
        "bad_context", "malformed CONTEXT ('c')")
    assert code(lambda: protocol.Begin.decode({"s": 1})) == (
        "bad_begin", "malformed begin line (no begin line)")
    assert code(lambda: protocol.Record.decode({"s": 1, "rec": 5}))[0] == "bad_record"
    for bad in ({"s": 1}, {"s": 1, "pid": "7"}, {"s": 1, "pid": 1e400}, {"s": 1, "pid": 2**31},
                {"s": 1, "pid": 7, "tid": True}, {"s": 1, "pid": 7, "count": "loads"}):
        assert code(lambda b=bad: protocol.Read.decode(b))[0] == "bad_read", bad
    assert code(lambda: protocol.Sync.decode({"s": True}))[0] == "bad_seq"
    # READ: a tid of 0 or null is the main thread
    assert protocol.Read.decode({"s": 1, "pid": 7, "tid": 0}) == protocol.Read(1, 7, None)
    # a HELLO is never refused; an empty job is no job
    assert protocol.Hello.decode({"job": 0, "pid": "x"}) == protocol.Hello()
    # "scratch" is true or absent (anything else: not scratch); the markers' scratch sink says it
    from counterd.markers.sinks.link import hello_payload

    assert protocol.Hello.decode(hello_payload("j", scratch=True)).scratch
    assert "scratch" not in hello_payload("j") and not protocol.Hello.decode(
        hello_payload("j")).scratch
    assert [protocol.Hello.decode({"scratch": v}).scratch for v in (1, "true", None)] == [False] * 3
    assert protocol.Hello(job="j", scratch=True).payload() == {"job": "j", "scratch": True}
    head = protocol.OPEN_HEAD.pack(1, 1, 0, 5, 0, 0, 3)
    assert code(lambda: binary_frames.Open.decode(head[:-1])) == (
        "bad_frame", "OPEN of 35 bytes is shorter than its 36-byte head")
    assert code(lambda: binary_frames.Open.decode(head + b"ab"))[0] == "bad_begin"  # cut short
    assert code(lambda: binary_frames.Open.decode(head + b"abc[1]"))[0] == "bad_begin"
    for tail in (b'{"x":NaN}', b'{"x":1e400}', b'{"x":"\\ud800"}', b'{"x":[1]}', b"[" * 10**5):
        assert code(lambda t=tail: binary_frames.Open.decode(head + b"abc" + t))[0] == "bad_begin"
    huge = protocol.OPEN_HEAD.pack(1, 1, (1 << 64) - 1, 5, 0, 0, 3)
    assert code(lambda: binary_frames.Open.decode(huge + b"abc"))[0] == "bad_begin"
    assert code(lambda: binary_frames.Open.decode(head[:-2] + b"\0\3\xed\xa0\x80"))[0] \
        == "bad_begin"  # an encoded surrogate is not UTF-8
    assert code(lambda: binary_frames.head(FrameType.CLOSE, b"\0" * 10))[0] == "bad_frame"
    close = protocol.CLOSE_HEAD.pack(1, 1, 0, 5, 6, 0, 0)
    counter = protocol.COUNTER.pack(9, 1.0, 1.0, 0)  # source 9 does not exist
    assert code(lambda: binary_frames.Close.decode(close, ("a",))) == (
        "bad_record", "malformed CLOSE (40 bytes for 1 counters and 0 bytes of unsupported "
                      "counters)")
    assert code(lambda: binary_frames.Close.decode(close + counter, ("a",)))[0] == "bad_record"
    bad_bits = protocol.CLOSE_HEAD.pack(1, 1, 0, 5, 6, 1 << 20, 0)
    assert code(lambda: binary_frames.Close.decode(bad_bits, ())) == (
        "bad_record", "malformed CLOSE (bad_close: unknown flag bits 0x100000)")
