"""Typed errors of the predictor. Each says what happened, why, and the fix (STYLE.md habit 4).

The library raises these and never prints or exits; ``predict`` (predictor/cli.py) prints
``str(error)`` on one line and exits with ``exit_code`` (2: bad usage or bad input).
The predictor has its own hierarchy; it shares only counterd's data-only modules (errors pickle
through :class:`counterd.data.errors.PicklableError`).
"""

from __future__ import annotations

import warnings

from counterd.data.errors import PicklableError, one_line


class PredictorError(PicklableError):
    """Base of every error the predictor raises on purpose."""

    exit_code = 2

    def __init__(self, what: str, fix: str | None = None) -> None:
        self.what = what
        self.fix = fix
        super().__init__(one_line(f"{what}: {fix}" if fix else what))


class BadInput(PredictorError):
    """A file or argument given to the predictor is malformed."""


class MissingCounter(BadInput):
    """A counter the cost function needs is absent from a superstep or pattern."""

    def __init__(self, counter: str, where: str, needed_by: str) -> None:
        self.counter = counter
        self.where = where
        super().__init__(
            f"{where}: counter {counter!r} is missing but {needed_by} needs it",
            "leave the model unset so that a variant whose counters are present is chosen, "
            "or name one (the profile's models and what each needs: predict profile PROFILE)")


# What supplies memory counters on a host without a PMU; both commands are tested end to end
# (tests/predictor/test_variants.py runs the first, tests/counterd/test_superstep.py the second).
MEMORY_COUNTER_ACTION = (
    "record the program with `counterd record --backend callgrind --out FILE -- CMD` "
    "(simulated counters, valgrind needed), or declare its address streams with step.feed() "
    "and record with `--backend sim`")


class NoVariant(BadInput):
    """No model variant of the profile can predict a superstep from the counters it has."""

    def __init__(self, where: str, have: tuple[str, ...], closest: str,
                 missing: tuple[str, ...], memory: bool, profile: str = "",
                 builtin: bool = False) -> None:
        self.where = where
        self.have = have
        self.closest = closest
        self.missing = missing
        self.memory = memory
        self.profile = profile
        self.builtin = builtin
        if not memory:
            what = (f"{where} has no memory-hierarchy counters (it has "
                    f"{', '.join(have) or 'none'}), and time is never predicted from time")
            fix = MEMORY_COUNTER_ACTION
        else:
            # The superstep has memory counters (Callgrind's L1 and last level, say): what is
            # missing is a model of the profile for that counter set, not a way to record.
            more = f" (and {', '.join(missing[1:])})" if len(missing) > 1 else ""
            of = f"profile {profile}" if profile else "the profile"
            what = (f"{where}: counter {missing[0]!r} is missing{more}: no model of {of} "
                    f"uses only the counters recorded (the closest, {closest}, needs it)")
            if builtin:
                fix = (f"{profile} is built in, a published machine's models of every cache "
                       "level; calibrate a profile of this host, which fits a model to each "
                       "counter source (microbench run --out R.json; predict calibrate "
                       "--results R.json --out P.toml), and give it as --profile")
            else:
                fix = ("calibrate the profile again (predict calibrate fits a model to each "
                       "counter source the results allow), or record with a backend that "
                       f"counts {missing[0]} (counterd probe lists them)")
        super().__init__(what, fix)


class UnknownCounter(BadInput):
    def __init__(self, counter: str, where: str, choices: tuple[str, ...]) -> None:
        self.counter = counter
        self.where = where
        super().__init__(f"{where}: unknown counter {counter!r}",
                         "use canonical names: " + ", ".join(choices))


class BadCounterValue(BadInput):
    """A counter value is negative, NaN or infinite."""

    def __init__(self, counter: str, where: str, value: object) -> None:
        self.counter = counter
        self.where = where
        self.value = value
        super().__init__(f"{where}: counter {counter!r} has value {value!r}",
                         "counters are non-negative finite event counts; re-record the run")


class ProfileError(BadInput):
    """A machine profile cannot be read or used."""


class ProfileVersionError(ProfileError):
    def __init__(self, path: str, found: object, supported: tuple[int, ...]) -> None:
        self.found = found
        super().__init__(
            f"{path}: machine profile format version {found!r} is not supported "
            f"(this predictor reads {', '.join(map(str, supported))})",
            "re-run `predict calibrate` with this version, or use the predictor that wrote it")


class InsufficientPatterns(BadInput):
    """The microbench results lack the patterns a fit needs."""

    def __init__(self, function: str, need: str) -> None:
        self.function = function
        super().__init__(f"cannot fit {function}: the results have no {need}",
                         "run the full microbench suite (microbench run --suite all) and "
                         "calibrate on its results")


class NotFittedError(PredictorError, AttributeError):
    """predict() called before fit() (scikit-learn's convention)."""

    def __init__(self, estimator: str) -> None:
        super().__init__(f"this {estimator} is not fitted yet", f"call {estimator}.fit() first")


class HostMismatchWarning(UserWarning):
    """The profile was fitted on a host whose fingerprint differs from the one in use."""


def warn_host_mismatch(differences: list[str], profile: str) -> None:
    """Emit one HostMismatchWarning naming every fingerprint field that differs."""
    if differences:
        warnings.warn(
            f"profile {profile} was fitted on another host ({'; '.join(differences)}): "
            "predictions may be off; calibrate on this host (predict calibrate)",
            HostMismatchWarning, stacklevel=3)
