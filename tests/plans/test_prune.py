"""planners.prune: recomputations a plan does not need undone, every result replayed."""
from __future__ import annotations

import pytest

import schedlang
from schedlang.budgets import for_graph
from schedlang.plans.plan import Op, Plan
from schedlang.plans.planners import run_planner
from schedlang.plans.planners.no_recompute import no_recompute_peak
from schedlang.plans.planners.prune import prune_recomputations
from schedlang.plans.simulate import simulate
from schedlang.testing.bruteforce import best_checkmate_schedule
from schedlang.testing.checkmate_instances import tiny_graphs

from ..paths import OPGRAPHS

CASES = [(g, frac, name) for g in tiny_graphs() for frac in (0.6, 0.8, 1.0)
         for name in ("recompute_all", "knapsack", "recompute_gaps")]


@pytest.mark.parametrize("graph,frac,name", CASES,
                         ids=[f"{g.name}-{f}-{n}" for g, f, n in CASES])
def test_pruned_plans_fit_and_are_no_slower(graph, frac, name):
    budget = int(no_recompute_peak(graph) * frac)
    plan = run_planner(name, graph, budget)
    before = simulate(plan, graph, budget=budget)
    pruned = prune_recomputations(graph, plan, budget)
    after = simulate(pruned, graph, budget=budget)
    if not before.valid:  # a plan over the budget is left as it is
        assert pruned is plan
        return
    assert after.valid, after.errors
    assert after.time <= before.time + 1e-12
    best, _ = best_checkmate_schedule(graph, budget)
    assert after.time >= best - 1e-9


def test_recomputations_are_undone_where_memory_allows():
    prob = schedlang.load(OPGRAPHS / "mlp3.sched")
    graph = prob.graph
    budget = for_graph("100%", graph)
    plan = run_planner("recompute_all", graph, budget)
    pruned = prune_recomputations(graph, plan, budget)
    before, after = (simulate(p, graph, budget=budget) for p in (plan, pruned))
    assert after.valid, after.errors
    assert after.time < before.time  # recompute_all recomputes what the plain peak holds
    assert pruned.meta["pruned"] > 0


def test_a_copy_nothing_reads_is_dropped():
    graph = tiny_graphs()[0]  # chain4: a -> b -> gb -> ga, a -> ga
    ops = [Op("compute", node="a"), Op("compute", node="b"), Op("delete", data="b"),
           Op("compute", node="b"), Op("delete", data="b"),  # computed again, read by nothing
           Op("compute", node="b"), Op("compute", node="gb"), Op("delete", data="b"),
           Op("compute", node="ga"), Op("delete", data="a"), Op("delete", data="gb"),
           Op("delete", data="ga")]
    plan = Plan(graph=graph.name, ops=ops)
    pruned = prune_recomputations(graph, plan, None)
    computes = [op.node for op in pruned.ops if op.op == "compute"]
    assert computes.count("b") == 1
    assert simulate(pruned, graph).valid
