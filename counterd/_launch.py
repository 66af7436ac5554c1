"""Exec shim for ``counterd record``: say ready, wait for the go byte, then exec the command.

The recorder starts this shim (as a script, with ``python -S``: it imports nothing but os and
sys, so it starts fast and touches no counter), waits until it reports ready (it is then
blocked in read(2)), attaches counters to its pid (with inherit, so every process the command
creates is counted) and takes the start reading, then writes the go byte; the shim execs the
command. So the whole command is counted from its first instruction and nothing before it.
Usage: python -S _launch.py READY_FD GO_FD CMD [ARGS...]
"""

import os
import sys


def main() -> None:
    ready, go = int(sys.argv[1]), int(sys.argv[2])
    cmd = sys.argv[3:]
    os.write(ready, b"r")
    os.close(ready)
    if os.read(go, 1) != b"g":  # the recorder gave up: do not run the command
        os._exit(125)
    os.close(go)
    try:
        os.execvp(cmd[0], cmd)
    except OSError as exc:
        sys.stderr.write(f"counterd record: cannot run {cmd[0]}: {exc.strerror}\n")
        os._exit(127)


if __name__ == "__main__":
    main()
