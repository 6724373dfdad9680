"""Every file schedlang writes goes through here: written whole or not at all.

The text goes to a temporary file in the target's folder, is flushed to disk, and then replaces
the target with `os.replace` (atomic on POSIX and Windows within one file system). A process
killed or failing mid-write leaves the old file as it was (and at worst a `.NAME.*.tmp` beside
it when killed by SIGKILL); a finished write is never half a file. Streams that grow line by
line (`sweep --out FILE.jsonl`) are appended and flushed per line instead: see `sweep.py`.
"""
from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

from .errors import DataError, Loc
from .paths import writable_file


@contextlib.contextmanager
def atomic_open(path, mode: str = "w", encoding: str = "utf-8"):
    """A file object whose content replaces `path` when the block ends without an exception.
    An `OSError` (no such folder, disk full, no permission) becomes a located `DataError`."""
    path = Path(path)
    binary = "b" in mode
    try:  # a FIFO, a device or a folder is not replaced by a file
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            writable_file(path)  # says what it is
    except (OSError, ValueError):
        pass  # no such file (yet): written below; a bad name fails below, located
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise _cannot(path, exc) from None
    try:
        with os.fdopen(fd, mode, encoding=None if binary else encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _mode_for(path))
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise _cannot(path, exc) from None
        raise


def write_file(path, data: str | bytes, encoding: str = "utf-8") -> None:
    """Write `data` (text or bytes) to `path` atomically (see the module docstring)."""
    with atomic_open(path, "wb" if isinstance(data, bytes) else "w", encoding) as f:
        f.write(data)


def _mode_for(path: Path) -> int:
    """The permissions the file would get from a plain open(): the old file's, else the umask's."""
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        mask = os.umask(0)
        os.umask(mask)
        return 0o666 & ~mask


def _cannot(path: Path, exc: OSError) -> DataError:
    return DataError(f"cannot write {path}: {exc.strerror or exc}", Loc(str(path)))
