"""schedlang/solve/window_bound.py: the bound from the memory at a chain of computations is a
lower bound of the stage model's optimum (the exhaustive oracle on tiny graphs, checkmate_tight's
proven optimum on an op graph), and it is more than the sum of the node times where the budget
forces recomputation."""
from __future__ import annotations

import random

import pytest

import schedlang
from schedlang.budgets import for_graph
from schedlang.graphs.writer import write_graph
from schedlang.plans.planners.no_recompute import no_recompute_peak
from schedlang.solve import strategy
from schedlang.solve.linked_windows import linked_window_bound
from schedlang.solve.solution import Status
from schedlang.solve.window_bound import window_bound
from schedlang.testing.bruteforce import best_checkmate_schedule
from schedlang.testing.checkmate_instances import graph_of, tiny_graphs

from ..paths import OPGRAPHS


def _random_graph(rng: random.Random, name: str):
    names = [f"n{i}" for i in range(6)]
    nodes = [(x, rng.randint(1, 9), rng.randint(1, 6) << 20) for x in names]
    edges = [(names[i], names[i + 1]) for i in range(5)]
    edges += [(names[i], names[j]) for i in range(6) for j in range(i + 2, 6)
              if rng.random() < 0.45]
    return graph_of(name, nodes, edges)


def _random_graphs(count: int, seed: int) -> list:
    rng = random.Random(seed)
    return [_random_graph(rng, f"dag{k}") for k in range(count)]


GRAPHS = tiny_graphs() + _random_graphs(12, seed=29)
CASES = [(g, frac) for g in GRAPHS for frac in (0.5, 0.6, 0.7, 0.8, 0.9, 1.0)]


@pytest.mark.parametrize("graph,frac", CASES, ids=[f"{g.name}-{f}" for g, f in CASES])
def test_never_above_the_exhaustive_optimum(graph, frac):
    budget = int(no_recompute_peak(graph) * frac)
    optimum, _ = best_checkmate_schedule(graph, budget)
    found = window_bound(graph, budget)
    if found is None:  # a working set over the budget: no plan fits
        assert optimum is None
        return
    assert found.bound >= sum(n.time for n in graph.nodes) - 1e-9
    if optimum is not None:
        assert found.bound <= optimum + 1e-9


def test_above_the_node_times_where_the_budget_forces_recomputation():
    # train6 at 75% of its plain peak: the optimum spends 2 time units on recomputation, and
    # the memory when g3 is first computed (f1, f2, f3, g3 cannot all be there) proves it
    graph = next(g for g in tiny_graphs() if g.name == "train6")
    budget = int(no_recompute_peak(graph) * 0.75)
    optimum, _ = best_checkmate_schedule(graph, budget)
    found = window_bound(graph, budget)
    assert optimum == pytest.approx(11) and sum(n.time for n in graph.nodes) == 9
    assert found.bound == pytest.approx(11) and found.chain == ["g3"]


# graphs whose best chain has two windows (found by a search over seeds): the windows' least
# recomputations add up, and on two of them to exactly the exhaustive optimum
CHAINS = [(100, 0.9, None), (233, 0.9, None), (269, 0.9, 33), (336, 0.8, 35), (386, 0.8, None)]


@pytest.mark.parametrize("seed,frac,exact", CHAINS)
def test_chains_of_windows_add_up_below_the_optimum(seed, frac, exact):
    graph = _random_graph(random.Random(seed), f"s{seed}")
    budget = int(no_recompute_peak(graph) * frac)
    optimum, _ = best_checkmate_schedule(graph, budget)
    found = window_bound(graph, budget, points=6)
    assert len(found.chain) == 2
    assert sum(n.time for n in graph.nodes) < found.bound <= optimum + 1e-9
    if exact is not None:
        assert found.bound == pytest.approx(exact) == optimum


def test_stopped_at_once_it_is_still_a_bound():
    graph = next(g for g in tiny_graphs() if g.name == "train6")
    found = window_bound(graph, int(no_recompute_peak(graph) * 0.75), time_limit=0)
    assert not found.complete and found.bound == pytest.approx(9) and found.chain == []


def test_a_working_set_over_the_budget_gives_no_bound():
    graph = next(g for g in tiny_graphs() if g.name == "chain4")
    assert window_bound(graph, 8 << 20) is None  # ga reads gb and a, and writes 4 MiB: 12 MiB


@pytest.mark.parametrize("bound_of", [window_bound, linked_window_bound],
                         ids=["chain", "linked"])
def test_below_checkmate_tights_optimum_on_an_op_graph(bound_of):
    prob = schedlang.load(OPGRAPHS / "mlp3.sched", budget="90%")
    graph, budget = prob.graph, for_graph("90%", prob.graph)
    found = bound_of(graph, budget)
    graph.budgets = {"peak": budget}
    exact = schedlang.load(text=write_graph(graph), model="checkmate_tight").solve(time_limit=120)
    assert exact.status == Status.OPTIMAL
    assert sum(n.time for n in graph.nodes) < found.bound <= exact.objective * (1 + 1e-6)


def test_the_op_graph_route_reports_it(monkeypatch):
    monkeypatch.setattr(strategy, "SMALL_NODES", 10)
    prob = schedlang.load(OPGRAPHS / "mlp3.sched", budget="90%")
    found = window_bound(prob.graph, prob.budgets.get("peak"))
    result = strategy.solve(prob, time_limit=60)
    steps = [s.what for s in result.strategy.steps]
    assert "bound" in steps and result.bound >= found.bound * (1 - 1e-9)
    assert result.simulated.valid and result.objective >= result.bound * (1 - 1e-6)
