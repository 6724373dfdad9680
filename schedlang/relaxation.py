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
import scipy.sparse as sp

from .ir import IRModel


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
    inf = highspy.kHighsInf

    def finite(v):
        return np.clip(np.asarray(v, dtype=float), -inf, inf)

    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = ir.n_columns, A.shape[0]
    lp.col_cost_ = np.asarray(c, dtype=float)
    lp.col_lower_, lp.col_upper_ = finite(lb), finite(ub)
    lp.row_lower_, lp.row_upper_ = finite(lo), finite(hi)
    lp.sense_ = highspy.ObjSense.kMaximize if sense == "max" else highspy.ObjSense.kMinimize
    csc = sp.csc_matrix(A)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = csc.indptr.astype(np.int32)
    lp.a_matrix_.index_ = csc.indices.astype(np.int32)
    lp.a_matrix_.value_ = csc.data.astype(float)
    if not relax:
        lp.integrality_ = [highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous
                           for i in ir.integrality()]
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
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
