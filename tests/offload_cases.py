"""Shared by the offloading tests (test_offload*.py): solving a layered graph with an
offloading model, replaying its plan, the oracle's instances and grid, and random tiny
instances."""
from __future__ import annotations

import copy
import functools
import math
import random

import pytest

import schedlang
from schedlang.graphs.graph import Graph
from schedlang.graphs.writer import write_graph
from schedlang.plans.planners.no_recompute import no_recompute_peak
from schedlang.plans.simulate import simulate
from schedlang.testing.layered_instances import MiB, chain, opt

from .bruteforce_offload import best_offload_plan

INF = math.inf

#: the offload model restricted to transfer fractions in {0, 1/2, 1} (the oracle's grid)
GRID = """
var OflH[(t, d) in DW] integer [0, 2]
var PrfH[(t, d) in DW] integer [0, 2]
var POflH[(t, j, o) in PW] integer [0, 2]
var PPrfH[(t, j, o) in PW] integer [0, 2]
constraint ofl_grid[(t, d) in DW]: Ofl[t, d] == 0.5 * OflH[t, d]
constraint prf_grid[(t, d) in DW]: Prf[t, d] == 0.5 * PrfH[t, d]
constraint pofl_grid[(t, j, o) in PW]: POfl[t, j, o] == 0.5 * POflH[t, j, o]
constraint pprf_grid[(t, j, o) in PW]: PPrf[t, j, o] == 0.5 * PPrfH[t, j, o]
"""


# ---------------------------------------------------------------------- helpers
def with_bandwidth(graph: Graph, bw: float | None) -> Graph:
    """A copy of `graph` with both bandwidths `bw` (bytes per time unit; None: none given)."""
    g = copy.deepcopy(graph)
    g.bandwidths = {} if bw is None else {"offload": bw, "prefetch": bw}
    return g


def solve(graph: Graph, peak: int, *, model: str = "offload", save: int | None = None,
          host: int | None = None, extra: str = "", backend: str = "pyomo"):
    """(problem, result) of `model` on `graph` (its bandwidths) at these budgets; `extra` is
    appended to the text (params, overrides)."""
    budgets = {"peak": peak}
    if save is not None:
        budgets["save"] = save
    if host is not None:
        budgets["host"] = host
    g = copy.copy(graph)
    g.budgets = budgets
    prob = schedlang.load(text=f"use {model}\n" + write_graph(g) + extra)
    return prob, prob.solve(backend=backend)


def replay(graph: Graph, res, peak: int, save: int | None = None, host: int | None = None):
    """The plan replays valid, within every budget, its time the objective; its peak is at
    most the predicted one. Returns the simulation."""
    sim = simulate(res.plan, graph, budget=peak, save_budget=save if save is not None else peak,
                   host_budget=host)
    ops = "\n".join(str(op) for op in res.plan.ops)
    assert sim.valid and sim.fits_budget, (sim.errors, ops)
    assert sim.time == pytest.approx(res.objective, rel=1e-6), ops
    assert sim.peak_bytes <= peak
    assert res.plan.predicted_peak is not None and sim.peak_bytes <= res.plan.predicted_peak
    return sim


def transfers(plan) -> list:
    return [op for op in plan.ops if op.op in ("offload", "prefetch", "wait")]


def oracle_instances() -> dict[str, Graph]:
    out = {}
    # 1 layer, 2 options: nothing gains from moving (see the test above), but all may move
    out["one_layer"] = chain("one_layer", [2, 3], [[opt("keep", 2, 3, 4),
                                                     opt("recomp", 2, 5, 0, ["in"])]])
    # 2 layers, a large phantom in front: offloading it saves the loss phase
    out["big1"] = chain("big1", [1, 1, 1], [[opt("keep", 2, 3, 8)], [opt("keep", 2, 3, 2)]])
    # 2 layers of 2 options (keep everything vs recompute from the input)
    two = [opt("keep", 2, 3, 4), opt("recomp", 2, 5, 0, ["in"])]
    out["chain2x2"] = chain("chain2x2", [2, 3, 2], [two, two])
    # uneven layers, an option keeping the output
    out["big2"] = chain("big2", [1, 4, 1], [[opt("keep", 2, 3, 6), opt("sel", 2, 4, 2, ["out"])],
                                            [opt("keep", 1, 2, 3)]])
    return out


ORACLE = oracle_instances()
BANDWIDTHS = {"0": 0, "small": 1 * MiB, "large": 4 * MiB, "inf": INF}


@functools.cache
def oracle(name: str, bw: str, peak: int, save: int | None = None):
    g = with_bandwidth(ORACLE[name], BANDWIDTHS[bw])
    return best_offload_plan(g, peak, save)


def oracle_budgets(name: str) -> list[int]:
    """Every whole MiB from the no-recomputation peak down to the first infeasible one (with
    free transfers: the widest range)."""
    out = []
    b = no_recompute_peak(ORACLE[name]) // MiB
    while True:
        out.append(b * MiB)
        if oracle(name, "inf", b * MiB)[0] is None:
            return out
        b -= 1


def tiny_random(seed: int) -> Graph:
    """1-2 layers of 1-2 options (keep, and recompute from the input or keep the output),
    random sizes, times and bandwidths (1, 2, 4 MiB per unit or inf, each direction), one
    datum pinned now and then."""
    rng = random.Random(seed)
    n = rng.choice([1, 2, 2])
    acts = [rng.randint(1, 4) for _ in range(n + 1)]
    grads = [rng.randint(1, 3) for _ in range(n + 1)]
    layers = []
    for _ in range(n):
        opts = [opt("keep", rng.randint(1, 6), rng.randint(1, 5), rng.randint(2, 9),
                    bwd_over_mib=rng.choice([0, 0, 1]))]
        r = rng.random()
        if r < 0.3:
            opts.append(opt("recomp", rng.randint(1, 4), rng.randint(3, 7), 0, ["in"]))
        elif r < 0.5:
            opts.append(opt("sel", rng.randint(1, 4), rng.randint(2, 6), rng.randint(1, 3), ["out"]))
        layers.append(opts)
    g = chain(f"tiny_random{seed}", acts, layers, loss_time=rng.choice([1, 2, 4]), grad_mib=grads)
    if rng.random() < 0.2:
        rng.choice(g.data).pinned = True
    g.bandwidths = {c: rng.choice([1, 2, 4, INF]) * MiB for c in ("offload", "prefetch")}
    return g


def linked_plan(prep, budget, bandwidth):
    """The solver's plan of `prep` (a `schedlang.pytorch.fit.Prepared`) at `budget` (a size or
    percent) with a host link of `bandwidth` each way (models/offload.sched for fx layers, the
    option `offload` for blocks): what `fit` compares with recomputation alone. Tests that
    run such a plan pass it to ``fit(..., bandwidth=..., plan=...)``, which keeps it whichever
    plan is faster."""
    import torch

    from schedlang.pytorch.fit import resolve_fit_budget, solve_extra, solve_plan
    from schedlang.pytorch.hostlink import resolve_link
    from schedlang.pytorch.planning import linked

    link, _ = resolve_link(bandwidth, torch.device("cpu"))
    lp = linked(prep, link)
    activation = resolve_fit_budget(budget, prep.plain_peak) - prep.resident_bytes
    plan = solve_plan(lp.graph, activation, **solve_extra(lp))
    assert plan is not None, (budget, bandwidth)
    return plan
