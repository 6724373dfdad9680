"""LP relaxation + rounding (planners.lp_rounding): valid plans, and a bound that holds."""
from __future__ import annotations

from pathlib import Path

import pytest

import schedlang
from schedlang.plans.plan import Plan
from schedlang.plans.planners import run_planner
from schedlang.plans.planners.lp_rounding import rounded_ops, solve_relaxation
from schedlang.plans.planners.no_recompute import no_recompute_peak
from schedlang.plans.simulate import simulate
from schedlang.solve.solution import Status
from schedlang.testing.bruteforce import best_checkmate_schedule
from schedlang.testing.checkmate_instances import tiny_graphs

ROOT = Path(__file__).resolve().parents[2]
CASES = [(g, frac) for g in tiny_graphs() for frac in (0.6, 0.75, 0.9, 1.0)]


@pytest.mark.parametrize("graph,frac", CASES, ids=[f"{g.name}-{f}" for g, f in CASES])
def test_bound_below_the_exact_optimum_and_plans_replay(graph, frac):
    """LP bound <= the exact optimum (brute force over stage schedules) <= the plan's time,
    for a plan that fits; every plan replays in the simulator."""
    budget = int(no_recompute_peak(graph) * frac)
    best, _ = best_checkmate_schedule(graph, budget)
    plan = run_planner("lp_rounding", graph, budget)
    sim = simulate(plan, graph, budget=budget)
    over = [e for e in sim.errors if "exceeds the peak budget" not in e]
    assert not over, over  # valid, the budget aside
    if best is None:
        assert not sim.fits_budget
        return
    bound = plan.meta["lp_bound"]
    assert bound is not None and bound <= best + 1e-6
    if plan.meta["fits"]:
        assert sim.valid and sim.fits_budget
        assert sim.time >= best - 1e-9
        assert plan.meta["gap"] == pytest.approx((sim.time - bound) / sim.time)


def test_a_budget_below_every_schedule_has_an_infeasible_relaxation():
    graph = tiny_graphs()[0]
    status, bound, _ = solve_relaxation(graph, max(n.size for n in graph.nodes) // 2)
    assert status == "infeasible" and bound is None


def test_keeping_everything_is_the_no_recomputation_schedule():
    graph = tiny_graphs()[2]
    n = len(graph.nodes)
    keep = [set(range(t)) for t in range(n)]
    sim = simulate(Plan(graph=graph.name, ops=rounded_ops(graph, keep)), graph)
    assert sim.valid and sim.time == pytest.approx(sum(node.time for node in graph.nodes))


def test_bound_and_plan_bracket_the_ilp_on_the_chain_example():
    prob = schedlang.load(ROOT / "examples" / "chain.sched")
    exact = prob.solve(warm_start=None)
    assert exact.status == Status.OPTIMAL
    plan = run_planner("lp_rounding", prob.graph, prob.budgets["peak"])
    sim = simulate(plan, prob.graph, budget=prob.budgets["peak"])
    assert plan.meta["lp_bound"] <= exact.objective + 1e-6
    if plan.meta["fits"]:
        assert sim.valid and sim.time >= exact.objective - 1e-9


@pytest.mark.parametrize("graph", tiny_graphs()[:3], ids=lambda g: g.name)
def test_shift_order_variant_replays(graph):
    budget = int(no_recompute_peak(graph) * 0.8)
    plan = run_planner("lp_rounding_shift", graph, budget)
    sim = simulate(plan, graph, budget=budget)
    assert not [e for e in sim.errors if "exceeds the peak budget" not in e]
    assert plan.meta["order"] == "shift"


def test_plan_cli_reports_the_bound_and_gap(capsys):
    import json

    from schedlang.cli.main import main

    chain = str(ROOT / "examples" / "chain.sched")
    assert main(["plan", chain, "--planner", "lp_rounding", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bound"] <= out["objective"]
    assert out["gap"] == pytest.approx((out["objective"] - out["bound"]) / out["objective"])
    assert main(["plan", chain, "--planner", "knapsack", "--json"]) in (0, 3)
    out = json.loads(capsys.readouterr().out)
    assert out["bound"] is None and out["gap"] is None
