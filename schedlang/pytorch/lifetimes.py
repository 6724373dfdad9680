"""When data die at run time: right after their last use, where the plan cannot hold them.

The fx plan executor holds every datum itself and frees it at the plan's ``delete``, with one
exception: a model output its backward part never reads is handed to the caller at the end
of the forward (`runtime.PlanExecutor.handed_over`), and a loop that releases the outputs
(`fit(outputs_held=False)`) frees it once the loss is computed. With the hook front end the
model's own forward runs, and a tensor passed between blocks is freed when nothing refers to it
any more: the model's code has moved on (``hidden = block(hidden)``) and no saved tensor of
autograd holds it (a block whose option saves it keeps it to its backward; one that recomputes,
or offloads what it saved, does not). There a plan's ``delete`` is a prediction, not an
instruction: the solver may place it anywhere after the last use, or leave it out, when that
does not change its objective (the least peak among the fastest plans ignores a delete that is
not at the peak's op, and the loss function's memory is added outside the model), and the
prediction then counted a datum the runtime had freed (a block's 32 KiB output through the loss
on GPT-2, Llama, BERT, ViT; Llama's logits in a loop that releases them).

`earliest_deletes` moves the deletes of such data right after their last use — the last op
that reads it (a layer's input, a backward whose option ``needs`` it) or creates it — and
adds the missing ones (never for a datum of role ``output``, which must be live at
the end). The plan's computes are unchanged, its memory never higher.
"""
from __future__ import annotations

from ..graphs.graph import Graph
from ..plans.plan import Op, Plan

__all__ = ["earliest_deletes"]


def earliest_deletes(plan: Plan, graph: Graph, only: set[str] | None = None) -> Plan:
    """A copy of `plan` in which each datum of `only` (default: every datum) is deleted right
    after its last use, with the plan's budgets and meta; a datum the plan deletes more than
    once (recomputed) or moves to the host keeps its deletes. Returns `plan` itself when
    nothing moves."""
    ha = graph.layered_index()
    roles = {d.name: d.role for d in graph.data}
    count: dict[str, int] = {}
    moved: set[str] = set()  # data with transfers: their deletes wait for them, as planned
    for op in plan.ops:
        if op.op == "delete":
            count[op.data] = count.get(op.data, 0) + 1
        elif op.op in ("offload", "prefetch", "wait") and op.data:
            moved.add(op.data)
    targets = {d for d in (only if only is not None else roles)
               if d not in moved and count.get(d, 0) <= 1
               and (count.get(d) or roles.get(d) != "output")}
    last: dict[str, int] = {}
    kept: list[Op] = []
    for op in plan.ops:
        if op.op == "delete" and op.data in targets:
            continue
        for d in _used(op, ha):
            last[d] = len(kept)
        kept.append(op)
    after: list[list[str]] = [[] for _ in range(len(kept) + 1)]
    order = [op.data for op in plan.ops if op.op == "delete" and op.data in targets]
    order += sorted(d for d in targets if d not in count and d in last)
    for d in order:
        after[last.get(d, -1) + 1].append(d)
    ops = [Op("delete", data=d) for d in after[0]]
    for k, op in enumerate(kept):
        ops.append(op)
        ops += [Op("delete", data=d) for d in after[k + 1]]
    if ops == plan.ops:
        return plan
    return Plan(graph=plan.graph, ops=ops, budget_peak=plan.budget_peak,
                budget_save=plan.budget_save, meta=dict(plan.meta))


def _used(op: Op, ha) -> list[str]:
    """The data `op` reads or creates (a compute)."""
    if op.op == "compute":
        i = ha.index[op.node]
        used = list(ha.uses[i])
        if ha.kind[i] == "bwd":
            names = ha.opt_names[i]
            used += ha.opt_uses[i][ha.opt_index[i].get(op.option, 0) if len(names) > 1 else 0]
        used += [d for d, _ in ha.creates[i]]
        return [ha.data[d] for d in used]
    return []
