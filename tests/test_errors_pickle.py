"""Every error type survives a pickle round trip with its message and fields: errors cross
process boundaries (microbench workers, pilot runs)."""

from __future__ import annotations

import pickle

import pytest

from counterd.backends.callgrind.valgrind import CallgrindError
from counterd.data import errors as ce
from counterd.data.errors import StoreError
from counterd.prediction import NoPrediction
from counterd.wire.protocol import ProtocolError
from microbench.runner import RunnerError
from predictor import errors as pe

CASES = [
    ce.CounterdError("what happened", "the fix"),
    ce.BadInput("bad", "fix it"),
    ce.UnknownCounter("l9_misses"),
    ce.UnknownBackend("nope", ("perf", "sim")),
    ce.BackendUnavailable("perf", "no PMU", "use sim"),
    ce.EventNotSupported("l2_misses", "perf", "not on this CPU", "use callgrind"),
    ce.CounterAccessDenied("cycles", "pid 1", "paranoid=3", "run as root"),
    ce.NoSuchTarget("pid 123"),
    pe.PredictorError("what", "fix"),
    pe.MissingCounter("loads", "superstep 3", "F1"),
    pe.UnknownCounter("x", "results.json", ("loads", "stores")),
    pe.BadCounterValue("loads", "superstep 1", -5),
    pe.ProfileVersionError("node.toml", 9, (1, 2)),
    pe.InsufficientPatterns("F2", "store patterns"),
    pe.NotFittedError("PaperModel"),
    pe.NoVariant("superstep 1", ("task_clock_ns",), "improved", ("loads",), False),
    ProtocolError("bad_seq", "sequence number 'x' is not an integer"),
]


def _extra_cases() -> list[BaseException]:
    out: list[BaseException] = []
    for cls in (CallgrindError, StoreError, NoPrediction, RunnerError):
        try:
            out.append(cls("what", "fix"))  # type: ignore[call-arg]
        except TypeError:
            pytest.fail(f"{cls.__name__} no longer takes (what, fix): extend this test")
    return out


@pytest.mark.parametrize("err", CASES + _extra_cases(), ids=lambda e: type(e).__name__)
def test_error_pickles_with_message_and_fields(err: BaseException) -> None:
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err)
    assert str(back) == str(err)
    assert vars(back) == vars(err)
    assert str(back)  # a message, not an empty string
