"""Every path a user gives, checked before it is used: a located error, never a traceback.

Files read (a `.sched` file and what it `use`s, `--graph`, a plan, a checkmate-nx graph, a
`--resume` stream, a module of `run`/`trace`) go through `read_text` or `readable_file`;
files written (`-o`, `--plan-out`, `--plot`, `--trace`, `--out`, `--graph-out`) are checked
by `writable_file` before the work that produces them starts (then written by
`schedlang.language.files`, atomically); a folder (``SCHEDLANG_CACHE_DIR``) by `writable_folder`. What
each refuses, with the reason in the message: a name too long for the file system, a folder
where a file is wanted (or the reverse), a FIFO, socket or device (reading one would block or
never end), a missing parent folder, and what the process may not read or write. The error's
location is where the path came from: the `use` statement, or the option (``--plan-out``)
when no file holds it.
"""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from .errors import DataError, Loc

__all__ = ["exists", "read_text", "readable_file", "writable_file", "writable_folder"]


def _why(exc: OSError) -> str:
    if exc.errno == errno.ENAMETOOLONG:
        return "the name is too long for the file system"
    if exc.errno == errno.ENOENT:
        return "no such file"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    if exc.errno == errno.ENOTDIR:
        return "a part of the path is a file, not a folder"
    if exc.errno == errno.ELOOP:
        return "too many symbolic links"
    return exc.strerror or str(exc)


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def _short(path) -> str:
    text = str(path)
    return text if len(text) <= 120 else f"{text[:60]}...{text[-40:]} ({len(text)} characters)"


def _loc(path, loc: Loc | None) -> Loc:
    if loc is not None:
        return loc
    return Loc(_short(path)) if str(path) else Loc("(an empty file name)")


def exists(path) -> bool:
    """`Path.exists` that answers False, rather than raising, for a name the system refuses."""
    try:
        os.stat(path)
    except (OSError, ValueError):
        return False
    return True


def readable_file(path, loc: Loc | None = None, what: str = "file") -> Path:
    """`path` as a `Path`, or a `DataError` saying why it cannot be read as a file (located
    at `loc`, the path named in the message; else at the path itself)."""
    p = Path(path)
    if not str(path):
        raise DataError(f"the {what} name is empty", _loc(path, loc))

    def fail(why: str):
        if loc is None:
            return DataError(why, _loc(path, None))
        return DataError(f"cannot read {what} '{_short(path)}': {why}", loc)
    try:
        st = os.stat(p)
    except (OSError, ValueError) as exc:
        why = _why(exc) if isinstance(exc, OSError) else "the name holds a NUL character"
        raise fail(why) from None
    if not stat.S_ISREG(st.st_mode):
        raise fail(f"it is {_kind(st.st_mode)}, not a file")
    if not os.access(p, os.R_OK):
        raise fail("permission denied")
    return p


def read_text(path, loc: Loc | None = None, what: str = "file") -> str:
    """The UTF-8 text of a file, or a located `DataError` (see `readable_file`)."""
    p = readable_file(path, loc, what)
    where = _loc(path, loc)
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"cannot read {what} {_short(path)}: not UTF-8 text ({exc.reason})",
                        where) from None
    except OSError as exc:
        raise DataError(f"cannot read {what} {_short(path)}: {_why(exc)}", where) from None


def writable_file(path, loc: Loc | None = None, what: str = "file") -> Path:
    """`path` as a `Path` when a file can be written there (replaced, if one is), else a
    `DataError` saying why; nothing is created."""
    p = Path(path)
    where = _loc(path, loc)
    if not str(path):
        raise DataError(f"cannot write the {what}: the name is empty", where)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        st = None
    except (OSError, ValueError) as exc:
        why = _why(exc) if isinstance(exc, OSError) else "the name holds a NUL character"
        raise DataError(f"cannot write the {what} to {_short(path)}: {why}", where) from None
    if st is not None:
        if not stat.S_ISREG(st.st_mode):
            raise DataError(f"cannot write the {what} to {_short(path)}: it is "
                            f"{_kind(st.st_mode)}", where)
        if not os.access(p, os.W_OK):
            raise DataError(f"cannot write the {what} to {_short(path)}: permission denied",
                            where)
    elif len(p.name.encode()) > _name_max(p.parent):
        raise DataError(f"cannot write the {what} to {_short(path)}: the name is too long for "
                        "the file system", where)
    parent = p.parent
    try:
        pst = os.stat(parent)
    except OSError as exc:
        why = "folder does not exist" if exc.errno == errno.ENOENT else _why(exc)
        raise DataError(f"cannot write the {what} to {_short(path)}: {why} "
                        f"({_short(parent)})", where) from None
    if not stat.S_ISDIR(pst.st_mode):
        raise DataError(f"cannot write the {what} to {_short(path)}: {_short(parent)} is not a "
                        "folder", where)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise DataError(f"cannot write the {what} to {_short(path)}: folder {_short(parent)} "
                        "is not writable", where)
    return p


def writable_folder(path, loc: Loc | None = None, what: str = "folder") -> Path:
    """`path` as a folder files can be written in, made (with its parents) if missing; else a
    `DataError` saying why."""
    p = Path(path)
    where = _loc(path, loc)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise DataError(f"cannot use {_short(path)} as the {what}: it is a file, not a folder",
                        where) from None
    except (OSError, ValueError) as exc:
        why = _why(exc) if isinstance(exc, OSError) else "the name holds a NUL character"
        raise DataError(f"cannot use {_short(path)} as the {what}: {why}", where) from None
    if not os.access(p, os.W_OK | os.X_OK):
        raise DataError(f"cannot use {_short(path)} as the {what}: it is not writable", where)
    return p


def _name_max(folder: Path) -> int:
    try:
        return os.pathconf(folder if exists(folder) else ".", "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        return 255
