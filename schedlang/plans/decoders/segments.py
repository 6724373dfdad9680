"""Decoder for segment models (`models/layer_options.sched`): a layer's forward cut into
consecutive segments of op units, each checkpointed (recomputed in the backward) or kept.

Roles: checkpointed[i, j] and kept[i, j] (units i..j form a segment of that kind); optional
piece_checkpointed[i, j] and piece_kept[i, j]: the pieces a checkpointed segment is cut into
(nested checkpoints; `schedlang.pytorch.options.SegmentedLayer`). The
solution is not a plan of the graph (the graph is one layer's op graph): `decode_segments`
returns no plan, and `segments_of` reads the segments for the option generator
(`schedlang.pytorch.options`)."""
from __future__ import annotations

from .roles import role_values


def decode_segments(decl, ir, solution, graph):
    return None


def segments_of(program, ir, solution) -> list[tuple]:
    """[(first unit, last unit, checkpointed)] for the segments, then [(first unit, last unit,
    checkpointed, 1)] for the pieces of the checkpointed ones (when the model has them)."""
    decl = program.decode
    out = []
    for role, ckpt, depth in (("checkpointed", True, ()), ("kept", False, ()),
                              ("piece_checkpointed", True, (1,)), ("piece_kept", False, (1,))):
        values = role_values(decl, ir, solution, role, required=not depth) or {}
        for (i, j), val in values.items():
            if val > 0.5:
                out.append((i, j, ckpt) + depth)
    return out
