"""The smallest budget that admits a plan, by bisection: one home for `schedlang solve` (an
infeasible budget, exit 3) and `schedlang.pytorch.fit` (a `FitError`).

`bisect_budget(feasible, low, high)` takes a predicate (a solve at a budget that says whether a
plan exists: True, False, or None when it does not know, its time having run out), a budget
known to be infeasible (`low`) and one to try as feasible (`high`), and halves the interval
until it is within `rel` of the answer, `max_steps` predicates ran, the `deadline` passed, or a
predicate did not know; each step is a progress step (`schedlang.progress`, phase
``bisection``). A budget whose solve ran out of time is neither feasible nor infeasible: the
bisection stops there and says so (`Bisection.stopped`), it never moves its infeasible side
on it. `smallest_feasible` is the same, its answer only (fit's side).

`explain_infeasible` is the `solve` side: the same problem moved to each budget (lowered once,
`schedlang.compile.parametric`), each solve stopping at its first plan (a feasibility question),
the heuristic planners' plan as its start, all of them within the command's deadline (each
solve gets the time left, `--time-limit` bounds the whole command).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from .. import progress, sweep
from ..compile.parametric import BudgetLowering
from ..language.units import format_size
from .solution import Status

__all__ = ["ANY_PLAN_GAP", "Bisection", "bisect_budget", "explain_infeasible",
           "smallest_feasible"]

#: the relative gap of a probe: it asks only whether a plan exists, and every incumbent is
#: within 100% of a non-negative bound, so the solver stops at the first plan it finds
ANY_PLAN_GAP = 1.0
#: a probe is not started with less time than this left before the deadline (seconds): it
#: could only end without an answer
LEAST_PROBE_SECONDS = 0.5
#: each probe's time limit without a deadline (seconds)
PROBE_SECONDS = 60.0


@dataclass
class Bisection:
    """What a bisection found: `best`, the smallest budget with a plan (None: none found);
    `infeasible`, the largest budget proven to have none; `stopped`, why it ended before
    `rel` (None: it narrowed the interval as asked, or ran its `max_steps`)."""

    best: int | None
    infeasible: int
    stopped: str | None = None


def bisect_budget(feasible, low: int, high: int, rel: float = 0.03, min_step: int = 1024,
                  max_steps: int = 8, first=None, deadline: float | None = None,
                  shown_offset: int = 0) -> Bisection:
    """The smallest budget found feasible between an infeasible `low` and `high` (module
    docstring). `first(high)`: the predicate of the first step, when it differs (fit's full
    solve, whose plan it keeps); `deadline`: a `time.monotonic()` after which no step starts;
    `shown_offset`: bytes the progress lines add to each budget (fit bisects activation
    bytes; its user reads whole budgets)."""
    out = Bisection(None, low)

    def shown(b: int) -> str:
        return format_size(b + shown_offset)

    def out_of_time() -> bool:
        return deadline is not None and deadline - time.monotonic() < LEAST_PROBE_SECONDS

    with progress.phase("bisection", total=max_steps):
        if out_of_time():
            out.stopped = "the time limit was spent before the first solve"
            return out
        progress.step(1, shown(high))
        answer = (first or feasible)(high)
        if answer is None:
            out.stopped = f"the solve at {shown(high)} ran out of time without a plan"
            return out
        if not answer:
            return out
        out.best, steps = high, 1
        while out.best - out.infeasible > max(rel * out.best, min_step) and steps < max_steps:
            if out_of_time():
                out.stopped = "the time limit"
                break
            steps += 1
            mid = (out.infeasible + out.best) // 2
            progress.step(steps, f"{shown(mid)}, between {shown(out.infeasible)} "
                                 f"(no plan) and {shown(out.best)} (a plan)")
            answer = feasible(mid)
            if answer is None:  # not a proof either way: the interval stays as it is
                out.stopped = f"the solve at {shown(mid)} ran out of time"
                break
            if answer:
                out.best = mid
            else:
                out.infeasible = mid
    return out


def smallest_feasible(feasible, low: int, high: int, rel: float = 0.03, min_step: int = 1024,
                      max_steps: int = 8, first=None, shown_offset: int = 0) -> int | None:
    """`bisect_budget`'s smallest feasible budget found, or None when `high` is not feasible."""
    return bisect_budget(feasible, low, high, rel, min_step, max_steps, first,
                         shown_offset=shown_offset).best


def explain_infeasible(prob, budget: int, backend: str = "pyomo", solver: str = "highs",
                       time_limit: float | None = None, rel: float = 0.01,
                       max_steps: int = 12,
                       deadline: float | None = None) -> tuple[Bisection | None, int | None]:
    """(the bisection, the no-recomputation peak) of a checked and lowered `Problem` that is
    infeasible at `budget`: its `best` None when not even the no-recomputation peak admits a
    plan (another constraint binds) unless it `stopped` early; (None, peak) when the budget is
    not below that peak, (None, None) without graph data. With a `deadline`
    (`time.monotonic()`), each step's solve gets the time left before it (no step starts
    without `LEAST_PROBE_SECONDS`); without one, `time_limit` (default `PROBE_SECONDS`) each.
    Each stops at its first plan."""
    if prob.graph is None:
        return None, None
    ref_peak, _ = sweep.reference(prob.graph)
    if not ref_peak or ref_peak <= budget:
        return None, ref_peak
    lowering = BudgetLowering(prob.program, {**prob.program.budgets, "peak": int(ref_peak)},
                              prob.max_elements)

    def feasible(b: int) -> bool | None:
        limit = probe_limit(time_limit, deadline)
        point = sweep.solve_at(prob.program, b, backend=backend, solver=solver, time_limit=limit,
                               gap=ANY_PLAN_GAP, lowering=lowering, warm_start="auto",
                               max_elements=prob.max_elements)
        if point.status in (Status.OPTIMAL, Status.FEASIBLE):
            return True
        return False if point.status == Status.INFEASIBLE else None

    return bisect_budget(feasible, budget, ref_peak, rel=rel, max_steps=max_steps,
                         deadline=deadline), ref_peak


def probe_limit(time_limit: float | None, deadline: float | None) -> float:
    """One probe's time limit: what is left before `deadline`, else `time_limit` (default
    `PROBE_SECONDS`)."""
    if deadline is not None:
        return max(LEAST_PROBE_SECONDS, deadline - time.monotonic())
    return PROBE_SECONDS if time_limit is None else time_limit
