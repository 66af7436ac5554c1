"""Fixtures shared by the predictor's tests."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest


@pytest.fixture
def pilot_text(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
               ) -> Callable[[Sequence[Any], str, str], tuple[int, str, Any]]:
    """``predict --pilot`` on the given pilot runs (the campaign stubbed, ``prog {n}``, no
    counting backend): its exit code, its text with the whitespace folded, and the captured
    output (``.out``, ``.err``)."""
    from predictor.cli import main

    def run(runs: Sequence[Any], sizes: str, target: str) -> tuple[int, str, Any]:
        monkeypatch.setattr("predictor.pilot.campaign.run_campaign", lambda *a, **k: runs)
        rc = main(["--pilot", "prog {n}", "--sizes", sizes, "--target", target,
                   "--backend", "none"])
        out = capsys.readouterr()
        return rc, " ".join(out.out.split()), out

    return run
