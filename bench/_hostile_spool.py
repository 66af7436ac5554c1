"""What a hostile program recorded by ``counterd record`` can leave in its spool directory.

One home for each scenario of issue 29's recorder attacks: bench/attacks.py (category
"recorder") runs this file as the recorded command at full size, tests/hostile/
test_spool_attacks.py calls :func:`plant` at small size in-process. Standard library only: the
recorded command must not import counterd (whose markers would add a spool file of their own).

    python bench/_hostile_spool.py KIND SIZE TARGET ENDFILE

plants ``KIND`` in ``$COUNTERD_SPOOL`` (``SIZE`` bytes where it has a size, ``TARGET`` for
the kinds that point at or copy a file), writes the monotonic clock at its end to ``ENDFILE``
and exits 0.
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import struct
import sys
import time

NOBODY = 65534
SIGNAL_AFTER_S = 0.4  # after the command's end: the recorder is reading its spool then

# kind -> (what it is, whether it needs root to be made)
KINDS: dict[str, tuple[str, bool]] = {
    "fifo": ("1.jsonl a FIFO (a reader blocks at its open)", False),
    "link to /dev/zero": ("1.jsonl a symbolic link to /dev/zero (endless zero bytes)", False),
    "link to another user's file": ("1.jsonl a symbolic link to a file of another user", False),
    "another user's file": ("1.jsonl a regular file of uid 65534 holding a record", True),
    "directory": ("a directory named 1.jsonl", False),
    "socket": ("1.jsonl a Unix socket", False),
    "character device": ("1.jsonl a character device (/dev/zero's numbers)", True),
    "block device": ("1.jsonl a block device (loop0's numbers)", True),
    "sparse frames": ("1.frames sparse, its head claiming committed = 2^32 bytes", False),
    "sparse jsonl": ("1.jsonl a sparse file of SIZE bytes (all zero)", False),
    "truncated while read": ("1.jsonl of SIZE bytes of junk lines, truncated and regrown "
                             "while the recorder reads it", False),
}

# A record line of a run the recorder must never report (planted in another user's file).
STOLEN_RUN = "stolen-run"


def record_line(run_id: str = STOLEN_RUN) -> bytes:
    """One spool ``record`` line (the JSON form of a SuperstepRecord, format 1)."""
    return (b'{"ev":"record","format":1,"run_id":"' + run_id.encode()
            + b'","index":0,"name":"s","rank":0,"pid":1,"cpu":0,"begin_ns":1,"end_ns":2,'
            b'"counters":{},"params":{},"flags":[],"unsupported":{},"backend":"none",'
            b'"host":"h"}\n')


def write_junk(path: str, size: int, line_bytes: int = 1024) -> None:
    """``size`` bytes of JSON lines that are not spool events (parsed, then skipped), written
    1 MiB at a time (the planting program's memory stays small: its RSS counts in the
    recorder's peak as measured, wait4's)."""
    line = b'{"x":"' + b"a" * (line_bytes - 9) + b'"}\n'
    block = line * ((1 << 20) // len(line))
    with open(path, "wb") as f:
        for _ in range(size // len(block)):
            f.write(block)


def plant(spool: str, kind: str, size: int = 0, target: str = "") -> str:
    """Leave ``kind`` in spool directory ``spool``; the path planted. ``target``: the other
    user's file a link points at (``link to another user's file``). PermissionError where
    the kind needs root."""
    path = os.path.join(spool, "1.frames" if kind == "sparse frames" else "1.jsonl")
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "link to /dev/zero":
        os.symlink("/dev/zero", path)
    elif kind == "link to another user's file":
        os.symlink(target, path)
    elif kind == "another user's file":
        with open(path, "wb") as f:
            f.write(record_line())
        os.chown(path, NOBODY, NOBODY)
    elif kind == "directory":
        os.mkdir(path)
        with open(os.path.join(path, "x"), "wb") as f:
            f.write(record_line())
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(path)
        s.close()
    elif kind == "character device":
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 5))
    elif kind == "block device":
        os.mknod(path, stat.S_IFBLK | 0o600, os.makedev(7, 0))
    elif kind == "sparse frames":
        with open(path, "wb") as f:
            f.write(struct.pack("<8sQ", b"CDSPOOL1", 1 << 32))
            f.truncate(64 + (1 << 32))
    elif kind == "sparse jsonl":
        with open(path, "wb") as f:
            f.truncate(size)
    elif kind == "truncated while read":
        write_junk(path, size)
        length = os.stat(path).st_size
        if os.fork() == 0:  # outlives the command: truncates and regrows under the reader
            os.setsid()
            try:
                deadline = time.monotonic() + 3.0
                while time.monotonic() < deadline:
                    os.truncate(path, 0)
                    time.sleep(0.01)
                    os.truncate(path, length)  # regrown, now a hole
                    time.sleep(0.01)
            except OSError:  # the recorder removed the spool: done
                pass
            os._exit(0)
    else:
        raise ValueError(f"unknown kind {kind!r}")
    return path


def signal_after(delay_s: float, sig: int) -> None:
    """Send ``sig`` to this process's parent (the recorder) ``delay_s`` after it exits, from a
    detached child: the recorder is then reading the spool, its command ended."""
    recorder = os.getppid()
    if os.fork() == 0:
        os.setsid()
        time.sleep(delay_s)
        try:
            os.kill(recorder, sig)
        except ProcessLookupError:
            pass
        os._exit(0)


def main(argv: list[str]) -> int:
    kind, size, target, endfile = argv[0], int(argv[1]), argv[2], argv[3]
    spool = os.environ["COUNTERD_SPOOL"]
    if kind.startswith("signal "):  # "signal SIGTERM": junk to read, then the signal
        write_junk(os.path.join(spool, "1.jsonl"), size)
        signal_after(SIGNAL_AFTER_S, int(getattr(signal, kind.split()[1])))
    else:
        plant(spool, kind, size, target)
    with open(endfile, "w") as f:
        f.write(repr(time.monotonic()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
