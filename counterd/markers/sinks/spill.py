"""Records a program could not hand to the daemon: one private spool file per process, which
``counterd import`` (:mod:`counterd.commands.importing`) sends on later.

A :class:`~counterd.markers.sinks.socket.SocketSink` holds at most ``high_water`` unacknowledged
records in memory; beyond that, and at exit for whatever the daemon has not acknowledged, it
appends them here, in the marker spool format (:mod:`counterd.wire.spool`, ``record`` lines), so
that nothing is lost when the daemon is down or stuck. The directory is private (0700, owned
by the user; a directory that is not is never used, since another user could read or plant
records there) and each file is 0600.
"""

from __future__ import annotations

import logging
import os
import stat
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from counterd.data.env import ENV_SPILL
from counterd.data.records import SuperstepRecord
from counterd.markers.sinks.base import as_record
from counterd.wire import spool

if TYPE_CHECKING:
    from counterd.markers.step import Step

log = logging.getLogger("counterd.markers")


def default_dir() -> Path:
    """``$COUNTERD_SPILL``, else ``$XDG_RUNTIME_DIR/counterd-spill`` (a per-user tmpfs under
    systemd), else ``<temp dir>/counterd-spill-<uid>``."""
    env = os.environ.get(ENV_SPILL)
    if env:
        return Path(env)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return Path(runtime) / "counterd-spill"
    return Path(tempfile.gettempdir()) / f"counterd-spill-{os.getuid()}"


def _private_dir(directory: Path) -> Path:
    """``directory``, created 0700 if missing; OSError if it is not ours alone."""
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise PermissionError(f"{directory} is not a directory private to uid {os.getuid()}")
    return directory


class SpillFile:
    """The spill file of one process, created at the first record spilled.

    ``write`` returns False when the file cannot be written (the caller keeps the records in
    memory then: a full disk never loses a record that memory can still hold).
    """

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory
        self.path: Path | None = None
        self.records = 0  # written so far
        self._fd: int | None = None
        self._failed: str | None = None  # why the file cannot be written (logged once)

    def _open(self) -> int:
        if self._fd is not None:
            return self._fd
        wanted = self.directory or default_dir()
        try:
            directory = _private_dir(wanted)
        except OSError as exc:  # planted by someone else, or not creatable: a fresh private one
            log.info("spill directory %s unusable (%s); using a new one", wanted, exc)
            directory = Path(tempfile.mkdtemp(prefix="counterd-spill-"))
        path = directory / f"{os.getpid()}-{time.time_ns()}.jsonl"
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND
                           | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        self.path = path
        return self._fd

    def write(self, items: Sequence[SuperstepRecord | Step]) -> bool:
        """Append ``items`` (one ``write(2)`` per record: a kill leaves whole lines)."""
        try:
            fd = self._open()
            for item in items:
                os.write(fd, spool.encode_line(spool.RECORD, as_record(item).to_json()))
                self.records += 1
        except (OSError, ValueError) as exc:
            if self._failed is None:
                log.warning("cannot write the counterd spill file in %s (%s): records stay "
                            "in memory", self.directory or default_dir(), exc)
            self._failed = str(exc)
            return False
        return True

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
