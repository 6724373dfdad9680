"""The elements of graph data (`graph.Graph`): Checkmate-view nodes, and the layered view's
data nodes, layers with their options, steps and segments, and the loss. Plain records;
`graph.Graph` validates and indexes them, `hgraph` derives the H-graph from them."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..language.errors import Loc


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


SEGMENT_KINDS = ("keep", "checkpoint")


@dataclass
class Segment:
    """Op units `first..last` of a layer (positions in its op graph's unit order) run `keep`
    (plain autograd) or `checkpoint` (recomputed in the backward); `children`: the segment's
    own cut into consecutive segments (empty: none)."""

    kind: str
    first: int
    last: int
    children: list[Segment] = field(default_factory=list)
    loc: Loc | None = field(default=None, compare=False)


@dataclass
class Segments:
    """A generated option's forward as segments of the layer's op units, which the runtime
    rebuilds it from (`schedlang.pytorch.frontends.fx.segments`); `signature`: the structure signature of
    the op graph the positions refer to."""

    signature: str
    parts: list[Segment]
    loc: Loc | None = field(default=None, compare=False)


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
    segments: Segments | None = None  # a generated option: how the runtime rebuilds it


@dataclass
class Layer:
    name: str
    inputs: list[str]
    outputs: list[str]
    grad_inputs: list[str]  # gradients the backward consumes
    grad_outputs: list[str]  # gradients the backward produces
    options: list[Option]
    loc: Loc | None = None
    # the forward without autograd as measured (`option fast_forward fwd T overhead M
    # [fwd_steps (...)]`: only its forward fields are read); None: derived (schedlang/graphs/hgraph.py)
    fast_forward: Option | None = None


@dataclass
class Loss:
    inputs: list[str]
    outputs: list[str]
    time: float
    loc: Loc | None = None
