"""Regression tests of the issue "Reliability": every attack of bench/attacks.py, each against
a fresh daemon, must leave it alive, ``/metrics`` answering and a fresh client's records stored,
and must meet its own expectation (refused with an ERROR, RSS and log growth bounded, nothing
stored for a forbidden run, no traceback from a file command, ...).

The attacks are defined once, in bench/attacks.py; these tests run them at ``--quick`` scale.
Those that take longer than a few seconds are marked ``slow``; those that need a second uid,
a setuid program or a tmpfs skip with the reason when not run as root.
"""

from __future__ import annotations

import attacks
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from counterd.wire import protocol

SLOW = {
    "1030 idle connections after HELLO from one user",
    "fd exhaustion (RLIMIT_NOFILE 64): EMFILE",
    "CONTEXT frames with distinct run ids, then disconnect",
    "slowloris (1 byte/s inside a frame)",
    "connect-and-drop flood",
    "kill -9 under 8 writers, restart with them running",
    "backend none: acknowledgements read, memory bounded",
    "disk full (8 MB tmpfs)",
    "SIGTERM under load (acknowledged kept)",
    "200 SIGHUPs under load",
    "first superstep open while the daemon restarts",
    "file commands x hostile files",
    "2,000 pipelined QUERY runs after 20,000 own runs",
}
NEEDS_FILES = {"disk full (8 MB tmpfs)", "file commands x hostile files"}


def _params() -> list[object]:
    out: list[object] = []
    for category, name, fn in attacks.ATTACKS:
        if category == "recorder":  # no daemon in them: test_spool_attacks.py, at small scale
            continue
        marks = [pytest.mark.slow] if name in SLOW else []
        out.append(pytest.param(name, fn, id=f"{category}: {name}", marks=marks))
    return out


@pytest.mark.parametrize(("name", "fn"), _params())
def test_attack(lab: attacks.Lab, name: str, fn: attacks.Attack) -> None:
    if name in NEEDS_FILES:
        attacks._valid_inputs(lab)
    checks = fn(lab)
    after = attacks.health(lab.daemon)
    skipped = [c for c in checks if c.skipped]
    if skipped and len(skipped) == len(checks):
        pytest.skip(skipped[0].why or "skipped")
    failed = [f"{c.name or name}: {c.why}" for c in checks if c.why and not c.skipped]
    assert not failed and not after, "\n".join(failed + [f"after the attack: {w}"
                                                          for w in after])


def test_every_category_has_attacks() -> None:
    """The script's tally covers each category the issue counts."""
    assert {c for c, _, _ in attacks.ATTACKS} == set(attacks.CATEGORIES)


def test_refused_frame_is_seen_as_refused(lab: attacks.Lab) -> None:
    """The yardstick itself: a frame the daemon refuses reads as "error", one it stores as
    "ack" (else every expectation above would pass or fail for the wrong reason)."""
    c = attacks.Conn(lab.daemon.socket)
    c.send(attacks.jframe(protocol.FrameType.RECORD, '{"s":1,"rec":{"format":99}}'))
    assert c.outcome(1, sync=2).startswith("error")
    c.send(attacks.jframe(protocol.FrameType.RECORD,
                          attacks.record_text(attacks.new_run("good"), seq=3)))
    assert c.outcome(3, sync=4) == "ack"
    c.close()


@pytest.fixture(scope="module")
def shared_daemon(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("fuzz")
    tmp.chmod(0o755)
    d = attacks.LiveDaemon(tmp / "d").start()
    yield d
    d.stop()


_CLIENT_TYPES = sorted(int(t) for t in protocol.CLIENT_TYPES)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ftype=st.sampled_from(_CLIENT_TYPES + [0, 2, 16, 31, 255]),
       body=st.one_of(st.binary(max_size=512),
                      st.recursive(st.none() | st.booleans() | st.integers()
                                   | st.floats(allow_nan=True) | st.text(max_size=20),
                                   lambda kids: st.lists(kids, max_size=4)
                                   | st.dictionaries(st.text(max_size=8), kids, max_size=4),
                                   max_leaves=20).map(lambda v: attacks.json.dumps(v)
                                                      .encode())),
       hello=st.booleans())
def test_any_frame_is_answered_and_the_daemon_serves_on(shared_daemon, ftype: int,
                                                        body: bytes, hello: bool) -> None:
    """Property: whatever one frame holds, before or after HELLO, the daemon answers it (or
    closes the connection) within seconds, and stays alive and serving: a SYNC on a fresh
    connection is acknowledged."""
    c = attacks.Conn(shared_daemon.socket, hello=hello)
    c.send(attacks.frame(ftype, body))
    c.send(attacks.jframe(protocol.FrameType.SYNC, '{"s":1000000}'))
    got = c.wait(lambda: bool(c.errors()) or c.acked() > 0, 5.0)
    c.close()
    assert got, "neither answered nor closed in 5 s"
    assert shared_daemon.alive()
    fresh = attacks.Conn(shared_daemon.socket)
    fresh.send(attacks.jframe(protocol.FrameType.SYNC, '{"s":1}'))
    assert fresh.outcome(1) == "ack"
    fresh.close()

