"""The README as a newcomer uses it: its first program, recorded and reported with its own
commands; its length; every relative link of README.md and docs/ leads somewhere; the
Prometheus and daemon configurations it shows are accepted."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from counterd.backends import resolve
from counterd.daemon import config as daemon_config
from predictor.costs.profile import save_profile, sgi_power_challenge

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BIN = Path(sys.executable).parent
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
MAX_LINES = 200

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _blocks(text: str, lang: str) -> list[str]:
    return [body for tag, body in FENCE.findall(text) if tag == lang]


def _first_program_commands(text: str) -> list[list[str]]:
    """The README's `counterd record` and `counterd report --records` lines (the sh block
    that follows the first program), as argument lists."""
    for block in _blocks(text, "sh"):
        lines = [ln.split("#", 1)[0].strip() for ln in block.splitlines()]
        record = [ln for ln in lines if ln.startswith("counterd record ")]
        report = [ln for ln in lines if ln.startswith("counterd report --records ")]
        if record and report:
            return [shlex.split(record[0]), shlex.split(report[0])]
    raise AssertionError("README.md has no sh block with `counterd record` and "
                         "`counterd report --records`")


def test_readme_is_short() -> None:
    n = len(README.read_text().splitlines())
    assert n <= MAX_LINES, f"README.md has {n} lines (at most {MAX_LINES}: move detail to docs/)"


def test_first_program_records_and_reports(tmp_path: Path) -> None:
    text = README.read_text()
    program = _blocks(text, "python")[0]
    assert "counterd.init()" in program and "counterd.superstep(" in program
    (tmp_path / "my_bsp.py").write_text(program)
    record, report = _first_program_commands(text)
    # Where the default backend is Callgrind (no PMU), the program would run a second time
    # under valgrind for about a minute: record times only here (the README says so too).
    if resolve("auto", "record").backend != "perf":
        record[2:2] = ["--backend", "none"]
    # The profile the README names is the one `make demo` writes; any valid profile serves to
    # run the command (this one is the paper's machine: the report warns it is another host).
    profile = tmp_path / report[report.index("--profile") + 1]
    profile.parent.mkdir(parents=True, exist_ok=True)
    save_profile(sgi_power_challenge(), profile)

    def run(args: list[str]) -> subprocess.CompletedProcess[str]:
        exe = [str(BIN / args[0])] + [sys.executable if a == "python" else a for a in args[1:]]
        out = subprocess.run(exe, cwd=tmp_path, text=True, capture_output=True, timeout=60)
        assert out.returncode == 0, f"{shlex.join(args)}: {out.stderr}"
        return out

    run(record)
    records_file = tmp_path / record[record.index("--out") + 1]
    lines = [json.loads(line) for line in records_file.read_text().splitlines()]
    recs = [r for r in lines if r["format"] == 1]  # after the clock domain (counterd.data.clocks)
    assert sorted((r["name"], r["rank"]) for r in recs) == [
        ("neighbour sum", 0), ("neighbour sum", 1), ("scale", 0), ("scale", 1)]
    broken = {"incomplete", "exception", "nested", "unmatched_end"}  # not `migrated`: load
    assert not [f for r in recs for f in r.get("flags") or () if f in broken], recs
    shown = run(report).stdout
    assert re.search(r"^\s*0 scale\s+2 ", shown, re.M), shown
    assert re.search(r"^\s*1 neighbour sum\s+2 ", shown, re.M), shown


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {_slug(m) for m in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def _markdown_files() -> list[Path]:
    return [README, *sorted((ROOT / "docs").rglob("*.md"))]


@pytest.mark.parametrize("page", _markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_lead_somewhere(page: Path) -> None:
    broken = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not checked here
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_readme_daemon_config_is_accepted(tmp_path: Path) -> None:
    (block,) = _blocks(README.read_text(), "toml")
    path = tmp_path / "counterd.toml"
    path.write_text(block)
    cfg = daemon_config.load(path, env={})
    assert str(cfg.socket_path) == "out/counterd.sock"
    assert cfg.metrics_listen == "127.0.0.1:9464"


@pytest.mark.skipif(not Path(PROMTOOL).exists(),
                    reason="promtool not installed (Debian package prometheus; "
                           "scripts/system-deps.sh installs it as root)")
def test_prometheus_example_is_valid() -> None:
    cfg = ROOT / "docs" / "prometheus.yml"
    out = subprocess.run([PROMTOOL, "check", "config", str(cfg)], text=True,
                         capture_output=True, timeout=30)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "127.0.0.1:9464" in cfg.read_text()
