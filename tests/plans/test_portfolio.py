"""The `best` portfolio planner and the random layered graph generator of bench/."""
from __future__ import annotations

import sys
from pathlib import Path

import networkx as nx
import pytest

from schedlang.graphs.checkmate_nx import graph_from_node_link
from schedlang.plans.planners import run_planner
from schedlang.plans.simulate import simulate
from schedlang.problem import resolve_budget
from schedlang.testing.checkmate_instances import tiny_graphs

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from random_layered import generate  # noqa: E402


@pytest.mark.parametrize("n,seed", [(30, 0), (60, 1), (120, 2)])
def test_generated_graphs_are_single_source_dags_in_the_shared_format(n, seed):
    data = generate(n, seed)
    g = nx.node_link_graph(data, edges="links", source="0", target="1")
    assert g.number_of_nodes() == n and nx.is_directed_acyclic_graph(g)
    assert [v for v in g if g.in_degree(v) == 0] == [0]
    assert [v for v in g if g.out_degree(v) == 0] == [1]
    order = data["graph"]["order"]
    position = {v: i for i, v in enumerate(order)}
    assert sorted(order) == list(range(n)) and all(position[u] < position[v] for u, v in g.edges)
    graph = graph_from_node_link(data, data["graph"]["name"])
    assert [node.name for node in graph.nodes] == [f"n{v}" for v in order]  # graph.order
    assert generate(n, seed) == data  # seeded


@pytest.mark.parametrize("n,pct", [(60, "90%"), (100, "80%")])
def test_best_finds_a_valid_plan_on_random_layered_graphs(n, pct):
    data = generate(n, 0)
    graph = graph_from_node_link(data, data["graph"]["name"])
    budget = resolve_budget(pct, graph)
    plan = run_planner("best", graph, budget)
    sim = simulate(plan, graph, budget=budget)
    assert sim.valid, sim.errors[:3]
    fitting = [r for r in plan.meta["candidates"] if r.get("fits")]
    # the fastest candidate, or faster (its needless recomputations undone: planners.prune)
    assert sim.time <= min(r["time"] for r in fitting) * (1 + 1e-12)


@pytest.mark.parametrize("graph", tiny_graphs(), ids=lambda g: g.name)
def test_best_is_never_worse_than_its_candidates(graph):
    from schedlang.plans.planners.no_recompute import no_recompute_peak

    budget = int(no_recompute_peak(graph) * 0.8)
    plan = run_planner("best", graph, budget)
    sim = simulate(plan, graph, budget=budget)
    rows = [r for r in plan.meta["candidates"] if "error" not in r]
    assert rows
    if any(r["fits"] for r in rows):
        assert sim.valid and sim.time <= min(r["time"] for r in rows if r["fits"]) * (1 + 1e-12)
    else:
        assert sim.peak_bytes == min(r["peak_bytes"] for r in rows)


def test_best_bounds_each_slow_candidate_by_its_share_of_the_time(monkeypatch):
    """recompute_gaps in the graph's order once ran unbounded (78 s on 2,000 nodes) and left
    shift one second: every slow candidate now gets a share of what is left of the limit."""
    from dataclasses import replace

    from schedlang.plans.planners import portfolio

    limits: dict[str, list] = {}

    def recorded(planner):
        def run(graph, budget, **options):
            label = planner.name + ("_shift" if "order" in options else "")
            limits.setdefault(label, []).append(options.get("time_limit"))
            return planner.run(graph, budget, **options)
        return replace(planner, run=run)

    table = {k: recorded(p) for k, p in portfolio.planners().items()}
    monkeypatch.setattr(portfolio, "planners", lambda: table)
    data = generate(100, 0)
    graph = graph_from_node_link(data, data["graph"]["name"])
    portfolio.plan_best(graph, resolve_budget("70%", graph), time_limit=8.0)
    assert limits["shift"] and limits["recompute_gaps"]
    for name, share in portfolio.BOUNDED_SHARE.items():
        assert all(t is not None and t <= max(1.0, share * 8.0)
                   for t in limits.get(name, [])), (name, limits[name])
