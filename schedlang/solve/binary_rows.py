"""The window bounds' one solve: the least recomputation time over binaries within sparse rows.

`schedlang.solve.window_bound` (one window) and `schedlang.solve.linked_windows` (a dozen linked)
build small 0-1 programs row by row (`SparseRows`) and ask for the least cost over them, as a
proven lower bound: the optimum when the solver closes it, else its dual bound. HiGHS solves
them through `scipy.optimize.milp`; CP-SAT, where installed, solves the linked windows (measured
on the 124-node GPT op graph at 60%: it closes the 12-point MILP in 23 s where HiGHS had not
closed it after 120 s, on the same shared machine; bench/README.md, issue 29 round 5).

CP-SAT needs integer coefficients. The rows here have integer ones (bytes, 0 and +-1); the
costs (seconds) are scaled and rounded down, so CP-SAT's bound of the rounded problem, scaled
back, is at most the least cost of the exact one: still a valid lower bound.
"""
from __future__ import annotations

import threading

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from .solvers.cpsat import PORTFOLIO_WORKERS
from .solvers.highs import Interrupts

#: the scaled costs of a CP-SAT solve add up to about this (rounding down loses < 1e-9 each)
CPSAT_SCALE = 1e9


class SparseRows:
    """Sparse constraint rows lo <= sum(vals * x[cols]) <= hi, built one row at a time."""

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.cols: list[int] = []
        self.vals: list[float] = []
        self.lo: list[float] = []
        self.hi: list[float] = []

    def add(self, terms: list[tuple[int, float]], lo: float, hi: float) -> None:
        r = len(self.lo)
        for col, val in terms:
            self.rows.append(r)
            self.cols.append(col)
            self.vals.append(val)
        self.lo.append(lo)
        self.hi.append(hi)

    def matrix(self, columns: int):
        return coo_matrix((self.vals, (self.rows, self.cols)),
                          shape=(len(self.lo), columns)).tocsr()

    def constraint(self, columns: int) -> LinearConstraint:
        return LinearConstraint(self.matrix(columns), self.lo, self.hi)

    def integral(self) -> bool:
        """Whether every coefficient and every finite side is an integer (CP-SAT takes them)."""
        numbers = np.concatenate([np.asarray(self.vals, dtype=float),
                                  [x for x in (*self.lo, *self.hi) if np.isfinite(x)]])
        return bool(np.all(np.abs(numbers) < 2.0 ** 53) and np.all(numbers == np.round(numbers)))


def least_recomputation(cost: np.ndarray, rows: SparseRows, lower: np.ndarray,
                        upper: np.ndarray, integral: bool, seconds: float,
                        solver: str = "highs") -> tuple[float, bool] | None:
    """(the least `cost` (seconds of recomputation) over binaries within `rows` and the
    bounds, whether the solver closed it) within `seconds`: its proven dual bound when stopped
    early, its LP value when not `integral`; None when infeasible. `solver="cpsat"` solves the
    0-1 program with CP-SAT when its rows are integral (else, or when CP-SAT is not
    installed, HiGHS)."""
    if solver == "cpsat" and integral and rows.integral() and _cpsat_installed():
        return _least_cpsat(cost, rows, lower, upper, seconds)
    # times scaled to a total of 1e6: HiGHS's absolute gap (1e-6) then means nothing here
    scale = 1e6 / max(float(cost.sum()), 1e-300)
    res = milp(cost * scale, constraints=rows.constraint(len(cost)),
               bounds=Bounds(lower, upper), integrality=np.full(len(cost), 1 if integral else 0),
               options={"time_limit": max(0.1, seconds), "mip_rel_gap": 1e-7})
    if res.status == 2:
        return None
    closed = res.status == 0
    dual = getattr(res, "mip_dual_bound", None) if integral else None
    if dual is None or not np.isfinite(dual):
        value = float(res.fun) if (closed or not integral) and res.x is not None else 0.0
    else:
        value = float(dual)
    return max(0.0, value / scale), closed


def _cpsat_installed() -> bool:
    try:
        from ortools.sat.python import cp_model  # noqa: F401
    except Exception:  # noqa: BLE001 (a broken installation is an unavailable solver)
        return False
    return True


def _least_cpsat(cost: np.ndarray, rows: SparseRows, lower: np.ndarray, upper: np.ndarray,
                 seconds: float) -> tuple[float, bool] | None:
    """`least_recomputation` by CP-SAT: (bound, closed), None when infeasible. Costs rounded
    down after scaling (module docstring). The search runs in a thread so that Ctrl-C stops
    it at once: the signal is recorded while it runs (`Interrupts`), the search stopped, and
    KeyboardInterrupt raised after, as from HiGHS."""
    from ortools.sat.python import cp_model

    n = len(cost)
    scale = CPSAT_SCALE / max(float(cost.sum()), 1e-300)
    model = cp_model.CpModel()
    x = [model.new_int_var(int(lower[j]), int(upper[j]), f"x{j}") for j in range(n)]
    matrix = rows.matrix(n)
    for r in range(matrix.shape[0]):
        lo, hi = rows.lo[r], rows.hi[r]
        start, end = matrix.indptr[r], matrix.indptr[r + 1]
        expr = sum(int(v) * x[c] for c, v in zip(matrix.indices[start:end],
                                                  matrix.data[start:end], strict=True))
        if np.isfinite(lo):
            model.add(expr >= int(lo))
        if np.isfinite(hi):
            model.add(expr <= int(hi))
    weights = np.floor(np.asarray(cost, dtype=float) * scale).astype(np.int64)
    model.minimize(sum(int(w) * x[j] for j, w in enumerate(weights) if w))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.1, float(seconds))
    solver.parameters.num_workers = PORTFOLIO_WORKERS
    solver.parameters.catch_sigint_signal = False
    status: list = []
    worker = threading.Thread(target=lambda: status.append(solver.solve(model)),
                              name="cpsat-bound", daemon=True)
    interrupts = Interrupts()
    with interrupts.installed():  # a signal is recorded, not raised inside the wait (a
        worker.start()            # KeyboardInterrupt there made OR-Tools abort at exit)
        while worker.is_alive():
            worker.join(0.1)
            if interrupts.requested is not None:
                solver.stop_search()
                worker.join()
    if interrupts.requested is not None:
        raise KeyboardInterrupt
    if status[0] == cp_model.INFEASIBLE:
        return None
    closed = status[0] == cp_model.OPTIMAL
    if status[0] not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return 0.0, False  # (UNKNOWN: nothing proven beyond 0)
    return max(0.0, float(solver.best_objective_bound) / scale), closed
