"""The independent simulator, the no-recomputation reference and the brute-force oracle."""
from __future__ import annotations

import itertools
import math

import pytest

from schedlang.graphs.checkmate_nx import load_checkmate_nx
from schedlang.graphs.elements import Layer, Node
from schedlang.graphs.graph import Graph
from schedlang.language.errors import DataError
from schedlang.plans.plan import Op, Plan
from schedlang.plans.planners.no_recompute import no_recompute_peak, no_recompute_plan
from schedlang.plans.simulate import simulate

from ..paths import GRAPHS, needs_graphs

try:
    from schedlang.testing.bruteforce import best_checkmate_schedule
except ImportError:  # tests/ is on sys.path instead of the repository root
    from bruteforce import best_checkmate_schedule



# --- tiny graphs, built by hand ----------------------------------------------------------
def make_graph(spec: list[tuple[str, float, int]], edges: list[tuple[str, str]],
               name: str = "g", **kw) -> Graph:
    return Graph(name=name, nodes=[Node(n, t, s) for n, t, s in spec], edges=edges, **kw)


def chain() -> Graph:
    # a(10) -> b(20) -> c(5) -> d(7)
    return make_graph([("a", 1, 10), ("b", 2, 20), ("c", 3, 5), ("d", 4, 7)],
                      [("a", "b"), ("b", "c"), ("c", "d")], name="chain")


def diamond() -> Graph:
    # a -> b, a -> c, b -> d, c -> d
    return make_graph([("a", 1, 4), ("b", 2, 8), ("c", 3, 2), ("d", 1, 1)],
                      [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")], name="diamond")


def skip() -> Graph:
    # forward f0 -> f1 -> f2, backward b2 -> b1 -> b0 with skip edges f_i -> b_i
    spec = [("f0", 2, 10), ("f1", 3, 12), ("f2", 1, 8),
            ("b2", 2, 8), ("b1", 4, 12), ("b0", 3, 10)]
    edges = [("f0", "f1"), ("f1", "f2"), ("f2", "b2"), ("b2", "b1"), ("b1", "b0"),
             ("f1", "b1"), ("f0", "b0")]
    return make_graph(spec, edges, name="skip")


def plan_of(*steps: str, graph: str = "g", **kw) -> Plan:
    """plan_of("c a", "d a") = compute a, delete a."""
    ops = []
    for step in steps:
        kind, name = step.split()
        ops.append(Op("compute", node=name) if kind == "c" else Op("delete", data=name))
    return Plan(graph=graph, ops=ops, **kw)


# --- valid plans ---------------------------------------------------------------------------
def test_valid_plan_peak_and_time_by_hand():
    g = diamond()
    plan = plan_of("c a", "c b", "c c", "d a", "c d", "d b", "d c", "d d", graph="diamond")
    r = simulate(plan, g)
    assert r.valid, r.errors
    assert r.errors == [] and r.warnings == []
    # a:4; b: 4+8=12; c: 12+2=14; drop a -> 10; d: 10+1=11
    assert r.peak_bytes == 14
    assert r.time == 7.0
    assert r.fits_budget is None and r.computes == 4


def test_inputs_and_output_are_both_counted_while_a_node_runs():
    g = make_graph([("a", 1, 10), ("b", 1, 1)], [("a", "b")])
    r = simulate(plan_of("c a", "c b", "d a", "d b"), g)
    assert r.valid and r.peak_bytes == 11


def test_recompute_counts_the_new_copy_then_releases_the_old():
    g = make_graph([("a", 1, 10), ("b", 2, 3)], [("a", "b")])
    r = simulate(plan_of("c a", "c a", "c b"), g)
    assert r.valid, r.errors
    # the second compute of a briefly holds two copies (20); then one copy of a + b = 13
    assert r.peak_bytes == 20
    assert r.time == 4.0
    # after the release, a single delete frees a; a second one is an error
    r = simulate(plan_of("c a", "c a", "c b", "d a", "d a"), g)
    assert not r.valid
    assert r.errors == ["op 4: delete 'a', which is not in memory (deleted by op 3)"]


def test_recompute_after_delete_is_accounted():
    g = chain()
    plan = plan_of("c a", "c b", "d a", "c c", "d b", "c d", "d c", "d d",
                   "c a", "c b", "d a", graph="chain")
    r = simulate(plan, g)
    assert r.valid, r.errors
    assert r.time == 1 + 2 + 3 + 4 + 1 + 2
    # b (20) + a (10) at the second compute of b, with d and c gone: 30
    assert r.peak_bytes == 30


# --- invalid plans -------------------------------------------------------------------------
def test_use_after_delete():
    g = chain()
    r = simulate(plan_of("c a", "d a", "c b", "c c", "c d", graph="chain"), g)
    assert not r.valid
    assert r.errors[0] == "op 2: compute 'b' needs 'a', which is not in memory (deleted by op 1)"
    assert len(r.errors) == 1


def test_missing_input():
    g = chain()
    r = simulate(plan_of("c b", "c a", "c c", "c d", graph="chain"), g)
    assert not r.valid
    assert r.errors == [
        "op 0: compute 'b' needs 'a', which is not in memory (never computed before)"]


def test_unknown_node_and_data():
    g = chain()
    plan = plan_of("c a", "c bb", "d zz", "c b", "c c", "c d", graph="chain")
    r = simulate(plan, g)
    assert not r.valid
    assert r.errors[0].startswith("op 1: compute of unknown node 'bb'")
    assert "did you mean 'b'" in r.errors[0]
    assert r.errors[1].startswith("op 2: delete of unknown data 'zz'")


def test_node_never_computed():
    g = chain()
    r = simulate(plan_of("c a", "c b", graph="chain"), g)
    assert not r.valid
    assert r.errors == ["2 nodes are never computed: 'c', 'd'"]
    assert r.peak_bytes == 30  # still reported


def test_delete_of_data_not_in_memory():
    g = chain()
    r = simulate(plan_of("d a", "c a", "c b", "c c", "c d", graph="chain"), g)
    assert r.errors == ["op 0: delete 'a', which is not in memory (never computed before)"]


def test_over_budget_from_the_plan_and_from_the_graph():
    g = chain()
    ok = no_recompute_plan(g)
    peak = simulate(ok, g).peak_bytes
    assert peak == 30

    ok.budget_peak = 30
    r = simulate(ok, g)
    assert r.valid and r.fits_budget is True and r.budget_bytes == 30

    ok.budget_peak = 29
    r = simulate(ok, g)
    assert not r.valid and r.fits_budget is False
    assert r.errors == ["peak memory 30 B exceeds the peak budget 29 B by 1 B"]

    ok.budget_peak = None
    g.budgets["peak"] = 25
    r = simulate(ok, g)
    assert not r.valid and r.fits_budget is False and r.budget_bytes == 25
    # the plan's budget wins over the graph's; an explicit budget wins over both
    ok.budget_peak = 40
    assert simulate(ok, g).valid
    assert not simulate(ok, g, budget=29).valid


def test_unsupported_and_unknown_ops_do_not_crash():
    g = chain()
    plan = no_recompute_plan(g)
    plan.ops.insert(1, Op("offload", data="a", fraction=1.0))
    plan.ops.insert(2, Op("prefetch", data="a"))
    plan.ops.insert(3, Op("wait", channel="prefetch", data="a"))
    plan.ops.insert(4, Op("drop_phantom", layer="a"))
    plan.ops.insert(5, Op("teleport", data="a"))
    r = simulate(plan, g)
    assert not r.valid
    assert len(r.errors) == 5
    assert all("not supported for this graph" in e for e in r.errors[:4])
    assert r.errors[0].startswith("op 1: offload")
    assert r.errors[4] == "op 5: unknown op kind 'teleport'"


def test_option_on_a_single_way_node_is_an_error():
    g = chain()
    plan = no_recompute_plan(g)
    plan.ops[0].option = "recompute"
    r = simulate(plan, g)
    assert not r.valid and "has a single way to run" in r.errors[0]


def test_an_unusable_layered_graph_is_an_invalid_result_not_a_crash():
    g = Graph(name="t", layers=[Layer("l1", ["x"], ["h"], [], [], [])])
    r = simulate(Plan(graph="t", ops=[Op("compute", node="l1")]), g)
    assert not r.valid and "cannot simulate this layered graph" in r.errors[0]


def test_graph_name_mismatch_and_wrong_prediction_are_warnings():
    g = chain()
    plan = no_recompute_plan(g)
    plan.graph = "other"
    plan.predicted_peak = 31
    r = simulate(plan, g)
    assert r.valid
    assert any("made for graph 'other'" in w for w in r.warnings)
    assert any("predicted peak 31 B, simulated 30 B" in w for w in r.warnings)


def test_error_list_is_capped():
    g = chain()
    plan = Plan(graph="chain", ops=[Op("delete", data="a")] * 80 + no_recompute_plan(g).ops)
    r = simulate(plan, g)
    assert len(r.errors) == 51 and r.errors[-1] == "... and 30 more errors"


# --- the no-recomputation reference --------------------------------------------------------
def test_no_recompute_plan_of_a_chain_by_hand():
    g = chain()
    plan = no_recompute_plan(g)
    assert [str(op) for op in plan.ops] == [
        "compute node='a'", "compute node='b'", "delete data='a'", "compute node='c'",
        "delete data='b'", "compute node='d'", "delete data='c'", "delete data='d'"]
    # a: 10; b: 10+20 = 30; c: 20+5 = 25; d: 5+7 = 12
    assert no_recompute_peak(g) == 30
    assert plan.predicted_peak == 30 and plan.predicted_time == 10.0
    r = simulate(plan, g)
    assert r.valid and r.peak_bytes == 30 and r.time == 10.0


def test_no_recompute_peak_by_hand_on_diamond_and_skip():
    # diamond: a 4; b 12; c 14 (a freed after c); d 2+8+1 = 11
    assert no_recompute_peak(diamond()) == 14
    # skip: f0 10; f1 22; f2 30; b2 38 (f2 freed); b1 12+10+8+12 = 42; b0 10+12+10 = 32
    assert no_recompute_peak(skip()) == 42


def test_no_recompute_plan_rejects_a_non_topological_order():
    g = make_graph([("b", 1, 1), ("a", 1, 1)], [("a", "b")])
    with pytest.raises(DataError, match="not in topological order"):
        no_recompute_plan(g)


@pytest.mark.parametrize("path", sorted(GRAPHS.glob("*.json")), ids=lambda p: p.stem)
def test_no_recompute_plan_is_valid_on_the_shared_graphs(path):
    g = load_checkmate_nx(path)
    plan = no_recompute_plan(g)
    r = simulate(plan, g)
    assert r.valid, r.errors
    assert r.peak_bytes == no_recompute_peak(g) == plan.predicted_peak
    assert r.time == pytest.approx(sum(n.time for n in g.nodes))


@needs_graphs
def test_vgg16_reference_peak_agrees_with_the_documented_budget():
    g = load_checkmate_nx(GRAPHS / "vgg16_train.json")
    peak = no_recompute_peak(g)
    assert peak == 15825108992
    # architecture.md's example plan uses budget 14242598093 = 90% of this peak, rounded up
    assert math.ceil(0.9 * peak) == 14242598093


def test_simulator_on_long_plans():
    n = 300
    g = make_graph([(f"v{i}", 1.0, 1 + i % 7) for i in range(n)],
                   [(f"v{i}", f"v{i + 1}") for i in range(n - 1)])
    base = no_recompute_plan(g).ops
    ops: list[Op] = []
    while len(ops) < 100_000:
        ops.extend(base)
    plan = Plan(graph="g", ops=ops)
    r = simulate(plan, g)  # its speed is measured in bench/bench_throughput.py
    assert r.valid and r.computes == len(ops) // 2


# --- the brute-force oracle ----------------------------------------------------------------
def fwd_bwd6() -> Graph:
    # a 3-layer network with its gradients, the shape Checkmate schedules
    spec = [("x1", 1, 6), ("x2", 2, 9), ("loss", 1, 1),
            ("g2", 2, 9), ("g1", 3, 6), ("g0", 1, 4)]
    edges = [("x1", "x2"), ("x2", "loss"), ("loss", "g2"), ("x2", "g2"), ("x1", "g2"),
             ("g2", "g1"), ("x1", "g1"), ("g1", "g0")]
    return make_graph(spec, edges, name="fwd_bwd6")


def chain5() -> Graph:
    return make_graph([(f"c{i}", 1 + i % 3, 3 + 2 * (i % 2)) for i in range(5)],
                      [(f"c{i}", f"c{i + 1}") for i in range(4)], name="chain5")


BRUTE_GRAPHS = [chain5, diamond, skip, fwd_bwd6]


@pytest.mark.parametrize("make", BRUTE_GRAPHS, ids=lambda f: f.__name__)
def test_bruteforce_optimum_is_monotone_and_reaches_the_plain_time(make):
    g = make()
    plain_peak = no_recompute_peak(g)
    plain_time = sum(n.time for n in g.nodes)
    previous = math.inf
    feasible_seen = False
    for budget in range(0, plain_peak + 6):
        best, plan = best_checkmate_schedule(g, budget)
        if best is None:
            assert plan is None
            assert not feasible_seen, f"infeasible at {budget} after a feasible budget"
            continue
        feasible_seen = True
        assert best <= previous, f"optimum grew from {previous} to {best} at budget {budget}"
        previous = best
        # the plan replays to exactly what brute force reports
        r = simulate(plan, g)
        assert r.valid, r.errors
        assert r.time == best
        assert r.peak_bytes == plan.predicted_peak <= budget
        assert r.fits_budget is True
        if budget >= plain_peak:
            assert best == plain_time
        elif budget == plain_peak - 1:
            assert best > plain_time  # the stage model has one order without recomputation
    assert feasible_seen


def test_bruteforce_saves_memory_by_recomputing():
    g = skip()
    plain = no_recompute_peak(g)
    best, plan = best_checkmate_schedule(g, plain - 4)
    assert best is not None and best > sum(n.time for n in g.nodes)
    computes = plan.computes()
    assert len(computes) > len(g.nodes)  # something is computed twice
    assert set(computes) == {n.name for n in g.nodes}


def _naive_optimum(g: Graph, budget: int) -> float | None:
    """All stage schedules, memory freed by a forward scan, judged by the simulator."""
    names = [n.name for n in g.nodes]
    preds = {v: {u for u, w in g.edges if w == v} for v in names}
    best = None
    n = len(names)
    for picks in itertools.product(*[itertools.product((0, 1), repeat=t) for t in range(n)]):
        seq = []
        for t, pick in enumerate(picks):
            seq += [names[v] for v in range(t) if pick[v]] + [names[t]]
        ops, live = [], []
        for p, v in enumerate(seq):
            ops.append(Op("compute", node=v))
            if v not in live:
                live.append(v)
            for x in list(live):
                needed = False
                for w in seq[p + 1:]:
                    if x in preds[w]:
                        needed = True
                        break
                    if w == x:
                        break
                if not needed:
                    ops.append(Op("delete", data=x))
                    live.remove(x)
        r = simulate(Plan(graph=g.name, ops=ops, budget_peak=budget), g)
        if r.valid and (best is None or r.time < best):
            best = r.time
    return best


@pytest.mark.parametrize("make", [diamond, chain5], ids=lambda f: f.__name__)
def test_bruteforce_agrees_with_a_naive_enumeration(make):
    g = make()
    for budget in range(no_recompute_peak(g) + 2):
        assert best_checkmate_schedule(g, budget)[0] == _naive_optimum(g, budget), budget


def test_bruteforce_refuses_big_graphs():
    g = make_graph([(f"v{i}", 1, 1) for i in range(7)], [])
    with pytest.raises(ValueError):
        best_checkmate_schedule(g, 10)
