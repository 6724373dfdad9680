"""The portfolio planner: several cheap planners, the fastest plan that fits.

``best`` runs `CANDIDATES` that apply to the graph (knapsack, mutwo, chen_greedy, the shift
reordering and recompute_gaps on Checkmate graphs; when shift's plan is over the budget,
recompute_gaps in the shift order right after it, reusing shift's order), replays each plan in
the simulator against the budget and returns the fastest that fits (on Checkmate graphs with
the recomputations it does not need undone: `planners.prune`), else the one with the lowest
peak. ``meta["candidates"]`` lists each candidate's simulated time, peak, fit and seconds (or
its error). With ``lp_rounding_below=N`` (default 120 nodes), graphs of at most N nodes also
try `lp_rounding_shift` (recomputation in the shift order), then `lp_rounding`, when no
cheaper plan fits (their LP grows with n²), within what is left of `time_limit` (60 s; checked
between LP solves, and passed to HiGHS). The slow candidates (shift, recompute_gaps in either
order) each get their `BOUNDED_SHARE` of what is left when they start, and recompute_gaps in
the graph's order is skipped once a fitting plan computes every node once (nothing is faster).
"""
from __future__ import annotations

import time as _time

from ...graphs.graph import Graph
from ..plan import Plan
from ..simulate import simulate
from . import Planner, graph_view, planners
from .no_recompute import no_recompute_plan
from .prune import prune_recomputations

CANDIDATES = ("knapsack", "mutwo", "chen_greedy", "shift", "recompute_gaps")
#: the share of what is left of `time_limit` each slow candidate may take when it starts (each
#: stops with what it has). On a 2,000-node random layered graph at 80% of its plain peak,
#: recompute_gaps in the graph's order, run first and unbounded, took 78 s (over the budget)
#: and left shift 1 s; shift's order needs 15 s, and recompute_gaps in it fits in 0.4 s. On
#: transformer op graphs the graph's order is the one that fits fastest (bench/README.md).
BOUNDED_SHARE = {"shift": 0.7, "recompute_gaps_shift": 0.5, "recompute_gaps": 1.0}
#: at most this share once a plan fits (the time left is then for a faster plan or a bound)
AFTER_A_FIT_SHARE = 0.5


def plan_best(graph: Graph, budget: int | None = None, candidates=CANDIDATES,
              lp_rounding_below: int = 120, time_limit: float = 60.0) -> Plan:
    table = planners()
    view = graph_view(graph)
    rows: list[dict] = []
    best = None  # (fits, key, plan)

    start = _time.perf_counter()

    def attempt(name: str, label: str | None = None, **options) -> Plan | None:
        """Run and replay one candidate; returns its plan when it is over the budget."""
        nonlocal best
        t0 = _time.perf_counter()
        label = label or name
        try:
            plan = table[name].run(graph, budget, **options)
        except Exception as exc:  # one candidate failing is one row, not the planner's failure
            rows.append({"planner": label, "error": f"{type(exc).__name__}: {exc}"})
            return None
        sim = simulate(plan, graph, budget=budget)
        fits = bool(sim.valid)
        rows.append({"planner": label, "time": sim.time, "peak_bytes": sim.peak_bytes,
                     "fits": fits, "seconds": round(_time.perf_counter() - t0, 3)})
        # a fitting plan beats any other; then the faster (fitting) or lower peak
        key = (not fits, *((sim.time, sim.peak_bytes) if fits else (sim.peak_bytes, sim.time)))
        if best is None or key < best[1]:
            best = (fits, key, plan, label)
        return plan if not fits else None  # (a plan that fits needs no second try)

    def left() -> float:
        return time_limit - (_time.perf_counter() - start)

    every_node_once = sum(float(x.time) for x in graph.nodes)  # (read on Checkmate graphs)
    for name in candidates:
        if name not in table or view not in table[name].views:
            continue
        if name not in BOUNDED_SHARE:
            attempt(name)
            continue
        if name == "recompute_gaps" and best is not None and best[0] and \
                best[1][1] <= every_node_once * (1 + 1e-12):
            continue  # a fitting plan without recomputation: none is faster
        share = BOUNDED_SHARE[name] if best is None or not best[0] else min(
            BOUNDED_SHARE[name], AFTER_A_FIT_SHARE)
        over = attempt(name, time_limit=max(1.0, share * left()))
        if name == "shift" and over is not None and "recompute_gaps" in table:
            # the shift order with recomputation, from the order shift found (no second reordering)
            order = list(dict.fromkeys(op.node for op in over.ops if op.op == "compute"))
            attempt("recompute_gaps", "recompute_gaps_shift", order=order,
                    time_limit=max(1.0, BOUNDED_SHARE["recompute_gaps_shift"] * left()))
    for name in ("lp_rounding_shift", "lp_rounding"):
        if (best is None or not best[0]) and len(graph.nodes) <= lp_rounding_below \
                and name in table and view in table[name].views and left() > 1:
            attempt(name, time_limit=left())
    if best is None:
        plan = no_recompute_plan(graph)
        plan.meta["candidates"] = rows
        return plan
    plan = best[2]
    if best[0] and view == "checkmate":  # recomputations the budget lets go, undone
        plan = prune_recomputations(graph, plan, budget)
    plan.meta["chosen"] = best[3]
    plan.meta["candidates"] = rows
    return plan


PLANNERS = {
    "best": Planner("best", "the fastest fitting plan of knapsack, mutwo, chen_greedy, "
                    "recompute_gaps and shift (recompute_gaps in shift's order, LP rounding on "
                    "small graphs, when none fits), each replayed by the simulator",
                    plan_best),
}
