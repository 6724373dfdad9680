"""The no-recomputation plan: the reference every budget fraction and planner is measured by.

* Checkmate view: every node once in topological order, each output deleted right after its
  last consumer ran (a node without consumers right after it is computed);
* layered view: the autograd-like plan (`no_recompute_layered`).

`no_recompute_peak(graph)` is its simulated peak, the 100% of ``--budget 80%``. The planner
registry lists this plan as ``no_recompute`` (`schedlang.plans.planners.baselines`).
"""
from __future__ import annotations

from ...graphs.graph import Graph
from ...language.errors import DataError
from ..plan import Op, Plan
from ..simulate import replay


def no_recompute_plan(graph: Graph) -> Plan:
    """Compute every node once in topological order; free each output after its last use.

    An output is deleted right after its last consumer ran; a node without consumers is
    deleted right after it is computed. Raises `DataError` when the graph's node list is not
    in topological order. A layered graph gets its autograd-like plan (`no_recompute_layered`).
    """
    if graph.is_layered:
        return no_recompute_layered(graph)
    idx = graph.checkmate_index(topological=True)
    names = idx.names
    # the last consumer of each output (position in node order)
    freed_after: list[list[int]] = [[] for _ in names]
    for i, s in enumerate(idx.succs):
        freed_after[s[-1] if s else i].append(i)
    ops: list[Op] = []
    live = 0
    peak = 0
    total = 0.0
    for i, name in enumerate(names):
        ops.append(Op("compute", node=name))
        live += idx.size[i]
        peak = max(peak, live)
        total += idx.time[i]
        for j in sorted(freed_after[i]):
            ops.append(Op("delete", data=names[j]))
            live -= idx.size[j]
    return Plan(graph=graph.name, ops=ops, predicted_peak=peak, predicted_time=total,
                meta={"planner": "no_recompute"})


def no_recompute_layered(graph: Graph) -> Plan:
    """The autograd-like plan of a layered graph, without recomputation.

    Forwards in layer order with the layer's first option, the loss, backwards in reverse
    order with the same option; each datum is deleted right after the last compute that reads
    or creates it (an input after its last reader, before anything when nothing reads it), an
    ``output`` never; phantoms are consumed by their backward. Raises `DataError` when the
    layered data is inconsistent.
    """
    ha = graph.layered_index()
    # (compute node, option) in H-graph order; option 0: the layer's first, the loss's only one
    steps: list[tuple[int, int]] = [(i, 0) for i in range(len(ha.names))]
    last = [-2] * len(ha.data)  # -2: never touched; -1: delete before the first step
    for d in ha.inputs:
        last[d] = -1
    for p, (i, o) in enumerate(steps):
        for d in ha.uses[i] + (ha.opt_uses[i][o] if ha.kind[i] == "bwd" else ()):
            last[d] = p
        for d, _ in ha.creates[i]:
            last[d] = p
    outputs = set(ha.outputs)
    freed_after: list[list[int]] = [[] for _ in range(len(steps) + 1)]
    for d, p in enumerate(last):
        if p >= -1 and d not in outputs:
            freed_after[p + 1].append(d)
    ops: list[Op] = [Op("delete", data=ha.data[d]) for d in freed_after[0]]
    for p, (i, o) in enumerate(steps):
        option = None if len(ha.opt_names[i]) == 1 else ha.opt_names[i][o]
        ops.append(Op("compute", node=ha.names[i], option=option))
        ops += [Op("delete", data=ha.data[d]) for d in freed_after[p + 1]]
    plan = Plan(graph=graph.name, ops=ops, meta={"planner": "no_recompute"})
    out = _replayed(plan, graph)
    plan.predicted_peak = out.peak
    plan.predicted_time = out.time
    return plan


def no_recompute_peak(graph: Graph) -> int:
    """Simulated peak of `no_recompute_plan(graph)`: the reference for budget fractions."""
    return _replayed(no_recompute_plan(graph), graph).peak


def _replayed(plan: Plan, graph: Graph):
    out = replay(plan, graph)
    if out.errors:  # cannot happen for a consistent, topologically ordered graph
        raise DataError(f"graph '{graph.name}': the no-recomputation plan does not replay: "
                        f"{out.errors[0]}", graph.loc)
    return out
