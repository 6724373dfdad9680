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
`Interrupts.GRACE` seconds after the signal, the solve stops waiting for it and returns the best
point it knows (the last improving solution HiGHS reported, else the MIP start) with the last
bound HiGHS reported; HiGHS's thread is left to stop at its next callback (in the CLI the
process ends first). After the first signal both signals get their default action back, so a
second Ctrl-C ends the process at once (docs/reliability.md).
"""
from __future__ import annotations

import contextlib
import signal
import threading
import time
from functools import cache

import numpy as np

from .base import CvxpyAnswer, NativeOptions, SolverAdapter, output_discarded, spell
from .status import ERROR, INF_OR_UNBD, INFEASIBLE, LIMIT, OPTIMAL, UNBOUNDED, UNKNOWN, \
    RawResult, by_termination, termination

# HighsModelStatus names -> termination
TERMINATION = by_termination({
    OPTIMAL: "kOptimal", INFEASIBLE: "kInfeasible", UNBOUNDED: "kUnbounded",
    INF_OR_UNBD: "kUnboundedOrInfeasible",
    LIMIT: "kTimeLimit kIterationLimit kSolutionLimit kObjectiveBound kObjectiveTarget "
           "kInterrupt kHighsInterrupt kMemoryLimit",
    ERROR: "kNotset kLoadError kModelError kPresolveError kSolveError kPostsolveError",
    UNKNOWN: "kModelEmpty kUnknown",
})


class Highs(SolverAdapter):
    def options(self, backend, time_limit, gap, threads) -> NativeOptions:
        # mip_feasibility_tolerance: HiGHS checks MIP points on its scaled model, where the
        # default 1e-6 lets a memory row of 4.6e5 MiB (a 450 GiB budget) pass 1 KiB over its
        # bound: a plan over the budget, or (after presolve) a wrong "infeasible". At 1e-9 the
        # slack stays under the models' whole-KiB rounding of budgets up to ~1 TiB
        # (docs/reliability.md, "Numbers at the edges")
        return NativeOptions(spell(("time_limit", "mip_rel_gap", "threads"), time_limit, gap,
                                   threads, mip_abs_gap=0.0, mip_feasibility_tolerance=1e-9))

    def pyomo_interface_available(self, interface: str) -> bool | None:
        if interface != "stdform_highs":
            return None
        try:
            import highspy  # noqa: F401
            from pyomo.repn.plugins.standard_form import LinearStandardFormCompiler  # noqa: F401
        except Exception:  # a broken installation is an unavailable solver
            return False
        return True

    @contextlib.contextmanager
    def session(self, threads, verbose):
        import highspy

        if not verbose:
            _swallow_banner()
        if threads is None or any(t.is_alive() for t in ABANDONED):
            # (never reset the scheduler under a run left in its root LP by an interrupt)
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


ADAPTER = Highs("highs", 1e-4, ("stdform_highs", "appsi_highs", "highs"), "HIGHS",
                warm_start=frozenset({"pyomo", "cvxpy"}),
                doc="HiGHS (highspy), embedded, the default")


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


#: HiGHS runs an interrupt stopped waiting for (`Interrupts.abandoned`): until they end, no
#: session resets HiGHS's thread scheduler under them
ABANDONED: list[threading.Thread] = []


class Interrupts:
    """SIGINT/SIGTERM while HiGHS runs: the first is recorded (`requested`: the signal's name),
    and the interrupt callbacks (`check`) pass it to HiGHS; the default actions are then put
    back, so a second signal ends the process. `run` waits at most `GRACE` seconds after the
    signal for HiGHS to stop (`abandoned`: it did not, e.g. inside its root LP)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)
    GRACE = 2.0  # seconds HiGHS gets to honour the request before the solve stops waiting

    def __init__(self):
        self.requested: str | None = None
        self.requested_at: float | None = None
        self.abandoned = False

    def _first(self, signum, frame) -> None:
        self.requested = signal.Signals(signum).name
        self.requested_at = time.monotonic()
        for s in self.SIGNALS:
            signal.signal(s, signal.SIG_DFL)

    def check(self, event) -> None:
        """A HiGHS interrupt callback: stop once a signal came."""
        if self.requested is not None:
            event.data_in.user_interrupt = True

    def run(self, h) -> None:
        """`h.run()`; in the main thread, on a worker thread while the main thread waits in
        Python, so that a signal is seen at once (a second Ctrl-C ends the process even while
        HiGHS is in a long LP that calls no callback)."""
        if threading.current_thread() is not threading.main_thread():
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
            if (self.requested_at is not None and worker.is_alive()
                    and time.monotonic() - self.requested_at > self.GRACE):
                self.abandoned = True  # HiGHS is in code that calls no callback
                ABANDONED.append(worker)
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


class Incumbent:
    """The best point known while HiGHS runs: the MIP start, then each improving solution
    HiGHS reports; and the last finite dual bound its MIP callback saw. What an interrupted
    solve returns when HiGHS cannot be stopped in time (`Interrupts.abandoned`)."""

    def __init__(self, start):
        self.x = None if start is None else np.asarray(start, dtype=float)
        self.source = "returned the MIP start" if start is not None else "no solution known"
        self.bound: float | None = None

    def improved(self, event) -> None:
        self.x = np.array(event.data_out.mip_solution, dtype=float)
        self.source = "returned HiGHS's last improving solution"

    def saw_bound(self, bound: float, inf: float) -> None:
        if abs(bound) < inf:
            self.bound = float(bound)


def _mip_callback(progress, interrupts: Interrupts, best: Incumbent | None = None):
    """A MIP callback of HiGHS: passes its incumbent, bound, gap and time on to `progress`
    (when given), records the bound in `best`, and asks HiGHS to stop once a signal came
    (`Interrupts`)."""
    import highspy

    from .progress import Progress

    inf = highspy.kHighsInf

    def report(event) -> None:
        interrupts.check(event)
        d = event.data_out
        if best is not None:
            best.saw_bound(d.mip_dual_bound, inf)
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
    Pyomo standard-form driver below, and `schedlang.relaxation`)."""
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

    h = highspy.Highs()
    h.setOptionValue("output_flag", bool(run.verbose))
    h.setOptionValue("log_to_console", bool(run.verbose))
    status = h.passModel(lp)
    if status == highspy.HighsStatus.kError:
        return RawResult(ERROR, detail="HiGHS rejected the model")
    for key, val in run.options.options.items():
        if h.setOptionValue(key, val) == highspy.HighsStatus.kError:
            return RawResult(ERROR, detail=f"HiGHS rejected option {key}={val!r}")
    interrupts = Interrupts()
    best = Incumbent(run.warm_start if is_int.any() else None)
    if is_int.any():
        h.cbMipInterrupt.subscribe(_mip_callback(run.progress, interrupts, best))
        h.cbMipImprovingSolution.subscribe(best.improved)
        # an LP solved by HiGHS itself (not the relaxations inside its MIP) checks too
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
        # HiGHS is still inside an LP that calls no callback: the best point known so far
        stuck = time.monotonic() - interrupts.requested_at
        x = best.x
        return RawResult(LIMIT, x=None if x is None else x.copy(),
                         objective=None if x is None else float(cost @ x) + offset,
                         bound=best.bound,
                         detail=f"interrupted by {interrupts.requested}, HiGHS did not stop "
                         f"within {stuck:.1f} s (inside an LP relaxation, which it cannot "
                         f"interrupt); {best.source}")
    info = h.getInfo()
    raw = read_info(h.getModelStatus().name, info,
                    lambda: np.asarray(h.getSolution().col_value, dtype=float))
    if interrupts.requested is not None:
        raw.detail = f"interrupted by {interrupts.requested}, {raw.detail}"
    if not is_int.any():  # an LP optimum: the bound is the objective
        raw.bound = info.objective_function_value if raw.termination == OPTIMAL else None
    return raw
