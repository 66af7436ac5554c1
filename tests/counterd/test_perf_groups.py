"""Event tables as data, the group scheduler, EINVAL splitting and multi-group reads
(counterd/backends/perf/, counterd/backends/perf/events/*.json).

Hardware groups are checked against :class:`FakeKernel`, a model of the kernel's open-time
group validation (arch/x86/events/core.c validate_group) for one CPU family: a group is
accepted iff its hardware events can each get a counter of their own among the family's
general counters (under its constraint masks) and fixed counters. Accepted events are then
opened for real as software task-clock events in the same group structure, so ioctls, reads
and closes run through the real kernel on this PMU-less machine. Software events go through
the real syscall unchanged.

Run with ``-s`` to see the groups formed for the whole canonical set on SKX, SPR and Zen 4.
"""

from __future__ import annotations

import errno
import itertools
import json
import mmap
import os
import struct
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

import counterd.backends.perf as perf
import counterd.backends.perf.group as perf_group
from counterd.backends.base import Reading, Target
from counterd.backends.perf import (
    PERF_COUNT_SW_CPU_CLOCK,
    PERF_COUNT_SW_TASK_CLOCK,
    PERF_TYPE_RAW,
    PERF_TYPE_SOFTWARE,
    EventSpec,
    PerfBackend,
    PerfEventAttr,
    PerfGroup,
    PerfReading,
    PmuFacts,
    PmuLayout,
    TableError,
    assign_counters,
    counter_choices,
    event_table,
    load_tables,
    parse_table,
    pmu_facts,
    schedule_groups,
)
from counterd.data.errors import CounterAccessDenied, EventNotSupported, NoSuchTarget
from counterd.data.events import NAMES
from tests.counterd.workloads import spin, touch_fresh_pages

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="perf_event_open is Linux-only")

PAGE = mmap.PAGESIZE
ALL = (*NAMES,)  # every canonical counter (context_switches is one of them)
SOFTWARE_GROUP = ("task_clock_ns", "page_faults", "context_switches")

CPUS = {
    "SKX": ("GenuineIntel", 6, 0x55),
    "ICX": ("GenuineIntel", 6, 0x6A),
    "SPR": ("GenuineIntel", 6, 0x8F),
    "EMR": ("GenuineIntel", 6, 0xCF),
    "Zen 1": ("AuthenticAMD", 0x17, 0x01),
    "Zen 2": ("AuthenticAMD", 0x17, 0x31),
    "Zen 3": ("AuthenticAMD", 0x19, 0x01),
    "Zen 4": ("AuthenticAMD", 0x19, 0x11),
}

# The groups the scheduler forms for the whole canonical set (SMT on, no NMI watchdog), and
# the counters no table entry can count there.
EXPECTED = {
    # SKX: 4 general counters, both memory groups full: branch-misses (0xc5) gets its own.
    "SKX": [("loads", "stores", "l1d_misses", "l2_misses", "cycles", "instructions"),
            ("l3_misses", "l1d_writebacks", "l2_writebacks", "dtlb_misses"),
            ("branch_misses",),
            SOFTWARE_GROUP],
    "SPR": [("loads", "stores", "l1d_misses", "l2_misses", "l3_misses", "cycles",
             "instructions", "branch_misses"),
            ("l2_writebacks", "dtlb_misses"),
            SOFTWARE_GROUP],
    "Zen 4": [("loads", "stores", "l1d_misses", "l2_misses", "l3_misses", "dtlb_misses"),
              ("cycles", "instructions", "branch_misses"),
              SOFTWARE_GROUP],
}
UNCOUNTABLE = {"SKX": {"l3_writebacks"}, "SPR": {"l1d_writebacks", "l3_writebacks"},
               "Zen 4": {"l1d_writebacks", "l2_writebacks", "l3_writebacks"}}


# ---------------------------------------------------------------------------------------------
# Fixture hosts and the fake kernel
# ---------------------------------------------------------------------------------------------


def make_host(tmp_path: Path, cpu: str, *, smt_control: str = "on", watchdog: int = 0,
              caps: dict[str, int] | None = None, paranoid: int = 2) -> tuple[Path, Path]:
    """sysfs/procfs fixture trees of a host with a core PMU ``cpu`` of the given family."""
    vendor, family, model = CPUS[cpu]
    sysfs, procfs = tmp_path / "sys", tmp_path / "proc"
    devices = sysfs / "bus/event_source/devices"
    for name, type_ in {"cpu": 4, "software": 1, "tracepoint": 2, "breakpoint": 5}.items():
        (devices / name).mkdir(parents=True)
        (devices / name / "type").write_text(f"{type_}\n")
    (devices / "cpu/caps").mkdir()
    (devices / "cpu/caps/max_precise").write_text("3\n")
    for file, value in (caps or {}).items():
        (devices / "cpu/caps" / file).write_text(f"{value}\n")
    smt = sysfs / "devices/system/cpu/smt"
    smt.mkdir(parents=True)
    (smt / "control").write_text(f"{smt_control}\n")
    (smt / "active").write_text("1\n" if smt_control == "on" else "0\n")
    (procfs / "sys/kernel").mkdir(parents=True)
    (procfs / "sys/kernel/perf_event_paranoid").write_text(f"{paranoid}\n")
    (procfs / "sys/kernel/nmi_watchdog").write_text(f"{watchdog}\n")
    (procfs / "cpuinfo").write_text(
        f"processor\t: 0\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: {model}\n"
        f"model name\t: fixture {cpu}\n\n")
    return sysfs, procfs


class FakeKernel:
    """perf_event_open as the kernel validates a group for one CPU family's core PMU.

    A hardware event is identified by the raw event the kernel would program (raw configs as
    given, generic ones through the family table's kernel_event); unknown ones get ENOENT.
    Joining a group that would no longer fit ``general`` general counters, under the family's
    constraint masks, and its fixed counters gives EINVAL. ``reject`` (EINVAL even alone),
    ``missing`` (ENOENT) and ``denied`` (EACCES) script per-event failures. The check is a
    brute-force search over counter assignments, independent of perf.assign_counters.
    """

    def __init__(self, cpu: str, *, general: int | None = None, reject: Sequence[int] = (),
                 missing: Sequence[int] = (), denied: Sequence[int] = (),
                 esrch: bool = False) -> None:
        self.facts: PmuFacts = pmu_facts(*CPUS[cpu])
        self.general = self.facts.general_smt_on if general is None else general
        self.reject, self.missing, self.denied = set(reject), set(missing), set(denied)
        self.esrch = esrch
        self.known: dict[tuple[int, int], int] = {}
        for entry in event_table(*CPUS[cpu]).values():
            if isinstance(entry, EventSpec) and entry.is_hardware:
                raw = entry.config if entry.type == PERF_TYPE_RAW else entry.kernel_config
                assert raw is not None
                self.known[(entry.type, entry.config)] = raw
        self.members: dict[int, list[int]] = {}  # leader fd -> raw configs in its group
        self.log: list[tuple[str, int | None, str]] = []  # (what, raw, verdict)
        self.einval_groups = 0

    def slots(self, raw: int) -> set[tuple[str, int]]:
        """The kernel's rules (x86_get_event_constraints, intel_pmu_check_event_constraints)."""
        general = {("general", i) for i in range(self.general)}
        for fixed in self.facts.fixed:
            if raw == fixed.config:
                return {("fixed", fixed.index)} | (set() if fixed.fixed_only else general)
        for constraint in self.facts.constraints:
            code, umask = raw & 0xFF, (raw >> 8) & 0xFF
            if (constraint.umask is None or constraint.umask == umask) and any(
                    lo <= code <= hi for lo, hi in constraint.codes):
                return {("general", i) for i in constraint.counters if i < self.general}
        return general

    def fits(self, raws: list[int]) -> bool:
        options = [sorted(self.slots(r)) for r in raws]
        return any(len(set(choice)) == len(choice) for choice in itertools.product(*options))

    def __call__(self, attr: PerfEventAttr, pid: int, cpu: int, group_fd: int,
                 flags: int) -> int:
        if self.esrch:
            raise OSError(errno.ESRCH, os.strerror(errno.ESRCH))
        raw: int | None = None
        if attr.type != PERF_TYPE_SOFTWARE:
            raw = self.known.get((attr.type, attr.config))
            for scripted, err in ((self.missing, errno.ENOENT), (self.reject, errno.EINVAL),
                                  (self.denied, errno.EACCES)):
                if raw in scripted or (raw is None and err == errno.ENOENT):
                    self.log.append(("open", raw, errno.errorcode[err]))
                    raise OSError(err, os.strerror(err))
            assert raw is not None
            group = [*self.members.get(group_fd, []), raw] if group_fd != -1 else [raw]
            if not self.fits(group):
                self.einval_groups += 1
                self.log.append(("join", raw, "EINVAL (group does not fit)"))
                raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
            # Accepted: count for real with a software event in the same group structure.
            attr = PerfEventAttr.from_buffer_copy(attr)
            attr.type, attr.config = PERF_TYPE_SOFTWARE, PERF_COUNT_SW_TASK_CLOCK
        fd = perf.perf_event_open(attr, pid, cpu, group_fd, flags)
        if group_fd == -1:
            self.members[fd] = [] if raw is None else [raw]
        elif raw is not None:
            self.members.setdefault(group_fd, []).append(raw)
        self.log.append(("open", raw, "ok"))
        return fd


def fake_backend(tmp_path: Path, cpu: str, kernel: FakeKernel | None = None,
                 **host: object) -> tuple[PerfBackend, FakeKernel]:
    sysfs, procfs = make_host(tmp_path, cpu, **host)  # type: ignore[arg-type]
    kernel = kernel or FakeKernel(cpu)
    return PerfBackend(sysfs, procfs, syscall=kernel), kernel


def show(title: str, groups: Sequence[Sequence[str]]) -> None:
    print(f"\n{title}:")
    for i, group in enumerate(groups, 1):
        print(f"  group {i}: {', '.join(group)}")


# ---------------------------------------------------------------------------------------------
# The data files
# ---------------------------------------------------------------------------------------------

TABLE_DIR = Path(perf.__file__).with_name("events")


def test_every_table_loads_with_version_history_and_sources() -> None:
    generic, families = load_tables()
    names = {t.name for t in families}
    assert names == {"skylakex", "icelakex", "sapphirerapids", "amdzen1", "amdzen2", "amdzen3",
                     "amdzen4"}
    for path in sorted(TABLE_DIR.glob("*.json")):
        doc = json.loads(path.read_text())
        assert doc["format_version"] == perf.TABLE_FORMAT_VERSION, path.name
        history = doc["history"]
        assert [h["revision"] for h in history] == list(range(1, doc["revision"] + 1))
        assert all(h["date"] and h["change"] for h in history)
    for table in (generic, *families):
        assert table.pmu.general_smt_on > 0 and table.pmu.source
        for name, entry in {**table.events, **table.software}.items():
            if isinstance(entry, EventSpec):
                assert entry.source, (table.name, name)
                if not entry.verified:
                    assert "unverified" in entry.note, (table.name, name)
            else:
                assert len(entry) > 20, (table.name, name)


def test_malformed_tables_are_refused() -> None:
    doc = json.loads((TABLE_DIR / "skylakex.json").read_text())
    newer = {**doc, "format_version": 99}
    with pytest.raises(TableError, match="format_version 99"):
        parse_table(newer, "skylakex.json")
    wrong = json.loads(json.dumps(doc))
    wrong["events"]["loads"]["config"] = "0x82d0"  # but the encoding says UMask 0x81
    with pytest.raises(TableError, match="does not match its encoding"):
        parse_table(wrong, "skylakex.json")
    bad_type = json.loads(json.dumps(doc))
    bad_type["events"]["loads"]["type"] = "uncore"
    with pytest.raises(TableError, match="type 'uncore'"):
        parse_table(bad_type, "skylakex.json")


def test_issue_points_are_in_the_tables() -> None:
    skx, icx, spr = (event_table(*CPUS[c]) for c in ("SKX", "ICX", "SPR"))
    zen1, zen2, zen4 = (event_table(*CPUS[c]) for c in ("Zen 1", "Zen 2", "Zen 4"))
    # L2_TRANS.L2_WB (0xF0/0x40) on SKX/CLX and ICX; SPR keeps L2_LINES_OUT.NON_SILENT.
    for table in (skx, icx):
        wb = table["l2_writebacks"]
        assert isinstance(wb, EventSpec) and wb.event == "L2_TRANS.L2_WB" and wb.config == 0x40F0
    spr_wb = spr["l2_writebacks"]
    assert isinstance(spr_wb, EventSpec) and spr_wb.config == 0x0226
    # SKX L1D.M_EVICT: not in Intel's JSON.
    evict = skx["l1d_writebacks"]
    assert isinstance(evict, EventSpec) and not evict.verified
    assert "unverified" in evict.note and "LIKWID" in evict.source
    # Zen 1 event 0x43 only in LIKWID; Zen 2 has it in the kernel's amdzen2 tables.
    for name in ("l1d_misses", "l3_misses"):
        z1, z2 = zen1[name], zen2[name]
        assert isinstance(z1, EventSpec) and isinstance(z2, EventSpec)
        assert z1.config & 0xFF == 0x43 and not z1.verified and "LIKWID" in z1.note
        assert z2.verified and "amdzen2" in z2.source
    # The generic dTLB read miss means different things: notes say so, encodings differ.
    intel_dtlb, amd_dtlb = skx["dtlb_misses"], zen4["dtlb_misses"]
    assert isinstance(intel_dtlb, EventSpec) and isinstance(amd_dtlb, EventSpec)
    assert intel_dtlb.config == amd_dtlb.config  # the same generic event ...
    assert intel_dtlb.kernel_config == 0x0E08 and amd_dtlb.kernel_config == 0xF045  # ...
    assert "demand loads only" in intel_dtlb.note and "loads and stores" in amd_dtlb.note
    spr_dtlb = spr["dtlb_misses"]
    assert isinstance(spr_dtlb, EventSpec) and spr_dtlb.kernel_config == 0x0E12
    # Family 0x19 models 0x30-0x3f: Zen 3 by arch/x86/kernel/cpu/amd.c, cited as such.
    assert perf.amd_generation(0x19, 0x30) == "zen3"
    assert perf.amd_generation(0x19, 0x3F) == "zen3"
    assert perf.amd_generation(0x19, 0x11) == "zen4" and perf.amd_generation(0x19, 0xA0) == "zen4"
    assert perf.amd_generation(0x17, 0x31) == "zen2" and perf.amd_generation(0x17, 0x08) == "zen1"
    zen3 = json.loads((TABLE_DIR / "amdzen3.json").read_text())
    note = zen3["match"][0]["note"]
    assert "arch/x86/kernel/cpu/amd.c" in note and "0x30-0x3f" in note and "mapfile" in note


# ---------------------------------------------------------------------------------------------
# The scheduler (pure)
# ---------------------------------------------------------------------------------------------


def test_counter_choices_follow_the_kernel_rules() -> None:
    spr = PmuLayout.from_facts(pmu_facts(*CPUS["SPR"]))
    general = {("general", i) for i in range(8)}
    low = {("general", i) for i in range(4)}
    assert counter_choices(0x81D0, spr) == low  # MEM_INST_RETIRED: 0xd0-0xdf -> 0-3
    assert counter_choices(0x0151, spr) == low  # L1D.REPLACEMENT: 0x01-0x8f -> 0-3
    assert counter_choices(0x412E, spr) == general  # LONGEST_LAT_CACHE: the exception
    assert counter_choices(0x003C, spr) == general | {("fixed", 1)}  # cycles: fixed or any
    assert counter_choices(0x00C0, spr) == general | {("fixed", 0)}
    assert counter_choices(0x0300, spr) == {("fixed", 2)}  # ref-cycles pseudo-encoding
    assert counter_choices(0x01CD + 0x100, spr) == {("general", 0)}  # 0x02cd: counter 0 only
    assert counter_choices(None, spr) == general
    zen = PmuLayout.from_facts(pmu_facts(*CPUS["Zen 4"]))
    assert counter_choices(0x0076, zen) == {("general", i) for i in range(6)}


def test_assignment_is_a_matching_not_a_greedy_guess() -> None:
    a, b = ("general", 0), ("general", 1)
    # Greedy in order would give the first event counter 0 and leave the second nothing.
    assert assign_counters([frozenset({a, b}), frozenset({a})]) == [b, a]
    assert assign_counters([frozenset({a}), frozenset({a})]) is None
    assert assign_counters([]) == []


@pytest.mark.parametrize("cpu", ["SKX", "SPR", "Zen 4"])
def test_whole_canonical_set_is_scheduled_into_groups_that_fit(tmp_path: Path, cpu: str) -> None:
    backend, _ = fake_backend(tmp_path, cpu)
    groups = backend.plan(ALL)
    layout = backend.pmu_layout()
    show(f"{cpu} ({perf.cpu_label(*CPUS[cpu])}; {layout.general} general counters, "
         f"fixed {[f.index for f in layout.fixed]}), whole canonical set", groups)
    assert groups == EXPECTED[cpu]
    table = backend.table()
    for group in groups[:-1]:  # each hardware group has a counter per event
        choices = [counter_choices(table[n].raw_config, layout)  # type: ignore[union-attr]
                   for n in group]
        assert assign_counters(choices) is not None
    planned = {n for g in groups for n in g}
    assert planned == set(ALL) - UNCOUNTABLE[cpu]


def test_smt_off_caps_and_watchdog_change_the_plan(tmp_path: Path) -> None:
    # Skylake-SP with Hyper-Threading off in firmware: 8 general counters, MEM_* still 0-3.
    skx, _ = fake_backend(tmp_path / "a", "SKX", smt_control="notsupported")
    assert skx.pmu_layout().general == 8
    hardware = tuple(n for g in EXPECTED["SKX"][:2] for n in g)
    # 8 general counters hold every memory event; branch-misses would be a ninth.
    assert skx.plan(ALL) == [tuple(n for n in ALL if n in hardware), ("branch_misses",),
                             SOFTWARE_GROUP]
    # A kernel turning SMT off does not undo the firmware's split.
    assert fake_backend(tmp_path / "b", "SKX", smt_control="off")[0].pmu_layout().general == 4
    # A count in sysfs caps wins over the table.
    capped, _ = fake_backend(tmp_path / "c", "Zen 4", caps={"num_counters": 3})
    assert capped.pmu_layout().general == 3
    assert capped.plan(ALL)[:3] == [("loads", "stores", "l1d_misses"),
                                    ("l2_misses", "l3_misses", "dtlb_misses"),
                                    ("cycles", "instructions", "branch_misses")]
    # The NMI watchdog's pinned cycles event holds a counter: Zen 4 groups of 5.
    zen, _ = fake_backend(tmp_path / "d", "Zen 4", watchdog=1)
    groups = zen.plan(ALL)
    show("Zen 4 with kernel.nmi_watchdog=1", groups)
    assert groups[:2] == [("loads", "stores", "l1d_misses", "l2_misses", "l3_misses"),
                          ("dtlb_misses", "cycles", "instructions", "branch_misses")]
    # On Skylake-SP it holds fixed counter 1, so cycles needs one of the 4 general counters.
    skx_wd, _ = fake_backend(tmp_path / "e", "SKX", watchdog=1)
    groups = skx_wd.plan(ALL)
    show("SKX with kernel.nmi_watchdog=1", groups)
    assert groups[:3] == [("loads", "stores", "l1d_misses", "l2_misses", "instructions"),
                          ("l3_misses", "l1d_writebacks", "l2_writebacks", "dtlb_misses"),
                          ("cycles", "branch_misses")]


def test_unknown_cpu_plans_with_the_generic_assumption() -> None:
    layout = PmuLayout.from_facts(pmu_facts("GenuineIntel", 6, 0x3F))
    assert layout.general == 4 and not layout.fixed
    table = event_table("GenuineIntel", 6, 0x3F)
    wanted = [(n, e) for n, e in table.items() if isinstance(e, EventSpec)]
    groups = schedule_groups(wanted, layout)
    assert all(len(g) <= 4 for g in groups[:-1]) and groups[-1] == SOFTWARE_GROUP


# ---------------------------------------------------------------------------------------------
# Opening on the fake kernel: groups, splitting, errors
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cpu", ["SKX", "SPR", "Zen 4"])
def test_whole_canonical_set_opens_as_planned_and_reads(tmp_path: Path, cpu: str) -> None:
    backend, kernel = fake_backend(tmp_path, cpu)
    with backend.open(ALL, strict=False) as group:
        assert isinstance(group, PerfGroup)
        show(f"{cpu}: opened", group.groups)
        assert [set(g) for g in group.groups] == [set(g) for g in EXPECTED[cpu]]
        assert kernel.einval_groups == 0  # the plan fits: the kernel rejected nothing
        assert set(group.events) == set(ALL) - UNCOUNTABLE[cpu]
        assert group.events == tuple(n for n in ALL if n in group.events)  # request order
        spin(0.02)
        reading = group.read()
        assert isinstance(reading, PerfReading)
        assert list(reading.values) == list(group.events)
        assert set(reading.unsupported) == UNCOUNTABLE[cpu]
        for names in group.groups:  # one ratio per group, every value carries it
            ratios = {reading.values[n].ratio for n in names}
            assert len(ratios) == 1 and 0.0 < ratios.pop() <= 1.0
            assert len({reading.times[n] for n in names}) == 1
        raw1 = group.read_raw()
        spin(0.02)
        raw2 = group.read_raw()
        assert isinstance(raw1, tuple) and isinstance(raw2, tuple)
        assert len(raw1) == sum(2 + len(g) for g in group.groups)
        values, unsupported = group.delta_raw(raw1, raw2)
        assert list(values) == list(group.events) and set(unsupported) == UNCOUNTABLE[cpu]
        assert values["loads"].value > 0  # task-clock stand-ins: CPU time of this thread


@pytest.mark.parametrize("cpu", ["SKX", "SPR", "Zen 4"])
def test_the_old_single_group_is_split_and_nothing_is_dropped(tmp_path: Path,
                                                              cpu: str) -> None:
    backend, kernel = fake_backend(tmp_path, cpu)
    table = backend.table()
    everything = [(n, e) for n in ALL if isinstance(e := table[n], EventSpec)]
    with backend.open_groups([everything], strict=True) as group:
        show(f"{cpu}: one group of everything, after EINVAL splits", group.groups)
        assert kernel.einval_groups >= 1  # the whole set does not fit: the kernel said EINVAL
        assert set(group.events) == {n for n, _ in everything}  # nothing dropped
        assert not group.read().unsupported
        for names in group.groups:
            hardware = [kernel.known[(e.type, e.config)] for n, e in everything
                        if n in names and e.is_hardware]
            assert kernel.fits(hardware)


def test_einval_splits_when_the_pmu_has_fewer_counters_than_the_table(tmp_path: Path) -> None:
    # A VM exposing 2 general counters where the Skylake-SP table says 4: the kernel refuses
    # (EINVAL) the third and fourth general-counter events of each planned group; the group
    # keeps what it accepted (the fixed-counter events still join) and the refused events
    # form the next group. Nothing that opens alone is dropped.
    backend, kernel = fake_backend(tmp_path, "SKX", FakeKernel("SKX", general=2))
    with backend.open(ALL, strict=False) as group:
        show("SKX planned for 4 general counters, on a PMU with 2", group.groups)
        assert [verdict for what, _, verdict in kernel.log if what == "join"] == [
            "EINVAL (group does not fit)"] * 4
        assert group.groups == (("loads", "stores", "cycles", "instructions"),
                                ("l1d_misses", "l2_misses"),
                                ("l3_misses", "l1d_writebacks"),
                                ("l2_writebacks", "dtlb_misses"),
                                ("branch_misses",),
                                SOFTWARE_GROUP)
        assert set(group.events) == set(ALL) - UNCOUNTABLE["SKX"]
        assert set(group.read().unsupported) == UNCOUNTABLE["SKX"]
    # The opener itself, for the record: two planned groups were split.
    opener = perf._Opener(kernel, Target(), grouped=True, strict=True, include_kernel=False,
                          paranoid=2)
    table = backend.table()
    opener.open([(n, table[n]) for n in EXPECTED["SKX"][0]])  # type: ignore[misc]
    try:
        assert opener.splits == 1 and [g for g, _ in opener.groups] == [
            ("loads", "stores", "cycles", "instructions"), ("l1d_misses", "l2_misses")]
    finally:
        perf._close_all(opener.fds)


def test_an_encoding_rejected_alone_is_reported_and_the_rest_kept(tmp_path: Path) -> None:
    evict = 0x0451  # L1D.M_EVICT on Skylake-SP, here rejected by the "kernel"
    backend, _ = fake_backend(tmp_path / "a", "SKX", FakeKernel("SKX", reject=[evict]))
    with pytest.raises(EventNotSupported) as info:
        backend.open([n for n in ALL if n != "l3_writebacks"])
    assert info.value.event == "l1d_writebacks"
    assert "rejected the event encoding" in info.value.reason
    assert "EINVAL when opened alone" in info.value.reason and "L1D.M_EVICT" in str(info.value)
    backend, kernel = fake_backend(tmp_path / "b", "SKX", FakeKernel("SKX", reject=[evict]))
    with backend.open(ALL, strict=False) as group:
        show("SKX with l1d_writebacks rejected alone", group.groups)
        assert group.groups[1] == ("l3_misses", "l2_writebacks", "dtlb_misses")
        reading = group.read()
    assert set(reading.unsupported) == {"l1d_writebacks", "l3_writebacks"}
    assert "rejected the event encoding" in reading.unsupported["l1d_writebacks"]
    assert set(group.events) == set(ALL) - {"l1d_writebacks", "l3_writebacks"}


def test_enoent_names_the_counter_and_says_not_on_this_pmu(tmp_path: Path) -> None:
    backend, _ = fake_backend(tmp_path, "SPR", FakeKernel("SPR", missing=[0x0226]))
    with pytest.raises(EventNotSupported) as info:
        backend.open(["loads", "l2_writebacks", "l2_misses"])
    assert info.value.event == "l2_writebacks"
    assert "not on this PMU" in info.value.reason and "ENOENT" in info.value.reason
    assert "L2_LINES_OUT.NON_SILENT" in info.value.reason
    with backend.open(["loads", "l2_writebacks", "l2_misses"], strict=False) as group:
        assert group.groups == (("loads", "l2_misses"),)
        assert "not on this PMU" in group.read().unsupported["l2_writebacks"]


def test_permission_errors_keep_the_paranoid_translation(tmp_path: Path) -> None:
    kernel = FakeKernel("Zen 4", denied=[0x0076])  # cycles refused
    backend, _ = fake_backend(tmp_path, "Zen 4", kernel, paranoid=3)
    with pytest.raises(CounterAccessDenied) as info:
        backend.open(["loads", "cycles", "instructions"])
    assert info.value.event == "cycles" and "perf_event_paranoid=3" in str(info.value)
    assert "CAP_PERFMON" in (info.value.fix or "")
    with backend.open(["loads", "cycles", "instructions"], strict=False) as group:
        assert set(group.events) == {"loads", "instructions"}
        assert "perf_event_paranoid=3" in group.read().unsupported["cycles"]


def test_a_missing_target_raises_even_when_lenient(tmp_path: Path) -> None:
    backend, _ = fake_backend(tmp_path, "SKX", FakeKernel("SKX", esrch=True))
    with pytest.raises(NoSuchTarget):
        backend.open(["loads", "stores"], Target(pid=4242), strict=False)


def test_software_listed_first_still_takes_the_fast_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """read_raw() used to fall back to a second read(2) whenever a software counter was
    listed before a hardware one (the kernel returns the group in open order, hardware
    first). Now there is one read(2) per kernel group and no fallback."""
    backend, _ = fake_backend(tmp_path, "SKX")
    table = backend.table()
    loads, clock = table["loads"], table["task_clock_ns"]
    assert isinstance(loads, EventSpec) and isinstance(clock, EventSpec)
    # One kernel group, hardware leader, requested software-first.
    group = backend.open_groups([[("loads", loads), ("task_clock_ns", clock)]],
                                order=["task_clock_ns", "loads"])
    calls: list[int] = []
    real_read = os.read

    def counting_read(fd: int, n: int) -> bytes:
        calls.append(fd)
        return real_read(fd, n)

    try:
        assert group.events == ("task_clock_ns", "loads")
        assert group.groups == (("loads", "task_clock_ns"),)
        monkeypatch.setattr(perf_group.os, "read", counting_read)
        first = group.read_raw()
        spin(0.01)
        second = group.read_raw()
        monkeypatch.undo()
        assert isinstance(first, tuple) and isinstance(second, tuple)
        assert len(calls) == 2  # one read(2) each, no fallback
        values, _ = group.delta_raw(first, second)
        assert list(values) == ["task_clock_ns", "loads"]
        assert values["task_clock_ns"].value > 0.005e9
    finally:
        group.close()
    # And through open(): the software counter in its own group, one read per group.
    with backend.open(["task_clock_ns", "page_faults", "loads"]) as both:
        assert both.groups == (("loads",), ("task_clock_ns", "page_faults"))
        calls.clear()
        monkeypatch.setattr(perf_group.os, "read", counting_read)
        raw = both.read_raw()
        monkeypatch.undo()
        assert isinstance(raw, tuple) and len(calls) == 2


# ---------------------------------------------------------------------------------------------
# Several real groups of software events through the real syscall
# ---------------------------------------------------------------------------------------------

CPU_CLOCK = EventSpec(PERF_TYPE_SOFTWARE, PERF_COUNT_SW_CPU_CLOCK, "cpu-clock")


def software_spec(name: str) -> EventSpec:
    entry = load_tables()[0].software[name]
    assert isinstance(entry, EventSpec)
    return entry


@pytest.fixture
def two_real_groups() -> PerfGroup:
    group = PerfBackend().open_groups(
        [[("task_clock_ns", software_spec("task_clock_ns")),
          ("page_faults", software_spec("page_faults"))],
         [("context_switches", software_spec("context_switches")),
          ("cpu_clock_ns", CPU_CLOCK)]])
    yield group
    group.close()


def test_two_real_groups_read_atomically_with_sane_values(
        two_real_groups: PerfGroup, monkeypatch: pytest.MonkeyPatch) -> None:
    group = two_real_groups
    assert group.groups == (("task_clock_ns", "page_faults"), ("context_switches",
                                                               "cpu_clock_ns"))
    before = group.read()
    cpu0 = time.thread_time_ns()
    touch_fresh_pages(200)
    spin(0.1)
    for _ in range(3):
        time.sleep(0.005)
    cpu_ns = time.thread_time_ns() - cpu0
    calls: list[int] = []
    real_read = os.read

    def counting_read(fd: int, n: int) -> bytes:
        calls.append(fd)
        return real_read(fd, n)

    monkeypatch.setattr(perf_group.os, "read", counting_read)
    after = group.read()
    monkeypatch.undo()
    assert len(calls) == 2 and len(set(calls)) == 2  # one read(2) per group, on each leader
    assert isinstance(after, PerfReading)
    delta = after.delta(before)
    assert delta["task_clock_ns"].value == pytest.approx(cpu_ns, rel=0.1)
    assert delta["cpu_clock_ns"].value == pytest.approx(cpu_ns, rel=0.1)
    assert 200 <= delta["page_faults"].value < 600
    assert delta["context_switches"].value >= 3
    for value in delta.values():  # software events are never multiplexed: ratio reported 1
        assert value.ratio == 1.0 and value.raw is not None and value.value == value.raw
    # Each group has its own times: the two leaders were enabled one after the other.
    assert after.times["task_clock_ns"] == after.times["page_faults"]
    assert after.times["context_switches"] == after.times["cpu_clock_ns"]
    assert after.time_enabled_ns > 0


def test_two_real_groups_raw_path_matches_readings(two_real_groups: PerfGroup) -> None:
    group = two_real_groups
    r1, a = group.read_raw(), group.read()
    touch_fresh_pages(64)
    spin(0.02)
    r2, b = group.read_raw(), group.read()
    assert isinstance(r1, tuple) and isinstance(r2, tuple) and len(r1) == 2 * (2 + 2)
    values, unsupported = group.delta_raw(r1, r2)
    assert list(values) == ["task_clock_ns", "page_faults", "context_switches", "cpu_clock_ns"]
    assert not unsupported
    assert values["page_faults"].value >= 64
    # The same spans through Readings: the raw tuple decodes like the reading of it.
    assert group._as_reading(r2).delta(group._as_reading(r1)) == values
    assert b.delta(a)["page_faults"].value >= 64
    mixed, _ = group.delta_raw(r1, b)  # a tuple and a Reading mix
    assert mixed["page_faults"].value >= 64


def scripted(enabled: int, running: int, pairs: list[tuple[int, int]]) -> bytes:
    buf = struct.pack("=QQQ", len(pairs), enabled, running)
    for value, event_id in pairs:
        buf += struct.pack("=QQ", value, event_id)
    return buf


def test_each_group_keeps_its_own_multiplexing_ratio() -> None:
    """Two groups multiplexed differently (scripted reads through pipes): every value is
    scaled by its own group's running/enabled, in read(), delta_raw() and Reading.delta()."""
    pipes = [os.pipe(), os.pipe()]
    group = PerfGroup(("loads", "stores", "cycles"), Target(),
                      [pipes[0][0], pipes[1][0]], {1: "loads", 2: "cycles", 3: "stores"},
                      grouped=True, unsupported={},
                      groups=[(("loads", "cycles"), [pipes[0][0]]),
                              (("stores",), [pipes[1][0]])])
    try:
        for (_rfd, wfd), buf in zip(pipes, [scripted(1000, 500, [(10, 1), (40, 2)]),
                                           scripted(1000, 250, [(30, 3)])], strict=True):
            os.write(wfd, buf)
        first = group.read()
        assert isinstance(first, PerfReading)
        assert list(first.values) == ["loads", "stores", "cycles"]
        assert first.values["loads"].value == 20.0 and first.values["loads"].ratio == 0.5
        assert first.values["cycles"].value == 80.0
        assert first.values["stores"].value == 120.0 and first.values["stores"].ratio == 0.25
        assert (first.time_enabled_ns, first.time_running_ns) == (1000, 250)  # most multiplexed
        for (_rfd, wfd), buf in zip(pipes, [scripted(2000, 1500, [(30, 1), (90, 2)]),
                                           scripted(2000, 250, [(30, 3)])], strict=True):
            os.write(wfd, buf)
        second = group.read()
        delta = second.delta(first)
        assert delta["loads"].value == 20 * 1000 / 1000 and delta["loads"].ratio == 1.0
        assert delta["stores"].value == 0.0 and delta["stores"].ratio == 0.0  # never ran
        a = (1000, 500, 10, 40, 1000, 250, 30)
        b = (2000, 1000, 30, 90, 2000, 750, 60)
        values, _ = group.delta_raw(a, b)
        assert values["loads"].value == 40.0 and values["loads"].ratio == 0.5
        assert values["stores"].value == 60.0 and values["stores"].ratio == 0.5
        assert list(values) == ["loads", "stores", "cycles"]
        assert group._as_reading(b).delta(group._as_reading(a)) == values
    finally:
        group.close()
        for _, wfd in pipes:
            os.close(wfd)


def test_a_foreign_buffer_is_decoded_from_the_same_read(monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    """When a group's buffer does not have the layout opened (here: members reordered),
    read_raw() decodes those same bytes with the checked decoder: no second read(2)."""
    rfd, wfd = os.pipe()
    group = PerfGroup(("loads", "stores"), Target(), [rfd], {1: "loads", 2: "stores"},
                      grouped=True, unsupported={"l3_writebacks": "uncore"})
    calls: list[int] = []
    real_read = os.read

    def counting_read(fd: int, n: int) -> bytes:
        calls.append(fd)
        return real_read(fd, n)

    try:
        os.write(wfd, scripted(900, 300, [(20, 2), (10, 1)]))
        monkeypatch.setattr(perf_group.os, "read", counting_read)
        result = group.read_raw()
        monkeypatch.undo()
        assert len(calls) == 1
        assert isinstance(result, Reading)
        assert result.values["loads"].value == 30.0 and result.values["stores"].raw == 20
        assert result.unsupported == {"l3_writebacks": "uncore"}
    finally:
        group.close()
        os.close(wfd)
