"""SCIP (pyscipopt). Pyomo drives it through pyomo.contrib.solver's `scip_direct`, cvxpy as
``SCIP`` (its parameters go in one `scip_params` dict there). One thread: `threads` is
dropped with a note."""
from __future__ import annotations

import numpy as np

from ..status import INF_OR_UNBD, INFEASIBLE, LIMIT, OPTIMAL, UNBOUNDED, RawResult, by_termination, termination
from .base import CvxpyAnswer, NativeOptions, SolverAdapter, spell

# SCIP status strings (Model.getStatus()) -> termination
TERMINATION = by_termination({
    OPTIMAL: "optimal gaplimit", INFEASIBLE: "infeasible", UNBOUNDED: "unbounded",
    INF_OR_UNBD: "inforunbd",
    LIMIT: "timelimit nodelimit totalnodelimit stallnodelimit sollimit bestsollimit "
           "restartlimit memlimit userinterrupt",
})
INFINITY = 1e19  # SCIP's default infinity: a bound beyond it is none


class Scip(SolverAdapter):
    def options(self, backend, time_limit, gap, threads) -> NativeOptions:
        params = spell(("limits/time", "limits/gap", None), time_limit, gap, None,
                       **{"limits/absgap": 0.0})
        notes = []
        if threads is not None:
            notes.append("scip solves with one thread; the threads option was ignored")
        return NativeOptions({"scip_params": params} if backend == "cvxpy" else params, notes)

    def read_cvxpy(self, ans: CvxpyAnswer) -> RawResult:
        st = ans.raw.get("scip_status", "")
        model = ans.raw.get("model")
        bound = None
        if model is not None:
            try:
                b = model.getDualbound()
                if np.isfinite(b) and abs(b) < INFINITY:
                    bound = ans.model_value(b)
            except Exception:
                bound = None
        return RawResult(termination(TERMINATION, st),
                         x=ans.x_value() if "primal" in ans.raw else None,
                         bound=bound, detail=f"SCIP {st}")


ADAPTER = Scip("scip", 0.0, ("scip_direct",), "SCIP", warm_start=frozenset({"pyomo"}),
               doc="SCIP (pyscipopt)", install=(("*", "pip install pyscipopt"),))
