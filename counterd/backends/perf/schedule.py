"""The group scheduler (pure): which events can share a kernel group.

:func:`schedule_groups` partitions the requested events into groups that fit the PMU's
counters (a bipartite matching per group, :func:`assign_counters`); the kernel multiplexes the
groups.

References: arch/x86/events/core.c (validate_group, x86_schedule_events);
arch/x86/events/intel/core.c and amd/core.c (event constraints).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from counterd.backends.perf.tables import CounterConstraint, EventSpec, FixedCounter, PmuFacts

Slot = tuple[str, int]  # ("fixed", index) or ("general", index)


@dataclass(frozen=True)
class PmuLayout:
    """The counters one logical CPU offers, as the scheduler sees them: ``general`` general
    counters (from sysfs caps where the kernel exports a count, else the family table for
    the SMT state), the family's fixed counters and constraints, and the raw config of the
    NMI watchdog's pinned cycles event when kernel.nmi_watchdog=1 (it holds a counter the
    kernel's open-time group check does not see)."""

    general: int
    fixed: tuple[FixedCounter, ...] = ()
    constraints: tuple[CounterConstraint, ...] = ()
    watchdog_config: int | None = None
    source: str = ""

    @classmethod
    def from_facts(cls, facts: PmuFacts, *, smt: bool = True, general: int | None = None,
                   watchdog: bool = False, source: str = "") -> PmuLayout:
        count = general if general is not None else (
            facts.general_smt_on if smt else facts.general_smt_off)
        return cls(count, facts.fixed, facts.constraints,
                   facts.watchdog_config if watchdog else None, source or facts.source)


def counter_choices(config: int | None, layout: PmuLayout) -> frozenset[Slot]:
    """The counters the kernel may put an event with this raw config on: its fixed counter
    (and every general counter unless the fixed encoding is a pseudo-event), else the
    general counters of the first matching constraint, else all general counters. ``None``
    (an encoding unknown for this CPU) may use any general counter."""
    everything = frozenset(("general", i) for i in range(layout.general))
    if config is None:
        return everything
    for fixed in layout.fixed:
        if config == fixed.config:
            slot = frozenset({("fixed", fixed.index)})
            return slot if fixed.fixed_only else slot | everything
    for constraint in layout.constraints:
        if constraint.matches(config):
            return frozenset(("general", i) for i in constraint.counters if i < layout.general)
    return everything


def assign_counters(choices: Sequence[frozenset[Slot]]) -> list[Slot] | None:
    """A counter for each event, all different, each among its choices (a maximum bipartite
    matching by augmenting paths, Kuhn's algorithm); None when no such assignment exists."""
    owner: dict[Slot, int] = {}

    def place(i: int, seen: set[Slot]) -> bool:
        for slot in sorted(choices[i]):
            if slot in seen:
                continue
            seen.add(slot)
            if slot not in owner or place(owner[slot], seen):
                owner[slot] = i
                return True
        return False

    for i in range(len(choices)):
        if not place(i, set()):
            return None
    by_event = {i: slot for slot, i in owner.items()}
    return [by_event[i] for i in range(len(choices))]


def schedule_groups(events: Sequence[tuple[str, EventSpec]], layout: PmuLayout
                    ) -> list[tuple[str, ...]]:
    """Partition events into kernel groups that each fit the PMU at once.

    Hardware events are placed first-fit in the order given: an event joins the first group
    in which every member (plus the NMI watchdog's event, when it holds a counter) still gets
    a counter of its own (:func:`assign_counters`), else it starts a group. Software events
    use no PMU counter and form one group of their own, last. Groups the kernel multiplexes
    are each read atomically, so every value keeps its own group's running/enabled ratio.
    """
    watchdog = ([counter_choices(layout.watchdog_config, layout)]
                if layout.watchdog_config is not None else [])
    hardware: list[tuple[list[str], list[frozenset[Slot]]]] = []
    software: list[str] = []
    for name, spec in events:
        if not spec.is_hardware:
            software.append(name)
            continue
        choice = counter_choices(spec.raw_config, layout)
        for names, choices in hardware:
            if assign_counters([*choices, choice, *watchdog]) is not None:
                names.append(name)
                choices.append(choice)
                break
        else:
            hardware.append(([name], [choice]))
    groups = [tuple(names) for names, _ in hardware]
    if software:
        groups.append(tuple(software))
    return groups
