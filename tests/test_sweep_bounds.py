"""A sweep's bounds are monotone in the budget (schedlang.sweep.monotone_bounds): a bound proven
at a larger budget bounds every smaller one."""
from __future__ import annotations

import pytest

from schedlang.results import Result
from schedlang.solve.solution import Status
from schedlang.sweep import SweepPoint, budget_monotone, monotone_bounds, prepare

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
