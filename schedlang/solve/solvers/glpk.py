"""GLPK: the `glpsol` binary through Pyomo's classic plugin, cvxopt (``GLPK_MI``) through
cvxpy. One thread, no absolute MIP gap, no bound reported by either driver.

Quirks: glpsol takes whole seconds, cvxopt milliseconds; glpsol's presolver leaves no
status in its solution file when it proves the LP infeasible or unbounded, and says which
in its log; Pyomo reports a stop on the requested MIP gap as a limit; cvxopt says
'feasible' for every stop on a limit, and 'undefined' (cvxpy: solver_error) for a limit
without a point.
"""
from __future__ import annotations

import math

from ..status import INF_OR_UNBD, INFEASIBLE, LIMIT, OPTIMAL, UNBOUNDED, UNKNOWN, RawResult
from .base import CvxpyAnswer, NativeOptions, SolverAdapter, read_cvxpy_status


class Glpk(SolverAdapter):
    def options(self, backend, time_limit, gap, threads) -> NativeOptions:
        opts: dict = {}
        notes = []
        if threads is not None:
            notes.append("glpk solves with one thread; the threads option was ignored")
        if backend == "pyomo":  # glpsol command line: whole seconds
            if time_limit is not None:
                secs = max(1, math.ceil(time_limit))
                if secs != time_limit:
                    notes.append(f"glpsol takes whole seconds: time limit {time_limit:g} s "
                                 f"rounded up to {secs} s")
                opts["tmlim"] = secs
            if gap is not None:
                opts["mipgap"] = float(gap)
        else:  # cvxopt.glpk options: milliseconds
            if time_limit is not None:
                opts["tm_lim"] = max(1, int(math.ceil(time_limit * 1000)))
            if gap is not None:
                opts["mip_gap"] = float(gap)
        return NativeOptions(opts, notes)

    def read_cvxpy(self, ans: CvxpyAnswer) -> RawResult:
        import cvxpy.settings as s

        res = read_cvxpy_status(ans, "")
        if ans.status is None and ans.raw.get(s.STATUS) == s.SOLVER_ERROR:
            res.termination = UNKNOWN
        res.detail = f"GLPK via cvxopt, cvxpy status {ans.status or ans.raw.get(s.STATUS)}"
        if res.termination == LIMIT and "mip_gap" in ans.options \
                and (ans.time_limit is None or ans.solve_time < 0.8 * ans.time_limit):
            # with time to spare, the only limit that can have stopped GLPK is the gap
            res.termination = OPTIMAL
            res.detail += "; stopped on the requested MIP gap"
        return res

    def adjust_classic(self, raw, log, is_mip, sense_min) -> RawResult:
        if raw.x is None and raw.termination == UNKNOWN:
            raw.termination = _verdict(log, is_mip)
        elif raw.termination == LIMIT and "MIP GAP TOLERANCE REACHED" in log:
            raw.termination = OPTIMAL  # stopped on the requested gap, not on the time limit
        return raw


def _verdict(log: str, is_mip: bool) -> str:
    """What glpsol's log says when its presolver proved the LP infeasible or unbounded."""
    if "HAS NO PRIMAL FEASIBLE SOLUTION" in log or "HAS NO INTEGER FEASIBLE SOLUTION" in log:
        return INFEASIBLE
    if "HAS UNBOUNDED PRIMAL SOLUTION" in log:
        # for a MIP this is the LP relaxation: the MIP is infeasible or unbounded
        return INF_OR_UNBD if is_mip else UNBOUNDED
    if "HAS NO DUAL FEASIBLE SOLUTION" in log:
        return INF_OR_UNBD
    return UNKNOWN


ADAPTER = Glpk("glpk", 0.0, ("glpk",), "GLPK_MI",
               doc="GLPK (the `glpsol` binary for Pyomo, cvxopt for CVXPY)",
               install=(("pyomo", "apt-get install glpk-utils (or conda install -c conda-forge glpk)"),
                        ("cvxpy", "pip install cvxopt")))
