"""Generated options in graph data files: `segments` written by `trace`, rebuilt by the runtime.

A generated option (`schedlang.pytorch.options`: ``ops1``, ``ops2``, ...) runs the layer's aten
graph cut into segments of op units, each kept or checkpointed. Its callable lives in the
process that generated it; the layered graph data keep what rebuilds it::

    option ops1 fwd 1.2ms overhead 40KiB bwd 2.9ms overhead 96KiB phantom 128KiB needs (h1)
        segments "5c0e2b7a91d4f3e8" (keep 0..6, checkpoint 7..15, keep 16..19)

The positions are those of the layer's op units (`schedlang.pytorch.opgraph`: the order in
which `record_ops` groups the aten ops of the layer on its sample inputs); the string is
the signature of that op graph (`units_signature`: its aten ops, shapes and unit boundaries),
so a model that records another op graph (another model, other input shapes, another torch)
is refused with a located error instead of running other cuts. A segment with its own cut in
parentheses recomputes one level deeper: ``(checkpoint 0..19 (keep 0..6, checkpoint 7..19))``
alone is the layer inside one more checkpoint (`SegmentedLayer.nested`); inside a checkpointed
segment, the cut is its pieces (nested checkpoints, `SegmentedLayer`).

* `describe(layer)` -> `Segments` (graph data) of a `SegmentedLayer`; `trace` writes it;
* `build(og, module, segments)` -> the `SegmentedLayer` of a description;
* `register(part, graph)` rebuilds every option of `graph` that has segments and no callable
  yet into ``part.op_options`` (what the runtime runs): `fit` does it when it is given layered
  graph data (read from a file by `schedlang run --graph`), recording each distinct layer's op
  graph once.
"""
from __future__ import annotations

import hashlib

from ....graphs.elements import Segment, Segments
from ....graphs.graph import Graph
from ....language.errors import DataError, Loc
from ...opgraph import record_ops
from ...options import layer_inputs
from ...segmented import SegmentedLayer

__all__ = ["build", "describe", "register", "units_signature"]

WHERE = Loc("segments")


def units_signature(og) -> str:
    """The structure signature of an `OpGraph` that segment positions refer to."""
    cuts = ",".join(str(len(u.nodes)) for u in og.units)
    return hashlib.sha1(f"{og.signature}|{cuts}".encode()).hexdigest()[:16]


def describe(layer) -> Segments:
    """The `Segments` of a `SegmentedLayer` (positions in its op graph's unit order)."""
    og = layer.og
    unit_of = {n: k for k, u in enumerate(og.units) for n in u.nodes}

    def parts(segments) -> list[Segment]:
        # a segment is (nodes, checkpointed), or (nodes, checkpointed, its own cut)
        return [Segment("checkpoint" if seg[1] else "keep", unit_of[seg[0][0].name],
                        unit_of[seg[0][-1].name], parts(seg[2]) if len(seg) > 2 else [])
                for seg in segments]

    out = parts(layer.segments)
    if layer.nested:
        out = [Segment("checkpoint", 0, len(og.units) - 1, out)]
    return Segments(units_signature(og), out)


def _flat(parts: list[Segment]) -> list[Segment]:
    """A kept segment's own cut runs as if it were written in its place."""
    out = []
    for seg in parts:
        if seg.kind == "keep" and seg.children:
            out += _flat(seg.children)
        else:
            out.append(seg)
    return out


def build(og, module, segments: Segments, what: str = "the option"):
    """The `SegmentedLayer` that runs `segments` on the layer `module` whose op graph is `og`;
    DataError (located at the segments) when they do not fit that op graph or nest in a way
    the runtime does not run. One checkpoint around all units with a cut inside is the
    layer run `nested`."""

    where = segments.loc or WHERE
    n = len(og.units)
    sig = units_signature(og)
    if segments.signature != sig:
        raise DataError(f"{what} was generated on another op graph (signature "
                        f"\"{segments.signature}\"): this model's layer records {n} op units "
                        f"with signature \"{sig}\" (another model, other input shapes, another "
                        "device or torch version); trace the model again", where)

    def check(parts: list[Segment]) -> None:
        for seg in parts:
            if seg.last >= n:
                raise DataError(f"{what} names op unit {seg.last}, but the layer has {n} op "
                                f"units (0..{n - 1})", seg.loc or where)
            check(seg.children)

    check(segments.parts)
    end = segments.parts[-1].last if segments.parts else -1
    if end != n - 1:
        raise DataError(f"the segments of {what} end at op unit {end}; the layer's forward has "
                        f"{n} op units (0..{n - 1}): they must cover all of them", where)
    nodes = {node.name: node for node in og.gm.graph.nodes}

    def runs(parts: list[Segment]) -> list[tuple]:
        out = []
        for seg in _flat(parts):
            ns = [nodes[x] for u in og.units[seg.first:seg.last + 1] for x in u.nodes]
            ckpt = seg.kind == "checkpoint"
            out.append((ns, ckpt, runs(seg.children)) if seg.children else (ns, ckpt))
        return out

    parts = _flat(segments.parts)
    nested = len(parts) == 1 and bool(parts[0].children)  # a checkpoint around all units
    found = runs(parts[0].children if nested else parts)
    deep = next((seg for seg in parts if seg.children), None) if not nested else \
        next((seg for seg in _flat(parts[0].children) if seg.children), None)
    try:
        return SegmentedLayer(og, module, found, nested)
    except (ValueError, TypeError):
        if deep is None:
            raise
        # a SegmentedLayer that takes segments as (nodes, checkpointed) only
        raise DataError(f"{what}: this runtime runs a segment's own cut only as the whole "
                        "layer's (one checkpoint around all units, its cut inside); segment "
                        f"{deep.first}..{deep.last} has one", deep.loc or where) from None


def register(part, graph: Graph) -> int:
    """Rebuild into ``part.op_options`` every option of `graph` with segments and no callable
    registered yet (module docstring); returns how many. DataError, located at the option,
    when one does not fit the model."""
    registry = getattr(part, "op_options", None)
    if registry is None:
        registry = part.op_options = {}
    todo = [(lay, o) for lay in graph.layers for o in lay.options
            if o.segments is not None and o.name not in registry.get(lay.name, {})]
    if not todo:
        return 0

    values_of = layer_inputs(part)
    recorded: dict = {}  # identical layers are recorded once
    for lay, o in todo:
        what = f"option '{o.name}' of layer '{lay.name}'"
        try:
            layer = part.layer(lay.name)
        except KeyError:
            raise DataError(f"{what}: '{lay.name}' is not a layer of this model (its layers: "
                            f"{', '.join(p.name for p in part.layers)})",
                            o.loc or WHERE) from None
        values = values_of[lay.name]
        requires = [f"{d}.grad" in lay.grad_outputs for d in layer.inputs]
        key = (layer.signature, tuple(tuple(v.shape) for v in values), tuple(requires))
        if key not in recorded:
            recorded[key] = record_ops(layer.module, values, requires, repeats=1)
        registry.setdefault(lay.name, {})[o.name] = build(recorded[key], layer.module,
                                                          o.segments, what)
    return len(todo)
