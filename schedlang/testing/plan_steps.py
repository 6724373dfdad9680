"""Plans written by hand in a one-letter shorthand, one op per line, for the simulator tests:

    c NODE [OPTION]        compute             d DATA        delete
    p LAYER                drop_phantom        w CHANNEL [TARGET]    wait
    o TARGET [FRACTION]    offload             f TARGET [FRACTION]   prefetch

where TARGET is `d:DATA` or `l:LAYER`."""
from __future__ import annotations

from schedlang.plans.plan import Op, Plan

#: in every plan of the tiny transformer (layered_instances.TINY_TEXT) that keeps h1: the loss,
#: then block2's backward
TINY_LOSS_AND_BLOCK2_BACKWARD = """c loss
d h2
d loss
c block2.bwd autograd
d h2.grad"""


def _target(text: str) -> dict:
    kind, name = text.split(":", 1)
    return {"data": name} if kind == "d" else {"layer": name}


def _op(parts: list[str]) -> Op:
    head = parts[0]
    if head == "c":
        return Op("compute", node=parts[1], option=parts[2] if len(parts) > 2 else None)
    if head == "d":
        return Op("delete", data=parts[1])
    if head == "p":
        return Op("drop_phantom", layer=parts[1])
    if head in ("o", "f"):
        fraction = float(parts[2]) if len(parts) > 2 else None
        return Op("offload" if head == "o" else "prefetch", fraction=fraction, **_target(parts[1]))
    if head == "w":
        return Op("wait", channel=parts[1], **(_target(parts[2]) if len(parts) > 2 else {}))
    raise ValueError(f"unknown step {' '.join(parts)!r}")


def plan_of(steps: str, graph: str = "tiny_transformer", **kw) -> Plan:
    """The plan of `steps` (the shorthand above) on `graph`."""
    ops = [_op(line.split()) for line in steps.strip().splitlines() if line.split()]
    return Plan(graph=graph, ops=ops, **kw)
