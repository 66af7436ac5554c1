"""Section 4 and 6.5 of the memory logP paper (Cameron, Sun, Byna and Ge, "Predicting and
Evaluating Memory Communication Performance"): point-to-point and broadcast costs from a fitted
model (:class:`predictor.families.memlogp.MemLogP`), split as its Figure 8 stacks them, and the
point-to-point rows predicted against measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from predictor.errors import BadInput
from predictor.families.memlogp import Measurements, MemLogP, check_message

Array = NDArray[np.float64]


@dataclass(frozen=True)
class Cost:
    """A communication cost in seconds split as the paper's Figure 8 stacks it: overhead
    (the alpha part) and latency (the ell part), plus the network latency L."""

    what: str
    overhead_s: float
    latency_s: float
    network_s: float

    @property
    def total_s(self) -> float:
        return self.overhead_s + self.latency_s + self.network_s

    def to_json(self) -> dict[str, Any]:
        return {"what": self.what, "overhead_s": self.overhead_s, "latency_s": self.latency_s,
                "network_s": self.network_s, "total_s": self.total_s}


def _check_cost_args(s_bytes: int, d_bytes: int, procs: int, network_s: float) -> None:
    check_message(s_bytes, d_bytes)
    if not isinstance(procs, int) or procs < 2:
        raise BadInput(f"{procs!r} processors", "a transfer needs P >= 2")
    if not (math.isfinite(network_s) and network_s >= 0):
        raise BadInput(f"network latency L = {network_s!r} s",
                       "give L >= 0 (0 in shared memory)")


def p2p_cost(model: MemLogP, s_bytes: int, d_bytes: int, network_s: float = 0.0) -> Cost:
    """s (alpha + ell_pack) + L + s (alpha + ell_unpack) (section 4)."""
    _check_cost_args(s_bytes, d_bytes, 2, network_s)
    a = model.alpha_s_per_byte
    lat = float(model.ell("pack", s_bytes, d_bytes) + model.ell("unpack", s_bytes, d_bytes))
    return Cost("point-to-point", 2 * s_bytes * a, s_bytes * lat, network_s)


def broadcast_cost(model: MemLogP, s_bytes: int, d_bytes: int, procs: int,
                   network_s: float = 0.0) -> Cost:
    """The root sends to P - 1 processors one after the other: (P - 2) gaps s max(alpha, g),
    then the last message's p2p cost (section 6.5, corrected: module docstring)."""
    _check_cost_args(s_bytes, d_bytes, procs, network_s)
    p2p = p2p_cost(model, s_bytes, d_bytes, network_s)
    gaps = (procs - 2) * s_bytes * max(model.alpha_s_per_byte, model.g)
    return Cost(f"broadcast to {procs - 1}", p2p.overhead_s + gaps, p2p.latency_s, network_s)


def paper_broadcast_cost(model: MemLogP, s_bytes: int, d_bytes: int, procs: int,
                         network_s: float = 0.0) -> Cost:
    """The broadcast as section 6.5 prints it: (P + 1) s alpha + 2 s ell + L, with ell the
    mean of pack's and unpack's (for comparison; see :func:`broadcast_cost`)."""
    _check_cost_args(s_bytes, d_bytes, procs, network_s)
    lat = float(model.ell("pack", s_bytes, d_bytes) + model.ell("unpack", s_bytes, d_bytes))
    return Cost(f"broadcast to {procs - 1} (as printed)",
                (procs + 1) * s_bytes * model.alpha_s_per_byte, s_bytes * lat, network_s)


@dataclass(frozen=True)
class P2PRow:
    s_bytes: int
    d_bytes: int
    measured_s: float  # the sender's pack + the receiver's unpack on another CPU
    predicted_s: float
    local_s: float  # pack + unpack measured on one CPU (the paper's P = 1)

    @property
    def error(self) -> float:
        return self.predicted_s / self.measured_s - 1.0

    def to_json(self) -> dict[str, Any]:
        return {"s_bytes": self.s_bytes, "d_bytes": self.d_bytes,
                "measured_s": self.measured_s, "predicted_s": self.predicted_s,
                "local_s": self.local_s, "error": self.error}


def p2p_rows(model: MemLogP, m: Measurements) -> tuple[P2PRow, ...]:
    """Measured two-processor transfers (sender packs, receiver on another CPU unpacks)
    against :func:`p2p_cost` with L = 0, beside the same transfer measured on one CPU."""
    send = {(p.s_bytes, p.d_bytes): p for p in m.of("p2p.pack")}
    recv = {(p.s_bytes, p.d_bytes): p for p in m.of("p2p.unpack")}
    one = {(p.op, p.s_bytes, p.d_bytes): p for p in m.points}
    rows = []
    for key in sorted(send.keys() & recv.keys()):
        s, d = key
        measured = s * (send[key].per_byte_s + recv[key].per_byte_s)
        local = [one.get((op, s, d)) for op in ("pack", "unpack")]
        local_s = (s * sum(p.per_byte_s for p in local if p is not None)
                   if all(local) else float("nan"))
        rows.append(P2PRow(s, d, measured, p2p_cost(model, s, d).total_s, local_s))
    return tuple(rows)


def seconds_per_byte(v: float) -> str:
    """A cost per byte for people: "0.237 ns/B"."""
    from counterd.data.units import seconds

    return seconds(v) + "/B"


__all__ = ["Cost", "P2PRow", "broadcast_cost", "p2p_cost", "p2p_rows", "paper_broadcast_cost",
           "seconds_per_byte"]
