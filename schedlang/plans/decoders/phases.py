"""Decoder for phase models with options and phantoms (H-Rockmate): -> compute / delete /
drop_phantom ops in order.

Roles: compute[t, k, o] (k computed with option o in phase t), keep[t, d] (d in memory before
phase t), phantom[t, j, o] (layer j's phantom saved with option o before phase t), delete[t, k, d]
(d deleted right after k in phase t); optional create, memory[t, k] and step_memory[t, k, o, i]
(the peak at each step of a sub-step profile) with memory_unit.
Within a phase, nodes run in the H-graph's order; after each compute, the data the model deletes
there are deleted; at the end of a phase, data not kept into the next phase are deleted and
phantoms not kept are dropped.

Offloading models (models/offload.sched) add the roles offload[t, d], prefetch[t, d], arrive[t, d]
(a prefetch round completes at the end of phase t) and their phantom counterparts
phantom_offload / phantom_prefetch / phantom_arrive[t, j, o]; transfers overlap the frontier
node t of phase t. A role may also be indexed by step, [t, k, d] and [t, k, j, o]
(models/offload_steps.sched): transfers overlap node k of phase t. The roles window_offload,
window_prefetch, window_arrive[t, d] and phantom_window_*[t, j, o] (models/offload_windows.sched)
move tensors during a phase's window: issued when the phase starts, waited (and arrived) right
before its frontier compute. A step with transfers
becomes: its transfers (offload / prefetch ops), the compute, a wait for every transfer issued
in it (so the step lasts as long as its slowest channel, like the model's time), then the
arrivals and the step's deletes. Fractions are cleaned of solver noise:
an offload never exceeds what is left of the tensor, and a round's fractions sum to exactly 1.
"""
from __future__ import annotations

from ...graphs.hgraph import FAST_FORWARD
from ...language.units import UNITS
from ..plan import Op, Plan
from .roles import role_values

_EPS = 1e-5  # transfer fractions below this are solver noise (binaries bound them
# within the solver's integrality tolerance, 1e-6 or so)
_WHOLE = 1e-4  # a host copy this close to whole is whole (noise dropped from its parts)


def decode_phases(decl, ir, solution, graph) -> Plan:
    R = role_values(decl, ir, solution, "compute")
    P = role_values(decl, ir, solution, "keep")
    Sp = role_values(decl, ir, solution, "phantom")
    D = role_values(decl, ir, solution, "delete")
    U = role_values(decl, ir, solution, "memory", required=False)
    h = graph.hgraph()
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
    moves = _Transfers(decl, ir, solution)
    data_order = list(h.data)
    live = set(h.inputs)
    phantoms: dict[str, str] = {}  # layer -> option saved
    ops: list[Op] = []
    for i, t in enumerate(order):
        window = moves.issue((t, None), ops)  # a phase's window: from its start to its frontier
        for k in order[: i + 1]:
            o = runs.get((t, k))
            if o is None:
                continue
            kind, layer = layer_of[k]
            if k == t:
                for channel, field, x in window:
                    ops.append(_op_on("wait", field, x, channel=channel))
                _arrive(moves.arrivals((t, None)), live, phantoms)
            # transfers start with the node and the step ends when all three channels are done
            issued = moves.issue((t, k), ops)
            ops.append(Op("compute", node=k, option=None if kind == "loss" else o))
            live.update(outputs_of.get(k, ()))
            if kind == "fwd" and o != FAST_FORWARD:
                phantoms[layer] = o
            elif kind == "bwd":
                phantoms.pop(layer, None)
            for channel, field, x in issued:
                ops.append(_op_on("wait", field, x, channel=channel))
            _arrive(moves.arrivals((t, k)), live, phantoms)
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


def _op_on(op: str, field: str, x: str, channel: str | None = None,
           fraction: float | None = None) -> Op:
    """An op on datum `x` (`field` "data") or on the phantom of layer `x` ("layer")."""
    if field == "data":
        return Op(op, data=x, channel=channel, fraction=fraction)
    return Op(op, layer=x, channel=channel, fraction=fraction)


def _arrive(arrivals, live: set, phantoms: dict) -> None:
    for field, x, jo in arrivals:
        if field == "data":
            live.add(x)
        else:
            phantoms[x] = jo


class _Transfers:
    """The transfer roles of an offloading model, step by step (absent roles: no transfers)."""

    def __init__(self, decl, ir, solution) -> None:
        def values(role):
            return role_values(decl, ir, solution, role, required=False) or {}

        self.offload, self.prefetch, self.arrive = (
            {**_by_step(values(role), values(f"phantom_{role}")),
             **_by_step(values(f"window_{role}"), values(f"phantom_window_{role}"), window=True)}
            for role in ("offload", "prefetch", "arrive"))
        self.host: dict[tuple, float] = {}  # (field, x) -> fraction offloaded so far
        self.round: dict[tuple, float] = {}  # (field, x) -> fraction of the current prefetch round

    def issue(self, step: tuple, ops: list) -> list[tuple[str, str, str]]:
        """Append the offload and prefetch ops of step (t, k); return (channel, field, x) to
        wait for."""
        issued = []
        for field, x, _, v in self.offload.get(step, ()):
            key = (field, x)
            host = self.host.get(key, 0.0)
            f = min(v, 1.0 - host)
            if f > _EPS:
                if host + f > 1.0 - _WHOLE:  # the last part: make the host copy whole
                    f = 1.0 - host
                self.host[key] = host + f
                ops.append(_op_on("offload", field, x, fraction=f))
                issued.append(("offload", field, x))
        arriving = {(field, x) for field, x, _, v in self.arrive.get(step, ()) if v > 0.5}
        for field, x, _, v in self.prefetch.get(step, ()):
            key = (field, x)
            done = self.round.get(key, 0.0)
            # never more than the host holds; a round that ends here sums to exactly 1
            f = 1.0 - done if key in arriving else min(v, self.host.get(key, 0.0) - done)
            if f > _EPS:
                self.round[key] = done + f
                ops.append(_op_on("prefetch", field, x, fraction=f))
                issued.append(("prefetch", field, x))
        for key in arriving:
            rest = 1.0 - self.round.get(key, 0.0)
            if rest > 1e-12 and ("prefetch", *key) not in issued:
                ops.append(Op("prefetch", fraction=rest, **{key[0]: key[1]}))
                issued.append(("prefetch", *key))
            self.round[key] = 0.0
        return issued

    def arrivals(self, step: tuple) -> list[tuple[str, str, str | None]]:
        """(field, x, option of a phantom) on the device from the end of step (t, k)."""
        return [(field, x, o) for field, x, o, v in self.arrive.get(step, ()) if v > 0.5]


def _by_step(data_values: dict, phantom_values: dict, window: bool = False) -> dict:
    """{step (t, k): [(field, x, phantom option or None, value)]} of a transfer role's nonzero
    values: data roles are indexed by (t, d) (the frontier step: k = t) or (t, k, d), phantom
    roles by (t, j, o) or (t, k, j, o). A window role (models/offload_windows.sched) is indexed
    like a frontier one, and its step is (t, None): from the phase's start to its frontier."""
    out: dict = {}
    for key, v in data_values.items():
        if v > _EPS:
            step = (key[0], None if window else key[0]) if len(key) == 2 else key[:2]
            out.setdefault(step, []).append(("data", key[-1], None, v))
    for key, v in phantom_values.items():
        if v > _EPS:
            step = (key[0], None if window else key[0]) if len(key) == 3 else key[:2]
            out.setdefault(step, []).append(("layer", key[-2], key[-1], v))
    return out
