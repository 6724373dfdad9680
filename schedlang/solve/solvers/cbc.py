"""COIN-OR CBC: the `cbc` binary through Pyomo's classic plugin, cylp (``CBC``) through cvxpy.

Quirks: the two drivers spell the options differently (command-line options vs attributes
of cylp's CyCbcModel); Pyomo reads CBC's 'best possible' from the log, where CBC 2.10
prints it in its internal minimisation sense (`adjust_classic` fixes the sign); cylp's
statuses reach us folded by cvxpy ('solution' -> optimal, every 'stopped on ...' ->
optimal_inaccurate, a limit), with no bound.
"""
from __future__ import annotations

from ..status import RawResult
from .base import CvxpyAnswer, NativeOptions, SolverAdapter, read_cvxpy_status, spell


class Cbc(SolverAdapter):
    def options(self, backend, time_limit, gap, threads) -> NativeOptions:
        if backend == "pyomo":  # command-line options of the cbc binary
            names = ("sec", "ratioGap", "threads")
        else:  # attributes of cylp's CyCbcModel
            names = ("maximumSeconds", "allowableFractionGap", "numberThreads")
        return NativeOptions(spell(names, time_limit, gap, threads, allowableGap=0.0))

    def read_cvxpy(self, ans: CvxpyAnswer) -> RawResult:
        return read_cvxpy_status(ans, f"CBC via cylp, cvxpy status {ans.status}")

    def adjust_classic(self, raw, log, is_mip, sense_min) -> RawResult:
        if raw.bound is not None:
            raw.bound = _bound(raw.bound, raw.objective, sense_min)
        return raw


def _bound(bound: float, incumbent: float | None, sense_min: bool) -> float | None:
    """Keep CBC's bound, or its negation, whichever is consistent with the incumbent (a
    bound is never worse); None when neither is."""
    if incumbent is None:
        return bound if sense_min else None
    tol = 1e-6 * (1.0 + abs(incumbent))
    for cand in (bound, -bound):
        if (sense_min and cand <= incumbent + tol) or (not sense_min and cand >= incumbent - tol):
            return cand
    return None


ADAPTER = Cbc("cbc", 0.0, ("cbc",), "CBC", warm_start=frozenset({"pyomo"}),
              doc="COIN-OR CBC (the `cbc` binary for Pyomo, cylp for CVXPY)",
              install=(("pyomo", "apt-get install coinor-cbc (or conda install -c conda-forge coincbc)"),
                       ("cvxpy", "pip install cylp")))
