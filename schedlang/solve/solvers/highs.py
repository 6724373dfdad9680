"""HiGHS (highspy), embedded; the default solver.

Pyomo drives it through `stdform_highs` (schedlang's own driver, `solve_pyomo_stdform`
below: the model compiled by Pyomo's LinearStandardFormCompiler and handed to highspy in
one call, 6-9x faster than appsi_highs' per-constraint translation), else `appsi_highs`,
else pyomo.contrib.solver's `highs`. cvxpy drives it as ``HIGHS``.

Quirks:
* one thread scheduler per process: a run asking for another thread count than the
  scheduler was started with ends with model status kNotset. `session` resets the
  scheduler before a run that sets `threads`, and again after it, so that the next run
  (ours or the caller's) starts a scheduler of its own size;
* the first `Highs()` of a process prints a banner on file descriptor 1; `session` makes
  that first instance with the output discarded unless the solve is verbose;
* cvxpy's HiGHS interface ignores ``x.value`` as a MIP start: it warm-starts only from a
  previous solve kept in its solver cache, so `cvxpy_solve` hands it a cache holding ours.

Interrupts (`solve_pyomo_stdform`, MIP models, main thread): `Highs.run` runs on a worker
thread while the main thread waits in Python, so that signals are seen at once. The first
SIGINT (Ctrl-C) or SIGTERM asks HiGHS to stop at its next interrupt callback (MIP, simplex,
IPM); the run returns with model status kInterrupt and its incumbent, which schedlang reports
as `feasible` with its gap (`no_solution` without one), as at a time limit. The LP relaxations
inside HiGHS's MIP run on an inner `Highs` of their own that calls no callback (and reads its
time limit once, when it starts), so nothing reaches a long root LP: when HiGHS has not stopped
`Interrupts.SIGNAL_GRACE` seconds after the signal (or `WATCHDOG_GRACE` seconds after the
whole run's deadline), the solve stops waiting for it and returns the best point it knows (the
last improving solution HiGHS reported, else the MIP start) with the last bound HiGHS
reported; HiGHS's thread is left to stop at its next callback (`LEFT_RUNNING`; the CLI ends
with os._exit). After the first signal both signals get their default action back, so a second
Ctrl-C ends the process at once (docs/reliability.md).
"""
from __future__ import annotations

import contextlib
import dataclasses
import signal
import threading
import time
from functools import cache

import numpy as np

from ..progress import Progress
from ..status import (
    ERROR,
    INF_OR_UNBD,
    INFEASIBLE,
    LIMIT,
    OPTIMAL,
    UNBOUNDED,
    UNKNOWN,
    RawResult,
    by_termination,
    termination,
)
from .base import CvxpyAnswer, NativeOptions, SolverAdapter, output_discarded, spell

# HighsModelStatus names -> termination
TERMINATION = by_termination({
    OPTIMAL: "kOptimal", INFEASIBLE: "kInfeasible", UNBOUNDED: "kUnbounded",
    INF_OR_UNBD: "kUnboundedOrInfeasible",
    LIMIT: "kTimeLimit kIterationLimit kSolutionLimit kObjectiveBound kObjectiveTarget "
           "kInterrupt kHighsInterrupt kMemoryLimit",
    ERROR: "kNotset kLoadError kModelError kPresolveError kSolveError kPostsolveError",
    UNKNOWN: "kModelEmpty kUnknown",
})


# worker threads the watchdog stopped waiting for (HiGHS stops at its next callback); a
# process that ends while one runs must end with os._exit (`threads_left_running`)
LEFT_RUNNING: list[threading.Thread] = []


def threads_left_running() -> bool:
    """Is a HiGHS run the watchdog abandoned still going? (Then ending the interpreter
    normally would abort in HiGHS's thread: `schedlang.cli.main.entry` ends with os._exit.)"""
    return any(t.is_alive() for t in LEFT_RUNNING)


# the Pyomo backend's first choice: the IR's matrix straight to highspy (`solve_ir`)
IR_INTERFACE = "highs_ir"

# seconds the watchdog waits, after the deadline, for HiGHS to honour its request to stop
WATCHDOG_GRACE = 1.0


class Highs(SolverAdapter):
    def options(self, backend, time_limit, gap, threads) -> NativeOptions:
        # mip_feasibility_tolerance: HiGHS checks MIP points on its scaled model, where the
        # default 1e-6 lets a memory row of 4.6e5 MiB (a 450 GiB budget) pass 1 KiB over its
        # bound: a plan over the budget, or (after presolve) a wrong "infeasible". At 1e-9 the
        # slack stays under 1 KiB for budgets up to ~1 TiB; a plan it lets over the budget is
        # solved again below it (docs/reliability.md, "Numbers at the edges")
        return NativeOptions(spell(("time_limit", "mip_rel_gap", "threads"), time_limit, gap,
                                   threads, mip_abs_gap=0.0, mip_feasibility_tolerance=1e-9))

    def pyomo_interface_available(self, interface: str) -> bool | None:
        if interface not in ("stdform_highs", IR_INTERFACE):
            return None
        try:
            import highspy  # noqa: F401
            if interface == "stdform_highs":
                from pyomo.repn.plugins.standard_form import LinearStandardFormCompiler  # noqa: F401
        except Exception:  # a broken installation is an unavailable solver
            return False
        return True

    @contextlib.contextmanager
    def session(self, threads, verbose):
        import highspy

        if not verbose:
            _swallow_banner()
        if threads is None or threads_left_running():
            # (never reset the scheduler under a run an interrupt left in its root LP)
            yield
            return
        highspy.Highs.resetGlobalScheduler(True)
        try:
            yield
        finally:
            highspy.Highs.resetGlobalScheduler(True)

    def read_cvxpy(self, ans: CvxpyAnswer) -> RawResult:
        ms = ans.raw.get("model_status", "")
        info = ans.raw.get("info")
        return read_info(ms, info, ans.x_value, ans.model_value)

    def cvxpy_solve(self, chain, prob, data, warm: bool, verbose: bool, opts: dict,
                    start: np.ndarray | None, dropped: list):
        if start is None:
            return chain.solve_via_data(prob, data, warm, verbose, opts)
        import cvxpy.settings as s
        import highspy

        cache_ = {}
        # the canonical columns are ours when, as here, the problem has one variable with
        # native bounds and nothing else
        if data[s.C].shape[0] == start.shape[0]:
            sol = highspy.HighsSolution()
            sol.col_value = np.asarray(start, dtype=float)
            sol.value_valid = True
            cache_["HIGHS"] = (None, None, {"model_status": "kOptimal", "solution": sol})
        else:
            dropped.append("warm start ignored: cvxpy's canonical HiGHS model has other columns")
        return chain.solver.solve_via_data(data, True, verbose, opts, cache_)


ADAPTER = Highs("highs", 1e-4, (IR_INTERFACE, "stdform_highs", "appsi_highs", "highs"), "HIGHS",
                warm_start=frozenset({"pyomo", "cvxpy"}),
                doc="HiGHS (highspy), embedded, the default",
                install=(("*", "pip install highspy"),))


@cache
def _swallow_banner() -> None:
    """highspy prints its banner when the process's first `Highs()` is made: make that one
    here with file descriptor 1 discarded."""
    import highspy

    with output_discarded():
        highspy.Highs()


def quiet_highs():
    """A `highspy.Highs()` with its log off, made after the banner was swallowed (for the
    HiGHS runs outside a solve's `session`: LP relaxations and MIP-start completions)."""
    import highspy

    _swallow_banner()
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    return h


def read_info(model_status: str, info, x_value, model_value=lambda v: v) -> RawResult:
    """A RawResult from HiGHS' model status name and `HighsInfo`; `x_value()` gives the
    point, `model_value(v)` maps HiGHS' objective values into the model's terms."""
    term = termination(TERMINATION, model_status)
    x = incumbent = bound = None
    if info is not None:
        if getattr(info, "primal_solution_status", 0) == 2:
            x = x_value()
            incumbent = model_value(info.objective_function_value)
        if getattr(info, "mip_node_count", -1) >= 0:  # a MIP: the dual bound is reported
            if np.isfinite(info.mip_dual_bound):
                bound = model_value(info.mip_dual_bound)
    return RawResult(term, x=x, objective=incumbent, bound=bound, detail=f"HiGHS {model_status}")


class Interrupts:
    """SIGINT/SIGTERM while HiGHS runs: the first is recorded (`requested`: the signal's name)
    and makes `stop_requested` true, which the MIP callback passes to HiGHS; the default
    actions are then put back, so a second signal ends the process.

    The whole-run time limit's watchdog (`deadline`, a `time.monotonic()` instant, or None):
    HiGHS gets the time left as its own limit; at the deadline the watchdog asks it to stop
    as a signal would, and `grace` seconds later, if HiGHS is still in a phase that calls no
    interrupt callback (presolve, the root LP of a large MIP), it stops waiting
    (`abandoned`): the run returns what the callbacks saw last (`incumbent`, `bound`) and
    HiGHS is left to stop on its thread at its next callback. A signal likewise: HiGHS gets
    `SIGNAL_GRACE` seconds to honour it."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)
    SIGNAL_GRACE = 2.0  # seconds HiGHS gets to honour a signal before the solve stops waiting

    def __init__(self, deadline: float | None = None, grace: float = WATCHDOG_GRACE):
        self.requested: str | None = None
        self.requested_at: float | None = None  # time.monotonic() of the first signal
        self.deadline = deadline
        self.grace = grace
        self.expired = False  # the watchdog asked HiGHS to stop
        self.abandoned = False  # ... and stopped waiting for it
        self.incumbent: np.ndarray | None = None  # the last improving MIP solution
        self.bound: float | None = None  # the last dual bound a MIP callback reported

    def _first(self, signum, frame) -> None:
        self.requested = signal.Signals(signum).name
        self.requested_at = time.monotonic()
        for s in self.SIGNALS:
            signal.signal(s, signal.SIG_DFL)

    def check(self, event) -> None:
        """A HiGHS interrupt callback: stop once a signal came or the deadline passed."""
        if self.requested is not None or self.expired:
            event.data_in.user_interrupt = True

    def improving(self, event) -> None:
        """HiGHS's improving-solution callback: keep the point (the watchdog's fallback)."""
        sol = event.data_out.mip_solution
        if sol is not None:
            self.incumbent = np.array(sol, dtype=float)

    def time_left(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()

    def run(self, h) -> None:
        """`h.run()`; in the main thread, or with a deadline, on a worker thread while this
        thread waits in Python, so that a signal is seen at once (a second Ctrl-C ends the
        process even while HiGHS is in a long LP that calls no callback) and the watchdog
        can stop waiting."""
        if self.deadline is None and threading.current_thread() is not threading.main_thread():
            h.run()
            return
        failed: list[BaseException] = []

        def work() -> None:
            try:
                h.run()
            except BaseException as exc:  # noqa: BLE001 (handed to the waiting thread)
                failed.append(exc)

        worker = threading.Thread(target=work, name="highs", daemon=True)
        worker.start()
        while worker.is_alive():
            worker.join(0.1)
            if not worker.is_alive():
                continue
            now = time.monotonic()
            if self.deadline is not None and now >= self.deadline:
                self.expired = True
            if (self.expired and now - self.deadline >= self.grace) or (
                    self.requested_at is not None and now - self.requested_at >= self.SIGNAL_GRACE):
                self.abandoned = True  # HiGHS is in code that calls no callback
                LEFT_RUNNING.append(worker)
                return
        if failed:
            raise failed[0]

    @contextlib.contextmanager
    def installed(self):
        """Catch the signals during the block (only in the main thread, where Python can)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        old = {s: signal.getsignal(s) for s in self.SIGNALS}
        for s in self.SIGNALS:
            signal.signal(s, self._first)
        try:
            yield self
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)


def _mip_callback(progress, interrupts: Interrupts):
    """A MIP callback of HiGHS: passes its incumbent, bound, gap and time on to `progress`
    (when given), and asks HiGHS to stop once a signal came (`Interrupts`)."""
    import highspy


    inf = highspy.kHighsInf

    def report(event) -> None:
        interrupts.check(event)
        d = event.data_out
        if abs(d.mip_dual_bound) < inf:
            interrupts.bound = float(d.mip_dual_bound)
        if progress is None:
            return
        found = abs(d.mip_primal_bound) < inf
        progress(Progress(d.mip_primal_bound if found else None,
                          d.mip_dual_bound if abs(d.mip_dual_bound) < inf else None,
                          d.mip_gap if found else None, d.running_time,
                          int(d.mip_node_count)))
    return report


# --------------------------------------------------------------------------- Pyomo standard form


def highs_lp(A, cost, col_lb, col_ub, row_lo, row_hi, *, maximize: bool = False,
             offset: float = 0.0, integer=None):
    """A `highspy.HighsLp` of min/max cost.x + offset s.t. row_lo <= A x <= row_hi and column
    bounds; `integer` (a boolean per column, or None for an LP) marks the integer columns.
    Infinite bounds may be numpy infinities. The one place a HiGHS model is assembled (the
    Pyomo standard-form driver below, and `schedlang.solve.relaxation`)."""
    import highspy
    import scipy.sparse as sp

    inf = highspy.kHighsInf

    def finite(v):
        return np.clip(np.asarray(v, dtype=float), -inf, inf)

    csc = sp.csc_matrix(A)
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = csc.shape[1], csc.shape[0]
    lp.col_cost_ = np.asarray(cost, dtype=float)
    lp.col_lower_, lp.col_upper_ = finite(col_lb), finite(col_ub)
    lp.row_lower_, lp.row_upper_ = finite(row_lo), finite(row_hi)
    lp.offset_ = float(offset)
    lp.sense_ = highspy.ObjSense.kMaximize if maximize else highspy.ObjSense.kMinimize
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = csc.indptr.astype(np.int32)
    lp.a_matrix_.index_ = csc.indices.astype(np.int32)
    lp.a_matrix_.value_ = csc.data.astype(float)
    if integer is not None and np.any(integer):
        lp.integrality_ = [highspy.HighsVarType.kInteger if f else highspy.HighsVarType.kContinuous
                           for f in np.asarray(integer, dtype=bool).tolist()]
    return lp

def solve_pyomo_stdform(model, cols, run) -> RawResult:
    """Solve the Pyomo `model` (its VarData `cols` in IR order) with highspy in one call."""
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

    lp = highs_lp(A, cost, col_lb, col_ub, row_lo, row_hi,
                  maximize=sense == highspy.ObjSense.kMaximize, offset=offset,
                  integer=is_int)
    return run_highs(lp, is_int, run)


def solve_ir(ir, run) -> RawResult:
    """Solve the IR model `ir` with highspy, its matrix handed over in one call (the
    `highs_ir` interface: no Pyomo model is built)."""
    import time

    t0 = time.perf_counter()
    A, lo, hi = ir.stacked()
    lb, ub = ir.column_bounds()
    obj = ir.objective
    cost = obj.c if obj is not None else np.zeros(ir.n_columns)
    is_int = ir.integrality()
    lp = highs_lp(A, cost, lb, ub, lo, hi, maximize=obj is not None and obj.sense == "max",
                  offset=obj.constant if obj is not None else 0.0, integer=is_int)
    build_time = time.perf_counter() - t0
    t1 = time.perf_counter()
    raw = run_highs(lp, is_int, run)
    raw.build_time = build_time
    raw.solve_time = time.perf_counter() - t1
    return raw


def run_highs(lp, is_int: np.ndarray, run) -> RawResult:
    """Pass `lp` (a HighsLp; `is_int`: its integer columns) to a new `Highs`, with `run`'s
    options, MIP start, progress, interrupts and deadline, and read its answer."""
    import highspy

    n = len(is_int)
    h = highspy.Highs()
    h.setOptionValue("output_flag", bool(run.verbose))
    h.setOptionValue("log_to_console", bool(run.verbose))
    if h.passModel(lp) == highspy.HighsStatus.kError:
        return RawResult(ERROR, detail="HiGHS rejected the model")
    for key, val in run.options.options.items():
        if h.setOptionValue(key, val) == highspy.HighsStatus.kError:
            return RawResult(ERROR, detail=f"HiGHS rejected option {key}={val!r}")
    interrupts = Interrupts(run.deadline)
    left = interrupts.time_left()
    if left is not None:
        if left <= 0:  # the whole run's time is spent before the solver started
            return _watchdog_result(run, interrupts, "time limit: before HiGHS started", n)
        limit = min(float(run.options.options.get("time_limit", left)), left)
        h.setOptionValue("time_limit", max(limit, 0.0))
    if is_int.any():
        h.cbMipInterrupt.subscribe(_mip_callback(run.progress, interrupts))
        h.cbMipImprovingSolution.subscribe(interrupts.improving)
        # the LPs inside the MIP (the root LP can take minutes) check for an interrupt too
        h.cbSimplexInterrupt.subscribe(interrupts.check)
        h.cbIpmInterrupt.subscribe(interrupts.check)
    if run.warm_start is not None and is_int.any():
        sol = highspy.HighsSolution()
        sol.col_value = np.asarray(run.warm_start, dtype=float)
        sol.value_valid = True
        h.setSolution(sol)
    with interrupts.installed():
        interrupts.run(h)
    if interrupts.abandoned:
        if interrupts.requested is not None:
            why = (f"interrupted by {interrupts.requested}, HiGHS did not stop within "
                   f"{interrupts.SIGNAL_GRACE:g} s (inside an LP relaxation, which it cannot "
                   f"interrupt) and was left to stop on its thread")
        else:
            why = (f"time limit: HiGHS did not stop within {interrupts.grace:g} s of the deadline (it was "
                   f"in a phase that calls no interrupt callback) and was left to stop on its "
                   f"thread")
        return _watchdog_result(run, interrupts, why, n)
    info = h.getInfo()
    raw = read_info(h.getModelStatus().name, info,
                    lambda: np.asarray(h.getSolution().col_value, dtype=float))
    if run.warm_start is not None and _start_returned_as_optimum(lp, raw):
        # HiGHS 1.16: a MIP start feasible in the presolved model can come back as the
        # "optimal" point, the optimum's value reported beside it (GPT-2's blocks started
        # from every block recomputed: 0.017277 returned, 0.015377 reported). Solved again
        # without the start, in the time left; that answer is the run's.
        again = run_highs(lp, is_int, dataclasses.replace(run, warm_start=None))
        again.notes.append(f"HiGHS returned its MIP start (objective "
                           f"{_point_objective(lp, raw.x):.6g}) as the optimum {raw.objective:.6g}"
                           f": solved again without the start")
        return again
    if interrupts.requested is not None:
        raw.detail = f"interrupted by {interrupts.requested}, {raw.detail}"
    elif interrupts.expired:
        raw.detail = f"stopped by the time limit's watchdog, {raw.detail}"
    if not is_int.any():  # an LP optimum: the bound is the objective
        raw.bound = info.objective_function_value if raw.termination == OPTIMAL else None
    elif _tree_exhausted(h, info, raw):
        raw.bound = raw.objective
        raw.notes.append(f"HiGHS searched the whole tree (its last dual bound "
                         f"{info.mip_dual_bound:.6g} was not raised to the incumbent): optimal")
    return raw


def _point_objective(lp, x: np.ndarray) -> float:
    return float(lp.offset_ + np.dot(np.asarray(lp.col_cost_, dtype=float), x))


def _start_returned_as_optimum(lp, raw: RawResult) -> bool:
    """Whether HiGHS says optimal for a point whose objective is not the one it reports."""
    if raw.termination != OPTIMAL or raw.x is None or raw.objective is None:
        return False
    got = _point_objective(lp, raw.x)
    return abs(got - raw.objective) > 1e-6 * max(1.0, abs(raw.objective), abs(got))


def _tree_exhausted(h, info, raw: RawResult) -> bool:
    """HiGHS says Optimal on a MIP either at the requested gap or when its search tree is
    exhausted; in the second case it may leave the dual bound where it was when the last
    nodes were pruned against the incumbent (or the warm start's cutoff), a gap above the
    requested one that the search has in fact closed."""
    if raw.termination != OPTIMAL or raw.objective is None or raw.x is None:
        return False
    gap = getattr(info, "mip_gap", None)
    try:
        asked = h.getOptionValue("mip_rel_gap")
        asked = float(asked[1] if isinstance(asked, tuple) else asked)  # (status, value)
    except Exception:  # an old highspy: keep the reported bound
        return False
    return gap is not None and np.isfinite(gap) and gap > asked * (1 + 1e-3) + 1e-12


def _watchdog_result(run, interrupts: Interrupts, why: str, n: int) -> RawResult:
    """A time limit or a signal without HiGHS's own answer: the best point known (the last
    improving solution HiGHS reported, else the MIP start) and the last bound it reported."""
    x = interrupts.incumbent
    source = "HiGHS's last improving solution"
    if x is None or len(x) != n:
        x, source = run.warm_start, "the MIP start"
    kept = f"; {source} is returned" if x is not None else ""
    return RawResult(LIMIT, x=x, bound=interrupts.bound,
                     detail=f"{why}{kept}")
