"""Loaders for the optional native parts (built by setup.py).

``lib()`` returns the ctypes handle of ``libcounterd`` or None; ``missing_reason()`` says why it
is None. ``hotpath()`` returns the markers' compiled hot path (the ``_hotpath`` extension
module, hotpath_src/*.c) or None: not built, or ``COUNTERD_NATIVE=0`` in the environment (the Python
path, for comparisons).
"""

from __future__ import annotations

# Only os at the top: counterd.perf_abi loads the extension (its perf_event_open) for
# counterd.launch on the way to the recorded command's exec, where ctypes (3.5 ms here),
# pathlib and typing are too slow.
import os

from counterd.data.env import ENV_NATIVE

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (see counterd/__init__)
if TYPE_CHECKING:
    import ctypes
    from pathlib import Path
    from types import ModuleType
    from typing import Any


def _candidates() -> list[Path]:
    import importlib.machinery
    from pathlib import Path

    here = Path(__file__).resolve().parent
    return [here / f"libcounterd{suffix}" for suffix in importlib.machinery.EXTENSION_SUFFIXES]


def hotpath() -> Any:
    """The ``_hotpath`` extension module, or None (see the module docstring)."""
    wanted = os.environ.get(ENV_NATIVE, "1") != "0"
    if wanted not in _hotpath_loaded:
        _hotpath_loaded[wanted] = _load_hotpath(wanted)
    return _hotpath_loaded[wanted]


def hotpath_missing_reason() -> str:
    """Why :func:`hotpath` is None ("" when it is not)."""
    if os.environ.get(ENV_NATIVE, "1") == "0":
        return f"{ENV_NATIVE}=0 in the environment"
    return _hotpath_error


_hotpath_error = ""
_hotpath_loaded: dict[bool, ModuleType | None] = {}


def _load_hotpath(wanted: bool) -> ModuleType | None:
    global _hotpath_error
    if not wanted:
        return None
    try:
        import counterd._native._hotpath as module  # type: ignore[import-not-found]
    except ImportError as exc:
        _hotpath_error = (f"the markers' compiled hot path was not built ({exc}; no C compiler "
                          "at install time?): install gcc and reinstall the package")
        return None
    return module


_lib_loaded: tuple[ctypes.CDLL | None, str] | None = None  # functools.cache, without functools


def _load() -> tuple[ctypes.CDLL | None, str]:
    global _lib_loaded
    if _lib_loaded is None:
        _lib_loaded = _load_lib()
    return _lib_loaded


def _load_lib() -> tuple[ctypes.CDLL | None, str]:
    import ctypes

    for path in _candidates():
        if path.exists():
            try:
                lib = ctypes.CDLL(str(path))
            except OSError as exc:
                return None, f"{path} could not be loaded: {exc}"
            _declare(lib)
            return lib, ""
    return None, ("the native library libcounterd was not built (no C compiler at install time?): "
                  "install gcc and reinstall the package (pip install -e .)")


def _declare(lib: ctypes.CDLL) -> None:
    import ctypes as c

    lib.counterd_superstep_boundary.argtypes = [c.c_int64, c.c_int32]
    lib.counterd_superstep_boundary.restype = c.c_int64
    lib.counterd_superstep_mark.argtypes = [c.c_int64, c.c_int32]
    lib.counterd_superstep_mark.restype = c.c_int64
    lib.counterd_load_stride.argtypes = [c.c_void_p, c.c_size_t, c.c_size_t, c.c_size_t]
    lib.counterd_load_stride.restype = c.c_uint64
    lib.counterd_store_stride.argtypes = [c.c_void_p, c.c_size_t, c.c_size_t, c.c_size_t,
                                          c.c_uint64]
    lib.counterd_store_stride.restype = None
    lib.counterd_rmw_stride.argtypes = [c.c_void_p, c.c_size_t, c.c_size_t, c.c_size_t]
    lib.counterd_rmw_stride.restype = None
    # Added for microbench (issue 4); a library built before them lacks the symbols.
    if hasattr(lib, "counterd_mixed_stride"):
        lib.counterd_mixed_stride.argtypes = [c.c_void_p, c.c_size_t, c.c_size_t, c.c_size_t,
                                              c.c_size_t, c.c_uint64]
        lib.counterd_mixed_stride.restype = c.c_uint64
        lib.counterd_flush_stride.argtypes = [c.c_void_p, c.c_size_t, c.c_size_t]
        lib.counterd_flush_stride.restype = c.c_int64
    # Added for the memory-lines-touched and memory logP benchmarks (issue 12).
    if hasattr(lib, "counterd_copy2d"):
        lib.counterd_copy2d.argtypes = [c.c_void_p, c.c_size_t, c.c_void_p, c.c_size_t,
                                        c.c_size_t, c.c_size_t, c.c_size_t]
        lib.counterd_copy2d.restype = c.c_uint64
    if hasattr(lib, "counterd_marks_start_counting"):
        lib.counterd_marks_start_counting.argtypes = []
        lib.counterd_marks_start_counting.restype = c.c_int32
    _declare_cachesim(lib)


def _declare_cachesim(lib: ctypes.CDLL) -> None:
    """The cache simulator (cachesim.c). The state pointer is ``ctypes.addressof`` a
    ``counterd.sim.engines._CState``, whose size sim checks against
    ``counterd_cachesim_state_size``. A library built before cachesim.c existed lacks these
    symbols: nothing is declared and sim uses its Python engine."""
    if not hasattr(lib, "counterd_cachesim_run"):
        return
    import ctypes as c

    lib.counterd_cachesim_run.argtypes = [c.c_void_p, c.c_void_p, c.c_void_p, c.c_size_t]
    lib.counterd_cachesim_run.restype = c.c_int64
    lib.counterd_cachesim_strided.argtypes = [c.c_void_p, c.c_uint64, c.c_uint64, c.c_uint64,
                                              c.c_uint8, c.c_uint64]
    lib.counterd_cachesim_strided.restype = c.c_int64
    lib.counterd_cachesim_flush.argtypes = [c.c_void_p]
    lib.counterd_cachesim_flush.restype = None
    if hasattr(lib, "counterd_cachesim_interleave"):  # coherent systems (sim.CoherentSim)
        lib.counterd_cachesim_interleave.argtypes = [c.c_void_p, c.c_int64, c.c_void_p,
                                                     c.c_void_p, c.c_uint64, c.c_void_p]
        lib.counterd_cachesim_interleave.restype = c.c_int64
    lib.counterd_cachesim_state_size.argtypes = []
    lib.counterd_cachesim_state_size.restype = c.c_size_t


def lib() -> ctypes.CDLL | None:
    return _load()[0]


def missing_reason() -> str:
    return _load()[1]


def marks_start_counting() -> bool:
    """Whether the superstep marks start Callgrind's counting (``counterd_superstep_mark``
    issues ``CALLGRIND_START_INSTRUMENTATION`` at a process's first mark): the library was
    built with valgrind's header. Counting from the first superstep relies on it."""
    native = lib()
    return native is not None and hasattr(native, "counterd_marks_start_counting") \
        and bool(native.counterd_marks_start_counting())


BOUNDARY_SYMBOL = "counterd_superstep_boundary"
