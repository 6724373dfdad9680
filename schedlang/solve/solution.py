"""One normalized solver result, whatever the backend and solver (cf. MathOptInterface)."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import numpy as np


class Status(str, Enum):
    OPTIMAL = "optimal"  # proven within the requested gap
    FEASIBLE = "feasible"  # a solution, stopped by a limit; see gap
    INFEASIBLE = "infeasible"
    UNBOUNDED = "unbounded"
    NO_SOLUTION = "no_solution"  # a limit was hit before any solution
    ERROR = "error"

    @property
    def has_solution(self) -> bool:
        return self in (Status.OPTIMAL, Status.FEASIBLE)


# Exit codes of `schedlang solve` per status (docs/cli.md's commands table).
EXIT_CODES = {
    Status.OPTIMAL: 0,
    Status.FEASIBLE: 0,
    Status.INFEASIBLE: 3,
    Status.UNBOUNDED: 3,
    Status.NO_SOLUTION: 4,
    Status.ERROR: 5,
}


@dataclass
class Solution:
    status: Status
    objective: float | None = None
    bound: float | None = None
    gap: float | None = None  # relative: |obj - bound| / max(|obj|, tiny)
    x: np.ndarray | None = None  # values of every column of the original IRModel
    backend: str = ""
    solver: str = ""
    message: str = ""
    timings: dict[str, float] = field(default_factory=dict)  # "presolve", "build", "solve"
    model_size: dict[str, int] = field(default_factory=dict)  # what the solver was given
    # a MIP start was given and not passed to the solver (the message says why)
    warm_start_ignored: bool = False
