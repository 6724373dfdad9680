"""Offloading an accumulated gradient part-way through its accumulation (models/offload.sched,
the simulator's partial host copies).

A skip connection makes a gradient with two contributions, one early in the backward and one
late; the partial sum waits in between. In `long_skip`, a.grad (8 MiB, everything else 1 MiB)
gets D.bwd's contribution first and B.bwd's after C3.bwd, C2.bwd and C1.bwd, and C2.bwd needs
8 MiB of workspace: offloaded during C3.bwd and prefetched during C1.bwd, a.grad is off the
device while C2.bwd runs. With a.grad pinned (what the model did before gradients could move),
the same budgets cost recomputation or are infeasible.
"""
from __future__ import annotations

import copy

import pytest

from schedlang.graphs.elements import DataNode, Layer, Loss
from schedlang.graphs.graph import Graph
from schedlang.plans.plan import Op, Plan
from schedlang.plans.simulate import simulate
from schedlang.solve.solution import Status
from schedlang.testing.layered_instances import MiB, opt, resolved

from .offload_cases import replay, solve


def long_skip(bandwidth: float = 8 * MiB) -> Graph:
    g = Graph("long_skip")
    g.data.append(DataNode("x", MiB, "input"))
    g.data += [DataNode(n, MiB) for n in ("a", "b", "c1", "c2", "c3", "d", "loss")]
    g.data += [DataNode(f"{n}.grad", (8 if n == "a" else 1) * MiB)
               for n in ("d", "c3", "c2", "c1", "b", "a")]
    g.data.append(DataNode("x.grad", MiB, "output"))
    spec = [("A", ["x"], "a"), ("B", ["a"], "b"), ("C1", ["b"], "c1"), ("C2", ["c1"], "c2"),
            ("C3", ["c2"], "c3"), ("D", ["c3", "a"], "d")]
    for name, ins, out in spec:
        grads = [f"{i}.grad" for i in ins]
        names = {"in": ins, "out": [out], "gin": [f"{out}.grad"], "gout": grads}
        o = opt("keep", 1, 2, 1, bwd_over_mib=8 if name == "C2" else 0)
        g.layers.append(Layer(name, ins, [out], [f"{out}.grad"], grads, [resolved(o, names)]))
    g.loss = Loss(["d"], ["loss", "d.grad"], 1)
    g.bandwidths = {"offload": bandwidth, "prefetch": bandwidth}
    return g


def pinned_grad(g: Graph) -> Graph:
    p = copy.deepcopy(g)
    next(d for d in p.data if d.name == "a.grad").pinned = True
    return p


@pytest.mark.parametrize("peak_mib", [19, 12])
def test_offloading_a_partial_gradient_pays(peak_mib):
    g = long_skip()
    peak = peak_mib * MiB
    _p, res = solve(g, peak)
    _p, ref = solve(pinned_grad(g), peak)
    assert res.status == Status.OPTIMAL
    replay(g, res, peak)
    assert ref.status == Status.INFEASIBLE or res.objective < ref.objective - 0.5
    # a.grad leaves between its two contributions and comes back before the second
    ops = [(op.op, op.node or op.data) for op in res.plan.ops]
    first = ops.index(("compute", "D.bwd"))
    second = ops.index(("compute", "B.bwd"))
    assert first < ops.index(("offload", "a.grad")) < ops.index(("prefetch", "a.grad")) < second


# ---------------------------------------------------------------------- the simulator's rules
def ops_of(text: str) -> list[Op]:
    out = []
    for line in text.strip().splitlines():
        kind, _, arg = line.strip().partition(" ")
        if kind == "compute":
            out.append(Op("compute", node=arg, option=None if arg == "loss" else "keep"))
        elif kind in ("delete",):
            out.append(Op(kind, data=arg))
        elif kind == "drop":
            out.append(Op("drop_phantom", layer=arg))
        elif kind in ("offload", "prefetch"):
            out.append(Op(kind, data=arg))
        elif kind == "wait":
            ch, _, x = arg.partition(" ")
            out.append(Op("wait", channel=ch, data=x))
    return out


FORWARD = """
compute A.fwd
compute B.fwd
compute C1.fwd
compute C2.fwd
compute C3.fwd
compute D.fwd
compute loss
delete d
delete loss
compute D.bwd
delete d.grad
"""
BACKWARD = """
compute C3.bwd
delete c3.grad
compute C2.bwd
delete c2.grad
compute C1.bwd
delete c1.grad
"""
TAIL = """
compute B.bwd
delete b.grad
compute A.bwd
delete a.grad
"""


def sim(text: str):
    g = long_skip()
    return simulate(Plan(graph=g.name, ops=ops_of(text)), g, budget=2**40, save_budget=2**40)


def test_a_partial_gradient_comes_back_with_its_contributions():
    res = sim(FORWARD + "offload a.grad\nwait offload a.grad\ndelete a.grad\n" + BACKWARD
              + "prefetch a.grad\nwait prefetch a.grad\n" + TAIL)
    assert res.valid, res.errors


def test_the_late_contribution_is_still_needed_after_the_prefetch():
    # B.bwd's contribution is not in the host copy: A.bwd reads an incomplete a.grad without it
    res = sim(FORWARD + "offload a.grad\nwait offload a.grad\ndelete a.grad\n" + BACKWARD
              + "prefetch a.grad\nwait prefetch a.grad\ncompute A.bwd\n")
    assert not res.valid
    assert any("incomplete" in e and "B.bwd" in e for e in res.errors), res.errors


def test_accumulating_while_the_offload_reads_the_gradient_is_an_error():
    res = sim(FORWARD + "offload a.grad\n" + BACKWARD + "compute B.bwd\nwait offload a.grad\n")
    assert any("adds its contribution to 'a.grad'" in e and "not waited" in e
               for e in res.errors), res.errors


def test_a_host_copy_holds_the_contributions_of_one_device_copy():
    g = long_skip()
    # half offloaded with D.bwd's contribution, the other half after B.bwd added its own
    ops = ops_of(FORWARD + BACKWARD + TAIL.split("compute A.bwd")[0])
    k = [i for i, op in enumerate(ops) if op.op == "compute" and op.node == "D.bwd"][0]
    ops[k + 1:k + 1] = [Op("offload", data="a.grad", fraction=0.5),
                        Op("wait", channel="offload", data="a.grad")]
    ops += [Op("offload", data="a.grad", fraction=0.5),
            Op("wait", channel="offload", data="a.grad")]
    res = simulate(Plan(graph=g.name, ops=ops), g, budget=2**40, save_budget=2**40)
    assert any("host copy holds other contributions" in e for e in res.errors), res.errors


@pytest.mark.parametrize("model", ["offload_windows", "offload_steps"])
def test_the_variants_move_partial_gradients_too(model):
    """The window and per-step models (relaxations of offload.sched) reach at least its
    optimum here, and their plans replay."""
    g = long_skip()
    _p, ref = solve(g, 12 * MiB)
    _p, res = solve(g, 12 * MiB, model=model)
    assert res.status == Status.OPTIMAL
    replay(g, res, 12 * MiB)
    assert res.objective <= ref.objective * (1 + 1e-6)
