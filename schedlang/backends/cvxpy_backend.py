"""CVXPY backend: the IR as one cvxpy Problem with vectorized constraint blocks.

One `cp.Variable(n)` over all columns (integrality by index, bounds passed natively), and per
constraint block at most three constraints: ``A_eq @ x == b``, ``A_le @ x <= hi``,
``A_ge @ x >= lo`` (rows split by numpy masks; a range row goes into both inequalities).
Never one cvxpy constraint per row (docs/performance-notes.md).

The solve goes through ``Problem.get_problem_data`` and the solving chain's
``solve_via_data`` so that the solver's raw answer (HiGHS model status and info, the Gurobi
model, the SCIP status) can be read before cvxpy folds it into its own status: cvxpy maps a
time limit to OPTIMAL_INACCURATE (SCIP, CBC, GLPK), to USER_LIMIT (HiGHS, Gurobi), and a time
limit without a solution to INFEASIBLE_INACCURATE (Gurobi) or SOLVER_ERROR (SCIP, GLPK).
"""
from __future__ import annotations

import time
import warnings

import numpy as np

from ..ir import IRModel
from . import ERROR, HIGHS_TERMINATION, INF_OR_UNBD, INFEASIBLE, LIMIT, OPTIMAL, UNBOUNDED, \
    UNKNOWN, RawResult, SolveRun

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
    name = run.solver.cvxpy
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
    notes = []
    try:
        if warm and name == "HIGHS":
            raw = _solve_highs_with_start(chain, data, run, opts, notes)
        else:
            raw = chain.solve_via_data(prob, data, warm, bool(run.verbose), opts)
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
    reader = _READERS.get(name, _read_generic)
    result = reader(raw, status, x, sense, const)
    if unpack_error and result.termination == OPTIMAL:
        result.termination = UNKNOWN
    if unpack_error:
        result.detail = (result.detail + "; " if result.detail else "") + unpack_error[:300]
    if name == "GLPK_MI" and result.termination == LIMIT and "mip_gap" in run.options.options \
            and (run.time_limit is None or solve_time < 0.8 * run.time_limit):
        # cvxopt says 'feasible' for every stop on a limit; with time to spare, the only
        # limit that can have stopped GLPK is the requested gap
        result.termination = OPTIMAL
        result.detail += "; stopped on the requested MIP gap"
    result.notes.extend(notes)
    result.build_time = build_time
    result.solve_time = solve_time
    return result


def _solve_highs_with_start(chain, data, run: SolveRun, opts: dict, notes: list):
    """cvxpy's HiGHS interface ignores ``x.value``: it warm-starts only from the solution of
    a previous solve kept in a solver cache. Give it a cache holding our start vector (the
    canonical columns are our columns when, as here, the problem has one variable with
    native bounds and nothing else)."""
    import cvxpy.settings as s
    import highspy

    n = run.warm_start.shape[0]
    cache = {}
    if data[s.C].shape[0] == n:
        start = highspy.HighsSolution()
        start.col_value = np.asarray(run.warm_start, dtype=float)
        start.value_valid = True
        cache["HIGHS"] = (None, None, {"model_status": "kOptimal", "solution": start})
    else:
        notes.append("warm start ignored: cvxpy's canonical HiGHS model has other columns")
    return chain.solver.solve_via_data(data, True, bool(run.verbose), opts, cache)


def _project(ir: IRModel, values: np.ndarray) -> np.ndarray:
    """A warm start cvxpy accepts: inside the bounds, integers rounded."""
    lb, ub = ir.column_bounds()
    v = np.clip(np.asarray(values, dtype=float), lb, ub)
    mask = ir.integrality()
    v[mask] = np.round(v[mask])
    return v


def _copy_options(opts: dict) -> dict:
    return {k: (dict(v) if isinstance(v, dict) else v) for k, v in opts.items()}


def _x_value(x) -> np.ndarray | None:
    v = x.value
    if v is None:
        return None
    return np.asarray(v, dtype=float).ravel()


# --------------------------------------------------------------------------- per-solver readers
# Each turns the raw answer of one cvxpy solver interface into a RawResult. Bounds reported
# by the solvers are for the canonical problem: min s*c@x (s = -1 for max), without the
# objective constant; in the model's terms the bound is s*bound + constant.

def _generic_term(status) -> str:
    import cvxpy.settings as s
    return {
        s.OPTIMAL: OPTIMAL, s.OPTIMAL_INACCURATE: LIMIT, s.USER_LIMIT: LIMIT,
        s.INFEASIBLE: INFEASIBLE, s.UNBOUNDED: UNBOUNDED,
        s.INFEASIBLE_OR_UNBOUNDED: INF_OR_UNBD, s.INFEASIBLE_INACCURATE: UNKNOWN,
        s.UNBOUNDED_INACCURATE: UNKNOWN, s.SOLVER_ERROR: ERROR,
    }.get(status, UNKNOWN)


def _read_generic(raw, status, x, sense, const) -> RawResult:
    term = _generic_term(status) if status is not None else ERROR
    xv = _x_value(x) if term in (OPTIMAL, LIMIT, UNKNOWN) else None
    return RawResult(term, x=xv, detail=f"cvxpy status {status}")


def _read_highs(raw, status, x, sense, const) -> RawResult:
    ms = raw.get("model_status", "")
    info = raw.get("info")
    term = HIGHS_TERMINATION.get(ms, UNKNOWN)
    xv = None
    bound = incumbent = None
    if info is not None:
        has_point = getattr(info, "primal_solution_status", 0) == 2
        if has_point:
            xv = _x_value(x)
            incumbent = sense * info.objective_function_value + const
        if getattr(info, "mip_node_count", -1) >= 0:  # a MIP: the dual bound is reported
            b = info.mip_dual_bound
            if np.isfinite(b):
                bound = sense * b + const
    return RawResult(term, x=xv, objective=incumbent, bound=bound, detail=f"HiGHS {ms}")


def _read_gurobi(raw, status, x, sense, const) -> RawResult:
    import gurobipy as gp
    model = raw.get("model")
    if model is None:
        return _read_generic(raw, status, x, sense, const)
    G = gp.GRB
    st = model.Status
    if st == G.LOADED:  # optimize() raised inside cvxpy, which hides the GurobiError
        detail = "Gurobi did not optimize"
        if max(model.NumVars, model.NumConstrs) > 2000:
            detail += (f" (the model has {model.NumVars} variables and {model.NumConstrs} "
                       f"constraints; a size-limited licence allows 2000)")
        return RawResult(ERROR, detail=detail)
    term = {
        G.OPTIMAL: OPTIMAL, G.INFEASIBLE: INFEASIBLE, G.INF_OR_UNBD: INF_OR_UNBD,
        G.UNBOUNDED: UNBOUNDED, G.TIME_LIMIT: LIMIT, G.ITERATION_LIMIT: LIMIT,
        G.NODE_LIMIT: LIMIT, G.SOLUTION_LIMIT: LIMIT, G.INTERRUPTED: LIMIT,
        G.USER_OBJ_LIMIT: LIMIT, G.WORK_LIMIT: LIMIT, G.MEM_LIMIT: LIMIT,
        G.SUBOPTIMAL: LIMIT, G.NUMERIC: ERROR, G.CUTOFF: LIMIT,
    }.get(st, UNKNOWN)
    xv = _x_value(x) if model.SolCount > 0 else None
    incumbent = sense * model.ObjVal + const if model.SolCount > 0 else None
    bound = None
    try:
        if model.IsMIP:
            b = model.ObjBound
            bound = sense * b + const if np.isfinite(b) else None
    except Exception:  # no bound attribute in this state
        bound = None
    return RawResult(term, x=xv, objective=incumbent, bound=bound,
                     detail=f"Gurobi status {st}")


def _read_scip(raw, status, x, sense, const) -> RawResult:
    st = raw.get("scip_status", "")
    model = raw.get("model")
    term = {
        "optimal": OPTIMAL, "gaplimit": OPTIMAL, "infeasible": INFEASIBLE,
        "unbounded": UNBOUNDED, "inforunbd": INF_OR_UNBD, "timelimit": LIMIT,
        "nodelimit": LIMIT, "totalnodelimit": LIMIT, "stallnodelimit": LIMIT,
        "sollimit": LIMIT, "bestsollimit": LIMIT, "restartlimit": LIMIT,
        "memlimit": LIMIT, "userinterrupt": LIMIT,
    }.get(st, UNKNOWN)
    has_point = "primal" in raw
    xv = _x_value(x) if has_point else None
    bound = None
    if model is not None:
        try:
            b = model.getDualbound()
            if np.isfinite(b) and abs(b) < 1e19:
                bound = sense * b + const
        except Exception:
            bound = None
    return RawResult(term, x=xv, bound=bound, detail=f"SCIP {st}")


def _read_cbc(raw, status, x, sense, const) -> RawResult:
    # cylp's status strings are folded by cvxpy: 'solution' -> OPTIMAL, every 'stopped on
    # ...' -> OPTIMAL_INACCURATE (a limit), with no bound exposed.
    res = _read_generic(raw, status, x, sense, const)
    res.detail = f"CBC via cylp, cvxpy status {status}"
    return res


def _read_glpk(raw, status, x, sense, const) -> RawResult:
    # cvxopt's 'feasible' (a limit with a point) -> OPTIMAL_INACCURATE; 'undefined' (a limit
    # without one) -> SOLVER_ERROR. GLPK exposes no bound through cvxopt.
    import cvxpy.settings as s
    res = _read_generic(raw, status, x, sense, const)
    if status is None and raw.get(s.STATUS) == s.SOLVER_ERROR:
        res.termination = UNKNOWN
    res.detail = f"GLPK via cvxopt, cvxpy status {status or raw.get(s.STATUS)}"
    return res


_READERS = {"HIGHS": _read_highs, "GUROBI": _read_gurobi, "SCIP": _read_scip,
            "CBC": _read_cbc, "GLPK_MI": _read_glpk}
