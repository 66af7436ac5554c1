"""Peak memory and time of the commands that read a large records file (issue 14, item 6).

Usage: python bench/reader_memory.py [--mb 200] [--keep DIR]

Records a real run (``counterd record --backend sim -- python examples/bsp_sum.py``), repeats
its records into a JSON-lines file of about ``--mb`` MB in a temp directory (each repetition a
run of its own: the run id and the superstep indices vary, so the file holds as many
supersteps as records / processors), calibrates no profile (it uses the built-in
``sgi-power-challenge``), and runs each reading command under ``/usr/bin/time -v``. Prints the
host line, the file's size and record count, and per command: exit code, seconds, and peak RSS
("Maximum resident set size"). The goal (issue 14): every command under 200 MB peak.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _host import host_line  # noqa: E402

from counterd.data.clocks import CLOCK_FORMAT  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
GOAL_MB = 200


def build(directory: Path, target_bytes: int) -> tuple[Path, int]:
    """A records file of about ``target_bytes``: the records of one real run, repeated."""
    seed = directory / "seed.jsonl"
    subprocess.run([str(BIN / "counterd"), "record", "--backend", "sim", "--out", str(seed),
                    "--", sys.executable, str(ROOT / "examples" / "bsp_sum.py")],
                   check=True, capture_output=True)
    base = [d for d in (json.loads(line) for line in seed.read_text().splitlines()
                        if line.strip()) if d.get("format") != CLOCK_FORMAT]  # records only
    steps = max(r["index"] for r in base) + 1
    out = directory / "big.jsonl"
    written = count = 0
    with out.open("w") as fh:
        rep = 0
        while written < target_bytes:
            for r in base:
                line = json.dumps({**r, "run_id": f"{r['run_id']}-{rep // 1000}",
                                   "index": r["index"] + steps * (rep % 1000)},
                                  sort_keys=True) + "\n"
                fh.write(line)
                written += len(line)
                count += 1
            rep += 1
    return out, count


def measure(argv: list[str]) -> tuple[int, float, float, str]:
    """Exit code, seconds, peak RSS in MB and the first stderr line of ``argv``."""
    t0 = time.monotonic()
    proc = subprocess.run(["/usr/bin/time", "-v", *argv], capture_output=True, text=True)
    seconds = time.monotonic() - t0
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
    rss_mb = int(m.group(1)) / 1024 if m else float("nan")
    first = next((ln for ln in proc.stderr.splitlines() if ln.strip()), "")
    return proc.returncode, seconds, rss_mb, first


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=200.0, help="size of the records file (MB)")
    ap.add_argument("--keep", type=Path, default=None, help="build the file here and keep it")
    args = ap.parse_args()
    if not Path("/usr/bin/time").exists():
        print("reader_memory: /usr/bin/time is missing (apt-get install time)", file=sys.stderr)
        return 2
    print(host_line())
    with tempfile.TemporaryDirectory() as tmp:
        directory = args.keep or Path(tmp)
        directory.mkdir(parents=True, exist_ok=True)
        big, count = build(directory, int(args.mb * 1e6))
        print(f"records file: {big.stat().st_size / 1e6:.1f} MB, {count} records")
        counterd, predict = str(BIN / "counterd"), str(BIN / "predict")
        env_note = os.environ.get("COUNTERD_PROFILE")
        if env_note:
            print(f"note: COUNTERD_PROFILE={env_note} is set")
        commands = {
            "counterd report --records F": [counterd, "report", "--records", str(big),
                                            "--out", str(directory / "r.txt")],
            "counterd report --records F --profile P --format html": [
                counterd, "report", "--records", str(big), "--profile",
                "sgi-power-challenge", "--format", "html", "--out",
                str(directory / "r.html")],
            "predict --profile P --counters F": [predict, "--profile", "sgi-power-challenge",
                                                 "--counters", str(big)],
        }
        print(f"{'command':<56} {'exit':>4} {'seconds':>8} {'peak RSS MB':>12}  goal")
        worst = 0.0
        for name, argv in commands.items():
            code, seconds, rss, first = measure(argv)
            worst = max(worst, rss)
            print(f"{name:<56} {code:>4} {seconds:>8.1f} {rss:>12.0f}  "
                  f"{'ok' if rss < GOAL_MB and code == 0 else 'MISSED'}"
                  + (f"  ({first})" if code else ""))
        print(f"worst peak RSS {worst:.0f} MB (goal < {GOAL_MB} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
