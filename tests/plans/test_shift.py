"""The shift scheduler (poprithms schedule::shift): known optima, validity, incremental costs.

The test graphs are built as poprithms' test utilities build them (``getRecomputeGraph`` with
``getSqrtSeries``/``getLogNSeries``, ``getBifurcatingGraph0``, the grid of ``grid.cpp``, and the
"adversary" of ``change_writer_0.cpp``), written here from their descriptions. Each op owns one
allocation required by itself and its consumers (poprithms' ``addConnectedAllocs``), except in
the adversary, whose allocations each span three consecutive ops of a planted random
topological order. Like poprithms' demos, runs start from random topological orders (and from
the greedy Kahn order), so the rotations have work to do.
"""
from __future__ import annotations

import math
import random

import pytest

import schedlang
from schedlang.graphs.checkmate_nx import load_checkmate_nx
from schedlang.graphs.elements import Node
from schedlang.graphs.graph import Graph
from schedlang.language.errors import DataError
from schedlang.plans.planners import planners, run_planner
from schedlang.plans.planners.no_recompute import no_recompute_peak
from schedlang.plans.planners.shift import (
    Dag,
    ShiftScheduler,
    dag_from_graph,
    max_liveness_of,
    reorder,
    shift_plan,
    shift_schedule,
    sum_liveness_of,
)
from schedlang.plans.simulate import simulate

from ..paths import GRAPHS, ROOT

VGG16 = GRAPHS / "vgg16_train.json"
SEEDS = range(4)


# --- generators ------------------------------------------------------------------------------
def connected_allocs(ops, edges, sizes):
    """One allocation per op, required by the op and its consumers."""
    consumers = {o: [] for o in ops}
    for u, v in edges:
        consumers[u].append(v)
    return [(size, [o] + consumers[o]) for o, size in zip(ops, sizes)]


def sqrt_series(n):
    """How many times each of n forward layers is computed: once at about every √n-th layer
    (the checkpoints) and at both ends, twice elsewhere."""
    root = math.isqrt(n)
    pattern = [2] * n
    pattern[0] = pattern[-1] = 1
    c = 0
    while root // 2 + c * root < n:
        pattern[root // 2 + c * root] = 1
        c += 1
    return pattern


def log_series(n):
    """Recursive bisection: the ends and the midpoint are computed once, the midpoints of the
    halves twice, and so on (about log2 n depths)."""
    series, known = [0] * n, [False] * n

    def put(i, v):
        if not known[i]:
            series[i], known[i] = v, True

    put(0, 1), put(n - 1, 1), put((n - 1) // 2, 1)
    depth = 2
    while not all(known):
        starts = [i for i in range(n - 1) if known[i] and not known[i + 1]]
        ends = [i for i in range(n - 1) if not known[i] and known[i + 1]]
        for a, b in zip(starts, ends):
            put(b, depth)
            put(a + 1 + (b - a) // 2, depth)
        depth += 1
    return series


def recompute_dag(times):
    """Layer L is computed times[L] times (ops "L_r"); the r-th copy reads the copy
    min(r, last) of layer L-1; then backwards "bwd_L" read the last copy of layer L and the
    backward of layer L+1. Unit allocations."""
    ops, edges, layers = [], [], []
    for L, t in enumerate(times):
        layer = []
        for r in range(t):
            name = f"{L}_{r}"
            ops.append(name)
            if L:
                prev = layers[L - 1]
                edges.append((prev[min(len(prev) - 1, r)], name))
            layer.append(name)
        layers.append(layer)
    for L in range(len(times) - 1, -1, -1):
        name = f"bwd_{L}"
        ops.append(name)
        edges.append((layers[L][-1], name))
        if L != len(times) - 1:
            edges.append((layers[L + 1][-1], name))
        layers[L].append(name)
    return Dag.build(ops, edges, connected_allocs(ops, edges, [1] * len(ops)))


def recompute_optimal(order):
    """poprithms' assertGlobalMinimumRecomputeGraph0: each backward right after the backward
    of the layer above or a forward of its own layer; per layer, forward copies in increasing
    order and the backward last."""
    def split(x):
        return (int(x[4:]), -1) if x.startswith("bwd_") else tuple(map(int, x.split("_")))

    parts = [split(x) for x in order]
    seen: dict[int, list[int]] = {}
    for i, (layer, r) in enumerate(parts):
        if r == -1:
            pl, pr = parts[i - 1]
            if not ((pr == -1 and pl - 1 == layer) or (pr != -1 and pl == layer)):
                return False
        seen.setdefault(layer, []).append(r)
    for rs in seen.values():
        if rs[-1] != -1 or any(a >= b for a, b in zip(rs[:-2], rs[1:-1])):
            return False
    return True


def bifurcating_dag(depth):
    """A binary tree of depth D opening from "o", closed by a mirrored tree of 2-input ops
    ("y..."), then "return". Unit allocations: the minimal max-liveness is D + 2."""
    ops, edges, level = ["o"], [], ["o"]
    while len(level) < 2 ** depth:
        nxt = []
        for x in level:
            for k in "01":
                ops.append(x + k)
                edges.append((x, x + k))
                nxt.append(x + k)
        level = nxt
    while len(level) > 1:
        nxt = []
        for a, b in zip(level[::2], level[1::2]):
            name = "y" + a[1:-1]
            ops.append(name)
            edges += [(a, name), (b, name)]
            nxt.append(name)
        level = nxt
    ops.append("return")
    edges.append((level[0], "return"))
    return Dag.build(ops, edges, connected_allocs(ops, edges, [1] * len(ops)))


def grid_dag(n):
    """grid.cpp: N rows; column 0 is a chain upwards, each row a chain rightwards, the last
    column a chain downwards into row 0. Allocations of 2N, except column N/2 (size 1): the
    minimal max-liveness is 3·2N + N − 2."""
    ops, edges, size = [], [], {}

    def name(r, c):
        return f"{r}_{c}"

    for r in range(n):
        ops.append(name(r, 0))
        size[name(r, 0)] = 2 * n
        if r:
            edges.append((name(r - 1, 0), name(r, 0)))
    for r in range(n):
        for c in range(1, n - 1):
            ops.append(name(r, c))
            size[name(r, c)] = 1 if c == n // 2 else 2 * n
            edges.append((name(r, c - 1), name(r, c)))
    for r in range(n - 1, -1, -1):
        ops.append(name(r, n - 1))
        size[name(r, n - 1)] = 2 * n
        edges.append((name(r, n - 2), name(r, n - 1)))
        if r != n - 1:
            edges.append((name(r + 1, n - 1), name(r, n - 1)))
    return Dag.build(ops, edges, connected_allocs(ops, edges, [size[o] for o in ops]))


def random_dag(n, seed, max_preds=2):
    rng = random.Random(seed)
    edges = set()
    for i in range(1, n):
        for p in rng.sample(range(i), min(i, rng.randint(1, max_preds))):
            edges.add((p, i))
    return sorted(edges)


def random_topo(n, edges, rng):
    preds = {i: set() for i in range(n)}
    for u, v in edges:
        preds[v].add(u)
    done, order = set(), []
    while len(order) < n:
        x = rng.choice([i for i in range(n) if i not in done and preds[i] <= done])
        order.append(x)
        done.add(x)
    return order


def adversary_dag(n=30, seed=1011):
    """change_writer_0.cpp's adversary: a random connected DAG, a planted random topological
    order, and an allocation (size 2..5) over each 3 consecutive ops of that order. Every
    allocation lives >= 3 steps in any schedule, and exactly 3 in the planted one, so the
    optimal sum-liveness is 3 · Σ sizes."""
    rng = random.Random(seed)
    ops = [f"op{i}" for i in range(n)]
    edges = random_dag(n, seed)
    planted = random_topo(n, edges, rng)
    allocs = [(2 + rng.randrange(4), [ops[planted[i - 2]], ops[planted[i - 1]], ops[planted[i]]])
              for i in range(2, n)]
    dag = Dag.build(ops, [(ops[u], ops[v]) for u, v in edges], allocs)
    return dag, [ops[i] for i in planted], 3 * sum(s for s, _ in allocs)


def order_ix(dag, names):
    index = {x: i for i, x in enumerate(dag.ops)}
    return [index[x] for x in names]


def assert_topological(dag, names):
    assert sorted(names) == sorted(dag.ops)
    pos = {x: p for p, x in enumerate(names)}
    for u, v in dag.edges:
        assert pos[dag.ops[u]] < pos[dag.ops[v]], (dag.ops[u], dag.ops[v])


def run(dag, **kw):
    stats: dict = {}
    names = shift_schedule(dag, stats=stats, **kw)
    assert_topological(dag, names)
    assert stats["stopped"] == "local minimum"
    # the tracked sums are the from-scratch ones
    assert stats["final_sum"] == sum_liveness_of(dag, order_ix(dag, names))
    assert stats["final_max"] == max_liveness_of(dag, order_ix(dag, names))
    return names, stats


# --- the seed's worked example ---------------------------------------------------------------
def seed_example():
    ops = list("abcdef")
    allocs = [(1, "abcde"), (1, "bcd"), (1, "cd"), (1, "d"), (1, "ef")]
    return Dag.build(ops, [], allocs)


def test_seed_example_sums():
    dag = seed_example()
    assert sum_liveness_of(dag, [0, 1, 2, 3, 4, 5]) == 13
    # The seed's text says 15 for (ii), listing C as live 3 steps; but in "a e f b c d" C is
    # required by c and d only (steps 4 and 5): 2 steps, so the sum is 6+3+2+1+2 = 14. The
    # rotation increases sum-liveness either way and is rejected.
    assert sum_liveness_of(dag, [0, 4, 5, 1, 2, 3]) == 14
    s = ShiftScheduler(dag, initial=list("abcdef"))
    assert s.sum_live == 13
    assert s.rotation_delta(1, 4, 6) == 1
    assert s._best_move(4, 2) is None  # "e f" has no reducing move


# --- known optima ----------------------------------------------------------------------------
@pytest.mark.parametrize("n, series", [(20, "sqrt"), (50, "sqrt"), (17, "log"), (50, "log")])
def test_recompute_chains(n, series):
    times = sqrt_series(n) if series == "sqrt" else log_series(n)
    dag = recompute_dag(times)
    sums = set()
    for init in ["greedy", "random"]:
        for seed in SEEDS if init == "random" else [1]:
            names, stats = run(dag, initial=init, seed=seed)
            assert recompute_optimal(names), (init, seed, names)
            sums.add(stats["final_sum"])
    assert len(sums) == 1  # the global minimum, whatever the start


def test_series_shapes():
    assert sqrt_series(20) == [1, 2, 1, 2, 2, 2, 1, 2, 2, 2, 1, 2, 2, 2, 1, 2, 2, 2, 1, 1]
    s = log_series(17)
    assert s[0] == s[-1] == s[8] == 1 and max(s) <= 1 + math.ceil(math.log2(17))


@pytest.mark.parametrize("depth", [3, 4, 5])
def test_bifurcating(depth):
    dag = bifurcating_dag(depth)
    for seed in SEEDS:
        _, stats = run(dag, initial="random", seed=seed)
        assert stats["final_max"] == depth + 2


@pytest.mark.parametrize("n", [5, 6, 8])
def test_grid(n):
    dag = grid_dag(n)
    for init in ["greedy", "fifo", "random"]:
        _, stats = run(dag, initial=init, seed=3)
        assert stats["final_max"] == 3 * 2 * n + n - 2


@pytest.mark.parametrize("seed", [1011, 1, 2, 3, 4])
def test_adversary_planted_optimum(seed):
    dag, planted, optimum = adversary_dag(seed=seed)
    assert_topological(dag, planted)
    assert sum_liveness_of(dag, order_ix(dag, planted)) == optimum
    for s in SEEDS:
        names, stats = run(dag, initial="random", seed=s)
        assert stats["final_sum"] == optimum, (seed, s)
        assert stats["initial_sum"] >= optimum


# --- validity --------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(12))
def test_random_graphs_topological(seed):
    rng = random.Random(seed)
    n = rng.randint(2, 40)
    edges = random_dag(n, seed, max_preds=3)
    ops = [f"n{i}" for i in range(n)]
    allocs = [(rng.randint(1, 50), rng.sample(ops, rng.randint(1, 4))) for _ in range(n)]
    dag = Dag.build(ops, [(ops[u], ops[v]) for u, v in edges], allocs)
    names, stats = run(dag, initial="random", seed=seed)
    assert stats["final_sum"] <= stats["initial_sum"]


def test_dag_inputs():
    spec = {"ops": ["a", "b", "c"], "edges": [("a", "c")], "allocs": [(5, ["a", "c"]), (1, ["b"])]}
    assert shift_schedule(spec) == ["a", "c", "b"] or shift_schedule(spec) == ["b", "a", "c"]
    assert shift_schedule(Dag.build(["x"])) == ["x"]
    assert shift_schedule(Dag.build([])) == []
    with pytest.raises(DataError, match="cycle"):
        shift_schedule({"ops": ["a", "b"], "edges": [("a", "b"), ("b", "a")]})
    with pytest.raises(DataError, match="not topological"):
        shift_schedule(spec, initial=["c", "a", "b"])
    with pytest.raises(DataError, match="unknown op"):
        shift_schedule({"ops": ["a"], "edges": [("a", "z")]})


def test_limits_stop_early():
    dag = recompute_dag(log_series(30))
    stats: dict = {}
    names = shift_schedule(dag, initial="random", seed=0, max_rotations=3, stats=stats)
    assert stats["stopped"] == "rotation limit" and stats["rotations"] == 3
    assert_topological(dag, names)


# --- incremental costs -----------------------------------------------------------------------
def random_scheduler(rng: random.Random, seed: int, n: int, allocs: int, most_readers: int):
    """A random DAG of `n` ops with `allocs` allocations of 1-9 B, each used by 1 to
    `most_readers` random ops, and a shift scheduler on it from a random topological order."""
    ops = [f"n{i}" for i in range(n)]
    used = [(rng.randint(1, 9), rng.sample(ops, rng.randint(1, most_readers))) for _ in range(allocs)]
    dag = Dag.build(ops, [(ops[u], ops[v]) for u, v in random_dag(n, seed)], used)
    return dag, ShiftScheduler(dag, initial="random", seed=seed)


@pytest.mark.parametrize("seed", range(6))
def test_incremental_delta_matches_scratch(seed):
    rng = random.Random(seed)
    n = 30
    dag, s = random_scheduler(rng, seed, n, allocs=40, most_readers=5)
    for _ in range(300):
        a = rng.randrange(n - 1)
        b = rng.randrange(a + 1, n)
        c = rng.randrange(b + 1, n + 1)
        order = s.order
        rotated = order[:a] + order[b:c] + order[a:b] + order[c:]
        delta = s.rotation_delta(a, b, c)
        assert delta == sum_liveness_of(dag, rotated) - sum_liveness_of(dag, order)
        pos = {op: p for p, op in enumerate(order)}
        valid = all(not (a <= pos[u] < b and b <= pos[v] < c) for u, v in dag.edges)
        assert s.rotation_valid(a, b, c) == valid
        if valid and rng.random() < 0.5:  # walk on, keeping the state topological
            s.apply_rotation(a, b, c)
            assert s.order == rotated
            assert s.sum_live == sum_liveness_of(dag, rotated)
            assert all(P == sorted(s.pos[o] for o in dag.allocs[x][1])
                       for x, P in enumerate(s.P))


@pytest.mark.parametrize("seed", range(4))
def test_ripple_best_move_is_brute_force_best(seed):
    """The one-sweep costs of all distances of a block move equal from-scratch sums, and the
    move chosen is the best valid one over >= k ops."""
    rng = random.Random(100 + seed)
    n = 24
    dag, s = random_scheduler(rng, seed, n, allocs=30, most_readers=4)
    base = sum_liveness_of(dag, s.order)
    for k in (1, 2, 3):
        for start in range(n - k + 1):
            order = s.order
            best = None
            for a in range(start - k, -1, -1):  # backwards over start-a >= k ops
                if not s.rotation_valid(a, start, start + k):
                    break
                d = sum_liveness_of(dag, order[:a] + order[start:start + k]
                                    + order[a:start] + order[start + k:]) - base
                best = d if best is None else min(best, d)
            for c in range(start + 2 * k, n + 1):  # forwards
                if not s.rotation_valid(start, start + k, c):
                    break
                d = sum_liveness_of(dag, order[:start] + order[start + k:c]
                                    + order[start:start + k] + order[c:]) - base
                best = d if best is None else min(best, d)
            move = s._best_move(start, k)
            if best is None or best >= 0:
                assert move is None
            else:
                assert move is not None and move[0] == best
                a, b, c = move[1:]
                assert s.rotation_valid(a, b, c)
                assert s.rotation_delta(a, b, c) == best


# --- Checkmate graphs: reorder and the planner -----------------------------------------------
def branchy_graph() -> Graph:
    """Two independent chains written one after the other, each with a big first output that
    only its last node reads: interleaving them badly is costly; the file order is fine."""
    nodes, edges = [], []
    for br in "pq":
        names = [f"{br}{i}" for i in range(4)]
        sizes = [100, 1, 1, 1]
        nodes += [Node(x, 1.0, s) for x, s in zip(names, sizes)]
        edges += list(zip(names, names[1:])) + [(names[0], names[3])]
    nodes.append(Node("join", 1.0, 1))
    edges += [("p3", "join"), ("q3", "join")]
    return Graph(name="branchy", nodes=nodes, edges=edges)


def fan_graph() -> Graph:
    """A file order that is topological but wasteful: all big producers first, then their
    small consumers. The shift order interleaves them, so the plan order differs."""
    nodes = [Node(f"big{i}", 1.0, 50) for i in range(4)]
    nodes += [Node(f"small{i}", 1.0, 1) for i in range(4)]
    edges = [(f"big{i}", f"small{i}") for i in range(4)]
    nodes.append(Node("sink", 1.0, 1))
    edges += [(f"small{i}", "sink") for i in range(4)]
    return Graph(name="fan", nodes=nodes, edges=edges)


def test_planner_registered():
    table = planners()
    assert "shift" in table and table["shift"].views == ("checkmate",)


@pytest.mark.parametrize("make", [branchy_graph, fan_graph])
def test_shift_plan_replays_out_of_file_order(make):
    g = make()
    plan = run_planner("shift", g)
    res = simulate(plan, g)
    assert res.valid, res.errors
    assert not res.warnings  # predicted peak and time match the simulator
    assert res.peak_bytes == plan.predicted_peak <= no_recompute_peak(g)
    assert sorted(plan.computes()) == sorted(n.name for n in g.nodes)
    assert len(plan.computes()) == len(g.nodes)  # no recomputation
    if make is fan_graph:
        assert plan.computes() != [n.name for n in g.nodes]  # the simulator took another order
        assert res.peak_bytes < no_recompute_peak(g)
    # max-liveness of the Checkmate allocation model is the simulated peak
    dag = dag_from_graph(g)
    assert plan.meta["shift"]["final_max"] == res.peak_bytes
    assert max_liveness_of(dag, order_ix(dag, plan.computes())) == res.peak_bytes


def test_reorder_keeps_the_graph():
    g = fan_graph()
    g2 = reorder(g)
    assert [n.name for n in g2.nodes] == shift_schedule(g)
    assert sorted(g2.edges) == sorted(g.edges) and g2.name == g.name
    assert [n.name for n in g.nodes][0] == "big0" and g.nodes[1].name == "big1"  # untouched
    assert no_recompute_peak(g2) == simulate(run_planner("shift", g), g).peak_bytes
    from schedlang.graphs.writer import write_graph  # the reordered graph writes as .sched data
    assert "node big0" in write_graph(g2)


def test_planner_rejects_unknown_options():
    with pytest.raises(DataError, match="unknown option"):
        run_planner("shift", fan_graph(), bogus=1)


def test_chain_example():
    g = schedlang.load(ROOT / "examples" / "chain.sched").graph
    plan = run_planner("shift", g, budget=None)
    res = simulate(plan, g, budget=10**12)
    assert res.valid, res.errors
    assert res.peak_bytes <= no_recompute_peak(g)
    assert_topological(dag_from_graph(g), plan.computes())


@pytest.mark.skipif(not VGG16.exists(), reason="vgg16_train.json not available")
def test_vgg16():
    g = load_checkmate_nx(VGG16)
    plan = run_planner("shift", g)
    res = simulate(plan, g, budget=10**15)
    assert res.valid, res.errors
    assert res.peak_bytes <= no_recompute_peak(g)
    dag = dag_from_graph(g)
    assert plan.meta["shift"]["final_sum"] <= sum_liveness_of(dag, list(range(len(g.nodes))))
    # from a random start too: still valid, and no worse than the file order in sum-liveness
    plan2 = shift_plan(g, initial="random", seed=5)
    res2 = simulate(plan2, g, budget=10**15)
    assert res2.valid, res2.errors
    assert plan2.meta["shift"]["final_sum"] <= sum_liveness_of(dag, list(range(len(g.nodes))))
