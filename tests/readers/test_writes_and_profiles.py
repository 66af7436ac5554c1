"""A full disk leaves no temp file (predict calibrate --out); a configured profile that
cannot be used stops the daemon at start and is refused on SIGHUP; a profile from another host
is one warning line in counterd report, as in predict."""

from __future__ import annotations

import errno
import json
import logging
import os
from pathlib import Path

import pytest

from counterd.commands import cli as counterd_cli
from counterd.daemon.config import load
from counterd.daemon.service import Daemon
from predictor import cli as predict_cli
from predictor.costs.profile import save_profile, sgi_power_challenge
from predictor.errors import ProfileError
from predictor.synthetic import make_results, reference_model
from tests.readers.files import records_bytes


class _FullDisk:
    """A file whose writes fail as on a full disk (the descriptor is real: mkstemp made it)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __enter__(self) -> _FullDisk:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)

    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _full_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "fdopen", lambda fd, *a, **kw: _FullDisk(fd))


def test_profile_on_a_full_disk_leaves_no_file(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    _full_disk(monkeypatch)
    with pytest.raises(ProfileError, match="No space left"):
        save_profile(sgi_power_challenge(), tmp_path / "p.toml")
    assert list(tmp_path.iterdir()) == []


def test_calibrate_out_on_a_full_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "r.json"
    results.write_text(json.dumps(make_results(reference_model(const=1500.0), noise=0.01,
                                               seed=2)))
    out = tmp_path / "out"
    out.mkdir()
    _full_disk(monkeypatch)
    assert predict_cli.main(["calibrate", "--results", str(results), "--out",
                             str(out / "p.toml")]) == 2
    err = capsys.readouterr().err.strip()
    assert "No space left" in err and "\n" not in err
    assert list(out.iterdir()) == []  # before the fix: a 0-byte .p.toml.XXXX


def _config(tmp_path: Path, profile: str) -> Path:
    f = tmp_path / "c.toml"
    f.write_text(f'[socket]\npath = "{tmp_path}/s.sock"\n[store]\npath = "{tmp_path}/st.db"\n'
                 f'[metrics]\nlisten = ""\n[predictor]\nprofile = "{profile}"\n')
    return f


@pytest.mark.parametrize("profile", ["missing.toml", "garbage.toml"])
def test_unusable_profile_stops_the_daemon_at_start(tmp_path: Path, profile: str,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]
                                                    ) -> None:
    for var in ("COUNTERD_SOCKET", "COUNTERD_STORE", "COUNTERD_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "garbage.toml").write_bytes(b"\xff\xfe" * 100)
    cfg = _config(tmp_path, str(tmp_path / profile))
    assert counterd_cli.main(["run", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("counterd run: config predictor.profile:") and "\n" not in err
    assert profile in err
    assert not (tmp_path / "st.db").exists() and not (tmp_path / "s.sock").exists()


def test_sighup_with_an_unusable_profile_keeps_the_running_config(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for var in ("COUNTERD_SOCKET", "COUNTERD_STORE", "COUNTERD_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    cfg_path = _config(tmp_path, "sgi-power-challenge")
    daemon = Daemon(load(cfg_path), config_path=cfg_path)
    daemon._apply(daemon.config)
    assert daemon.state.predict is not None
    running = daemon.config
    cfg_path.write_text(cfg_path.read_text().replace("sgi-power-challenge",
                                                     str(tmp_path / "missing.toml")))
    with caplog.at_level(logging.ERROR, logger="counterd"):
        daemon.reload()
    assert daemon.config == running and daemon.state.predict is not None
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("keeping the running config" in m and "missing.toml" in m for m in errors)


def test_report_warns_once_for_a_profile_from_another_host(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = tmp_path / "r.jsonl"
    records.write_bytes(records_bytes(tmp_path))
    assert counterd_cli.main(["report", "--records", str(records), "--profile",
                              "sgi-power-challenge", "--out", str(tmp_path / "r.txt")]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and err[1] == f"counterd report: wrote {tmp_path / 'r.txt'} (text)"
    # The predictor's own warning, once (predictor.errors.warn_host_mismatch), as predict prints it.
    assert err[0].startswith("counterd report: warning: profile sgi-power-challenge was "
                             "fitted on another host (cpu_model: 'MIPS R10000 194 MHz'")
    assert err[0].endswith("calibrate on this host (predict calibrate)")
