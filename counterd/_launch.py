"""Exec shim for ``counterd record``: wait for the go byte on a descriptor, then exec.

The recorder starts this shim, attaches counters to its pid (with inherit, so every process
the command creates is counted), then writes one byte; the shim execs the command. So the
whole command is counted from its first instruction, with no race against a fast exit.
Usage: python -m counterd._launch FD CMD [ARGS...]
"""

import os
import sys


def main() -> None:
    fd = int(sys.argv[1])
    cmd = sys.argv[2:]
    if os.read(fd, 1) != b"g":  # the recorder gave up: do not run the command
        os._exit(125)
    os.close(fd)
    try:
        os.execvp(cmd[0], cmd)
    except OSError as exc:
        sys.stderr.write(f"counterd record: cannot run {cmd[0]}: {exc.strerror}\n")
        os._exit(127)


if __name__ == "__main__":
    main()
