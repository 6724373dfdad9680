"""A sweep is monotone in the budget: a bound proven at a larger budget bounds every smaller
one (schedlang.sweep.monotone_bounds), and a plan of a smaller budget fits every larger one, so
no larger budget reports a slower plan (schedlang.sweep.monotone_plans)."""
from __future__ import annotations

import pytest

from schedlang.plans.planners.no_recompute import no_recompute_peak
from schedlang.plans.simulate import simulate
from schedlang.results import Result
from schedlang.solve.solution import Status
from schedlang.sweep import SweepPoint, budget_monotone, monotone_bounds, monotone_plans, prepare, sweep_problem
from schedlang.testing.checkmate_instances import checkmate_problem, tiny_graphs

from .paths import EXAMPLES


def _point(budget, status, objective, bound):
    gap = None if objective is None or bound is None else (objective - bound) / objective
    return SweepPoint(budget, None, Result(status, objective, bound, gap, "pyomo", "highs", {},
                                           {}), None)


def test_a_larger_budgets_bound_lifts_the_smaller_ones():
    points = [_point(100, Status.FEASIBLE, 20.0, 12.0),   # weak bound at the tight budget
              _point(200, Status.FEASIBLE, 16.0, 15.0),
              _point(300, Status.OPTIMAL, 14.0, 14.0),
              _point(50, Status.NO_SOLUTION, None, None),
              _point(400, Status.FEASIBLE, 13.0, None)]
    monotone_bounds(points)
    by = {p.budget_bytes: p.result for p in points}
    assert by[100].bound == 15.0 and by[100].gap == pytest.approx(0.25)
    assert by[200].bound == 15.0  # its own bound is the best at and above it
    assert by[50].bound == 15.0 and by[50].gap is None
    assert by[400].bound is None  # nothing larger proves anything
    assert "bound from budget 200 B" in by[100].message


def test_a_plan_meeting_a_lifted_bound_is_optimal():
    points = [_point(100, Status.FEASIBLE, 14.0, 10.0), _point(200, Status.OPTIMAL, 14.0, 14.0)]
    monotone_bounds(points)
    assert points[0].result.status == Status.OPTIMAL and points[0].result.gap == 0.0


def test_only_shipped_time_models_are_treated_as_monotone():
    assert budget_monotone(prepare(EXAMPLES / "chain.sched").program)
    assert budget_monotone(prepare(EXAMPLES / "transformer12.sched").program)


# ---------------------------------------------------------------- plans: monotone in the budget

def _tiny_sweep(graph, fractions, **kw):
    peak = no_recompute_peak(graph)
    prob = checkmate_problem(graph, peak)
    prob.check()
    return sweep_problem(prob, [int(f * peak) for f in fractions], jobs=1, **kw), prob


@pytest.mark.parametrize("graph", tiny_graphs(), ids=lambda g: g.name)
def test_a_larger_budget_never_reports_a_slower_plan(graph):
    """Each budget's solve stops at its first plan (gap 1: the answers differ from budget to
    budget as the solver's first plans do); whatever they are, the sweep's plans never get
    slower as the budget grows, and each replays within its own budget."""
    points, prob = _tiny_sweep(graph, [0.6, 0.7, 0.8, 0.9, 1.0], gap=1.0, threads=1)
    solved = [p for p in points if p.result.status.has_solution]
    for smaller, larger in zip(solved, solved[1:]):
        assert larger.objective <= smaller.objective * (1 + 1e-9)
    for p in solved:
        sim = simulate(p.result.plan, prob.graph, budget=p.budget_bytes)
        assert sim.valid and sim.time == pytest.approx(p.objective)
        assert p.result.bound is None or p.result.bound <= p.objective * (1 + 1e-9)


def test_a_slower_or_missing_answer_takes_the_smaller_budgets_plan():
    graph = tiny_graphs()[2]  # train6
    points, prob = _tiny_sweep(graph, [0.9])
    small = points[0]
    assert small.result.status == Status.OPTIMAL
    budget = small.budget_bytes + 1024
    slower = _point(budget, Status.FEASIBLE, small.objective + 5.0, small.objective - 1.0)
    missing = _point(budget + 1024, Status.NO_SOLUTION, None, None)
    proven = _point(budget + 2048, Status.INFEASIBLE, None, None)  # (a proof: left as it is)
    monotone_plans([missing, slower, small, proven], prob.graph)
    for p in (slower, missing):
        r = p.result
        assert r.objective == small.objective and r.plan is not None
        assert r.plan.budget_peak == p.budget_bytes and r.simulated.valid
        assert f"the plan of budget {small.budget_bytes} B" in r.message
    assert slower.result.bound == small.objective - 1.0 and slower.result.status == Status.FEASIBLE
    assert missing.result.status == Status.FEASIBLE and missing.result.bound is None
    assert proven.result.status == Status.INFEASIBLE and proven.result.plan is None
