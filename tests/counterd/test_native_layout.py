"""The compiled hot path's C sources sit where no import can take them for a module: a folder
``counterd/_native/hotpath/`` (no ``__init__.py``) was a namespace package, and
``import counterd._native.hotpath`` replaced the loader function ``counterd._native.hotpath()``
with it."""

from __future__ import annotations

import importlib.util

from counterd import _native


def test_the_hot_path_sources_do_not_shadow_the_loader() -> None:
    assert importlib.util.find_spec("counterd._native.hotpath") is None
    assert callable(_native.hotpath)
