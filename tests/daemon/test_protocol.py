"""Wire protocol: framing, limits, versions (counterd/protocol.py)."""

from __future__ import annotations

import random
import struct

import pytest

from counterd import protocol
from counterd.protocol import Decoder, FrameType, ProtocolError


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
    from counterd.records import FLAGS

    assert set(protocol.FLAG_BITS) == set(FLAGS)
    flags = frozenset({"nested", "migrated", "unsupported_counters"})
    bits = protocol.flag_bits(flags)
    assert bits == (1 << 2) | (1 << 5) | (1 << 6)
    assert protocol.bit_flags(bits) == flags
    assert protocol.flag_bits(frozenset({"no such flag"})) is None
    with pytest.raises(ProtocolError):
        protocol.bit_flags(1 << len(protocol.FLAG_BITS))


def test_sources_on_the_wire_are_the_record_sources() -> None:
    from counterd.events import Source

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
