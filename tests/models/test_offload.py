"""models/offload.sched: what users rely on, and its optimum against an exhaustive search.

* offloading off (bandwidth 0, `param allow_offload = 0`, or every datum and option `pinned`):
  the optimum and the status are rockmate.sched's (examples and random layered instances, at
  budgets from the no-recomputation peak down to infeasible);
* infinite bandwidth: when every tensor can be moved in time, a budget well below the
  no-recomputation peak costs nothing; 1 MiB less and it does;
* finite bandwidth: every plan replays valid in the simulator within the budgets, its time the
  objective, its peak at most the predicted one (equal where the model holds no slack memory:
  see test_predicted_peak_is_the_simulated_peak);
* the switches (`allow_recompute = 0`, offloading off) and the host budget do what they say,
  and both backends agree;
* against tests/bruteforce_offload.py (transfer fractions on the grid {0, 1/2, 1}; the ILP
  restricted to the same grid by GRID below): equal optima, infeasible iff infeasible, on
  tiny instances x budgets x bandwidths (0, small, large, inf). The oracle is itself held to
  the simulator (`check=True` on the smallest instances).

Five model bugs the oracle found (a datum's window ending at its readers' first computation,
arrivals not restoring contributions, the host budget reading outside the window, a phantom
prefetch round unable to span two phases, a phantom offloaded during its own backward) each
keep their minimal reproducer below as a regression test. The predicted peak bounds the
replayed one (equality depends on which tied optimum the solver returns).
"""
from __future__ import annotations

import copy
import functools
import random

import pytest

from schedlang.graphs.graph import Graph
from schedlang.language.program import load_program
from schedlang.plans.planners.no_recompute import no_recompute_peak, no_recompute_plan
from schedlang.solve.solution import Status
from schedlang.testing.bruteforce import assert_oracle_optimum
from schedlang.testing.layered_instances import MiB, chain, opt

from ..bruteforce_offload import OffloadStats, best_offload_plan
from ..offload_cases import (
    BANDWIDTHS,
    GRID,
    INF,
    ORACLE,
    oracle,
    oracle_budgets,
    replay,
    solve,
    tiny_random,
    transfers,
    with_bandwidth,
)
from ..paths import ROOT


@functools.cache
def example(name: str) -> Graph:
    return load_program([ROOT / "examples" / f"{name}.sched"]).graph


def random_chain(seed: int) -> Graph:
    """2-3 layers of 1-3 options (keep everything, recompute from the input, keep the output),
    random sizes and times in whole MiB and units."""
    rng = random.Random(seed)
    n = rng.choice([2, 3])
    acts = [rng.randint(1, 4) for _ in range(n + 1)]
    layers = []
    for _ in range(n):
        f = rng.randint(1, 3)
        opts = [opt("keep", f, rng.randint(1, 4), rng.randint(2, 8),
                    bwd_over_mib=rng.randint(0, 2))]
        if rng.random() < 0.7:
            opts.append(opt("recomp", f, rng.randint(3, 6), 0, ["in"], fwd_over_mib=rng.randint(0, 1)))
        if rng.random() < 0.4:
            opts.append(opt("sel", f, rng.randint(2, 5), rng.randint(1, 3), ["out"]))
        layers.append(opts)
    return chain(f"random{seed}", acts, layers, loss_time=rng.choice([0.5, 1, 2]))


RANDOM = {seed: random_chain(seed) for seed in range(4)}


def budgets_of(graph: Graph, fractions=(1.0, 0.75, 0.55, 0.35, 0.2)) -> list[int]:
    top = no_recompute_peak(graph)
    return sorted({max(MiB, int(top * f) // MiB * MiB) if f < 1 else top for f in fractions},
                  reverse=True)


# ---------------------------------------------------------------------- offloading off = rockmate
def pinned_everywhere(graph: Graph) -> Graph:
    g = copy.deepcopy(graph)
    for d in g.data:
        d.pinned = True
    for layer in g.layers:
        for o in layer.options:
            o.pinned = True
    return g


OFF_MODES = {
    "bandwidth0": lambda g: (with_bandwidth(g, 0), ""),
    "allow_offload0": lambda g: (with_bandwidth(g, 16e9), "param allow_offload = 0\n"),
    "pinned": lambda g: (with_bandwidth(pinned_everywhere(g), 16e9), ""),
}


def off_cases():
    cases = []
    for name in ("tiny_transformer", "profiled"):
        cases += [(name, b) for b in budgets_of(example(name), (1.0, 0.7, 0.5, 0.3))]
    cases += [("unet", b) for b in budgets_of(example("unet"), (0.5, 0.3))]  # OPTIMAL, INFEASIBLE
    for seed, g in RANDOM.items():
        cases += [(f"random{seed}", b) for b in budgets_of(g, (1.0, 0.55, 0.2))]
    return cases


def graph_named(name: str) -> Graph:
    return RANDOM[int(name[6:])] if name.startswith("random") else example(name)


@functools.cache
def rockmate_optimum(name: str, peak: int):
    _prob, res = solve(with_bandwidth(graph_named(name), None), peak, model="rockmate")
    return res.status, res.objective


@pytest.mark.parametrize("name,peak,mode", [(n, b, m) for n, b in off_cases() for m in OFF_MODES
                                            if n != "unet" or m == "bandwidth0" or b == max(
                                                b2 for n2, b2 in off_cases() if n2 == "unet")])
def test_offloading_off_is_rockmate(name, peak, mode):
    status, objective = rockmate_optimum(name, peak)
    graph, extra = OFF_MODES[mode](graph_named(name))
    _prob, res = solve(graph, peak, extra=extra)
    assert res.status == status
    if status == Status.OPTIMAL:
        assert res.objective == pytest.approx(objective, rel=1e-6)
        assert not transfers(res.plan)
        replay(graph, res, peak)


def test_offloading_off_cases_cover_infeasible_and_recomputation():
    statuses = {rockmate_optimum("tiny_transformer", peak)[0]
                for name, peak in off_cases() if name == "tiny_transformer"}
    assert statuses == {Status.OPTIMAL, Status.INFEASIBLE}
    g = graph_named("tiny_transformer")
    tight = budgets_of(g, (1.0, 0.5))[-1]
    assert rockmate_optimum("tiny_transformer", tight)[1] > no_recompute_plan(g).predicted_time


# ---------------------------------------------------------------------- infinite bandwidth
def zero_overhead_chain() -> Graph:
    """3 layers, every activation 1 MiB, a phantom of 8 MiB per layer (or recompute, slower).
    No-recomputation peak: 27 MiB; time 10. With free transfers, the phantom of layer j is
    offloaded while L(j+1).fwd runs (it is on the device during that step: transfers overlap
    the frontier step only) and dropped after it; it comes back while L(j+1).bwd runs. The
    peak is then two phantoms and two activations: 18 MiB (L(j+1).fwd: h_j, h_j+1, phantoms
    j and j+1; L(j+1).bwd: its phantom, the prefetch buffer of phantom j, two gradients)."""
    two = [opt("keep", 1, 2, 8), opt("recomp", 1, 3, 0, ["in"])]
    return chain("zero_overhead", [1, 1, 1, 1], [two, two, two])


def test_free_transfers_make_a_smaller_budget_free():
    g = with_bandwidth(zero_overhead_chain(), INF)
    base = no_recompute_plan(g).predicted_time
    assert no_recompute_peak(g) == 27 * MiB
    for save in (None, 18 * MiB):
        _prob, res = solve(g, 18 * MiB, save=save)
        assert res.status == Status.OPTIMAL
        assert res.objective == pytest.approx(base, rel=1e-9)  # no overhead at all
        sim = replay(g, res, 18 * MiB, save)
        assert sim.wait_time == 0 and transfers(res.plan)
    # 1 MiB less: two phantoms no longer fit beside two activations, so something is recomputed
    _prob, res = solve(g, 17 * MiB)
    assert res.status == Status.OPTIMAL and res.objective > base + 0.5
    replay(g, res, 17 * MiB)
    # without offloading, 18 MiB costs recomputation
    _prob, res = solve(with_bandwidth(g, 0), 18 * MiB)
    assert res.objective > base + 0.5


def test_free_transfers_do_not_help_where_nothing_can_move_in_time():
    """One layer: a tensor offloaded during one frontier step is back at the end of a later
    one at the earliest, and the only frontier steps before L1.bwd are L1.fwd's and the loss's:
    a tensor moved out is off the device only between two phases, so no peak goes down and
    free transfers change no optimum (the oracle agrees: test_ilp_equals_oracle[one_layer-*])."""
    g = chain("one_layer", [2, 3], [[opt("keep", 2, 3, 4), opt("recomp", 2, 5, 0, ["in"])]])
    for peak in (11 * MiB, 10 * MiB, 8 * MiB):
        _p, ref = solve(with_bandwidth(g, None), peak, model="rockmate")
        _p, res = solve(with_bandwidth(g, INF), peak)
        assert res.status == ref.status
        if ref.status == Status.OPTIMAL:
            assert res.objective == pytest.approx(ref.objective)
            replay(with_bandwidth(g, INF), res, peak)


# ---------------------------------------------------------------------- finite bandwidth
def finite_cases():
    cases = []
    for seed in RANDOM:
        for bw in (1 * MiB, 4 * MiB):
            cases += [(f"random{seed}", bw, b) for b in budgets_of(RANDOM[seed], (0.75, 0.45))]
    for name in ("tiny_transformer", "profiled"):
        g = example(name)
        cases += [(name, 16e9, b) for b in budgets_of(g, (0.7, 0.5))]
        if name == "tiny_transformer":
            cases += [(name, 2e9, b) for b in budgets_of(g, (0.6,))]
    return cases


@pytest.mark.parametrize("name,bw,peak", finite_cases())
def test_finite_bandwidth_plans_replay(name, bw, peak):
    g = with_bandwidth(graph_named(name), bw)
    _prob, res = solve(g, peak)
    status, objective = rockmate_optimum(name, peak)
    if res.status == Status.INFEASIBLE:
        assert status == Status.INFEASIBLE
        return
    assert res.status == Status.OPTIMAL
    if status == Status.OPTIMAL:
        assert res.objective <= objective * (1 + 1e-9)  # offloading only adds choices
    replay(g, res, peak)


def test_offloading_helps_somewhere():
    """The finite-bandwidth cases are not all plans without transfers."""
    g = with_bandwidth(chain("big1", [1, 1, 1], [[opt("keep", 2, 3, 8)], [opt("keep", 2, 3, 2)]]),
                       4 * MiB)
    _p, res = solve(g, 12 * MiB)
    _p, ref = solve(g, 12 * MiB, model="rockmate")
    assert res.objective < ref.objective
    assert transfers(res.plan)
    replay(g, res, 12 * MiB)


def test_predicted_peak_bounds_the_simulated_peak():
    """tiny_transformer, 16GB/s, peak 120MiB. The ILP's Hold/Busy of a datum may be 1 in phases
    where no prefetch of it is in flight (nothing forces them to 0: they only cost memory), so
    the predicted peak can be above the replayed one (114 vs 108 MiB with one tied optimum);
    what a user relies on is that it is never below it, nor above the budget."""
    g = with_bandwidth(example("tiny_transformer"), 16e9)
    _p, res = solve(g, 120 * MiB)
    sim = replay(g, res, 120 * MiB)
    assert sim.peak_bytes <= res.plan.predicted_peak <= 120 * MiB


# ---------------------------------------------------------------------- switches
SWITCH = with_bandwidth(chain("switch", [1, 1, 1], [[opt("keep", 2, 3, 8), opt("recomp", 2, 5, 0, ["in"])],
                                                   [opt("keep", 2, 3, 2), opt("recomp", 2, 4, 0, ["in"])]]),
                        4 * MiB)


@pytest.mark.parametrize("peak,feasible", [(13 * MiB, True), (12 * MiB, True),
                                           (10 * MiB, False), (8 * MiB, False)])
def test_no_recomputation_switch(peak, feasible):
    """Without recomputation, SWITCH fits 12 MiB (by offloading L1's phantom) but not 10 MiB,
    which the model with recomputation reaches at a cost."""
    _p, res = solve(SWITCH, peak, extra="param allow_recompute = 0\n")
    _p, free = solve(SWITCH, peak)
    assert free.status == Status.OPTIMAL
    if not feasible:
        assert res.status == Status.INFEASIBLE
        return
    assert res.status == Status.OPTIMAL
    computes = [op.node for op in res.plan.ops if op.op == "compute"]
    assert len(computes) == len(set(computes))  # every node once
    replay(SWITCH, res, peak)
    assert free.objective <= res.objective * (1 + 1e-9)


def test_no_recomputation_switch_still_offloads():
    _p, res = solve(SWITCH, 12 * MiB, extra="param allow_recompute = 0\n")
    assert res.status == Status.OPTIMAL and transfers(res.plan)
    _p, none = solve(SWITCH, 12 * MiB, extra="param allow_recompute = 0\nparam allow_offload = 0\n")
    assert none.status == Status.INFEASIBLE


@pytest.mark.parametrize("how", ["allow_offload0", "bandwidth0", "prefetch0"])
def test_offloading_switched_off_issues_no_transfer(how):
    g, extra = SWITCH, ""
    if how == "allow_offload0":
        extra = "param allow_offload = 0\n"
    elif how == "bandwidth0":
        g = with_bandwidth(SWITCH, 0)
    else:
        g = copy.deepcopy(SWITCH)
        g.bandwidths["prefetch"] = 0
    for peak in (12 * MiB, 10 * MiB):
        _p, res = solve(g, peak, extra=extra)
        assert res.status == Status.OPTIMAL and not transfers(res.plan)
        replay(g, res, peak)


# ---------------------------------------------------------------------- host budget
@pytest.mark.parametrize("name", ["big1", "zero_overhead"])
def test_host_budget_binds(name):
    """big1 (4 MiB per unit, peak 12 MiB) offloads L1's phantom (8 MiB); zero_overhead (free
    transfers, peak 18 MiB) the phantoms of L1 and L2 (16 MiB). Less host memory than that
    costs time; every plan stays within its host budget."""
    if name == "big1":
        g = with_bandwidth(ORACLE["big1"], 4 * MiB)
        peak, need = 12 * MiB, 8 * MiB
    else:
        g = with_bandwidth(zero_overhead_chain(), INF)
        peak, need = 18 * MiB, 16 * MiB
    _p, free = solve(g, peak)
    replay(g, free, peak)
    previous = free.objective
    for host in (need, need // 2, MiB):  # recomputation keeps every host budget feasible
        _p, res = solve(g, peak, host=host)
        assert res.status == Status.OPTIMAL
        assert res.objective >= previous * (1 - 1e-9)
        previous = res.objective
        sim = replay(g, res, peak, host=host)
        assert sim.host_peak_bytes <= host
        if host == need:
            assert res.objective == pytest.approx(free.objective)
        else:
            assert res.objective > free.objective * (1 + 1e-9)


def test_backends_agree():
    g = SWITCH
    for peak in (12 * MiB, 9 * MiB):
        a = solve(g, peak, backend="pyomo")[1]
        b = solve(g, peak, backend="cvxpy")[1]
        assert a.status == b.status == Status.OPTIMAL
        assert a.objective == pytest.approx(b.objective, rel=1e-6)
        replay(g, a, peak)
        replay(g, b, peak)


# ---------------------------------------------------------------------- against the oracle
def check_against_oracle(name: str, bw: str, peak: int, save: int | None = None) -> None:
    g = with_bandwidth(ORACLE[name], BANDWIDTHS[bw])
    best, _plan = oracle(name, bw, peak, save)
    _prob, res = solve(g, peak, save=save, extra=GRID if BANDWIDTHS[bw] else "")
    where = f"{name} bandwidth {bw} peak {peak / MiB} MiB save {save and save / MiB}"
    if not assert_oracle_optimum(res, best, where + "\n" + "\n".join(str(o) for o in (_plan.ops if _plan else []))):
        return
    replay(g, res, peak, save)


FAST = [("one_layer", bw) for bw in BANDWIDTHS] + [("big1", "large"), ("big1", "inf")]
SLOW = ([("big1", "0"), ("big1", "small")] + [("chain2x2", bw) for bw in BANDWIDTHS]
        + [("big2", bw) for bw in BANDWIDTHS])


@pytest.mark.parametrize("name,bw", FAST)
def test_ilp_equals_oracle(name, bw):
    for peak in oracle_budgets(name):
        check_against_oracle(name, bw, peak)


@pytest.mark.slow
@pytest.mark.parametrize("name,bw", SLOW)
def test_ilp_equals_oracle_more(name, bw):
    for peak in oracle_budgets(name):
        check_against_oracle(name, bw, peak)


def test_oracle_cases_cover_offloading_and_infeasibility():
    # the small bandwidth is too slow where the large one helps; infeasible budgets are included
    assert oracle("big1", "large", 12 * MiB)[0] < oracle("big1", "0", 12 * MiB)[0]
    assert oracle("big1", "small", 12 * MiB)[0] > oracle("big1", "large", 12 * MiB)[0]
    assert oracle("big1", "inf", oracle_budgets("big1")[-1])[0] is None


@pytest.mark.parametrize("bw", ["small", "inf"])
def test_oracle_steps_like_the_simulator(bw):
    """Every transition the search takes or rejects (validity, peak) is replayed by simulate,
    and the search with every cut off but memo finds the same optima."""
    g = with_bandwidth(ORACLE["one_layer"], BANDWIDTHS[bw])
    for peak in oracle_budgets("one_layer"):
        st = OffloadStats()
        t, _plan = best_offload_plan(g, peak, check=True, seed=False, dominance=False, stats=st)
        assert t == oracle("one_layer", bw, peak)[0]
        assert st.checked > 0


@pytest.mark.slow
@pytest.mark.parametrize("bw", ["large", "inf"])
def test_oracle_steps_like_the_simulator_with_phantom_transfers(bw):
    """The same on 2 layers, where phantoms are offloaded, dropped and prefetched back."""
    g = with_bandwidth(ORACLE["big1"], BANDWIDTHS[bw])
    for peak in (12 * MiB, 11 * MiB):
        st = OffloadStats()
        t, _plan = best_offload_plan(g, peak, check=True, stats=st)
        assert t == oracle("big1", bw, peak)[0]


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(24))
def test_ilp_equals_oracle_on_random_tiny_instances(seed):
    """Budgets from the no-recomputation peak down by 1, 2, 3, 5 MiB, with a binding save
    budget or a host budget now and then."""
    g = tiny_random(seed)
    rng = random.Random(seed + 1000)
    top = no_recompute_peak(g)
    for peak in sorted({top - m * MiB for m in (0, 1, 2, 3, 5) if top - m * MiB > 0}):
        saves = [None] + ([max(MiB, peak - rng.randint(1, 6) * MiB)] if rng.random() < 0.5 else [])
        for save in saves:
            host = rng.randint(1, 8) * MiB if rng.random() < 0.3 else None
            best, plan = best_offload_plan(g, peak, save, host)
            _prob, res = solve(g, peak, save=save, host=host, extra=GRID)
            where = f"{g.name} peak {peak / MiB} save {save and save / MiB} host {host and host / MiB}"
            if best is None:
                assert res.status == Status.INFEASIBLE, where
                continue
            assert res.status == Status.OPTIMAL, (where, best)
            assert res.objective == pytest.approx(best, rel=1e-6), \
                (where, "\n".join(str(o) for o in plan.ops))
            replay(g, res, peak, save, host)


# ---------------------------------------------------------------------- minimal reproducers
def split_round() -> Graph:
    """2 layers; L1's phantom (8 MiB) must be off the device at the start of the loss phase
    (save budget 10 MiB: h2 is 6 MiB), so it is offloaded during L2.fwd (8 time units at
    1 MiB per unit) and dropped; it must come back for L1.bwd, and the two frontier steps
    before it (the loss, L2.bwd) last 4 units each. Prefetching half in each hides it: time
    27, no overhead. The model's `ph_one_copy` counts PHold + PBusy of the same round (both
    are 1 in the second phase of a round), so a phantom's prefetch round never spans two
    phases: it prefetches the whole phantom in one step, 4 units longer (31)."""
    return chain("split_round", [1, 1, 6], [[opt("keep", 10, 1, 8)], [opt("keep", 8, 4, 0)]],
                 loss_time=4, grad_mib=[1, 1, 1])


def test_phantom_prefetch_round_over_two_phases():
    g = with_bandwidth(split_round(), MiB)
    best, plan = best_offload_plan(g, 16 * MiB, 10 * MiB)
    assert best == pytest.approx(27)
    assert sum(op.op == "prefetch" and op.layer == "L1" for op in plan.ops) == 2
    _prob, res = solve(g, 16 * MiB, save=10 * MiB, extra=GRID)
    replay(g, res, 16 * MiB, 10 * MiB)
    assert res.objective == pytest.approx(best)


def test_phantom_offload_during_its_backward_is_not_a_plan():
    """Free transfers: offloading L1's phantom while L1.bwd runs costs nothing in the model
    (PW includes t = bwd(j)), so the solver may pick it; the decoded plan then consumes the
    phantom before the offload is waited, which the simulator rejects. Forcing it shows the
    model admits it at the optimum's objective."""
    g = with_bandwidth(chain("one_layer", [1, 1], [[opt("keep", 1, 1, 4)]]), INF)
    _p, free = solve(g, 64 * MiB)
    replay(g, free, 64 * MiB)
    # POfl has no element in the backward's own phase: PW leaves t = bwd(j) out, and naming
    # that element is an error that says which phases there are (a reference outside the
    # domain would be 0, the constraint infeasible)
    from schedlang.language.errors import DataError

    with pytest.raises(DataError, match="'L1.bwd' is not an element of POfl's index 1 "
                                        r"\(its elements: 'loss'\)"):
        solve(g, 64 * MiB, extra='constraint force: POfl["L1.bwd", "L1", "keep"] == 1\n')


def recomputed_reader() -> Graph:
    """2 layers of one option; x (4 MiB) is read only by L1.fwd. At peak 16 MiB the optimum
    (time 25) runs L1.fwd with fast_forward, offloads x during it (free: infinite offload
    bandwidth), prefetches x while L2.bwd runs and recomputes L1.fwd (keep, saving its
    phantom) in the phase of L1.bwd. Keeping x instead is 2 MiB too much while L2.fwd runs.
    The model's DW lets a datum move only in phases t <= one of its readers' index, i.e. no
    later than L1.fwd's phase here: a recomputation of a reader in a later phase is not seen,
    so the model finds no plan at all."""
    g = chain("recomputed_reader", [4, 3, 3], [[opt("keep", 6, 5, 6)], [opt("keep", 2, 4, 8)]],
              loss_time=2, grad_mib=[2, 1, 3])
    g.bandwidths = {"offload": INF, "prefetch": 2 * MiB}
    return g


def lost_contribution() -> Graph:
    """2 layers; L1.bwd ("sel") needs h1. At peak 7 MiB the optimum (time 12) offloads h1
    and L1's phantom while L2.fwd runs, deletes / drops them, and prefetches both while L2.bwd
    runs. The model makes L1.bwd recompute L1.fwd (time 14): a datum read in phase t needs
    S[t, k, d] for each creator k (rockmate's contribution rows), and `contribution_kept`
    carries S only from S or a computation of k in the previous phase, not from an arrival
    (Arr): a prefetched activation is never complete for the model."""
    g = chain("lost_contribution", [1, 1, 3], [[opt("sel", 1, 2, 1, ["out"])],
                                                [opt("keep", 2, 5, 2, bwd_over_mib=1)]],
              loss_time=2, grad_mib=[1, 1, 1])
    g.bandwidths = {"offload": MiB, "prefetch": 2 * MiB}
    return g


@pytest.mark.parametrize("make, peak_mib, best_time, prefetched", [
    (recomputed_reader, 16, 25, "x"),  # a prefetch for a recomputed reader
    (lost_contribution, 7, 12, "h1"),  # a prefetched activation is complete
])
def test_optimum_prefetches(make, peak_mib, best_time, prefetched):
    g = make()
    best, plan = best_offload_plan(g, peak_mib * MiB)
    assert best == pytest.approx(best_time)
    assert any(op.op == "prefetch" and op.data == prefetched for op in plan.ops)
    _prob, res = solve(g, peak_mib * MiB, extra=GRID)
    assert res.status == Status.OPTIMAL
    assert res.objective == pytest.approx(best)


def host_outside_window() -> Graph:
    """2 layers of 2 options, h1.grad pinned (found by a random sweep). h1's last reader is
    L2.bwd, so its DW window ends before the last phase, and `host_memory` (like `host_whole`
    and `prog_done`) reads Host[last(K), d] + Ofl[last(K), d]: out of the window, so 0. The
    host budget then does not count h1: at peak 10 MiB and host 1 MiB the ILP offloads all of
    h1 (2 MiB)."""
    g = chain("host_outside_window", [3, 2, 3],
              [[opt("keep", 4, 2, 4, bwd_over_mib=1), opt("recomp", 2, 4, 0, ["in"])],
               [opt("keep", 5, 5, 4), opt("recomp", 1, 6, 0, ["in"])]],
              loss_time=1, grad_mib=[3, 1, 3])
    next(d for d in g.data if d.name == "h1.grad").pinned = True
    g.bandwidths = {"offload": 2 * MiB, "prefetch": 2 * MiB}
    return g


def test_host_budget_counts_every_datum():
    g = host_outside_window()
    for host in (1 * MiB, 3 * MiB):
        _prob, res = solve(g, 10 * MiB, host=host)
        assert res.status == Status.OPTIMAL
        sim = replay(g, res, 10 * MiB, host=host)
        assert sim.host_peak_bytes <= host
