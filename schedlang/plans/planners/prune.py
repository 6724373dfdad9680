"""Undo recomputations a plan does not need: keep the earlier copy instead, where it fits.

A plan found without regard to time (the default solve's first phase lowers only the memory
over the budget: `models/extensions/soft_budget.sched`) recomputes more than it must. For each
recomputation, the most expensive first, `prune_recomputations` drops the compute and the
delete of the copy before it (which then lives on to the recomputed copy's delete), and keeps
the change when the simulator replays the plan validly within the budget. Recomputed copies
that nothing reads are dropped first. Every plan it
returns has been replayed; its time never exceeds the given plan's.
"""
from __future__ import annotations

from ...graphs.graph import Graph
from ..plan import Plan
from ..simulate import simulate


def _undo(plan: Plan, k: int) -> Plan | None:
    """`plan` without the recomputation at op k and the delete of the copy before it; None
    when op k is a first computation or the copy before it is not deleted in between."""
    node = plan.ops[k].node
    earlier = [i for i in range(k) if plan.ops[i].op == "compute" and plan.ops[i].node == node]
    if not earlier:
        return None
    deletes = [i for i in range(earlier[-1] + 1, k)
               if plan.ops[i].op == "delete" and plan.ops[i].data == node]
    if len(deletes) != 1:
        return None
    ops = [op for i, op in enumerate(plan.ops) if i not in (k, deletes[0])]
    return Plan(graph=plan.graph, ops=ops, budget_peak=plan.budget_peak,
                budget_save=plan.budget_save, meta=dict(plan.meta))


def _drop_unread(plan: Plan, graph: Graph) -> tuple[Plan, int]:
    """`plan` without the recomputed copies that nothing reads before they are deleted (or
    the plan ends): they only add memory and time."""
    readers: dict[str, list[str]] = {n.name: [] for n in graph.nodes}
    for u, v in graph.edges:
        readers[v].append(u)
    seen: set[str] = set()
    live: dict[str, int] = {}  # node -> index of the compute op of its live copy
    read: set[int] = set()
    drop: set[int] = set()
    for k, op in enumerate(plan.ops):
        if op.op == "compute":
            for u in readers[op.node]:
                if u in live:
                    read.add(live[u])
            live[op.node] = k
            seen.add(op.node)
        elif op.op == "delete" and op.data in live:
            k0 = live.pop(op.data)
            first = all(plan.ops[i].node != op.data for i in range(k0) if plan.ops[i].op == "compute")
            if k0 not in read and not first:
                drop |= {k0, k}
    if not drop:
        return plan, 0
    ops = [op for i, op in enumerate(plan.ops) if i not in drop]
    return (Plan(graph=plan.graph, ops=ops, budget_peak=plan.budget_peak,
                 budget_save=plan.budget_save, meta=dict(plan.meta)), len(drop) // 2)


def prune_recomputations(graph: Graph, plan: Plan, budget: int | None) -> Plan:
    """`plan` with every recomputation that `budget` lets go undone (module docstring). An
    undo that fails stays failed (undos only add memory), so each recomputation is tried
    once: at most one replay per recomputation, plus one per undo."""
    times = {n.name: float(n.time) for n in graph.nodes}
    if not simulate(plan, graph, budget=budget).valid:
        return plan  # (a plan that does not replay within the budget: left as it is)
    current, undone = plan, 0
    failed: set[int] = set()  # id() of the compute ops whose undo did not fit
    waiting: set[int] = set()  # ... whose undo does not apply yet (another may make it apply)
    while True:
        current, dropped = _drop_unread(current, graph)  # never adds memory: stays valid
        undone += dropped
        seen: set[str] = set()
        candidates = []
        for k, op in enumerate(current.ops):
            if op.op == "compute":
                if op.node in seen and id(op) not in failed | waiting:
                    candidates.append(k)
                seen.add(op.node)
        if not candidates:
            break
        k = max(candidates, key=lambda i: times[current.ops[i].node])
        trial = _undo(current, k)
        if trial is None:
            waiting.add(id(current.ops[k]))
        elif simulate(trial, graph, budget=budget).valid:
            current = trial
            undone += 1
            waiting.clear()
        else:
            failed.add(id(current.ops[k]))
    if undone:
        sim = simulate(current, graph, budget=budget)
        current.predicted_time, current.predicted_peak = sim.time, sim.peak_bytes
        current.meta["pruned"] = undone
    return current
