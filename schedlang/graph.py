"""Graph data: the instance a formulation is solved on.

Two vocabularies share one type:

* the Checkmate view — compute nodes in topological order, each producing one output whose
  data name is the node's name, with a time and an output size, and edges (producer, consumer);
* the layered view of the H-Rockmate issue — data nodes, layers (forward/backward pairs) with
  options and phantoms, and a loss. It is parsed and checked now and fully used by
  `models/rockmate.sched`.

Times are floats in the graph's time unit (seconds when the data gave units, the data's own
abstract units otherwise); sizes are bytes. Nothing here knows about formulations.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .errors import DataError, Loc

NODE_KINDS = ("forward", "backward", "loss")


@dataclass
class Node:
    name: str
    time: float
    size: int
    kind: str = "forward"
    loc: Loc | None = None


@dataclass
class DataNode:
    name: str
    size: int
    role: str = ""  # "", "input" or "output" (must be alive at the end)
    loc: Loc | None = None
    pinned: bool = False  # never offloaded to host memory


@dataclass
class Step:
    """One sub-step of an option's forward or backward: its transient memory, the node's
    inputs no longer needed from this step on, and the node's outputs created by then."""

    overhead: int
    frees: list[str] = field(default_factory=list)
    creates: list[str] = field(default_factory=list)


@dataclass
class Option:
    name: str
    fwd_time: float
    fwd_overhead: int
    bwd_time: float
    bwd_overhead: int
    phantom: int
    needs: list[str] = field(default_factory=list)  # extra backward deps on forward outputs
    loc: Loc | None = None
    fwd_steps: list[Step] = field(default_factory=list)  # sub-step profiles (correction terms)
    bwd_steps: list[Step] = field(default_factory=list)
    pinned: bool = False  # its phantom is never offloaded to host memory


@dataclass
class Layer:
    name: str
    inputs: list[str]
    outputs: list[str]
    grad_inputs: list[str]  # gradients the backward consumes
    grad_outputs: list[str]  # gradients the backward produces
    options: list[Option]
    loc: Loc | None = None


@dataclass
class Loss:
    inputs: list[str]
    outputs: list[str]
    time: float
    loc: Loc | None = None


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

    # --- derived views (cheap; recomputed on demand) -------------------------------------
    def node(self, name: str) -> Node:
        return self._node_index()[name]

    def _node_index(self) -> dict[str, Node]:
        return {n.name: n for n in self.nodes}

    def node_positions(self) -> dict[str, int]:
        """name -> position in `nodes` (the Checkmate view); DataError on a repeated name."""
        index: dict[str, int] = {}
        for i, n in enumerate(self.nodes):
            if n.name in index:
                raise DataError(f"graph '{self.name}' has two nodes named '{n.name}'", self.loc)
            index[n.name] = i
        return index
