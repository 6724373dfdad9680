"""Warm starts: heuristic plans encoded as MIP starts (schedlang.plans.decoders.encode)."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

import schedlang
from schedlang.cli.main import main
from schedlang.plans.decoders import encode
from schedlang.plans.decoders.encode import check_point, objective_value
from schedlang.plans.plan import Op, Plan
from schedlang.plans.planners.no_recompute import no_recompute_peak, no_recompute_plan
from schedlang.plans.simulate import simulate
from schedlang.solve.backends import BACKENDS
from schedlang.solve.solution import Status
from schedlang.testing.bruteforce import best_checkmate_schedule
from schedlang.testing.checkmate_instances import checkmate_problem, tiny_graphs

from ..paths import ROOT

CHAIN = ROOT / "examples" / "chain.sched"
MIB = 2**20


def _lowered(path=CHAIN, budget=None):
    prob = schedlang.load(path, budget=budget)
    prob.check()
    return prob, prob.lower()


def _rows_ok(ir, x) -> None:
    """A @ x within [lo, hi], bounds and integrality: the point is feasible for the IR."""
    A, lo, hi = ir.stacked()
    act = A @ x
    assert np.all(act >= lo - 1e-6) and np.all(act <= hi + 1e-6)
    lb, ub = ir.column_bounds()
    assert np.all(x >= lb - 1e-9) and np.all(x <= ub + 1e-9)
    mask = ir.integrality()
    assert np.all(np.abs(x[mask] - np.round(x[mask])) < 1e-9)
    ok, why = check_point(ir, x)
    assert ok, why


# --------------------------------------------------------------------------- the encoder

@pytest.mark.parametrize("budget", [None, "100%", "200MiB"])
def test_no_recompute_plan_encodes_to_a_feasible_point(budget):
    # None: the file's 120 MiB, where no recomputation does not fit (see the next test)
    prob, ir = _lowered(budget=budget)
    plan = no_recompute_plan(prob.graph)
    x = encode(prob.program, ir, plan, prob.graph)
    assert x is not None and x.shape == (ir.n_columns,)
    if budget is None:
        assert not check_point(ir, x)[0]
        return
    _rows_ok(ir, x)
    assert objective_value(ir, x) == pytest.approx(simulate(plan, prob.graph).time)


def test_recomputing_plan_of_the_solver_round_trips():
    """decode(solve) -> encode gives a feasible point with the solver's objective."""
    prob, ir = _lowered()
    result = prob.solve()
    assert result.status == Status.OPTIMAL
    assert len(result.plan.computes()) > len(prob.graph.nodes)  # it recomputes
    x = encode(prob.program, ir, result.plan, prob.graph)
    _rows_ok(ir, x)
    assert objective_value(ir, x) == pytest.approx(result.objective)


CASES = [(g, frac) for g in tiny_graphs() for frac in (0.6, 0.75, 0.9, 1.0)]


@pytest.mark.parametrize("graph,frac", CASES, ids=[f"{g.name}-{f}" for g, f in CASES])
def test_brute_force_plans_encode_to_feasible_points(graph, frac):
    budget = int(no_recompute_peak(graph) * frac)
    best, plan = best_checkmate_schedule(graph, budget)
    if plan is None:
        pytest.skip("no schedule fits")
    prob = checkmate_problem(graph, budget)
    prob.check()
    ir = prob.lower()
    x = encode(prob.program, ir, plan, prob.graph)
    _rows_ok(ir, x)
    assert objective_value(ir, x) == pytest.approx(best)


def test_plan_outside_the_stage_space_is_not_encoded():
    prob, ir = _lowered()
    plan = no_recompute_plan(prob.graph)
    ops = list(plan.ops)
    i, j = (next(k for k, op in enumerate(ops) if op.op == "compute" and op.node == n)
            for n in ("f1", "f2"))
    ops[i], ops[j] = ops[j], ops[i]  # f2's first computation before f1's
    notes: list[str] = []
    assert encode(prob.program, ir, Plan("chain", ops), prob.graph, notes) is None
    assert "first time before node 'f1'" in notes[0] and "node order" in notes[0]

    notes = []
    bad = Plan("chain", [Op("compute", node="f1"), Op("drop_phantom", layer="x")])
    assert encode(prob.program, ir, bad, prob.graph, notes) is None
    assert "drop_phantom" in notes[0]


# ------------------------------------------------------------- phase models (rockmate, offload)

PHASE_CASES = [("tiny_transformer", None, None), ("unet", None, None),
               ("transformer12", None, "60%"), ("transformer6_offload", None, "60%"),
               ("tiny_transformer", "offload", None)]


@pytest.mark.parametrize("name,model,budget", PHASE_CASES)
def test_layered_plans_encode_to_feasible_points_of_phase_models(name, model, budget):
    """A heuristic plan that fits is a point of the phase model (offload: with zero transfers)
    whose objective is the plan's simulated time; one over the budget is not."""
    prob = schedlang.load(ROOT / "examples" / f"{name}.sched", model=model, budget=budget)
    ir = prob.lower()
    seen_fit = False
    for planner in ("knapsack", "mutwo", "chen_greedy", "no_recompute"):
        ws = prob.prepare_warm_start(planner, ir)
        assert ws.valid, (planner, ws)
        if ws.fits:
            seen_fit = True
            assert ws.encoded and ws.feasible, (planner, ws.message)
            _rows_ok(ir, ws.x)
            assert ws.objective == pytest.approx(ws.time, rel=1e-9)
        else:
            assert not ws.feasible and "no completion" in ws.message
    assert seen_fit


@pytest.mark.parametrize("name,model", [("tiny_transformer", None), ("unet", None),
                                        ("tiny_transformer", "offload")])
def test_phase_model_optimum_round_trips_and_warm_start_keeps_it(name, model):
    """decode(solve) -> encode is a feasible point with the optimum's value, and a solve
    warm-started from it (or from the best heuristic) reaches the same optimum."""
    path = ROOT / "examples" / f"{name}.sched"
    prob = schedlang.load(path, model=model)
    cold = prob.solve()
    assert cold.status == Status.OPTIMAL
    ir = prob.ir
    if not [op for op in cold.plan.ops if op.op in ("offload", "prefetch")]:
        x = encode(prob.program, ir, cold.plan, prob.graph)
        _rows_ok(ir, x)
        assert objective_value(ir, x) == pytest.approx(cold.objective, rel=1e-9)
    for start in ("auto", cold.plan):
        warm = schedlang.load(path, model=model).solve(warm_start=start)
        assert warm.status == Status.OPTIMAL and warm.objective == pytest.approx(cold.objective)
        assert warm.simulated.valid
    assert warm.warm_start.accepted or "transfers" in warm.warm_start.message


def test_plans_outside_the_phase_space_are_not_encodable():
    prob = schedlang.load(ROOT / "examples" / "tiny_transformer.sched")
    ir = prob.lower()
    plan = no_recompute_plan(prob.graph)
    computes = [i for i, op in enumerate(plan.ops) if op.op == "compute"]
    swapped = list(plan.ops)
    a, b = computes[0], computes[1]
    swapped[a], swapped[b] = swapped[b], swapped[a]
    notes: list[str] = []
    assert encode(prob.program, ir, Plan(graph=plan.graph, ops=swapped), prob.graph, notes) is None
    assert "H-graph order" in notes[0]
    with_transfer = [*plan.ops[:2], Op("offload", data="x", fraction=1.0),
                     *plan.ops[2:]]
    notes = []
    assert encode(prob.program, ir, Plan(graph=plan.graph, ops=with_transfer), prob.graph,
                  notes) is None
    assert "without transfers" in notes[0]


# --------------------------------------------------------------------------- solving

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("budget,expected", [(None, 50.0), ("100%", 45.0)])
def test_warm_started_solves_reach_the_optimum(backend, budget, expected):
    cold = schedlang.load(CHAIN, budget=budget).solve(backend=backend, solver="highs")
    assert cold.status == Status.OPTIMAL and cold.objective == pytest.approx(expected)
    # the solver's own (recomputing) plan as a start, and a heuristic plan by name
    starts = [cold.plan, "no_recompute"] if budget else [cold.plan]
    for start in starts:
        warm = schedlang.load(CHAIN, budget=budget).solve(backend=backend, solver="highs",
                                                         warm_start=start)
        assert warm.status == Status.OPTIMAL, warm.message
        assert warm.objective == pytest.approx(expected)
        ws = warm.warm_start
        assert ws.encoded and ws.feasible and ws.fits and ws.passed and ws.accepted, ws
        assert ws.objective == pytest.approx(ws.time)
        assert "given to the solver as a MIP start" in warm.message
        assert warm.simulated.valid


@pytest.mark.parametrize("backend", BACKENDS)
def test_over_budget_plan_is_an_infeasible_start(backend):
    # no recomputation peaks at 168 MiB, the file's budget is 120 MiB
    result = schedlang.load(CHAIN).solve(backend=backend, warm_start="no_recompute")
    assert result.status == Status.OPTIMAL and result.objective == pytest.approx(50)
    ws = result.warm_start
    assert ws.planner == "no_recompute" and ws.valid and not ws.fits
    assert ws.encoded and not ws.feasible and not ws.passed and not ws.accepted
    assert "over the budget" in ws.message and "U[" in ws.message
    assert "solved cold" in result.message


def test_unencodable_plan_runs_cold_and_says_so():
    prob = schedlang.load(CHAIN, budget="100%")
    plan = no_recompute_plan(prob.graph)
    ops = [op for op in plan.ops]
    a = next(k for k, op in enumerate(ops) if op.op == "compute" and op.node == "f1")
    b = next(k for k, op in enumerate(ops) if op.op == "compute" and op.node == "f2")
    ops[a], ops[b] = ops[b], ops[a]
    result = prob.solve(warm_start=Plan("chain", ops))
    assert result.status == Status.OPTIMAL and result.objective == pytest.approx(45)
    assert not result.warm_start.encoded and not result.warm_start.passed
    assert "solved cold" in result.message and "node order" in result.message


def test_vector_warm_start_is_checked():
    prob = schedlang.load(CHAIN)
    prob.check()
    ir = prob.lower()
    good = prob.solve().solution.x
    warm = prob.solve(warm_start=good)
    assert warm.warm_start.accepted and warm.warm_start.planner is None
    bad = prob.solve(warm_start=np.zeros(ir.n_columns))  # R[t, t] = 1 is violated
    assert not bad.warm_start.feasible and not bad.warm_start.passed
    assert "frontier" in bad.warm_start.message
    with pytest.raises(schedlang.language.errors.SchedError):
        prob.solve(warm_start=np.zeros(3))


def test_unknown_planner_is_bad_input():
    with pytest.raises(schedlang.language.errors.SchedError, match="unknown planner 'no_recomput'"):
        schedlang.load(CHAIN).solve(warm_start="no_recomput")


# --------------------------------------------------------------------------- command line

def test_cli_warm_start_json(capsys):
    code = main(["solve", str(CHAIN), "--budget", "100%", "--warm-start", "no_recompute",
                 "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["status"] == "optimal" and out["objective"] == pytest.approx(45)
    ws = out["warm_start"]
    assert ws["planner"] == "no_recompute" and ws["time"] == pytest.approx(45)
    assert ws["fits"] is True and ws["feasible"] is True and ws["accepted"] is True


def test_cli_warm_start_human_over_budget(capsys):
    code = main(["solve", str(CHAIN), "--warm-start", "no_recompute"])
    out = capsys.readouterr().out
    assert code == 0
    line = next(ln for ln in out.splitlines() if ln.startswith("warm start"))
    assert "no_recompute" in line and "over the budget" in line and "solved cold" in line


def test_cli_unknown_planner_exits_2(capsys):
    assert main(["solve", str(CHAIN), "--warm-start", "nope"]) == 2
    assert "unknown planner 'nope'" in capsys.readouterr().err


# --------------------------------------------------------------------------- default: auto

def test_cli_warm_starts_by_default_and_not_with_no_warm_start(capsys):
    assert main(["solve", str(CHAIN), "--json"]) == 0
    auto = json.loads(capsys.readouterr().out)
    assert main(["solve", str(CHAIN), "--json", "--no-warm-start"]) == 0
    cold = json.loads(capsys.readouterr().out)
    assert cold["warm_start"] is None
    ws = auto["warm_start"]
    assert set(ws["auto"]) == {"knapsack", "mutwo", "chen_greedy"}
    assert ws["planner"] in ws["auto"] and ws["fits"] and ws["accepted"]
    assert auto["objective"] == pytest.approx(cold["objective"])


def test_auto_picks_the_best_feasible_start():
    prob, ir = _lowered()
    ws = prob.prepare_warm_start("auto", ir)
    each = [prob.prepare_warm_start(name, ir) for name in ws.auto]
    feasible = [w.objective for w in each if w.feasible]
    assert ws.feasible and ws.objective == pytest.approx(min(feasible))


def test_auto_without_a_fitting_plan_solves_cold_and_says_why():
    # 40 MiB: no heuristic plan fits the chain (the ILP proves it infeasible)
    res = schedlang.load(CHAIN, budget="40MiB").solve(warm_start="auto")
    ws = res.warm_start
    assert not ws.passed and "no heuristic plan fits" in ws.message
    assert res.status == Status.INFEASIBLE
    # how far over, in bytes: each planner's plan's peak against the 40 MiB budget
    overs = re.findall(r"it peaks at (\d+) B, (\d+) B over", ws.message)
    assert overs and all(int(p) - int(o) == 40 * 2 ** 20 for p, o in overs)
