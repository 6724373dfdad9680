"""The baseline planners (schedlang/plans/planners/baselines.py): valid plans on both graph
vocabularies, the expected overhead/memory ordering, budgets respected when they can be."""
from __future__ import annotations

import itertools

import pytest

from schedlang.cli.main import load_graph
from schedlang.graphs.elements import Node
from schedlang.graphs.graph import Graph
from schedlang.plans.planners import planners, run_planner
from schedlang.plans.planners.baselines import (
    PLANNERS,
    knapsack_choose,
    plan_checkpoint_groups,
    sequential_checkpoints,
    sqrt_checkpoints,
)
from schedlang.plans.planners.no_recompute import no_recompute_plan
from schedlang.plans.planners.sequences import CheckmateView
from schedlang.plans.simulate import simulate
from schedlang.problem import resolve_budget

from ..paths import EXAMPLES, GRAPHS

NO_LIMIT = 1 << 62
BASELINES = list(PLANNERS)
BUDGET_AWARE = ["chen_greedy", "checkpoint_sequential", "knapsack"]
LAYERED = ["tiny_transformer", "transformer12", "unet", "profiled"]


def load(name: str) -> Graph:
    if name == "vgg16_train":
        path = GRAPHS / "vgg16_train.json"
        if not path.exists():
            pytest.skip(f"{path} not present")
        graph, budgets = load_graph(str(path))
    else:
        graph, budgets = load_graph(str(EXAMPLES / f"{name}.sched"))
    graph.budgets.update(budgets)
    return graph


def chain(n: int, fwd_time: float = 1.0, bwd_time: float = 2.0, size: int = 1 << 20) -> Graph:
    """Checkmate's linear training graph: f0..f{n-1}, then b{n-1}..b0; b_i reads f_i, b_{i+1}."""
    nodes = [Node(f"f{i}", fwd_time, size) for i in range(n)]
    nodes += [Node(f"b{i}", bwd_time, size, kind="backward") for i in reversed(range(n))]
    edges = [(f"f{i}", f"f{i + 1}") for i in range(n - 1)]
    for i in reversed(range(n)):
        edges.append((f"f{i}", f"b{i}"))
        if i + 1 < n:
            edges.append((f"b{i + 1}", f"b{i}"))
    return Graph(name=f"chain{n}", nodes=nodes, edges=edges)


def check(graph: Graph, name: str, budget: int | None):
    """Run planner `name`; its plan must replay (whatever the budget); returns the replay."""
    plan = run_planner(name, graph, budget)
    sim = simulate(plan, graph, budget=NO_LIMIT, save_budget=NO_LIMIT)
    assert sim.valid, (name, graph.name, sim.errors[:3])
    assert plan.meta["planner"] == name
    if name in PLANNERS and name != "no_recompute":
        # the baselines predict with the simulator: predicted == simulated
        assert plan.predicted_peak == sim.peak_bytes
        assert plan.predicted_time == pytest.approx(sim.time)
    return plan, sim


def reference(graph: Graph):
    return simulate(no_recompute_plan(graph), graph, budget=NO_LIMIT, save_budget=NO_LIMIT)


@pytest.mark.parametrize("graph_name", ["chain", "vgg16_train", *LAYERED])
@pytest.mark.parametrize("frac", [None, "90%", "60%"])
def test_every_baseline_replays(graph_name, frac):
    graph = load(graph_name)
    budget = resolve_budget(frac, graph) if frac else graph.budgets.get("peak")
    ref = reference(graph)
    for name in BASELINES:
        plan, sim = check(graph, name, budget)
        assert sim.time >= ref.time - 1e-9 * ref.time, name  # recomputation never saves time
        if name in ("no_recompute", "checkpoint_all"):
            assert sim.time == pytest.approx(ref.time) and sim.peak_bytes == ref.peak_bytes


def test_registry_lists_the_baselines_for_both_views():
    table = planners()
    for name in ["no_recompute", "checkpoint_all", "recompute_all", "chen_sqrt", "chen_greedy",
                 "checkpoint_sequential", "knapsack"]:
        assert name in table
        assert set(table[name].views) == {"checkmate", "layered"}
        assert table[name].description


def test_ordering_on_a_long_chain():
    graph = chain(25)
    ref = reference(graph)
    out = {name: check(graph, name, None)[1] for name in BASELINES}
    over = {name: s.time / ref.time - 1 for name, s in out.items()}
    peak = {name: s.peak_bytes for name, s in out.items()}
    assert over["no_recompute"] == 0 and over["checkpoint_all"] == 0
    assert 0 < over["chen_sqrt"] < over["recompute_all"]
    assert peak["recompute_all"] <= peak["chen_sqrt"] < peak["no_recompute"]
    # sqrt(n) segments: each forward recomputed at most once -> overhead <= forward / total
    assert over["chen_sqrt"] <= 25 * 1.0 / ref.time + 1e-9
    # recompute-all is quadratic: b_i recomputes f1..f_i (f0 is the input; f24 is still in
    # memory for b24, which follows the forward)
    assert out["recompute_all"].time == pytest.approx(ref.time + sum(range(1, 24)))
    # without a budget: chen_greedy aims at memory, the others at time
    assert peak["chen_greedy"] <= peak["chen_sqrt"]
    assert over["checkpoint_sequential"] == 0 and over["knapsack"] == 0


def test_chen_sqrt_uses_sqrt_n_segments():
    assert sqrt_checkpoints(list(range(16))) == [3, 7, 11]
    assert sqrt_checkpoints(list(range(1))) == []
    graph = chain(16)
    plan = run_planner("chen_sqrt", graph)
    # units: f1..f15 (f0 is the graph input, always kept); 15 units -> segments of 4
    assert plan.meta["checkpoints"] == ["f4", "f8", "f12"]


def test_checkpoint_sequential_segments_like_torch():
    units = list(range(10))
    assert sequential_checkpoints(units, 1) == []
    assert sequential_checkpoints(units, 2) == [4]  # [0..4] checkpointed, [5..9] normal
    assert sequential_checkpoints(units, 3) == [2, 5]  # size 3; the last segment holds 4 units
    assert sequential_checkpoints(units, 20) == []


@pytest.mark.parametrize("graph_name", ["chain", "transformer12", "tiny_transformer"])
def test_budget_aware_planners_fit_the_file_budget(graph_name):
    graph = load(graph_name)
    budget = graph.budgets["peak"]
    save = graph.budgets.get("save")
    for name in BUDGET_AWARE:
        _, sim = check(graph, name, budget)
        assert sim.peak_bytes <= budget, name
        if save is not None and sim.save_peak_bytes is not None:
            assert sim.save_peak_bytes <= save, name


@pytest.mark.parametrize("graph_name", ["chain", "unet", "transformer12"])
def test_full_budget_means_no_recomputation(graph_name):
    graph = load(graph_name)
    graph.budgets.pop("save", None)
    ref = reference(graph)
    for name in ("checkpoint_sequential", "knapsack"):
        _, sim = check(graph, name, ref.peak_bytes)
        assert sim.time == pytest.approx(ref.time) and sim.peak_bytes <= ref.peak_bytes


def test_budget_aware_planners_fit_when_a_baseline_does():
    """At the peak chen_sqrt reaches on a long chain, chen_greedy fits and is no slower (the
    chain's articulation points include sqrt's checkpoints); knapsack fits too."""
    graph = chain(16)
    _, sqrt_sim = check(graph, "chen_sqrt", None)
    budget = sqrt_sim.peak_bytes
    _, greedy = check(graph, "chen_greedy", budget)
    assert greedy.peak_bytes <= budget and greedy.time <= sqrt_sim.time + 1e-9
    _, knap = check(graph, "knapsack", budget)
    assert knap.peak_bytes <= budget


def test_an_unreachable_budget_returns_a_plan_that_does_not_fit():
    graph = load("chain")
    for name in BASELINES:
        plan, sim = check(graph, name, 20 * 2**20)
        assert sim.peak_bytes > 20 * 2**20
    # the budget-aware ones return their lowest peak
    _, greedy = check(graph, "chen_greedy", 20 * 2**20)
    _, sqrt = check(graph, "chen_sqrt", 20 * 2**20)
    assert greedy.peak_bytes <= sqrt.peak_bytes < reference(graph).peak_bytes


def test_layered_recompute_uses_fast_forward_then_the_first_option():
    graph = load("transformer12")
    plan = run_planner("chen_sqrt", graph)
    ops = [(op.node, op.option) for op in plan.ops if op.op == "compute"]
    block1 = [o for n, o in ops if n == "block1.fwd"]
    assert block1 == ["fast_forward", "autograd"]
    assert ("block12.fwd", "autograd") in ops and ops.count(("block12.fwd", "autograd")) == 1


def test_knapsack_picks_the_data_recompute_option_when_it_helps():
    graph = load("profiled")  # block2's autograd forward has a 64 MiB sub-step
    budget = resolve_budget("80%", graph)
    plan, sim = check(graph, "knapsack", budget)
    assert sim.peak_bytes <= budget
    options = {op.option for op in plan.ops if op.op == "compute" and op.node == "block2.bwd"}
    assert options == {"recompute"}


def test_knapsack_dp_matches_brute_force():
    groups = [[(0, 5.0), (40, 0.0)], [(0, 3.0), (25, 0.0)], [(0, 4.0), (30, 1.0), (50, 0.0)],
              [(0, 1.0), (10, 0.0)]]
    for capacity in (0, 10, 35, 55, 70, 90, 125):
        picks = knapsack_choose(groups, capacity)
        weight = sum(groups[g][c][0] for g, c in enumerate(picks))
        cost = sum(groups[g][c][1] for g, c in enumerate(picks))
        assert weight <= capacity
        best = min(sum(g[c][1] for g, c in zip(groups, combo))
                   for combo in itertools.product(*(range(len(g)) for g in groups))
                   if sum(g[c][0] for g, c in zip(groups, combo)) <= capacity)
        assert cost == pytest.approx(best)


def test_knapsack_never_exceeds_its_capacity_with_rounding():
    # weights that a rounded (not rounded-up) quantization would squeeze past the capacity
    groups = [[(0, 1.0), (1001, 0.0)] for _ in range(8)]
    picks = knapsack_choose(groups, 4000, resolution=10)
    assert sum(groups[g][c][0] for g, c in enumerate(picks)) <= 4000


def test_articulation_candidates_on_a_diamond():
    # x -> a -> {b, c} -> d -> e -> loss: a and d are cut points, b and c are not (nor e,
    # a leaf of the forward graph)
    nodes = [Node("x", 1, 8), Node("a", 1, 8), Node("b", 1, 8), Node("c", 1, 8), Node("d", 1, 8),
             Node("e", 1, 8), Node("loss", 1, 1, kind="loss"), Node("ge", 1, 8, kind="backward"),
             Node("gd", 1, 8, kind="backward"),
             Node("gb", 1, 8, kind="backward"), Node("gc", 1, 8, kind="backward"),
             Node("ga", 1, 8, kind="backward")]
    edges = [("x", "a"), ("a", "b"), ("a", "c"), ("b", "d"), ("c", "d"), ("d", "e"), ("e", "loss"),
             ("loss", "ge"), ("e", "ge"), ("ge", "gd"), ("d", "gd"), ("gd", "gb"), ("gd", "gc"),
             ("b", "gb"), ("c", "gc"), ("gb", "ga"), ("gc", "ga"), ("a", "ga")]
    graph = Graph(name="diamond", nodes=nodes, edges=edges)
    view = CheckmateView(graph)
    assert [view.names[u] for u in view.articulation_units()] == ["a", "d"]
    for name in BASELINES:
        check(graph, name, None)
        check(graph, name, 24)


def test_checkpoint_groups_reject_an_empty_group():
    """A group without layers is a clear ValueError (it was an IndexError)."""
    graph = load("transformer12")
    with pytest.raises(ValueError, match="group 2 of 2 is empty"):
        plan_checkpoint_groups(graph, [[graph.layers[0].name], []])
