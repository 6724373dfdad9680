"""CVXPY backend: the IR as one cvxpy Problem with vectorized constraint blocks.

One `cp.Variable(n)` over all columns (integrality by index, bounds passed natively), and per
constraint block at most three constraints: ``A_eq @ x == b``, ``A_le @ x <= hi``,
``A_ge @ x >= lo`` (rows split by numpy masks; a range row goes into both inequalities).
Never one cvxpy constraint per row (build times: bench/bench_build.py, bench/README.md).

The solve goes through ``Problem.get_problem_data`` and the solving chain's
``solve_via_data`` so that the solver's raw answer (HiGHS model status and info, the Gurobi
model, the SCIP status) can be read before cvxpy folds it into its own status: cvxpy maps a
time limit to OPTIMAL_INACCURATE (SCIP, CBC, GLPK), to USER_LIMIT (HiGHS, Gurobi), and a time
limit without a solution to INFEASIBLE_INACCURATE (Gurobi) or SOLVER_ERROR (SCIP, GLPK).
Reading that answer is each solver adapter's `read_cvxpy` (`schedlang/solve/solvers/`).
"""
from __future__ import annotations

import time
import warnings

import numpy as np

from ...compile.ir import IRModel
from ..solvers.base import CvxpyAnswer
from ..status import ERROR, OPTIMAL, UNKNOWN, RawResult
from . import SolveRun

VAR_NAME = "x"


def build(ir: IRModel):
    """A cvxpy Problem for `ir`; its one variable is ``problem.variables()[0]``."""
    import cvxpy as cp
    import scipy.sparse as sp

    n = ir.n_columns
    lb, ub = ir.column_bounds()
    ints = np.flatnonzero(ir.integrality())
    kwargs = {}
    if ints.size:
        kwargs["integer"] = (ints,)
    if np.isfinite(lb).any() or np.isfinite(ub).any():
        kwargs["bounds"] = [lb.astype(float), ub.astype(float)]
    x = cp.Variable(n, name=VAR_NAME, **kwargs)

    constraints = []
    for blk in ir.constraints:
        A = sp.csr_matrix(blk.A, dtype=float)
        lo, hi = blk.lo.astype(float), blk.hi.astype(float)
        fin_lo, fin_hi = np.isfinite(lo), np.isfinite(hi)
        eq = fin_lo & fin_hi & (lo == hi)
        le = fin_hi & ~eq
        ge = fin_lo & ~eq
        for mask, kind in ((eq, "=="), (le, "<="), (ge, ">=")):
            rows = np.flatnonzero(mask)
            if rows.size == 0:
                continue
            sub = A if rows.size == A.shape[0] else A[rows]
            if kind == "==":
                constraints.append(sub @ x == lo[rows])
            elif kind == "<=":
                constraints.append(sub @ x <= hi[rows])
            else:
                constraints.append(sub @ x >= lo[rows])

    obj = ir.objective
    if obj is None:
        objective = cp.Minimize(0)
    else:
        expr = obj.c.astype(float) @ x + float(obj.constant)
        objective = cp.Maximize(expr) if obj.sense == "max" else cp.Minimize(expr)
    return cp.Problem(objective, constraints)


def solve(ir: IRModel, run: SolveRun) -> RawResult:
    adapter = run.solver
    name = adapter.cvxpy
    t0 = time.perf_counter()
    prob = build(ir)
    x = prob.variables()[0]
    warm = run.warm_start is not None
    if warm:
        x.value = _project(ir, run.warm_start)
    data, chain, inverse = prob.get_problem_data(name, ignore_dpp=True)
    build_time = time.perf_counter() - t0

    t1 = time.perf_counter()
    opts = _copy_options(run.options.options)
    dropped: list[str] = []  # why the MIP start was not passed, when it was not
    try:
        raw = adapter.cvxpy_solve(chain, prob, data, warm, bool(run.verbose), opts,
                                  run.warm_start, dropped)
    except Exception as exc:  # the solver itself failed
        return RawResult(ERROR, detail=f"{name}: {type(exc).__name__}: {exc}",
                         build_time=build_time, solve_time=time.perf_counter() - t1)
    solve_time = time.perf_counter() - t1

    status = None
    unpack_error = ""
    try:
        with warnings.catch_warnings():  # inaccurate/limit warnings: we report the status
            warnings.simplefilter("ignore")
            prob.unpack_results(raw, chain, inverse)
        status = prob.status
    except Exception as exc:  # cvxpy raises SolverError for its error statuses
        unpack_error = f"{type(exc).__name__}: {exc}"
    sense = -1.0 if (ir.objective is not None and ir.objective.sense == "max") else 1.0
    const = float(ir.objective.constant) if ir.objective is not None else 0.0
    result = adapter.read_cvxpy(CvxpyAnswer(raw, status, x, sense, const, run.options.options,
                                            run.time_limit, solve_time))
    if unpack_error and result.termination == OPTIMAL:
        result.termination = UNKNOWN
    if unpack_error:
        result.detail = (result.detail + "; " if result.detail else "") + unpack_error[:300]
    result.notes.extend(dropped)
    result.warm_start_ignored = bool(dropped)
    result.build_time = build_time
    result.solve_time = solve_time
    return result


def _project(ir: IRModel, values: np.ndarray) -> np.ndarray:
    """A warm start cvxpy accepts: inside the bounds, integers rounded."""
    lb, ub = ir.column_bounds()
    v = np.clip(np.asarray(values, dtype=float), lb, ub)
    mask = ir.integrality()
    v[mask] = np.round(v[mask])
    return v


def _copy_options(opts: dict) -> dict:
    return {k: (dict(v) if isinstance(v, dict) else v) for k, v in opts.items()}
