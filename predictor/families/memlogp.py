"""Memory logP: the cost of memory communication (copy, pack, unpack) per byte.

From Cameron, Sun, Byna and Ge, "Predicting and Evaluating Memory Communication Performance"
(sections 2-4 and 6). A message of s bytes whose words lie d bytes apart costs, per byte,

    T(s, d) = alpha + ell(s, d)                       (eq. 15: T_word = cpi_contig + ...)

* alpha (``alpha_s_per_byte``): the overhead, the cost per byte of an *ideally distributed*
  (contiguous, cache-resident) transfer: here the median cost per byte of the contiguous copy
  over the sizes whose source and destination fit the first-level cache (section 6.1: "the
  alpha term is the cost associated with movement of contiguous data").
* ell(s, d) (``ell``): the effective latency, what data size and distribution add (section 6.1:
  "after subtracting the ideal overhead, the ell function remains"). It is never below 0
  (section 2: ell is bounded below by alpha's cost), so a fitted T below alpha is raised to it.

Prediction of ell (section 6.2): a curve fitted per operation, "constrained to the size
characteristics of the memory hierarchy and the data characteristics of size (s) and
distribution (d)". Eq. 16 writes the average access time as sum_j T_j P(stack distance >
S_{j-1}); for a message copied again and again (the paper's mpptest loop) every access of a
side of the transfer has the same reuse distance, the side's footprint. So each term is
(lines the transfer moves per byte) x (the fraction of them that miss level j), with the
fraction from the level's size, associativity and line and the page size of the machine
description, never fitted:

* a side with stride d touches min(d, line)/(8 line) lines per byte (one per word from
  d = line on) and holds n min(d, line) bytes of lines, n = s/8 words;
* its effective capacity at level j is ways x line x the sets its addresses can reach: a
  stride that is a multiple of the line reaches line slots = (page/line) / gcd(page/line,
  d/line) of each page, and a level with more sets than a page has slots (physically indexed:
  the page frame picks the colour) multiplies them by sets / (page/line);
* a level holds the message's lines as a set-associative LRU cache under a cyclic reference
  string: a set with k <= ways of the lines hits them all, a set with k > ways misses them
  all (each line is evicted just before its reuse), so f_j is the fraction of lines in
  overfull sets (:func:`lru_miss_fraction`). The mean load of a line's set is every side's
  lines over the sets it reaches; where the index lies within the page (L1) the lines spread
  evenly and f_j is a step at the capacity; where page frames of random colour pick part of
  the set (a physically indexed L2), the other lines of a line's set are ~ Poisson(load) and
  f_j = P(Poisson(load) >= ways) (checked against a brute-force LRU simulation in the
  tests). (The previous ramp max(0, 1 - capacity/footprint) is random replacement's rate; it
  rose too late and too slowly for this host's transitions.)
* the last level is hashed: its slices are picked by a hash of the physical address (Intel's
  and AMD's sliced L3s), so every stride reaches all its sets (no colour reduction there);
  it is also shared (with other CPUs, and in a virtual machine with other guests): its
  capacity is a candidate at its size over 1, 2 and 4 (``m3s_2``, ``m3p_4``, ...), and the
  term search keeps what the host shows;
* lines of a side with d <= line are streamed (the hardware prefetches neighbours), lines of a
  side with d > line are sparse: each gets its own cost per level (``m<j>s``, ``m<j>p``); the
  contiguous copy's streamed lines (``m<j>v``) are apart from the word loop's, whose loop
  hides most of a miss (0.24 ns/B per word against the vector copy's 0.01 ns/B);
* the TLB (which the paper leaves out and blames for its errors at large s and d): pages per
  byte min(d, page)/(8 page) of each side times the miss fraction of a fully associative LRU
  TLB under the cyclic string of the span's pages (a step at its reach), for the
  description's DTLB entries and 4, 16, 64, 256 times it (``tlb64``, ``tlb1024``, ...): sysfs
  lists no TLB on x86 and no description has the second-level one;
* the page walk of a TLB miss (``w<j>``, levels 2 on): it reads the page's 8-byte entry, the
  entries of the span lie together (span/page x 8 bytes) and share level j with the data, so
  pages per byte x the LRU miss fraction of (entry lines + data lines) at level j;
* ``loop``: 1 where the kernel copies one word per row (pack, unpack, strided copy), 0 for the
  contiguous copy, which moves whole rows with vector instructions (copy only).

The toolkit (:func:`predictor.toolkit.model.fit_model`) fits T(s, d) per operation on these terms
by relative-error least squares with costs >= 0, and Brewer's t-tests drop the terms that do
not earn their place (``modeler="brewer"``; ``"fixed"`` keeps all).

Point-to-point and broadcast costs (sections 4 and 6.5), for a message of s bytes:

    p2p(s, d)         = s (alpha + ell_pack) + L + s (alpha + ell_unpack)
    broadcast(P, s, d) = (P - 2) s max(alpha, g) + p2p(s, d)           (P >= 2)

The paper prints the broadcast as (P - 1) max(o, g) + 2 (o + ell) + L = (P + 1) o + 2 ell + L.
That does not reduce to its own point-to-point cost o + L + o at P = 2 (it gives 3o + L): the
root's sends start at 0, g, ..., (P - 2) g, and the last one costs o + L + o, so the gap is
paid P - 2 times, not P - 1. The corrected count, P o + 2 ell + L, is also the one the paper's
Figure 8 divides by ("dividing (P+1)*alpha ... by P+1 = 8" for an 8-way broadcast, P = 8).
Both are given (``broadcast_cost``, ``paper_broadcast_cost``). Section 4's "2 (alpha + ell)"
with ell "the average cost between packing ... and unpacking" is the p2p above.

Other deviations found (predictor/NOTES.md, "Memory logP"): eq. 16's OCR'd left side sums
from j = 2 but its right side starts with T_1 (the right side is the derivable one); eq. 15
names alpha cpi_contig, which grows with s once the contiguous copy leaves the caches, while
section 2 defines alpha as constant: alpha here is the cache-resident contiguous cost, and what
the contiguous copy adds beyond the caches is its ell (eq. 11's cpi_mem).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from counterd.data.errors import CounterdError
from counterd.machine.geometry import CacheLevel
from counterd.machine.views import GeometryTable
from predictor.errors import BadInput
from predictor.toolkit import model as modeling

Array = NDArray[np.float64]

# The results document ``microbench memlogp`` writes (a contract between the two packages).
# Format history: version 1 (issue 12): host metadata, geometry, call overhead, per point the
# operation, s, d, repetitions per call, raw samples (ns), median, cost per byte (s).
FORMAT = "counterd-memlogp"
VERSION = 1
SUPPORTED_VERSIONS = (1,)
WORD_BYTES = 8
OPS = ("copy", "pack", "unpack")
P2P_ROLES = ("p2p.pack", "p2p.unpack")  # sender packs, receiver unpacks on another CPU
LEVEL_TERMS = ("m{j}s", "m{j}p")  # streamed and sparse lines missing level j, per byte


# -- the hierarchy -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Hierarchy:
    """Cache levels (size, ways, line), page size and TLB entries of the machine description
    (:mod:`counterd.machine`): what constrains the curves."""

    levels: tuple[CacheLevel, ...]
    page_bytes: int = 4096
    tlb_entries: int = 64

    def __post_init__(self) -> None:
        if not self.levels:
            raise BadInput("no cache levels", "give the machine's cache geometry")
        if self.page_bytes <= 0 or self.tlb_entries <= 0:
            raise BadInput(f"page {self.page_bytes} B, {self.tlb_entries} TLB entries",
                           "both must be > 0")

    def to_json(self) -> dict[str, Any]:
        return {"levels": [{"level": lv.level, "size_bytes": lv.size_bytes, "ways": lv.ways,
                            "line_bytes": lv.line_bytes} for lv in self.levels],
                "page_bytes": self.page_bytes, "tlb_entries": self.tlb_entries}

    @classmethod
    def from_json(cls, d: Mapping[str, Any], where: str = "geometry") -> Hierarchy:
        try:
            levels = GeometryTable(d).cache_levels()
            return cls(levels, int(d.get("page_bytes", 4096)), int(d.get("tlb_entries", 64)))
        except (KeyError, TypeError, ValueError, CounterdError) as exc:
            raise BadInput(f"{where}: not a cache geometry ({type(exc).__name__}: {exc})",
                           "give a file written by microbench memlogp") from None


def line_slots(d_bytes: ArrayLike, line_bytes: int, page_bytes: int) -> Array:
    """Distinct line positions within a page that words d bytes apart reach: all page/line
    of them for d < line or d not a multiple of the line, else (page/line) / gcd(page/line,
    d/line) (one for d a multiple of the page)."""
    d = np.asarray(d_bytes, dtype=np.int64)
    per_page = max(1, page_bytes // line_bytes)
    lines = np.maximum(d // line_bytes, 1)
    g = np.gcd(lines, per_page)
    out = np.where((d >= line_bytes) & (d % line_bytes == 0), per_page // g, per_page)
    return out.astype(np.float64)


def effective_capacity(level: CacheLevel, d_bytes: ArrayLike, page_bytes: int) -> Array:
    """Bytes of lines a side with stride d can keep in ``level``: ways x line x the sets its
    addresses reach (module docstring). A level with more sets than a page has line slots is
    taken as physically indexed with page frames of every colour."""
    per_page = max(1, page_bytes // level.line_bytes)
    colours = max(1, level.sets // per_page)
    sets = np.minimum(level.sets, line_slots(d_bytes, level.line_bytes, page_bytes) * colours)
    return level.ways * level.line_bytes * sets


def miss_fraction(pressure: ArrayLike) -> Array:
    """max(0, 1 - 1/r) for a level under pressure r (footprint / capacity, summed over sides):
    random replacement's miss rate on a cyclic reference string (kept for comparison; the
    curve terms use :func:`lru_miss_fraction`)."""
    r = np.asarray(pressure, dtype=np.float64)
    return np.where(r > 1.0, 1.0 - 1.0 / np.maximum(r, 1.0), 0.0)


def poisson_tail(lam: ArrayLike, k: int) -> Array:
    """P(K >= k) for K ~ Poisson(lam): 1 - sum_{i<k} e^-lam lam^i / i! (k small: a cache's
    ways)."""
    lam = np.maximum(np.asarray(lam, dtype=np.float64), 0.0)
    term = np.exp(-lam)
    below = np.zeros_like(lam)
    for i in range(k):
        below = below + term
        term = term * lam / (i + 1)
    return np.clip(1.0 - below, 0.0, 1.0)


def lru_miss_fraction(load: ArrayLike, ways: int, random_frames: bool) -> Array:
    """The fraction of a side's lines that miss a set-associative LRU level when the message is
    copied again and again (a cyclic reference string), ``load`` the mean number of lines
    (of every side) that share a line's set.

    A set holding k distinct lines of a cycle hits them all while k <= ways and misses them
    all when k > ways (LRU evicts each line just before its reuse), so the miss fraction is
    the fraction of lines in sets holding more than ``ways`` lines:

    * ``random_frames`` (a physically indexed level with more sets than a page has lines, so
      the page frame's colour picks part of the set, and frames come in random colours): a
      page puts at most one line of a side in a given set, so the number of *other* lines in
      a line's set is a sum of Bernoulli draws, ~ Poisson(load), and the line misses when they
      are >= ways: f = P(Poisson(load) >= ways);
    * else (the index lies within the page: the addresses pick the sets) the lines spread
      evenly, floor(load) or ceil(load) per set: f = 0 for load <= ways, (load - ways)
      (ways + 1) / load between ways and ways + 1 (the lines in the sets with ways + 1),
      1 beyond: a step at the capacity.
    """
    x = np.asarray(load, dtype=np.float64)
    if random_frames:
        return poisson_tail(x, ways)
    between = (x - ways) * (ways + 1) / np.maximum(x, 1e-300)
    return np.where(x <= ways, 0.0, np.where(x >= ways + 1, 1.0, between))


def sides(op: str, d_bytes: ArrayLike) -> tuple[Array, Array]:
    """(load stride, store stride) in bytes of ``op`` at stride d: pack gathers (strided
    loads, contiguous stores), unpack scatters, copy is strided on both sides (section 6.1's
    direct copy of non-contiguous data; d = 8 is the contiguous copy)."""
    d = np.asarray(d_bytes, dtype=np.float64)
    w = np.full_like(d, WORD_BYTES)
    if op == "copy":
        return d, d
    if op == "pack":
        return d, w
    if op == "unpack":
        return w, d
    raise BadInput(f"unknown operation {op!r}", "choose " + ", ".join(OPS))


def check_message(s_bytes: ArrayLike, d_bytes: ArrayLike, where: str = "message") -> None:
    s, d = np.asarray(s_bytes, dtype=np.float64), np.asarray(d_bytes, dtype=np.float64)
    bad_s = ~np.isfinite(s) | (s < WORD_BYTES) | (np.mod(s, WORD_BYTES) != 0)
    bad_d = ~np.isfinite(d) | (d < WORD_BYTES) | (np.mod(d, WORD_BYTES) != 0)
    if np.any(bad_s):
        raise BadInput(f"{where}: size {float(np.ravel(s)[np.flatnonzero(bad_s)[0]]):g} B",
                       f"give whole {WORD_BYTES} B words, s >= {WORD_BYTES}")
    if np.any(bad_d):
        raise BadInput(f"{where}: stride {float(np.ravel(d)[np.flatnonzero(bad_d)[0]]):g} B",
                       f"give a stride of whole {WORD_BYTES} B words (8 is contiguous)")


def features(op: str, s_bytes: ArrayLike, d_bytes: ArrayLike, h: Hierarchy
             ) -> dict[str, Array]:
    """The inputs of the curve terms (per byte of message) for ``op`` at (s, d): ``s``, ``d``,
    ``loop``, per level j ``m<j>s``, ``m<j>p`` (and ``m<j>v`` for copy), ``w<j>`` from level
    2 on, and ``tlb<entries>`` (module docstring)."""
    check_message(s_bytes, d_bytes)
    s = np.asarray(s_bytes, dtype=np.float64)
    d = np.asarray(d_bytes, dtype=np.float64)
    s, d = np.broadcast_arrays(s, d)
    n = s / WORD_BYTES
    out: dict[str, Array] = {"s": s.astype(float), "d": d.astype(float)}
    out["loop"] = (d > WORD_BYTES).astype(float) if op == "copy" else np.ones_like(s)
    ld, st = sides(op, d)
    strides = (ld, st)
    page = h.page_bytes
    # Pages a side touches: n words d apart, one word per page once d >= page (the TLB's
    # term); the page-walk entries below cover the span's pages.
    touched_pages = sum(np.ceil(n * np.minimum(x, page) / page) for x in strides)
    span_pages = sum(np.ceil(n * x / page) for x in strides)
    per_byte_pages = sum(np.minimum(x, page) / (WORD_BYTES * page) for x in strides)
    for lv in h.levels:
        line = lv.line_bytes
        random_frames = lv.sets > max(1, page // line)
        hashed = lv is h.levels[-1] and len(h.levels) > 1
        lines = [n * np.minimum(x, line) / line for x in strides]
        # Sets each side reaches: the stride's line slots x the page colours (module
        # docstring); a hashed last level spreads every stride over all its sets.
        reach = [np.full_like(s, float(lv.sets)) if hashed
                 else effective_capacity(lv, x, page) / (lv.ways * line) for x in strides]
        for share in shares(lv, h):
            streamed = np.zeros_like(s)
            sparse = np.zeros_like(s)
            for i, stride in enumerate(strides):
                # Mean lines in a set of side i: every side's lines over the sets it reaches,
                # the narrower side's sets lying within the wider one's (a line of side i
                # meets lines_k / max(reach_i, reach_k) lines of side k on average); a
                # share of the level leaves it 1/share of the ways.
                load = share * sum(lines[k] / np.maximum(reach[i], reach[k])
                                   for k in range(len(strides)))
                f = lru_miss_fraction(load, lv.ways, random_frames or hashed)
                per_byte = np.minimum(stride, line) / (WORD_BYTES * line)
                streamed = streamed + np.where(stride <= line, f * per_byte, 0.0)
                sparse = sparse + np.where(stride > line, f * per_byte, 0.0)
            suffix = "" if share == 1 else f"_{share}"
            if op == "copy":  # the vector copy's lines apart from the word loop's
                out[f"m{lv.level}v{suffix}"] = (1.0 - out["loop"]) * streamed
                streamed = out["loop"] * streamed
            out[f"m{lv.level}s{suffix}"] = streamed
            out[f"m{lv.level}p{suffix}"] = sparse
            if lv is not h.levels[0]:
                # The page walk of a TLB miss reads the page's 8-byte entry; the entries of
                # a side's span lie together (span / page x 8 bytes) and share the level
                # with the data lines: a page whose entry misses costs one more line.
                walk = share * (span_pages * 8 / line + sum(lines)) / lv.sets
                out[f"w{lv.level}{suffix}"] = (
                    lru_miss_fraction(walk, lv.ways, random_frames or hashed) * per_byte_pages)
    for entries in tlb_reaches(h):
        # A fully associative LRU TLB under the cyclic string of pages: a step at its reach.
        out[f"tlb{entries}"] = lru_miss_fraction(touched_pages, entries, False) * per_byte_pages
    return out


def tlb_reaches(h: Hierarchy) -> tuple[int, ...]:
    """TLB sizes (entries) the curve may use: the machine description's DTLB and 2, 4, ...
    256 times it (second-level TLBs come in powers of two times the first's: 1536-3072 entries
    on current x86). Descriptions read from sysfs know no TLB (x86 does not list it there) and
    none knows a second-level TLB; which reach the host has is left to the term search."""
    return tuple(h.tlb_entries * 2 ** k for k in range(9))


def shares(level: CacheLevel, h: Hierarchy) -> tuple[int, ...]:
    """1 for a private level; for the last level, shared with other CPUs (and, in a virtual
    machine, with other guests), 1, 2 and 4: the capacity a transfer may count on is the
    level's size over one of these, and the term search picks which."""
    return (1, 2, 4) if level is h.levels[-1] and len(h.levels) > 1 else (1,)


def candidate_terms(op: str, h: Hierarchy) -> tuple[str, ...]:
    """The curve's candidate terms for ``op`` (text forms of :mod:`predictor.toolkit.terms`)."""
    terms = ["1"] + (["loop"] if op == "copy" else [])
    for lv in h.levels:
        for share in shares(lv, h):
            suffix = "" if share == 1 else f"_{share}"
            terms += [t.format(j=lv.level) + suffix for t in LEVEL_TERMS]
            if op == "copy":
                terms.append(f"m{lv.level}v{suffix}")
            if lv is not h.levels[0]:
                terms.append(f"w{lv.level}{suffix}")
    return (*terms, *(f"tlb{e}" for e in tlb_reaches(h)))


# -- measurements ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Point:
    """One measured transfer: ``op`` (copy, pack, unpack, or a p2p role), s and d in bytes,
    the cost per byte in seconds (median, call overhead removed), and the run's flags."""

    op: str
    s_bytes: int
    d_bytes: int
    per_byte_s: float
    flags: tuple[str, ...] = ()
    spread: float = 0.0

    def __post_init__(self) -> None:
        if self.op not in OPS + P2P_ROLES:
            raise BadInput(f"point with operation {self.op!r}",
                           "choose " + ", ".join(OPS + P2P_ROLES))
        check_message(self.s_bytes, self.d_bytes, where=f"{self.op} point")
        if not (math.isfinite(self.per_byte_s) and self.per_byte_s > 0):
            raise BadInput(f"{self.op} s={self.s_bytes} d={self.d_bytes}: cost per byte "
                           f"{self.per_byte_s!r}", "costs are finite and > 0: rerun the "
                           "measurement")

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "s_bytes": self.s_bytes, "d_bytes": self.d_bytes,
                "per_byte_s": self.per_byte_s, "flags": list(self.flags),
                "spread": self.spread}


@dataclass(frozen=True)
class Measurements:
    """What ``microbench memlogp`` measured: the points, the hierarchy, the host."""

    points: tuple[Point, ...]
    hierarchy: Hierarchy
    host: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""

    def of(self, op: str) -> tuple[Point, ...]:
        return tuple(p for p in self.points if p.op == op)


def measurements_from_json(doc: Any, where: str = "results") -> Measurements:
    """The measurements of a results document (format ``counterd-memlogp``); BadInput names
    the field and the fix."""
    from predictor.inputs import check_format

    doc = check_format(doc, FORMAT, SUPPORTED_VERSIONS, where, "microbench memlogp")
    geometry = doc.get("geometry")
    if not isinstance(geometry, dict):
        raise BadInput(f"{where} has no geometry", "rerun microbench memlogp")
    h = Hierarchy.from_json({**geometry, "page_bytes": doc.get("page_bytes",
                                                              geometry.get("page_bytes", 4096))},
                            f"{where}: geometry")
    raw = doc.get("points")
    if not isinstance(raw, list) or not raw:
        raise BadInput(f"{where} has no measured points", "rerun microbench memlogp")
    pts = []
    for i, p in enumerate(raw):
        try:
            pts.append(Point(str(p["op"]), int(p["s_bytes"]), int(p["d_bytes"]),
                             float(p["per_byte_s"]), tuple(str(f) for f in p.get("flags", ())),
                             float(p.get("spread", 0.0))))
        except (KeyError, TypeError, ValueError) as exc:
            raise BadInput(f"{where}: points[{i}] is damaged ({type(exc).__name__}: {exc})",
                           "rerun microbench memlogp") from None
        except BadInput as exc:
            raise BadInput(f"{where}: points[{i}]: {exc.what}", exc.fix) from None
    host: dict[str, Any] = doc["host"] if isinstance(doc.get("host"), dict) else {}
    return Measurements(tuple(pts), h, host, where)


def load_measurements(path: str | Path) -> Measurements:
    """Read and check a ``microbench memlogp`` results file (strict JSON)."""
    from predictor.inputs import read_json

    return measurements_from_json(read_json(path, "microbench memlogp", "measurements"),
                                  str(path))


def alpha_of(m: Measurements) -> float:
    """alpha in seconds per byte: the median cost of the contiguous copies (d = 8) whose source
    and destination fit the first-level cache; without such a point, the cheapest contiguous
    copy measured."""
    contiguous = [p for p in m.of("copy") if p.d_bytes == WORD_BYTES]
    if not contiguous:
        raise BadInput(f"{m.source or 'the measurements'} have no contiguous copy (d = 8)",
                       "measure one: alpha is the contiguous copy's cost per byte")
    l1 = m.hierarchy.levels[0].size_bytes
    resident = [p.per_byte_s for p in contiguous if 2 * p.s_bytes <= l1]
    return float(np.median(resident)) if resident else min(p.per_byte_s for p in contiguous)


# -- the fitted model --------------------------------------------------------------------------

@dataclass(frozen=True)
class Curve:
    """T(s, d) per byte of one operation: the toolkit's model on the terms of
    :func:`features`, in seconds per byte."""

    op: str
    model: modeling.Model
    candidates: tuple[str, ...]
    unusable: tuple[str, ...] = ()  # candidates these points cannot tell apart (not fitted)

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "candidates": list(self.candidates),
                "unusable": list(self.unusable), **self.model.to_dict()}


@dataclass(frozen=True)
class MemLogP:
    """alpha and the fitted ell curves of a host (fit with :func:`fit`)."""

    alpha_s_per_byte: float
    curves: Mapping[str, Curve]
    hierarchy: Hierarchy
    g_s_per_byte: float | None = None  # the gap; None: g = alpha (the paper's simplification)

    @property
    def g(self) -> float:
        return self.alpha_s_per_byte if self.g_s_per_byte is None else self.g_s_per_byte

    def curve(self, op: str) -> Curve:
        if op not in self.curves:
            raise BadInput(f"no fitted curve for {op!r} (have {', '.join(self.curves)})",
                           "measure that operation with microbench memlogp")
        return self.curves[op]

    def per_byte(self, op: str, s_bytes: ArrayLike, d_bytes: ArrayLike) -> Array:
        """alpha + ell(s, d): predicted seconds per byte of ``op``."""
        shape = np.broadcast(np.asarray(s_bytes), np.asarray(d_bytes)).shape
        table = features(op, np.ravel(s_bytes), np.ravel(d_bytes), self.hierarchy)
        fitted = self.curve(op).model.predict(table)
        return np.maximum(fitted, self.alpha_s_per_byte).reshape(shape)

    def ell(self, op: str, s_bytes: ArrayLike, d_bytes: ArrayLike) -> Array:
        """ell(s, d) in seconds per byte (>= 0)."""
        return self.per_byte(op, s_bytes, d_bytes) - self.alpha_s_per_byte

    def to_json(self) -> dict[str, Any]:
        return {"alpha_s_per_byte": self.alpha_s_per_byte, "g_s_per_byte": self.g,
                "hierarchy": self.hierarchy.to_json(),
                "curves": {k: c.to_json() for k, c in self.curves.items()}}


def usable_terms(candidates: Sequence[str], table: Mapping[str, Array], points: int
                 ) -> tuple[list[str], tuple[str, ...]]:
    """The candidates the points can estimate, in order: the constant, then each term that
    is not constant on the points and not a linear combination of the terms kept before it,
    at most ``points - 1`` of them (one residual degree of freedom); and the rest."""
    kept: list[str] = []
    cols: list[Array] = []
    for t in candidates:
        col = np.ones(points) if t == "1" else np.asarray(table[t], dtype=float)
        if t != "1" and (np.ptp(col) == 0 or len(kept) >= points - 1):
            continue
        trial = np.column_stack([*cols, col / np.linalg.norm(col)])
        if np.linalg.matrix_rank(trial, tol=1e-9) == trial.shape[1]:
            kept.append(t)
            cols.append(col / np.linalg.norm(col))
    return kept, tuple(t for t in candidates if t not in kept)


def fit(m: Measurements, *, modeler: str = "brewer", ops: Sequence[str] | None = None,
        g_s_per_byte: float | None = None) -> MemLogP:
    """alpha (:func:`alpha_of`) and one curve per operation measured, each fitted by the
    toolkit on the candidate terms the operation's points can estimate (:func:`usable_terms`).
    """
    alpha = alpha_of(m)
    curves: dict[str, Curve] = {}
    for op in ops or [o for o in OPS if m.of(o)]:
        pts = m.of(op)
        if len(pts) < 2:
            raise BadInput(f"{m.source or 'the measurements'} have {len(pts)} {op} points",
                           "measure two or more with microbench memlogp")
        s = np.array([p.s_bytes for p in pts], dtype=float)
        d = np.array([p.d_bytes for p in pts], dtype=float)
        y = np.array([p.per_byte_s for p in pts])
        table = features(op, s, d, m.hierarchy)
        terms, unusable = usable_terms(candidate_terms(op, m.hierarchy), table, len(pts))
        model = modeling.fit_model(terms, table, y, modeler=modeler, nonnegative=True,
                                   keep=["1"], where=f"memory logP {op}")
        curves[op] = Curve(op, model, tuple(terms), unusable)
    return MemLogP(alpha, curves, m.hierarchy, g_s_per_byte)


# -- predicted against measured ----------------------------------------------------------------

@dataclass(frozen=True)
class Row:
    op: str
    s_bytes: int
    d_bytes: int
    measured_s_per_byte: float
    predicted_s_per_byte: float
    ell_measured_s_per_byte: float
    ell_predicted_s_per_byte: float
    flags: tuple[str, ...] = ()

    @property
    def error(self) -> float:
        """(predicted - measured) / measured of the cost per byte: the paper's signed
        percentages (+80 % / -60 %) as fractions."""
        return self.predicted_s_per_byte / self.measured_s_per_byte - 1.0

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "s_bytes": self.s_bytes, "d_bytes": self.d_bytes,
                "measured_s_per_byte": self.measured_s_per_byte,
                "predicted_s_per_byte": self.predicted_s_per_byte,
                "ell_measured_s_per_byte": self.ell_measured_s_per_byte,
                "ell_predicted_s_per_byte": self.ell_predicted_s_per_byte,
                "error": self.error, "flags": list(self.flags)}


@dataclass(frozen=True)
class Comparison:
    rows: tuple[Row, ...]
    on: str  # "the fitted points" or the file of an independent run

    @property
    def worst(self) -> Row:
        return max(self.rows, key=lambda r: abs(r.error))

    def within(self, bound: float) -> bool:
        return all(abs(r.error) <= bound for r in self.rows)

    def to_json(self) -> dict[str, Any]:
        w = self.worst
        return {"on": self.on, "rows": [r.to_json() for r in self.rows],
                "worst": w.to_json(), "max_over": max(r.error for r in self.rows),
                "max_under": min(r.error for r in self.rows),
                "mean_abs_error": float(np.mean([abs(r.error) for r in self.rows]))}


def compare(model: MemLogP, m: Measurements, on: str = "the fitted points") -> Comparison:
    """Predicted against measured cost per byte at every copy, pack and unpack point of
    ``m``; ell measured is the measured cost minus the model's alpha."""
    rows = []
    for p in m.points:
        if p.op not in OPS or p.op not in model.curves:
            continue
        pred = float(model.per_byte(p.op, p.s_bytes, p.d_bytes))
        a = model.alpha_s_per_byte
        rows.append(Row(p.op, p.s_bytes, p.d_bytes, p.per_byte_s, pred, p.per_byte_s - a,
                        pred - a, p.flags))
    if not rows:
        raise BadInput(f"{on}: no copy, pack or unpack point to compare",
                       "give a file written by microbench memlogp")
    return Comparison(tuple(rows), on)


__all__ = ["FORMAT", "OPS", "P2P_ROLES", "SUPPORTED_VERSIONS", "VERSION", "Comparison", "Curve",
           "Hierarchy", "Measurements", "MemLogP", "Point", "Row", "alpha_of", "candidate_terms",
           "compare", "effective_capacity", "features", "fit", "line_slots", "load_measurements",
           "lru_miss_fraction", "measurements_from_json", "miss_fraction", "poisson_tail",
           "shares", "sides", "tlb_reaches", "usable_terms"]
