"""Gurobi (gurobipy). Pyomo drives it through pyomo.contrib.solver's `gurobi_direct`, cvxpy
as ``GUROBI``.

Quirks: a size-limited licence refuses models over 2000 variables or rows; through cvxpy the
refusal is hidden (the model stays LOADED), and `read_cvxpy` says why.
"""
from __future__ import annotations

import numpy as np

from ..status import ERROR, INF_OR_UNBD, INFEASIBLE, LIMIT, OPTIMAL, UNBOUNDED, RawResult, by_termination, termination
from .base import CvxpyAnswer, NativeOptions, SolverAdapter, spell

SIZE_LIMIT = 2000  # variables or rows a size-limited licence allows

# gurobipy.GRB status constant names -> termination
TERMINATION = by_termination({
    OPTIMAL: "OPTIMAL", INFEASIBLE: "INFEASIBLE", INF_OR_UNBD: "INF_OR_UNBD",
    UNBOUNDED: "UNBOUNDED", ERROR: "NUMERIC",
    LIMIT: "TIME_LIMIT ITERATION_LIMIT NODE_LIMIT SOLUTION_LIMIT INTERRUPTED USER_OBJ_LIMIT "
           "WORK_LIMIT MEM_LIMIT SUBOPTIMAL CUTOFF",
})


class Gurobi(SolverAdapter):
    def options(self, backend, time_limit, gap, threads) -> NativeOptions:
        return NativeOptions(spell(("TimeLimit", "MIPGap", "Threads"), time_limit, gap, threads,
                                   MIPGapAbs=0.0))

    def read_cvxpy(self, ans: CvxpyAnswer) -> RawResult:
        import gurobipy as gp

        model = ans.raw.get("model")
        if model is None:
            return super().read_cvxpy(ans)
        G = gp.GRB
        st = model.Status
        if st == G.LOADED:  # optimize() raised inside cvxpy, which hides the GurobiError
            detail = "Gurobi did not optimize"
            if max(model.NumVars, model.NumConstrs) > SIZE_LIMIT:
                detail += (f" (the model has {model.NumVars} variables and {model.NumConstrs} "
                           f"constraints; a size-limited licence allows {SIZE_LIMIT})")
            return RawResult(ERROR, detail=detail)
        names = {getattr(G, k): k for k in TERMINATION if hasattr(G, k)}
        term = termination(TERMINATION, names.get(st, ""))
        solved = model.SolCount > 0
        bound = None
        try:
            if model.IsMIP and np.isfinite(model.ObjBound):
                bound = ans.model_value(model.ObjBound)
        except Exception:  # no bound attribute in this state
            bound = None
        return RawResult(term, x=ans.x_value() if solved else None,
                         objective=ans.model_value(model.ObjVal) if solved else None,
                         bound=bound, detail=f"Gurobi status {st}")


ADAPTER = Gurobi("gurobi", 1e-4, ("gurobi_direct",), "GUROBI",
                 warm_start=frozenset({"pyomo", "cvxpy"}),
                 doc=f"Gurobi (gurobipy); a size-limited licence caps models at {SIZE_LIMIT} "
                     "variables/rows",
                 install=(("*", "pip install gurobipy (a size-limited licence comes with it; "
                                "larger models need a Gurobi licence)"),))
