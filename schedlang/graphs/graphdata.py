"""Graph data declarations (AST) -> `Graph`, with every data check located in the source.

Checks: duplicate and unknown names (with did-you-mean), units (a time where a size is due
and the reverse; one time convention per graph), negative sizes/times, cycles, budgets.
"""
from __future__ import annotations

import math

import networkx as nx

from ..language import ast
from ..language.errors import DataError, Loc, did_you_mean
from ..language.parser import name_loc
from ..language.units import SIZE_UNITS, TIME_UNITS, dimension, exact_bytes, format_size
from .elements import SEGMENT_KINDS, DataNode, Layer, Loss, Node, Option, Segment, Segments, Step
from .graph import Graph
from .hgraph import FAST_FORWARD


def _size(v: ast.Value | None, what: str, default: int | None = None) -> int:
    if v is None:
        if default is None:
            raise DataError(f"{what} needs a size", None)
        return default
    if v.unit and v.unit not in SIZE_UNITS:
        raise DataError(f"{what} must be a size (B, KiB, MiB, GiB, ...), not a {dimension(v.unit)} "
                        f"('{v.text}')", v.loc)
    if v.value < 0:
        raise DataError(f"{what} cannot be negative ('{v.text}')", v.loc)
    try:  # exact, from the literal's text: sizes near 2^63 keep every byte
        return exact_bytes(v.text[:len(v.text) - len(v.unit)], v.unit)
    except ValueError as exc:
        raise DataError(f"{what}: {exc}", v.loc) from None


class _Times:
    """All times of a graph follow one convention: with units (-> seconds) or without."""

    def __init__(self) -> None:
        self.first: ast.Value | None = None

    def __call__(self, v: ast.Value | None, what: str) -> float:
        if v is None:
            return 0.0
        if v.unit and v.unit not in TIME_UNITS:
            raise DataError(f"{what} must be a time (s, ms, us), not a {dimension(v.unit)} ('{v.text}')", v.loc)
        if v.value < 0:
            raise DataError(f"{what} cannot be negative ('{v.text}')", v.loc)
        if not math.isfinite(v.value * TIME_UNITS.get(v.unit, 1.0)):
            raise DataError(f"{what} must be a finite number, not '{v.text}' (too large for a "
                            "float)", v.loc)
        if self.first is None:
            self.first = v
        elif bool(self.first.unit) != bool(v.unit):
            this = "has a unit" if v.unit else "has no unit"
            first = "has one" if self.first.unit else "has none"
            raise DataError(f"the {what}, '{v.text}', {this}, but the first time in this graph ('{self.first.text}' "
                            f"at {self.first.loc}) {first}: give every time with a unit (s, ms, us), or "
                            "none", v.loc)
        return v.value * TIME_UNITS.get(v.unit, 1.0)

    @property
    def unit(self) -> str:
        return "s" if self.first is not None and self.first.unit else ""


def build_graph(decl: ast.GraphDecl) -> Graph:
    g = Graph(name=decl.name, title=decl.title, loc=decl.loc)
    times = _Times()
    seen: dict[str, Loc] = {}

    def declare(name: str, loc: Loc, what: str):
        if name in seen:
            raise DataError(f"{what} '{name}' is declared twice (first at {seen[name]})", loc)
        seen[name] = loc

    edges: list[ast.EdgeStmt] = []
    for item in decl.items:
        if isinstance(item, ast.NodeStmt):
            loc = name_loc(item.name, item.loc)
            declare(item.name, loc, "node")
            g.nodes.append(Node(str(item.name), times(item.time, f"time of node '{item.name}'"),
                                _size(item.size, f"size of node '{item.name}'", 0), item.kind, loc))
        elif isinstance(item, ast.EdgeStmt):
            edges.append(item)
        elif isinstance(item, ast.DataStmt):
            loc = name_loc(item.name, item.loc)
            declare(item.name, loc, "data")
            g.data.append(DataNode(str(item.name), _size(item.size, f"size of data '{item.name}'"), item.role, loc,
                                   item.pinned))
        elif isinstance(item, ast.LayerStmt):
            g.layers.append(_layer(item, times))
        elif isinstance(item, ast.LossStmt):
            if g.loss is not None:
                raise DataError(f"a graph has one loss (first at {g.loss.loc})", item.loc)
            g.loss = Loss([str(n) for n in item.inputs], [str(n) for n in item.outputs],
                          times(item.time, "time of the loss"), item.loc)

    known = {n.name for n in g.nodes}
    for e in edges:
        src_loc = name_loc(e.source, e.loc)
        if e.source not in known:
            raise DataError(f"edge from unknown node '{e.source}'{did_you_mean(e.source, known)}", src_loc)
        for t in e.targets:
            if t not in known:
                raise DataError(f"edge to unknown node '{t}'{did_you_mean(t, known)}", name_loc(t, e.loc))
            if t == e.source:
                raise DataError(f"edge from '{t}' to itself: the graph must be acyclic", name_loc(t, e.loc))
            g.edges.append((str(e.source), str(t)))
    _check_layers(g, [item for item in decl.items if isinstance(item, (ast.LayerStmt, ast.LossStmt))])
    _check_order(g, edges)
    g.time_unit = times.unit
    return g


def _layer(item: ast.LayerStmt, times: _Times) -> Layer:
    options = []
    fast_forward = None
    seen: dict[str, Loc] = {}
    for o in item.options:
        if o.name in seen:
            raise DataError(f"option '{o.name}' of layer '{item.name}' is declared twice", o.loc)
        seen[o.name] = o.loc
        what = f"option '{o.name}' of layer '{item.name}'"
        if o.name == FAST_FORWARD:
            fast_forward = _fast_forward(o, what, times)
            continue
        steps = {}
        for side, stmts in (("fwd", o.fwd_steps), ("bwd", o.bwd_steps)):
            steps[side] = [Step(_size(st.overhead, f"a {side} step of {what}"),
                                [str(n) for n in st.frees], [str(n) for n in st.creates])
                           for st in stmts]
        options.append(Option(
            str(o.name), times(o.fwd, f"forward time of {what}"),
            _size(o.fwd_overhead, f"forward overhead of {what}", 0),
            times(o.bwd, f"backward time of {what}"), _size(o.bwd_overhead, f"backward overhead of {what}", 0),
            _size(o.phantom, f"phantom of {what}", 0), [str(n) for n in o.needs], o.loc,
            steps["fwd"], steps["bwd"], o.pinned,
            None if o.segments is None else _segments(o.segments, what)))
    if not options and fast_forward is None:
        raise DataError(f"layer '{item.name}' has no option", name_loc(item.name, item.loc))
    return Layer(str(item.name), [str(n) for n in item.inputs], [str(n) for n in item.outputs],
                 [str(n) for n in item.grad_inputs], [str(n) for n in item.grad_outputs], options,
                 name_loc(item.name, item.loc), fast_forward)


def _fast_forward(o: ast.OptionStmt, what: str, times: _Times) -> Option:
    """`option fast_forward fwd T [overhead M] [fwd_steps (...)]`: the forward without autograd
    as measured. It has no backward, phantom, needs or pin (it saves nothing)."""
    extra = [name for name, present in (("bwd", o.bwd is not None), ("phantom", o.phantom is not None),
                                        ("needs", bool(o.needs)), ("pinned", o.pinned),
                                        ("bwd_steps", bool(o.bwd_steps)),
                                        ("segments", o.segments is not None)) if present]
    if extra:
        raise DataError(f"{what} is the forward without autograd: it takes `fwd`, `overhead` and "
                        f"`fwd_steps` only, not `{extra[0]}`", o.loc)
    if o.fwd is None:
        raise DataError(f"{what} needs its measured time: `option {FAST_FORWARD} fwd TIME "
                        "overhead SIZE`", o.loc)
    steps = [Step(_size(st.overhead, f"a fwd step of {what}"), [str(n) for n in st.frees],
                  [str(n) for n in st.creates]) for st in o.fwd_steps]
    return Option(FAST_FORWARD, times(o.fwd, f"forward time of {what}"),
                  _size(o.fwd_overhead, f"forward overhead of {what}", 0), 0.0, 0, 0, [], o.loc,
                  steps)


def _segments(stmt: ast.SegmentsStmt, what: str) -> Segments:
    """`segments "SIG" (...)` of an option: the kinds known, the positions whole numbers, and
    each list of segments consecutive (the top level from unit 0, a segment's own cut over
    exactly its units). Whether they end at the layer's last unit is checked against the op
    graph when the runtime rebuilds the option (`schedlang.pytorch.frontends.fx.segments`)."""
    if not stmt.signature:
        raise DataError(f"the segments of {what} need the signature of the layer's op graph",
                        stmt.loc)

    def position(v: ast.Value) -> int:
        if v.unit or not math.isfinite(v.value) or v.value != int(v.value):
            raise DataError(f"a segment of {what} names op units by position (a whole number "
                            f"from 0), not '{v.text}'", v.loc)
        return int(v.value)

    def tile(stmts: list, start: int, end: int | None, inside: str) -> list[Segment]:
        out = []
        for st in stmts:
            kind = str(st.kind)
            if kind not in SEGMENT_KINDS:
                raise DataError(f"unknown segment kind '{kind}' in {what}"
                                f"{did_you_mean(kind, SEGMENT_KINDS)}; a segment is "
                                f"{' or '.join(SEGMENT_KINDS)}", st.kind.loc)
            first = position(st.first)
            last = first if st.last is None else position(st.last)
            if first != start:
                gap = "leaves out" if first > start else "repeats"
                units = (f"unit {start}" if abs(first - start) == 1 else
                         f"units {min(start, first)}..{max(start, first) - 1}")
                raise DataError(f"the segments of {what} must cover {inside} once, in order: "
                                f"this one starts at unit {first} and {gap} {units}",
                                st.first.loc)
            if last < first:
                raise DataError(f"segment {first}..{last} of {what} is empty: its last unit "
                                "comes before its first", st.last.loc)
            children = tile(st.children, first, last, f"the units {first}..{last} of its "
                            "parent") if st.children else []
            out.append(Segment(kind, first, last, children, st.loc))
            start = last + 1
        if end is not None and start != end + 1:
            raise DataError(f"the segments of {what} must cover {inside} once: they end at "
                            f"unit {start - 1}, not {end}", stmts[-1].loc)
        return out

    return Segments(stmt.signature, tile(stmt.parts, 0, None, "the layer's op units"),
                    stmt.loc)


def _check_layers(g: Graph, items: list) -> None:
    """Every data name a layer or the loss mentions must be declared (`items`: their AST, whose
    names remember where they are written)."""
    data = {d.name for d in g.data}
    uses = []
    for item in items:
        if isinstance(item, ast.LayerStmt):
            for n in item.inputs + item.outputs + item.grad_inputs + item.grad_outputs:
                uses.append((n, item.loc, f"layer '{item.name}'"))
            for o in item.options:
                uses += [(n, o.loc, f"option '{o.name}' of layer '{item.name}'") for n in o.needs]
        else:
            uses += [(n, item.loc, "the loss") for n in item.inputs + item.outputs]
    for name, loc, who in uses:
        if name not in data:
            raise DataError(f"{who} uses undeclared data '{name}'{did_you_mean(name, data)}; declare it "
                            f"with `data {name} SIZE`", name_loc(name, loc))


def _check_order(g: Graph, edges: list[ast.EdgeStmt]) -> None:
    """Nodes must be listed in a topological order, which the formulations take as stage order."""
    digraph = nx.DiGraph()
    digraph.add_nodes_from(n.name for n in g.nodes)
    digraph.add_edges_from(g.edges)
    try:
        cycle = nx.find_cycle(digraph)
    except nx.NetworkXNoCycle:
        cycle = None
    position = {n.name: i for i, n in enumerate(g.nodes)}
    if cycle:
        # Point at the edge that closes the cycle: one that goes back to an earlier node (a cycle
        # has at least one), written last in the path.
        k = next(i for i, (u, v) in enumerate(cycle) if position[v] <= position[u])
        cycle = cycle[k + 1:] + cycle[:k + 1]
        path = " -> ".join([u for u, _ in cycle] + [cycle[-1][1]])
        u, v = cycle[-1]
        where = next((name_loc(t, e.loc) for e in edges if e.source == u for t in e.targets if t == v),
                     g.loc)
        raise DataError(f"graph '{g.name}' has a cycle: {path}; the graph must be acyclic", where)
    for e in edges:
        for t in e.targets:
            if position[t] < position[e.source]:
                raise DataError(f"edge {e.source} -> {t} goes backwards: '{t}' is declared before "
                                f"'{e.source}'; nodes must be declared in a topological order, so declare "
                                f"'{t}' after '{e.source}'", name_loc(t, e.loc))


BUDGET_KINDS = ("peak", "save", "host")
BANDWIDTH_KINDS = ("offload", "prefetch")


def budget_value(b: ast.BudgetDecl) -> int:
    if b.kind not in BUDGET_KINDS:
        raise DataError(f"unknown budget '{b.kind}'{did_you_mean(b.kind, BUDGET_KINDS)}; "
                        "budgets are 'peak', 'save' and 'host' (host memory for offloaded tensors)",
                        name_loc(b.kind, b.loc))
    nbytes = _size(b.value, f"budget {b.kind}")
    if nbytes <= 0:
        raise DataError(f"budget {b.kind} must be positive, got {format_size(nbytes)}", b.value.loc)
    return nbytes


def bandwidth_value(b: ast.BandwidthDecl) -> float:
    """Bytes per second; 0 disables transfers in that direction, inf makes them free."""
    if b.kind not in BANDWIDTH_KINDS:
        raise DataError(f"unknown bandwidth '{b.kind}'{did_you_mean(b.kind, BANDWIDTH_KINDS)}; "
                        "bandwidths are 'offload' (device to host) and 'prefetch' (host to device)",
                        name_loc(b.kind, b.loc))
    v = b.value
    if v.unit == "?":
        raise DataError(f"bandwidth {b.kind} must be a rate such as 16GB/s, 0 or inf, not '{v.text}'", v.loc)
    if not v.unit and v.value != 0:
        raise DataError(f"bandwidth {b.kind} needs a unit: write e.g. {v.text}GB/s (bytes per second)", v.loc)
    if v.unit == "B/s" and v.text == "inf":
        return float("inf")
    return v.value * SIZE_UNITS.get(v.unit[:-2], 1) if v.unit else 0.0
