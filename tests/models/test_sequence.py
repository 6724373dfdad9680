"""models/sequence.sched: the order-free step model. Its optimum against the exhaustive search
over every sequence of at most card(nodes) + recomputations computations in any order
(`best_sequence_schedule`), infeasibility likewise, on graphs where the graph's own node order
is worse than another (the stage model's optimum is above the order-free one: an order-bound
model fails here); decoded plans replayed by the simulator, predicted peaks as replayed, and a
plan encoded back as a start the model accepts."""
from __future__ import annotations

import random

import pytest

import schedlang
from schedlang.graphs.writer import write_graph
from schedlang.plans.planners.no_recompute import no_recompute_peak
from schedlang.plans.simulate import simulate
from schedlang.solve.solvers import is_available
from schedlang.testing.bruteforce import assert_oracle_optimum, best_checkmate_schedule, best_sequence_schedule
from schedlang.testing.checkmate_instances import graph_of, tiny_graphs

M = 2**20


def _random_dag(seed: int):
    """Six nodes, edges between any earlier and later node (not a chain: orders differ)."""
    rng = random.Random(seed)
    names = [f"n{i}" for i in range(6)]
    nodes = [(x, rng.randint(1, 5), rng.randint(1, 6) * M) for x in names]
    edges = [(names[i], names[j]) for i in range(6) for j in range(i + 1, 6) if rng.random() < 0.45]
    return graph_of(f"dag{seed}", nodes, edges)


def _budget(graph, step: int) -> int:
    """From the least memory any single computation needs (step 0) to the plain peak (4)."""
    size = {n.name: n.size for n in graph.nodes}
    low = max(n.size + sum(size[u] for u, v in graph.edges if v == n.name) for n in graph.nodes)
    return low + (no_recompute_peak(graph) - low) * step // 4


by_name = {g.name: g for g in tiny_graphs()}
GRAPHS = [by_name["diamond"], by_name["train6"], by_name["random1"]] + \
    [_random_dag(s) for s in (0, 1, 5, 6)]
CASES = [(g, step, extra) for g in GRAPHS for step in (0, 2, 4) for extra in (1, 3)]
SOLVERS = ["highs"] + (["cpsat"] if is_available("cpsat", "pyomo") else [])


def _solve(graph, budget: int, extra: int, solver: str):
    graph.budgets = {"peak": budget}
    problem = schedlang.load(text=write_graph(graph), model="sequence",
                             params={"recomputations": extra})
    return problem, problem.solve(solver=solver, time_limit=60)


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize("graph,step,extra", CASES,
                         ids=[f"{g.name}-b{s}-r{e}" for g, s, e in CASES])
def test_optimum_matches_brute_force(graph, step, extra, solver):
    budget = _budget(graph, step)
    expected, _ = best_sequence_schedule(graph, budget, len(graph.nodes) + extra)
    _, result = _solve(graph, budget, extra, solver)
    if not assert_oracle_optimum(result, expected, f"{graph.name} at {budget} B"):
        return
    sim = simulate(result.plan, graph, budget=budget)
    assert sim.valid, sim.errors
    assert sim.time == pytest.approx(expected)
    assert sim.computes <= len(graph.nodes) + extra
    assert result.plan.predicted_peak == sim.peak_bytes


def test_not_bound_to_the_graph_order():
    """dag6 at its least budget: the best plan in the graph's order of first computations (the
    stage model's space) is slower than the best in any order, and the model finds the latter."""
    graph = _random_dag(6)
    budget = _budget(graph, 0)
    in_order, _ = best_checkmate_schedule(graph, budget)
    any_order, _ = best_sequence_schedule(graph, budget, len(graph.nodes) + 3)
    assert any_order is not None and in_order is not None and any_order < in_order
    _, result = _solve(graph, budget, 3, "highs")
    assert_oracle_optimum(result, any_order, "dag6")


def test_the_bound_on_computations_is_the_plan_space():
    """random1 needs two recomputations at this budget: with room for one it is infeasible
    (for plans of at most 7 computations, as the oracle agrees), with three it is solved."""
    graph = by_name["random1"]
    budget = _budget(graph, 2)
    assert best_sequence_schedule(graph, budget, len(graph.nodes) + 1)[0] is None
    _, tight = _solve(graph, budget, 1, "highs")
    assert tight.status.value == "infeasible"
    assert "for plans of at most 7 computations" in tight.message  # not "no plan fits"
    best, _ = best_sequence_schedule(graph, budget, len(graph.nodes) + 3)
    _, roomy = _solve(graph, budget, 3, "highs")
    assert_oracle_optimum(roomy, best, "random1")


def test_a_plan_encodes_as_a_start_the_model_accepts():
    """The oracle's plan (eager frees, any order) as a warm start: feasible, same objective."""
    graph = _random_dag(6)
    budget = _budget(graph, 0)
    best, plan = best_sequence_schedule(graph, budget, len(graph.nodes) + 3)
    graph.budgets = {"peak": budget}
    problem = schedlang.load(text=write_graph(graph), model="sequence",
                             params={"recomputations": 3})
    problem.lower()
    start = problem.prepare_warm_start(plan)
    assert start.feasible, start.message
    assert start.objective == pytest.approx(best)
