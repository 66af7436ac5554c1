"""Build the optional native library (kernels, superstep boundary symbol, cache simulator).

It is an ordinary shared object loaded with ctypes, not a Python extension module. The build is
optional: without a C compiler the package installs, the simulator falls back to its pure-Python
engine and `counterd probe` says the native library is missing.
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
        return []  # not a Python module: no PyInit_ symbol


setup(
    ext_modules=[
        Extension(
            "counterd._native.libcounterd",
            sources=["counterd/_native/kernels.c", "counterd/_native/cachesim.c"],
            extra_compile_args=["-O2", "-g", "-fno-strict-aliasing", "-fvisibility=hidden"],
        )
    ],
    cmdclass={"build_ext": OptionalBuildExt},
)
