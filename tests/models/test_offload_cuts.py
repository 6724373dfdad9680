"""The valid inequalities of models/offload.sched (`ph_traced`, `ph_host_traced`, `bwd_traced`,
`ph_stays`; `param strengthen = 0` leaves them out): they cut only fractional points, so the
exact optimum is the same with and without them, and the LP relaxation's bound never drops
(issue 15: without them the root bound of a transformer-like chain is the sum of its compute
times). The brute-force oracle comparisons of tests/models/test_offload.py run with them in."""
from __future__ import annotations

import copy

import pytest

import schedlang
from schedlang.graphs.writer import write_graph
from schedlang.plans.planners.no_recompute import no_recompute_peak
from schedlang.solve.relaxation import highs_solve
from schedlang.solve.solution import Status
from schedlang.testing.layered_instances import MiB, chain, opt, skip3

from ..offload_cases import ORACLE, replay, tiny_random, with_bandwidth


def transformer_like(n: int) -> schedlang.graphs.graph.Graph:
    """bench/instances.transformer_chain's ratios scaled down 16x: 1 MiB activations, phantoms
    of 6 (autograd), 0 (recompute) and 2.5 MiB (selective), forwards of 2 time units, a host
    link of 1.43 MiB per unit (24 GB/s against 2 ms forwards)."""
    o = [opt("keep", 2, 4, 6), opt("recomp", 2, 6, 0, ["in"]), opt("sel", 2, 4.8, 2.5, ["out"])]
    g = chain(f"transformer_like{n}", [1] * (n + 1), [o] * n, loss_time=0.1)
    return with_bandwidth(g, 1.43 * MiB)


def problem(graph, peak: int, strengthen: int):
    g = copy.copy(graph)
    g.budgets = {"peak": peak}
    return schedlang.load(text="use offload\n" + write_graph(g) + f"\nparam strengthen = {strengthen}\n")


def lp_bound(graph, peak: int, strengthen: int) -> float:
    out = highs_solve(problem(graph, peak, strengthen).lower(), relax=True)
    assert out.status == "optimal"
    return out.objective


def skip_with_transfers():
    two = [opt("keep", 2, 3, 4), opt("recomp", 2, 5, 0, ["in"])]
    return with_bandwidth(skip3("skip3", [two, two, [opt("keep", 1, 2, 3)]]), 2 * MiB)


CASES = ([(f"oracle_{n}", lambda n=n: with_bandwidth(ORACLE[n], 4 * MiB)) for n in ("big1", "big2")]
         + [(f"tiny_random{s}", lambda s=s: tiny_random(s)) for s in (1, 4, 7)]
         + [("skip3", skip_with_transfers), ("transformer_like3", lambda: transformer_like(3))])


@pytest.mark.parametrize("name,make", CASES, ids=[c[0] for c in CASES])
def test_cuts_keep_the_optimum(name, make):
    g = make()
    top = no_recompute_peak(g)
    for frac in (1.0, 0.7, 0.5):
        peak = int(top * frac)
        weak = problem(g, peak, 0).solve()
        strong = problem(g, peak, 1).solve()
        assert strong.status == weak.status, (name, frac)
        assert strong.status in (Status.OPTIMAL, Status.INFEASIBLE), (name, frac, strong.status)
        if strong.status == Status.OPTIMAL:
            assert strong.objective == pytest.approx(weak.objective, rel=1e-6), (name, frac)
            replay(g, strong, peak)
            # the LP bound never drops, and stays below the optimum
            lo_weak, lo_strong = lp_bound(g, peak, 0), lp_bound(g, peak, 1)
            assert lo_weak - 1e-7 <= lo_strong <= strong.objective * (1 + 1e-7), (name, frac)


def test_cuts_raise_the_bound_of_a_transformer_like_chain():
    """Where the unstrengthened LP hides every transfer behind compute by moving fractions of
    phantoms, the cuts close about half of its gap (3 layers at 60%: 18.70 -> 19.14 of 19.7)."""
    g = transformer_like(3)
    peak = int(no_recompute_peak(g) * 0.6)
    best = problem(g, peak, 1).solve()
    assert best.status == Status.OPTIMAL
    weak, strong = lp_bound(g, peak, 0), lp_bound(g, peak, 1)
    assert weak < strong <= best.objective * (1 + 1e-7)
    assert (best.objective - strong) < 0.6 * (best.objective - weak)
