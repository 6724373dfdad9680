"""SCIP (pyscipopt). Pyomo drives it through pyomo.contrib.solver's `scip_direct`, cvxpy as
``SCIP`` (its parameters go in one `scip_params` dict there). One thread: `threads` is
dropped with a note."""
from __future__ import annotations

import numpy as np

from .base import CvxpyAnswer, NativeOptions, SolverAdapter
from .status import INF_OR_UNBD, INFEASIBLE, LIMIT, OPTIMAL, UNBOUNDED, RawResult, termination

# SCIP status strings (Model.getStatus()) -> termination
TERMINATION = {
    "optimal": OPTIMAL, "gaplimit": OPTIMAL, "infeasible": INFEASIBLE,
    "unbounded": UNBOUNDED, "inforunbd": INF_OR_UNBD, "timelimit": LIMIT,
    "nodelimit": LIMIT, "totalnodelimit": LIMIT, "stallnodelimit": LIMIT,
    "sollimit": LIMIT, "bestsollimit": LIMIT, "restartlimit": LIMIT,
    "memlimit": LIMIT, "userinterrupt": LIMIT,
}
INFINITY = 1e19  # SCIP's default infinity: a bound beyond it is none


class Scip(SolverAdapter):
    def options(self, backend, time_limit, gap, threads) -> NativeOptions:
        params: dict = {"limits/absgap": 0.0}
        notes = []
        if time_limit is not None:
            params["limits/time"] = float(time_limit)
        if gap is not None:
            params["limits/gap"] = float(gap)
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
               doc="SCIP (pyscipopt)")
