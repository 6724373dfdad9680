"""Buffer assignment (schedlang.plans.allocator): liveness, in-place, pool, greedy by size."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

import schedlang
from schedlang.cli.main import main
from schedlang.graphs.elements import Node
from schedlang.graphs.graph import Graph
from schedlang.language.errors import DataError
from schedlang.plans.allocator import (
    METHODS,
    Value,
    _greedy_by_size,
    _pool,
    allocate,
    allocate_all,
    conflicts,
    liveness,
    max_live,
)
from schedlang.plans.plan import Op, Plan
from schedlang.plans.planners.no_recompute import no_recompute_plan
from schedlang.plans.simulate import simulate

from ..paths import EXAMPLES, GRAPHS

NO_BUDGET = 1 << 62

# Solved plans of the examples, pinned as data: a solver may return any of several optimal
# plans, and the allocator's figures depend on which (tests/data/plans/README.md).
PINNED = Path(__file__).resolve().parents[1] / "data" / "plans"
SOLVED = ("chain", "tiny_transformer", "unet", "transformer12")


@pytest.fixture(scope="module")
def cases():
    """(name, plan, graph): the pinned solved plans of the examples, their no-recomputation
    plans, and the no-recomputation plans of the VGG16 graphs of shared/graphs when present."""
    out = []
    for name in SOLVED:
        prob = schedlang.load(EXAMPLES / f"{name}.sched")
        plan = Plan.load(PINNED / f"{name}.json")
        sim = simulate(plan, prob.graph)  # the plan's own budget: the example's
        assert sim.valid and sim.fits_budget, (name, sim.errors)
        out.append((name, plan, prob.graph))
        out.append((f"{name}/no_recompute", no_recompute_plan(prob.graph), prob.graph))
    for g in ("vgg16_train", "vgg16_test"):
        path = GRAPHS / f"{g}.json"
        if path.exists():
            from schedlang.graphs.checkmate_nx import load_checkmate_nx

            graph = load_checkmate_nx(str(path))
            out.append((f"{g}/no_recompute", no_recompute_plan(graph), graph))
    return out


def _case(cases, name):
    for n, plan, graph in cases:
        if n == name:
            return plan, graph
    pytest.skip(f"{name} not available")


# --- every example ---------------------------------------------------------------------------
@pytest.mark.parametrize("free_at", ["delete", "last_use"])
def test_arena_at_least_max_live_and_no_overlap(cases, free_at):
    for name, plan, graph in cases:
        lv, reports = allocate_all(plan, graph, free_at=free_at)
        assert [r.method for r in reports] == list(METHODS)
        for r in reports:
            assert r.arena_bytes >= r.max_live_bytes > 0, (name, r.method)
            if r.inplace_reuses == 0:
                assert r.max_live_bytes == lv.max_live_bytes, (name, r.method)
            assert conflicts(r.assignments) == [], (name, r.method)
            assert all(0 <= a.offset and a.offset + a.size <= r.arena_bytes
                       for a in r.assignments), (name, r.method)


def test_max_live_equals_the_simulated_peak(cases):
    """free_at="delete" holds each value as the simulator does (no sub-step profiles here)."""
    for name, plan, graph in cases:
        sim = simulate(plan, graph, budget=NO_BUDGET, save_budget=NO_BUDGET)
        lv = liveness(plan, graph)
        assert lv.max_live_bytes == sim.peak_bytes, name
        assert max_live(lv.values) == sim.peak_bytes, name
        # last_use can only free earlier
        assert liveness(plan, graph, free_at="last_use").max_live_bytes <= sim.peak_bytes


def test_profiled_workspace_is_conservative():
    prob = schedlang.load(EXAMPLES / "profiled.sched")
    plan = no_recompute_plan(prob.graph)
    sim = simulate(plan, prob.graph, budget=NO_BUDGET, save_budget=NO_BUDGET)
    lv = liveness(plan, prob.graph)
    assert lv.max_live_bytes >= sim.peak_bytes  # the whole 64 MiB step workspace for the op


@pytest.mark.parametrize("name", ["transformer12", "transformer12/no_recompute",
                                  "chain/no_recompute", "vgg16_train/no_recompute",
                                  "vgg16_test/no_recompute"])
def test_greedy_by_size_within_5_percent(cases, name):
    plan, graph = _case(cases, name)
    r = allocate(plan, graph, "greedy_by_size")
    assert r.arena_bytes <= 1.05 * r.max_live_bytes, (r.arena_bytes, r.max_live_bytes)


def test_greedy_by_size_on_the_solved_chain(cases):
    """Plain greedy by size is 6.7% over max-live on the pinned solved chain plan (128 vs
    120 MiB): mixed 16/24/32 MiB lifetimes defeat the size order. Seeded restarts with
    perturbed sizes find 120 MiB."""
    plan, graph = _case(cases, "chain")
    plain = allocate(plan, graph, "greedy_by_size")
    assert plain.max_live_bytes == 120 << 20
    assert plain.arena_bytes == 128 << 20
    better = allocate(plan, graph, "greedy_by_size", restarts=64)
    assert better.arena_bytes <= 1.05 * better.max_live_bytes
    assert better.arena_bytes <= plain.arena_bytes
    assert conflicts(better.assignments) == []


# --- liveness details ------------------------------------------------------------------------
def test_outputs_and_gradients_stay_live(cases):
    plan, graph = _case(cases, "tiny_transformer")
    lv = liveness(plan, graph, free_at="last_use")
    n = len(plan.ops)
    out = [v for v in lv.values if v.name == "x.grad"]
    assert out and out[-1].end == n  # kept to the end, never reused
    for r in allocate_all(plan, graph, free_at="last_use")[1]:
        a = next(a for a in r.assignments if a.value == out[-1].name)
        others = [b for b in r.assignments if b is not a and b.size and b.end >= a.start
                  and b.start <= a.end and b.inplace_of != a.value and a.inplace_of != b.value]
        assert all(b.offset >= a.offset + a.size or a.offset >= b.offset + b.size for b in others)


def test_gradient_accumulation_is_one_buffer(cases):
    """In the U-Net, e1.grad gets two contributions: one value live across both."""
    plan, graph = _case(cases, "unet/no_recompute")
    lv = liveness(plan, graph, free_at="last_use")
    grads = [v for v in lv.values if v.key == "e1.grad"]
    assert len(grads) == 1
    creators = [k for k, op in enumerate(plan.ops)
                if op.op == "compute" and op.node in ("down2.bwd", "up1.bwd")]
    assert grads[0].start == min(creators) and grads[0].end >= max(creators)


def test_recomputation_is_a_new_value(cases):
    plan, graph = _case(cases, "chain")
    lv = liveness(plan, graph)
    f3 = [v for v in lv.values if v.key == "f3"]
    assert [v.name for v in f3] == ["f3", "f3@2"]
    assert f3[0].end < f3[1].start  # two lifetimes, free to share bytes


def _tiny() -> Graph:
    """a = op1(b, c); d = op2(a); e = op3(d, f) of the seed, as Checkmate nodes."""
    g = Graph("seed")
    for name in "bcfade":
        g.nodes.append(Node(name, 1.0, 10))
    g.edges = [("b", "a"), ("c", "a"), ("a", "d"), ("d", "e"), ("f", "e")]
    return g


def test_dataflow_on_the_seed_example():
    g = _tiny()
    ops = [Op("compute", node=x) for x in "bcf"]
    ops += [Op("compute", node="a"), Op("delete", data="b"), Op("delete", data="c"),
            Op("compute", node="d"), Op("delete", data="a"),
            Op("compute", node="e"), Op("delete", data="d"), Op("delete", data="f")]
    plan = Plan("seed", ops)
    lv = liveness(plan, g, free_at="last_use")
    ids = {v.name: v.id for v in lv.values}
    name = {v.id: v.name for v in lv.values}

    def live_in(k):
        return {name[v] for v in lv.live_in[k + 1]}

    def live_out(k):
        return {name[v] for v in lv.live_out[k + 1]}

    assert live_in(3) == {"b", "c", "f"} and live_out(3) == {"a", "f"}  # op1
    assert live_in(6) == {"a", "f"} and live_out(6) == {"d", "f"}  # op2
    assert live_in(8) == {"d", "f"} and live_out(8) == {"e"}  # op3; e stays: never deleted
    assert lv.values[ids["e"]].end == len(ops)
    assert lv.iterations == 2
    # in-place: a takes b's bytes (both dying inputs are 10 B)
    r = allocate(plan, g, "inplace")
    by = {a.value: a for a in r.assignments}
    assert by["a"].inplace_of in ("b", "c") and by["a"].offset == by[by["a"].inplace_of].offset
    assert by["d"].inplace_of == "a" and by["e"].inplace_of in ("d", "f")
    assert conflicts(r.assignments) == []
    assert r.arena_bytes == r.max_live_bytes == 30  # b (then a, d, e in place), c, f
    assert allocate(plan, g, "greedy_by_size").arena_bytes == 40


def test_inplace_rule_is_opt_in_and_selective():
    g = _tiny()
    plan = no_recompute_plan(g)
    assert allocate(plan, g, "pool").inplace_reuses == 0
    assert allocate(plan, g, "greedy_by_size").inplace_reuses == 0
    only_d = allocate(plan, g, "greedy_by_size", inplace={"d"})
    assert [a.value for a in only_d.assignments if a.inplace_of] == ["d"]
    assert allocate(plan, g, "inplace", inplace=lambda n: False).inplace_reuses == 0


def test_inplace_needs_a_large_enough_input():
    g = Graph("grow")
    g.nodes = [Node("x", 1.0, 10), Node("y", 1.0, 20)]
    g.edges = [("x", "y")]
    r = allocate(no_recompute_plan(g), g, "inplace")
    assert r.inplace_reuses == 0 and r.arena_bytes == 30


def test_an_invalid_plan_is_refused():
    g = _tiny()
    with pytest.raises(DataError, match="does not replay"):
        liveness(Plan("seed", [Op("compute", node="a")]), g)


# --- property tests --------------------------------------------------------------------------
def _random_checkmate(rng: random.Random) -> tuple[Plan, Graph]:
    """A random DAG and a random valid plan with recomputations and early deletes."""
    n = rng.randint(2, 12)
    g = Graph("rand")
    for i in range(n):
        g.nodes.append(Node(f"n{i}", 1.0, rng.choice([1, 2, 3, 4, 8, 16])))
    for j in range(1, n):
        for i in rng.sample(range(j), k=min(j, rng.randint(1, 2))):
            g.edges.append((f"n{i}", f"n{j}"))
    preds = {j: [i for i in range(j) if (f"n{i}", f"n{j}") in g.edges] for j in range(n)}
    live: set[int] = set()
    ops: list[Op] = []

    def ensure(j: int) -> None:
        for p in preds[j]:
            if p not in live:
                ensure(p)
        missing = [p for p in preds[j] if p not in live]
        for p in missing:  # a deeper recompute deleted it again: compute once more
            ensure(p)
        ops.append(Op("compute", node=f"n{j}"))
        live.add(j)

    for j in range(n):
        ensure(j)
        for v in sorted(live):
            if v != j and rng.random() < 0.35:
                ops.append(Op("delete", data=f"n{v}"))
                live.discard(v)
        if live and rng.random() < 0.15:  # recompute a live value: the copy replaces it
            v = rng.choice(sorted(live))
            if all(p in live for p in preds[v]):
                ops.append(Op("compute", node=f"n{v}"))
    return Plan("rand", ops), g


def _replay_check(plan: Plan, graph: Graph, assignments) -> None:
    """Replay the plan: during each compute, the values in memory (the simulator's view) must
    occupy disjoint bytes, except an in-place output and the dying input it took over."""
    by = {a.value: a for a in assignments}
    preds: dict[str, set[str]] = {n.name: set() for n in graph.nodes}
    for u, v in graph.edges:
        preds[v].add(u)
    count: dict[str, int] = {}
    cur: dict[str, str] = {}  # datum -> current value name
    ops = plan.ops
    for k, op in enumerate(ops):
        if op.op == "delete":
            del cur[op.data]
            continue
        node = op.node
        count[node] = count.get(node, 0) + 1
        new = node if count[node] == 1 else f"{node}@{count[node]}"
        held = list(cur.values()) + [new]
        # inputs freed by the deletes right after this compute die here
        dying = set()
        for later in ops[k + 1:]:
            if later.op != "delete":
                break
            dying.add(cur.get(later.data))
        for i, a in enumerate(held):
            for b in held[i + 1:]:
                x, y = by[a], by[b]
                if not x.size or not y.size:
                    continue
                if x.offset >= y.offset + y.size or y.offset >= x.offset + x.size:
                    continue
                pair = {a, b}
                ok = (new in pair and by[new].inplace_of in pair and by[new].inplace_of in dying
                      and {cur.get(p) for p in preds[node]} & pair)
                assert ok, f"op {k}: {a} and {b} share bytes while both are live"
        cur[node] = new


def test_random_plans_never_overwrite_a_live_value():
    try:
        from hypothesis import given, settings
        from hypothesis import strategies as st
    except ImportError:  # seeded random instead
        seeds = range(300)
        for seed in seeds:
            _check_seed(seed)
        return

    @settings(max_examples=150, deadline=None)
    @given(st.integers(0, 2**32 - 1))
    def prop(seed):
        _check_seed(seed)

    prop()


def _check_seed(seed: int) -> None:
    rng = random.Random(seed)
    plan, graph = _random_checkmate(rng)
    sim = simulate(plan, graph, budget=NO_BUDGET)
    assert sim.valid, sim.errors
    lv = liveness(plan, graph)
    assert lv.max_live_bytes == sim.peak_bytes
    for method in METHODS:
        for inplace in (False, True):
            r = allocate(plan, graph, method, inplace=inplace, lv=lv)
            assert r.arena_bytes >= r.max_live_bytes
            assert conflicts(r.assignments) == []
            _replay_check(plan, graph, r.assignments)


def test_random_lifetimes_pool_and_greedy():
    rng = random.Random(7)
    for _ in range(200):
        n = rng.randint(1, 30)
        values = []
        for i in range(n):
            s = rng.randint(-1, 20)
            values.append(Value(i, f"v{i}", "data", f"v{i}", rng.randint(0, 64), s,
                                s + rng.randint(0, 8)))
        bound = max_live(values)
        offs, arena = _greedy_by_size([(v.id, v.size, v.start, v.end) for v in values],
                                      restarts=rng.randint(0, 3), seed=rng.randint(0, 9))
        _, poffs, sizes = _pool(values, {})
        for placement, total in ((offs, arena), (poffs, sum(sizes))):
            assert total >= bound
            for a in values:
                for b in values:
                    if a.id < b.id and a.size and b.size and a.start <= b.end \
                            and b.start <= a.end:
                        oa, ob = placement[a.id], placement[b.id]
                        assert oa >= ob + b.size or ob >= oa + a.size


# --- CLI -------------------------------------------------------------------------------------
def test_cli_allocator(tmp_path, capsys):
    plan_path = PINNED / "chain.json"
    chain = str(EXAMPLES / "chain.sched")

    assert main(["simulate", str(plan_path), "--graph", chain, "--allocator"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("valid: peak 120.00 MiB")
    assert "allocator: max-live 120.00 MiB (125829120 B" in out
    for m in METHODS:
        assert f"  {m} " in out

    assert main(["simulate", str(plan_path), "--graph", chain, "--allocator", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["valid"] and res["peak_bytes"] == 125829120
    alloc = res["allocator"]
    assert alloc["max_live_bytes"] == 125829120 and alloc["free_at"] == "delete"
    assert [m["method"] for m in alloc["methods"]] == list(METHODS)
    for m in alloc["methods"]:
        assert m["arena_bytes"] >= m["max_live_bytes"]
        assert set(m) >= {"method", "arena_bytes", "max_live_bytes", "fragmentation"}

    assert main(["simulate", str(plan_path), "--graph", chain, "--json"]) == 0
    assert "allocator" not in json.loads(capsys.readouterr().out)


def test_cli_allocator_on_an_invalid_plan(tmp_path, capsys):
    plan_path = tmp_path / "bad.json"
    Plan("chain", [Op("compute", node="f2")]).save(plan_path)
    code = main(["simulate", str(plan_path), "--graph", str(EXAMPLES / "chain.sched"),
                 "--allocator", "--json"])
    assert code == 3
    res = json.loads(capsys.readouterr().out)
    assert "does not replay" in res["allocator"]["error"]


def test_cli_greedy_by_size_reaches_max_live_on_the_chain_example(capsys):
    """The CLI's report runs greedy by size with seeded restarts."""
    assert main(["simulate", str(PINNED / "chain.json"), "--graph", str(EXAMPLES / "chain.sched"),
                 "--allocator", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["allocator"]
    greedy = next(m for m in report["methods"] if m["method"] == "greedy_by_size")
    assert greedy["arena_bytes"] <= 1.05 * report["max_live_bytes"]
