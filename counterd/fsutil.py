"""File helpers shared by every writer: atomic replace, never a half-written result."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from counterd.errors import BadInput


def atomic_write_text(path: Path, text: str, *, overwrite: bool = True) -> None:
    """Write ``text`` to ``path`` via a temp file in the same directory and rename.

    Raises BadInput (with the OS reason and a fix) if the directory is missing or unwritable or
    the disk is full; the temp file is removed, the old file (if any) is left untouched.
    """
    path = Path(path)
    if not overwrite and path.exists():
        raise BadInput(f"{path} exists", "choose another --out or remove the file first")
    directory = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise BadInput(f"cannot write {path}: {exc.strerror}",
                       "choose a writable directory for --out") from exc
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise BadInput(f"cannot write {path}: {exc.strerror}",
                       "free space on the disk or choose another --out") from exc
