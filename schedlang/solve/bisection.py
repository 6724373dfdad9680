"""The smallest budget that admits a plan, by bisection: one home for `schedlang solve` (an
infeasible budget, exit 3) and `schedlang.pytorch.fit` (a `FitError`).

`smallest_feasible(feasible, low, high)` takes a predicate (a solve at a budget that says
whether a plan exists), a budget known to be infeasible (`low`) and one to try as feasible
(`high`), and halves the interval until it is within `rel` of the answer (or `max_steps`
predicates ran); each step is a progress step (`schedlang.progress`, phase ``bisection``).
`explain_infeasible` is the `solve` side: the same problem moved to each budget (lowered once,
`schedlang.compile.parametric`), each solve stopping at its first plan (a feasibility question), the
heuristic planners' plan as its start.
"""
from __future__ import annotations

from .. import progress, sweep
from ..compile.parametric import BudgetLowering
from ..language.units import format_size
from .solution import Status

__all__ = ["explain_infeasible", "smallest_feasible"]


def smallest_feasible(feasible, low: int, high: int, rel: float = 0.03, min_step: int = 1024,
                      max_steps: int = 8, first=None, shown_offset: int = 0) -> int | None:
    """The smallest budget found feasible between an infeasible `low` and `high` (within
    `rel` of it, or `min_step` bytes; at most `max_steps` calls of `feasible`), or None when
    `high` is not feasible. `first(high)`: the predicate of the first step, when it differs
    (fit's full solve, whose plan it keeps). `shown_offset`: bytes the progress lines add to
    each budget (fit bisects activation bytes; its user reads whole budgets)."""
    with progress.phase("bisection", total=max_steps):
        def shown(b):
            return format_size(b + shown_offset)

        progress.step(1, shown(high))
        if not (first or feasible)(high):
            return None
        best, steps = high, 1
        while best - low > max(rel * best, min_step) and steps < max_steps:
            steps += 1
            mid = (low + best) // 2
            progress.step(steps, f"{shown(mid)}, between {shown(low)} (no plan) "
                                 f"and {shown(best)} (a plan)")
            if feasible(mid):
                best = mid
            else:
                low = mid
    return best


def explain_infeasible(prob, budget: int, backend: str = "pyomo", solver: str = "highs",
                       time_limit: float | None = None, rel: float = 0.01,
                       max_steps: int = 12) -> tuple[int | None, int | None]:
    """(the smallest feasible peak budget found, the no-recomputation peak) of a checked and
    lowered `Problem` that is infeasible at `budget`; (None, peak) when not even the
    no-recomputation peak is (another constraint binds), (None, None) without graph data.
    Each step's solve gets `time_limit` (default 60 s) and stops at its first plan."""
    if prob.graph is None:
        return None, None
    ref_peak, _ = sweep.reference(prob.graph)
    if not ref_peak or ref_peak <= budget:
        return None, ref_peak
    lowering = BudgetLowering(prob.program, {**prob.program.budgets, "peak": int(ref_peak)},
                              prob.max_elements)
    limit = 60.0 if time_limit is None else time_limit

    def feasible(b: int) -> bool:
        point = sweep.solve_at(prob.program, b, backend=backend, solver=solver, time_limit=limit,
                         gap=1.0, lowering=lowering, warm_start="auto",
                         max_elements=prob.max_elements)
        return point.status in (Status.OPTIMAL, Status.FEASIBLE)

    return smallest_feasible(feasible, budget, ref_peak, rel=rel, max_steps=max_steps), ref_peak
