from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from counterd.markers import api as superstep


@pytest.fixture(autouse=True)
def _fresh_recorder() -> Iterator[None]:
    """Each test starts without a process-wide marker recorder."""
    superstep._recorder = None
    yield
    superstep._recorder = None


@pytest.fixture(autouse=True, scope="session")
def _private_plan_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """counterd record keeps its perf plan (counterd.launch) under $XDG_RUNTIME_DIR or
    $XDG_CACHE_HOME: the tests' own directory, never the user's."""
    saved = {k: os.environ.get(k) for k in ("XDG_RUNTIME_DIR", "XDG_CACHE_HOME")}
    os.environ.pop("XDG_RUNTIME_DIR", None)
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
