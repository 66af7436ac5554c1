"""The compiled extensions' tests under valgrind's memcheck: invalid reads and writes, uses of
uninitialised memory and bad frees whose innermost frames are the project's C code.

    .venv/bin/python bench/native_memcheck.py [PYTEST ARGS...]

The default tests are those of the markers' hot path, its user-space counter reads and the
spool's shared mapping (tests/counterd/test_hotpath.py, test_rdpmc.py, test_spool_mapped.py),
about 2 minutes; the hypothesis test that compares random marker programs on both paths is
left out (under memcheck its input generation trips hypothesis's too-slow health check).
CPython itself gives memcheck reports (its small-int cache under PYTHONMALLOC=malloc, glibc's
vectorised string compares, the dynamic loader): those are counted, not listed. An error is
the project's when one of its four innermost frames is in a C file under counterd/_native/
(the markers' hot path is counterd/_native/hotpath_src/*.c).

Then, outside valgrind, a leak check memcheck cannot make (a reference the C code never
drops is no invalid access): the process's anonymous memory (RssAnon) after each of three
rounds of 300,000 compiled marker pairs, for each kind of lane (spool with perf counters,
sampled, without counters); a pair that leaked 8 bytes would add 2.4 MB a round.

Exit status 1 if memcheck finds an error of the project's, the tests fail or a lane's memory
grows by over 1 MB from the first round to the last; 0 otherwise; valgrind not installed: 2.
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._host import host_line  # noqa: E402

DEFAULT = ["tests/counterd/test_hotpath.py", "tests/counterd/test_rdpmc.py",
           "tests/counterd/test_spool_mapped.py", "--deselect",
           "tests/counterd/test_hotpath.py::"
           "test_random_marker_programs_give_the_same_records_on_both_paths"]
OURS = re.compile(r"\b(" + "|".join(re.escape(p.name) for p in
                                    sorted((ROOT / "counterd" / "_native").rglob("*.c")))
                  + r")\b")
FRAME = re.compile(r"==\d+==\s+(at|by) ")
KIND = re.compile(r"==\d+== (\S.*)")  # an error's first line: "Invalid read of size 8"


def project_errors(log: str) -> tuple[int, collections.Counter[str]]:
    """(how many error contexts the log holds, the project's by kind and innermost frames)."""
    total = 0
    ours: collections.Counter[str] = collections.Counter()
    for block in re.split(r"\n==\d+== \n", log):
        lines = block.splitlines()
        frames = [line for line in lines if FRAME.match(line)]
        if not frames or "ERROR SUMMARY" in block or "HEAP SUMMARY" in block:
            continue
        total += 1
        head = frames[:4]
        if any(OURS.search(f) for f in head):
            kind = next((m.group(1) for m in map(KIND.match, lines) if m), "?")
            ours["\n".join([kind, *head])] += 1
    return total, ours


LEAK_CHECK = """
import sys, tempfile
from pathlib import Path
import counterd
from counterd.markers.api import configure
SOFTWARE = ("task_clock_ns", "page_faults", "context_switches")

def anon_kb():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1])

spool = Path(tempfile.mkdtemp())
for label, kw in [("spool, perf software events", dict(backend="perf", events=SOFTWARE)),
                  ("spool, perf software events, sample 1ms:10",
                   dict(backend="perf", events=SOFTWARE, sample="1ms:10")),
                  ("spool, no counters", dict(backend="none"))]:
    configure(spool=spool, socket="off", **kw)
    kb = []
    for _ in range(3):
        for _ in range(300_000):
            with counterd.superstep("s", k=1):
                pass
        kb.append(anon_kb())
    print(label, *kb)
    for f in spool.iterdir():
        f.unlink()
"""


def leak_check() -> bool:
    """The rounds' anonymous memory per kind of lane, printed; whether none grew over 1 MB."""
    out = subprocess.run([sys.executable, "-c", LEAK_CHECK], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    ok = True
    print("anonymous memory (RssAnon) after each of 3 rounds of 300,000 compiled pairs:")
    for line in out.splitlines():
        *words, first, second, last = line.split()
        label, kb = " ".join(words), [int(first), int(second), int(last)]
        grew = kb[-1] - kb[0] > 1024
        ok &= not grew
        print(f"  {label:<45} {' '.join(f'{v / 1024:6.1f}' for v in kb)} MB"
              + ("  GROWS" if grew else ""))
    return ok


def main() -> int:
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        print("valgrind is not installed (scripts/system-deps.sh installs it)", file=sys.stderr)
        return 2
    print(host_line())
    args = sys.argv[1:] or DEFAULT
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(
            [valgrind, "--tool=memcheck", f"--log-file={tmp}/vg.%p.log", sys.executable, "-m",
             "pytest", "-q", "-p", "no:cacheprovider", *args],
            cwd=ROOT, env={**os.environ, "PYTHONMALLOC": "malloc"},
            capture_output=True, text=True)
        print(proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr)
        found: collections.Counter[str] = collections.Counter()
        total = 0
        logs = sorted(Path(tmp).glob("vg.*.log"))
        for log in logs:
            n, ours = project_errors(log.read_text(errors="replace"))
            total += n
            found += ours
    print(f"memcheck: {len(logs)} processes, {total} error contexts, "
          f"{sum(found.values())} with counterd/_native code among the innermost four frames")
    for text, n in found.most_common():
        print(f"\n{n}x {text}")
    flat = leak_check()
    return 1 if found or proc.returncode or not flat else 0


if __name__ == "__main__":
    raise SystemExit(main())
