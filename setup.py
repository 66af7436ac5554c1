"""Build the optional native parts.

* ``counterd._native.libcounterd`` (kernels, the superstep boundary symbol, the cache
  simulator): an ordinary shared object loaded with ctypes, not a Python extension module.
* ``counterd._native._hotpath``: the superstep markers' hot path, a Python extension module.

Both builds are optional: without a C compiler the package installs, the simulator falls back to
its pure-Python engine, the markers to their Python path, and `counterd probe` says what is
missing.
"""

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - any compiler failure makes the build optional
            print(f"warning: native library not built ({exc}); pure-Python fallbacks will be used")

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001
            print(f"warning: {ext.name} not built ({exc}); pure-Python fallbacks will be used")

    def get_export_symbols(self, ext: Extension) -> list[str]:
        if ext.name.endswith("libcounterd"):
            return []  # not a Python module: no PyInit_ symbol
        return super().get_export_symbols(ext)


setup(
    ext_modules=[
        Extension(
            "counterd._native.libcounterd",
            sources=["counterd/_native/kernels.c", "counterd/_native/cachesim.c"],
            extra_compile_args=["-O2", "-g", "-fno-strict-aliasing", "-fvisibility=hidden"],
        ),
        Extension(
            "counterd._native._hotpath",
            sources=[f"counterd/_native/hotpath_src/{name}.c" for name in
                     ("module", "lane", "step", "frames", "mappedfile", "perfpage")],
            depends=["counterd/_native/hotpath_src/hotpath.h"],
            extra_compile_args=["-O2", "-g", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                "-Wno-missing-field-initializers"],
        ),
    ],
    cmdclass={"build_ext": OptionalBuildExt},
)
