"""Progress of a running solve: incumbent, bound, gap, elapsed, fed by solver callbacks.

A backend that can hear from its solver while it runs (HiGHS from the IR or through the
Pyomo backend's `stdform_highs` driver, by its MIP callback; CP-SAT) calls
``run.progress(Progress(...))`` now and then; by default that is
`schedlang.progress.solver_callback`, which shows `Progress.line` as the ``solving`` phase of
the running command (a live line on a terminal, plain lines otherwise; ``--quiet``: none).
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Progress:
    incumbent: float | None  # the best objective found so far (None: none yet)
    bound: float | None  # the best proven bound
    gap: float | None  # relative gap between them, as the solver computes it
    elapsed: float  # seconds since the solve started
    nodes: int | None = None  # branch-and-bound nodes explored

    def line(self) -> str:
        def num(v):
            return "-" if v is None or not math.isfinite(v) else f"{v:.6g}"
        gap = "-" if self.gap is None or not math.isfinite(self.gap) else f"{100 * self.gap:.3g}%"
        nodes = f"  nodes {self.nodes}" if self.nodes is not None else ""
        return (f"solving   incumbent {num(self.incumbent)}  bound {num(self.bound)}  "
                f"gap {gap}{nodes}  {self.elapsed:.1f} s")
