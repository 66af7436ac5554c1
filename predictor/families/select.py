"""Model-based selection and parameter optimisation (seed 003: Brewer, "High-level optimization
via automated statistical modeling", sections 2, 4 and 5).

A *specification* (a TOML file the library designer writes) names the implementations of one
specification, the parameters a caller gives, and for each implementation its candidate terms
and, optionally, one integer parameter the selector optimises (radix sort's bits per digit).
Each implementation gets a model fitted with the toolkit (:mod:`predictor.toolkit.model`) from
profiling samples; :func:`choose` predicts every implementation at the caller's parameters and
picks the least predicted time, saying by how much it beats the next.

:func:`integer_root` and :func:`integer_minimum` are 003's IntegerRoot and IntegerMinimum
(section 5). 003 optimises radix sort's digit width over the number of iterations i rather than
over the width itself (its equation 7: with ``width``-bit keys, i iterations need digits of
ceil(width / i) bits, and the model over i has one minimum where the model over the width has
several); a specification says so with ``variable = "iterations"`` and
``value = "ceil(width/iterations)"``.

Specification format::

    [selection]
    name = "sort"
    parameters = ["keys", "width"]      # what a caller gives
    implementation_key = "algo"         # the sample field naming the implementation
    time_key = "total_s"                # the sample field holding the measured time

    [implementations.radix]
    terms = ["1", "2^bpd", "ceil(width/bpd)*keys"]
    [implementations.radix.optimise]
    parameter = "bpd"                   # the integer parameter chosen by the selector
    range = [1, 16]
    variable = "iterations"             # optional: search over this integer instead ...
    value = "ceil(width/iterations)"    # ... and set the parameter to this term of it
    variable_range = [1, 32]

    [implementations.sample]
    terms = ["1", "keys", "keys*log(keys)"]

Samples are JSON lines, one per profiling run, holding the parameters, the implementation key
and the time key (``examples/bsp_sort.py --json`` writes them). Repeated runs of one
configuration are reduced to their median before fitting (robust to a run the host disturbed).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from predictor.errors import BadInput
from predictor.toolkit import fitting
from predictor.toolkit import model as md
from predictor.toolkit import terms as tm

_SPEC_FIX = "see the specification format in `predict select --help`"
_SAMPLES_FIX = "give the JSON lines written by the profiled program (e.g. bsp_sort.py --json)"


# -- IntegerRoot and IntegerMinimum (seed 003 section 5) ---------------------------------------

def integer_root(bottom: int, top: int, f: Callable[[int], float]) -> int:
    """The integer in [bottom, top] nearest a root of ``f`` (003's IntegerRoot): where f
    changes sign between x-1 and x, the one of them with the smaller |f|. No root in the
    range: ``bottom - 1`` if f is negative on all of it, ``top + 1`` if positive. With more
    than one root, one of them. Bisection when the ends differ in sign (log2(top - bottom)
    evaluations); otherwise every point is tried, since a sign change may hide between ends of
    one sign."""
    if bottom > top:
        raise BadInput(f"IntegerRoot: empty range [{bottom}, {top}]", "give bottom <= top")
    fb, ft = f(bottom), f(top)
    if fb == 0:
        return bottom
    if ft == 0:
        return top
    if (fb < 0) != (ft < 0):
        lo, hi = bottom, top  # sign(f(lo)) == sign(fb) != sign(f(hi))
        while hi - lo > 1:
            mid = (lo + hi) // 2
            fm = f(mid)
            if fm == 0:
                return mid
            if (fm < 0) == (fb < 0):
                lo = mid
            else:
                hi = mid
        return lo if abs(f(lo)) <= abs(f(hi)) else hi
    prev = fb
    for x in range(bottom + 1, top + 1):
        fx = f(x)
        if fx == 0:
            return x
        if (fx < 0) != (prev < 0):
            return x - 1 if abs(prev) <= abs(fx) else x
        prev = fx
    return bottom - 1 if fb < 0 else top + 1


def integer_minimum(bottom: int, top: int, f: Callable[[int], float]) -> int:
    """A minimiser of ``f`` over the integers of [bottom, top] (003's IntegerMinimum): binary
    search on the sign of the forward difference f(x+1) - f(x), which assumes f has a single
    minimum there (003 footnote 6); on a plateau the leftmost point. About 2 log2(top - bottom)
    evaluations."""
    if bottom > top:
        raise BadInput(f"IntegerMinimum: empty range [{bottom}, {top}]", "give bottom <= top")
    lo, hi = bottom, top
    while lo < hi:
        mid = (lo + hi) // 2
        if f(mid + 1) < f(mid):
            lo = mid + 1
        else:
            hi = mid
    return lo


# -- the specification ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Optimise:
    """The integer parameter an implementation's selector chooses."""

    parameter: str
    bottom: int
    top: int
    variable: str | None = None  # search over this integer instead,
    value: tm.Term | None = None  # and set the parameter to this term of it
    variable_bottom: int = 1
    variable_top: int = 1

    def values(self, params: Mapping[str, float]) -> list[tuple[int, int]]:
        """(search point, parameter value) over the search range, parameter values in range."""
        if self.variable is None or self.value is None:
            return [(v, v) for v in range(self.bottom, self.top + 1)]
        out = []
        for i in range(self.variable_bottom, self.variable_top + 1):
            v = float(self.value.evaluate({**params, self.variable: float(i)}))
            if math.isfinite(v) and self.bottom <= v <= self.top:
                out.append((i, int(v)))
        return out


@dataclass(frozen=True)
class Implementation:
    name: str
    terms: tuple[tm.Term, ...]
    optimise: Optimise | None = None


@dataclass(frozen=True)
class Specification:
    name: str
    parameters: tuple[str, ...]
    implementation_key: str
    time_key: str
    implementations: Mapping[str, Implementation]
    path: str = "<spec>"

    def inputs(self, impl: Implementation) -> tuple[str, ...]:
        """Every input an implementation's samples must carry."""
        extra = (impl.optimise.parameter,) if impl.optimise else ()
        return tuple(dict.fromkeys((*self.parameters, *extra, *tm.needs(impl.terms))))


def _int_pair(v: Any, where: str) -> tuple[int, int]:
    if (not isinstance(v, list) or len(v) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in v) or v[0] > v[1]):
        raise BadInput(f"{where} must be [bottom, top], two integers, bottom <= top", _SPEC_FIX)
    return v[0], v[1]


def _strings(v: Any, where: str) -> tuple[str, ...]:
    if not isinstance(v, list) or not v or not all(isinstance(x, str) for x in v):
        raise BadInput(f"{where} must be a non-empty list of strings", _SPEC_FIX)
    return tuple(v)


def spec_from_dict(d: Mapping[str, Any], path: str = "<spec>") -> Specification:
    sel = d.get("selection")
    impls = d.get("implementations")
    if not isinstance(sel, dict) or not isinstance(impls, dict) or not impls:
        raise BadInput(f"{path}: needs a [selection] table and one or more "
                       "[implementations.NAME] tables", _SPEC_FIX)
    params = _strings(sel.get("parameters"), f"{path}: selection.parameters")
    keys = {}
    for k, default in (("implementation_key", "implementation"), ("time_key", "time_s")):
        keys[k] = sel.get(k, default)
        if not isinstance(keys[k], str):
            raise BadInput(f"{path}: selection.{k} must be a string", _SPEC_FIX)
    out: dict[str, Implementation] = {}
    for name, body in impls.items():
        where = f"{path}: implementations.{name}"
        if not isinstance(body, dict):
            raise BadInput(f"{where} must be a table", _SPEC_FIX)
        try:
            out[str(name)] = _implementation(str(name), body, params, where)
        except BadInput as exc:
            if path in exc.what:
                raise
            raise BadInput(f"{where}: {exc.what}", exc.fix) from None
    name = sel.get("name", Path(path).stem)
    return Specification(str(name), params, keys["implementation_key"], keys["time_key"], out,
                         path)


def _implementation(name: str, body: Mapping[str, Any], params: Sequence[str], where: str
                    ) -> Implementation:
    terms = tm.parse_all(_strings(body.get("terms"), f"{where}.terms"))
    opt = body.get("optimise")
    optimise = None
    if opt is not None:
        if not isinstance(opt, dict) or not isinstance(opt.get("parameter"), str):
            raise BadInput(f"{where}.optimise needs parameter = NAME", _SPEC_FIX)
        lo, hi = _int_pair(opt.get("range"), f"{where}.optimise.range")
        var = opt.get("variable")
        if var is not None:
            if not isinstance(var, str) or not isinstance(opt.get("value"), str):
                raise BadInput(f"{where}.optimise: variable needs value = TERM", _SPEC_FIX)
            vlo, vhi = _int_pair(opt.get("variable_range"),
                                 f"{where}.optimise.variable_range")
            optimise = Optimise(opt["parameter"], lo, hi, var, tm.parse(opt["value"]),
                                vlo, vhi)
        else:
            optimise = Optimise(opt["parameter"], lo, hi)
        if optimise.parameter in params:
            raise BadInput(f"{where}.optimise.parameter {optimise.parameter!r} is also a "
                           "caller's parameter", "optimise a parameter the caller omits")
    return Implementation(name, terms, optimise)


def load_spec(path: str | Path) -> Specification:
    from counterd.util.strictjson import Malformed
    from counterd.util.stricttoml import loads

    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise BadInput(f"cannot read {path}: {exc.strerror}", _SPEC_FIX) from None
    try:
        doc = loads(data)
    except Malformed as exc:
        raise BadInput(f"{path}: {exc}", _SPEC_FIX) from None
    return spec_from_dict(doc, str(path))


# -- samples ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Samples:
    """One implementation's profiling data: inputs by name, and the median time of each
    distinct configuration, with how many runs each median is of."""

    inputs: Mapping[str, np.ndarray]
    times: np.ndarray
    runs: np.ndarray

    def __len__(self) -> int:
        return len(self.times)


def _finite(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def read_samples(spec: Specification, lines: Iterable[tuple[str, bytes | str]]
                 ) -> dict[str, Samples]:
    """Group sample lines ``(where, text)`` by implementation; lines of implementations the
    specification does not name are skipped. BadInput names the line of a bad one."""
    from counterd.util.strictjson import Malformed, loads

    groups: dict[str, dict[tuple[float, ...], list[float]]] = {}
    for where, line in lines:
        if not line.strip():
            continue
        try:
            d = loads(line)
        except Malformed as exc:
            raise BadInput(f"{where} is not JSON ({exc})", _SAMPLES_FIX) from None
        if not isinstance(d, dict):
            raise BadInput(f"{where} is not a JSON object", _SAMPLES_FIX)
        name = d.get(spec.implementation_key)
        if not isinstance(name, str) or name not in spec.implementations:
            continue
        impl = spec.implementations[name]
        need = spec.inputs(impl)
        missing = [k for k in need if not _finite(d.get(k))]
        if missing:
            raise BadInput(f"{where}: implementation {name} needs a number for "
                           f"{', '.join(missing)}", _SAMPLES_FIX)
        t = d.get(spec.time_key)
        if not isinstance(t, int | float) or not _finite(t) or t <= 0:
            raise BadInput(f"{where}: {spec.time_key} = {t!r} is not a time > 0",
                           "drop failed runs from the samples")
        groups.setdefault(name, {}).setdefault(tuple(float(d[k]) for k in need),
                                               []).append(float(t))
    out = {}
    for name, configs in groups.items():
        need = spec.inputs(spec.implementations[name])
        rows = np.array(list(configs), dtype=np.float64).reshape(len(configs), len(need))
        out[name] = Samples({k: rows[:, j] for j, k in enumerate(need)},
                            np.array([float(np.median(v)) for v in configs.values()]),
                            np.array([len(v) for v in configs.values()]))
    return out


def load_samples(spec: Specification, paths: Sequence[str | Path]) -> dict[str, Samples]:
    from counterd.data.errors import BadInput as CounterdBadInput
    from counterd.util.fsutil import bounded_lines

    def lines() -> Iterable[tuple[str, bytes]]:
        for p in paths:
            for n, line in bounded_lines(p, _SAMPLES_FIX):
                yield f"{p}:{n}", line
    try:
        return read_samples(spec, lines())
    except CounterdBadInput as exc:  # the predictor's own error type, for its CLI
        raise BadInput(str(exc)) from None


# -- fitting and choosing -----------------------------------------------------------------------

def fit_implementations(spec: Specification, samples: Mapping[str, Samples], *,
                        modeler: str = "brewer", holdout: float | None = None, seed: int = 0,
                        progress: fitting.Progress = fitting.no_progress) -> dict[str, md.Model]:
    """One model per implementation of the specification, from its samples."""
    models = {}
    for name, impl in spec.implementations.items():
        s = samples.get(name)
        if s is None or not len(s):
            raise BadInput(f"no samples for implementation {name} "
                           f"({spec.implementation_key} = {name!r})",
                           "profile every implementation the specification names")
        progress(f"{name}: fitting {len(impl.terms)} terms on {len(s)} configurations "
                 f"({int(s.runs.sum())} runs)")
        models[name] = md.fit_model(impl.terms, s.inputs, s.times, modeler=modeler,
                                    holdout=holdout, seed=seed, where=f"implementation {name}",
                                    progress=_prefixed(progress, name))
    return models


def _prefixed(progress: fitting.Progress, prefix: str) -> fitting.Progress:
    return lambda message: progress(f"{prefix}: {message}")


@dataclass(frozen=True)
class Candidate:
    implementation: str
    predicted: float
    lower: float
    upper: float
    params: Mapping[str, float]  # the caller's and, if optimised, the chosen one
    optimised: str | None = None  # "bpd = 8 (iterations = 4, IntegerMinimum, 4 evaluations)"


@dataclass(frozen=True)
class Choice:
    best: Candidate
    candidates: tuple[Candidate, ...]  # by predicted time
    margin: float  # next best predicted / best predicted (inf with one candidate)
    notes: tuple[str, ...] = field(default=())


def _check_params(spec: Specification, params: Mapping[str, float]) -> None:
    missing = [p for p in spec.parameters if p not in params]
    extra = [p for p in params if p not in spec.parameters]
    if missing or extra:
        raise BadInput("the parameters are " + ", ".join(spec.parameters)
                       + (f"; missing {', '.join(missing)}" if missing else "")
                       + (f"; unknown {', '.join(extra)}" if extra else ""),
                       "give each as NAME=VALUE")
    bad = [p for p, v in params.items() if not _finite(v)]
    if bad:
        raise BadInput(f"parameter {bad[0]} = {params[bad[0]]!r} is not a finite number",
                       "give a number")


def best_parameter(impl: Implementation, model: md.Model, params: Mapping[str, float]
                   ) -> tuple[int, str]:
    """The optimised parameter's value for ``params`` by IntegerMinimum over the model (over
    the specification's search variable where it names one), and how it was found."""
    opt = impl.optimise
    assert opt is not None
    points = opt.values(params)
    if not points:
        raise BadInput(f"implementation {impl.name}: no value of {opt.variable} in "
                       f"[{opt.variable_bottom}, {opt.variable_top}] gives {opt.parameter} in "
                       f"[{opt.bottom}, {opt.top}]", "widen the ranges in the specification")
    calls = 0

    def f(i: int) -> float:
        nonlocal calls
        calls += 1
        return float(model.predict({**params, opt.parameter: float(points[i][1])})[0])

    best = integer_minimum(0, len(points) - 1, f)
    var, value = points[best]
    how = (f"{opt.variable} = {var}, " if opt.variable else "") + \
        f"IntegerMinimum, {calls} model evaluations"
    return value, how


def choose(spec: Specification, models: Mapping[str, md.Model], params: Mapping[str, float],
           *, level: float = 0.95) -> Choice:
    """Predict every implementation at ``params`` (optimising each one's integer parameter)
    and pick the least predicted time (seed 003 section 2)."""
    _check_params(spec, params)
    cands = []
    for name, impl in spec.implementations.items():
        model = models[name]
        full = dict(params)
        how = None
        if impl.optimise:
            value, why = best_parameter(impl, model, params)
            full[impl.optimise.parameter] = float(value)
            how = f"{impl.optimise.parameter} = {value} ({why})"
        p = model.interval({k: np.array([v]) for k, v in full.items()}, level)
        cands.append(Candidate(name, float(p.mean[0]), float(p.lower[0]), float(p.upper[0]),
                               full, how))
    # A time <= 0 is a model extrapolated past its data: ranked last, and said.
    cands.sort(key=lambda c: (c.predicted <= 0, c.predicted))
    notes = [f"{c.implementation}: predicted time {c.predicted:.3g} is not positive, so the "
             "model is outside what it was fitted on" for c in cands if c.predicted <= 0]
    for name, model in models.items():
        for k, v in params.items():
            x = model.inputs.get(k)
            if x is not None and len(x) and not x.min() <= v <= x.max():
                notes.append(f"{name}: {k} = {v:g} is outside the profiled range "
                             f"[{x.min():g}, {x.max():g}]: extrapolated")
    margin = (cands[1].predicted / cands[0].predicted
              if len(cands) > 1 and cands[0].predicted > 0 else math.inf)
    return Choice(cands[0], tuple(cands), margin, tuple(notes))
