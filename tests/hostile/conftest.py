"""The attacks of bench/attacks.py (one home for each scenario) against a daemon per test."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import attacks  # noqa: E402


@pytest.fixture
def lab() -> Iterator[attacks.Lab]:
    """A live ``counterd run`` on temp paths, with ``--quick`` scale: the floods sized so that
    each test stays within seconds. Not under pytest's tmp_path: its parents are private to
    root, and the attacks of other uids must reach the socket."""
    tmp = Path(tempfile.mkdtemp(prefix="counterd-hostile-"))
    tmp.chmod(0o755)
    lab = attacks.Lab(tmp, True, attacks.LiveDaemon(tmp / "main").start())
    yield lab
    lab.daemon.stop()
    shutil.rmtree(tmp, ignore_errors=True)
