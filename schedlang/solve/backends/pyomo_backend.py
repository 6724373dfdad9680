"""Pyomo backend: the IR as a Pyomo ConcreteModel, solved through Pyomo's solver interfaces.

One indexed `Var` per variable family (indexed by position, 0..size-1; the IR keeps the
keys), one indexed `Constraint` per constraint block whose rule returns
``(lo, LinearExpression(...), hi)`` straight from the block's CSR row, and one `Objective`.
Component names are the family and block names, made into Python identifiers.

Interfaces (each solver adapter in `schedlang/solve/solvers/` lists its own, first available
wins): `highs_ir` (HiGHS's default: the IR's matrix handed to highspy in one call,
`schedlang.solve.solvers.highs.solve_ir`, no Pyomo model built: the fastest way from the IR to
HiGHS, and no Pyomo objects for the garbage collector to walk afterwards), `stdform_highs`
(the Pyomo model compiled to standard form, `schedlang.solve.solvers.highs.solve_pyomo_stdform`),
`appsi_highs` (pyomo.contrib.appsi), pyomo.contrib.solver's `highs`, `gurobi_direct`,
`scip_direct`, Pyomo's classic shell plugins (`cbc`, `glpk`), and `cpsat_ir` (CP-SAT,
`schedlang.solve.solvers.cpsat`: built from the IR directly, no Pyomo model). The termination tables
of Pyomo's three APIs are in `schedlang.solve.status`; a solver's log-reading quirks are
its adapter's `adjust_classic`.
"""
from __future__ import annotations

import keyword
import logging
import re
import time

import numpy as np

from ...compile.ir import IRModel
from ..solvers import PYOMO_CONTRIB, cpsat, pyomo_interface
from ..solvers.highs import IR_INTERFACE, solve_pyomo_stdform
from ..solvers.highs import solve_ir as solve_highs_ir
from ..status import ERROR, PYOMO_APPSI, PYOMO_CLASSIC, RawResult, termination
from ..status import PYOMO_CONTRIB as CONTRIB_TERMINATION
from . import SolveRun

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
    interface = run.interface or pyomo_interface(run.solver.name)
    # CP-SAT, and HiGHS by default, take the IR's matrix as it is: no Pyomo model is built
    if interface == cpsat.INTERFACE:
        return cpsat.solve(ir, run)
    if interface == IR_INTERFACE:
        return solve_highs_ir(ir, run)
    t0 = time.perf_counter()
    model = build(ir)
    build_time = time.perf_counter() - t0
    cols = columns(model)
    if run.warm_start is not None:
        for v, val in zip(cols, run.warm_start.tolist()):
            v.set_value(val, skip_validation=True)
    t1 = time.perf_counter()
    try:
        if interface == "stdform_highs":
            raw = solve_pyomo_stdform(model, cols, run)
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


# --------------------------------------------------------------------------- appsi HiGHS

def _solve_appsi_highs(model, cols, run: SolveRun) -> RawResult:
    from pyomo.contrib.appsi.solvers import Highs

    # only_child_vars: columns go to HiGHS in the model's (the IR's) order. By default appsi
    # orders them by first appearance in the constraints, which made the vgg16_train MILP take
    # 3-5 s instead of about 1 s (column order swings HiGHS's root work).
    opt = Highs(only_child_vars=True)
    opt.config.load_solution = False
    opt.config.stream_solver = bool(run.verbose)
    opt.highs_options = dict(run.options.options)
    if run.warm_start is not None:
        opt.config.warmstart = True
    res = opt.solve(model)
    tc = res.termination_condition
    term = termination(PYOMO_APPSI, tc)
    x = None
    if res.best_feasible_objective is not None:
        x = _values(cols, res.solution_loader.get_primals())
    return RawResult(term, x=x, objective=res.best_feasible_objective,
                     bound=res.best_objective_bound, detail=f"HiGHS {tc.name}")


# --------------------------------------------------------------------------- pyomo.contrib.solver

def _solve_contrib(model, cols, interface: str, run: SolveRun) -> RawResult:
    from pyomo.contrib.solver.common.factory import SolverFactory
    from pyomo.contrib.solver.common.results import SolutionStatus

    opt = SolverFactory(interface)
    kwargs = dict(load_solutions=False, raise_exception_on_nonoptimal_result=False,
                  solver_options=dict(run.options.options))
    if run.verbose:
        import sys
        kwargs["tee"] = [sys.stdout]
    notes = []
    ignored = False
    if run.warm_start is not None:
        if "warmstart_discrete_vars" in opt.config:
            kwargs["warmstart_discrete_vars"] = True
        else:
            ignored = True
            notes.append(f"warm start ignored: Pyomo's {interface} interface takes no MIP start")
    res = opt.solve(model, **kwargs)
    tc = res.termination_condition
    term = termination(CONTRIB_TERMINATION, tc)
    x = None
    if res.solution_status in (SolutionStatus.feasible, SolutionStatus.optimal):
        x = _values(cols, res.solution_loader.get_vars())
    detail = f"{interface} {tc.name}"
    if term == ERROR and res.solver_log:
        detail += ": " + res.solver_log.strip().splitlines()[-1][:200]
    return RawResult(term, x=x, objective=res.incumbent_objective, bound=res.objective_bound,
                     detail=detail, notes=notes, warm_start_ignored=ignored)


# --------------------------------------------------------------------------- classic plugins

def _solve_classic(model, cols, interface: str, run: SolveRun) -> RawResult:
    import pyomo.environ as pyo
    from pyomo.opt import SolutionStatus

    opt = pyo.SolverFactory(interface)
    for key, val in run.options.options.items():
        opt.options[key] = val
    kwargs = dict(load_solutions=False, tee=bool(run.verbose))
    if run.warm_start is not None and opt.warm_start_capable():
        kwargs["warmstart"] = True
    res = opt.solve(model, **kwargs)
    tc = res.solver.termination_condition
    term = termination(PYOMO_CLASSIC, tc)
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
    sense_min = _is_min(model)
    lower, upper = res.problem.lower_bound, res.problem.upper_bound
    bound = lower if sense_min else upper
    incumbent = upper if sense_min else lower
    raw = RawResult(term, x=x, objective=_finite(incumbent), bound=_finite(bound),
                    detail=f"{interface} {tc}")
    return run.solver.adjust_classic(raw, getattr(opt, "_log", "") or "",
                                     any(v.is_integer() for v in cols), sense_min)


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
