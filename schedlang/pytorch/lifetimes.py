"""When the hook front end's data die: right after their last use.

The fx plan executor holds every datum itself and frees it at the plan's ``delete``. With the
hook front end the model's own forward runs, and a tensor passed between blocks is freed when
nothing refers to it any more: the model's code has moved on (``hidden = block(hidden)``) and no
saved tensor of autograd holds it (a block whose option saves it keeps it to its backward; one
that recomputes, or offloads what it saved, does not). A plan's ``delete`` there is a
prediction, not an instruction: the solver may place it anywhere after the last use when that
does not change its objective (the least peak among the fastest plans ignores a delete that
is not at the peak's op, and the loss function's memory is added outside the model), and the
prediction then counted a datum the runtime had freed (a block's 32 KiB output through the loss
on GPT-2, Llama, BERT, ViT).

`earliest_deletes` moves each of a per-block plan's deletes right after the datum's last use:
the last op that reads it (a layer's input, or its backward's option ``needs`` it) or creates
it. The plan's computes are unchanged, its memory never higher.
"""
from __future__ import annotations

from ..graph import Graph
from ..plan import Op, Plan

__all__ = ["earliest_deletes"]


def earliest_deletes(plan: Plan, graph: Graph) -> Plan:
    """`plan` (computes and deletes only, each datum deleted once) with each delete right
    after the last compute that uses the datum; a copy, with the plan's budgets and meta. Any
    other plan is returned as is."""
    deleted = [op.data for op in plan.ops if op.op == "delete"]
    if any(op.op not in ("compute", "delete") for op in plan.ops) \
            or len(set(deleted)) != len(deleted):
        return plan
    ha = graph.layered_index()
    last: dict[str, int] = {}
    computes: list[Op] = []
    for op in plan.ops:
        if op.op != "compute":
            continue
        i = ha.index[op.node]
        used = list(ha.uses[i])
        if ha.kind[i] == "bwd":
            names = ha.opt_names[i]
            o = ha.opt_index[i].get(op.option, 0) if len(names) > 1 else 0
            used += ha.opt_uses[i][o]
        used += [d for d, _ in ha.creates[i]]
        for d in used:
            last[ha.data[d]] = len(computes)
        computes.append(op)
    after: list[list[str]] = [[] for _ in range(len(computes) + 1)]
    for name in deleted:  # in the plan's order
        after[last.get(name, -1) + 1].append(name)
    ops = [Op("delete", data=d) for d in after[0]]
    for k, op in enumerate(computes):
        ops.append(op)
        ops += [Op("delete", data=d) for d in after[k + 1]]
    return Plan(graph=plan.graph, ops=ops, budget_peak=plan.budget_peak,
                budget_save=plan.budget_save, meta=dict(plan.meta))
