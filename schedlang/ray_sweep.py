"""`schedlang sweep --ray [ADDRESS]`: the budgets of a sweep solved as Ray tasks.

Ray is an optional extra (``pip install "schedlang[ray]"``); this module is imported only
when a sweep asks for it, and the core never imports Ray. Each budget is one task running
`schedlang.sweep.solve_at` on the loaded and checked program (put once in Ray's object store):
the task lowers the program at its budget and solves it cold, with the options of the serial
sweep. The points come back in any order; they are recorded (`--out`) as they finish and
returned in ascending budget order. Without an address a local Ray instance is started (and
shut down at the end); with one (``ray://host:10001``, ``auto``, ``host:6379``), the sweep
joins that cluster, whose workers need schedlang installed.

The serial sweep lowers the program once and moves it from budget to budget
(`schedlang.parametric`); a task lowers its budget on its own. The models are the same, so
the results are: same statuses and objectives (a solve stopped by a time limit depends on the
machine's speed, and may end elsewhere).
"""
from __future__ import annotations

from .errors import Loc, SchedError
from .sweep import SweepPoint, parse_budgets, reference, solve_at

RAY_LOC = Loc("--ray")


def import_ray():
    """The `ray` module, or a `SchedError` (exit 2) that says how to install it."""
    try:
        import ray
    except ImportError:
        raise SchedError("--ray needs Ray, which is not installed: pip install "
                         "\"schedlang[ray]\" (or pip install ray)", RAY_LOC) from None
    return ray


def _solve_task(program, budget: int, options: dict) -> SweepPoint:
    """One budget, in a Ray worker."""
    return solve_at(program, budget, **options)


def sweep_on_ray(prob, budgets, *, address: str | None = None, backend: str = "pyomo",
                 solver: str = "highs", time_limit: float | None = None,
                 gap: float | None = None, threads: int | None = None, progress=None,
                 done: dict[int, SweepPoint] | None = None, record=None) -> list[SweepPoint]:
    """`schedlang.sweep.sweep_problem`, with each budget a Ray task (see the module doc).

    `address`: a Ray cluster to join; None or "" starts a local one. `progress(k, n, budget,
    point)` is called as each point comes back (k counts the points back so far)."""
    ray = import_ray()
    values = parse_budgets(budgets, prob.graph)
    done = done or {}
    todo = [b for b in values if b not in done]
    results: dict[int, SweepPoint] = dict(done)
    started = False
    if todo:
        try:
            started = not ray.is_initialized()
            if started:
                ray.init(address=address or None, include_dashboard=False,
                         log_to_driver=False, logging_level="WARNING")
        except Exception as exc:  # a bad address, a cluster that does not answer
            raise SchedError(f"cannot start or join Ray"
                             f"{' at ' + address if address else ''}: {exc}", RAY_LOC) from None
    try:
        if todo:
            options = {"backend": backend, "solver": solver, "time_limit": time_limit,
                       "gap": gap, "threads": threads, "ref": reference(prob.graph),
                       "timings": {"parse": prob.timings.get("parse", 0.0),
                                   "check": prob.timings.get("check", 0.0)},
                       "max_elements": prob.max_elements}
            task = ray.remote(num_cpus=1)(_solve_task)
            program = ray.put(prob.program)
            pending = {task.remote(program, b, options): b for b in todo}
            k = len(done)
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                budget = pending.pop(ready[0])
                point = ray.get(ready[0])
                results[budget] = point
                if record is not None:
                    record(point)
                k += 1
                if progress is not None:
                    progress(k, len(values), budget, point)
    finally:
        if started:
            ray.shutdown()
    return [results[b] for b in values]
