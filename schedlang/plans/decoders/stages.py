"""Decoder for stage models (Checkmate): R/S/FREE -> compute and delete ops in order.

Roles: compute[t, v] (v computed in stage t), keep[t, v] (v kept from stage t-1 into t),
free[t, u, v] (u freed right after computing v in stage t); optional memory[t, v] with
memory_unit (the byte size of one unit of memory[t, v]) for the predicted peak.
Within a stage, nodes run in graph order; after each compute, the outputs the model frees there
are deleted; at the end of a stage, whatever is not kept into the next one is deleted.
"""
from __future__ import annotations

from ...language.units import UNITS
from ..plan import Op, Plan
from .roles import role_values


def decode_stages(decl, ir, solution, graph) -> Plan:
    R = role_values(decl, ir, solution, "compute")
    S = role_values(decl, ir, solution, "keep")
    FREE = role_values(decl, ir, solution, "free")
    U = role_values(decl, ir, solution, "memory", required=False)
    order = [n.name for n in graph.nodes]
    position = {name: i for i, name in enumerate(order)}
    frees_after: dict[tuple, list] = {}
    for (t, u, v), val in FREE.items():
        if val > 0.5:
            frees_after.setdefault((t, v), []).append(u)
    ops: list[Op] = []
    live: set[str] = set()
    for i, t in enumerate(order):
        for v in order[: i + 1]:
            if R.get((t, v), 0.0) > 0.5:
                ops.append(Op("compute", node=v))
                live.add(v)
                for u in frees_after.get((t, v), []):
                    if u in live:
                        ops.append(Op("delete", data=u))
                        live.discard(u)
        nxt = order[i + 1] if i + 1 < len(order) else None
        for u in sorted(live, key=position.__getitem__):  # in graph order
            if nxt is None or S.get((nxt, u), 0.0) < 0.5:
                ops.append(Op("delete", data=u))
                live.discard(u)
    peak = None
    if U:
        unit = decl.roles.get("memory_unit")
        scale = unit.value * UNITS.get(unit.unit, 1.0) if unit is not None and hasattr(unit, "value") else 1.0
        peak = int(round(max(U.values()) * scale))
    return Plan(graph=graph.name, ops=ops, budget_peak=None, predicted_peak=peak,
                predicted_time=solution.objective, meta={"decoder": "stages"})
