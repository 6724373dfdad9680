"""Status normalization: from what a solver said to one `Solution` status, the same everywhere.

Two steps, both here:

1. A backend reads the solver's native answer and names its *termination* with one of the
   words below (`RawResult.termination`). The per-solver tables live in the adapters
   (`highs.TERMINATION`, `gurobi.TERMINATION`, `scip.TERMINATION`); the tables of the
   interfaces every solver shares (Pyomo's three solver APIs, cvxpy's status strings) are
   `PYOMO_CLASSIC`, `PYOMO_CONTRIB`, `PYOMO_APPSI` and `CVXPY` below, keyed by the names of
   the native enums so that nothing is imported to read them.
2. `normalize` turns a `RawResult` into a `Solution` (the table in `schedlang.solve.backends`'s
   docstring): the final status, the objective recomputed in the original model, the
   bound and gap checked against the requested gap.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..compile.bounds import box_bound, round_bound
from ..compile.ir import IRModel
from .solution import Solution, Status

# RawResult.termination values
OPTIMAL, LIMIT, INFEASIBLE, UNBOUNDED, INF_OR_UNBD, ERROR, UNKNOWN = (
    "optimal", "limit", "infeasible", "unbounded", "infeasible_or_unbounded", "error",
    "unknown")
TERMINATIONS = (OPTIMAL, LIMIT, INFEASIBLE, UNBOUNDED, INF_OR_UNBD, ERROR, UNKNOWN)

GAP_REL_TOL = 1e-3  # a gap may exceed the requested one by this fraction of it ...
GAP_ABS_TOL = 1e-9  # ... or by this much in absolute terms, and still be optimal
ROW_TOL = 1e-6  # relative feasibility tolerance when checking returned points
INT_TOL = 1e-5  # integrality tolerance when checking returned points


@dataclass
class RawResult:
    """What a backend reports: the solver's verdict, before normalization."""

    termination: str  # one of TERMINATIONS
    x: np.ndarray | None = None  # values of the given model's columns
    objective: float | None = None  # the solver's incumbent value (model objective + constant)
    bound: float | None = None  # the solver's dual bound, same space; None: not available
    detail: str = ""  # the native status, for messages
    notes: list[str] = field(default_factory=list)
    build_time: float = 0.0
    solve_time: float = 0.0
    warm_start_ignored: bool = False  # a MIP start was given and the interface dropped it


# --------------------------------------------------------------------------- interface tables
# Termination words of the solver interfaces shared by several solvers, keyed by the native
# enum member's name (`tc.name`). A name not listed is UNKNOWN.

def by_termination(names: dict[str, str]) -> dict[str, str]:
    """A termination table written termination-first: {word: "native names, spaced"} ->
    {native name: word}."""
    return {native: word for word, listed in names.items() for native in listed.split()}


# pyomo.opt.TerminationCondition (Pyomo's classic SolverFactory plugins: cbc, glpk)
PYOMO_CLASSIC = by_termination({
    OPTIMAL: "optimal globallyOptimal locallyOptimal",
    LIMIT: "maxTimeLimit maxIterations maxEvaluations minStepLength minFunctionValue "
           "userInterrupt resourceInterrupt intermediateNonInteger feasible",
    ERROR: "licensingProblems invalidProblem solverFailure internalSolverError error",
    INFEASIBLE: "infeasible", UNBOUNDED: "unbounded", INF_OR_UNBD: "infeasibleOrUnbounded",
    UNKNOWN: "other unknown",
})

# pyomo.contrib.solver TerminationCondition (the new solver API: highs, gurobi_direct, ...)
PYOMO_CONTRIB = by_termination({
    OPTIMAL: "convergenceCriteriaSatisfied",
    LIMIT: "maxTimeLimit iterationLimit objectiveLimit minStepLength interrupted",
    INFEASIBLE: "provenInfeasible locallyInfeasible", UNBOUNDED: "unbounded",
    INF_OR_UNBD: "infeasibleOrUnbounded", ERROR: "error licensingProblems",
    UNKNOWN: "emptyModel",
})

# pyomo.contrib.appsi TerminationCondition (appsi_highs)
PYOMO_APPSI = by_termination({
    OPTIMAL: "optimal",
    LIMIT: "maxTimeLimit maxIterations objectiveLimit interrupted minStepLength",
    INFEASIBLE: "infeasible", UNBOUNDED: "unbounded", INF_OR_UNBD: "infeasibleOrUnbounded",
    ERROR: "error licensingProblems",
})

# cvxpy's status strings (cvxpy.settings). cvxpy folds a time limit into optimal_inaccurate
# (SCIP, CBC, GLPK) or user_limit (HiGHS, Gurobi); the adapters read the raw answer first
# where the solver exposes it.
CVXPY = by_termination({
    OPTIMAL: "optimal", LIMIT: "optimal_inaccurate user_limit", INFEASIBLE: "infeasible",
    UNBOUNDED: "unbounded", INF_OR_UNBD: "infeasible_or_unbounded",
    UNKNOWN: "infeasible_inaccurate unbounded_inaccurate", ERROR: "solver_error",
})


def termination(table: dict, native) -> str:
    """The termination word for `native` (an enum member or a string) in `table`."""
    key = native if isinstance(native, str) else getattr(native, "name", str(native))
    return table.get(key, UNKNOWN)


# --------------------------------------------------------------------------- normalization

def normalize(ir: IRModel, model: IRModel, post, raw: RawResult, solver: str,
              requested_gap: float, time_limit: float | None, notes: list[str], size: dict,
              base: dict, extra_bound: float | None = None) -> Solution:
    """The `Solution` for `raw`, the answer on the presolved `model` of `ir` (`post`
    expands its point); `requested_gap` decides between optimal and feasible. `extra_bound`:
    a bound proven before the solve (the LP relaxation's), used where it beats the solver's;
    a point at a limit within the requested gap of it is optimal."""
    notes = notes + raw.notes
    term = raw.termination
    detail = f" ({raw.detail})" if raw.detail else ""

    if term == ERROR:
        return Solution(Status.ERROR, message=join(notes + [f"solver failed{detail}"]),
                        model_size=size, **base)
    if term == INFEASIBLE:
        return Solution(Status.INFEASIBLE, message=join(
            notes + [f"the solver proved the model infeasible{detail}"]), model_size=size,
            **base)
    if term == UNBOUNDED:
        return Solution(Status.UNBOUNDED, message=join(
            notes + [f"the objective is unbounded{detail}"]), model_size=size, **base)

    x = None
    feasible = False
    if raw.x is not None:
        xr = np.asarray(raw.x, dtype=float).ravel()
        if xr.shape[0] == model.n_columns and np.all(np.isfinite(xr)):
            x = post.expand(xr)
            feasible, why = is_feasible(ir, x)
            if not feasible:
                notes.append(f"the point returned by the solver is not feasible: {why}")

    at_limit = (time_limit is not None and base["timings"].get("solve", 0.0)
                >= 0.98 * time_limit)
    bound = raw.bound if raw.bound is not None and np.isfinite(raw.bound) else None
    box = box_bound(model) if term != OPTIMAL and model.integrality().any() else None
    if box is not None and (bound is None or _signed_diff(ir, box, bound) > 0):
        if bound is None:  # e.g. stopped before its root LP (Checkmate: every node once)
            notes.append("bound: every column at its best bound (the solver reported none)")
        bound = box
    if extra_bound is not None and np.isfinite(extra_bound) and (
            bound is None or _signed_diff(ir, extra_bound, bound) > 0):
        bound = extra_bound

    if term == OPTIMAL and x is not None:
        # a point that fails our check keeps the solver's verdict (its tolerances rule),
        # with the note above saying so
        status = Status.OPTIMAL
        if bound is None and not model.integrality().any():
            bound = objective_value(ir, x)  # an LP optimum: the dual bound is the objective
    elif term in (OPTIMAL, LIMIT, UNKNOWN):
        if x is not None and feasible:
            status = Status.FEASIBLE
            if term == UNKNOWN:
                notes.append(f"the solver's status is unknown{detail}; its point is feasible")
        elif term == LIMIT or (term == UNKNOWN and at_limit):
            status = Status.NO_SOLUTION
            x = None
        else:
            return Solution(Status.ERROR, message=join(
                notes + [f"the solver returned no usable solution{detail}"]),
                model_size=size, bound=bound, **base)
    else:
        return Solution(Status.ERROR, message=join(notes + [f"unexpected status {term}"]),
                        model_size=size, **base)

    if status == Status.NO_SOLUTION:
        stop = f"stopped{detail} before finding a feasible solution"
        return Solution(Status.NO_SOLUTION, bound=bound, message=join(notes + [stop]),
                        model_size=size, **base)

    x = _round_integers(ir, x)
    obj = objective_value(ir, x)
    bound = round_bound(model, bound)  # the presolved model: fewer columns, a coarser step
    if bound is not None and _signed_diff(ir, bound, obj) > 1e-6 * (1.0 + abs(obj)):
        notes.append(f"the solver's bound {bound:.10g} is on the wrong side of the "
                     f"objective {obj:.10g}; ignored")
        bound = None
    rel_gap = None
    if bound is not None:
        rel_gap = relative_gap(ir, obj, bound)
        if status == Status.OPTIMAL and not within_gap(ir, obj, bound, requested_gap):
            status = Status.FEASIBLE
            notes.append(f"the solver stopped with gap {rel_gap:.3g} above the requested "
                         f"{requested_gap:.3g}; reported as feasible")
        elif status == Status.FEASIBLE and extra_bound is not None and bound == extra_bound \
                and rel_gap <= requested_gap:
            status = Status.OPTIMAL
            notes.append("proven optimal by the LP relaxation's bound")
    if bound is None and model.integrality().any():
        notes.append(f"no bound: {solver} through the {base['backend']} backend reports "
                     f"none, the status rests on its termination reason")
    if status == Status.FEASIBLE and term == LIMIT:
        notes.append(f"stopped at a limit{detail}")
    return Solution(status, objective=obj, bound=bound, gap=rel_gap, x=x,
                    message=join(notes), model_size=size, **base)


# --------------------------------------------------------------------------- helpers

def infeasible_or_unbounded(raw: RawResult, check: RawResult, model: IRModel) -> RawResult:
    """Settle a solver's infeasible-or-unbounded `raw` by `check`, the same rows solved with a
    zero objective: a feasible point means unbounded, proven infeasible rows infeasible."""
    if check.termination == OPTIMAL or (check.termination in (LIMIT, UNKNOWN)
                                        and check.x is not None
                                        and is_feasible(model, check.x)[0]):
        raw.termination = UNBOUNDED
        raw.detail += "; a re-solve with a zero objective found a feasible point"
    elif check.termination == INFEASIBLE:
        raw.termination = INFEASIBLE
        raw.detail += "; a re-solve with a zero objective proved the rows infeasible"
    else:
        raw.termination = ERROR
        raw.detail = (f"the solver reported infeasible-or-unbounded and a feasibility "
                      f"check ended with '{check.termination}' {check.detail}").strip()
    return raw


def join(notes: list[str]) -> str:
    return "; ".join(n for n in notes if n)


def objective_value(ir: IRModel, x: np.ndarray) -> float:
    if ir.objective is None:
        return 0.0
    return float(ir.objective.c @ x + ir.objective.constant)


def _signed_diff(ir: IRModel, obj: float, bound: float) -> float:
    """How far the objective is from the bound in the worse direction (>= 0)."""
    sense = ir.objective.sense if ir.objective is not None else "min"
    d = obj - bound if sense == "min" else bound - obj
    return max(0.0, d)


def within_gap(ir: IRModel, obj: float, bound: float, requested_gap: float) -> bool:
    """Whether objective `obj` is within `requested_gap` of the proven `bound` (with the
    slack of GAP_REL_TOL and GAP_ABS_TOL): what makes a point optimal."""
    diff = _signed_diff(ir, obj, bound)
    return diff <= GAP_ABS_TOL * max(1.0, abs(obj)) \
        or relative_gap(ir, obj, bound) <= requested_gap * (1.0 + GAP_REL_TOL) + GAP_ABS_TOL


def relative_gap(ir: IRModel, obj: float, bound: float) -> float:
    """|obj - bound| / |obj| in the worse direction (0 within GAP_ABS_TOL)."""
    diff = _signed_diff(ir, obj, bound)
    if diff <= GAP_ABS_TOL * max(1.0, abs(obj)):
        return 0.0
    return diff / max(abs(obj), 1e-10)


def _round_integers(ir: IRModel, x: np.ndarray) -> np.ndarray:
    mask = ir.integrality()
    if mask.any():
        x = x.copy()
        x[mask] = np.round(x[mask])
    return x


def is_feasible(ir: IRModel, x: np.ndarray) -> tuple[bool, str]:
    """Does `x` satisfy the rows, bounds and integrality of `ir` (with tolerances)?"""
    lb, ub = ir.column_bounds()
    scale = 1.0 + np.abs(x)
    low = np.flatnonzero(x < lb - ROW_TOL * scale)
    high = np.flatnonzero(x > ub + ROW_TOL * scale)
    if low.size or high.size:
        j = int(low[0] if low.size else high[0])
        return False, f"column {j} = {x[j]:.10g} outside [{lb[j]:.10g}, {ub[j]:.10g}]"
    mask = ir.integrality()
    frac = np.flatnonzero(mask & (np.abs(x - np.round(x)) > INT_TOL))
    if frac.size:
        j = int(frac[0])
        return False, f"integer column {j} = {x[j]:.10g}"
    A, lo, hi = ir.stacked()
    if A.shape[0]:
        act = A @ x
        mag = abs(A) @ np.abs(x)
        tol = ROW_TOL * (1.0 + mag + np.maximum(_finite_abs(lo), _finite_abs(hi)))
        bad = np.flatnonzero((act < lo - tol) | (act > hi + tol))
        if bad.size:
            i = int(bad[0])
            return False, (f"{bad.size} rows violated, e.g. row {i}: {act[i]:.10g} not in "
                           f"[{lo[i]:.10g}, {hi[i]:.10g}]")
    return True, ""


def _finite_abs(v: np.ndarray) -> np.ndarray:
    return np.where(np.isfinite(v), np.abs(v), 0.0)
