"""Backends: from the IR to a native model (Pyomo, CVXPY), solved by the registry's solvers.

Entry points:

* ``build_model(ir, backend)`` returns the native model, without solving (build benchmarks);
* ``solve_ir(ir, backend, solver, ...)`` presolves, builds, solves, postsolves and returns one
  normalized `Solution` whatever the backend and solver.

A backend module exposes ``build(ir)`` and ``solve(ir, run) -> RawResult``; it reports what
the solver said (`RawResult.termination`, the point, the bound) and this module decides the
final status, the same way for every backend:

==========================  ==========================================================
solver said                 status
==========================  ==========================================================
optimal                     ``optimal`` if the gap from our objective and the solver's
                            bound is within the requested gap (the solver's default
                            when not given; 0.1% slack on it), else ``feasible``;
                            without a bound (cvxpy's CBC and GLPK) the termination
                            reason decides, and the message says so
limit (time, nodes, ...)    ``feasible`` with a point that passes our feasibility check
                            of the original rows, bounds and integrality, else
                            ``no_solution``
infeasible                  ``infeasible``
unbounded                   ``unbounded``
infeasible or unbounded     re-solved with a zero objective: feasible → ``unbounded``,
                            infeasible → ``infeasible``
error, an exception         ``error`` with the message
(presolve proves it)        ``infeasible``, the message names the row or variable
unknown                     ``feasible`` with a feasible point; ``no_solution`` when a
                            time limit was reached; else ``error``
==========================  ==========================================================

The objective is recomputed from the returned point in the original model (constant
included); `x` covers every original column (presolve-fixed ones at their values), integer
columns rounded. Timings: ``presolve``; ``build`` (Pyomo: the ConcreteModel; cvxpy: the
Problem and its canonicalization); ``solve`` (the solver call; for Pyomo this includes the
translation into the solver).
"""
from __future__ import annotations

import contextlib
import importlib
import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import SchedError
from ..ir import IRModel, Objective
from ..presolve import Postsolve, presolve as run_presolve, trivial_infeasibility
from ..solution import Solution, Status
from ..solvers import (
    BACKEND_NAMES, NativeOptions, SolverInfo, check_backend, native_options, requested_gap,
    resolve, supports_warm_start,
)

BACKENDS = BACKEND_NAMES

GAP_REL_TOL = 1e-3  # a gap may exceed the requested one by this fraction of it ...
GAP_ABS_TOL = 1e-9  # ... or by this much in absolute terms, and still be optimal
ROW_TOL = 1e-6  # relative feasibility tolerance when checking returned points
INT_TOL = 1e-5  # integrality tolerance when checking returned points

# RawResult.termination values
OPTIMAL, LIMIT, INFEASIBLE, UNBOUNDED, INF_OR_UNBD, ERROR, UNKNOWN = (
    "optimal", "limit", "infeasible", "unbounded", "infeasible_or_unbounded", "error",
    "unknown")


# HiGHS model statuses (HighsModelStatus names), as every backend reads them
HIGHS_TERMINATION = {
    "kOptimal": OPTIMAL, "kInfeasible": INFEASIBLE, "kUnbounded": UNBOUNDED,
    "kUnboundedOrInfeasible": INF_OR_UNBD, "kTimeLimit": LIMIT, "kIterationLimit": LIMIT,
    "kSolutionLimit": LIMIT, "kObjectiveBound": LIMIT, "kObjectiveTarget": LIMIT,
    "kInterrupt": LIMIT, "kHighsInterrupt": LIMIT, "kMemoryLimit": LIMIT, "kNotset": ERROR,
    "kLoadError": ERROR, "kModelError": ERROR, "kPresolveError": ERROR, "kSolveError": ERROR,
    "kPostsolveError": ERROR, "kModelEmpty": UNKNOWN, "kUnknown": UNKNOWN,
}


@dataclass
class SolveRun:
    """What a backend needs to run one solve."""

    solver: SolverInfo
    options: NativeOptions
    time_limit: float | None = None
    warm_start: np.ndarray | None = None  # reduced-model columns; None: no MIP start
    verbose: bool = False
    interface: str | None = None  # force a Pyomo interface (tests, benchmarks)


@dataclass
class RawResult:
    """What a backend reports: the solver's verdict, before normalization."""

    termination: str  # one of OPTIMAL, LIMIT, INFEASIBLE, UNBOUNDED, INF_OR_UNBD, ERROR, UNKNOWN
    x: np.ndarray | None = None  # values of the given model's columns
    objective: float | None = None  # the solver's incumbent value (model objective + constant)
    bound: float | None = None  # the solver's dual bound, same space; None: not available
    detail: str = ""  # the native status, for messages
    notes: list[str] = field(default_factory=list)
    build_time: float = 0.0
    solve_time: float = 0.0


_highs_threads: list = [None]  # the thread count HiGHS' global scheduler was last set to


def prepare_highs_threads(threads: int | None) -> None:
    """HiGHS keeps one global thread scheduler per process and fails a run (model status
    kNotset) that asks for another thread count; reset the scheduler when it changes."""
    if threads is None or threads == _highs_threads[0]:
        return
    import highspy
    highspy.Highs.resetGlobalScheduler(True)
    _highs_threads[0] = threads


def _backend_module(backend: str):
    check_backend(backend)
    return importlib.import_module(f"{__name__}.{backend}_backend")


def build_model(ir: IRModel, backend: str) -> object:
    """The native model for `ir` (a Pyomo ConcreteModel, a cvxpy Problem); no solve."""
    return _backend_module(backend).build(ir)


def solve_ir(ir: IRModel, backend: str = "pyomo", solver: str = "highs",
             time_limit: float | None = None, gap: float | None = None,
             threads: int | None = None, presolve: bool = True,
             warm_start: np.ndarray | None = None, verbose: bool = False) -> Solution:
    """Presolve, build, solve and postsolve `ir`; one normalized `Solution`.

    Raises `SolverUnavailable` for an unknown backend or solver, or one not installed,
    and `SchedError` for invalid option values; everything the solver does wrong becomes
    ``Status.ERROR`` with a message.
    """
    check_backend(backend)
    info = resolve(solver, backend)
    try:
        opts = native_options(info.name, backend, time_limit, gap, threads)
    except ValueError as exc:
        raise SchedError(str(exc)) from None
    notes = list(opts.notes)
    timings: dict[str, float] = {}
    base = dict(backend=backend, solver=info.name, timings=timings)

    if warm_start is not None:
        warm_start = np.asarray(warm_start, dtype=float).ravel()
        if warm_start.shape[0] != ir.n_columns:
            raise SchedError(f"warm start has {warm_start.shape[0]} values, the model "
                             f"{ir.n_columns} columns")

    t0 = time.perf_counter()
    if presolve:
        model, post = run_presolve(ir)
        if post.infeasible is None and post.summary():
            notes.append(post.summary())
    else:
        model, post = ir, Postsolve.identity(ir)
    timings["presolve"] = time.perf_counter() - t0
    reason = post.infeasible or trivial_infeasibility(model)
    if reason:
        return Solution(Status.INFEASIBLE, message=_join(notes + [reason]),
                        model_size=model.size_summary(), **base)
    size = model.size_summary()

    if model.n_columns == 0:  # presolve fixed everything
        timings["build"] = timings["solve"] = 0.0
        x = post.expand(np.zeros(0))
        obj = _objective_value(ir, x)
        return Solution(Status.OPTIMAL, objective=obj, bound=obj, gap=0.0, x=x,
                        message=_join(notes + ["solved by presolve"]),
                        model_size=size, **base)

    ws = None
    if warm_start is not None:
        if supports_warm_start(info.name, backend):
            ws = post.restrict(warm_start)
        else:
            notes.append(f"warm start ignored: the {backend} backend cannot pass a MIP "
                         f"start to {info.name}")

    if info.name == "highs":
        prepare_highs_threads(threads)
    run = SolveRun(info, opts, time_limit, ws, verbose)
    raw = _call_backend(backend, model, run)
    timings["build"] = raw.build_time
    timings["solve"] = raw.solve_time

    if raw.termination == INF_OR_UNBD:
        raw = _disambiguate(backend, model, run, raw)

    return _normalize(ir, model, post, raw, info, gap, time_limit, notes, size, base)


def _call_backend(backend: str, model: IRModel, run: SolveRun) -> RawResult:
    try:
        with _solver_output_to_stderr():
            return _backend_module(backend).solve(model, run)
    except SchedError:
        raise
    except Exception as exc:  # a solver failure is a result, not a traceback
        return RawResult(ERROR, detail=f"{type(exc).__name__}: {exc}")


@contextlib.contextmanager
def _solver_output_to_stderr():
    """Solvers print banners and logs on file descriptor 1 (Gurobi's licence line, HiGHS and
    cvxpy logs with verbose=True); send them to stderr so that stdout stays clean for
    `schedlang solve --json`. Process-wide while a solve runs."""
    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError, AttributeError):
        yield
        return
    try:
        os.dup2(2, 1)
        yield
    finally:
        try:
            sys.stdout.flush()
        except (OSError, ValueError):
            pass
        os.dup2(saved, 1)
        os.close(saved)


def _disambiguate(backend: str, model: IRModel, run: SolveRun, raw: RawResult) -> RawResult:
    """Infeasible or unbounded? Solve the feasibility problem (zero objective) to tell."""
    o = model.objective
    probe = IRModel(model.name, model.variables, model.constraints,
                    Objective(o.name if o else "feasibility", "min",
                              np.zeros(model.n_columns), 0.0))
    check = _call_backend(backend, probe, SolveRun(run.solver, run.options, run.time_limit,
                                                   None, run.verbose))
    raw.build_time += check.build_time
    raw.solve_time += check.solve_time
    if check.termination == OPTIMAL or (check.termination in (LIMIT, UNKNOWN)
                                        and check.x is not None
                                        and _is_feasible(model, check.x)[0]):
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


def _normalize(ir: IRModel, model: IRModel, post: Postsolve, raw: RawResult,
               info: SolverInfo, gap: float | None, time_limit: float | None,
               notes: list[str], size: dict, base: dict) -> Solution:
    notes = notes + raw.notes
    term = raw.termination
    detail = f" ({raw.detail})" if raw.detail else ""

    if term == ERROR:
        return Solution(Status.ERROR, message=_join(notes + [f"solver failed{detail}"]),
                        model_size=size, **base)
    if term == INFEASIBLE:
        return Solution(Status.INFEASIBLE, message=_join(
            notes + [f"the solver proved the model infeasible{detail}"]), model_size=size,
            **base)
    if term == UNBOUNDED:
        return Solution(Status.UNBOUNDED, message=_join(
            notes + [f"the objective is unbounded{detail}"]), model_size=size, **base)

    x = None
    feasible = False
    if raw.x is not None:
        xr = np.asarray(raw.x, dtype=float).ravel()
        if xr.shape[0] == model.n_columns and np.all(np.isfinite(xr)):
            x = post.expand(xr)
            feasible, why = _is_feasible(ir, x)
            if not feasible:
                notes.append(f"the point returned by the solver is not feasible: {why}")

    at_limit = (time_limit is not None and base["timings"].get("solve", 0.0)
                >= 0.98 * time_limit)
    bound = raw.bound if raw.bound is not None and np.isfinite(raw.bound) else None

    if term == OPTIMAL and x is not None:
        # a point that fails our check keeps the solver's verdict (its tolerances rule),
        # with the note above saying so
        status = Status.OPTIMAL
        if bound is None and not model.integrality().any():
            bound = _objective_value(ir, x)  # an LP optimum: the dual bound is the objective
    elif term in (OPTIMAL, LIMIT, UNKNOWN):
        if x is not None and feasible:
            status = Status.FEASIBLE
            if term == UNKNOWN:
                notes.append(f"the solver's status is unknown{detail}; its point is feasible")
        elif term == LIMIT or (term == UNKNOWN and at_limit):
            status = Status.NO_SOLUTION
            x = None
        else:
            return Solution(Status.ERROR, message=_join(
                notes + [f"the solver returned no usable solution{detail}"]),
                model_size=size, bound=bound, **base)
    else:
        return Solution(Status.ERROR, message=_join(notes + [f"unexpected status {term}"]),
                        model_size=size, **base)

    if status == Status.NO_SOLUTION:
        stop = f"stopped{detail} before finding a feasible solution"
        return Solution(Status.NO_SOLUTION, bound=bound, message=_join(notes + [stop]),
                        model_size=size, **base)

    x = _round_integers(ir, x)
    obj = _objective_value(ir, x)
    if bound is not None and _signed_diff(ir, bound, obj) > 1e-6 * (1.0 + abs(obj)):
        notes.append(f"the solver's bound {bound:.10g} is on the wrong side of the "
                     f"objective {obj:.10g}; ignored")
        bound = None
    rel_gap = None
    if bound is not None:
        rel_gap = _relative_gap(ir, obj, bound)
        want = requested_gap(info.name, gap)
        diff = _signed_diff(ir, obj, bound)
        if status == Status.OPTIMAL and diff > GAP_ABS_TOL * max(1.0, abs(obj)) \
                and rel_gap > want * (1.0 + GAP_REL_TOL) + GAP_ABS_TOL:
            status = Status.FEASIBLE
            notes.append(f"the solver stopped with gap {rel_gap:.3g} above the requested "
                         f"{want:.3g}; reported as feasible")
    if bound is None and model.integrality().any():
        notes.append(f"no bound: {info.name} through the {base['backend']} backend reports "
                     f"none, the status rests on its termination reason")
    if status == Status.FEASIBLE and term == LIMIT:
        notes.append(f"stopped at a limit{detail}")
    return Solution(status, objective=obj, bound=bound, gap=rel_gap, x=x,
                    message=_join(notes), model_size=size, **base)


# --------------------------------------------------------------------------- helpers

def _join(notes: list[str]) -> str:
    return "; ".join(n for n in notes if n)


def _objective_value(ir: IRModel, x: np.ndarray) -> float:
    if ir.objective is None:
        return 0.0
    return float(ir.objective.c @ x + ir.objective.constant)


def _signed_diff(ir: IRModel, obj: float, bound: float) -> float:
    """How far the objective is from the bound in the worse direction (>= 0)."""
    sense = ir.objective.sense if ir.objective is not None else "min"
    d = obj - bound if sense == "min" else bound - obj
    return max(0.0, d)


def _relative_gap(ir: IRModel, obj: float, bound: float) -> float:
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


def _is_feasible(ir: IRModel, x: np.ndarray) -> tuple[bool, str]:
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
