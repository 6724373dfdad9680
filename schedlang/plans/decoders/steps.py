"""Decoder and encoder for step models (`models/sequence.sched`): one computation per step.

Roles: compute[s, v] (v computed at step s, at most one v per step), keep[s, v] (v's output
resident after step s); optional memory_unit for the predicted peak (the model's own count:
what is resident before a step plus the output it computes).

Decoding: the steps in order; each computes its node, then deletes every live output not
resident after it. Encoding (a plan -> a MIP start): step s is the plan's s-th computation
(computations of an output nothing reads before it is replaced are left out: the model has no
such wasted step, and the plan without them is faster and uses no more memory), and
keep[s, v] is 1 when the copy of v live after step s is read by a later computation before it
is deleted or replaced (a copy nothing reads again is left out: the model frees eagerly, and
counting less memory than the plan keeps the start feasible whenever the plan fits).
"""
from __future__ import annotations

import numpy as np

from ..plan import Op, Plan
from .encode import NotEncodable, check_point, complete_point, role_family
from .roles import role_values


def decode_steps(decl, ir, solution, graph) -> Plan:
    C = role_values(decl, ir, solution, "compute")
    K = role_values(decl, ir, solution, "keep")
    computes: dict[int, str] = {}
    for (s, v), val in C.items():
        if val > 0.5:
            computes[int(s)] = v
    resident = {(int(s), v) for (s, v), val in K.items() if val > 0.5}
    size = {n.name: n.size for n in graph.nodes}
    position = {n.name: i for i, n in enumerate(graph.nodes)}
    ops: list[Op] = []
    live: set[str] = set()
    peak = 0
    for s in sorted(computes):
        v = computes[s]
        peak = max(peak, sum(size[u] for u in live) + size[v])
        ops.append(Op("compute", node=v))
        live.add(v)
        for u in sorted(live, key=position.__getitem__):
            if (s, u) not in resident:
                ops.append(Op("delete", data=u))
                live.discard(u)
    return Plan(graph=graph.name, ops=ops, budget_peak=None,
                predicted_peak=peak if decl.roles.get("memory_unit") is not None else None,
                predicted_time=solution.objective, meta={"decoder": "steps"})


def step_count(decl, ir) -> int:
    """The step model's number of steps: the largest step of its `compute` role."""
    return max((int(key[0]) for key in role_family(decl, ir, "compute").keys), default=0)


def plan_space(decl, ir) -> str:
    """What a step model's status, bound and gap are for: plans of at most as many
    computations as it has steps, not every plan."""
    try:
        steps = step_count(decl, ir)
    except NotEncodable:
        return ""
    return (f"status, bound and gap are for plans of at most {steps} computations (the "
            f"model's steps), in any order")


def step_computations(plan: Plan, graph) -> tuple[list[str], list[set[str]]]:
    """(the plan's computations in order, for each the outputs a later computation reads from
    the copy live after it), computations whose output is never read left out. Raises
    `NotEncodable` for a plan the step model cannot express."""
    if graph.is_layered:
        raise NotEncodable(f"graph '{graph.name}' is layered data; the step encoder works on "
                           f"node/edge graphs")
    known = {n.name for n in graph.nodes}
    preds: dict[str, list[str]] = {}
    for u, v in graph.edges:
        preds.setdefault(v, []).append(u)
    order: list[str] = []
    for k, op in enumerate(plan.ops):
        if op.op == "compute":
            node = op.node
            if node is None or node not in known or op.option is not None:
                raise NotEncodable(f"op {k}: compute '{node}' is not a Checkmate node")
            order.append(node)
        elif op.op != "delete":
            raise NotEncodable(f"op {k}: a '{op.op}' op has no counterpart in the step model")
    read = {u for u, _ in graph.edges}
    while True:
        needed = _needed_after(order, preds)
        # a computation of an output something reads, which nothing reads before it is
        # replaced or the plan ends, is left out (the model has no such step: it is wasted)
        wasted = [s for s, v in enumerate(order) if v in read and v not in needed[s]]
        if not wasted:
            return order, needed
        order = [v for s, v in enumerate(order) if s not in set(wasted)]


def _needed_after(order: list[str], preds: dict[str, list[str]]) -> list[set[str]]:
    """For each step, the outputs a later step reads before the step that recomputes them
    (backwards; a deletion before that read would make the plan invalid anyway)."""
    needed: list[set[str]] = [set() for _ in order]
    pending: set[str] = set()
    for s in range(len(order) - 1, -1, -1):
        needed[s] = set(pending)
        pending.discard(order[s])
        pending.update(preds.get(order[s], ()))
    return needed


def encode_steps(decl, ir, plan: Plan, graph) -> np.ndarray:
    fC = role_family(decl, ir, "compute")
    fK = role_family(decl, ir, "keep")
    order, needed = step_computations(plan, graph)
    steps = step_count(decl, ir)
    if len(order) > steps:
        raise NotEncodable(f"the plan has {len(order)} computations; the model has {steps} "
                           f"steps (a higher `param recomputations` makes room)")
    on = {(s + 1, v) for s, v in enumerate(order)}
    x = np.zeros(ir.n_columns)
    for fam, chosen in ((fC, on), (fK, {(s + 1, v) for s in range(len(order))
                                        for v in needed[s]})):
        keys = [(int(key[0]), key[1]) for key in fam.keys]
        for j, key in enumerate(keys):
            x[fam.offset + j] = float(key in chosen)
        missing = chosen - set(keys)
        if missing:  # (a computation before its ancestors': the plan is invalid)
            s, v = min(missing)
            raise NotEncodable(f"step {s}: the step model has no column for '{v}' there")
    # variables that play no role (an extension's): 0, else completed by HiGHS
    others = [fam for fam in ir.variables if fam.name not in (fC.name, fK.name)]
    for fam in others:
        x[fam.offset: fam.offset + fam.size] = np.clip(0.0, fam.lb, fam.ub)
    if others and not check_point(ir, x)[0]:
        x = complete_point(ir, x, [fC, fK])
    return x
