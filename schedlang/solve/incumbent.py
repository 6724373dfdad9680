"""A heuristic plan outside the model as the solve's incumbent (`Problem.solve`, warm start auto).

The Checkmate model computes node t in stage t, in the graph's order. When none of the auto
warm-start planners fits the budget, planner `shift` may still fit by reordering the nodes
(the random layered graphs of `bench/random_layered.py` at 90% and 80%: no recomputation at
all). Its plan cannot be encoded in the fixed-order model, so it is no MIP start; it is kept
as the incumbent instead:

* it is used only when the model's objective is the simulated time (checked on the encodings
  of the other candidates: their model objective equals their simulated time), so that its
  time and the solver's objective compare;
* its bound is order-free: every node of the graph is computed at least once, so no plan, in
  any order, is faster than the sum of the node times (`order_free_bound`). The solver's own
  bound holds for the model's order only and is not reported for this plan;
* when its time meets that bound it is optimal and the solver is not run; otherwise the
  solver runs cold on the model and the better of the two plans is returned, the outside plan
  as `feasible` with its gap against the order-free bound.

Every plan returned here has been replayed by the simulator against the budgets.
"""
from __future__ import annotations

import time

from ..plans import planners as registry
from ..plans.planners import graph_view
from ..plans.simulate import simulate
from ..results import Result
from .solution import Status

# the candidate's model objective must equal its simulated time within this relative tolerance
SAME = 1e-7


def order_free_bound(graph) -> float | None:
    """The sum of the node times: a lower bound on the time of every valid plan (each node is
    computed at least once), whatever its order. None for layered data or negative times."""
    if graph is None or graph.is_layered or not graph.nodes:
        return None
    times = [float(n.time) for n in graph.nodes]
    if min(times) < 0:
        return None
    return sum(times)


def objective_is_time(tried) -> bool:
    """Whether the encodings of the tried warm starts show the model's objective to be the
    simulated time (at least one encoded candidate, all of them agreeing)."""
    seen = [ws for ws in tried if ws.encoded and ws.objective is not None and ws.time is not None]
    return bool(seen) and all(abs(ws.objective - ws.time) <= SAME * (1.0 + abs(ws.time))
                              for ws in seen)


def outside_incumbent(problem, ir, tried):
    """Planner `shift`'s `WarmStart` when the auto candidates `tried` gave no usable start:
    a MIP start if its encoding satisfies the model, else (`outside`) the incumbent, if it
    fits the budgets and its time compares with the model's objective. None when `shift`
    does not apply."""
    graph = problem.graph
    table = registry.planners()
    if "shift" not in table or graph_view(graph) not in table["shift"].views \
            or any(ws.planner == "shift" for ws in tried):
        return None
    ws = problem.prepare_warm_start("shift", ir)
    if ws.feasible or not ws.fits or ws.plan is None:
        return ws
    if order_free_bound(graph) is None or not objective_is_time(tried):
        ws.message = (f"it fits, but its order is not the model's, and the model's objective "
                      f"is not its simulated time ({ws.message})")
        return ws
    ws.outside = True
    ws.message = f"its node order is not the model's ({ws.message})"
    return ws


def at_bound(problem, ws) -> bool:
    """The outside plan's time meets the order-free bound: it is optimal."""
    bound = order_free_bound(problem.graph)
    return bound is not None and ws.time <= bound + SAME * (1.0 + abs(bound))


def outside_result(problem, ir, ws, timings: dict, backend: str, solver: str, found: str):
    """The `Result` returning the outside plan `ws.plan` (replayed against the budgets),
    with the order-free bound; `found` says what the solver found (or why it did not run)."""
    plan = ws.plan
    plan.budget_peak = problem.budgets.get("peak")
    plan.budget_save = problem.budgets.get("save")
    timings = dict(timings)
    t0 = time.perf_counter()
    sim = simulate(plan, problem.graph)
    timings["simulate"] = time.perf_counter() - t0
    bound = order_free_bound(problem.graph)
    obj = float(sim.time)
    gap = max(0.0, obj - bound) / max(abs(obj), 1e-10)
    status = Status.OPTIMAL if at_bound(problem, ws) else Status.FEASIBLE
    if status == Status.OPTIMAL:
        gap = 0.0
    message = (f"the plan of planner {ws.planner} is returned ({found}); it is in its own node "
               f"order, outside the model's fixed order; bound: the sum of the node times "
               f"(every node computed once, in any order)")
    ws.accepted = False
    return Result(status, obj, bound, gap, backend, solver, ir.size_summary(), timings, plan,
                  sim, None, message, problem.budgets.get("peak"), warm_start=ws)


def keep_better(problem, ir, ws, result):
    """After a cold solve beside an outside incumbent: the solver's result when it found a
    plan at least as fast, else the outside plan."""
    if result.status.has_solution and result.simulated is not None and result.simulated.valid \
            and result.objective is not None and result.objective <= ws.time:
        result.message = "; ".join(m for m in (result.message, ws.summary()) if m)
        return result
    found = (f"the solver's plan takes {result.objective:.6g}" if result.status.has_solution
             else f"the solver ended {result.status.value}")
    return outside_result(problem, ir, ws, result.timings, result.backend, result.solver, found)
