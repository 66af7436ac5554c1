"""PAPI counter source through python-papi (the optional extra ``counterd[papi]``).

The same canonical names as every backend, mapped to PAPI presets. PAPI itself sits on
perf_event (its ``perf_event`` component), so where perf has no hardware PMU, PAPI has no
presets either; ``available()`` then says why, quoting PAPI's own component status.
Multiplexing is left to the kernel (PAPI's reads are already scaled); the ratio is reported
as 1.0 because PAPI does not expose time_running/time_enabled.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

from counterd.backends.base import THIS_THREAD, Capability, CounterValue, Reading, Target
from counterd.data.errors import (
    BackendUnavailable,
    CounterAccessDenied,
    EventNotSupported,
    NoSuchTarget,
)
from counterd.data.events import NAMES, Source

# Canonical counter -> PAPI preset (papiStdEventDefs.h). Writebacks have no preset.
PRESETS: dict[str, str | None] = {
    "loads": "PAPI_LD_INS",
    "stores": "PAPI_SR_INS",
    "l1d_misses": "PAPI_L1_DCM",
    "l2_misses": "PAPI_L2_DCM",
    "l3_misses": "PAPI_L3_TCM",
    "dtlb_misses": "PAPI_TLB_DM",
    "cycles": "PAPI_TOT_CYC",
    "instructions": "PAPI_TOT_INS",
    "branch_misses": "PAPI_BR_MSP",  # conditional branches only (papiStdEventDefs.h)
    "l1d_writebacks": None,
    "l2_writebacks": None,
    "l3_writebacks": None,
    "task_clock_ns": None,
    "page_faults": None,
    "context_switches": None,
}
NO_PRESET = {
    "l1d_writebacks": "PAPI has no preset for cache writebacks; use the perf backend's raw events",
    "l2_writebacks": "PAPI has no preset for cache writebacks; use the perf backend's raw events",
    "l3_writebacks": "PAPI has no preset for cache writebacks; use the perf backend's raw events",
    "task_clock_ns": "a kernel software event: use the perf backend",
    "page_faults": "a kernel software event: use the perf backend",
    "context_switches": "a kernel software event: use the perf backend",
}
_INSTALL_FIX = "pip install 'counterd[papi]' (python-papi bundles and builds PAPI; needs gcc)"
_init_lock = threading.Lock()


def _papi() -> tuple[Any, Any, Any]:
    try:
        from pypapi import events, exceptions  # type: ignore[import-not-found]
        from pypapi import papi_low as low
    except ImportError as exc:
        raise BackendUnavailable("papi", f"python-papi is not installed ({exc})",
                                 _INSTALL_FIX) from exc
    with _init_lock:
        if not low.is_initialized():
            try:
                low.library_init()
            except exceptions.PapiError as exc:
                raise BackendUnavailable("papi", f"PAPI_library_init failed: {exc}") from exc
    return low, events, exceptions


def _component_status(low: Any) -> str:
    """PAPI's own word on why its perf_event component is (un)usable."""
    parts = []
    for i in range(low.num_components()):
        info = low.get_component_info(i)
        name = _text(info.name)
        if info.disabled:
            parts.append(f"component {name} disabled ({_text(info.disabled_reason)})")
    return "; ".join(parts)


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    try:
        from pypapi import ffi  # type: ignore[import-not-found]

        return str(ffi.string(value).decode(errors="replace"))
    except Exception:  # noqa: BLE001 - already a str, or a non-cdata value
        return str(value)


class PapiGroup:
    """One PAPI event set on one target, started at open; read() is cumulative."""

    def __init__(self, backend: PapiBackend, events: Sequence[str], target: Target,
                 strict: bool) -> None:
        low, papi_events, exceptions = _papi()
        self._low = low
        self.target = target
        self._unsupported: dict[str, str] = {}
        self._eventset = low.create_eventset()
        counted: list[str] = []
        try:
            if target.kernel_tid:
                try:
                    low.attach(self._eventset, target.kernel_tid)
                except exceptions.PapiError as exc:
                    if not _pid_exists(target.kernel_tid):
                        raise NoSuchTarget(target.describe()) from exc
                    raise CounterAccessDenied("*", target.describe(), str(exc),
                                              "run as the target's owner or as root") from exc
            for name in events:
                preset = PRESETS.get(name)
                try:
                    if preset is None:
                        raise EventNotSupported(name, "papi", NO_PRESET[name])
                    try:
                        low.add_event(self._eventset, getattr(papi_events, preset))
                    except exceptions.PapiError as exc:
                        raise EventNotSupported(name, "papi", f"{preset}: {exc}") from exc
                    counted.append(name)
                except EventNotSupported as exc:
                    if strict:
                        raise
                    self._unsupported[name] = exc.reason
            self.events = tuple(counted)
            if counted:
                low.start(self._eventset)
        except BaseException:
            self._destroy()
            raise
        self._closed = False

    def read(self) -> Reading:
        if not self.events:
            return Reading({}, unsupported=dict(self._unsupported))
        values = self._low.read(self._eventset)
        return Reading(
            {name: CounterValue(float(v), Source.MEASURED, 1.0, int(v))
             for name, v in zip(self.events, values, strict=True)},
            unsupported=dict(self._unsupported))

    def _destroy(self) -> None:
        try:
            self._low.cleanup_eventset(self._eventset)
            self._low.destroy_eventset(self._eventset)
        except Exception:  # noqa: BLE001 - best effort on teardown
            pass

    def close(self) -> None:
        if getattr(self, "_closed", True):
            return
        self._closed = True
        if self.events:
            try:
                self._low.stop(self._eventset)
            except Exception:  # noqa: BLE001 - a stopped or vanished target
                pass
        self._destroy()

    def __enter__(self) -> PapiGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class PapiBackend:
    name = "papi"
    source = Source.MEASURED

    def available(self) -> Capability:
        try:
            low, papi_events, exceptions = _papi()
        except BackendUnavailable as exc:
            return Capability(self.name, False, exc.reason + ": " + _INSTALL_FIX,
                              {c: exc.reason for c in NAMES})
        status = _component_status(low)
        counters: dict[str, str | None] = {}
        for name in NAMES:
            preset = PRESETS.get(name)
            if preset is None:
                counters[name] = NO_PRESET.get(name, "no PAPI preset")
                continue
            try:
                low.query_event(getattr(papi_events, preset))
                counters[name] = None
            except exceptions.PapiError as exc:
                why = f"PAPI preset {preset} does not exist on this host ({exc})"
                counters[name] = why + (f"; {status}" if status else "")
        usable = any(v is None for v in counters.values())
        reason = "PAPI presets available" if usable else (
            "no PAPI preset is available on this host" + (f": {status}" if status else ""))
        return Capability(self.name, usable, reason, counters)

    def open(self, events: Sequence[str], target: Target = THIS_THREAD, *,
             strict: bool = True) -> PapiGroup:
        from counterd.data.events import check_names

        check_names(tuple(events))
        return PapiGroup(self, events, target, strict)
