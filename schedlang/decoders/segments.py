"""Decoder for segment models (`models/layer_options.sched`): a layer's forward cut into
consecutive segments of op units, each checkpointed (recomputed in the backward) or kept.

Roles: checkpointed[i, j] and kept[i, j] (units i..j form a segment of that kind). The
solution is not a plan of the graph (the graph is one layer's op graph): `decode_segments`
returns no plan, and `segments_of` reads the segments for the option generator
(`schedlang.pytorch.options`)."""
from __future__ import annotations


def decode_segments(decl, ir, solution, graph):
    return None


def segments_of(program, ir, solution) -> list[tuple[str, str, bool]]:
    """[(first unit, last unit, checkpointed)] in the graph's order."""
    from . import role_values

    decl = program.decode
    out = []
    for role, ckpt in (("checkpointed", True), ("kept", False)):
        for (i, j), val in role_values(decl, ir, solution, role).items():
            if val > 0.5:
                out.append((i, j, ckpt))
    return out
