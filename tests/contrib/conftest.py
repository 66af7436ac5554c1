"""The namespace cluster of bench/netns_cluster.py, one per test, torn down after it."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from netns_cluster import Cluster  # noqa: E402


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    tmp_path.chmod(0o755)
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.close()
