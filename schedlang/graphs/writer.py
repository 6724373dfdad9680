"""Write a `Graph` (Checkmate view) as ``.sched`` graph data text.

The output looks like::

    # schedlang graph data: 45 nodes, 87 edges
    graph vgg16_train "VGG16 (MLSys)_256_(224, 224, 3)_train" {
      node block1_conv1 time 385 size 3288334336B
      node block1_conv1_grad backward time 385 size 3288334336B
      node "odd/name:0" time 12.5 size 4B
      edge block1_conv1 -> block1_conv2, block1_conv1_grad
    }
    budget peak 14242598093B

Names are written bare when they match ``[A-Za-z_][A-Za-z0-9_]*(\\.[A-Za-z0-9_]+)*`` and are
not a word of the language, else as a double-quoted string with ``\\"`` and ``\\\\`` escapes.
The kind is written only when it is not ``forward``. Times carry no unit when the graph's time
unit is abstract (``time_unit == ""``), else the unit among ``s``, ``ms``, ``us`` that writes the
value best. Sizes are whole bytes followed by ``B``. Edges are grouped by producer, producers
and consumers in node order. The output depends only on the graph (it is deterministic).
"""
from __future__ import annotations

import math
import re
from decimal import Decimal

from ..language.errors import DataError
from .graph import NODE_KINDS, Graph

# the grammar's NAME: each dotted part starts with a letter or _ (blocks.0.out must be quoted)
_BARE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")

#: words of the language (keywords and units) that a bare name must not spell; quoting them
#: costs nothing and keeps the data readable whatever the lexer does with keywords
RESERVED = frozenset("""
    graph node edge budget peak save time size forward backward loss data layer option grad
    input output fwd bwd overhead phantom needs use model set param var expr constraint
    minimize maximize forall sum where in and or not implies max min first next prev last
    binary integer continuous bandwidth pinned host offload prefetch true false segments
    B KB MB GB KiB MiB GiB TiB s ms us ns
""".split())

#: seconds per unit
_UNITS = {"s": 0, "ms": -3, "us": -6}


def quote_name(name: str) -> str:
    """A name as it appears in `.sched` text: bare when possible, else quoted."""
    if not isinstance(name, str) or not name:
        raise DataError(f"cannot write an empty or non-string name ({name!r})")
    if _BARE.fullmatch(name) and name not in RESERVED:
        return name
    return quote_string(name, what="name")


def quote_string(text: str, what: str = "string") -> str:
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise DataError(f"cannot write {what} {text!r}: it holds a control character")
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def format_number(value: float) -> str:
    """Shortest text that reads back as the same float, never in exponent notation."""
    value = float(value)
    if not math.isfinite(value):
        raise DataError(f"cannot write the non-finite number {value!r}")
    if value == 0:
        return "0"
    if value.is_integer() and abs(value) < 2**63:
        return str(int(value))
    return _plain(Decimal(repr(value)))


def _plain(d: Decimal) -> str:
    text = format(d, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text or "0"


def format_time(value: float, time_unit: str) -> str:
    """A time as `.sched` text: bare in abstract units, else with the best of s/ms/us."""
    if time_unit == "":
        return format_number(value)
    if time_unit not in _UNITS:
        raise DataError(f"cannot write times in unit {time_unit!r} (expected s, ms or us)")
    value = float(value)
    if not math.isfinite(value):
        raise DataError(f"cannot write the non-finite time {value!r}")
    if value == 0:
        return "0" + time_unit
    seconds = Decimal(repr(value)).scaleb(_UNITS[time_unit])
    # the largest unit in which the value is at least 1 (us for anything smaller)
    for unit in ("s", "ms", "us"):
        scaled = seconds.scaleb(-_UNITS[unit])
        if abs(scaled) >= 1 or unit == "us":
            return _plain(scaled.normalize()) + unit
    raise AssertionError("unreachable")


def format_size(value: int | float) -> str:
    if isinstance(value, float):
        if not value.is_integer():
            raise DataError(f"cannot write the fractional size {value!r} bytes")
        value = int(value)
    return f"{int(value)}B"


def write_graph(graph: Graph) -> str:
    """The `.sched` graph data text of `graph` (Checkmate view, or layered data)."""
    graph.check_one_vocabulary()
    if graph.is_layered:
        return _write_layered(graph)
    idx = graph.checkmate_index()
    quoted = [quote_name(name) for name in idx.names]
    lines = [f"# schedlang graph data: {idx.n} nodes, {len(idx.edges)} edges"]
    header = f"graph {quote_name(graph.name)}"
    if graph.title:
        header += " " + quote_string(re.sub(r"[\x00-\x1f\x7f]", " ", graph.title),
                                    what="title")
    lines.append(header + " {")
    for node, qname in zip(graph.nodes, quoted):
        if node.kind not in NODE_KINDS:
            raise DataError(f"node '{node.name}' has unknown kind {node.kind!r}", node.loc)
        kind = "" if node.kind == "forward" else f" {node.kind}"
        lines.append(f"  node {qname}{kind} time {format_time(node.time, graph.time_unit)} "
                     f"size {format_size(node.size)}")
    for i, targets in enumerate(idx.succs):
        if targets:
            lines.append(f"  edge {quoted[i]} -> " + ", ".join(quoted[j] for j in targets))
    lines.append("}")
    lines += _budget_lines(graph)
    return "\n".join(lines) + "\n"


def _budget_lines(graph: Graph) -> list[str]:
    lines = [f"budget {kind} {format_size(graph.budgets[kind])}"
             for kind in ("peak", "save", "host") if graph.budgets.get(kind) is not None]
    for kind in ("offload", "prefetch"):
        if kind in graph.bandwidths:
            lines.append(f"bandwidth {kind} {format_rate(graph.bandwidths[kind])}")
    return lines


def format_rate(bps: float) -> str:
    """Bytes per second as .sched text: inf, 0, or an exact number of B/s."""
    if math.isinf(bps):
        return "inf"
    if bps == 0:
        return "0"
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6)):  # a round rate reads as one
        if bps >= scale and float(bps / scale).is_integer():
            return f"{int(bps / scale)}{unit}"
    return f"{bps:.17g}B/s"


def _write_layered(graph: Graph) -> str:
    """Layered graph data: data nodes, layers with options, the loss."""
    unit = graph.time_unit

    def names(items) -> str:
        return "(" + ", ".join(quote_name(n) for n in items) + ")"

    def steps_text(*sides) -> str:
        text = ""
        for side, steps in sides:
            if steps:
                parts = []
                for st in steps:
                    part = format_size(st.overhead)
                    if st.frees:
                        part += f" frees {names(st.frees)}"
                    if st.creates:
                        part += f" creates {names(st.creates)}"
                    parts.append(part)
                text += f"\n        {side} (" + ", ".join(parts) + ")"
        return text

    def segments_text(parts) -> str:
        items = []
        for seg in parts:
            span = f"{seg.first}" if seg.first == seg.last else f"{seg.first}..{seg.last}"
            items.append(f"{seg.kind} {span}"
                         + (" " + segments_text(seg.children) if seg.children else ""))
        return "(" + ", ".join(items) + ")"

    lines = [f"# schedlang graph data: {len(graph.data)} data nodes, {len(graph.layers)} layers"]
    header = f"graph {quote_name(graph.name)}"
    if graph.title:
        header += " " + quote_string(re.sub(r"[\x00-\x1f\x7f]", " ", graph.title), what="title")
    lines.append(header + " {")
    for d in graph.data:
        role = f" {d.role}" if d.role else ""
        pinned = " pinned" if d.pinned else ""
        lines.append(f"  data {quote_name(d.name)} {format_size(d.size)}{role}{pinned}")
    for layer in graph.layers:
        lines.append(f"  layer {quote_name(layer.name)} {names(layer.inputs)} -> {names(layer.outputs)} {{")
        lines.append(f"    grad {names(layer.grad_inputs)} -> {names(layer.grad_outputs)}")
        for o in layer.options:
            text = (f"    option {quote_name(o.name)} fwd {format_time(o.fwd_time, unit)} overhead "
                    f"{format_size(o.fwd_overhead)} bwd {format_time(o.bwd_time, unit)} overhead "
                    f"{format_size(o.bwd_overhead)} phantom {format_size(o.phantom)}")
            if o.needs:
                text += f" needs {names(o.needs)}"
            if o.pinned:
                text += " pinned"
            text += steps_text(("fwd_steps", o.fwd_steps), ("bwd_steps", o.bwd_steps))
            if o.segments is not None:
                text += (f"\n        segments {quote_string(o.segments.signature, 'signature')} "
                         + segments_text(o.segments.parts))
            lines.append(text)
        ff = layer.fast_forward
        if ff is not None:
            lines.append(f"    option fast_forward fwd {format_time(ff.fwd_time, unit)} overhead "
                         f"{format_size(ff.fwd_overhead)}" + steps_text(("fwd_steps", ff.fwd_steps)))
        lines.append("  }")
    if graph.loss is not None:
        lines.append(f"  loss {names(graph.loss.inputs)} -> {names(graph.loss.outputs)} "
                     f"time {format_time(graph.loss.time, unit)}")
    lines.append("}")
    lines += _budget_lines(graph)
    return "\n".join(lines) + "\n"
