"""Pyomo backend: the IR as a Pyomo ConcreteModel, solved through Pyomo's solver interfaces.

One indexed `Var` per variable family (indexed by position, 0..size-1; the IR keeps the
keys), one indexed `Constraint` per constraint block whose rule returns
``(lo, LinearExpression(...), hi)`` straight from the block's CSR row, and one `Objective`.
Component names are the family and block names, made into Python identifiers.

Interfaces (chosen by the registry, first available):
  highs  -> `stdform_highs`: Pyomo's LinearStandardFormCompiler turns the model into sparse
            arrays, handed to highspy in one call (measured 6-9x faster than appsi_highs'
            per-constraint translation, which is ~80% of a Pyomo solve);
            else appsi_highs (pyomo.contrib.appsi), else the pyomo.contrib.solver `highs`
  gurobi -> pyomo.contrib.solver `gurobi_direct`     scip -> pyomo.contrib.solver `scip_direct`
  cbc, glpk -> Pyomo's classic shell plugins (the `cbc` and `glpsol` binaries)
"""
from __future__ import annotations

import keyword
import logging
import re
import time

import numpy as np

from ..ir import IRModel
from ..solvers import PYOMO_CONTRIB, pyomo_interface
from . import ERROR, HIGHS_TERMINATION, INF_OR_UNBD, INFEASIBLE, LIMIT, OPTIMAL, UNBOUNDED, \
    UNKNOWN, RawResult, SolveRun

COLUMNS_ATTR = "_schedlang_columns"  # the model's VarData in IR column order


def _identifier(name: str, taken: set[str], model) -> str:
    base = re.sub(r"\W", "_", name) or "c"
    if base[0].isdigit() or keyword.iskeyword(base):
        base = "_" + base
    cand = base
    k = 1
    while cand in taken or hasattr(model, cand):
        k += 1
        cand = f"{base}_{k}"
    taken.add(cand)
    return cand


def build(ir: IRModel):
    """A Pyomo ConcreteModel for `ir`. Its VarData in column order: ``columns(model)``."""
    from pyomo.common.gc_manager import PauseGC

    # Pyomo creates one object per term; the cyclic garbage collector, triggered again and
    # again by these allocations, otherwise takes more than half of the build time.
    with PauseGC():
        return _build(ir)


def _build(ir: IRModel):
    import pyomo.environ as pyo
    from pyomo.core.expr.numeric_expr import LinearExpression

    m = pyo.ConcreteModel(name=ir.name)
    taken: set[str] = set()
    columns: list = []
    domains = {"binary": pyo.Binary, "integer": pyo.Integers, "continuous": pyo.Reals}
    for fam in ir.variables:
        n = fam.size
        lbs = [None if v == -np.inf else float(v) for v in fam.lb.tolist()]
        ubs = [None if v == np.inf else float(v) for v in fam.ub.tolist()]
        plain_binary = fam.kind == "binary" and all(v == 0.0 for v in lbs) \
            and all(v == 1.0 for v in ubs)
        if plain_binary:
            var = pyo.Var(range(n), domain=pyo.Binary, dense=True)
        else:
            var = pyo.Var(range(n), domain=domains[fam.kind], dense=True,
                          bounds=lambda _m, i, lbs=lbs, ubs=ubs: (lbs[i], ubs[i]))
        m.add_component(_identifier(fam.name, taken, m), var)
        columns.extend(var.values())

    for blk in ir.constraints:
        A = blk.A.tocsr()
        indptr = A.indptr.tolist()
        coefs = A.data.tolist()
        terms = [columns[j] for j in A.indices.tolist()]
        lo = [None if v == -np.inf else float(v) for v in blk.lo.tolist()]
        hi = [None if v == np.inf else float(v) for v in blk.hi.tolist()]

        def rule(_m, i, indptr=indptr, coefs=coefs, terms=terms, lo=lo, hi=hi):
            s, e = indptr[i], indptr[i + 1]
            lo_i, hi_i = lo[i], hi[i]
            if s == e or (lo_i is None and hi_i is None):
                return pyo.Constraint.Skip  # empty rows were checked before the build
            expr = LinearExpression(constant=0, linear_coefs=coefs[s:e],
                                    linear_vars=terms[s:e])
            if lo_i is not None and lo_i == hi_i:
                return (expr, lo_i)
            return (lo_i, expr, hi_i)

        m.add_component(_identifier(blk.name, taken, m),
                        pyo.Constraint(range(blk.size), rule=rule))

    obj = ir.objective
    if obj is not None:
        nz = np.flatnonzero(obj.c)
        expr = LinearExpression(constant=float(obj.constant),
                                linear_coefs=obj.c[nz].tolist(),
                                linear_vars=[columns[j] for j in nz.tolist()])
        sense = pyo.maximize if obj.sense == "max" else pyo.minimize
        m.add_component(_identifier(obj.name or "objective", taken, m),
                        pyo.Objective(expr=expr, sense=sense))
    else:
        m.add_component(_identifier("objective", taken, m), pyo.Objective(expr=0.0))
    setattr(m, COLUMNS_ATTR, columns)
    return m


def columns(model) -> list:
    return getattr(model, COLUMNS_ATTR)


def _values(cols: list, primals=None) -> np.ndarray:
    if primals is None:
        vals = [v.value for v in cols]
    else:
        vals = [primals.get(v, None) for v in cols]
    return np.array([np.nan if v is None else v for v in vals], dtype=float)


def solve(ir: IRModel, run: SolveRun) -> RawResult:
    t0 = time.perf_counter()
    model = build(ir)
    build_time = time.perf_counter() - t0
    interface = run.interface or pyomo_interface(run.solver.name)
    cols = columns(model)
    if run.warm_start is not None:
        for v, val in zip(cols, run.warm_start.tolist()):
            v.set_value(val, skip_validation=True)
    t1 = time.perf_counter()
    try:
        if interface == "stdform_highs":
            raw = _solve_stdform_highs(model, cols, run)
        elif interface == "appsi_highs":
            raw = _solve_appsi_highs(model, cols, run)
        elif interface in PYOMO_CONTRIB:
            raw = _solve_contrib(model, cols, interface, run)
        else:
            raw = _solve_classic(model, cols, interface, run)
    except Exception as exc:
        raw = RawResult(ERROR, detail=f"{interface}: {type(exc).__name__}: {exc}")
    raw.build_time = build_time
    raw.solve_time = time.perf_counter() - t1
    return raw


# --------------------------------------------------------------------------- standard form -> HiGHS

def _solve_stdform_highs(model, cols, run: SolveRun) -> RawResult:
    import highspy
    import pyomo.environ as pyo
    from pyomo.common.gc_manager import PauseGC
    from pyomo.repn.plugins.standard_form import LinearStandardFormCompiler

    with PauseGC():
        repn = LinearStandardFormCompiler().write(
            model, mixed_form=True, set_sense=None, column_order=cols)
    n = len(cols)
    position = {id(v): k for k, v in enumerate(cols)}
    where = np.fromiter((position[id(v)] for v in repn.columns), dtype=np.int64,
                        count=len(repn.columns))

    # columns in the IR's order (the compiler may leave out columns used nowhere)
    inf = highspy.kHighsInf
    col_lb = np.empty(n)
    col_ub = np.empty(n)
    is_int = np.zeros(n, dtype=bool)
    for k, v in enumerate(cols):
        lo, hi = v.bounds
        col_lb[k] = -inf if lo is None else lo
        col_ub[k] = inf if hi is None else hi
        is_int[k] = v.is_integer()
    cost = np.zeros(n)
    offset = 0.0
    sense = highspy.ObjSense.kMinimize
    if repn.objectives:
        cost[where] = repn.c.toarray()[0]
        offset = float(repn.c_offset[0])
        if repn.objectives[0].sense == pyo.maximize:
            sense = highspy.ObjSense.kMaximize

    # rows: the compiler splits a range row into (<= hi, >= lo); merge them back
    A = repn.A.tocsr()
    kinds = np.fromiter((r.bound_type for r in repn.rows), dtype=np.int8, count=len(repn.rows))
    ids = np.fromiter((id(r.constraint) for r in repn.rows), dtype=np.int64,
                      count=len(repn.rows))
    rhs = np.asarray(repn.rhs, dtype=float)
    row_lo = np.where(kinds >= 0, np.where(kinds == 0, rhs, -inf), rhs)
    row_hi = np.where(kinds <= 0, np.where(kinds == 0, rhs, inf), rhs)
    if len(ids) > 1:
        pair = np.flatnonzero(ids[1:] == ids[:-1])  # row pair+1 repeats row pair
        if pair.size:
            row_lo[pair] = row_lo[pair + 1]
            keep = np.ones(len(ids), dtype=bool)
            keep[pair + 1] = False
            A, row_lo, row_hi = A[keep], row_lo[keep], row_hi[keep]
    # columns of A in IR order
    A = A.tocsc()
    if len(where) != n or not np.array_equal(where, np.arange(n)):
        import scipy.sparse as sp
        perm = sp.csc_matrix((np.ones(len(where)), (where, np.arange(len(where)))),
                             shape=(n, len(where)))
        A = (A @ perm.T).tocsc()

    lp = highspy.HighsLp()
    lp.num_col_ = n
    lp.num_row_ = A.shape[0]
    lp.col_cost_ = cost
    lp.col_lower_ = col_lb
    lp.col_upper_ = col_ub
    lp.row_lower_ = row_lo
    lp.row_upper_ = row_hi
    lp.offset_ = offset
    lp.sense_ = sense
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = A.indptr
    lp.a_matrix_.index_ = A.indices
    lp.a_matrix_.value_ = A.data
    if is_int.any():
        lp.integrality_ = [highspy.HighsVarType.kInteger if f else highspy.HighsVarType.kContinuous
                           for f in is_int.tolist()]

    h = highspy.Highs()
    h.setOptionValue("output_flag", bool(run.verbose))
    h.setOptionValue("log_to_console", bool(run.verbose))
    status = h.passModel(lp)
    if status == highspy.HighsStatus.kError:
        return RawResult(ERROR, detail="HiGHS rejected the model")
    for key, val in run.options.options.items():
        if h.setOptionValue(key, val) == highspy.HighsStatus.kError:
            return RawResult(ERROR, detail=f"HiGHS rejected option {key}={val!r}")
    if run.warm_start is not None and is_int.any():
        sol = highspy.HighsSolution()
        sol.col_value = np.asarray(run.warm_start, dtype=float)
        sol.value_valid = True
        h.setSolution(sol)
    h.run()
    ms = h.getModelStatus().name
    info = h.getInfo()
    term = HIGHS_TERMINATION.get(ms, UNKNOWN)
    x = incumbent = bound = None
    if info.primal_solution_status == 2:
        x = np.asarray(h.getSolution().col_value, dtype=float)
        incumbent = info.objective_function_value
    if is_int.any():
        if info.mip_node_count >= 0 and np.isfinite(info.mip_dual_bound):
            bound = info.mip_dual_bound
    elif term == OPTIMAL:
        bound = info.objective_function_value
    return RawResult(term, x=x, objective=incumbent, bound=bound, detail=f"HiGHS {ms}")


# --------------------------------------------------------------------------- appsi HiGHS

def _solve_appsi_highs(model, cols, run: SolveRun) -> RawResult:
    from pyomo.contrib.appsi.base import TerminationCondition as TC
    from pyomo.contrib.appsi.solvers import Highs

    # only_child_vars: columns go to HiGHS in the model's (the IR's) order. By default appsi
    # orders them by first appearance in the constraints, which made the vgg16_train MILP take
    # 3-5 s instead of about 1 s (column order swings HiGHS's root work; performance-notes.md).
    opt = Highs(only_child_vars=True)
    opt.config.load_solution = False
    opt.config.stream_solver = bool(run.verbose)
    opt.highs_options = dict(run.options.options)
    if run.warm_start is not None:
        opt.config.warmstart = True
    res = opt.solve(model)
    tc = res.termination_condition
    term = {
        TC.optimal: OPTIMAL, TC.maxTimeLimit: LIMIT, TC.maxIterations: LIMIT,
        TC.objectiveLimit: LIMIT, TC.interrupted: LIMIT, TC.minStepLength: LIMIT,
        TC.infeasible: INFEASIBLE, TC.unbounded: UNBOUNDED,
        TC.infeasibleOrUnbounded: INF_OR_UNBD, TC.error: ERROR,
        TC.licensingProblems: ERROR,
    }.get(tc, UNKNOWN)
    x = None
    if res.best_feasible_objective is not None:
        x = _values(cols, res.solution_loader.get_primals())
    return RawResult(term, x=x, objective=res.best_feasible_objective,
                     bound=res.best_objective_bound, detail=f"HiGHS {tc.name}")


# --------------------------------------------------------------------------- pyomo.contrib.solver

def _solve_contrib(model, cols, interface: str, run: SolveRun) -> RawResult:
    from pyomo.contrib.solver.common.factory import SolverFactory
    from pyomo.contrib.solver.common.results import SolutionStatus, TerminationCondition as TC

    opt = SolverFactory(interface)
    kwargs = dict(load_solutions=False, raise_exception_on_nonoptimal_result=False,
                  solver_options=dict(run.options.options))
    if run.verbose:
        import sys
        kwargs["tee"] = [sys.stdout]
    notes = []
    if run.warm_start is not None:
        if "warmstart_discrete_vars" in opt.config:
            kwargs["warmstart_discrete_vars"] = True
        else:
            notes.append(f"warm start ignored: Pyomo's {interface} interface takes no MIP start")
    res = opt.solve(model, **kwargs)
    tc = res.termination_condition
    term = {
        TC.convergenceCriteriaSatisfied: OPTIMAL, TC.maxTimeLimit: LIMIT,
        TC.iterationLimit: LIMIT, TC.objectiveLimit: LIMIT, TC.minStepLength: LIMIT,
        TC.interrupted: LIMIT, TC.unbounded: UNBOUNDED, TC.provenInfeasible: INFEASIBLE,
        TC.locallyInfeasible: INFEASIBLE, TC.infeasibleOrUnbounded: INF_OR_UNBD,
        TC.error: ERROR, TC.licensingProblems: ERROR, TC.emptyModel: UNKNOWN,
    }.get(tc, UNKNOWN)
    x = None
    if res.solution_status in (SolutionStatus.feasible, SolutionStatus.optimal):
        x = _values(cols, res.solution_loader.get_vars())
    detail = f"{interface} {tc.name}"
    if term == ERROR and res.solver_log:
        detail += ": " + res.solver_log.strip().splitlines()[-1][:200]
    return RawResult(term, x=x, objective=res.incumbent_objective, bound=res.objective_bound,
                     detail=detail, notes=notes)


# --------------------------------------------------------------------------- classic plugins

def _solve_classic(model, cols, interface: str, run: SolveRun) -> RawResult:
    import pyomo.environ as pyo
    from pyomo.opt import SolutionStatus, TerminationCondition as TC

    opt = pyo.SolverFactory(interface)
    for key, val in run.options.options.items():
        opt.options[key] = val
    kwargs = dict(load_solutions=False, tee=bool(run.verbose))
    if run.warm_start is not None and opt.warm_start_capable():
        kwargs["warmstart"] = True
    res = opt.solve(model, **kwargs)
    tc = res.solver.termination_condition
    term = {
        TC.optimal: OPTIMAL, TC.globallyOptimal: OPTIMAL, TC.locallyOptimal: OPTIMAL,
        TC.maxTimeLimit: LIMIT, TC.maxIterations: LIMIT, TC.maxEvaluations: LIMIT,
        TC.minStepLength: LIMIT, TC.minFunctionValue: LIMIT, TC.userInterrupt: LIMIT,
        TC.resourceInterrupt: LIMIT, TC.licensingProblems: ERROR,
        TC.infeasible: INFEASIBLE, TC.invalidProblem: ERROR, TC.solverFailure: ERROR,
        TC.internalSolverError: ERROR, TC.error: ERROR, TC.unbounded: UNBOUNDED,
        TC.infeasibleOrUnbounded: INF_OR_UNBD, TC.intermediateNonInteger: LIMIT,
        TC.feasible: LIMIT, TC.other: UNKNOWN, TC.unknown: UNKNOWN,
    }.get(tc, UNKNOWN)
    x = None
    if len(res.solution) > 0 and res.solution(0).status in (
            SolutionStatus.optimal, SolutionStatus.feasible, SolutionStatus.bestSoFar,
            SolutionStatus.locallyOptimal, SolutionStatus.globallyOptimal,
            SolutionStatus.stoppedByLimit):
        log = logging.getLogger("pyomo.core")  # it warns when loading a limit's point
        level = log.level
        log.setLevel(logging.ERROR)
        try:
            model.solutions.load_from(res)
        finally:
            log.setLevel(level)
        x = _values(cols)
    if interface == "glpk":
        log = getattr(opt, "_log", "") or ""
        if x is None and term == UNKNOWN:
            term = _glpk_verdict(log, any(v.is_integer() for v in cols))
        elif term == LIMIT and "MIP GAP TOLERANCE REACHED" in log:
            term = OPTIMAL  # stopped on the requested gap, not on the time limit
    sense_min = _is_min(model)
    lower, upper = res.problem.lower_bound, res.problem.upper_bound
    bound = lower if sense_min else upper
    incumbent = upper if sense_min else lower
    bound, incumbent = _finite(bound), _finite(incumbent)
    if interface == "cbc" and bound is not None:
        bound = _cbc_bound(bound, incumbent, sense_min)
    return RawResult(term, x=x, objective=incumbent, bound=bound, detail=f"{interface} {tc}")


def _glpk_verdict(log: str, is_mip: bool) -> str:
    """glpsol's presolver leaves no status in its solution file when it proves the LP
    infeasible or unbounded (Pyomo then says 'other'); its log says which."""
    if "HAS NO PRIMAL FEASIBLE SOLUTION" in log or "HAS NO INTEGER FEASIBLE SOLUTION" in log:
        return INFEASIBLE
    if "HAS UNBOUNDED PRIMAL SOLUTION" in log:
        # for a MIP this is the LP relaxation: the MIP is infeasible or unbounded
        return INF_OR_UNBD if is_mip else UNBOUNDED
    if "HAS NO DUAL FEASIBLE SOLUTION" in log:
        return INF_OR_UNBD
    return UNKNOWN


def _cbc_bound(bound: float, incumbent: float | None, sense_min: bool) -> float | None:
    """Pyomo reads CBC's 'best possible' from the log, where CBC 2.10 prints it in its
    internal minimisation sense: for a maximisation it can come with the wrong sign. Keep
    the reading only when it is consistent with the incumbent (a bound is never worse)."""
    if incumbent is None:
        return bound if sense_min else None
    tol = 1e-6 * (1.0 + abs(incumbent))
    for cand in (bound, -bound):
        if (sense_min and cand <= incumbent + tol) or (not sense_min and cand >= incumbent - tol):
            return cand
    return None


def _is_min(model) -> bool:
    import pyomo.environ as pyo
    for o in model.component_data_objects(pyo.Objective, active=True):
        return o.sense == pyo.minimize
    return True


def _finite(v) -> float | None:
    try:
        v = float(v)
    except (TypeError, ValueError):
        return None
    return v if np.isfinite(v) else None
