"""The markers' compiled lanes through the daemon's socket (counterd.markers.native with
counterd.markers.sinks.socket.SocketSink): frames written into the client's black box, sent in
batches, every record acknowledged after commit. The same programs on the Python path
(``COUNTERD_NATIVE=0``) give the same records; a daemon killed and restarted under a program
with a superstep open loses nothing and duplicates nothing; threads marking at once keep the
frame numbers in order."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from counterd import _native
from counterd.data.records import SuperstepRecord
from tests.daemon.conftest import DaemonProc
from tests.daemon.test_daemon import run_py, stored, wait_for

pytestmark = pytest.mark.skipif(_native.hotpath() is None, reason="the hot path is not built")

SOFTWARE = "task_clock_ns,page_faults,context_switches"

PROGRAM = """
import json, counterd
from counterd.markers.api import recorder
for i in range(300):
    with counterd.superstep("p", i=i, tag="x" if i % 3 else ""):
        pass
with counterd.superstep("outer"):
    with counterd.superstep("inner", k=1.5):
        pass
try:
    with counterd.superstep("boom"):
        raise ValueError("bad input 7")
except ValueError:
    pass
sink = recorder().sink
print(json.dumps({"lanes": len(sink._lanes), "flushed": sink.flush(30)}))
"""


def shape(r: SuperstepRecord) -> tuple[object, ...]:
    """What both engines must agree on (times, cpu and counter values are the run's own)."""
    return (r.index, r.name, r.rank, r.params, sorted(r.flags - {"migrated"}),
            r.end_ns is None, {k: v.source for k, v in r.counters.items()},
            dict(r.unsupported), r.backend, r.exception)


@pytest.mark.parametrize("backend", ["none", "perf"])
def test_both_engines_store_the_same_records(daemon: DaemonProc, backend: str) -> None:
    got = {}
    for native in ("1", "0"):
        run_id = f"lanes-{backend}-{native}"
        out = run_py(PROGRAM, daemon.env(COUNTERD_RUN_ID=run_id, COUNTERD_NATIVE=native,
                                      COUNTERD_BACKEND=backend, COUNTERD_EVENTS=SOFTWARE
                                      if backend == "perf" else ""))
        assert out.returncode == 0, out.stderr
        said = json.loads(out.stdout)
        assert said == {"lanes": 1 if native == "1" else 0, "flushed": True}
        got[native] = stored(daemon, run_id)
        # The superstep that raised keeps what it raised through the socket and the store.
        assert {r.name: r.exception for r in got[native] if r.exception} == {
            "boom": "ValueError: bad input 7"}
        # Each process's marker pair, calibrated through a scratch connection to the same
        # daemon (none of whose supersteps is stored: 303 records, the program's own).
        costs = {r.marker_ns for r in got[native]}
        assert len(costs) == 1 and None not in costs, costs
        assert 100 < costs.pop() < 10_000_000  # 0.1 us .. 10 ms: measured, plausible
    assert len(got["1"]) == 303 == len(got["0"])
    assert [shape(r) for r in got["1"]] == [shape(r) for r in got["0"]]
    if backend == "perf":
        assert all(r.counters["task_clock_ns"].value > 0 for r in got["1"])
    assert "bad_seq" not in daemon.log_text()


RESTART = """
import sys, counterd
from counterd.markers.api import recorder
outer = counterd.superstep("outer")
outer.__enter__()
for i in range(50):
    with counterd.superstep("before", i=i):
        pass
sink = recorder().sink
assert sink.flush(30)
print("ready", flush=True)
sys.stdin.readline()  # the daemon is killed and started again meanwhile
for i in range(50):
    with counterd.superstep("after", i=i):
        pass
outer.__exit__(None, None, None)
print("flushed" if sink.flush(30) else "not flushed", sink.degraded, flush=True)
"""


@pytest.mark.parametrize("native", ["1", "0"])
def test_a_daemon_restarted_under_an_open_superstep(tmp_path: Path, native: str) -> None:
    """The daemon dies (kill -9) with the program inside "outer"; after it starts again the
    program's next markers reconnect, begin "outer" again and resend what was not
    acknowledged: every superstep is stored once, complete."""
    d = DaemonProc(tmp_path / "d").start()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(RESTART)], text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=d.env(COUNTERD_RUN_ID="restart", COUNTERD_NATIVE=native,
                      COUNTERD_BACKEND="perf", COUNTERD_EVENTS=SOFTWARE))
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read() if proc.stderr \
            else ""
        d.kill9()
        d.start()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert out.startswith("flushed None"), (out, err)
        recs = stored(d, "restart")
        names = sorted((r.name, r.params.get("i", -1)) for r in recs)
        assert names == sorted([("before", i) for i in range(50)]
                               + [("after", i) for i in range(50)] + [("outer", -1)])
        assert all(r.end_ns is not None and "incomplete" not in r.flags for r in recs)
        outer = next(r for r in recs if r.name == "outer")
        assert outer.end_ns is not None and outer.end_ns - outer.begin_ns > 0
    finally:
        d.stop()


def test_threads_marking_at_once_keep_frames_in_order(daemon: DaemonProc) -> None:
    out = run_py("""
        import json, threading, counterd
        from counterd.markers.api import recorder
        compiled = []
        def work(k):
            for i in range(500):
                with counterd.superstep("t", k=k, i=i):
                    pass
            # this thread's supersteps went through its compiled lane (the sink's set of
            # lanes is weak: an exited thread's lane goes once its steps are acknowledged)
            compiled.append(recorder()._local.st.lane is not None)
        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        sink = recorder().sink
        print(json.dumps({"lanes": sum(compiled), "flushed": sink.flush(30)}))
    """, daemon.env(COUNTERD_RUN_ID="threads", COUNTERD_BACKEND="perf",
                    COUNTERD_EVENTS=SOFTWARE))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"lanes": 4, "flushed": True}
    recs = stored(daemon, "threads")
    assert sorted((r.params["k"], r.params["i"]) for r in recs) == \
        [(k, i) for k in range(4) for i in range(500)]
    # calibrated once for the process, whichever thread began first, the others waiting
    assert len({r.marker_ns for r in recs}) == 1 and recs[0].marker_ns is not None
    assert "bad_seq" not in daemon.log_text() and "refused" not in daemon.log_text()
    assert os.path.exists(daemon.socket)


# -- found by review: each of these failed before its fix ------------------------------------

def _daemon(tmp_path: Path, socket_extra: str) -> DaemonProc:
    d = DaemonProc(tmp_path / "d")
    d.write_config(socket_extra=socket_extra)
    return d.start()


@pytest.mark.parametrize("native", ["1", "0"])
def test_a_refused_close_of_a_lane_is_counted(tmp_path: Path, native: str) -> None:
    """The daemon refuses a superstep's OPEN (one open per connection here), then its CLOSE;
    the ERROR read by a READ's wait (not by an ACK) still counts as refused, so flush() says
    False, on both engines (the lane's step was not yet held as unacknowledged)."""
    d = _daemon(tmp_path, "max_open_per_client = 1\n")
    try:
        out = run_py("""
            import json, os, counterd
            from counterd.markers.api import recorder
            with counterd.superstep("warm"):
                pass
            sink = recorder().sink
            assert sink.flush(10)
            with counterd.superstep("outer"):
                with counterd.superstep("inner"):
                    pass
                sink.read(os.getpid(), [])
            print(json.dumps({"flushed": sink.flush(10), "refused": sink.refused_count}))
        """, d.env(COUNTERD_RUN_ID="refused", COUNTERD_NATIVE=native, COUNTERD_BACKEND="none"))
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout) == {"flushed": False, "refused": 1}
        assert sorted(r.name for r in stored(d, "refused")) == ["outer", "warm"]
    finally:
        d.stop()


def test_a_forked_childs_read_leaves_its_parents_black_box(daemon: DaemonProc) -> None:
    """A forked child asking its parent's sink for a READ gets no connection, and the
    parent's black box keeps its head: the parent, killed with frames unsent, loses none."""
    code = """
        import os, signal, counterd
        from counterd.markers.sinks import link as client
        from counterd.markers.api import recorder
        client.BATCH_S = 30.0  # no batch falls due by time during the test
        with counterd.superstep("warm"):
            pass
        sink = recorder().sink
        assert sink.flush(10)
        for i in range(5):
            with counterd.superstep("before", i=i):
                pass
        pid = os.fork()
        if pid == 0:
            os._exit(0 if sink.read(os.getpid(), [])["code"] == "unreachable" else 3)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        for i in range(5):
            with counterd.superstep("after", i=i):
                pass
        os.kill(os.getpid(), signal.SIGKILL)
    """
    out = run_py(code, daemon.env(COUNTERD_RUN_ID="forked", COUNTERD_BACKEND="none"))
    assert out.returncode == -9, out.stderr
    wait_for(lambda: len(stored(daemon, "forked")) == 11, what="the 11 records")


def test_an_idle_connection_with_frames_in_its_black_box_stays(tmp_path: Path) -> None:
    """Finished supersteps waiting in the black box for their batch, then a phase without
    markers longer than socket.idle_timeout_s, then kill -9: the daemon did not close the
    connection as idle (it would never have read them), and stores them."""
    d = _daemon(tmp_path, "idle_timeout_s = 1\n")
    try:
        out = run_py("""
            import os, signal, time, counterd
            from counterd.markers.api import recorder
            with counterd.superstep("warm"):
                pass
            assert recorder().sink.flush(10)
            for i in range(3):
                with counterd.superstep("work", i=i):
                    pass
            time.sleep(3)
            os.kill(os.getpid(), signal.SIGKILL)
        """, d.env(COUNTERD_RUN_ID="idle", COUNTERD_BACKEND="none"))
        assert out.returncode == -9, out.stderr
        wait_for(lambda: len(stored(d, "idle")) == 4, what="the 4 records")
        assert "idle:" not in d.log_text()
    finally:
        d.stop()


def test_a_step_begun_the_python_way_and_ended_by_its_lane_is_not_left_open(
        daemon: DaemonProc) -> None:
    """A lane's begin while another holder has the sink's lock goes the Python way (the
    sink keeps it as open); its end through the lane must close it there too, or every
    reconnection would begin it again and the daemon would hold a phantom."""
    out = run_py("""
        import json, counterd
        from counterd.markers.api import recorder
        with counterd.superstep("warm"):
            pass
        sink = recorder().sink
        with sink._lock:
            step = counterd.superstep("a")
            step.__enter__()
        step.__exit__(None, None, None)
        print(json.dumps({"flushed": sink.flush(10), "open": len(sink._open)}))
    """, daemon.env(COUNTERD_RUN_ID="phantom", COUNTERD_BACKEND="none"))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"flushed": True, "open": 0}


def test_a_connection_left_open_by_a_forked_child_reads_nothing_of_the_next(
        daemon: DaemonProc) -> None:
    """The parent drops its connection (here by hand) while a forked child keeps it open; the
    parent's next connection uses the same black box. When the child exits, the old session
    reads nothing from the box (its head names the new connection): no frame is handled
    twice, no protocol error, every record stored once."""
    out = run_py("""
        import os, json, time, counterd
        from counterd.markers.sinks import link as client
        from counterd.markers.api import recorder
        client.BATCH_S = 30.0
        with counterd.superstep("warm"):
            pass
        sink = recorder().sink
        assert sink.flush(10)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # keeps the first connection open until told
            os.close(w)
            os.read(r, 1)
            os._exit(0)
        os.close(r)
        with sink._lock:
            sink._disconnect("by hand")
            assert sink._attempt(force=True)
        for i in range(20):
            with counterd.superstep("next", i=i):
                pass  # waiting in the box, unsent
        os.write(w, b"x")  # the child exits: the first connection ends
        os.waitpid(pid, 0)
        time.sleep(0.5)
        print(json.dumps({"flushed": sink.flush(10)}))
    """, daemon.env(COUNTERD_RUN_ID="stale", COUNTERD_BACKEND="none"))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"flushed": True}
    assert sorted(r.params.get("i", -1) for r in stored(daemon, "stale")) == [-1, *range(20)]
    log = daemon.log_text()
    assert "unsent in its black box" not in log and "bad_seq" not in log
