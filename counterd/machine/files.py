"""Machine files: a machine described in TOML (:func:`load_file`), over this host for what the
file does not give.

Machine files
-------------

TOML, UTF-8. Every table and key but ``format`` and ``version`` is optional: what the file
does not give is read from this host (sysfs, procfs) as without a file. ``[[caches]]``, when
given, replaces every cache sysfs lists. Unknown keys, wrong types and impossible geometry are
errors that name the file, the field and the fix (exit 2 in every CLI)::

    format = "counterd-machine"
    version = 2                       # 1 is read too (without [memory])
    page_bytes = 4096                 # a power of two

    [host]                            # the fingerprint profiles are checked against
    hostname = "node17"
    cpu_model = "Intel(R) Xeon(R) Platinum 8480+"
    cpus_online = 8

    [[caches]]                        # one table per cache; caches[k] counts them from 1
    level = 1
    type = "data"                     # data, unified or instruction (level 1 only)
    size = "48K"                      # bytes: an integer, or a string with K, M or G
    ways = 12                         # at least 1 (fully associative: size / line_bytes)
    line_bytes = 64                   # a power of two, not below the previous level's line
    shared_cpus = [0]                 # the CPUs sharing it (sysfs shared_cpu_list)

    [tlb]                             # the DTLB (sysfs does not describe it)
    entries = 64
    ways = 4                          # entries a multiple of ways

    [memory]                          # version 2; what a bank is (MemoryLayout)
    numa_nodes = ["0-3", "4-7"]       # CPUs of node 0, 1, ... (sysfs cpulist, or [0, 1, ...]);
                                      # every CPU online on one node. Default: sysfs
                                      # devices/system/node, else one node, assumed
    channels_per_node = 8             # memory channels of each node (default 8, assumed)
    interleave_bytes = 256            # bytes on one channel before the next, a power of two
                                      # (default 256, assumed)
    provenance = "dmidecode -t memory"  # optional: how the values were found

    [bank_map]                        # banks as they are, instead of channels x nodes
    banks = 8                         # (not with memory.channels_per_node/interleave_bytes)
    interleave_bytes = 256
    provenance = "measured with ..."  # default: "declared in <file>"; "assumed..." marks it so

The bank map is ``banks = channels_per_node x NUMA nodes`` interleaved on
``interleave_bytes`` (:class:`~counterd.machine.memory.MemoryLayout` says why), unless
``[bank_map]`` gives it; with nothing declared it is 8 x 256 B on a one-node host, labelled
assumed. A file that changes ``host.cpus_online`` without ``numa_nodes`` has one assumed node
of CPUs 0 .. cpus_online - 1.

Data and unified levels are numbered 1, 2, ... without gaps (at most 8). Every level needs a
whole number of sets (``size = sets x ways x line_bytes``), which both simulators index by
address modulo sets: a set count that is not a power of two (e.g. a 20-way L3) is accepted;
valgrind needs powers of two and a line of at least 16 B, and the callgrind backend adjusts
the set count as it documents (:func:`counterd.backends.callgrind.geometry.adjust_cache`). Callgrind
also needs the L1 instruction cache.

Format history: 1 - first version (format, version, page_bytes, host, caches, tlb, bank_map);
2 - ``[memory]`` (numa_nodes, channels_per_node, interleave_bytes, provenance). Version 1
files are read as before.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from counterd.data.errors import BadInput
from counterd.machine.description import Machine
from counterd.machine.geometry import (
    MAX_CPU_ID,
    MAX_LEVELS,
    CacheLevel,
    is_pow2,
    parse_cpulist,
    parse_size,
)
from counterd.machine.memory import BankMap, MemoryLayout, NumaNode, Sourced, assumed_layout
from counterd.machine.sysfs import host

#: The environment variable naming a machine file (as ``--machine FILE`` does).
ENV_MACHINE = "COUNTERD_MACHINE"
FILE_FORMAT = "counterd-machine"
FILE_VERSION = 2
SUPPORTED_FILE_VERSIONS = (1, 2)


# --------------------------------------------------------------------------------------------
# Machine files


class _FileError(Exception):
    def __init__(self, what: str, fix: str) -> None:
        super().__init__(what)
        self.what, self.fix = what, fix


_TOP_KEYS = ("format", "version", "page_bytes", "host", "caches", "tlb", "memory", "bank_map")
_TABLE_KEYS = {
    "host": ("hostname", "cpu_model", "cpus_online"),
    "caches": ("level", "type", "size", "ways", "line_bytes", "shared_cpus"),
    "tlb": ("entries", "ways"),
    "memory": ("numa_nodes", "channels_per_node", "interleave_bytes", "provenance"),
    "bank_map": ("banks", "interleave_bytes", "provenance"),
}
_TYPES = ("data", "unified", "instruction")


def _type_name(v: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a float", str: "a string",
            list: "an array", dict: "a table"}.get(type(v), type(v).__name__)


def _check_keys(table: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    for key in table:
        if key not in allowed:
            field = f"{where}.{key}" if where else key
            raise _FileError(f"unknown key {field}",
                             f"the keys{' of ' + where if where else ''} are "
                             + ", ".join(allowed) + " (format in counterd/machine/files.py)")


def _int(table: Mapping[str, Any], key: str, where: str, *, minimum: int = 1,
         pow2: bool = False, hint: str = "") -> int | None:
    if key not in table:
        return None
    v = table[key]
    field = f"{where}.{key}" if where else key
    if not isinstance(v, int) or isinstance(v, bool):
        suggestion = "<integer>"
        if isinstance(v, str):
            with contextlib.suppress(BadInput):
                suggestion = f"{parse_size(v)}, without quotes"
        raise _FileError(f"{field} = {v!r} is {_type_name(v)}, not an integer",
                         f"write {key} = {suggestion}{hint}")
    if pow2 and not is_pow2(v):
        raise _FileError(f"{field} = {v} is not a power of two",
                         f"give {key} as a power of two{hint}")
    if v < minimum:
        raise _FileError(f"{field} = {v}", f"give {key} >= {minimum}{hint}")
    return v


def _str(table: Mapping[str, Any], key: str, where: str) -> str | None:
    if key not in table:
        return None
    v = table[key]
    if not isinstance(v, str):
        raise _FileError(f"{where}.{key} = {v!r} is {_type_name(v)}, not a string",
                         f'write {key} = "..."')
    return v


def _table(doc: Mapping[str, Any], key: str) -> Mapping[str, Any] | None:
    if key not in doc:
        return None
    v = doc[key]
    if not isinstance(v, dict):
        raise _FileError(f"{key} is {_type_name(v)}, not a table", f"write it as [{key}]")
    _check_keys(v, _TABLE_KEYS[key], key)
    return v


def _cache(c: Any, k: int) -> tuple[str, CacheLevel]:
    where = f"caches[{k}]"
    if not isinstance(c, dict):
        raise _FileError(f"{where} is {_type_name(c)}, not a table",
                         "write each cache as a [[caches]] table")
    _check_keys(c, _TABLE_KEYS["caches"], where)
    for key in ("level", "size", "ways", "line_bytes"):
        if key not in c:
            raise _FileError(f"{where} has no {key}",
                             "give level, size, ways and line_bytes for every cache")
    level = _int(c, "level", where, hint=" (1 for L1)")
    kind = _str(c, "type", where) or ("data" if level == 1 else "unified")
    if kind.lower() not in _TYPES:
        raise _FileError(f"{where}.type = {kind!r}", "give type = data, unified or instruction")
    kind = kind.lower()
    size_v = c["size"]
    if isinstance(size_v, str):
        try:
            size: int | None = parse_size(size_v)
        except BadInput:
            raise _FileError(f"{where}.size = {size_v!r} is not a size",
                             'write a byte count like 49152, "48K" or "2M"') from None
    else:
        size = _int(c, "size", where, hint=' (bytes, or a string like "48K")')
    ways = _int(c, "ways", where, hint=" (the associativity; fully associative: size / line)")
    line = _int(c, "line_bytes", where, pow2=True, minimum=2,
                hint=" (bytes, e.g. 64; sysfs: coherency_line_size)")
    assert level is not None and size is not None and ways is not None and line is not None
    if size <= 0:
        raise _FileError(f"{where}.size = {size_v!r}", "give the size in bytes, > 0")
    if size % (ways * line):
        raise _FileError(f"{where}.size = {size} B is not ways x line_bytes x a whole number of "
                         f"sets ({ways} x {line} B x {size / (ways * line):g})",
                         "check size, ways and line_bytes (the simulators index a whole number "
                         "of sets)")
    if kind == "instruction" and level != 1:
        raise _FileError(f"{where}: an instruction cache at level {level}",
                         'only L1 has a separate instruction cache: write type = "unified"')
    shared: tuple[int, ...] = ()
    if "shared_cpus" in c:
        v = c["shared_cpus"]
        if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool)
                                              and x >= 0 for x in v):
            raise _FileError(f"{where}.shared_cpus = {v!r} is not a list of CPU numbers",
                             "write shared_cpus = [0, 1]")
        shared = tuple(v)
    try:
        return kind, CacheLevel(level, size, ways, line, shared)
    except BadInput as exc:
        raise _FileError(f"{where}: {exc.what}", exc.fix or "check the cache") from None


def _caches(v: Any) -> tuple[tuple[CacheLevel, ...], CacheLevel | None]:
    if not isinstance(v, list) or not v:
        raise _FileError(f"caches is {_type_name(v)}, not an array of tables",
                         "write each cache as a [[caches]] table, or leave caches out")
    data: dict[int, tuple[int, CacheLevel]] = {}
    l1i = None
    for k, c in enumerate(v, start=1):
        kind, lv = _cache(c, k)
        if kind == "instruction":
            if l1i is not None:
                raise _FileError(f"caches[{k}]: a second L1 instruction cache",
                                 "give one instruction cache")
            l1i = lv
        elif lv.level in data:
            raise _FileError(f"caches[{k}]: a second data or unified cache at level "
                             f"{lv.level} (caches[{data[lv.level][0]}] is one)",
                             "give one data or unified cache per level")
        else:
            data[lv.level] = (k, lv)
    numbers = sorted(data)
    if numbers != list(range(1, len(numbers) + 1)) or len(numbers) > MAX_LEVELS:
        raise _FileError(f"caches: data and unified levels {numbers}",
                         f"number them 1, 2, ... without gaps (at most {MAX_LEVELS})")
    for n in numbers[1:]:
        k, lv = data[n]
        prev = data[n - 1][1]
        if lv.line_bytes < prev.line_bytes:
            raise _FileError(f"caches[{k}].line_bytes = {lv.line_bytes} is smaller than L{n - 1}'s"
                             f" line ({prev.line_bytes} B)",
                             f"a line of L{n - 1} must fit in one line of L{n}: give L{n} a line "
                             f"of at least {prev.line_bytes} B")
    return tuple(data[n][1] for n in numbers), l1i


def _numa_nodes(v: Any) -> tuple[NumaNode, ...]:
    fix = 'write numa_nodes = ["0-31", "32-63"]: the CPUs of node 0, 1, ... as sysfs lists them'
    if not isinstance(v, list) or not v:
        raise _FileError(f"memory.numa_nodes = {v!r:.60} is not an array of CPU lists", fix)
    nodes: list[NumaNode] = []
    where: dict[int, int] = {}
    for k, item in enumerate(v):
        cpus: tuple[int, ...] | None = None
        if isinstance(item, str):
            with contextlib.suppress(ValueError):
                cpus = parse_cpulist(item)
        elif isinstance(item, list) and all(isinstance(x, int) and not isinstance(x, bool)
                                            for x in item):
            cpus = tuple(item)
        if cpus is None or any(not 0 <= c <= MAX_CPU_ID for c in cpus):
            raise _FileError(f"memory.numa_nodes: node {k} = {item!r:.60} is not a CPU list", fix)
        if not cpus:
            raise _FileError(f"memory.numa_nodes: node {k} has no CPUs",
                             "list only the NUMA nodes with CPUs, each with its CPUs")
        for c in cpus:
            if c in where:
                raise _FileError(f"memory.numa_nodes: CPU {c} is on node {where[c]} and node {k}",
                                 "put every CPU on one node")
            where[c] = k
        nodes.append(NumaNode(k, tuple(sorted(cpus))))
    return tuple(nodes)


def _memory(doc: Mapping[str, Any], version: int, base: Machine, cpus_online: int | None,
            name: str) -> MemoryLayout:
    """The file's memory layout over ``base``'s: NUMA nodes, channels and interleave it
    declares (``[memory]``, version 2), or banks it declares as they are (``[bank_map]``).
    Without ``numa_nodes``, a file that changes the CPUs online gets one assumed node of them
    (the host's nodes describe other CPUs)."""
    layout = base.memory
    if cpus_online is not None and cpus_online != base.cpus_online:
        layout = dataclasses.replace(assumed_layout(
            range(cpus_online), f"{name} gives {cpus_online} CPUs online and no "
            "memory.numa_nodes"), declared_banks=layout.declared_banks)
    mem = _table(doc, "memory")
    if mem is not None:
        if version < 2:
            raise _FileError(f"[memory] in a version {version} file",
                             "write version = 2 (a version 1 file cannot declare memory)")
        note = f"declared in {name}"
        layout = dataclasses.replace(layout, remark=_str(mem, "provenance", "memory") or "")
        if "numa_nodes" in mem:
            nodes = _numa_nodes(mem["numa_nodes"])
            count = sum(len(n.cpus) for n in nodes)
            online = base.cpus_online if cpus_online is None else cpus_online
            if count != online:
                raise _FileError(f"memory.numa_nodes list {count} CPUs, and {online} are online "
                                 f"({'host.cpus_online' if cpus_online else 'this host'})",
                                 f"list every CPU online on one node, or give "
                                 f"[host] cpus_online = {count}")
            layout = dataclasses.replace(layout, nodes=Sourced(nodes, "declared", note))
        channels = _int(mem, "channels_per_node", "memory",
                        hint=" (memory channels of each NUMA node, e.g. 8)")
        if channels is not None:
            layout = dataclasses.replace(layout, channels_per_node=Sourced(channels, "declared",
                                                                           note))
        interleave = _int(mem, "interleave_bytes", "memory", pow2=True, minimum=8,
                          hint=" (bytes on one channel before the next, e.g. 256)")
        if interleave is not None:
            layout = dataclasses.replace(layout, interleave_bytes=Sourced(interleave,
                                                                          "declared", note))
    banks = _table(doc, "bank_map")
    if banks is not None:
        if mem is not None and ("channels_per_node" in mem or "interleave_bytes" in mem):
            raise _FileError("both [bank_map] and memory.channels_per_node or "
                             "memory.interleave_bytes give the banks",
                             "keep [memory] (banks = channels_per_node x NUMA nodes, "
                             "interleaved on interleave_bytes) or [bank_map], not both")
        n = _int(banks, "banks", "bank_map")
        il = _int(banks, "interleave_bytes", "bank_map", hint=" (bytes, e.g. 256)")
        if n is None or il is None:
            raise _FileError("bank_map needs banks and interleave_bytes",
                             "give both, e.g. banks = 8, interleave_bytes = 256")
        text = _str(banks, "provenance", "bank_map") or f"declared in {name}"
        layout = dataclasses.replace(layout, declared_banks=Sourced(
            BankMap(n, il), "assumed" if text.startswith("assumed") else "declared", text))
    return layout


def _decode(path: Path, raw: bytes) -> dict[str, Any]:
    from counterd.util import stricttoml
    from counterd.util.strictjson import Malformed

    try:
        return stricttoml.loads(raw)
    except Malformed as exc:
        raise _FileError(str(exc), "save it as UTF-8 text" if str(exc).startswith("not UTF-8")
                         else "fix the syntax (format in counterd/machine/files.py and the README, "
                         "section Machine files)") from None


def _apply(doc: Mapping[str, Any], base: Machine, name: str) -> Machine:
    _check_keys(doc, _TOP_KEYS, "")
    fmt = doc.get("format")
    if fmt != FILE_FORMAT:
        raise _FileError(f"format = {fmt!r}" if "format" in doc else "format is missing",
                         f'a machine file starts with format = "{FILE_FORMAT}" and '
                         f"version = {FILE_VERSION}")
    if "version" not in doc:
        raise _FileError("version is missing", f"add version = {FILE_VERSION}")
    version = doc["version"]
    if not isinstance(version, int) or isinstance(version, bool) \
            or version not in SUPPORTED_FILE_VERSIONS:
        raise _FileError(f"version = {version!r} is not supported",
                         "this counterd reads version "
                         + ", ".join(map(str, SUPPORTED_FILE_VERSIONS)))
    changes: dict[str, Any] = {}
    page = _int(doc, "page_bytes", "", pow2=True, hint=" (bytes, e.g. 4096)")
    if page is not None:
        changes["page_bytes"] = page
    host = _table(doc, "host")
    if host is not None:
        for key in ("hostname", "cpu_model"):
            s = _str(host, key, "host")
            if s is not None:
                changes[key] = s
        cpus = _int(host, "cpus_online", "host")
        if cpus is not None:
            changes["cpus_online"] = cpus
    if "caches" in doc:
        levels, l1i = _caches(doc["caches"])
        changes.update(levels=levels, l1i=l1i, caches_known=True,
                       caches_source=f"machine file {name}")
    tlb = _table(doc, "tlb")
    if tlb is not None:
        entries = _int(tlb, "entries", "tlb")
        ways = _int(tlb, "ways", "tlb")
        if entries is None or ways is None:
            raise _FileError("tlb needs entries and ways", "give both, e.g. entries = 64, "
                             "ways = 4")
        if entries % ways:
            raise _FileError(f"tlb.entries = {entries} is not a multiple of tlb.ways = {ways}",
                             "give entries = sets x ways")
        changes.update(tlb_entries=entries, tlb_ways=ways)
    changes["memory"] = _memory(doc, version, base, changes.get("cpus_online"), name)
    try:
        return dataclasses.replace(base, **changes, file=name,
                                   source=f"machine file {name}; the rest: {base.source}")
    except BadInput as exc:  # a combination the field checks above do not see
        raise _FileError(exc.what, exc.fix or "check the file against its format") from None


def load_file(path: str | Path, base: Machine | None = None) -> Machine:
    """The machine a file describes, over ``base`` (default: this host,
    :func:`~counterd.machine.sysfs.host`) for what it does not give. Raises BadInput naming the
    file, the field and the fix."""
    path = Path(path)
    name = str(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise BadInput(f"cannot read machine file {name}: {exc.strerror or exc}",
                       f"give an existing file with --machine or {ENV_MACHINE}") from None
    try:
        return _apply(_decode(path, raw), base if base is not None else host(), name)
    except _FileError as exc:
        raise BadInput(f"machine file {name}: {exc.what}", exc.fix) from None
