"""CP-SAT (OR-Tools), built straight from the IR; `pip install "schedlang[cpsat]"`.

CP-SAT solves integer programs only, so the IR is made integral *exactly* before it is handed
over (`integral_model`), never by rounding a coefficient:

* every row is multiplied by the smallest power of two (up to 2^`MAX_SHIFT`) that makes its
  coefficients integers; a float times a power of two is exact, so the row is the same row.
  Its bounds are then rounded inwards (``ceil(lo)``, ``floor(hi)``), which loses nothing
  because the row's activity is an integer: a plan within the budget stays within it and a
  plan over it stays over it. Checkmate's memory rows (sizes in MiB, sizes / 2^20) become rows
  in bytes this way. Rows that no power of two makes integral but a power of ten (up to
  10^`MAX_DECIMALS`) does, within 1e-12 relative (data written in decimal, e.g. `12.345`),
  are scaled by it, their coefficients taken as the decimals they were written as;
* continuous columns are taken in steps of 1/K (y = K x, y integer), K the smallest power of
  two that makes every row holding a continuous column integral before the substitution
  (Checkmate's memory U, a sum of sizes in MiB: K = 2^20, bytes). Where a continuous column
  can take values between those steps at every optimum (not so in the shipped stage models),
  CP-SAT's optimum can only be worse than the MILP's, never better;
* a model that needs more than 2^`MAX_SHIFT` is refused with a message (`NotIntegral`):
  solve it with HiGHS.

The objective is scaled the same way when a power of two makes it integral (then CP-SAT's bound
is exact), else it is passed as CP-SAT's floating-point objective. A MIP start becomes CP-SAT's
solution hint. The first SIGINT/SIGTERM, like the whole-run watchdog's deadline, stops the
search (`stop_search`) and the best solution comes back as at a time limit; the search runs on
a worker thread while the main thread waits in Python (`highs.Interrupts`); a search still
running one second after the deadline (CP-SAT's presolve of a large model) is left to stop on
its thread and the MIP start is returned, as HiGHS's watchdog does. Progress (incumbent,
bound) comes from CP-SAT's solution and bound callbacks.

Only the Pyomo backend drives it (interface `cpsat_ir`: the Pyomo model is not built, the IR
goes to CP-SAT as it is); cvxpy has no CP-SAT interface.
"""
from __future__ import annotations

import math
import threading
import time

import numpy as np

from ..progress import Progress
from ..status import ERROR, INFEASIBLE, LIMIT, OPTIMAL, UNBOUNDED, UNKNOWN, RawResult, by_termination, termination
from .base import NativeOptions, SolverAdapter, spell
from .highs import LEFT_RUNNING, Interrupts

#: CP-SAT's workers where schedlang chooses them (the op-graph route without --threads, the
#: window bounds' MILP): more than the cores, for its LP-based workers and neighbourhood
#: searches (measured on 2 cores: `tiny` at 60% from the same start, 90 s side by side,
#: 0.0012588 with 8, nothing better than the start's 0.0012926 with 2; bench/README.md,
#: issue 29 round 5)
PORTFOLIO_WORKERS = 8

# CpSolverStatus names -> termination (UNKNOWN: a limit before any solution)
TERMINATION = by_termination({
    OPTIMAL: "OPTIMAL", LIMIT: "FEASIBLE UNKNOWN", INFEASIBLE: "INFEASIBLE",
    ERROR: "MODEL_INVALID",
})

MAX_SHIFT = 40  # the largest power of two a row, a column or the objective is scaled by
MAX_DECIMALS = 9  # ... else the largest power of ten (coefficients written in decimal)
DECIMAL_TOL = 1e-12  # relative distance to an integer forgiven after a power of ten
INTERFACE = "cpsat_ir"


class NotIntegral(ValueError):
    """The model cannot be made integral exactly within 2^MAX_SHIFT."""


class CpSat(SolverAdapter):
    def options(self, backend, time_limit, gap, threads) -> NativeOptions:
        # our default relative gap (CP-SAT's own is 0), overridden by `gap`
        return NativeOptions(spell(("max_time_in_seconds", "relative_gap_limit", "num_workers"),
                                   time_limit, gap, threads,
                                   relative_gap_limit=self.default_gap, absolute_gap_limit=0.0))

    def pyomo_interface_available(self, interface: str) -> bool | None:
        if interface != INTERFACE:
            return None
        try:
            from ortools.sat.python import cp_model  # noqa: F401
        except Exception:  # a broken installation is an unavailable solver
            return False
        return True


ADAPTER = CpSat("cpsat", 1e-4, (INTERFACE,), "CPSAT", warm_start=frozenset({"pyomo"}),
                doc="CP-SAT (OR-Tools), from the IR; integer models (exact scaling)",
                install=(("pyomo", 'pip install "schedlang[cpsat]" (OR-Tools)'),
                         ("cvxpy", 'pip install "schedlang[cpsat]" (OR-Tools)')))


# --------------------------------------------------------------------------- exact scaling

def _scale(values) -> tuple[float, bool] | None:
    """(f, exact): the least power of two f <= 2^MAX_SHIFT with values * f all integers
    exactly (exact True), else the least power of ten f <= 10^MAX_DECIMALS with values * f
    within DECIMAL_TOL (relative) of integers: data written in decimal (exact False); None
    when neither exists."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v) & (v != 0)]
    if v.size == 0:
        return 1.0, True
    for k in range(MAX_SHIFT + 1):
        w = np.ldexp(v, k)
        if np.all(w == np.round(w)):
            return float(2 ** k), True
    for k in range(1, MAX_DECIMALS + 1):
        w = v * 10.0 ** k
        if np.all(np.abs(w - np.round(w)) <= DECIMAL_TOL * np.abs(w)):
            return 10.0 ** k, False
    return None


class Integral:
    """The IR as integer rows: ``lo <= A y <= hi`` over integer columns y in [lb, ub], with
    x = y / col_scale; the objective c . y / obj_scale + constant (c integral when
    `obj_exact`)."""

    def __init__(self, A, lo, hi, lb, ub, col_scale, c, obj_scale, obj_exact, constant, sense):
        self.A, self.lo, self.hi, self.lb, self.ub = A, lo, hi, lb, ub
        self.col_scale, self.c, self.obj_scale = col_scale, c, obj_scale
        self.obj_exact, self.constant, self.sense = obj_exact, constant, sense

    def to_x(self, y) -> np.ndarray:
        return np.asarray(y, dtype=float) / self.col_scale

    def to_y(self, x) -> np.ndarray:
        return np.round(np.asarray(x, dtype=float) * self.col_scale)

    def model_value(self, v: float) -> float:
        return v / self.obj_scale + self.constant


def _inward(lo: np.ndarray, hi: np.ndarray, exact: np.ndarray):
    """Scaled bounds rounded inwards to integers; decimal rows (not `exact`) first forgive
    the representation error of their decimal data."""
    slack = np.where(exact, 0.0, DECIMAL_TOL * np.maximum(1.0, np.abs(np.where(
        np.isfinite(hi), hi, np.where(np.isfinite(lo), lo, 0.0)))))
    with np.errstate(invalid="ignore"):
        return (np.where(np.isfinite(lo), np.ceil(lo - slack), -np.inf),
                np.where(np.isfinite(hi), np.floor(hi + slack), np.inf))


def _row_scales(A, extra=None) -> tuple[np.ndarray, np.ndarray]:
    """Per row of the CSR matrix `A` (and its `extra` values per row, e.g. bounds), `_scale`
    vectorized: (factor, exact); factor 0 where none exists."""
    n = A.shape[0]
    data = np.asarray(A.data, dtype=float)
    rows = np.repeat(np.arange(n), np.diff(A.indptr))
    if extra is not None:
        e = np.asarray(extra, dtype=float)
        data = np.concatenate([data, e.ravel()])
        rows = np.concatenate([rows, np.repeat(np.arange(n), e.shape[1])])
    keep = np.isfinite(data) & (data != 0)
    data, rows = data[keep], rows[keep]
    factor = np.zeros(n)
    exact = np.ones(n, dtype=bool)
    todo = np.ones(n, dtype=bool)

    def settle(f: float, w: np.ndarray, ok: np.ndarray, is_exact: bool) -> None:
        bad = np.zeros(n, dtype=bool)
        bad[rows[~ok]] = True
        done = todo & ~bad
        factor[done], exact[done] = f, is_exact
        todo[done] = False

    for k in range(MAX_SHIFT + 1):
        w = np.ldexp(data, k)
        settle(2.0 ** k, w, w == np.round(w), True)
        if not todo.any():
            break
    for k in range(1, MAX_DECIMALS + 1):
        if not todo.any():
            break
        w = data * 10.0 ** k
        settle(10.0 ** k, w, np.abs(w - np.round(w)) <= DECIMAL_TOL * np.abs(w), False)
    return factor, exact


def _refuse(factor: np.ndarray) -> None:
    bad = np.flatnonzero(factor == 0)
    if bad.size:
        raise NotIntegral(f"row {int(bad[0])} has coefficients that no power of two up to "
                          f"2^{MAX_SHIFT} or of ten up to 10^{MAX_DECIMALS} makes integers")


def integral_model(ir) -> Integral:
    """`ir` scaled to integers (the module docstring); `NotIntegral` when it cannot be."""
    import scipy.sparse as sp

    A, lo, hi = ir.stacked()
    A = sp.csr_matrix(A, dtype=float)
    A.sum_duplicates()
    lb, ub = ir.column_bounds()
    cont = ~ir.integrality()
    col_scale = np.ones(ir.n_columns)
    col_exact = True
    if cont.any():
        rows = np.flatnonzero(np.diff(sp.csr_matrix(A[:, cont]).indptr) > 0)
        factor, exact = _row_scales(A[rows], np.stack([lo[rows], hi[rows]], axis=1))
        _refuse(factor)
        if rows.size:
            col_scale[cont] = factor.max()
            col_exact = bool(exact.all())
        A = sp.csr_matrix(A @ sp.diags(1.0 / col_scale))
    row_scale, exact = _row_scales(A)
    _refuse(row_scale)
    A = sp.csr_matrix(sp.diags(row_scale) @ A)
    A.data = np.round(A.data)
    lo_i, hi_i = _inward(lo * row_scale, hi * row_scale, exact)
    lb_i, ub_i = _inward(lb * col_scale, ub * col_scale, np.full(len(lb), col_exact))
    obj = ir.objective
    c = (obj.c if obj is not None else np.zeros(ir.n_columns)) / col_scale
    got = _scale(c)
    obj_exact = got is not None and got[0] <= 2.0 ** 30
    obj_scale = got[0] if obj_exact else 1.0
    return Integral(A, lo_i, hi_i, lb_i, ub_i, col_scale,
                    np.round(c * obj_scale) if obj_exact else c, obj_scale, obj_exact,
                    obj.constant if obj is not None else 0.0,
                    obj.sense if obj is not None else "min")


# --------------------------------------------------------------------------- solve

# CP-SAT works in int64 and refuses a model whose sums could overflow; bounds beyond this
# are treated as infinite (a column or row with no finite bound gets it).
INT_RANGE = 2 ** 53


def _domain(lo: float, hi: float) -> list[int]:
    lo = -INT_RANGE if not math.isfinite(lo) else max(int(lo), -INT_RANGE)
    hi = INT_RANGE if not math.isfinite(hi) else min(int(hi), INT_RANGE)
    return [lo, hi]


class OutOfTime(Exception):
    """The deadline passed while the CP-SAT model was being built."""


def build(m: Integral, hint: np.ndarray | None = None, deadline: float | None = None):
    """The CpModel of `m` (and the hint y = scaled MIP start); `OutOfTime` once `deadline`
    (a `time.monotonic()` instant) has passed, checked every 10,000 rows."""
    from ortools.sat.python import cp_model

    model = cp_model.CpModel()
    proto = model.proto
    for lo, hi in zip(m.lb.tolist(), m.ub.tolist()):
        proto.variables.add().domain.extend(_domain(lo, hi))
    A = m.A
    indptr, indices = A.indptr, A.indices
    data = A.data.astype(np.int64)
    for i, (lo, hi) in enumerate(zip(m.lo.tolist(), m.hi.tolist())):
        if deadline is not None and i % 10000 == 0 and time.monotonic() >= deadline:
            raise OutOfTime
        s, e = indptr[i], indptr[i + 1]
        if s == e:
            continue
        lin = proto.constraints.add().linear
        lin.vars.extend(indices[s:e].tolist())
        lin.coeffs.extend(data[s:e].tolist())
        lin.domain.extend(_domain(lo, hi))
    nz = np.flatnonzero(m.c)
    sign = -1.0 if m.sense == "max" else 1.0
    if m.obj_exact:
        objective = proto.objective
        objective.vars.extend(nz.tolist())
        objective.coeffs.extend((sign * m.c[nz]).astype(np.int64).tolist())
        if sign < 0:
            objective.scaling_factor = -1.0
    else:
        objective = proto.floating_point_objective
        objective.vars.extend(nz.tolist())
        objective.coeffs.extend(m.c[nz].tolist())
        objective.maximize = m.sense == "max"
    if hint is not None:
        proto.solution_hint.vars.extend(range(len(hint)))
        proto.solution_hint.values.extend(m.to_y(hint).astype(np.int64).tolist())
    return model


def solve(ir, run) -> RawResult:
    """Solve the IR model `ir` with CP-SAT (`run`: a backends.SolveRun)."""
    from ortools.sat.python import cp_model


    t0 = time.perf_counter()
    try:
        m = integral_model(ir)
    except NotIntegral as exc:
        return RawResult(ERROR, detail=f"CP-SAT needs an integer model: {exc}")
    try:
        model = build(m, run.warm_start, run.deadline)
    except OutOfTime:
        model = None
    build_time = time.perf_counter() - t0
    if model is None or (run.deadline is not None and time.monotonic() >= run.deadline):
        return _mip_start(run, "the time limit was reached while the CP-SAT model was built",
                          build_time)

    solver = cp_model.CpSolver()
    params = solver.parameters
    params.catch_sigint_signal = False  # ours (Interrupts) keeps the incumbent
    params.log_search_progress = bool(run.verbose)
    interrupts = Interrupts(run.deadline)
    for key, val in run.options.options.items():
        setattr(params, key, val)
    left = interrupts.time_left()
    if left is not None:
        params.max_time_in_seconds = max(0.0, min(left, params.max_time_in_seconds))

    best = {"bound": None}
    started = time.monotonic()

    def on_bound(bound: float) -> None:
        best["bound"] = bound

    def on_solution() -> None:
        if run.progress is None:
            return
        inc = m.model_value(cb.objective_value)
        bound = best["bound"]
        bound = None if bound is None else m.model_value(bound)
        gap = None if bound is None else abs(inc - bound) / max(abs(inc), 1e-10)
        run.progress(Progress(inc, bound, gap, time.monotonic() - started))

    class Callback(cp_model.CpSolverSolutionCallback):
        def on_solution_callback(self) -> None:
            on_solution()

    cb = Callback()
    solver.best_bound_callback = on_bound
    status: list = []

    def work() -> None:
        status.append(solver.solve(model, cb))

    t1 = time.perf_counter()
    with interrupts.installed():
        worker = threading.Thread(target=work, name="cpsat", daemon=True)
        worker.start()
        stopped = False
        while worker.is_alive():
            worker.join(0.1)
            left = interrupts.time_left()
            if not stopped and (interrupts.requested is not None
                                or (left is not None and left <= 0)):
                solver.stop_search()
                stopped = True
            if left is not None and -left >= interrupts.grace and worker.is_alive():
                # CP-SAT's presolve of a large model can take a while to see the request
                LEFT_RUNNING.append(worker)
                raw = _mip_start(run, f"CP-SAT did not stop within {interrupts.grace:g} s "
                                      f"of the deadline and was left to stop on its thread",
                                 build_time)
                raw.solve_time = time.perf_counter() - t1
                return raw
    solve_time = time.perf_counter() - t1
    name = solver.status_name(status[0]) if status else "UNKNOWN"
    term = termination(TERMINATION, name)
    x = objective = bound = None
    if name in ("OPTIMAL", "FEASIBLE"):
        response = solver.response_proto
        x = m.to_x(np.asarray(response.solution, dtype=float))
        objective = m.model_value(solver.objective_value)
        if m.obj_exact:
            bound = m.model_value(solver.best_objective_bound)
    if x is not None:
        y = np.asarray(response.solution, dtype=float)
        free = (~np.isfinite(m.lb) & (y <= -INT_RANGE)) | (~np.isfinite(m.ub) & (y >= INT_RANGE))
        if free.any():  # a column without a bound ran to the end of CP-SAT's range
            term, x, objective, bound = UNBOUNDED, None, None, None
            name += f", column {int(np.flatnonzero(free)[0])} at CP-SAT's integer range 2^53"
    detail = f"CP-SAT {name}"
    if interrupts.requested is not None:
        detail = f"interrupted by {interrupts.requested}, {detail}"
    elif stopped:
        detail = f"stopped by the time limit's watchdog, {detail}"
    if x is None and term in (LIMIT, UNKNOWN) and run.warm_start is not None:
        raw = _mip_start(run, f"{detail}: no solution found in time", build_time)
        raw.solve_time = solve_time
        return raw
    notes = []
    if not m.obj_exact:
        notes.append("CP-SAT got a floating-point objective (no power of two makes it "
                     "integral): its bound is not reported")
    return RawResult(term if term != UNKNOWN else LIMIT, x=x, objective=objective, bound=bound,
                     detail=detail, notes=notes, build_time=build_time,
                     solve_time=solve_time)


def _mip_start(run, why: str, build_time: float) -> RawResult:
    """A limit reached with no CP-SAT solution: the MIP start (a feasible point, checked
    before it was passed) is the best point known."""
    x = run.warm_start
    return RawResult(LIMIT, x=x, detail=why + ("; the MIP start is returned" if x is not None
                                                else ""), build_time=build_time)
