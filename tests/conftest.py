from __future__ import annotations

from collections.abc import Iterator

import pytest

from counterd.markers import api as superstep


@pytest.fixture(autouse=True)
def _fresh_recorder() -> Iterator[None]:
    """Each test starts without a process-wide marker recorder."""
    superstep._recorder = None
    yield
    superstep._recorder = None
