"""counterd cluster targets: Slurm hostlist syntax and the file_sd JSON it writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from counterd.commands import cli
from counterd.commands.cluster import MAX_HOSTS, expand_hostlist, file_sd, hosts_from_lines
from counterd.data.errors import BadInput


@pytest.mark.parametrize("text,expected", [
    ("node1", ["node1"]),
    ("node[1-3]", ["node1", "node2", "node3"]),
    ("node[001-003]", ["node001", "node002", "node003"]),
    ("n[8-10]", ["n8", "n9", "n10"]),  # padded to the lower bound's width, as Slurm
    ("n[08-10]", ["n08", "n09", "n10"]),
    ("n[1-2,7,10-11]", ["n1", "n2", "n7", "n10", "n11"]),
    ("login1,n[1-2],gpu[01-02]", ["login1", "n1", "n2", "gpu01", "gpu02"]),
    ("r[1-2]-n[01-02]", ["r1-n01", "r1-n02", "r2-n01", "r2-n02"]),  # first bracket slowest
    ("r[1-2]n[1-2].ib", ["r1n1.ib", "r1n2.ib", "r2n1.ib", "r2n2.ib"]),
    ("n[1-2],n[2-3]", ["n1", "n2", "n3"]),  # duplicates once
    ("10.0.0.[1-2]", ["10.0.0.1", "10.0.0.2"]),
])
def test_hostlists_expand_as_slurm_does(text: str, expected: list[str]) -> None:
    assert expand_hostlist(text) == expected


def test_node_001_to_128_is_128_padded_names() -> None:
    hosts = expand_hostlist("node[001-128]")
    assert len(hosts) == 128 and hosts[0] == "node001" and hosts[-1] == "node128"


@pytest.mark.parametrize("text,what", [
    ("n[1-3", "without"), ("n1-3]", "without"), ("n[[1-2]]", "nested"),
    ("n[3-1]", "backwards"), ("n[a-b]", "holds"), ("n[1-]", "holds"), ("n[]", "holds"),
    (f"n[0-{MAX_HOSTS}]", "too long"), ("a[0-999]b[0-999]", "more than"),
    ("bad host", "not a host"),
])
def test_bad_hostlists_are_one_clear_error(text: str, what: str) -> None:
    with pytest.raises(BadInput, match=what):
        expand_hostlist(text)


def test_file_sd_json_with_labels_and_ipv6() -> None:
    groups = json.loads(file_sd(["n1", "fd00::5"], 9464, {"cluster": "hpc1"}))
    assert groups == [{"targets": ["n1:9464", "[fd00::5]:9464"],
                       "labels": {"cluster": "hpc1"}}]


def test_host_files_take_hostlists_and_comments() -> None:
    assert hosts_from_lines(["# rack 1", "n[1-2]  # compute", "", "login1"]) == \
        ["n1", "n2", "login1"]


def test_the_cli_writes_the_file_atomically(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("gpu[1-2]\n")
    out = tmp_path / "targets" / "counterd.json"
    out.parent.mkdir()
    assert cli.main(["cluster", "targets", "node[01-02]", "--file", str(hosts), "--port",
                     "9464", "--label", "cluster=hpc1", "--out", str(out)]) == 0
    assert json.loads(out.read_text())[0]["targets"] == [
        "node01:9464", "node02:9464", "gpu1:9464", "gpu2:9464"]
    assert "4 targets" in capsys.readouterr().err


@pytest.mark.parametrize("argv,what", [
    (["cluster", "targets"], "no hosts"),
    (["cluster", "targets", "n[2-1]"], "backwards"),
    (["cluster", "targets", "n1", "--label", "__x=1"], "label"),
    (["cluster", "targets", "n1", "--port", "0"], "port"),
    (["cluster", "targets", "--file", "/nonexistent/hosts"], "cannot read"),
])
def test_bad_input_is_one_line_and_exit_2(argv: list[str], what: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert what in err and err.count("\n") <= 2
