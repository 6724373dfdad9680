"""Backends: from the IR to a native model (Pyomo, CVXPY), solved by the registry's solvers.

Entry points:

* ``build_model(ir, backend)`` returns the native model, without solving (build benchmarks);
* ``solve_ir(ir, backend, solver, ...)`` presolves, builds, solves, postsolves and returns one
  normalized `Solution` whatever the backend and solver.

A backend module exposes ``build(ir)`` and ``solve(ir, run) -> RawResult``; it reports what
the solver said (`RawResult.termination`, the point, the bound), reading the solver's answer
with its adapter (`schedlang/solve/solvers/`), and `schedlang.solve.status.normalize` decides
the final status, the same way for every backend:

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

import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ...compile.bounds import cutoff_bounds
from ...compile.ir import IRModel, Objective
from ...compile.presolve import Postsolve, trivial_infeasibility
from ...compile.presolve import presolve as run_presolve
from ...language.errors import SchedError
from .. import relaxation
from ..progress import Progress
from ..solution import Solution, Status
from ..solvers import (
    BACKEND_NAMES,
    NativeOptions,
    SolverAdapter,
    check_backend,
    native_options,
    requested_gap,
    resolve,
    supports_warm_start,
)
from ..solvers.base import output_to_stderr
from ..solvers.highs import Interrupts
from ..status import (
    ERROR,
    INF_OR_UNBD,
    LIMIT,
    RawResult,
    infeasible_or_unbounded,
    is_feasible,
    join,
    normalize,
    objective_value,
)

BACKENDS = BACKEND_NAMES


@dataclass
class SolveRun:
    """What a backend needs to run one solve."""

    solver: SolverAdapter
    options: NativeOptions
    time_limit: float | None = None
    warm_start: np.ndarray | None = None  # reduced-model columns; None: no MIP start
    verbose: bool = False
    interface: str | None = None  # force a Pyomo interface (tests, benchmarks)
    progress: Callable[[Progress], None] | None = None  # fed while the solver runs, if it can
    deadline: float | None = None  # time.monotonic() by which the solve must end (watchdog)


def _backend_module(backend: str):
    check_backend(backend)
    return importlib.import_module(f"{__name__}.{backend}_backend")


def build_model(ir: IRModel, backend: str) -> object:
    """The native model for `ir` (a Pyomo ConcreteModel, a cvxpy Problem); no solve."""
    return _backend_module(backend).build(ir)


#: the largest bound (a row's or a column's, in the model's own units) at which a solver's
#: feasibility tolerance (HiGHS: 1e-9, on its scaled model) stays under 1 KiB in the shipped
#: models (memory in MiB); below a KiB, a plan a tolerance lets over its budget is solved again
#: below it (`Problem.solve`)
LARGE_BOUND = 1e6


def large_numbers(model: IRModel) -> list[str]:
    """A note when a finite row or column bound of `model` passes `LARGE_BOUND`: there the
    solver cannot tell a memory row that fits from one 1 KiB over, and its 'infeasible' (or a
    plan the simulator finds over the budget) may come from its tolerance, not the data."""
    worst, where = 0.0, ""
    for b in model.constraints:
        for arr in (b.lo, b.hi):
            finite = np.abs(arr[np.isfinite(arr)])
            if finite.size and finite.max() > worst:
                worst, where = float(finite.max()), f"constraint {b.name}"
    for f in model.variables:
        for arr in (f.lb, f.ub):
            finite = np.abs(np.asarray(arr, dtype=float))
            finite = finite[np.isfinite(finite)]
            if finite.size and finite.max() > worst:
                worst, where = float(finite.max()), f"variable {f.name}"
    if worst <= LARGE_BOUND:
        return []
    return [f"numbers in the model reach {worst:.4g} ({where}), over {LARGE_BOUND:.0e}: the "
            "solver's feasibility tolerance is then coarser than the model's resolution, so an "
            "'infeasible' or a plan over the budget may come from it; give the model coarser "
            "units (docs/reliability.md)"]


def solve_ir(ir: IRModel, backend: str = "pyomo", solver: str = "highs",
             time_limit: float | None = None, gap: float | None = None,
             threads: int | None = None, presolve: bool = True,
             warm_start: np.ndarray | None = None, verbose: bool = False,
             progress: Callable[[Progress], None] | None = None,
             deadline: float | None = None, solver_options: dict | None = None) -> Solution:
    """Presolve, build, solve and postsolve `ir`; one normalized `Solution`.

    `solver_options`: options in the solver's own spelling for the interface `backend` drives
    (HiGHS: ``{"presolve": "off"}``), set after the common ones (`native_options`), so they
    may override them.

    `progress` is called with a `Progress` now and then while the solver runs, where the
    solver reports it (HiGHS through the Pyomo backend; `schedlang.solve.progress`).
    `deadline` (a `time.monotonic()` instant) bounds the rest of the solve, build included:
    the solver's time limit becomes the time left once the model is built, and HiGHS through
    the Pyomo backend is watched (`solvers.highs.Interrupts`): a solver still running at the
    deadline is stopped, and its best point (or the MIP start) returned as at a time limit.

    Raises `SolverUnavailable` for an unknown backend or solver, or one not installed,
    and `SchedError` for invalid option values; everything the solver does wrong becomes
    ``Status.ERROR`` with a message.
    """
    check_backend(backend)
    info = resolve(solver, backend)
    try:
        opts = native_options(info.name, backend, time_limit, gap, threads, solver_options)
    except ValueError as exc:
        raise SchedError(str(exc)) from None
    notes = list(opts.notes)
    timings: dict[str, float] = {}
    base = dict(backend=backend, solver=info.name, timings=timings)
    lagrangian = None  # a proven bound from the LP relaxation's duals (`_cutoff`)

    if warm_start is not None:
        warm_start = np.asarray(warm_start, dtype=float).ravel()
        if warm_start.shape[0] != ir.n_columns:
            raise SchedError(f"warm start has {warm_start.shape[0]} values, the model "
                             f"{ir.n_columns} columns")

    t0 = time.perf_counter()
    if deadline is not None and time.monotonic() >= deadline:  # no time left: no presolve
        presolve = False
    if presolve:
        model, post = run_presolve(ir)
        if post.infeasible is None and warm_start is not None \
                and is_feasible(ir, warm_start)[0]:
            model, post, lagrangian, note, signal = _cutoff(model, post, warm_start, gap,
                                                            deadline)
            notes += note
            if signal is not None:  # Ctrl-C / SIGTERM during the LP: the start, as HiGHS would
                timings["presolve"] = time.perf_counter() - t0
                timings["build"] = timings["solve"] = 0.0
                raw = RawResult(LIMIT, x=post.restrict(warm_start),
                                detail=f"interrupted by {signal} during the LP relaxation of the "
                                       f"cutoff; the MIP start is returned")
                return normalize(ir, model, post, raw, info.name, requested_gap(info.name, gap),
                                 time_limit, notes, model.size_summary(), base,
                                 extra_bound=lagrangian)
        if post.infeasible is None and post.summary():
            notes.insert(len(opts.notes), post.summary())
    else:
        model, post = ir, Postsolve.identity(ir)
    timings["presolve"] = time.perf_counter() - t0
    reason = post.infeasible or trivial_infeasibility(model)
    if reason:
        return Solution(Status.INFEASIBLE, message=join(notes + [reason]),
                        model_size=model.size_summary(), **base)
    size = model.size_summary()
    notes += large_numbers(model)

    if model.n_columns == 0:  # presolve fixed everything
        timings["build"] = timings["solve"] = 0.0
        x = post.expand(np.zeros(0))
        obj = objective_value(ir, x)
        return Solution(Status.OPTIMAL, objective=obj, bound=obj, gap=0.0, x=x,
                        message=join(notes + ["solved by presolve"]),
                        model_size=size, **base)

    ws = None
    if warm_start is not None:
        if supports_warm_start(info.name, backend):
            ws = post.restrict(warm_start)
        else:
            notes.append(f"warm start ignored: the {backend} backend cannot pass a MIP "
                         f"start to {info.name}")

    if deadline is not None and time.monotonic() >= deadline:  # no time left to build
        timings["build"] = timings["solve"] = 0.0
        raw = RawResult(LIMIT, x=ws, detail="time limit: reached before the model was built"
                        + ("; the MIP start is returned" if ws is not None else ""))
        return normalize(ir, model, post, raw, info.name, requested_gap(info.name, gap),
                         time_limit, notes, size, base)
    if deadline is not None:  # the time left is the solver's limit (build included)
        left = max(deadline - time.monotonic(), 0.0)
        limit = left if time_limit is None else min(float(time_limit), left)
        opts = native_options(info.name, backend, limit, gap, threads, solver_options)
        time_limit = limit
    run = SolveRun(info, opts, time_limit, ws, verbose, progress=progress, deadline=deadline)
    with info.session(threads, verbose):
        raw = _call_backend(backend, model, run)
        if raw.termination == INF_OR_UNBD:
            raw = _disambiguate(backend, model, run, raw)
    timings["build"] = raw.build_time
    timings["solve"] = raw.solve_time
    sol = normalize(ir, model, post, raw, info.name, requested_gap(info.name, gap), time_limit,
                    notes, size, base, extra_bound=lagrangian)
    sol.warm_start_ignored = warm_start is not None and (ws is None or raw.warm_start_ignored)
    return sol


# `_cutoff` solves the LP relaxation for its duals on models of CUTOFF_LP_COLUMNS to
# CUTOFF_LP_MAX_COLUMNS columns (below, HiGHS's own root LP is cheap; above, the LP alone
# takes minutes on 2 cores: resnet50_train's 321,506), with at most CUTOFF_LP_SHARE of the
# time left before the deadline; each presolve after a cutoff runs at most
# CUTOFF_PRESOLVE_ROUNDS rounds (the fixings propagate one stage a round; HiGHS's presolve
# carries them on: resnet50_train, 50 rounds 38 s, 8 rounds 6 s)
CUTOFF_LP_COLUMNS = 10_000
CUTOFF_LP_MAX_COLUMNS = 150_000
CUTOFF_LP_SHARE = 0.4
CUTOFF_PRESOLVE_ROUNDS = 8


def _cutoff(model: IRModel, post: Postsolve, start: np.ndarray, gap: float | None,
            deadline: float | None):
    """Bounds that no point as good as the feasible MIP `start` crosses
    (`bounds.cutoff_bounds`), each round followed by a presolve: first from the objective's
    coefficients, then, on a large model, from the duals of its LP relaxation
    (`relaxation.lp_duals`, reduced-cost fixing; the LP's bound is proven and returned).
    mobilenet_train at 90% from knapsack's start: 94,119 columns -> 79,792 -> 61,028 (15,626
    after HiGHS's presolve, against 92,371 without), and HiGHS's root LP takes 1 s instead of
    ~60. The LP runs under `solvers.highs.Interrupts`: Ctrl-C or SIGTERM stops it. Returns
    (model, postsolve, the bound or None, notes, the signal's name or None)."""
    x = post.restrict(start)
    lagrangian, notes, tightened = None, [], 0
    interrupts = Interrupts(deadline)
    for use_lp in (False, True):
        y = None
        if use_lp:
            if not CUTOFF_LP_COLUMNS <= model.n_columns <= CUTOFF_LP_MAX_COLUMNS \
                    or not model.integrality().any():
                break
            limit = None if deadline is None else CUTOFF_LP_SHARE * (deadline - time.monotonic())
            y = relaxation.lp_duals(model, limit, interrupts)
            if y is None:
                if interrupts.requested is None:
                    notes.append("cutoff: the LP relaxation was not solved in time")
                break
        cut, count, bound = cutoff_bounds(model, x, y)
        if use_lp and bound is not None:
            lagrangian = bound
        if count:
            again, inner = run_presolve(cut, max_rounds=CUTOFF_PRESOLVE_ROUNDS)
            if inner.infeasible is not None:  # (it cannot be: the start is inside)
                break
            model, post, x = again, post.then(inner), inner.restrict(x)
            tightened += count
    if tightened:
        notes.append(f"cutoff: {tightened} integer bounds from the MIP start's objective"
                     + (" and the LP relaxation's reduced costs" if lagrangian is not None else ""))
    return model, post, lagrangian, notes, interrupts.requested


def _call_backend(backend: str, model: IRModel, run: SolveRun) -> RawResult:
    try:
        with output_to_stderr():
            return _backend_module(backend).solve(model, run)
    except SchedError:
        raise
    except Exception as exc:  # a solver failure is a result, not a traceback
        return RawResult(ERROR, detail=f"{type(exc).__name__}: {exc}")


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
    return infeasible_or_unbounded(raw, check, model)
