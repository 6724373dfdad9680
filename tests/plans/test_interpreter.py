"""The one walk over a plan's ops (`schedlang.plans.interpreter.PlanInterpreter`) and the
interpreters of the core built on it: the simulator's replays and the allocator's liveness
walks read the same plans the same way (issue 27)."""
from __future__ import annotations

import pytest

from schedlang.plans.allocator import liveness
from schedlang.plans.interpreter import OP_METHODS, PlanInterpreter
from schedlang.plans.layered_replay import LayeredReplay
from schedlang.plans.plan import OP_KINDS, Op, Plan
from schedlang.plans.planners.no_recompute import no_recompute_plan
from schedlang.plans.replay import CheckmateReplay, Replay
from schedlang.plans.simulate import simulate
from schedlang.testing.checkmate_instances import tiny_graphs
from schedlang.testing.layered_instances import chain, opt

# every op kind once, in a layered plan's vocabulary
EVERY_KIND = [Op("compute", node="a.fwd", option="o"), Op("delete", data="x"),
              Op("drop_phantom", layer="a"), Op("offload", data="y", fraction=0.5),
              Op("prefetch", data="y"), Op("wait", channel="prefetch")]


class Recorder(PlanInterpreter):
    """Writes down every call the walk makes."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, str]] = []

    def before_op(self, op: Op) -> None:
        self.calls.append(("before", self.index, op.op))

    def after_op(self, op: Op) -> None:
        self.calls.append(("after", self.index, op.op))


for _kind in OP_KINDS:  # one recording method per kind, named as OP_METHODS says
    setattr(Recorder, OP_METHODS[_kind],
            lambda self, op, kind=_kind: self.calls.append((kind, self.index, op.op)))


def test_every_op_kind_has_a_method_and_the_walk_runs_them_in_order():
    assert sorted(OP_METHODS) == sorted(OP_KINDS)
    rec = Recorder()
    rec.run(EVERY_KIND)
    expected = []
    for k, op in enumerate(EVERY_KIND):
        expected += [("before", k, op.op), (op.op, k, op.op), ("after", k, op.op)]
    assert rec.calls == expected


def test_an_interpreter_ignores_the_kinds_it_does_not_override():
    PlanInterpreter().run(EVERY_KIND)  # every method a no-op by default


def test_an_unknown_op_kind_names_its_op():
    with pytest.raises(ValueError, match=r"op 1: unknown op kind 'teleport'"):
        PlanInterpreter().run([Op("delete", data="x"), Op("teleport")])


def test_the_core_interpreters_share_the_walk():
    assert issubclass(Replay, PlanInterpreter)
    assert issubclass(CheckmateReplay, Replay) and issubclass(LayeredReplay, Replay)


@pytest.mark.parametrize("graph", tiny_graphs() + [chain("layered", [8, 8, 8, 8], [[opt("o", 1, 2, 4)]] * 3)],
                         ids=lambda g: g.name)
def test_simulator_and_allocator_read_the_same_plan(graph):
    """On the no-recomputation plan, the most bytes the allocator's liveness walk finds alive
    at once is the simulator's peak: both interpreters walk the same ops."""
    plan = no_recompute_plan(graph)
    sim = simulate(plan, graph)
    assert sim.valid, sim.errors
    assert liveness(plan, graph).max_live_bytes == sim.peak_bytes


def test_a_view_reports_the_ops_it_does_not_replay():
    graph = tiny_graphs()[0]  # Checkmate view: no phantoms, no transfers
    plan = no_recompute_plan(graph)
    bad = Plan(graph=plan.graph, ops=[*plan.ops, Op("wait", channel="offload")])
    errors = simulate(bad, graph).errors
    assert any(e.startswith(f"op {len(plan.ops)}: wait ops are not supported") for e in errors), errors
