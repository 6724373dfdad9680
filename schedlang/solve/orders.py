"""Node orders of the stage model: which problem a plan and a proven bound are for.

Checkmate's stage model (`models/checkmate.sched`) takes the graph's node list as the order of
first computations: stage t ends with the first computation of node t. Its optimum, and every
bound of it (the solvers', `window_bound`), hold for plans in that order only; a plan that
computes the nodes for the first time in another topological order may be faster (the traced
`tiny` op graph at 70%: planner shift's order with recompute_gaps, 0.000850, below every plan
of the traced order seen in 300 s). The default solve's op-graph route picks the order
(`schedlang.solve.strategy`) and says which one its result is for (`Route.order`).
"""
from __future__ import annotations

from dataclasses import replace

from ..graphs.graph import Graph
from ..plans.plan import Plan

#: the names `Route.order` uses
GRAPH_ORDER = "graph"
SHIFT_ORDER = "shift"
#: the order of the first computations of the order-free model's plan (`solve.order_free`)
SEQUENCE_ORDER = "sequence"


def first_computations(plan: Plan) -> list[str]:
    """The nodes in the order of their first computation in `plan`."""
    return list(dict.fromkeys(op.node for op in plan.ops if op.op == "compute" and op.node))


def in_order(graph: Graph, order: list[str]) -> Graph | None:
    """`graph` with its nodes listed in `order` (the same nodes, edges and budgets: the stage
    model in that order), or None when `order` is not a topological order of all its nodes."""
    by_name = {n.name: n for n in graph.nodes}
    if sorted(order) != sorted(by_name):
        return None
    position = {x: i for i, x in enumerate(order)}
    if any(position[u] >= position[v] for u, v in graph.edges):
        return None
    return replace(graph, nodes=[by_name[x] for x in order], edges=list(graph.edges),
                   budgets=dict(graph.budgets))


def describe(order: str) -> str:
    """How a result says which stage model its bound is for."""
    if order == GRAPH_ORDER:
        return "the stage model in the graph's node order"
    if order == SEQUENCE_ORDER:
        return ("the stage model in the node order of the order-free model's plan "
                "(models/sequence.sched)")
    return f"the stage model in planner {order}'s node order"
