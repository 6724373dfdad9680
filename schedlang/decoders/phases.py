"""Decoder for phase models with options and phantoms (H-Rockmate): -> compute / delete /
drop_phantom ops in order.

Roles: compute[t, k, o] (k computed with option o in phase t), keep[t, d] (d in memory before
phase t), phantom[t, j, o] (layer j's phantom saved with option o before phase t), delete[t, k, d]
(d deleted right after k in phase t); optional create, memory[t, k] and step_memory[t, k, o, i]
(the peak at each step of a sub-step profile) with memory_unit.
Within a phase, nodes run in the H-graph's order; after each compute, the data the model deletes
there are deleted; at the end of a phase, data not kept into the next phase are deleted and
phantoms not kept are dropped.
"""
from __future__ import annotations

from ..hgraph import FAST_FORWARD, build_hgraph
from ..plan import Op, Plan
from ..units import UNITS


def decode_phases(decl, ir, solution, graph) -> Plan:
    from . import role_values

    R = role_values(decl, ir, solution, "compute")
    P = role_values(decl, ir, solution, "keep")
    Sp = role_values(decl, ir, solution, "phantom")
    D = role_values(decl, ir, solution, "delete")
    U = role_values(decl, ir, solution, "memory", required=False)
    h = build_hgraph(graph)
    order = [k.name for k in h.compute]
    layer_of = {k.name: (k.kind, k.layer) for k in h.compute}
    outputs_of: dict[str, list[str]] = {}
    for c, d in h.creates:
        outputs_of.setdefault(c, []).append(d)
    runs: dict[tuple, str] = {(t, k): o for (t, k, o), v in R.items() if v > 0.5}
    deletes: dict[tuple, list] = {}
    for (t, k, d), v in D.items():
        if v > 0.5:
            deletes.setdefault((t, k), []).append(d)
    data_order = list(h.data)
    live = set(h.inputs)
    phantoms: dict[str, str] = {}  # layer -> option saved
    ops: list[Op] = []
    for i, t in enumerate(order):
        for k in order[: i + 1]:
            o = runs.get((t, k))
            if o is None:
                continue
            kind, layer = layer_of[k]
            ops.append(Op("compute", node=k, option=None if kind == "loss" else o))
            live.update(outputs_of.get(k, ()))
            if kind == "fwd" and o != FAST_FORWARD:
                phantoms[layer] = o
            elif kind == "bwd":
                phantoms.pop(layer, None)
            for d in sorted(deletes.get((t, k), []), key=data_order.index):
                if d in live:
                    ops.append(Op("delete", data=d))
                    live.discard(d)
        nxt = order[i + 1] if i + 1 < len(order) else None
        for d in [d for d in data_order if d in live]:
            if d in h.outputs and nxt is None:
                continue  # input gradients stay: they are what the step computes
            if nxt is None or P.get((nxt, d), 0.0) < 0.5:
                ops.append(Op("delete", data=d))
                live.discard(d)
        for layer, o in list(phantoms.items()):
            if nxt is None or Sp.get((nxt, layer, o), 0.0) < 0.5:
                ops.append(Op("drop_phantom", layer=layer))
                del phantoms[layer]
    peak = None
    if U:
        unit = decl.roles.get("memory_unit")
        scale = unit.value * UNITS.get(unit.unit, 1.0) if unit is not None and hasattr(unit, "value") else 1.0
        top = max(U.values())
        # steps of sub-step profiles count where their option ran
        steps = role_values(decl, ir, solution, "step_memory", required=False) or {}
        ran = [v for (t, k, o, _), v in steps.items() if (t, k) in runs and runs[(t, k)] == o]
        peak = int(round(max([top] + ran) * scale))
    return Plan(graph=graph.name, ops=ops, predicted_peak=peak, predicted_time=solution.objective,
                meta={"decoder": "phases"})
