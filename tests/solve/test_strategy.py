"""The default solve (schedlang/solve/strategy.py): its routes, their answers against the exhaustive
oracle and against the model as written, every plan replayed, and what the output says."""
from __future__ import annotations

import json
import random
import re
import time

import pytest

import schedlang
from schedlang.cli.main import main
from schedlang.graphs.writer import write_graph
from schedlang.plans.planners.no_recompute import no_recompute_peak
from schedlang.plans.simulate import simulate
from schedlang.solve import strategy
from schedlang.solve.orders import describe, first_computations, in_order
from schedlang.solve.solution import Status
from schedlang.testing.bruteforce import assert_oracle_optimum, best_checkmate_schedule, best_sequence_schedule
from schedlang.testing.checkmate_instances import graph_of, tiny_graphs

from ..paths import EXAMPLES, OPGRAPHS, ROOT


def _problem(graph, budget):
    graph.budgets = {"peak": budget}
    return schedlang.load(text=write_graph(graph))


def test_small_graphs_and_other_formulations_are_solved_as_written():
    prob = schedlang.load(EXAMPLES / "chain.sched")
    assert strategy.choose(prob).name == "as written"
    result = strategy.solve(prob)
    assert result.status == Status.OPTIMAL and result.objective == pytest.approx(50)
    assert result.strategy.model == "checkmate"
    # a formulation other than the shipped checkmate: as written, whatever the size
    op = schedlang.load(OPGRAPHS / "gpt1.sched", model="checkmate_tight")
    assert strategy.choose(op).name == "as written"
    assert strategy.choose(schedlang.load(OPGRAPHS / "gpt1.sched")).name == "op graph"
    assert strategy.choose(schedlang.load(EXAMPLES / "unet.sched")).name == "as written"


CASES = [(g, frac) for g in tiny_graphs() for frac in (0.5, 0.6, 0.75, 1.0)]


def _on_the_op_graph_route(graph, frac, monkeypatch):
    """(the budget, brute force's optimum in the graph's own order, the default solve's
    result) with every graph sent down the op-graph route."""
    monkeypatch.setattr(strategy, "SMALL_NODES", 0)
    budget = int(no_recompute_peak(graph) * frac)
    expected, _ = best_checkmate_schedule(graph, budget)
    return budget, expected, strategy.solve(_problem(graph, budget), time_limit=60)


@pytest.mark.parametrize("graph,frac", CASES, ids=[f"{g.name}-{f}" for g, f in CASES])
def test_op_graph_route_matches_brute_force(graph, frac, monkeypatch):
    # every graph takes the op-graph route here: heuristic start or phase one, CP-SAT, HiGHS
    budget, expected, result = _on_the_op_graph_route(graph, frac, monkeypatch)
    assert result.strategy.name == "op graph"
    if expected is not None:  # the graph's own order is always solved: never slower than it
        assert result.objective is not None and result.objective <= expected * (1 + 1e-6)
    if result.strategy.order == "shift":  # the optimum of the stage model in that order
        expected, _ = best_checkmate_schedule(
            in_order(graph, first_computations(result.plan)), budget)
    if not assert_oracle_optimum(result, expected, graph.name):
        return
    sim = simulate(result.plan, graph, budget=budget)
    assert sim.valid and sim.time == pytest.approx(expected)


# budgets at which no plan fits the tiny graphs in their own order (brute force): the route's
# phase one proves it, whichever of its solvers does
INFEASIBLE = [(g, frac) for g in tiny_graphs() for frac in (0.5, 0.6)
              if best_checkmate_schedule(g, int(no_recompute_peak(g) * frac))[0] is None]


@pytest.mark.parametrize("solvers", [(("cpsat", 1.0),), (("highs", 0.0), ("cpsat", 1.0))],
                         ids=["cpsat", "highs-skipped"])
@pytest.mark.parametrize("graph,frac", INFEASIBLE[:4], ids=[f"{g.name}-{f}" for g, f in INFEASIBLE[:4]])
def test_phase_one_by_cpsat_proves_what_brute_force_proves(graph, frac, solvers, monkeypatch):
    """Phase one's solvers take turns (`PHASE_ONE_SOLVERS`); CP-SAT's least excess above zero,
    proven, is a proof of infeasibility as HiGHS's is, and a solver whose share is too short
    to build the model in is skipped, not the end of phase one."""
    monkeypatch.setattr(strategy, "PHASE_ONE_SOLVERS", solvers)
    budget, expected, result = _on_the_op_graph_route(graph, frac, monkeypatch)
    assert expected is None and result.status == Status.INFEASIBLE
    phase_one = [s for s in result.strategy.steps if s.model == strategy.SOFT_BUDGET]
    assert [s.what for s in phase_one] == ["cpsat"]
    assert phase_one[0].objective > 0


@pytest.mark.slow
def test_phase_one_goes_on_by_cpsat_from_highs_least_excess(monkeypatch):
    """bert1's op graph at 60%: no heuristic plan fits, and HiGHS on the soft budget ends over
    it (3.7 KB after 16 s, 3.3 KB after 236 s); CP-SAT, started from HiGHS's least excess,
    finds a plan that fits (7 s). Here HiGHS gets a tenth of phase one, so that it ends over."""
    monkeypatch.setattr(strategy, "PHASE_ONE_SOLVERS", (("highs", 0.1), ("cpsat", 1.0)))
    prob = schedlang.load(OPGRAPHS / "bert1.sched", budget="60%")
    prob.check()
    route = strategy.Route("op graph", "")
    tight = strategy._load_like(prob, [strategy.TIGHT_MODEL])
    start, _, lowest, _ = strategy._start_plan(tight, route)
    assert start is None and lowest is not None
    plan, note, proof = strategy._phase_one(prob, route, lowest, 60, time.monotonic(), {})
    assert proof is None and note == "from phase one's plan"
    phase_one = [s for s in route.steps if s.model == strategy.SOFT_BUDGET]
    assert [s.what for s in phase_one] == ["highs", "cpsat"]
    assert phase_one[0].objective > 0 and phase_one[1].note.endswith("from HiGHS's least")
    assert phase_one[1].objective == 0
    sim = simulate(plan, prob.graph, budget=prob.budgets["peak"])
    assert sim.valid and sim.fits_budget


M = 2**20
# graphs whose stage model is faster in another node order than in their own: in their own
# order no plan fits (first) or the optimum is 53 (second); the same nodes reordered: 33, 44
REORDERED = [
    (graph_of("late_n4", [("n0", 2, 2 * M), ("n1", 8, M), ("n2", 3, 5 * M), ("n3", 6, 5 * M),
                          ("n4", 8, 6 * M), ("n5", 4, 2 * M)],
              [("n0", "n1"), ("n0", "n5"), ("n2", "n3"), ("n3", "n5")]), 0.8),
    (graph_of("late_n1", [("n0", 8, 5 * M), ("n1", 9, 6 * M), ("n2", 9, 5 * M), ("n3", 1, 3 * M),
                          ("n4", 3, 2 * M), ("n5", 6, 4 * M)],
              [("n0", "n2"), ("n0", "n3"), ("n0", "n5"), ("n1", "n4"), ("n1", "n5"),
               ("n2", "n3"), ("n2", "n4"), ("n4", "n5")]), 0.9),
]


@pytest.mark.parametrize("graph,frac", REORDERED, ids=[g.name for g, _ in REORDERED])
def test_op_graph_route_solves_the_stage_model_in_a_better_order(graph, frac, monkeypatch):
    # recompute_gaps in shift's order starts faster than any plan in the graph's order: the
    # route solves the stage model in shift's order, says so, and proves that order's optimum
    budget, in_own_order, result = _on_the_op_graph_route(graph, frac, monkeypatch)
    assert result.strategy.order == "shift"
    assert "in planner shift's node order" in result.message
    order = first_computations(result.plan)
    assert order != [n.name for n in graph.nodes]
    expected, _ = best_checkmate_schedule(in_order(graph, order), budget)
    assert assert_oracle_optimum(result, expected, graph.name)
    assert in_own_order is None or expected < in_own_order
    sim = simulate(result.plan, graph, budget=budget)  # a plan of the graph as given
    assert sim.valid and sim.time == pytest.approx(expected)
    out = result.strategy.to_json()
    assert out["order"] == "shift" and "shift's node order" in result.strategy.summary()


# a graph whose stage model is faster in its own order than in shift's, although only shift's
# order has a heuristic plan at 90% (recompute_gaps; none fits in the graph's order): the
# stage model's optimum is 33 in the graph's order, 39 in shift's
LATE_GAIN = graph_of("late_gain", [("n0", 7, 5 * M), ("n1", 1, 4 * M), ("n2", 1, 6 * M),
                                   ("n3", 6, 6 * M), ("n4", 8, 5 * M), ("n5", 9, 3 * M)],
                     [("n0", "n1"), ("n0", "n3"), ("n1", "n2"), ("n1", "n5"), ("n2", "n3"),
                      ("n2", "n5"), ("n4", "n5")])


def test_op_graph_route_keeps_the_faster_order_when_the_other_starts_faster(monkeypatch):
    # (without the starts from smaller budgets: with them, recompute_gaps at a smaller budget
    # fits in the graph's order too, which then starts ahead and the other order is not tried)
    monkeypatch.setattr(strategy, "ladder_plans", lambda *args, **kwargs: iter(()))
    budget, in_own_order, result = _on_the_op_graph_route(LATE_GAIN, 0.9, monkeypatch)
    steps = result.strategy.steps
    assert any("shift's order: faster" in s.note for s in steps)  # shift's order starts ahead
    assert any(s.what == "cpsat" and "the graph's order" in s.note for s in steps)
    order = [n.name for n in LATE_GAIN.nodes]
    shift_order = strategy._reordered(_problem(LATE_GAIN, budget), strategy.Route("", ""),
                                      None, 0.0)[1]
    in_shift_order, _ = best_checkmate_schedule(in_order(LATE_GAIN, shift_order), budget)
    assert shift_order != order and in_own_order < in_shift_order  # (the instance: 33 < 39)
    assert result.status == Status.OPTIMAL and result.strategy.order == "graph"
    assert result.objective == pytest.approx(in_own_order)
    assert "the stage model in the graph's node order" in result.message
    sim = simulate(result.plan, LATE_GAIN, budget=budget)
    assert sim.valid and sim.time == pytest.approx(in_own_order)


@pytest.mark.parametrize("graph", [LATE_GAIN] + [g for g, _ in REORDERED] + tiny_graphs(),
                         ids=lambda g: g.name)
def test_op_graph_route_is_never_slower_at_a_larger_budget(graph, monkeypatch):
    """On graphs where the node order the route takes changes with the budget, and on the tiny
    graphs, the answers (each closed: the optimum of the orders it solved, its starts from
    smaller budgets included) never get slower as the budget grows, and a budget with a plan
    gives every larger budget one (same flags); every plan replays within its budget."""
    answers = []
    for frac in (0.5, 0.6, 0.75, 0.8, 0.85, 0.9, 0.95, 1.0):
        budget, _, result = _on_the_op_graph_route(graph, frac, monkeypatch)
        if result.plan is not None:
            assert simulate(result.plan, graph, budget=budget).valid
        answers.append(result.objective)
    first = next(i for i, a in enumerate(answers) if a is not None)
    solved = answers[first:]
    assert None not in solved, answers
    assert all(b <= a * (1 + 1e-6) for a, b in zip(solved, solved[1:])), answers


def test_op_graph_route_reports_a_replayed_plan_and_its_bound(monkeypatch):
    monkeypatch.setattr(strategy, "SMALL_NODES", 10)
    prob = schedlang.load(OPGRAPHS / "mlp3.sched", budget="90%")
    result = strategy.solve(prob, time_limit=60)
    assert [s.what for s in result.strategy.steps][:1] == ["planner"]
    assert result.strategy.model == "checkmate_tight"
    expected = schedlang.load(OPGRAPHS / "mlp3.sched", budget="90%").solve(time_limit=60)
    assert expected.status == Status.OPTIMAL  # checkmate.sched closes this one
    assert result.status == Status.OPTIMAL
    assert result.objective == pytest.approx(expected.objective, rel=1e-4)  # the default gap
    sim = simulate(result.plan, prob.graph, budget=prob.budgets["peak"])
    assert sim.valid and sim.time == pytest.approx(result.objective)


def test_ctrl_c_while_bounding_keeps_the_start_plan(monkeypatch):
    """A Ctrl-C during the window bounds (before a solver runs) returns the start plan,
    replayed, feasible, with the order-free bound: what was solved is not lost."""
    monkeypatch.setattr(strategy, "SMALL_NODES", 10)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(strategy, "window_bound", interrupted)
    prob = schedlang.load(OPGRAPHS / "mlp3.sched", budget="90%")
    result = strategy.solve(prob, time_limit=60)
    assert result.status.has_solution and result.plan is not None
    assert "interrupted while bounding" in result.message
    sim = simulate(result.plan, prob.graph, budget=prob.budgets["peak"])
    assert sim.valid and sim.time == pytest.approx(result.objective)
    assert result.bound is not None and result.bound <= result.objective


def test_large_graph_route_gives_the_best_plan_with_the_order_free_bound(monkeypatch):
    monkeypatch.setattr(strategy, "LARGE_NODES", 40)
    prob = schedlang.load(OPGRAPHS / "gpt1.sched", budget="90%")
    result = strategy.solve(prob)
    assert result.strategy.name == "large graph"
    assert result.status.has_solution
    sim = simulate(result.plan, prob.graph, budget=prob.budgets["peak"])
    assert sim.valid and sim.time == pytest.approx(result.objective)
    every_node_once = sum(n.time for n in prob.graph.nodes)
    assert every_node_once < result.objective  # (the plan recomputes: the windows bound it)
    assert every_node_once < result.bound <= result.objective
    assert result.strategy.order is not None
    assert f"status, gap and bound are for {describe(result.strategy.order)}" in result.message
    assert result.gap == pytest.approx((result.objective - result.bound) / result.objective)


def test_large_graph_route_interrupted_while_bounding_keeps_its_plan(monkeypatch):
    monkeypatch.setattr(strategy, "LARGE_NODES", 40)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(strategy, "window_bound", interrupted)
    prob = schedlang.load(OPGRAPHS / "gpt1.sched", budget="90%")
    result = strategy.solve(prob)
    assert result.status.has_solution and "interrupted while bounding" in result.message
    assert simulate(result.plan, prob.graph, budget=prob.budgets["peak"]).valid
    assert result.bound == pytest.approx(sum(n.time for n in prob.graph.nodes))


def test_large_graph_route_without_a_plan_says_by_how_much_it_is_over(monkeypatch):
    monkeypatch.setattr(strategy, "LARGE_NODES", 40)
    prob = schedlang.load(OPGRAPHS / "gpt1.sched", budget="20%")
    result = strategy.solve(prob, time_limit=30)
    assert result.status == Status.NO_SOLUTION and result.plan is None
    lowest = int(re.search(r"the lowest peak, planner [\w ]+: (\d+) B", result.message)[1])
    over = float(re.search(r"B, ([\d.]+)% over", result.message)[1])
    budget = prob.budgets["peak"]
    assert lowest > budget and over == pytest.approx(100 * (lowest - budget) / budget, abs=0.05)


def _training_graph(seed: int, depth: int):
    """A forward chain f1..fk and its backward gk..g1, each gi reading fi (random times and
    sizes): the graphs where plans recompute."""
    rng = random.Random(seed)
    mib = 2**20
    f = [f"f{i}" for i in range(1, depth + 1)]
    g = [f"g{i}" for i in range(depth, 0, -1)]
    nodes = [(x, rng.randint(1, 5), rng.randint(1, 6) * mib) for x in f + g]
    edges = list(zip(f, f[1:])) + list(zip(g, g[1:])) + [(f[-1], g[0])]
    edges += [(f"f{i}", f"g{i + 1}") for i in range(1, depth)]
    return graph_of(f"train{depth}_{seed}", nodes, edges)


def test_large_graph_route_bounds_hold_for_every_plan_in_its_order(monkeypatch):
    """The large-graph route's bound (the order-free one, or the window bound in the plan's
    order of first computations, which `Route.order` names) is at most the exhaustive optimum
    of the stage model in that order, and at least the sum of the node times."""
    monkeypatch.setattr(strategy, "SMALL_NODES", 1)
    monkeypatch.setattr(strategy, "LARGE_NODES", 2)
    raised = 0
    for graph in [*tiny_graphs(), *(_training_graph(seed, 3) for seed in range(10))]:
        for frac in (0.6, 0.7, 0.8):
            budget = int(no_recompute_peak(graph) * frac)
            result = strategy.solve(_problem(graph, budget))
            assert result.strategy.name == "large graph"
            if not result.status.has_solution:
                continue
            every_node_once = sum(n.time for n in graph.nodes)
            assert every_node_once - 1e-9 <= result.bound <= result.objective + 1e-9
            ordered = in_order(graph, first_computations(result.plan))
            optimum, _ = best_checkmate_schedule(ordered, budget)
            assert optimum is not None and result.bound <= optimum + 1e-9, (graph.name, frac)
            if result.bound > every_node_once + 1e-9:
                raised += 1
                assert result.strategy.order is not None
                assert "status, gap and bound are for" in result.message
    assert raised >= 3  # (the window bound was above the order-free one, and checked)


def test_cli_says_which_route_and_model_it_used(capsys, monkeypatch):
    monkeypatch.setattr(strategy, "LARGE_NODES", 40)
    assert main(["solve", str(OPGRAPHS / "gpt1.sched"), "--budget", "90%", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["strategy"]["route"] == "large graph"
    assert out["strategy"]["steps"][0]["what"] == "planner"
    # a solver named on the command line: the model as written, no strategy
    assert main(["solve", str(EXAMPLES / "chain.sched"), "--solver", "highs", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["strategy"] is None and out["solver"] == "highs"
    assert main(["solve", str(EXAMPLES / "chain.sched")]) == 0
    assert "strategy  as written" in capsys.readouterr().out


@pytest.mark.parametrize("graph,frac", [(g, f) for g in tiny_graphs()[:4] for f in (0.5, 0.7)],
                         ids=lambda x: getattr(x, "name", str(x)))
def test_soft_budget_least_excess_is_zero_exactly_when_a_plan_fits(graph, frac):
    budget = int(no_recompute_peak(graph) * frac)
    expected, _ = best_checkmate_schedule(graph, budget)
    graph.budgets = {"peak": budget}
    prob = schedlang.load(text=write_graph(graph), model=[
        "checkmate_tight", str(ROOT / "models" / "extensions" / "soft_budget.sched")])
    result = prob.solve(warm_start="recompute_all")
    assert result.status == Status.OPTIMAL, result.message
    assert (result.objective <= 1e-9) == (expected is not None)
    # the start over the budget is a point of this model: its excess completed by HiGHS
    assert result.warm_start.feasible, result.warm_start.message


def _dag80():
    """Six nodes on which no plan in the node order fits 15 MiB and no heuristic plan fits,
    while a plan in another order does (27 with at most 12 computations)."""
    rng = random.Random(80)
    names = [f"n{i}" for i in range(6)]
    nodes = [(x, rng.randint(1, 5), rng.randint(1, 6) << 20) for x in names]
    edges = [(names[i], names[j]) for i in range(6) for j in range(i + 1, 6) if rng.random() < 0.45]
    return graph_of("dag80", nodes, edges)


@pytest.mark.skipif(not strategy.order_free.available(), reason="needs CP-SAT")
def test_small_graph_route_finds_a_plan_outside_the_graph_order():
    """The small-graph route, when no heuristic plan fits, asks the order-free model
    (models/sequence.sched) first: here the node order has no plan at all (the stage model
    alone would say infeasible), and the answer is a plan in another order, replayed within
    the budget, at most as slow as the order-free optimum over 12 computations."""
    graph, budget = _dag80(), 15 << 20
    assert best_checkmate_schedule(graph, budget)[0] is None
    any_order, _ = best_sequence_schedule(graph, budget, 12)
    assert any_order is not None
    result = strategy.solve(_problem(graph, budget), time_limit=60)
    assert result.status in (Status.FEASIBLE, Status.OPTIMAL) and result.plan is not None
    sim = simulate(result.plan, graph, budget=budget)
    assert sim.valid, sim.errors
    assert sim.time <= any_order * (1 + 1e-9)
    assert result.strategy.order == "sequence"
    assert "order-free" in result.message and "sequence.sched" in result.message
    assert [s.model for s in result.strategy.steps if s.what == "cpsat"] == ["sequence"]


@pytest.mark.slow  # 13 s: the ladder and shift on resnet's op graph
def test_the_order_is_chosen_by_the_starts_times_in_the_model():
    """resnet's op graph at 60%: recompute_gaps's plan in the graph's order, as written, peaks
    871 B over the budget, but the model runs it with its own deletions and it fits there, at
    0.003095 against 0.003272 for recompute_gaps in shift's order: the graph's order goes
    first (the replay of the plan as written took shift's, and the route ended at 0.003272)."""
    prob = schedlang.load(OPGRAPHS / "resnet.sched", budget="60%")
    prob.check()
    route = strategy.Route("op graph", "")
    _, order = strategy._reordered(prob, route, None, 0.0)
    tight = strategy._load_like(prob, [strategy.TIGHT_MODEL])
    start, _, _, start_time = strategy._start_plan(tight, route)
    assert not simulate(start, prob.graph, budget=prob.budgets["peak"]).valid  # as written
    side = strategy._shift_side(prob, route, start_time, order)
    assert side is not None and side.order == "shift"
    shift_time = simulate(side.start, prob.graph).time
    assert side.faster == (shift_time < start_time) and not side.faster


def test_a_plan_in_hand_replaces_the_answer_only_when_faster_than_rounding():
    """The model's objective and a replayed plan's time, the same node times summed in another
    order, differ in the last digits: the model's optimal answer with its own bound stays
    (unet at 90%: it was replaced by an equal plan with the weaker every-node-once bound)."""
    def result(objective, bound, status):
        return schedlang.results.Result(status, objective, bound, 0.0, "pyomo", "cpsat", {}, {},
                                        plan=object())

    answer = result(0.0024158269999999997, 0.0024158269999999997, Status.OPTIMAL)
    same = result(0.002415826999999998, 0.0023998, Status.FEASIBLE)
    route = strategy.Route("op graph", "")
    assert strategy._faster(answer, [same, None], route) is answer
    faster = result(0.0024, 0.0023998, Status.FEASIBLE)
    assert strategy._faster(answer, [same, faster], route) is faster
    assert "faster than the stage model" in faster.message


def test_a_plan_that_fits_a_smaller_budget_starts_the_route():
    """gpt1's op graph: recompute_gaps at 80% of the plain peak takes 0.005290, run at a
    smaller budget (its needless recomputations then undone at 80%) 0.004896; at 70% no
    planner fits at the budget itself, and the ladder's plans give the route a start without
    phase one. Every start fits its budget, replayed."""
    for pct, at_budget_fits in (("80%", True), ("70%", False)):
        prob = schedlang.load(OPGRAPHS / "gpt1.sched", budget=pct)
        prob.check()
        budget = prob.budgets["peak"]
        tight = strategy._load_like(prob, [strategy.TIGHT_MODEL])
        own = strategy.prune_recomputations(
            tight.graph, strategy.run_named_planner("recompute_gaps", tight.graph, budget), budget)
        own_sim = simulate(own, tight.graph, budget=budget)
        start, note, _, start_time = strategy._start_plan(tight, strategy.Route("op graph", ""))
        assert start is not None and "of the budget" in note
        assert simulate(start, tight.graph, budget=budget).valid
        assert own_sim.valid == at_budget_fits
        if at_budget_fits:
            assert start_time < own_sim.time * (1 - 1e-6)



def test_a_smaller_budgets_plan_starts_the_graph_order(monkeypatch):
    """LATE_GAIN at 90%: no planner fits in the graph's order at the budget, recompute_gaps at
    a smaller budget does, and the route proves the graph order's optimum (33) in that order."""
    budget, in_own_order, result = _on_the_op_graph_route(LATE_GAIN, 0.9, monkeypatch)
    assert result.status == Status.OPTIMAL and result.strategy.order == "graph"
    assert result.objective == pytest.approx(in_own_order)
    assert any("of the budget" in s.note for s in result.strategy.steps if s.what == "planner")
    assert simulate(result.plan, LATE_GAIN, budget=budget).valid
