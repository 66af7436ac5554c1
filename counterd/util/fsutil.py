"""File helpers shared by every writer: atomic replace, never a half-written result."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from counterd.data.errors import BadInput

# tempfile.mkstemp's file: created, not opened, read-write, 0600 (see atomic_write_text)
_TEMP_FLAGS = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def umask() -> int:
    """The process's file-mode creation mask, read without changing it (Linux 4.7+ lists it
    in /proc/self/status; elsewhere it is set and restored at once)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _temp_beside(directory: Path, prefix: str, suffix: str) -> tuple[int, str]:
    """``tempfile.mkstemp(suffix, prefix, directory)`` without loading tempfile (which loads
    shutil and random, 3-4 ms out of every recording): a new file of a name nobody could have
    guessed, mode 0600; (fd, path)."""
    for _ in range(100):
        path = os.path.join(directory, prefix + os.urandom(8).hex() + suffix)
        try:
            return os.open(path, _TEMP_FLAGS, 0o600), path
        except FileExistsError:
            continue
    raise FileExistsError(f"no free name for {prefix}...{suffix} in {directory}")


def atomic_write_text(path: Path, text: str, *, overwrite: bool = True) -> None:
    """Write ``text`` to ``path`` via a temp file in the same directory and rename.

    The file gets the mode a plain ``open(path, "w")`` would give it (0666 less the umask;
    the temp file's own 0600 would otherwise stay). Raises BadInput (with the OS reason and a
    fix) if the directory is missing or unwritable or the disk is full; the temp file is
    removed, the old file (if any) is left untouched.
    """
    path = Path(path)
    if not overwrite and path.exists():
        raise BadInput(f"{path} exists", "choose another --out or remove the file first")
    directory = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = _temp_beside(directory, f".{path.name}.", ".tmp")
    except OSError as exc:
        raise BadInput(f"cannot write {path}: {exc.strerror}",
                       "choose a writable directory for --out") from exc
    try:
        os.fchmod(fd, 0o666 & ~umask())
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


MAX_LINE_BYTES = 1 << 24  # a record line or CSV row; counterd writes a few hundred bytes


def bounded_lines(path: str | Path, fix: str) -> Iterator[tuple[int, bytes]]:
    """(line number, line) of ``path``, read one at a time, so a file of any size is read in
    bounded memory; BadInput (with ``fix``) for an unreadable file or a line longer than
    :data:`MAX_LINE_BYTES`."""
    try:
        fh = Path(path).open("rb")
    except OSError as exc:
        raise BadInput(f"cannot read {path}: {exc.strerror}", fix) from None
    with fh:
        lineno = 0
        while line := fh.readline(MAX_LINE_BYTES + 1):
            lineno += 1
            if len(line) > MAX_LINE_BYTES:
                raise BadInput(f"{path}:{lineno}: line longer than {MAX_LINE_BYTES} bytes", fix)
            yield lineno, line
