"""Source locations and the typed errors every stage raises.

Every user-facing problem is a `SchedError` carrying a `Loc`; the CLI prints it as
``path:line:col: error: message`` and exits with the error's `exit_code`. Nothing below the
CLI prints or exits.
"""
from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Loc:
    """A position in a source file (1-based line and column)."""

    path: str = "<input>"
    line: int = 0
    col: int = 0

    def __str__(self) -> str:
        if self.line:
            return f"{self.path}:{self.line}:{self.col}"
        return self.path


NOWHERE = Loc("<schedlang>", 0, 0)


class SchedError(Exception):
    """A problem in user input (exit code 2 unless a subclass says otherwise)."""

    exit_code = 2
    kind = "error"

    def __init__(self, message: str, loc: Loc | None = None, notes: list[str] | None = None):
        super().__init__(message)
        self.message = message
        self.loc = loc or NOWHERE
        self.notes = list(notes or [])

    def __str__(self) -> str:
        text = f"{self.loc}: {self.kind}: {self.message}"
        for note in self.notes:
            text += f"\n{self.loc}: note: {note}"
        return text


class SyntaxProblem(SchedError):
    """The text does not follow the grammar."""


class CheckError(SchedError):
    """Names, arity, types, units or domains are wrong."""


class DataError(SchedError):
    """Graph data is inconsistent (cycles, unknown nodes, domain violations, missing budget)."""


class SolverUnavailable(SchedError):
    """The requested solver (or backend) is not installed or cannot be driven by the backend."""

    exit_code = 5


class LintWarning(SchedError):
    """Legal but likely not what was meant: printed (``path:line:col: warning: ...``), never raised."""

    kind = "warning"


class ErrorList(SchedError):
    """Several independent problems found in one pass (the checker reports them all)."""

    def __init__(self, errors: Sequence[SchedError]):
        super().__init__(errors[0].message if errors else "", errors[0].loc if errors else None)
        self.errors = list(errors)
        self.exit_code = max((e.exit_code for e in errors), default=2)

    def __str__(self) -> str:
        return "\n".join(str(e) for e in self.errors)


def did_you_mean(name: str, candidates) -> str:
    """A ' (did you mean 'x'?)' suffix, or '' when nothing is close."""
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""
