"""End-to-end: .sched text -> both backends -> plan -> simulator, against brute force."""
from __future__ import annotations

import pytest

import schedlang
from schedlang.plans.planners.no_recompute import no_recompute_peak
from schedlang.plans.simulate import simulate
from schedlang.solve.backends import BACKENDS
from schedlang.solve.solution import Status
from schedlang.solve.solvers import available_solvers
from schedlang.testing.bruteforce import best_checkmate_schedule
from schedlang.testing.checkmate_instances import checkmate_problem, tiny_graphs

from ..paths import EXAMPLES

CASES = [(g, frac) for g in tiny_graphs() for frac in (0.6, 0.75, 0.9, 1.0)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("graph,frac", CASES, ids=[f"{g.name}-{f}" for g, f in CASES])
def test_checkmate_matches_brute_force(graph, frac, backend):
    budget = int(no_recompute_peak(graph) * frac)
    expected, _ = best_checkmate_schedule(graph, budget)
    result = checkmate_problem(graph, budget).solve(backend=backend, solver="highs")
    if expected is None:
        assert result.status == Status.INFEASIBLE
        return
    assert result.status == Status.OPTIMAL
    assert result.objective == pytest.approx(expected)
    # the plan is replayed independently: valid, within the budget, time equal to the objective
    sim = simulate(result.plan, graph, budget=budget)
    assert sim.valid, sim.errors
    assert sim.peak_bytes <= budget
    assert sim.time == pytest.approx(result.objective)
    assert result.plan.predicted_peak == pytest.approx(sim.peak_bytes, abs=1)


def test_backends_agree_on_examples():
    for path in sorted(EXAMPLES.glob("*.sched")):
        if "vgg16" in path.name or "graph" in path.read_text() and "layer " in path.read_text():
            continue  # vgg16: its own (slow) test; layered data: no shipped formulation yet
        objs = {be: schedlang.load(path).solve(backend=be).objective for be in BACKENDS}
        assert objs["pyomo"] == pytest.approx(objs["cvxpy"]), path.name


SOLVER_CASES = [(be, s) for be in BACKENDS for s in available_solvers(be)]


@pytest.mark.parametrize("backend,solver", SOLVER_CASES, ids=[f"{b}-{s}" for b, s in SOLVER_CASES])
def test_every_installed_solver_solves_the_example(backend, solver):
    result = schedlang.load(EXAMPLES / "chain.sched").solve(backend=backend, solver=solver, time_limit=60)
    assert result.status == Status.OPTIMAL, result.message
    assert result.objective == pytest.approx(50)
    assert result.simulated.valid and result.simulated.peak_bytes <= 120 * 2**20


def test_user_constraint_changes_the_plan():
    base = schedlang.load(EXAMPLES / "chain.sched").solve()
    keep = schedlang.load(EXAMPLES / "keep_f3.sched").solve()
    recomputed = lambda r: [op.node for op in r.plan.ops if op.op == "compute"]  # noqa: E731
    assert recomputed(base).count("f3") == 2  # the plain optimum recomputes f3 ...
    assert recomputed(keep).count("f3") == 1  # ... the user's constraint forbids it
    assert keep.objective >= base.objective
    assert keep.simulated.valid and keep.simulated.time == pytest.approx(keep.objective)


def test_budget_below_largest_node_is_infeasible():
    result = schedlang.load(EXAMPLES / "chain.sched", budget="20MiB").solve()
    assert result.status == Status.INFEASIBLE
    assert result.plan is None


def test_time_limited_run_is_not_reported_optimal():
    prob = schedlang.load(EXAMPLES / "vgg16_train.sched", budget="80%")
    result = prob.solve(backend="cvxpy", time_limit=0.05)
    assert result.status in (Status.FEASIBLE, Status.NO_SOLUTION)


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_vgg16_at_90_percent_is_solved_to_optimality(backend):
    prob = schedlang.load(EXAMPLES / "vgg16_train.sched")
    assert prob.budgets["peak"] == 14242598093  # 90% of the no-recomputation peak
    result = prob.solve(backend=backend, solver="highs")
    assert result.status == Status.OPTIMAL
    assert result.objective == pytest.approx(15805)
    assert result.simulated.valid
    assert result.simulated.peak_bytes <= prob.budgets["peak"]
    assert result.simulated.time == pytest.approx(result.objective)
