"""The optional hook from counterd to the predictor: predicted time of one superstep.

``counterd -> predictor`` is the only allowed direction (DESIGN.md section 2), and only to
attach predictions to records. The predictor is imported lazily, once, when a machine profile
is configured; without a profile, or when ``predictor`` is not importable or lacks the entry
points below, :func:`load` returns no function and the reason, which the daemon logs once and
``counterd report`` prints. Nothing else in counterd depends on the predictor.

Expected predictor entry points (issue 5; the wiring lives in :func:`_from_predictor` only):

* ``predictor.costs.profile.load_profile(path) -> MachineProfile``
* ``predictor.costs.costfuncs.predict_superstep(profile, counters) -> Mapping[str, float]`` where
  ``counters`` maps each canonical counter to a numpy array over processors and the result
  maps ``"F1"``, ``"F2"``, ``"F3"``, ``"F"`` (seconds) and optionally ``"<bound>_min"`` /
  ``"<bound>_max"`` for ``QSM``, ``EBSP``, ``DXBSP``.

Seed 004 (Amato et al.): F1 is the hierarchy term (per-level misses and writebacks of the
busiest processor), F2 the bus term (all processors' memory traffic through one bus), F3 the
bank term (the busiest memory bank), and F = max(F1, F2, F3); the term that attains the
maximum is the superstep's *dominating term*.
"""

from __future__ import annotations

import importlib
import logging
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from counterd.data.errors import CounterdError, PicklableError
from counterd.data.records import SuperstepRecord

log = logging.getLogger("counterd.prediction")

TERMS = ("F1", "F2", "F3")
TERM_MEANING = {"F1": "hierarchy", "F2": "bus", "F3": "bank"}
BOUNDS = ("QSM", "EBSP", "DXBSP")


@dataclass(frozen=True)
class Prediction:
    """Predicted cost of one superstep, in seconds (the paper's F1, F2, F3, F)."""

    terms_s: Mapping[str, float]
    total_s: float
    bounds_s: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    profile: str = ""
    model: str = ""  # the profile's model variant that predicted (by the counters present)
    # That variant's accuracy as calibration measured it: average and maximum E, and on what.
    accuracy: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        missing = [t for t in TERMS if t not in self.terms_s]
        if missing:
            raise ValueError(f"prediction lacks terms {missing}")

    @property
    def dominating(self) -> str:
        """The term that attains F = max(F1, F2, F3)."""
        return max(TERMS, key=lambda t: self.terms_s[t])

    @staticmethod
    def from_mapping(values: Mapping[str, Any], profile: str = "") -> Prediction:
        terms = {t: float(values[t]) for t in TERMS}
        total = float(values.get("F", max(terms.values())))
        bounds = {b: (float(values[f"{b}_min"]), float(values[f"{b}_max"])) for b in BOUNDS
                  if f"{b}_min" in values and f"{b}_max" in values}
        return Prediction(terms, total, bounds, profile, str(values.get("model", "")),
                          dict(values.get("accuracy") or {}))

    @property
    def accuracy_note(self) -> str:
        """``improved.l1_llc, validated E avg 1.50 / max 3.65`` (empty when unknown)."""
        acc = self.accuracy
        if not self.model:
            return ""
        if "avg_error" not in acc:
            return self.model
        on = str(acc.get("on", ""))
        how = ("validation" if on.startswith("validation") else
               "cross-validated" if "cross-validated" in on else "fitting")
        return (f"{self.model}, {how} E avg {float(acc['avg_error']):.2f} / max "
                f"{float(acc['max_error']):.2f}")


PredictFn = Callable[[Sequence[SuperstepRecord]], Prediction | None]


# Why a superstep has no prediction: a fixed set, so that it can be a metric label.
NO_PREDICTION_REASONS = {
    "no_memory_counters": "the superstep has no memory-hierarchy counters (software events "
                          "only): record the program with `counterd record --backend callgrind "
                          "-- CMD`, or declare its address streams with step.feed() under the "
                          "sim backend",
    "no_model_variant": "no model of the profile uses only the superstep's counters: "
                        "calibrate a profile of this host (predict calibrate), which fits a "
                        "model to each counter source",
    "incomplete": "the superstep did not end on every processor",
    "error": "the predictor failed (the daemon's log says why)",
}


class NoPrediction(CounterdError):
    """The profile cannot predict these records; ``code`` is one of NO_PREDICTION_REASONS."""

    def __init__(self, what: str, code: str = "error") -> None:
        self.code = code if code in NO_PREDICTION_REASONS else "error"
        super().__init__(what)


def error_ratio(measured_s: float, predicted_s: float) -> float | None:
    """Seed 004's error metric E = max(T, P) / min(T, P) (>= 1; 1 is a perfect prediction)."""
    if measured_s <= 0 or predicted_s <= 0:
        return None
    return max(measured_s, predicted_s) / min(measured_s, predicted_s)


def per_processor(records: Sequence[SuperstepRecord]) -> dict[str, list[float]]:
    """Counter values of one superstep as lists over processors (ranks, in rank order); a
    processor without a counter contributes 0."""
    by_rank: dict[int, dict[str, float]] = {}
    for rec in records:
        vals = by_rank.setdefault(rec.rank, {})
        for name, cv in rec.counters.items():
            vals[name] = vals.get(name, 0.0) + cv.value
    names = sorted({n for vals in by_rank.values() for n in vals})
    ranks = sorted(by_rank)
    return {n: [by_rank[r].get(n, 0.0) for r in ranks] for n in names}


def load(profile: str | Path | None, *,
         warn: Callable[[str], None] = log.warning) -> tuple[PredictFn | None, str]:
    """A prediction function for ``profile`` (a TOML file, or the name of a profile built into
    the predictor, e.g. ``sgi-power-challenge``), or ``(None, reason)``. Never raises.

    A profile fitted on another host is still used; ``warn`` gets the predictor's one-line
    warning saying which fingerprint fields differ (``predictor.costs.profile.check_host``, the
    warning ``predict`` prints): the daemon logs it, ``counterd report`` prints it."""
    if profile is None:
        return None, "no machine profile configured (predictor.profile / COUNTERD_PROFILE)"
    if not Path(profile).is_file() and not _is_builtin(str(profile)):
        return None, f"machine profile {profile} does not exist"
    try:
        return _from_predictor(profile, warn)
    except ImportError as exc:
        return None, f"the predictor package is not importable ({exc})"
    except Exception as exc:  # a broken profile must not take the daemon down
        return None, f"cannot load machine profile {profile}: {exc}"


def _check_host(profile_mod: Any, profile: Any, warn: Callable[[str], None]) -> None:
    """The predictor's host check, its warnings passed to ``warn`` one line each."""
    check = getattr(profile_mod, "check_host", None)
    if check is None:
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            check(profile)
        except PicklableError as exc:  # this host cannot be described (a bad machine file)
            warn(f"cannot compare profile {getattr(profile, 'name', '')} with this host: "
                 f"{exc}")
    for w in caught:
        warn(str(w.message))


def _is_builtin(name: str) -> bool:
    try:
        return name in importlib.import_module("predictor.costs.profile").BUILTIN
    except ImportError:
        return False


def _from_predictor(profile_path: str | Path,
                    warn: Callable[[str], None]) -> tuple[PredictFn | None, str]:
    profile_mod = importlib.import_module("predictor.costs.profile")
    costfuncs = importlib.import_module("predictor.costs.costfuncs")
    load_profile = getattr(profile_mod, "load_profile", None)
    predict = getattr(costfuncs, "predict_superstep", None)
    if load_profile is None or predict is None:
        return None, ("the predictor lacks predictor.costs.profile.load_profile or "
                      "predictor.costs.costfuncs.predict_superstep; predictions are off")
    profile = load_profile(profile_path)
    _check_host(profile_mod, profile, warn)
    import numpy as np

    def fn(records: Sequence[SuperstepRecord]) -> Prediction | None:
        arrays = {k: np.asarray(v, dtype=float) for k, v in per_processor(records).items()}
        try:
            values: Any = predict(profile, arrays)
        except Exception as exc:  # e.g. no variant fits the counters present
            memory = getattr(exc, "memory", None)
            code = ("error" if memory is None else "no_model_variant" if memory
                    else "no_memory_counters")
            raise NoPrediction(str(exc), code) from exc
        return Prediction.from_mapping(values, str(profile_path))

    return fn, f"predictions from {profile_path}"
