"""Every command that reads a file, against every hostile variant of that file (issue 14,
"Files"): exit 2 with one stderr line naming the file, never a traceback."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from counterd.commands import cli as counterd_cli
from microbench import cli as microbench_cli
from predictor import cli as predict_cli
from predictor.costs.profile import save_profile, sgi_power_challenge
from predictor.synthetic import make_results, reference_model
from tests.readers.files import (
    VARIANTS,
    jsonl_variant,
    records_bytes,
    results_variant,
    toml_variant,
)

MACHINE = (b'format = "counterd-machine"\nversion = 1\npage_bytes = 4096\n\n[[caches]]\n'
           b'level = 1\ntype = "data"\nsize = "32K"\nways = 8\nline_bytes = 64\n')


@pytest.fixture(scope="module")
def seeds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes | Path]:
    """A valid file of each format; the commands' other inputs (R: records, S: results)."""
    tmp = tmp_path_factory.mktemp("seeds")
    rec = records_bytes(tmp)
    (tmp / "rec.jsonl").write_bytes(rec)
    results = json.dumps(make_results(reference_model(const=1500.0), noise=0.01,
                                      seed=2)).encode()
    (tmp / "results.json").write_bytes(results)
    save_profile(sgi_power_challenge(), tmp / "prof.toml")
    config = (f'[socket]\npath = "{tmp}/s.sock"\n[store]\npath = "{tmp}/st.db"\n'
              '[metrics]\nlisten = ""\n').encode()
    return {"jsonl": rec, "results": results, "profile": (tmp / "prof.toml").read_bytes(),
            "machine": MACHINE, "config": config, "R": tmp / "rec.jsonl",
            "S": tmp / "results.json"}


def _variant(kind: str, valid: bytes, name: str) -> bytes:
    if kind == "jsonl":
        return jsonl_variant(valid, name)
    if kind == "results":
        return results_variant(valid, name)
    keys = {"profile": (("machine", "processors"), ("models", "paper", "F1", "acc")),
            "machine": (("page_bytes",), ("caches", 0, "ways")),
            "config": (("socket", "idle_timeout_s"), ("socket", "max_clients_per_uid"))}
    number, counter = keys[kind]
    return toml_variant(valid, name, number_key=number, counter_key=counter)


Argv = Callable[[str, dict[str, bytes | Path]], tuple[Callable[[list[str]], int], list[str]]]

COMMANDS: dict[str, tuple[str, Argv]] = {
    "counterd report --records F": ("jsonl", lambda f, s: (
        counterd_cli.main, ["report", "--records", f])),
    "counterd report --records R --profile F": ("profile", lambda f, s: (
        counterd_cli.main, ["report", "--records", str(s["R"]), "--profile", f])),
    "predict --counters F": ("jsonl", lambda f, s: (
        predict_cli.main, ["--profile", "sgi-power-challenge", "--counters", f])),
    "predict --profile F --counters R": ("profile", lambda f, s: (
        predict_cli.main, ["--profile", f, "--counters", str(s["R"])])),
    "predict calibrate --results F": ("results", lambda f, s: (
        predict_cli.main, ["calibrate", "--results", f, "--out", f + ".toml"])),
    "predict validate --results F": ("results", lambda f, s: (
        predict_cli.main, ["validate", "--results", f, "--profile", "sgi-power-challenge"])),
    "predict validate --profile F": ("profile", lambda f, s: (
        predict_cli.main, ["validate", "--results", str(s["S"]), "--profile", f])),
    "predict profile F": ("profile", lambda f, s: (predict_cli.main, ["profile", f])),
    "microbench show F": ("results", lambda f, s: (microbench_cli.main, ["show", f])),
    "microbench run --resume --out F": ("results", lambda f, s: (
        microbench_cli.main, ["run", "--resume", "--backend", "sim", "--suite", "table1",
                              "--procs", "1", "--compute-backend", "none", "--out", f])),
    "counterd probe --machine F": ("machine", lambda f, s: (
        counterd_cli.main, ["probe", "--machine", f])),
    "microbench list --machine F": ("machine", lambda f, s: (
        microbench_cli.main, ["list", "--machine", f])),
    "counterd run --config F": ("config", lambda f, s: (
        counterd_cli.main, ["run", "--config", f])),
}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("command", list(COMMANDS))
def test_hostile_file_exits_2_with_one_line(command: str, variant: str,
                                            seeds: dict[str, bytes | Path], tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    kind, argv = COMMANDS[command]
    if kind == "config" and variant == "empty":
        pytest.skip("an empty config is the defaults: valid, the daemon would start")
    for var in ("COUNTERD_SOCKET", "COUNTERD_STORE", "COUNTERD_PROFILE", "COUNTERD_MACHINE"):
        monkeypatch.delenv(var, raising=False)
    valid = seeds[kind]
    assert isinstance(valid, bytes)
    f = tmp_path / f"{kind}-{variant}"
    f.write_bytes(_variant(kind, valid, variant))
    main, args = argv(str(f), seeds)
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err[:2000]
    assert str(f) in err, err[:500]


# Issue 34: a file of another kind given as records said "record format None is not 1:
# re-record with this version of counterd" or "record format 'counterd-microbench' is not 1".
def test_a_report_given_as_records_is_named(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "report.json"
    f.write_text('{\n  "format": 2,\n  "supersteps": []\n}\n')
    assert counterd_cli.main(["report", "--records", str(f)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"counterd report: {f}: one JSON document over several lines (a counterd "
                   "report --json output?), not the records counterd record writes, one per "
                   "line: give the records `counterd record --out FILE` writes"), err


@pytest.mark.parametrize("kind", ["other tool", "microbench results", "newer records"])
@pytest.mark.parametrize("command", ["counterd report --records F", "predict --counters F"])
def test_a_file_of_another_kind_is_named_with_what_to_do(kind: str, command: str,
                                                         seeds: dict[str, bytes | Path],
                                                         tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    first = json.loads(seeds["jsonl"].splitlines()[0])  # type: ignore[union-attr]
    content, said = {
        "other tool": (b'{"ts": 1, "level": "info", "msg": "hello"}\n',
                       'not counterd records: a JSON object without "format": 1 (keys: level, '
                       'msg, ts), written by another tool: give the records `counterd record '
                       '--out FILE` writes'),
        "microbench results": (seeds["results"] + b"\n",
                               "this is a microbench results file (microbench run --out), not "
                               "superstep records: summarise it with `microbench show FILE`"),
        "newer records": (json.dumps({**first, "format": 7}).encode() + b"\n",
                          "record format 7 is newer than this counterd reads (1): upgrade "
                          "counterd to read it, or re-record with this version"),
    }[kind]
    f = tmp_path / "given"
    f.write_bytes(content)  # type: ignore[arg-type]
    main, args = COMMANDS[command][1](str(f), seeds)
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"{f}:1: {said}"), err
    assert "\n" not in err and "is not 1" not in err
