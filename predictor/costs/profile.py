"""Versioned machine profiles (TOML): host fingerprint, cache geometry, bank map, fitted cost
models with the patterns they came from, and fit diagnostics (DESIGN.md section 3).

Read with :mod:`tomllib`; written by the small serializer below (no extra dependency) and
atomically (temp file + rename), never over an existing file unless asked (the pyperf lesson
of STYLE.md). Every parameter is in nanoseconds per event (``unit = "ns"`` in the file).

Format history:
  1 - first version: format, version, name, unit, created, default_model; tables host,
      geometry (+ levels), bank_map, machine (processors, word_bytes, llc_level), models.<v>
      (const, F1, F2, F3, patterns, diagnostics) for v in paper/improved, bsp (QSM, EBSP,
      DXBSP: min, max, min_patterns, max_patterns), notes.
  2 - model variants by counter set (see predictor/costs/variants.py).
  3 - table contention: the bank contention F2 and F3 (and DXBSP's g1, g2) were fitted at,
      and why (:class:`predictor.costs.costmodel.Contention`); optional (absent in versions 1 and
      2).
"""

from __future__ import annotations

import datetime
import json
import math
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from counterd.data.events import MISS_COUNTERS, WRITEBACK_COUNTERS
from predictor.costs.costmodel import BSPModel, Contention, FModel
from predictor.errors import NoVariant, ProfileError, ProfileVersionError, warn_host_mismatch
from predictor.inputs import machine_sections

if TYPE_CHECKING:
    from counterd.machine.views import BankTable, GeometryTable

PROFILE_FORMAT = "counterd-machine-profile"
# Version history:
#   1 - models "paper" and "improved", BSP min/max, fingerprint, bank map with provenance.
#   2 - model variants by counter set ("improved.misses", "paper.l1_llc", ...; see
#       predictor/costs/variants.py), each with "counter_set", "needs" and "accuracy".
#   3 - "contention": the low and high bank contention the fits took, and why.
PROFILE_VERSION = 3
SUPPORTED_VERSIONS = (1, 2, 3)
FINGERPRINT_FIELDS = ("cpu_model", "cpus_online", "page_bytes", "caches")
# A memory model extended by the compute terms (predictor.costs.calibrate.ComputeFit) is
# "<model>.compute".
COMPUTE_SUFFIX = ".compute"
# Counters of the memory hierarchy: a superstep with none of them cannot be predicted.
MEMORY_COUNTERS = frozenset({"loads", "stores", "dtlb_misses", *MISS_COUNTERS,
                             *WRITEBACK_COUNTERS})


@dataclass(frozen=True)
class MachineProfile:
    """A calibrated machine: its fingerprint, geometry, bank map, fitted models and how.

    ``processors`` is the P the profile was calibrated on, and ``contention`` the bank
    contention its F2 and F3 were fitted at (with P above the banks, the least and most the
    node allows; :class:`predictor.costs.costmodel.Contention`; None in profiles before version 3).

    **A superstep on p < P processors** is predicted with the same coefficients: F1 is the
    largest per-processor cost over the p that ran (idle ones cost nothing), F2 divides the
    p processors' summed memory traffic by the profile's P, not by p (the bus is the
    machine's: each idle processor adds 0 to the average; Amato et al. section 4.2 with p =
    the machine's processors, predictor/NOTES.md #5), and F3 is the busiest bank's traffic,
    whoever caused it. The BSP-like bounds likewise (EBSP's M/p with p = P). No coefficient
    is rescaled by p / P: the contention a p-processor superstep meets is in its counters
    (fewer processors, fewer misses on the bus and at each bank), which is what F charges.
    """

    name: str
    host: Mapping[str, Any]  # hostname, cpu_model, cpus_online, page_bytes, caches
    # The machine's sections, typed (counterd.machine.views; predictor.inputs.machine_sections)
    geometry: GeometryTable  # spec, levels [{level, size_bytes, ways, line_bytes}], source
    bank_map: BankTable  # banks, interleave_bytes, provenance
    processors: int
    word_bytes: int
    llc_level: int
    models: Mapping[str, Mapping[str, Any]]  # "paper"/"improved" -> model table
    bsp: Mapping[str, Any]
    default_model: str = "improved"
    created: str = ""
    notes: tuple[str, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)
    contention: Contention | None = None

    @property
    def banks(self) -> int:
        return self.bank_map.banks

    def f_model(self, variant: str | None = None) -> FModel:
        v = variant or self.default_model
        if v not in self.models:
            raise ProfileError(f"profile {self.name} has no model {v!r}",
                               "choose from " + ", ".join(self.models))
        return FModel.from_dict(self.models[v], llc_level=self.llc_level,
                                processors=self.processors, banks=self.banks, name=v)

    def variants(self, family: str | None = None) -> list[str]:
        """The models of a family (``improved``: ``improved``, ``improved.misses``, ...), the
        most complete first: the most counters needed, and a memory model's compute
        extension just before the model itself. (Its own needs can be fewer: a term of the
        memory model that the compute fit also tried, such as the accesses at a cost of zero,
        goes if the fit drops it; the extension is still the memory model and more.)"""
        fam = family or self.default_model
        names = [k for k in self.models if k == fam or k.startswith(fam + ".")]

        def rank(k: str) -> tuple[int, bool, bool, str]:
            base = k.removesuffix(COMPUTE_SUFFIX)
            if base not in self.models:
                base = k
            return (-len(self.f_model(base).needs()), base == k, base != fam, k)

        return sorted(names, key=rank)

    def select_model(self, counters: Collection[str], *, where: str = "the superstep",
                     bank_counts: bool = False, family: str | None = None) -> str:
        """The most complete variant whose counters are all in ``counters``; NoVariant (with
        the one action that supplies them) when none is."""
        names = self.variants(family)
        if not names:
            raise ProfileError(f"profile {self.name} has no model {family!r}",
                               "choose from " + ", ".join(self.models))
        closest = names[0]
        missing: tuple[str, ...] = ()
        for name in names:
            need = self.f_model(name).needs(bank_counts=bank_counts)
            lacking = tuple(c for c in need if c not in counters)
            if not lacking:
                return name
            if not missing or len(lacking) < len(missing):
                closest, missing = name, lacking
        have = tuple(sorted(counters))
        memory = any(c in MEMORY_COUNTERS for c in counters)
        builtin = self.name in BUILTIN and self.created == BUILTIN[self.name]().created
        raise NoVariant(where, have, closest, missing, memory, self.name, builtin)

    def accuracy(self, name: str) -> Mapping[str, Any]:
        """A model's accuracy as calibration measured it (empty for older profiles)."""
        return self.models.get(name, {}).get("accuracy", {})

    def bsp_model(self) -> BSPModel:
        try:
            return BSPModel.from_dict(self.bsp, processors=self.processors, banks=self.banks)
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise ProfileError(f"profile {self.name}: bsp table is incomplete ({exc})",
                               "re-run predict calibrate") from exc

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": PROFILE_FORMAT, "version": PROFILE_VERSION, "name": self.name,
            "unit": "ns", "created": self.created, "default_model": self.default_model,
            "notes": list(self.notes), "host": dict(self.host),
            "geometry": self.geometry.to_dict(), "bank_map": self.bank_map.to_dict(),
            "machine": {"processors": self.processors, "word_bytes": self.word_bytes,
                        "llc_level": self.llc_level},
            "models": {k: dict(v) for k, v in self.models.items()}, "bsp": dict(self.bsp),
            "contention": self.contention.to_dict() if self.contention else None,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], source: str = "<profile>") -> MachineProfile:
        if d.get("format") != PROFILE_FORMAT:
            raise ProfileError(f"{source}: not a machine profile (format "
                               f"{d.get('format')!r:.40})",
                               "give a file written by `predict calibrate` or a built-in name: "
                               + ", ".join(BUILTIN))
        if d.get("version") not in SUPPORTED_VERSIONS:
            raise ProfileVersionError(source, d.get("version"), SUPPORTED_VERSIONS)
        if d.get("unit") != "ns":
            raise ProfileError(f"{source}: unit {d.get('unit')!r} is not 'ns'",
                               "profiles keep every parameter in ns per event")
        try:
            m = _table(d, "machine")
            geometry, bank_map = machine_sections(_table(d, "geometry", {}),
                                                  _table(d, "bank_map", {}))
            prof = cls(name=_text(d, "name"), host=_table(d, "host", {}),
                       geometry=geometry, bank_map=bank_map,
                       processors=_count(m, "processors"), word_bytes=_count(m, "word_bytes"),
                       llc_level=_count(m, "llc_level"), models=_models(d),
                       bsp=_table(d, "bsp"),
                       default_model=_text(d, "default_model", "improved"),
                       created=_text(d, "created", ""), notes=tuple(_texts(d, "notes")),
                       contention=(Contention.from_dict(_table(d, "contention"))
                                   if "contention" in d else None))
            _count(prof.bank_map, "banks", 1)
            for name in prof.models:  # every model the profile names can be built
                prof.f_model(name)
            for fn, bounds in prof.bsp_model().params.items():
                for b, g in bounds.items():
                    for i, v in enumerate(g):
                        _coefficient(v, f"bsp.{fn}.{b}[{i}]")
        except (KeyError, TypeError, ValueError) as exc:
            raise ProfileError(f"{source}: not a valid machine profile ({exc})",
                               "re-run predict calibrate") from None
        except ProfileError as exc:
            raise ProfileError(f"{source}: {exc.what}", exc.fix) from None
        return prof


# -- field checks of from_dict: what the models and the CLI read, typed as calibrate writes it
def _table(d: Mapping[str, Any], key: str, default: Any = None) -> dict[str, Any]:
    v = d[key] if default is None else d.get(key, default)
    if not isinstance(v, Mapping):
        raise TypeError(f"{key} is {type(v).__name__}, not a table")
    return dict(v)


def _text(d: Mapping[str, Any], key: str, default: str | None = None) -> str:
    v = d[key] if default is None else d.get(key, default)
    if not isinstance(v, str):
        raise TypeError(f"{key} is {type(v).__name__}, not a string")
    return v


def _texts(d: Mapping[str, Any], key: str) -> list[str]:
    v = d.get(key, [])
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise TypeError(f"{key} is not a list of strings")
    return v


def _count(d: Mapping[str, Any], key: str, default: int | None = None) -> int:
    v = d[key] if default is None else d.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= 1 << 20:
        raise ValueError(f"{key} = {v!r:.40} is not a count in [1, 2^20]")
    return v


def _coefficient(v: Any, where: str) -> float:
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v < math.inf:
        raise ValueError(f"{where} = {v!r:.40} is not a finite number >= 0")
    return float(v)


def _models(d: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The model tables, every coefficient (F1, F2, F3, const: ns per event, fitted >= 0 by
    NNLS) finite and >= 0, and the accuracy the CLI prints numeric."""
    models = _table(d, "models")
    if not models:
        raise ValueError("models is empty")
    for name, model in models.items():
        if not isinstance(model, Mapping):
            raise TypeError(f"models.{name} is not a table")
        _coefficient(model.get("const", 0.0), f"models.{name}.const")
        for term in ("F1", "F2", "F3"):
            for k, v in _table(model, term, {}).items():
                _coefficient(v, f"models.{name}.{term}.{k}")
        acc = _table(model, "accuracy", {})
        for k in ("avg_error", "max_error"):
            if k in acc and (not isinstance(acc[k], (int, float)) or isinstance(acc[k], bool)):
                raise TypeError(f"models.{name}.accuracy.{k} is not a number")
    return models


# -- fingerprints ---------------------------------------------------------------------------

def caches_spec(levels: Any) -> str:
    """``L1=48K/12/64,L2=...``: size/ways/line per level, the fingerprint's cache field
    (:func:`counterd.machine.views.caches_spec`)."""
    from counterd.machine.views import caches_spec as spec

    return spec(levels)


def current_host(procfs: str = "/proc", sysfs: str = "/sys") -> dict[str, Any]:
    """This host's fingerprint: counterd's machine description (:mod:`counterd.machine`, read
    from procfs and sysfs once per process, or the machine file ``COUNTERD_MACHINE`` names).
    Other roots than the defaults are read afresh (tests). A bad machine file is BadInput."""
    from counterd import machine
    from counterd.data.errors import CounterdError
    from counterd.machine.sysfs import read
    from predictor.errors import BadInput

    try:
        m = (machine.current() if (procfs, sysfs) == ("/proc", "/sys")
             else read(sysfs, procfs))
    except CounterdError as exc:
        raise BadInput(exc.what, exc.fix) from exc
    return m.fingerprint()


def fingerprint_differences(fitted: Mapping[str, Any], here: Mapping[str, Any]) -> list[str]:
    """Every fingerprint field that differs: ``"cpu_model: 'A' (profile) vs 'B' (here)"``."""
    return [f"{k}: {fitted.get(k)!r} (profile) vs {here.get(k)!r} (here)"
            for k in FINGERPRINT_FIELDS
            if fitted.get(k) is not None and here.get(k) is not None
            and str(fitted.get(k)) != str(here.get(k))]


def check_host(profile: MachineProfile, here: Mapping[str, Any] | None = None) -> list[str]:
    """Warn (HostMismatchWarning) if the profile was fitted on a host with another fingerprint;
    return the differing fields."""
    diffs = fingerprint_differences(profile.host, here if here is not None else current_host())
    warn_host_mismatch(diffs, profile.name)
    return diffs


# -- TOML -----------------------------------------------------------------------------------

_BARE = re.compile(r"[A-Za-z0-9_-]+")


def _key(k: str) -> str:
    return k if _BARE.fullmatch(k) else json.dumps(k)


def _scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_scalar(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{" + ", ".join(f"{_key(k)} = {_scalar(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def _is_table_list(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, Mapping) for x in v)


def _emit(d: Mapping[str, Any], prefix: str, out: list[str]) -> None:
    d = {k: v for k, v in d.items() if v is not None}  # TOML has no null: absent means None
    for k, v in d.items():
        if not isinstance(v, Mapping) and not _is_table_list(v):
            out.append(f"{_key(k)} = {_scalar(v)}")
    for k, v in d.items():
        path = f"{prefix}.{_key(k)}" if prefix else _key(k)
        if isinstance(v, Mapping):
            out.append(f"\n[{path}]")
            _emit(v, path, out)
        elif _is_table_list(v):
            for item in v:
                out.append(f"\n[[{path}]]")
                _emit(item, path, out)


def dumps(d: Mapping[str, Any], header: str = "") -> str:
    """A nested dict as TOML (tables, arrays of tables, scalars, lists, inline tables)."""
    out = [f"# {line}" if line else "#" for line in header.splitlines()]
    _emit(d, "", out)
    return "\n".join(out) + "\n"


_HEADER = """counterd machine profile (predict calibrate). Every parameter: ns per event.
Format history: see predictor/costs/profile.py (3: the contention table)."""


def profile_to_toml(p: MachineProfile) -> str:
    return dumps(p.to_dict(), _HEADER)


def save_profile(p: MachineProfile, path: str | Path, *, overwrite: bool = False) -> Path:
    """Write ``p`` atomically (:func:`counterd.util.fsutil.atomic_write_text`: on a full disk the
    temp file is removed and an existing profile is left as it was)."""
    from counterd.data.errors import BadInput as FileError
    from counterd.util.fsutil import atomic_write_text

    path = Path(path)
    if path.exists() and not overwrite:
        raise ProfileError(f"{path} exists", "choose another --out or pass --force")
    try:
        text = profile_to_toml(p)
    except TypeError as exc:  # a value TOML cannot hold, from the results it was fitted on
        raise ProfileError(f"cannot write profile {path} ({exc})",
                           "check the microbench results for damaged host or geometry "
                           "fields") from None
    load_profile_text(text, str(path))  # never write a file we cannot read back
    try:
        atomic_write_text(path, text)
    except FileError as exc:
        raise ProfileError(f"cannot write profile {exc.what.removeprefix('cannot write ')}",
                           "free space on the disk or choose a writable --out") from None
    return path


MAX_PROFILE_BYTES = 16 << 20  # a calibrated profile is a few kB


def load_profile(spec: str | Path) -> MachineProfile:
    """A built-in profile by name, or a TOML file. ProfileError (one line, naming the file)
    for a file that cannot be read or is not a valid profile."""
    if str(spec) in BUILTIN:
        return BUILTIN[str(spec)]()
    try:
        with Path(spec).open("rb") as fh:
            raw = fh.read(MAX_PROFILE_BYTES + 1)
    except OSError as exc:
        raise ProfileError(f"cannot read profile {spec}: {exc.strerror or exc}",
                           "give a profile file or a built-in name: "
                           + ", ".join(BUILTIN)) from None
    if len(raw) > MAX_PROFILE_BYTES:
        raise ProfileError(f"{spec} is larger than {MAX_PROFILE_BYTES} bytes",
                           "give a profile written by predict calibrate")
    return load_profile_text(raw, str(spec))


def load_profile_text(data: str | bytes, source: str) -> MachineProfile:
    """The profile of a TOML text (strict: :mod:`counterd.util.stricttoml`), checked field by
    field (:meth:`MachineProfile.from_dict`)."""
    from counterd.util import stricttoml
    from counterd.util.strictjson import Malformed

    try:
        doc = stricttoml.loads(data, finite=False)  # diagnostics may be inf; from_dict
        # checks the parameters
    except Malformed as exc:
        raise ProfileError(f"{source} is not a profile file ({exc})",
                           "give a profile written by predict calibrate") from None
    return MachineProfile.from_dict(doc, source)


# -- the paper's machine ----------------------------------------------------------------------

US = 1000.0  # the paper's parameters are in microseconds (section 4.1 footnote 1); ours in ns
# C0E7 and WB(b) count 16-byte quadwords; our writebacks count 128-byte L2 lines: a line
# written back is 128/16 = 8 quadwords, so a cost per quadword is 8x per line.
QW_PER_L2_LINE = 128 // 16


def sgi_power_challenge() -> MachineProfile:
    """The machine of seed 004 section 2 with the published parameters of sections 4.1/4.2."""
    f_paper = {
        "const": 0.0,
        # Section 4.2 table, F1 row: g1..g5 = 0.0088, 0.055, 0.97, 0.013, 0.026 (g5 per
        # quadword of C0E7 -> x8 per L2 line).
        "F1": {"acc": 0.0088 * US, "l1d_misses": 0.055 * US, "l2_misses": 0.97 * US,
               "l1d_writebacks": 0.013 * US, "l2_writebacks": 0.026 * US * QW_PER_L2_LINE},
        # F2 row: 1.17 per L2 miss, 0.18 per quadword written back (x8 per line).
        "F2": {"l2_misses": 1.17 * US, "l2_writebacks": 0.18 * US * QW_PER_L2_LINE},
        # F3 row: 0.26 per L2 miss at a bank, 0.051 per quadword written back to it.
        "F3": {"lm": 0.26 * US, "wb": 0.051 * US * QW_PER_L2_LINE},
        "patterns": {"F1": ["p1.s1.b0.-E", "p1.s8.b0.-E", "p1.s32.b1/8.-E"],
                     "F2": ["p8.s256.b1.-E"], "F3": ["p8.s256.b8.-E"]},
        "diagnostics": {"avg_error": 1.19, "max_error": 1.91, "n": 412,
                        "source": "Amato et al., section 5.1, validation suite"},
    }
    bsp = {  # section 4.1, (g1, g2) per function and bound, us -> ns
        "QSM": {"min": [0.0083 * US, 0.001 * US], "max": [5.35 * US, 0.67 * US],
                "min_patterns": ["p1.s1.b0.LE", "p8.s1.b0.LC (same word)"],
                "max_patterns": ["p8.s256.b8.SC", "p8.s256.b8.SC (same word)"]},
        "EBSP": {"min": [0.0083 * US, 0.0083 * US], "max": [1.31 * US, 5.35 * US],
                 "min_patterns": ["p1.s1.b0.LE", "p8.s1.b0.LE"],
                 "max_patterns": ["p1.s256.b1.SE", "p8.s256.b8.SC"]},
        "DXBSP": {"min": [0.0083 * US, 0.26 * US], "max": [3.40 * US, 0.33 * US],
                  "min_patterns": ["p1.s1.b0.LE", "p8.s256.b8.LE"],
                  "max_patterns": ["p8.s32.b1.SC", "p8.s256.b8.SE"]},
    }
    levels = [{"level": 1, "size_bytes": 32 << 10, "ways": 2, "line_bytes": 32},
              {"level": 2, "size_bytes": 1 << 20, "ways": 2, "line_bytes": 128}]
    geometry, bank_map = machine_sections({
        "spec": caches_spec(levels), "levels": levels,
        "source": "Amato et al., section 2 (32 KB L1 data, 1 MB unified L2; lines 32 B and "
                  "128 B; R10000 caches are 2-way)"}, {
        "banks": 8, "interleave_bytes": 128,
        "provenance": "derived from Amato et al., Table 1: stride 32 words (128 B, 4-byte "
                      "words) reaches all 8 banks, stride 256 (1 KB) one bank, so bank = "
                      "(address // 128) % 8"})
    return MachineProfile(
        name="sgi-power-challenge",
        host={"hostname": "sgi-power-challenge", "cpu_model": "MIPS R10000 194 MHz",
              "cpus_online": 8, "page_bytes": 16384, "caches": caches_spec(levels)},
        geometry=geometry, bank_map=bank_map,
        processors=8, word_bytes=4, llc_level=2,
        models={"paper": f_paper}, bsp=bsp, default_model="paper",
        created="1999-10-04",
        contention=Contention(8, 8, 1.0, 8.0, 1.0, "the paper's classes (Amato et al., "
                              "section 4.2): F2 on p8.s256.b1.-E, F3 on p8.s256.b8.-E; 8 "
                              "processors on 8 banks reach BKC 1"),
        notes=("published parameters of Amato et al., Predicting performance on SMPs (TR "
               "99-020), converted from us to ns and from quadwords to 128-byte lines; see "
               "predictor/NOTES.md",))


BUILTIN = {"sgi-power-challenge": sgi_power_challenge}


def new_profile(name: str, *, host: Mapping[str, Any], geometry: Mapping[str, Any],
                bank_map: Mapping[str, Any], processors: int, word_bytes: int,
                llc_level: int, models: Mapping[str, Mapping[str, Any]],
                bsp: Mapping[str, Any], notes: tuple[str, ...] = (),
                contention: Contention | None = None) -> MachineProfile:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return MachineProfile(name, host, *machine_sections(geometry, bank_map), processors,
                          word_bytes, llc_level, models, bsp, "improved", now, notes,
                          contention=contention)
