"""What a command prints on stdout with ``--json``: exactly one JSON object (or list) per run.

A command prints its answer with `print_json`; `main` prints `error_object` for a run that
ends in an error (bad input, an unavailable solver, Ctrl-C, a bug) when nothing was printed
yet, so that whatever happens a ``--json`` run gives one parsable document on stdout and the
same exit code as without ``--json``.
"""
from __future__ import annotations

import json

from ..language.errors import NOWHERE, ErrorList, SchedError

_printed: list[bool] = [False]


def reset() -> None:
    """A new run of `main` (tests run several in one process)."""
    _printed[0] = False


def printed() -> bool:
    return _printed[0]


def print_json(obj, **kwargs) -> None:
    """`obj` as one line of JSON on stdout, flushed (the run's answer)."""
    print(json.dumps(obj, **kwargs), flush=True)
    _printed[0] = True


def error_object(message: str, location: str | None, exit_code: int, kind: str = "error",
                 notes: list[str] | None = None) -> dict:
    """The ``--json`` object of a run that ended in an error."""
    out: dict[str, object] = {"status": "error", "kind": kind, "message": message, "location": location,
           "exit_code": exit_code}
    if notes:
        out["notes"] = list(notes)
    return out


def print_error(exc, exit_code: int) -> None:
    """`exc` (a `SchedError`, or anything else: a bug) as the run's one JSON object, unless
    the run printed its answer already."""
    if printed():
        return

    if isinstance(exc, ErrorList) and exc.errors:
        first = exc.errors[0]
        obj = error_object(first.message, _where(first.loc), exit_code,
                           notes=[str(e) for e in exc.errors[1:]])
    elif isinstance(exc, SchedError):
        obj = error_object(exc.message, _where(exc.loc), exit_code, notes=exc.notes)
    else:
        obj = error_object(f"{type(exc).__name__}: {exc}", None, exit_code, kind="internal")
    try:
        print_json(obj)
    except (OSError, ValueError):  # stdout closed: nothing more to do
        pass


def _where(loc) -> str | None:
    return None if loc is None or loc == NOWHERE else str(loc)
