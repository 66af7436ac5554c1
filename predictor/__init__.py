"""predictor: the cost functions of seed 004 (Amato et al.), their calibration into machine
profiles, validation tables and per-superstep forecasts (issue 5).

Public API:

- cost functions (pure, vectorised): :mod:`predictor.costs.costfuncs` -- f1, f2, f3, f_max, qsm,
  ebsp, dxbsp, error_ratio, predict_superstep (the daemon's entry point);
- inputs: :func:`load_results` (microbench), :func:`load_counters` (counterd record JSONL or
  CSV) -> :class:`Step`;
- estimators: :class:`PaperFit`, :class:`ImprovedFit` (fit() returns self, attributes end
  in ``_``);
- profiles: :class:`MachineProfile`, :func:`load_profile`, :func:`save_profile`;
- :func:`calibrate`, :func:`validate`, :func:`forecast`.

The predictor imports only counterd's data modules and never microbench (DESIGN.md section 2).
"""

from predictor.costs.calibrate import calibrate, forecast, validate
from predictor.costs.costmodel import BSPModel, FModel
from predictor.costs.fit import ImprovedFit, PaperFit
from predictor.costs.profile import MachineProfile, load_profile, save_profile
from predictor.errors import (
    BadCounterValue,
    BadInput,
    HostMismatchWarning,
    InsufficientPatterns,
    MissingCounter,
    NotFittedError,
    PredictorError,
    ProfileError,
    ProfileVersionError,
    UnknownCounter,
)
from predictor.inputs import Step, load_counters, load_results

__all__ = [
    "BSPModel", "BadCounterValue", "BadInput", "FModel", "HostMismatchWarning", "ImprovedFit",
    "InsufficientPatterns", "MachineProfile", "MissingCounter", "NotFittedError", "PaperFit",
    "PredictorError", "ProfileError", "ProfileVersionError", "Step", "UnknownCounter",
    "calibrate", "forecast", "load_counters", "load_profile", "load_results", "save_profile",
    "validate",
]
