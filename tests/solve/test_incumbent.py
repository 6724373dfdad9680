"""The solve's incumbents: a heuristic plan outside the fixed-order model kept as the solve's
answer (`schedlang.solve.incumbent`), and the bounds a MIP start's objective implies
(`bounds.cutoff_bounds`). Plans are checked in the simulator, optima against the exact ILP."""
from __future__ import annotations

import json
import sys

import numpy as np
import pytest

import schedlang
from schedlang.cli.main import main
from schedlang.compile.bounds import cutoff_bounds, lagrangian_bound, objective_step, round_bound
from schedlang.compile.presolve import presolve
from schedlang.graphs.checkmate_nx import load_checkmate_nx
from schedlang.plans.simulate import simulate
from schedlang.problem import resolve_budget
from schedlang.solve import strategy
from schedlang.solve.relaxation import highs_solve, lp_duals
from schedlang.solve.solution import Status
from schedlang.solve.status import is_feasible
from schedlang.testing.checkmate_instances import checkmate_problem, tiny_graphs

from ..paths import ROOT

sys.path.insert(0, str(ROOT / "bench"))
from random_layered import generate  # noqa: E402

# random layered graphs where knapsack, mutwo and chen_greedy are over the budget and shift fits
OUTSIDE = [(14, 2, "90%"), (14, 2, "80%"), (20, 7, "80%")]


def _graph(tmp_path, n, seed):
    path = tmp_path / f"rl{n}_{seed}.json"
    path.write_text(json.dumps(generate(n, seed)))
    return load_checkmate_nx(str(path)), path


@pytest.mark.parametrize("n,seed,pct", OUTSIDE)
def test_a_fitting_plan_outside_the_model_is_the_answer(tmp_path, n, seed, pct):
    graph, _ = _graph(tmp_path, n, seed)
    budget = resolve_budget(pct, graph)
    res = schedlang.load(graph=graph, budget=budget).solve(warm_start="auto", time_limit=60)
    assert res.status.has_solution
    assert res.warm_start.planner == "shift" and res.warm_start.outside
    sim = simulate(res.plan, graph, budget=budget)
    assert sim.valid and sim.peak_bytes <= budget
    assert res.objective == pytest.approx(sim.time)
    node_sum = sum(n.time for n in graph.nodes)
    assert res.bound == pytest.approx(node_sum) and res.bound <= res.objective + 1e-9
    if res.status == Status.OPTIMAL:
        assert res.objective == pytest.approx(node_sum)
    # the exact fixed-order ILP, cold: never better than the returned plan, never below the bound
    exact = schedlang.load(graph=graph, budget=budget).solve(warm_start=None)
    if exact.status == Status.OPTIMAL:
        assert res.objective <= exact.objective + 1e-6
        assert res.bound <= exact.objective + 1e-6
    else:
        assert exact.status == Status.INFEASIBLE


@pytest.mark.parametrize("n,seed,pct", OUTSIDE)
def test_the_default_op_graph_route_returns_it_too(tmp_path, n, seed, pct, monkeypatch):
    # the op-graph route solves the model in the graph's order; shift's reordered plan, when
    # faster, is the answer there as well, with the order-free bound
    monkeypatch.setattr(strategy, "SMALL_NODES", 0)
    graph, _ = _graph(tmp_path, n, seed)
    budget = resolve_budget(pct, graph)
    res = strategy.solve(schedlang.load(graph=graph, budget=budget), time_limit=60)
    written = schedlang.load(graph=graph, budget=budget).solve(warm_start="auto", time_limit=60)
    assert res.strategy.name == "op graph" and written.status.has_solution
    sim = simulate(res.plan, graph, budget=budget)
    assert sim.valid and res.objective == pytest.approx(sim.time)
    assert res.objective <= written.objective + 1e-6
    assert res.bound <= res.objective + 1e-9
    if res.objective < written.objective - 1e-6 or res.plan.meta.get("planner") == "shift":
        assert res.bound == pytest.approx(sum(n.time for n in graph.nodes))


def test_solve_cli_returns_the_outside_plan(tmp_path, capsys):
    _, path = _graph(tmp_path, 14, 2)
    sched = tmp_path / "g.sched"
    assert main(["import", str(path), "--format", "checkmate-nx", "-o", str(sched)]) == 0
    capsys.readouterr()
    assert main(["solve", str(sched), "--budget", "90%", "--json", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["status"] in ("optimal", "feasible") and out["simulated"]["valid"]
    assert out["simulated"]["peak_bytes"] <= out["budget_bytes"]
    assert out["warm_start"]["planner"] == "shift"
    # opting out of the warm start: the fixed-order model alone
    assert main(["solve", str(sched), "--budget", "90%", "--json", "--quiet",
                 "--no-warm-start"]) in (0, 3, 4)
    cold = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert cold["warm_start"] is None


# --------------------------------------------------------------------------- cutoff bounds

def _cases():
    for g in tiny_graphs():
        total = sum(n.size for n in g.nodes)
        for frac in (0.5, 0.7, 1.0):
            yield g, int(total * frac)


@pytest.mark.parametrize("k", range(len(list(_cases()))))
def test_cutoff_bounds_keep_the_start_and_the_optimum(k):
    cases = list(_cases())
    if k >= len(cases):
        pytest.skip("fewer cases")
    graph, budget = cases[k]
    prob = checkmate_problem(graph, budget)
    ir = prob.lower()
    exact = highs_solve(ir)
    if exact.status != "optimal":
        pytest.skip("infeasible budget")
    model, post = presolve(ir)
    y = lp_duals(model)
    assert y is not None
    low, _ = lagrangian_bound(model, y)
    assert low + model.objective.constant <= exact.objective + 1e-6  # a proven bound
    assert low + model.objective.constant == pytest.approx(highs_solve(model, relax=True).objective)
    for start in ("no_recompute", "checkpoint_all", "knapsack"):
        ws = prob.prepare_warm_start(start, ir)
        if not ws.feasible:
            continue
        x = post.restrict(ws.x)
        for duals in (None, y):
            cut, _, bound = cutoff_bounds(model, x, duals)
            assert bound is not None and bound <= exact.objective + 1e-6
            assert is_feasible(cut, x)[0]  # the start itself stays in
            lb, ub = cut.column_bounds()
            lb0, ub0 = model.column_bounds()
            assert np.all(lb >= lb0) and np.all(ub <= ub0)  # only tightened
            reduced = highs_solve(cut)
            assert reduced.status == "optimal"
            assert reduced.objective == pytest.approx(exact.objective)  # the optimum is kept
            # and through a second presolve, as solve_ir does
            again, inner = presolve(cut)
            full = post.then(inner)
            sol = highs_solve(again)
            assert is_feasible(ir, full.expand(sol.x))[0]
            assert sol.objective == pytest.approx(exact.objective)


@pytest.mark.parametrize("lp_columns", [None, 0])
def test_solve_with_a_start_proves_the_cold_optimum(monkeypatch, lp_columns):
    """A MIP start's cutoff (objective; with lp_columns=0 also `solve_ir`'s LP step, which
    runs from CUTOFF_LP_COLUMNS columns on): the cold optimum, a proven bound, a valid plan."""
    import schedlang.solve.backends as backends

    if lp_columns is not None:
        monkeypatch.setattr(backends, "CUTOFF_LP_COLUMNS", lp_columns)
    for graph, budget in list(_cases())[:9]:
        cold = checkmate_problem(graph, budget).solve(warm_start=None)
        warm = checkmate_problem(graph, budget).solve(warm_start="checkpoint_all")
        assert warm.status == cold.status
        if cold.status == Status.OPTIMAL:
            assert warm.objective == pytest.approx(cold.objective)
            assert warm.bound <= cold.objective + 1e-6
            assert warm.simulated.valid and warm.simulated.time == pytest.approx(warm.objective)


# --------------------------------------------------------------------------- objective steps

def test_objective_step_and_rounded_bounds_stay_below_the_optimum():

    seen = 0
    for graph, budget in _cases():
        prob = checkmate_problem(graph, budget)
        ir = prob.lower()
        exact = highs_solve(ir)
        if exact.status != "optimal":
            continue
        step = objective_step(ir)
        assert step is not None and step > 0  # integer node times, binary computations
        k = (exact.objective - ir.objective.constant) / step
        assert abs(k - round(k)) < 1e-6  # the optimum is on the grid
        lp = highs_solve(ir, relax=True).objective
        rounded = round_bound(ir, lp)
        assert lp - 1e-9 <= rounded <= exact.objective + 1e-9  # still a bound, never weaker
        seen += 1
    assert seen


def test_objective_step_needs_integer_columns_with_commensurable_costs():
    from schedlang.compile.ir import IRModel, Objective, VarFamily

    def model(kinds, costs, constant=0.0):
        fams = [VarFamily(f"v{i}", [()], k, np.zeros(1), np.ones(1), offset=i)
                for i, k in enumerate(kinds)]
        return IRModel("m", fams, [], Objective("o", "min", np.array(costs, float), constant))

    m = model(["binary", "binary", "binary"], [0.0012, 0.0048, 0.002], constant=0.0001)
    assert objective_step(m) == pytest.approx(0.0004)
    assert round_bound(m, 0.0001 + 0.00398) == pytest.approx(0.0001 + 0.004)
    assert objective_step(model(["binary", "continuous"], [1.0, 1.0])) is None
    assert objective_step(model(["binary", "binary"], [1.0, 2 ** 0.5])) is None


def test_a_signal_during_the_cutoff_lp_returns_the_start(monkeypatch):
    """Ctrl-C while the cutoff's LP relaxation runs: the MIP start comes back as `feasible`,
    as it would from HiGHS's own interrupt (docs/reliability.md)."""
    import schedlang.solve.backends as backends
    import schedlang.solve.relaxation as relaxation

    def interrupted(model, limit, interrupts):
        interrupts.requested = "SIGINT"
        return None

    monkeypatch.setattr(backends, "CUTOFF_LP_COLUMNS", 0)
    monkeypatch.setattr(relaxation, "lp_duals", interrupted)
    graph, budget = list(_cases())[2]  # chain4 at its full size: no_recompute fits
    prob = checkmate_problem(graph, budget)
    res = prob.solve(warm_start="checkpoint_all")
    assert res.status == Status.FEASIBLE
    assert "interrupted by SIGINT during the LP relaxation" in res.message
    assert res.objective == pytest.approx(res.warm_start.objective)
    assert res.simulated.valid and res.bound <= res.objective
