"""Starts from smaller budgets: a plan that fits a smaller budget fits this one.

A heuristic planner run at the budget itself spends all of it and may end slower than the
same planner run at a smaller budget (its greedy choices differ), once the smaller budget's
plan has its needless recomputations undone at this budget (`planners.prune`). On the traced
one-block GPT (`bench/data/opgraphs/gpt1.sched`) at 80% of its plain peak, recompute_gaps at
the budget takes 0.005290 and at 75% of it 0.004896 (7.4% faster); at 70% no planner fits at
the budget and recompute_gaps at half of it fits (0.004151) where the route otherwise waits for
phase one. The op-graph route (`schedlang.solve.strategy`) runs the ladder for its starts in
both node orders; every plan is replayed by the caller at the budget itself.
"""
from __future__ import annotations

from collections.abc import Iterator

from ..graphs.graph import Graph
from ..plans.plan import Plan
from ..plans.planners.prune import prune_recomputations
from ..problem import run_named_planner

#: the planner run down the ladder (the one whose plans start the op-graph route most often,
#: and cheap: 0.1-0.2 s a run on the 54-124-node op graphs)
LADDER_PLANNER = "recompute_gaps"
#: the fractions of the budget it runs at (1.0, the budget itself, is the caller's own run)
LADDER = (0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6, 0.55, 0.5, 0.45, 0.4)


def ladder_plans(graph: Graph, budget: int | None,
                 planner: str = LADDER_PLANNER) -> Iterator[Plan]:
    """`planner`'s plans at each fraction of `budget` in `LADDER`, each with its needless
    recomputations at `budget` itself undone, named in `meta["planner"]`; a run that fails is
    skipped. Nothing without a budget. Whether a plan fits `budget` is the caller's replay."""
    if budget is None:
        return
    for fraction in LADDER:
        try:
            plan = run_named_planner(planner, graph, int(budget * fraction))
        except Exception:  # noqa: BLE001, S112 (a planner's failure leaves the other rungs)
            continue
        plan = prune_recomputations(graph, plan, budget)
        plan.meta["planner"] = f"{planner} at {fraction:.0%} of the budget"
        yield plan
