"""Typed errors. Backends translate OS errors into these at their boundary.

Each error says what happened, why, and how to fix it (STYLE.md habit 4). CLIs print
``str(error)`` on one line and exit 2; library code never prints.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (see counterd/__init__)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any


def _rebuild(cls: type[BaseException], message: str, fields: dict[str, Any]) -> BaseException:
    """Unpickle an error: its message and its fields, without calling its ``__init__``."""
    err = cls.__new__(cls)
    BaseException.__init__(err, message)
    err.__dict__.update(fields)
    return err


def one_line(message: str) -> str:
    """``message`` with its line breaks escaped: an error quotes what it got (a field name
    from a file, say), and the CLIs promise one line on stderr."""
    return message.replace("\r", "\\r").replace("\n", "\\n")


class PicklableError(Exception):
    """An exception that survives a pickle round trip with its message and fields.

    Errors cross process boundaries (microbench workers, pilot runs); the default pickling
    calls ``cls(*self.args)``, which fails or garbles the message for every error whose
    ``__init__`` takes other arguments than the message (psutil's errors solve it the same
    way, with ``__reduce__``).
    """

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), str(self), dict(self.__dict__)))


class CounterdError(PicklableError):
    """Base of every error this project raises on purpose."""

    exit_code = 2

    def __init__(self, what: str, fix: str | None = None) -> None:
        self.what = what
        self.fix = fix
        super().__init__(one_line(f"{what}: {fix}" if fix else what))


class BadInput(CounterdError):
    """Input from the user (arguments, files, configuration) is wrong."""


class UnknownCounter(BadInput):
    """``choices``: the names it could have been (counterd.data.events.NAMES, given by the raiser:
    this module is below every other and imports none of them)."""

    def __init__(self, name: str, choices: Sequence[str] = ()) -> None:
        self.name = name
        super().__init__(f"unknown counter {name!r}",
                         "choose from " + ", ".join(choices) if choices
                         else "use a canonical counter name")


class UnknownBackend(BadInput):
    def __init__(self, name: str, choices: tuple[str, ...]) -> None:
        self.name = name
        super().__init__(f"unknown backend {name!r}", "choose from " + ", ".join(choices))


class BackendUnavailable(CounterdError):
    """A counter source cannot be used on this host at all."""

    def __init__(self, backend: str, reason: str, fix: str | None = None) -> None:
        self.backend = backend
        self.reason = reason
        super().__init__(f"backend {backend} is unavailable: {reason}", fix)


class EventNotSupported(CounterdError):
    """One counter cannot be counted by a backend on this host; others may still work."""

    def __init__(self, event: str, backend: str, reason: str, fix: str | None = None) -> None:
        self.event = event
        self.backend = backend
        self.reason = reason
        super().__init__(f"counter {event} is not supported by {backend}: {reason}", fix)


class CounterAccessDenied(CounterdError):
    """The kernel refuses to count a target (permissions, perf_event_paranoid)."""

    def __init__(self, event: str, target: str, reason: str, fix: str | None = None) -> None:
        self.event = event
        self.target = target
        self.reason = reason
        super().__init__(f"counting {event} on {target} was refused: {reason}", fix)


class NoSuchTarget(CounterdError):
    """The process or thread to count does not exist (any more)."""

    def __init__(self, target: str) -> None:
        self.target = target
        super().__init__(f"{target} does not exist",
                         "check the pid/tid; the process may have exited")


class StoreError(CounterdError):
    """The daemon's store cannot be opened or written (:mod:`counterd.daemon.store`)."""
