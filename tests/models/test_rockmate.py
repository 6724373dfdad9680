"""models/rockmate.sched: agreement with Checkmate, plans that replay, the shipped examples."""
from __future__ import annotations

import random

import pytest

import schedlang
from schedlang.graphs.elements import DataNode, Layer, Loss, Node, Option
from schedlang.graphs.graph import Graph
from schedlang.graphs.writer import write_graph
from schedlang.plans.planners.no_recompute import no_recompute_peak
from schedlang.plans.simulate import simulate
from schedlang.solve.solution import Status

from ..paths import ROOT

MiB = 2**20


def single_option_pair(n: int, seed: int) -> tuple[Graph, Graph]:
    """A layered chain with one option per layer and no phantoms, and the same instance as a
    Checkmate graph (one node per compute node, one output each)."""
    rng = random.Random(seed)
    sizes = [rng.randint(1, 6) * MiB for _ in range(2 * n + 2)]
    fwd_t = [rng.randint(1, 5) for _ in range(n)]
    bwd_t = [rng.randint(1, 5) for _ in range(n)]
    h = [f"h{i}" for i in range(1, n + 1)]
    layered = Graph(f"chain{n}_{seed}")
    layered.data = [DataNode(x, sizes[i]) for i, x in enumerate(h)]
    layered.data.append(DataNode("lossgrad", sizes[n]))
    layered.data += [DataNode(f"g{i}", sizes[n + 1 + i]) for i in range(n - 1, -1, -1)]
    for i in range(n):
        ins = [h[i - 1]] if i else []
        grad_in = [f"g{i + 1}"] if i < n - 1 else ["lossgrad"]
        layered.layers.append(Layer(f"L{i + 1}", ins, [h[i]], grad_in, [f"g{i}"],
                                    [Option("only", fwd_t[i], 0, bwd_t[i], 0, 0, [h[i]])]))
    layered.loss = Loss([h[-1]], ["lossgrad"], 1.0)
    # the Checkmate view of the same computation
    cm = Graph(f"cm_chain{n}_{seed}")
    cm.nodes = [Node(f"L{i + 1}.fwd", fwd_t[i], sizes[i]) for i in range(n)]
    cm.nodes.append(Node("loss", 1.0, sizes[n]))
    cm.nodes += [Node(f"L{i + 1}.bwd", bwd_t[i], sizes[n + 1 + i], "backward") for i in range(n - 1, -1, -1)]
    cm.edges = [(f"L{i}.fwd", f"L{i + 1}.fwd") for i in range(1, n)] + [(f"L{n}.fwd", "loss")]
    cm.edges += [("loss", f"L{n}.bwd")] + [(f"L{i + 1}.bwd", f"L{i}.bwd") for i in range(n - 1, 0, -1)]
    cm.edges += [(f"L{i}.fwd", f"L{i}.bwd") for i in range(1, n + 1)]
    return layered, cm


def solve_graph(graph: Graph, model: str, budget: int, backend: str = "pyomo"):
    graph.budgets = {"peak": budget}
    return schedlang.load(text=f"use {model}\n" + write_graph(graph)).solve(backend=backend)


CASES = [(n, seed, frac) for n, seed in ((2, 1), (3, 2), (3, 5), (4, 3)) for frac in (0.7, 0.85, 1.0)]


@pytest.mark.parametrize("n,seed,frac", CASES)
def test_single_option_rockmate_equals_checkmate(n, seed, frac):
    layered, cm = single_option_pair(n, seed)
    budget = int(no_recompute_peak(cm) * frac)
    rm = solve_graph(layered, "rockmate", budget)
    ck = solve_graph(cm, "checkmate", budget)
    assert rm.status == ck.status
    if ck.status == Status.OPTIMAL:
        assert rm.objective == pytest.approx(ck.objective)
        for res, graph in ((rm, layered), (ck, cm)):
            sim = simulate(res.plan, graph, budget=budget)
            assert sim.valid, sim.errors
            assert sim.time == pytest.approx(res.objective)


@pytest.mark.parametrize("name", ["tiny_transformer", "unet"])
@pytest.mark.parametrize("backend", ["pyomo", "cvxpy"])
def test_examples_solve_and_replay(name, backend):
    prob = schedlang.load(ROOT / "examples" / f"{name}.sched")
    res = prob.solve(backend=backend)
    assert res.status == Status.OPTIMAL
    sim = res.simulated
    assert sim.valid, sim.errors
    assert sim.peak_bytes <= prob.budgets["peak"]
    assert sim.time == pytest.approx(res.objective)
    assert sim.peak_bytes <= res.plan.predicted_peak


def test_budget_sweep_on_the_tiny_transformer_is_monotone():
    objectives = []
    for budget in ("80MiB", "100MiB", "120MiB", "200MiB"):
        res = schedlang.load(ROOT / "examples" / "tiny_transformer.sched", budget=budget).solve()
        assert res.status == Status.OPTIMAL and res.simulated.valid
        objectives.append(res.objective)
    assert objectives == sorted(objectives, reverse=True)
    assert objectives[0] > objectives[-1]  # a tight budget costs time


# --------------------------------------------------------------------- correction terms

@pytest.mark.parametrize("backend", ["pyomo", "cvxpy"])
def test_correction_terms_change_the_optimum_and_only_that_plan_fits(backend):
    with_profiles = schedlang.load(ROOT / "examples" / "profiled.sched").solve(backend=backend)
    flat = schedlang.load(ROOT / "examples" / "no_profiles.sched").solve(backend=backend)
    assert with_profiles.status == flat.status == Status.OPTIMAL
    # the flat model believes autograd everywhere fits; the profile's 64 MiB spike says no
    assert flat.objective == pytest.approx(12.1e-3)
    assert with_profiles.objective == pytest.approx(14.1e-3)
    graph = schedlang.load(ROOT / "examples" / "profiled.sched").graph
    budget = 130 * MiB
    ok = simulate(with_profiles.plan, graph, budget=budget)
    assert ok.valid and ok.peak_bytes <= budget and ok.peak_bytes == with_profiles.plan.predicted_peak
    bad = simulate(flat.plan, graph, budget=budget)
    assert not bad.valid and bad.peak_bytes > budget


FREEING = """
use rockmate
graph freeing {
  data x 8MiB input
  data h1 64MiB
  data h2 8MiB
  data loss 4B
  data h2.grad 8MiB
  data h1.grad 64MiB
  data x.grad 8MiB output
  layer block1 (x) -> (h1) {
    grad (h1.grad) -> (x.grad)
    option recompute fwd 1ms bwd 2ms phantom 0 needs (x)
  }
  layer block2 (h1) -> (h2) {
    grad (h2.grad) -> (h1.grad)
    option autograd fwd 1ms overhead 48MiB bwd 2ms phantom 8MiB%s
  }
  loss (h2) -> (loss, h2.grad) time 0.1ms
}
"""


@pytest.mark.parametrize("backend", ["pyomo", "cvxpy"])
def test_a_step_that_frees_an_input_lowers_the_peak(backend):
    # block2's forward no longer needs h1 (64 MiB) once its workspace (48 MiB) is in use: with
    # the profile, deleting h1 right after block2.fwd makes room for the workspace
    flat = FREEING % ""
    profiled = FREEING % "\n        fwd_steps (0, 48MiB frees (h1) creates (h2))"
    budget = "130MiB"
    r_flat = schedlang.load(text=flat, budget=budget).solve(backend=backend)
    r_prof = schedlang.load(text=profiled, budget=budget).solve(backend=backend)
    assert r_flat.status == Status.INFEASIBLE  # 8 + 64 + 8 + 8 + 48 = 136 MiB > 130 without it
    assert r_prof.status == Status.OPTIMAL
    assert r_prof.simulated.valid and r_prof.simulated.peak_bytes <= 130 * MiB
    assert r_prof.simulated.time == pytest.approx(r_prof.objective)
