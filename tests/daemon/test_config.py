"""Daemon configuration: TOML, COUNTERD_* overrides, defaults, errors with the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from counterd.daemon import config
from counterd.data.errors import BadInput


def test_defaults_are_loopback_and_documented() -> None:
    cfg = config.load(None, env={})
    assert cfg.metrics_listen == "127.0.0.1:9464"
    assert cfg.socket_path == config.default_socket_path()
    assert cfg.store_synchronous == "full"
    assert cfg.sample_interval_s == 1.0 and cfg.retention_days == 30
    assert not cfg.export_pids and cfg.watch == ()


def test_file_then_environment(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text('log_level = "debug"\n[metrics]\nlisten = "127.0.0.1:1"\n'
                 '[store]\npath = "/x/y.db"\nretention_days = 2\n'
                 '[sampling]\nevents = ["task_clock_ns"]\n'
                 '[[watch]]\njob = "web"\ncomm = "^nginx$"\nuser = 0\n')
    cfg = config.load(f, env={"COUNTERD_METRICS_LISTEN": "127.0.0.1:2",
                              "COUNTERD_SAMPLE_INTERVAL": "0.5"})
    assert cfg.metrics_listen == "127.0.0.1:2"  # environment wins
    assert cfg.store_path == Path("/x/y.db") and cfg.retention_days == 2
    assert cfg.sample_interval_s == 0.5 and cfg.log_level == "debug"
    assert cfg.sample_events == ("task_clock_ns",)
    assert cfg.watch == (config.WatchRule(job="web", comm="^nginx$", user=0),)


@pytest.mark.parametrize("text, env, words", [
    ("[metrics]\nlisten = 5\n", {}, "metrics.listen"),
    ("[store]\nsynchronous = \"sometimes\"\n", {}, "store.synchronous"),
    ("[store]\ncolour = 1\n", {}, "store.colour"),
    ("[sampling]\nevents = [\"bogus\"]\n", {}, "bogus"),
    ("[[watch]]\njob = \"x\"\ncomm = \"(\"\n", {}, "watch #1"),
    ("not toml = = 1\n", {}, "not valid TOML"),
    ("", {"COUNTERD_SAMPLE_INTERVAL": "fast"}, "COUNTERD_SAMPLE_INTERVAL"),
    ("", {"COUNTERD_METRICS_LISTEN": "nowhere"}, "HOST:PORT"),
])
def test_bad_config_names_the_key(tmp_path: Path, text: str, env: dict[str, str],
                                  words: str) -> None:
    f = tmp_path / "c.toml"
    f.write_text(text)
    with pytest.raises(BadInput) as err:
        config.load(f, env=env)
    assert words in str(err.value)
    assert err.value.fix


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="cannot read config"):
        config.load(tmp_path / "none.toml", env={})
