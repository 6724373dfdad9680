"""schedlang/solve/linked_windows.py: the windows' bound with the memory at its points linked is
a lower bound of the stage model's optimum (the exhaustive oracle on tiny graphs,
checkmate_tight's proven optimum on an op graph), solved by CP-SAT or by HiGHS, and it proves
more than the chain of `window_bound` where a plan pays in one window for what it kept in the
one before."""
from __future__ import annotations

import pytest

import schedlang
from schedlang.budgets import for_graph
from schedlang.plans.planners.no_recompute import no_recompute_peak
from schedlang.solve.linked_windows import linked_window_bound
from schedlang.solve.window_bound import window_bound
from schedlang.testing.bruteforce import best_checkmate_schedule
from schedlang.testing.checkmate_instances import graph_of

from ..paths import OPGRAPHS
from .test_window_bound import CASES

M = 2**20


@pytest.mark.parametrize("solver", ["cpsat", "highs"])
@pytest.mark.parametrize("graph,frac", CASES, ids=[f"{g.name}-{f}" for g, f in CASES])
def test_never_above_the_exhaustive_optimum(graph, frac, solver):
    budget = int(no_recompute_peak(graph) * frac)
    optimum, _ = best_checkmate_schedule(graph, budget)
    found = linked_window_bound(graph, budget, points=len(graph.nodes), solver=solver)
    if found is None:  # a working set over the budget: no plan fits
        assert optimum is None
        return
    assert found.closed
    assert found.bound >= sum(n.time for n in graph.nodes) - 1e-9
    if optimum is not None:
        assert found.bound <= optimum + 1e-9


def test_linked_memory_proves_more_than_the_chain():
    # at 80% of the plain peak: the chain of windows proves 2 units of recomputation, the
    # optimum recomputes 4; what is kept at n2's first computation must have been kept at
    # n1's or computed again, and the linked windows see that it cannot
    graph = graph_of("linked6", [("n0", 2, 2 * M), ("n1", 3, 6 * M), ("n2", 8, 6 * M),
                                 ("n3", 3, 5 * M), ("n4", 4, 3 * M), ("n5", 9, 4 * M)],
                     [("n0", "n1"), ("n1", "n2"), ("n2", "n3"), ("n3", "n4"), ("n4", "n5"),
                      ("n0", "n5"), ("n1", "n3"), ("n1", "n5"), ("n2", "n4")])
    budget = int(no_recompute_peak(graph) * 0.8)
    optimum, _ = best_checkmate_schedule(graph, budget)
    chain = window_bound(graph, budget)
    assert chain.bound == pytest.approx(32) and optimum == pytest.approx(34)
    for solver in ("cpsat", "highs"):
        linked = linked_window_bound(graph, budget, points=6, solver=solver)
        assert linked.bound == pytest.approx(optimum)
        assert "linked" in linked.describe()


def test_stopped_early_it_is_still_a_bound():
    prob = schedlang.load(OPGRAPHS / "tiny.sched")
    budget = for_graph("70%", prob.graph)
    found = linked_window_bound(prob.graph, budget, time_limit=0.2)
    assert found is not None and found.bound >= sum(n.time for n in prob.graph.nodes) - 1e-12
