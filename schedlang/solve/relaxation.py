"""HiGHS straight from the IR, for the algorithms that solve a model as a step of their own:
the LP relaxation (`planners.lp_rounding`: a lower bound and fractional values to round) and
the completion of a partly fixed point (`decoders.encode`: a plan fixes the decisions, the
solver fills in the model's bookkeeping columns).

These are not user-facing solves (`Problem.solve` / `backends.solve_ir` are): no presolve of
ours, no decoding, no time-limit watchdog; output off, HiGHS's thread scheduler as it is.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..compile.ir import IRModel
from .solvers.highs import highs_lp, quiet_highs


@dataclass
class HighsOutcome:
    status: str  # "optimal", "feasible" (a limit with an incumbent), "infeasible", "no_solution"
    x: np.ndarray | None
    objective: float | None  # of the IR's objective, sense included, constant added
    bound: float | None  # the dual bound (a MIP) or the LP optimum (a relaxation)


def highs_solve(ir: IRModel, lb: np.ndarray | None = None, ub: np.ndarray | None = None,
                relax: bool = False, time_limit: float | None = None,
                gap: float | None = None) -> HighsOutcome:
    """Solve `ir` with HiGHS, with column bounds `lb`/`ub` in place of the IR's (to fix
    columns), as an LP when `relax`."""
    import highspy


    A, lo, hi = ir.stacked()
    clb, cub = ir.column_bounds()
    lb = clb if lb is None else np.asarray(lb, dtype=float)
    ub = cub if ub is None else np.asarray(ub, dtype=float)
    c = ir.objective.c if ir.objective is not None else np.zeros(ir.n_columns)
    sense = ir.objective.sense if ir.objective is not None else "min"
    constant = ir.objective.constant if ir.objective is not None else 0.0
    # the constant is added to HiGHS's objective below, not passed as its offset
    lp = highs_lp(A, c, lb, ub, lo, hi, maximize=sense == "max",
                  integer=None if relax else ir.integrality())
    h = quiet_highs()
    if time_limit is not None:
        h.setOptionValue("time_limit", float(time_limit))
    if gap is not None:
        h.setOptionValue("mip_rel_gap", float(gap))
    h.passModel(lp)
    h.run()
    status = h.getModelStatus()
    info = h.getInfo()
    M = highspy.HighsModelStatus
    if status in (M.kInfeasible, M.kUnboundedOrInfeasible):
        return HighsOutcome("infeasible", None, None, None)
    has_x = info.primal_solution_status == 2  # kSolutionStatusFeasible
    x = np.asarray(h.getSolution().col_value) if has_x else None
    obj = float(info.objective_function_value) + constant if has_x else None
    if relax:
        bound = obj if status == M.kOptimal else None
    else:
        bound = float(info.mip_dual_bound) + constant if has_x or status == M.kOptimal else None
    if status == M.kOptimal:
        return HighsOutcome("optimal", x, obj, bound)
    return HighsOutcome("feasible" if has_x else "no_solution", x, obj, bound)


def lp_duals(ir: IRModel, time_limit: float | None = None, interrupts=None) -> np.ndarray | None:
    """The row duals of `ir`'s LP relaxation in min sense (a max objective negated), for
    `bounds.lagrangian_bound` / `cutoff_bounds`; None when HiGHS does not reach the LP
    optimum within `time_limit`. Any multipliers give a valid bound there, so the duals'
    accuracy only decides how tight it is. `interrupts` (a `solvers.highs.Interrupts`): the
    LP runs under it, so that Ctrl-C / SIGTERM or its deadline stop it (its `requested` /
    `expired` then say so)."""
    import highspy


    if ir.objective is None or ir.n_rows == 0:
        return None
    A, lo, hi = ir.stacked()
    lb, ub = ir.column_bounds()
    c = ir.objective.c if ir.objective.sense == "min" else -ir.objective.c
    h = quiet_highs()
    if time_limit is not None:
        if time_limit <= 0:
            return None
        h.setOptionValue("time_limit", float(time_limit))
    h.passModel(highs_lp(A, c, lb, ub, lo, hi))
    if interrupts is None:
        h.run()
    else:
        h.cbSimplexInterrupt.subscribe(interrupts.check)
        h.cbIpmInterrupt.subscribe(interrupts.check)
        with interrupts.installed():
            interrupts.run(h)
        if interrupts.abandoned or interrupts.requested is not None:
            return None
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    y = np.asarray(h.getSolution().row_dual, dtype=float)
    return y if y.shape[0] == A.shape[0] and np.all(np.isfinite(y)) else None
