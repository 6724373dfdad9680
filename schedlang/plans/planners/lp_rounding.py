"""LP relaxation + rounding: Checkmate's two-phase approximation, with the LP bound reported.

Jain et al. (MLSys 2020, section 5) solve the linear relaxation of the Checkmate MILP, round
the keep variables S, and rebuild a feasible schedule from the rounded S; the LP optimum is a
lower bound on the MILP's, so every plan carries a gap against a proven bound. Here:

1. The Checkmate model (`models/checkmate.sched`, the one home of the formulation) is lowered
   on the graph at the budget, and its relaxation solved by HiGHS (`relaxation.highs_solve`).
   Its optimum is ``meta["lp_bound"]``: no plan in Checkmate's stage space (this node order,
   one stage per node) is faster, so ``meta["gap"] = (time - bound) / time`` is proven.
2. Rounding: for each threshold, S[t, v] = 1 when the LP's S[t, v] reaches it. Then the
   computes are the least that make that S a schedule (Checkmate's "solve R given S"): stage t
   computes t, every v kept into t+1 that is not kept into t, and, walking down from the
   highest node, every input of a computed node that is not kept into t.
3. Ops: a stage runs its computes in node order; each output is deleted right after its last
   use in the stage unless it is kept into the next stage.
4. Budget scaling: the rounded plans may exceed the budget (the LP spreads memory thinly), so
   until one fits, the LP is solved again at smaller budgets (`scales`) and rounded the same
   way. Every plan is
   replayed by the simulator; the fastest that fits is returned (``meta["fits"]``), else
   the lowest peak (no gap then).

Option ``order="shift"``: the stages follow the shift planner's node order
(`shift.reorder`) instead of the graph's; the bound is then that order's.
"""
from __future__ import annotations

import time as _time

from ...compile.lower import lower_program
from ...graphs.graph import Graph
from ...language.program import load_program
from ...solve.relaxation import highs_solve
from ..plan import Op, Plan
from ..simulate import simulate
from . import Planner
from .no_recompute import no_recompute_peak, no_recompute_plan
from .shift import reorder

THRESHOLDS = (0.5, 0.3, 0.7, 0.1, 0.9, 0.2, 0.4, 0.6, 0.8, 0.01, 0.99)
SCALES = (1.0, 0.95, 0.9, 0.85, 0.8, 0.7, 0.6, 0.5)


def lower_checkmate(graph: Graph, budget: int):
    """The Checkmate IR of `graph` at `budget` bytes."""
    program = load_program([], ["checkmate"])
    return lower_program(program, graph, {"peak": int(budget)})


def solve_relaxation(graph: Graph, budget: int, time_limit: float | None = None):
    """(status, LP optimum or None, {(t, v): S value}) of the Checkmate relaxation."""
    ir = lower_checkmate(graph, budget)
    out = highs_solve(ir, relax=True, time_limit=time_limit)
    if out.x is None:
        return out.status, None, {}
    fam = ir.family("S")
    values = out.x[fam.offset: fam.offset + fam.size]
    return out.status, out.bound, dict(zip(fam.keys, values.tolist()))


def rounded_ops(graph: Graph, keep: list[set[int]]) -> list[Op]:
    """The ops of the schedule that keeps keep[t] (node indices) into stage t, with the
    fewest computes (Checkmate's R given S)."""
    n = len(graph.nodes)
    names = [node.name for node in graph.nodes]
    index = {name: i for i, name in enumerate(names)}
    preds: list[list[int]] = [[] for _ in range(n)]
    for src, dst in graph.edges:
        preds[index[dst]].append(index[src])
    ops: list[Op] = []
    live: set[int] = set()
    for t in range(n):
        kept, kept_next = keep[t], (keep[t + 1] if t + 1 < n else set())
        computed = {t} | {v for v in kept_next if v not in kept}
        for v in range(t, -1, -1):
            if v in computed:
                computed.update(u for u in preds[v] if u not in kept)
        for u in sorted(live - kept):
            ops.append(Op("delete", data=names[u]))
        live = set(kept)
        stage = sorted(computed)
        last_use = {u: v for v in stage for u in preds[v]}  # stage is ascending: the last wins
        for v in stage:
            ops.append(Op("compute", node=names[v]))
            live.add(v)
            for u in sorted(x for x in live if last_use.get(x, -1) <= v and x not in kept_next):
                ops.append(Op("delete", data=names[u]))
                live.discard(u)
    for u in sorted(live):
        ops.append(Op("delete", data=names[u]))
    return ops


def plan_lp_rounding(graph: Graph, budget: int | None = None, thresholds=THRESHOLDS,
                     scales=SCALES, order: str = "graph", time_limit: float | None = None) -> Plan:
    t_start = _time.perf_counter()
    if order == "shift":
        graph = reorder(graph)
    if budget is None:
        budget = no_recompute_peak(graph)
    names = [node.name for node in graph.nodes]
    index = {name: i for i, name in enumerate(names)}
    n = len(names)
    best = None  # (fits, key, ops, sim)
    bound = None
    lp_status = None
    for scale in scales:
        left = None if time_limit is None else time_limit - (_time.perf_counter() - t_start)
        if left is not None and left <= 0:
            break
        status, value, S = solve_relaxation(graph, int(budget * scale), left)
        if scale == scales[0]:
            bound, lp_status = value, status
            if status == "infeasible":
                break  # no plan of this node order fits: nor at smaller budgets
        if not S:
            continue
        seen: set = set()
        for thr in thresholds:
            keep: list[set[int]] = [set() for _ in range(n)]
            for (t, v), x in S.items():
                if x >= thr - 1e-9:
                    keep[index[t]].add(index[v])
            signature = tuple(frozenset(k) for k in keep)
            if signature in seen:
                continue
            seen.add(signature)
            ops = rounded_ops(graph, keep)
            sim = simulate(Plan(graph=graph.name, ops=ops), graph, budget=budget)
            fits = bool(sim.valid)
            # a fitting plan beats any other; then the faster (fitting) or lower peak
            key = (not fits, *((sim.time, sim.peak_bytes) if fits else (sim.peak_bytes, sim.time)))
            if best is None or key < best[1]:
                best = (fits, key, ops, sim)
        if best is not None and best[0]:
            break  # smaller budgets round to more recomputation: slower plans
    meta = {"planner": "lp_rounding", "lp_status": lp_status, "lp_bound": bound,
            "order": order, "seconds": _time.perf_counter() - t_start}
    if best is None:  # no relaxation solved: the plan with everything once
        plan = no_recompute_plan(graph)
        plan.meta.update(meta)
        return plan
    sim = best[3]
    meta["fits"] = best[0]
    if best[0] and bound is not None and sim.time > 0:  # a proven gap only for a valid plan
        meta["gap"] = max(0.0, (sim.time - bound) / sim.time)
    return Plan(graph=graph.name, ops=best[2], budget_peak=budget, predicted_peak=sim.peak_bytes,
                predicted_time=sim.time, meta=meta)


PLANNERS = {
    "lp_rounding": Planner(
        "lp_rounding", "Checkmate's LP relaxation + rounding (deterministic thresholds, budget "
        "scaling); meta carries the LP bound and the plan's gap to it", plan_lp_rounding,
        views=("checkmate",)),
    "lp_rounding_shift": Planner(
        "lp_rounding_shift", "lp_rounding with the stages in the shift planner's node order",
        lambda graph, budget=None, **kw: plan_lp_rounding(graph, budget, order="shift", **kw),
        views=("checkmate",)),
}
