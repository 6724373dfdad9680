"""The recompute_gaps planners (schedlang/plans/planners/gaps.py): plans that replay, never below
the exhaustive optimum, within the budget whenever the planner says its profile fits."""
from __future__ import annotations

import pytest

import schedlang
from schedlang.budgets import for_graph
from schedlang.plans.planners import run_planner
from schedlang.plans.planners.gaps import plan_recompute_gaps
from schedlang.plans.planners.no_recompute import no_recompute_peak
from schedlang.plans.simulate import NO_LIMIT, simulate
from schedlang.testing.bruteforce import best_checkmate_schedule
from schedlang.testing.checkmate_instances import tiny_graphs

from ..paths import GRAPHS, OPGRAPHS, needs_graphs

CASES = [(g, frac) for g in tiny_graphs() for frac in (0.6, 0.75, 0.9, 1.0)]


@pytest.mark.parametrize("graph,frac", CASES, ids=[f"{g.name}-{f}" for g, f in CASES])
def test_plans_replay_and_never_beat_the_optimum(graph, frac):
    budget = int(no_recompute_peak(graph) * frac)
    plan = plan_recompute_gaps(graph, budget)
    sim = simulate(plan, graph, budget=NO_LIMIT)
    assert sim.valid, sim.errors
    # the planner's profile counts every copy alive at a position: never below the replay
    assert plan.predicted_peak >= sim.peak_bytes
    assert sim.time == pytest.approx(plan.predicted_time)
    best, _ = best_checkmate_schedule(graph, budget)
    if sim.peak_bytes <= budget:
        assert best is not None and sim.time >= best - 1e-9
    if plan.predicted_peak <= budget:
        assert sim.peak_bytes <= budget


def _load(path, budget):
    prob = schedlang.load(path)
    return prob.graph, for_graph(budget, prob.graph)


def test_op_graph_plan_fits_where_the_profile_does():
    graph, budget = _load(OPGRAPHS / "gpt2block.sched", "80%")
    plan = run_planner("recompute_gaps", graph, budget)
    sim = simulate(plan, graph, budget=budget)
    assert plan.predicted_peak <= budget  # this budget is reached on this graph
    assert sim.valid, sim.errors
    assert sim.time > sum(n.time for n in graph.nodes)  # it recomputes something


def test_long_chains_fit_the_tiny_op_graph_at_60_percent():
    # its parameter gradients all live until the step's end: the plan fits only by computing
    # them again late through long chains of ancestors (more than 20 nodes), each chain node
    # deleted once read; the greedy's profile bounds the replay (here from above: it counts
    # each recomputed output over its whole position)
    graph, budget = _load(OPGRAPHS / "tiny.sched", "60%")
    plan = run_planner("recompute_gaps", graph, budget)
    sim = simulate(plan, graph, budget=budget)
    assert sim.valid, sim.errors  # (valid: within the budget too)
    assert sim.peak_bytes <= plan.predicted_peak
    short = plan_recompute_gaps(graph, budget, chain_limit=20)
    assert simulate(short, graph, budget=NO_LIMIT).peak_bytes > budget


@needs_graphs
def test_shift_order_with_cuts_fits_the_random_layered_graph():
    # Moccasin's n100 graph at 70%: the shift order alone is over the budget; with cuts the
    # plan fits
    from schedlang.cli.main import load_graph

    graph, _ = load_graph(str(GRAPHS / "random_layered_n100.json"))
    budget = for_graph("70%", graph)
    assert simulate(run_planner("shift", graph, budget), graph, budget=budget).peak_bytes > budget
    plan = run_planner("recompute_gaps_shift", graph, budget)
    sim = simulate(plan, graph, budget=budget)
    assert sim.valid, sim.errors
    assert sim.time >= sum(n.time for n in graph.nodes)
