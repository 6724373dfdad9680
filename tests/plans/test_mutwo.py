"""μ-TWO Algorithm B planner (schedlang/plans/planners/mutwo.py)."""
from __future__ import annotations

import random

import pytest

import schedlang
from schedlang.graphs.checkmate_nx import load_checkmate_nx
from schedlang.graphs.elements import Node
from schedlang.graphs.graph import Graph
from schedlang.plans.plan import Plan
from schedlang.plans.planners import PlannerNotApplicable, planners, run_planner
from schedlang.plans.planners.mutwo import (
    KEEP,
    RECOMPUTE,
    SWAP,
    CandidateSet,
    checkmate_ops,
    checkmate_view,
    format_table,
    mutwo,
    mutwo_table,
    replay_peak,
    swap_overhead,
)
from schedlang.plans.planners.no_recompute import no_recompute_peak
from schedlang.plans.simulate import simulate

from ..paths import EXAMPLES, GRAPHS

TRAIN = sorted(GRAPHS.glob("*_train.json")) if GRAPHS.is_dir() else []
HUGE = 10**30


def chain_graph() -> Graph:
    return schedlang.load(EXAMPLES / "chain.sched").graph


def budget_of(graph: Graph, frac: float) -> int:
    return int(no_recompute_peak(graph) * frac)


def base_time(graph: Graph) -> float:
    return sum(n.time for n in graph.nodes)


def check_plan(graph: Graph, budget: int) -> tuple[Plan, object]:
    plan = run_planner("mutwo", graph, budget)
    # validity of the op list on its own, then against the budget
    free = simulate(plan, graph, budget=HUGE)
    assert free.valid, free.errors[:3]
    assert free.peak_bytes == plan.predicted_peak
    assert free.time == pytest.approx(plan.predicted_time)
    res = simulate(plan, graph, budget=budget)
    assert plan.meta["fits"] == res.fits_budget
    if res.fits_budget:
        assert res.valid and res.peak_bytes <= budget
    # every activation is in the table, once
    view = checkmate_view(graph)
    names = [a for a, _ in plan.meta["decisions"]]
    assert names == [view.names[a] for a in view.activations]
    assert {d for _, d in plan.meta["decisions"]} <= {KEEP, RECOMPUTE}
    assert plan.meta["planner"] == "mutwo"
    return plan, res


# --- registry ------------------------------------------------------------------------------
def test_registered():
    p = planners()["mutwo"]
    assert p.name == "mutwo" and set(p.views) == {"checkmate", "layered"}


# --- chain.sched: valid, fits, not better than the ILP optimum ----------------------------
@pytest.mark.parametrize("pct", ["90%", "80%"])
def test_chain_against_ilp(pct):
    prob = schedlang.load(EXAMPLES / "chain.sched", budget=pct)
    graph, budget = prob.graph, prob.budgets["peak"]
    plan, res = check_plan(graph, budget)
    assert res.fits_budget and res.peak_bytes <= budget
    ilp = prob.solve()
    assert ilp.status.has_solution and ilp.simulated.valid
    assert res.time >= ilp.objective - 1e-9
    assert res.time > base_time(graph)  # it had to recompute something
    assert any(d == RECOMPUTE for _, d in plan.meta["decisions"])
    # recomputations happen in the backward, right before the node that needs them
    computes = plan.computes()
    for a, d in plan.meta["decisions"]:
        if d == RECOMPUTE:
            assert computes.count(a) == 2
            second = len(computes) - 1 - computes[::-1].index(a)
            assert not graph.node(computes[second + 1]).kind == "forward" or \
                computes[second + 1] in dict(plan.meta["decisions"])


@pytest.mark.parametrize("pct", ["90%", "80%"])
def test_chain_prune(pct):
    prob = schedlang.load(EXAMPLES / "chain.sched", budget=pct)
    graph, budget = prob.graph, prob.budgets["peak"]
    plain = run_planner("mutwo", graph, budget)
    pruned = run_planner("mutwo", graph, budget, prune=True)
    res = simulate(pruned, graph, budget=budget)
    assert res.valid and res.peak_bytes <= budget
    assert prob.solve().objective - 1e-9 <= res.time <= simulate(plain, graph).time
    kept = {a for a, d in pruned.meta["decisions"] if d == KEEP}
    assert kept >= {a for a, d in plain.meta["decisions"] if d == KEEP}


def test_chain_table_and_csv():
    graph = chain_graph()
    rows = mutwo_table(graph, budget_of(graph, 0.8))
    assert [a for a, _ in rows] == ["f1", "f2", "f3", "f4", "f5", "f6", "loss"]
    text = format_table(rows)
    lines = text.splitlines()
    assert lines[0] == "activation,decision"
    assert len(lines) == 8 and all(line.count(",") == 1 for line in lines)
    assert format_table([("a,b", KEEP)]) == 'activation,decision\n"a,b",keep\n'


def test_no_budget_keeps_everything():
    graph = chain_graph()
    plan = run_planner("mutwo", graph, None)
    assert all(d == KEEP for _, d in plan.meta["decisions"])
    assert plan.predicted_peak == no_recompute_peak(graph)
    assert simulate(plan, graph).valid


# --- the shared Checkmate graphs ------------------------------------------------------------
@pytest.mark.skipif(not TRAIN, reason="no shared graphs")
@pytest.mark.parametrize("path", TRAIN, ids=lambda p: p.stem)
@pytest.mark.parametrize("frac", [0.9, 0.8])
def test_shared_graphs(path, frac):
    graph = load_checkmate_nx(path)
    budget = budget_of(graph, frac)
    plan, res = check_plan(graph, budget)
    if not res.fits_budget:
        # on these graphs only when no plan can fit: some node needs more than the budget
        # (its inputs and its output at once); the greedy returns the lowest peak it reached
        assert res.peak_bytes < no_recompute_peak(graph)
        assert node_lower_bound(graph) > budget


def node_lower_bound(graph: Graph) -> int:
    size = {n.name: n.size for n in graph.nodes}
    preds: dict[str, set[str]] = {n.name: set() for n in graph.nodes}
    for u, v in graph.edges:
        preds[v].add(u)
    return max(size[v] + sum(size[u] for u in preds[v]) for v in size)


@pytest.mark.skipif(not (GRAPHS / "vgg16_test.json").exists(), reason="no shared graphs")
def test_inference_graph_has_no_candidates():
    graph = load_checkmate_nx(GRAPHS / "vgg16_test.json")
    plan = run_planner("mutwo", graph, budget_of(graph, 0.9))
    assert plan.meta["decisions"] == [] and plan.meta["fits"] is False
    assert simulate(plan, graph, budget=HUGE).valid


# --- the incremental memory simulation agrees with the simulator ---------------------------
def _graphs_for_replay():
    out = [chain_graph()]
    for stem in ("vgg16_train", "resnet50_train"):
        if (GRAPHS / f"{stem}.json").exists():
            out.append(load_checkmate_nx(GRAPHS / f"{stem}.json"))
    return out


def test_replay_peak_matches_simulate_on_random_decisions():
    rng = random.Random(4)
    for graph in _graphs_for_replay():
        view = checkmate_view(graph)
        for _ in range(15):
            rec = {a for a in view.activations if rng.random() < rng.choice([0.2, 0.5, 0.9])}
            plan = Plan(graph=graph.name, ops=checkmate_ops(view, rec))
            res = simulate(plan, graph, budget=HUGE)
            assert res.valid, (graph.name, sorted(rec), res.errors[:3])
            assert replay_peak(view, plan.ops) == (res.peak_bytes, pytest.approx(res.time))
            # each evicted activation is computed again
            computes = plan.computes()
            for a in rec:
                assert computes.count(view.names[a]) >= 2


# --- candidate update: splicing ------------------------------------------------------------
def splice_graph() -> Graph:
    """f1 -> x -> f2 -> f3 -> loss; x is read by no backward node (so never a source);
    b3 reads f3, b2 reads f2, b1 reads f1."""
    nodes = [Node("f1", 1, 10), Node("x", 2, 10), Node("f2", 3, 10), Node("f3", 4, 10),
             Node("loss", 1, 1, kind="backward"),
             Node("b3", 1, 10, kind="backward"), Node("b2", 1, 10, kind="backward"),
             Node("b1", 1, 10, kind="backward")]
    edges = [("f1", "x"), ("x", "f2"), ("f2", "f3"), ("f3", "loss"), ("loss", "b3"),
             ("f3", "b3"), ("b3", "b2"), ("f2", "b2"), ("b2", "b1"), ("f1", "b1")]
    return Graph(name="splice", nodes=nodes, edges=edges)


def test_candidate_update_splices_sources():
    graph = splice_graph()
    view = checkmate_view(graph)
    idx = {n: i for i, n in enumerate(view.names)}
    f1, x, f2, f3 = idx["f1"], idx["x"], idx["f2"], idx["f3"]
    assert view.activations == [f1, f2, f3]
    cs = CandidateSet(view)
    # x is not an activation: freed after the forward, so f2's path runs through it
    assert cs.candidates[f2].srcs == {f1} and cs.candidates[f2].path == {x, f2}
    assert cs.candidates[f2].rp_time == 5
    assert cs.candidates[f3].srcs == {f2} and cs.candidates[f3].rp_time == 4
    assert cs.candidates[f1].srcs == set() and cs.candidates[f1].rp_time == 1
    # evict f3 first: nothing depends on it yet; f2 now serves f3's recomputation
    cs.choose_recompute(f3)
    assert cs.candidates[f2].n_dep == 1 and cs.candidates[f2].total_time == 10
    assert cs.candidates[f1].n_dep == 0
    # evict f2: the chosen f3 gets f2's sources and path (splice into an earlier choice)
    cs.choose_recompute(f2)
    assert cs.recomps[f3].srcs == {f1} and cs.recomps[f3].path == {x, f2, f3}
    assert cs.recomps[f3].rp_time == 9
    # f1 is now a source of both recomputations: evicting it costs three recomputations
    assert cs.candidates[f1].n_dep == 2 and cs.candidates[f1].total_time == 3
    assert cs.candidates[f1].ratio == pytest.approx(10 / 3)
    cs.choose_recompute(f1)
    assert cs.recomps[f3].srcs == set() and cs.recomps[f3].path == {f1, x, f2, f3}
    assert not cs.candidates

    # the plan follows the splice: before the loss (the first backward node reading f3), f3
    # is rebuilt from f1 via x and f2; f3 stays for b3, the intermediates are rebuilt for b2
    plan = Plan(graph="splice", ops=checkmate_ops(view, {f1, f2, f3}))
    res = simulate(plan, graph, budget=HUGE)
    assert res.valid, res.errors
    assert plan.computes() == ["f1", "x", "f2", "f3", "f1", "x", "f2", "f3", "loss", "b3",
                               "f1", "x", "f2", "b2", "f1", "b1"]


def test_candidate_update_new_candidates_get_spliced():
    graph = splice_graph()
    view = checkmate_view(graph)
    idx = {n: i for i, n in enumerate(view.names)}
    cs = CandidateSet(view)
    cs.choose_recompute(idx["f2"])
    f3 = cs.candidates[idx["f3"]]
    assert f3.srcs == {idx["f1"]} and f3.path == {idx["x"], idx["f2"], idx["f3"]}
    assert f3.rp_time == 9


def test_greedy_order_follows_ratio():
    graph = chain_graph()
    out = mutwo(graph, budget_of(graph, 0.8))
    assert out.fits
    ratios = [s["ratio"] for s in out.steps]
    assert ratios and all(s["decision"] == RECOMPUTE for s in out.steps)
    # the loop stops at the first simulated peak within the budget
    assert all(s["peak"] > budget_of(graph, 0.8) for s in out.steps[:-1])
    assert out.steps[-1]["peak"] <= budget_of(graph, 0.8)


# --- swap branch -----------------------------------------------------------------------------
def test_swap_branch_picks_long_inactive_activation():
    graph = chain_graph()
    view = checkmate_view(graph)
    f1 = view.names.index("f1")
    # f1 waits from f2 to b1: the longest inactive time of the chain
    assert max(view.activations, key=view.inactive_time) == f1
    budget = budget_of(graph, 0.9)
    bandwidth = view.size[f1] / 5.0  # 5 time units per transfer, 2 x 5 < inactive time
    assert swap_overhead(view, f1, bandwidth) == 0.0
    out = mutwo(graph, budget, bandwidth=bandwidth)
    table = dict(out.decisions)
    assert table["f1"] == SWAP
    assert out.steps[0]["decision"] == SWAP and out.steps[0]["activation"] == "f1"
    kinds = [op.op for op in out.ops]
    assert "offload" in kinds and "prefetch" in kinds
    assert kinds.index("offload") < kinds.index("prefetch")
    # our memory model counts the prefetched copy; the simulator does not replay swaps yet
    assert out.peak == replay_peak(view, out.ops)[0]
    plan = run_planner("mutwo", graph, budget, bandwidth=bandwidth)
    assert "swap" in format_table(plan.meta["decisions"]) and "note" in plan.meta


def test_swap_branch_slow_link_recomputes():
    graph = chain_graph()
    view = checkmate_view(graph)
    out = mutwo(graph, budget_of(graph, 0.9), bandwidth=view.size[0] / 1000.0)
    assert SWAP not in dict(out.decisions).values()
    out = mutwo(graph, budget_of(graph, 0.9))  # no bandwidth: never a swap
    assert SWAP not in dict(out.decisions).values()
    assert not any(op.op in ("offload", "prefetch") for op in out.ops)


# --- layered graphs ---------------------------------------------------------------------------
@pytest.mark.parametrize("example", ["tiny_transformer", "transformer12", "unet"])
@pytest.mark.parametrize("frac", [0.9, 0.8])
def test_layered(example, frac):
    graph = schedlang.load(EXAMPLES / f"{example}.sched").graph
    budget = budget_of(graph, frac)
    plan = run_planner("mutwo", graph, budget)
    res = simulate(plan, graph, budget=budget, save_budget=HUGE)
    free = simulate(plan, graph, budget=HUGE, save_budget=HUGE)
    assert free.valid, free.errors[:3]
    assert free.peak_bytes == plan.predicted_peak
    if plan.meta["fits"]:
        assert res.valid and res.peak_bytes <= budget
    assert [a for a, _ in plan.meta["decisions"]] == [layer.name for layer in graph.layers]
    rec = [a for a, d in plan.meta["decisions"] if d == RECOMPUTE]
    assert rec
    for op in plan.ops:  # a recomputed layer runs fast_forward first, then again
        if op.op == "compute" and op.node.endswith(".fwd") and op.node[:-4] in rec:
            assert op.option == "fast_forward"
            break


def test_errors():
    with pytest.raises(schedlang.SchedError):
        run_planner("mutwo", chain_graph(), 1, bandwidth=0)
    assert issubclass(PlannerNotApplicable, schedlang.SchedError)
