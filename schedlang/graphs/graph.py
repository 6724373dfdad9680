"""Graph data: the instance a formulation is solved on.

Two vocabularies share one type:

* the Checkmate view — compute nodes in topological order, each producing one output whose
  data name is the node's name, with a time and an output size, and edges (producer, consumer);
* the layered view of the H-Rockmate issue — data nodes, layers (forward/backward pairs) with
  options and phantoms, and a loss. It is parsed and checked now and fully used by
  `models/rockmate.sched`.

Times are floats in the graph's time unit (seconds when the data gave units, the data's own
abstract units otherwise); sizes are bytes. Nothing here knows about formulations.

A graph uses one vocabulary (`Graph.is_layered` says which), and each view has one validated,
cached index that every consumer (simulator, planners, allocator, writer, decoders) reads:

* `Graph.checkmate_index()` -> `CheckmateIndex` (below): nodes by position, sizes, times,
  predecessor/successor lists; edges naming unknown nodes are rejected here, and
  ``topological=True`` also rejects a node list out of topological order;
* `Graph.hgraph()` -> `schedlang.graphs.hgraph.HGraph`, the H-graph of the layered view, and
  `Graph.layered_index()` -> `schedlang.graphs.hgraph.HIndex`, that H-graph indexed by position (what
  the simulator and the allocator replay on).

The indexes are rebuilt when the graph's content changes (they are keyed by it), so a graph
may be edited between two uses; they must not be mutated.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..language.errors import DataError, Loc
from ..language.units import MAX_BYTES
from .elements import DataNode, Layer, Loss, Node, Step
from .hgraph import HGraph, HIndex, build_hgraph, index_hgraph

NODE_KINDS = ("forward", "backward", "loss")


@dataclass
class Graph:
    name: str
    title: str = ""
    nodes: list[Node] = field(default_factory=list)  # topological order
    edges: list[tuple[str, str]] = field(default_factory=list)  # (producer, consumer)
    data: list[DataNode] = field(default_factory=list)
    layers: list[Layer] = field(default_factory=list)
    loss: Loss | None = None
    budgets: dict[str, int] = field(default_factory=dict)  # "peak", "save", "host" -> bytes
    # "offload" (device -> host), "prefetch" (host -> device) -> bytes per second; absent: 0,
    # i.e. no offloading; math.inf: transfers take no time
    bandwidths: dict[str, float] = field(default_factory=dict)
    time_unit: str = ""  # "s" when the data gave time units, "" for abstract units
    loc: Loc | None = None

    # derived views, keyed by the content they were built from (see the module docstring)
    _views: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def node(self, name: str) -> Node:
        return {n.name: n for n in self.nodes}[name]

    def layered_loss(self) -> Loss:
        """The loss of a layered graph; DataError (located) when it declares none."""
        if self.loss is None:
            raise DataError(f"graph '{self.name}' has layers but no `loss (...) -> (...)`", self.loc)
        return self.loss

    @property
    def is_layered(self) -> bool:
        """Whether the graph is in the H-Rockmate vocabulary (layers, a loss, or data nodes
        without compute nodes) rather than the Checkmate one (nodes and edges)."""
        return bool(self.layers) or self.loss is not None or (bool(self.data) and not self.nodes)

    def check_one_vocabulary(self) -> None:
        """DataError when the graph has both compute nodes and layered declarations."""
        if self.nodes and (self.layers or self.loss is not None or self.data):
            raise DataError(f"graph '{self.name}' has both compute nodes (Checkmate view) and data, "
                            "layers or a loss (H-Rockmate view); a graph uses one vocabulary",
                            self.loc)

    def checkmate_index(self, *, topological: bool = False) -> CheckmateIndex:
        """The Checkmate view, indexed (cached); DataError when it is inconsistent: a repeated
        node name, an edge naming an unknown node, a mix of vocabularies, and with
        `topological` a node list out of topological order."""
        key = (self.name, tuple((n.name, n.time, n.size, n.kind) for n in self.nodes),
               tuple((u, v) for u, v in self.edges), bool(self.data), bool(self.layers),
               self.loss is None)
        index: CheckmateIndex = self._cached("checkmate", key, self._build_checkmate_index)
        if topological and index.backward_edge is not None:
            u, v = index.backward_edge
            raise DataError(f"graph '{self.name}': nodes are not in topological order "
                            f"(edge {u} -> {v})", self.loc or Loc(self.name))
        return index

    def hgraph(self) -> HGraph:
        """The H-graph of the layered view (cached; `schedlang.graphs.hgraph.build_hgraph`)."""
        def build() -> HGraph:
            self.check_one_vocabulary()
            self.check_total_bytes()
            return build_hgraph(self)
        return self._cached("hgraph", self._layered_key(), build)

    def layered_index(self) -> HIndex:
        """The H-graph indexed by position (cached; `schedlang.graphs.hgraph.HIndex`)."""
        return self._cached("layered", self._layered_key(), lambda: index_hgraph(self, self.hgraph()))

    def _cached(self, view: str, key: Any, build: Callable[[], Any]) -> Any:
        hit = self._views.get(view)
        if hit is not None and hit[0] == key:
            return hit[1]
        value = build()  # a DataError propagates and nothing is cached
        self._views[view] = (key, value)
        return value

    def _layered_key(self) -> tuple:
        def steps(sts: list[Step]) -> tuple:
            return tuple((st.overhead, tuple(st.frees), tuple(st.creates)) for st in sts)

        return (
            self.name, bool(self.nodes),
            tuple((d.name, d.size, d.role, d.pinned) for d in self.data),
            tuple((lay.name, tuple(lay.inputs), tuple(lay.outputs), tuple(lay.grad_inputs),
                   tuple(lay.grad_outputs),
                   tuple((o.name, o.fwd_time, o.fwd_overhead, o.bwd_time, o.bwd_overhead,
                          o.phantom, tuple(o.needs), o.pinned, steps(o.fwd_steps),
                          steps(o.bwd_steps)) for o in lay.options),
                   None if lay.fast_forward is None else
                   (lay.fast_forward.fwd_time, lay.fast_forward.fwd_overhead,
                    steps(lay.fast_forward.fwd_steps)))
                  for lay in self.layers),
            None if self.loss is None else (tuple(self.loss.inputs), tuple(self.loss.outputs),
                                            self.loss.time),
            tuple(self.bandwidths.items()),
        )

    def check_total_bytes(self) -> None:
        """DataError when the graph's sizes add up to more than an int64 holds: every peak and
        budget is at most that sum, and the planners, the simulator and the models count bytes
        in 64-bit integers or floats (`schedlang.language.units.MAX_BYTES`)."""

        total = (sum(int(n.size) for n in self.nodes) + sum(int(d.size) for d in self.data)
                 + sum(int(o.phantom) + int(o.fwd_overhead) + int(o.bwd_overhead)
                       + sum(int(st.overhead) for st in o.fwd_steps + o.bwd_steps)
                       for lay in self.layers for o in lay.options))
        if total > MAX_BYTES:
            raise DataError(f"graph '{self.name}': its sizes add up to {total:,} bytes, over "
                            f"{MAX_BYTES:,} (2^63 - 1): peaks and budgets are counted in 64-bit "
                            "integers; give sizes in a coarser unit", self.loc or Loc(self.name))

    def _build_checkmate_index(self) -> CheckmateIndex:
        self.check_one_vocabulary()
        self.check_total_bytes()
        names = tuple(n.name for n in self.nodes)
        index: dict[str, int] = {}
        for i, name in enumerate(names):
            if name in index:
                raise DataError(f"graph '{self.name}' has two nodes named '{name}'", self.loc)
            index[name] = i
        preds: list[set[int]] = [set() for _ in names]
        succs: list[set[int]] = [set() for _ in names]
        edges: list[tuple[int, int]] = []
        backward = None
        for u, v in self.edges:
            iu, iv = index.get(u), index.get(v)
            if iu is None or iv is None:
                raise DataError(f"graph '{self.name}': edge {u} -> {v} names an unknown node "
                                f"'{u if iu is None else v}'", self.loc)
            if iv not in succs[iu]:
                succs[iu].add(iv)
                preds[iv].add(iu)
                edges.append((iu, iv))
            if backward is None and iv <= iu:
                backward = (u, v)
        return CheckmateIndex(
            names=names, index=index,
            size=tuple(int(n.size) for n in self.nodes),
            time=tuple(float(n.time) for n in self.nodes),
            kind=tuple(n.kind for n in self.nodes),
            preds=tuple(tuple(sorted(p)) for p in preds),
            succs=tuple(tuple(sorted(s)) for s in succs),
            edges=tuple(edges), backward_edge=backward)


@dataclass(frozen=True)
class CheckmateIndex:
    """The Checkmate view of a graph by node position (`Graph.checkmate_index`)."""

    names: tuple[str, ...]  # nodes, in the graph's order
    index: dict[str, int]  # name -> position
    size: tuple[int, ...]
    time: tuple[float, ...]
    kind: tuple[str, ...]  # "forward", "backward" or "loss"
    preds: tuple[tuple[int, ...], ...]  # distinct predecessors, ascending
    succs: tuple[tuple[int, ...], ...]  # distinct successors, ascending
    edges: tuple[tuple[int, int], ...]  # distinct edges, in the order first written
    backward_edge: tuple[str, str] | None  # the first edge that does not go forward, if any

    @property
    def n(self) -> int:
        return len(self.names)
