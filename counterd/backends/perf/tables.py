"""The perf event tables: which event counts each canonical counter on a CPU, as data.

Which event counts which canonical counter depends on the CPU: versioned data files in
``events/`` (one per CPU family, plus ``generic.json``) give, per canonical counter, an
:class:`EventSpec` or the reason it cannot be had, with the source each encoding was checked
against, and the family's PMU facts (general counters with SMT on/off, fixed counters,
counter constraints). This module loads and validates them (:func:`load_tables`,
:func:`parse_table`) and finds the one for a CPU family (:func:`family_table`).

References: arch/x86/events/intel/core.c and amd/core.c (event constraints, generic event
maps); the encodings cite intel/perfmon and the kernel's
tools/perf/pmu-events/arch/x86/<cpu>/*.json in each data file.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from counterd.backends.perf.syscall import (
    HARDWARE_TYPES,
    PERF_TYPE_HARDWARE,
    PERF_TYPE_HW_CACHE,
    PERF_TYPE_RAW,
    PERF_TYPE_SOFTWARE,
)
from counterd.data.errors import CounterdError

# --------------------------------------------------------------------------------------------
# Event tables: versioned data files in counterd/backends/perf/events/*.json
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EventSpec:
    """How to count one canonical counter: ``perf_event_attr.type``/``config`` (+ config1).

    ``event`` is the vendor's or perf's name for it; ``note`` says where it differs from the
    canonical definition in counterd/data/events.py (an honest caveat, empty when it matches);
    ``source`` what the encoding was checked against; ``verified`` is False where no vendor
    or kernel list has the event (the note says which list it comes from).
    ``kernel_side``: the event only ever fires in kernel mode, so it is opened without
    ``exclude_kernel`` (which would filter every occurrence out, kernel/events/core.c
    perf_exclude_event) and needs perf_event_paranoid <= 1 or privileges.
    ``kernel_config``: for perf's generic events (PERF_TYPE_HARDWARE / HW_CACHE), the raw event
    the kernel programs for them on this CPU family, which decides the counters it may use.
    """

    type: int
    config: int
    event: str
    note: str = ""
    config1: int = 0
    kernel_side: bool = False
    source: str = ""
    kernel_config: int | None = None
    verified: bool = True

    @property
    def is_hardware(self) -> bool:
        return self.type in HARDWARE_TYPES

    @property
    def raw_config(self) -> int | None:
        """The raw event the PMU is programmed with (None: not known for this CPU)."""
        return self.config if self.type == PERF_TYPE_RAW else self.kernel_config

    def describe(self) -> str:
        kind = TYPE_NAMES.get(self.type, str(self.type))
        return f"{self.event} ({kind} config {self.config:#x})"


def hw_cache_config(cache: int, op: int, result: int) -> int:
    """``PERF_TYPE_HW_CACHE`` config: ``id | op << 8 | result << 16`` (perf_event_open(2))."""
    return cache | (op << 8) | (result << 16)


def intel_raw_config(event: int, umask: int, cmask: int = 0, inv: bool = False,
                     edge: bool = False) -> int:
    """``PERF_TYPE_RAW`` config for an Intel core event: IA32_PERFEVTSELx layout
    (SDM vol. 3B 20.2.1.1): event[7:0], umask[15:8], edge[18], inv[23], cmask[31:24];
    the same fields as /sys/bus/event_source/devices/cpu/format/*."""
    return (event & 0xFF) | (umask & 0xFF) << 8 | int(edge) << 18 | int(inv) << 23 | (
        cmask & 0xFF) << 24


def amd_raw_config(event: int, umask: int) -> int:
    """``PERF_TYPE_RAW`` config for an AMD core event: PERF_CTL layout, event[7:0],
    umask[15:8], event[11:8] in bits [35:32] (/sys/.../cpu/format/event = config:0-7,32-35)."""
    return (event & 0xFF) | (umask & 0xFF) << 8 | ((event >> 8) & 0xF) << 32


# Counters that only perf provides; accepted by open() even if events.py does not list them.
PERF_EXTRA_NAMES: tuple[str, ...] = ("context_switches",)

TABLE_FORMAT_VERSION = 1  # the data-file layout this module reads (events/README.md)
TYPE_NAMES: dict[int, str] = {PERF_TYPE_HARDWARE: "hardware", PERF_TYPE_SOFTWARE: "software",
                              PERF_TYPE_HW_CACHE: "hw_cache", PERF_TYPE_RAW: "raw"}
_TYPES_BY_NAME = {name: number for number, name in TYPE_NAMES.items()}
_ENCODERS = {"GenuineIntel": intel_raw_config, "AuthenticAMD": amd_raw_config}


class TableError(CounterdError):
    """A perf/events/*.json file is malformed or newer than this code."""

    def __init__(self, path: str, what: str) -> None:
        super().__init__(f"perf event table {path}: {what}",
                         "the tables are package data of counterd: reinstall it, or fix the "
                         "file (perf/events/README.md describes the format)")


@dataclass(frozen=True)
class FixedCounter:
    """A fixed-function counter: it counts one event (``config``, event | umask << 8) only.
    The kernel also lets that event use a general counter unless ``fixed_only`` (the
    pseudo-encodings with event code 0, arch/x86/events/intel/core.c
    intel_pmu_check_event_constraints)."""

    index: int
    event: str
    config: int
    serves: tuple[str, ...] = ()
    fixed_only: bool = False


@dataclass(frozen=True)
class CounterConstraint:
    """General counters an event may use, matched on the event-select byte (and the umask when
    given), as the kernel's INTEL_EVENT_CONSTRAINT(_RANGE)/INTEL_UEVENT_CONSTRAINT entries;
    the first matching constraint of a family applies (x86_get_event_constraints)."""

    codes: tuple[tuple[int, int], ...]
    counters: frozenset[int]
    umask: int | None = None
    source: str = ""

    def matches(self, config: int) -> bool:
        code, umask = config & 0xFF, (config >> 8) & 0xFF
        if self.umask is not None and umask != self.umask:
            return False
        return any(lo <= code <= hi for lo, hi in self.codes)


@dataclass(frozen=True)
class PmuFacts:
    """What a CPU family's core PMU offers one logical CPU, from its table's ``pmu`` section."""

    general_smt_on: int
    general_smt_off: int
    fixed: tuple[FixedCounter, ...] = ()
    constraints: tuple[CounterConstraint, ...] = ()
    watchdog_config: int | None = None
    source: str = ""


@dataclass(frozen=True)
class EventTable:
    """One data file: a CPU family's encodings (or the generic ones) and its PMU facts."""

    name: str
    label: str
    revision: int
    path: str
    events: Mapping[str, EventSpec | str]
    pmu: PmuFacts
    matches: tuple[tuple[str, int, tuple[tuple[int, int], ...]], ...] = ()
    model_labels: Mapping[int, str] = field(default_factory=dict)
    software: Mapping[str, EventSpec | str] = field(default_factory=dict)
    label_appended: frozenset[str] = frozenset()

    def covers(self, vendor: str, family: int, model: int) -> bool:
        return any(v == vendor and f == family and any(lo <= model <= hi for lo, hi in ranges)
                   for v, f, ranges in self.matches)


def _int(value: object, path: str, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TableError(path, f"{what} must be an integer or a hex string, not {value!r}")
    try:
        return value if isinstance(value, int) else int(value, 0)
    except ValueError:
        raise TableError(path, f"{what}: {value!r} is not a number") from None


def _ranges(items: Sequence[object], path: str, what: str) -> tuple[tuple[int, int], ...]:
    """``["0x01-0x8f", "0xce"]`` -> ((1, 0x8f), (0xce, 0xce))."""
    out = []
    for item in items:
        lo, _, hi = str(item).partition("-")
        out.append((_int(lo, path, what), _int(hi or lo, path, what)))
    return tuple(out)


def _counter_set(text: object, path: str) -> frozenset[int]:
    return frozenset(i for lo, hi in _ranges(str(text).split(","), path, "counters")
                     for i in range(lo, hi + 1))


def _event_entry(name: str, entry: Mapping[str, Any], vendor: str | None,
                 path: str) -> EventSpec | str:
    if "unsupported" in entry:
        return str(entry["unsupported"])
    kind = entry.get("type")
    if kind not in _TYPES_BY_NAME:
        raise TableError(path, f"{name}: type {kind!r} is not one of {sorted(_TYPES_BY_NAME)}")
    config = _int(entry.get("config"), path, f"{name}.config")
    encoding = entry.get("encoding")
    if encoding is not None:  # the vendor's EventCode/UMask must give the same config
        encode = _ENCODERS.get(vendor or "")
        if encode is None:
            raise TableError(path, f"{name}: an encoding needs a vendor in the match rules")
        expected = encode(_int(encoding.get("EventCode"), path, f"{name}.EventCode"),
                          _int(encoding.get("UMask", 0), path, f"{name}.UMask"))
        if expected != config:
            raise TableError(path, f"{name}: config {config:#x} does not match its encoding "
                             f"{dict(encoding)} ({expected:#x})")
    kernel = entry.get("kernel_event")
    return EventSpec(
        type=_TYPES_BY_NAME[kind], config=config, event=str(entry.get("event", name)),
        note=str(entry.get("note", "")),
        config1=_int(entry.get("config1", 0), path, f"{name}.config1"),
        kernel_side=bool(entry.get("kernel_side", False)), source=str(entry.get("source", "")),
        kernel_config=None if kernel is None else _int(kernel.get("config"), path,
                                                       f"{name}.kernel_event"),
        verified=bool(entry.get("verified", True)))


def _pmu_facts(section: Mapping[str, Any], path: str) -> PmuFacts:
    general = section.get("general_counters") or {}
    fixed = tuple(
        FixedCounter(index=_int(f.get("index"), path, "fixed index"), event=str(f.get("event")),
                     config=_int(f.get("config"), path, "fixed config"),
                     serves=tuple(f.get("serves", ())), fixed_only=bool(f.get("fixed_only")))
        for f in section.get("fixed_counters", ()))
    constraints = tuple(
        CounterConstraint(codes=_ranges(c.get("event_codes", ()), path, "event_codes"),
                          counters=_counter_set(c.get("counters", ""), path),
                          umask=None if c.get("umask") is None else _int(c["umask"], path,
                                                                         "umask"),
                          source=str(c.get("source", "")))
        for c in section.get("constraints", ()))
    watchdog = (section.get("nmi_watchdog") or {}).get("config")
    return PmuFacts(
        general_smt_on=_int(general.get("smt_on"), path, "general_counters.smt_on"),
        general_smt_off=_int(general.get("smt_off"), path, "general_counters.smt_off"),
        fixed=fixed, constraints=constraints,
        watchdog_config=None if watchdog is None else _int(watchdog, path, "nmi_watchdog"),
        source=str(general.get("source", "")))


def parse_table(doc: Mapping[str, Any], path: str) -> EventTable:
    """One data file's JSON -> :class:`EventTable`; raises :class:`TableError` on anything
    malformed, including an ``encoding`` that does not give the stated ``config``."""
    version = doc.get("format_version")
    if version != TABLE_FORMAT_VERSION:
        raise TableError(path, f"format_version {version!r}, this counterd reads "
                         f"{TABLE_FORMAT_VERSION}")
    matches = tuple(
        (str(m.get("vendor")), _int(m.get("family"), path, "family"),
         _ranges(m.get("models", ()), path, "models"))
        for m in doc.get("match", ()))
    vendors = {m[0] for m in matches}
    vendor = vendors.pop() if len(vendors) == 1 else None
    events = {name: _event_entry(name, entry, vendor, path)
              for name, entry in doc.get("events", {}).items()}
    software = {name: _event_entry(name, entry, vendor, path)
                for name, entry in doc.get("software", {}).items()}
    appended = frozenset(name for name, entry in doc.get("events", {}).items()
                         if entry.get("append_cpu_label"))
    return EventTable(
        name=str(doc.get("table")), label=str(doc.get("label", doc.get("table"))),
        revision=_int(doc.get("revision", 0), path, "revision"), path=path, events=events,
        pmu=_pmu_facts(doc.get("pmu") or {}, path), matches=matches,
        model_labels={_int(k, path, "model"): str(v)
                      for k, v in (doc.get("model_labels") or {}).items()},
        software=software, label_appended=appended)


@functools.lru_cache(maxsize=1)
def load_tables() -> tuple[EventTable, tuple[EventTable, ...]]:
    """``(generic, families)`` from the package's events/*.json (read once)."""
    generic: EventTable | None = None
    families: list[EventTable] = []
    # The package's own directory, not importlib.resources.files: that costs 3-8 ms of imports
    # (zipfile, tempfile) on the way to counterd record's exec, for packages counterd is never
    # shipped as (its C extensions need a directory on disk too).
    folder = Path(__file__).resolve().parent / "events"
    for item in sorted(folder.iterdir(), key=lambda p: p.name):
        if not item.name.endswith(".json"):
            continue
        path = f"counterd/backends/perf/events/{item.name}"
        try:
            doc = json.loads(item.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise TableError(path, f"cannot be read: {exc}") from exc
        table = parse_table(doc, path)
        if table.name == "generic":
            generic = table
        else:
            families.append(table)
    if generic is None:
        raise TableError("counterd/backends/perf/events/generic.json", "missing")
    return generic, tuple(families)


def family_table(vendor: str, family: int, model: int) -> EventTable | None:
    """The data file whose match rules cover this CPU, or None (generic events only)."""
    return next((t for t in load_tables()[1] if t.covers(vendor, family, model)), None)


def amd_generation(family: int, model: int) -> str | None:
    """Zen generation ("zen1".."zen4") from family/model, by the AMD tables' match rules:
    family 0x17 models 0x00-0x2f Zen 1 and the rest Zen 2, as tools/perf/pmu-events/arch/x86/
    mapfile.csv maps them; family 0x19 models 0x00-0x0f and 0x20-0x5f Zen 3, the rest Zen 4,
    as arch/x86/kernel/cpu/amd.c (bsp_init_amd) does. mapfile.csv differs there: its amdzen3
    pattern leaves models 0x30-0x3f to amdzen4 (see amdzen3.json)."""
    table = family_table("AuthenticAMD", family, model)
    return table.name.removeprefix("amd") if table is not None else None


def cpu_label(vendor: str, family: int, model: int) -> str:
    """A human name for the CPU the tables know it as, for messages."""
    table = family_table(vendor, family, model)
    if table is not None:
        return table.model_labels.get(model, table.label)
    return f"{vendor or 'unknown vendor'} family {family:#x} model {model:#x}"


def event_table(vendor: str, family: int, model: int) -> dict[str, EventSpec | str]:
    """Canonical counter -> how to count it on this CPU, or why it cannot be counted.

    Pure: reads nothing from the host but the package's data files. Software events and
    perf's generic events (generic.json) come first; a family's table (Intel family 6 models
    0x55, 0x6a, 0x6c, 0x8f, 0xcf; AMD families 0x17 and 0x19) replaces them where the generic
    event is missing or means something else (e.g. amd_hw_cache_event_ids_f17h maps L1D read
    access to ls_dc_accesses, loads and stores, so the generic "loads" is wrong on Zen).
    """
    generic, _ = load_tables()
    table: dict[str, EventSpec | str] = {**generic.events, **generic.software}
    specific = family_table(vendor, family, model)
    if specific is None:
        label = cpu_label(vendor, family, model)
        for name in generic.label_appended:
            table[name] = f"{table[name]} ({label})"
    else:
        table.update(specific.events)
    return table


def pmu_facts(vendor: str, family: int, model: int) -> PmuFacts:
    """The PMU facts of this CPU's family table, or the generic assumption."""
    specific = family_table(vendor, family, model)
    return (specific or load_tables()[0]).pmu
