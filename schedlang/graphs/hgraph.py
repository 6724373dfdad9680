"""The H-graph: what the H-Rockmate formulation indexes, derived from the layered vocabulary.

From `data`, `layer` (forward/backward pair with options) and `loss` declarations:

* compute nodes in topological order: the forward of every layer (declaration order), the loss,
  then the backward of every layer in reverse order. Names: `LAYER.fwd`, `LAYER.bwd`, `loss`;
* data nodes: every declared `data`; a data node may have several creators (gradient
  accumulation: each consumer layer's backward contributes to the gradient of its input);
* creates (k, d): k writes (a contribution to) d; uses (k, d): k reads d whatever its option;
  option_uses (k, o, d): the backward k run with option o also reads d (the option's `needs`,
  Rockmate's dep_interfaces_data);
* options: a backward has its layer's options; a forward has them too plus `fast_forward` (no
  autograd, so no phantom; Rockmate's nOpts + 1 options for a forward). Its time, overhead and
  sub-step profile are the layer's `option fast_forward ...` when the graph data states it (the
  PyTorch profiler measures the forward under ``no_grad``). Otherwise they are derived, and
  the memory conservatively (`fast_forward_option`): the time is the least forward time of the
  layer's options (a forward without autograd does the same arithmetic and saves nothing), the
  overhead the *largest* forward transient of its options (an option's flat overhead, or the
  largest step of its `fwd_steps`), with no profile: we do not know which option's kernels and
  workspaces the forward without autograd runs, and the largest step bounds every step;
* layers with no backward: a layer whose only option is `fast_forward` (a frozen layer at the
  input side, parameter-free glue whose inputs need no gradient) has a forward and no backward,
  saves no phantom and takes no `grad` statement;
* phantoms: option o of layer j saves phantom(j, o) bytes from its forward to its backward;
* inputs: data with role `input` (in memory at the start, created by nobody); outputs: data
  with role `output` (input gradients: they must be alive at the end);
* chained (a, b): layer b is declared right after layer a and reads a's outputs, which nothing
  else reads (no other layer, not the loss) and none of which is an `output`: one checkpoint
  can hold a and b as a group, a's outputs living only inside it (`chained_layers`; the hook
  front end's checkpointed groups of blocks, models/extensions/block_groups.sched).

This module is the one home of the layered view: `build_hgraph` (the H-graph, by name) and
`index_hgraph` (`HIndex`: the same by position, what the simulator and the allocator replay
on). Consumers get both cached from the graph: `Graph.hgraph()`, `Graph.layered_index()`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import networkx as nx

from ..language.errors import DataError, Loc
from .elements import DataNode, Layer, Loss


class LayeredGraph(Protocol):
    """What the H-graph reads of a graph: its layered view (`graph.Graph` is one; it builds
    and caches the H-graph, `Graph.hgraph`)."""

    name: str
    data: list[DataNode]
    layers: list[Layer]
    bandwidths: dict[str, float]
    loc: Loc | None

    def layered_loss(self) -> Loss: ...

FAST_FORWARD = "fast_forward"


@dataclass
class NodeOption:
    name: str
    time: float
    overhead: int
    steps: list = field(default_factory=list)  # [graph.Step]: a sub-step memory profile


@dataclass
class ComputeNode:
    name: str
    kind: str  # "fwd", "bwd" or "loss"
    layer: str | None
    options: list[NodeOption]
    loc: Loc | None = None


@dataclass
class HGraph:
    name: str
    compute: list[ComputeNode] = field(default_factory=list)  # topological order
    data: dict[str, int] = field(default_factory=dict)  # name -> bytes, declaration order
    creates: list[tuple[str, str]] = field(default_factory=list)
    uses: list[tuple[str, str]] = field(default_factory=list)
    option_uses: list[tuple[str, str, str]] = field(default_factory=list)
    phantoms: dict[tuple[str, str], int] = field(default_factory=dict)  # (layer, option) -> bytes
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    loss: str | None = None
    chained: list[tuple[str, str]] = field(default_factory=list)  # (a, b): `chained_layers`

    def node(self, name: str) -> ComputeNode:
        return next(k for k in self.compute if k.name == name)

    def creators(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {d: [] for d in self.data}
        for k, d in self.creates:
            out[d].append(k)
        return out

    def users(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {d: [] for d in self.data}
        for k, d in self.uses:
            out[d].append(k)
        for k, _, d in self.option_uses:
            if k not in out[d]:
                out[d].append(k)
        return out


def fwd_name(layer: str) -> str:
    return f"{layer}.fwd"


def bwd_name(layer: str) -> str:
    return f"{layer}.bwd"


def _fwd_transient(o) -> int:
    """The most transient memory of option o's forward: its flat overhead, or its largest step."""
    return max(st.overhead for st in o.fwd_steps) if o.fwd_steps else int(o.fwd_overhead)


def fast_forward_option(layer) -> NodeOption:
    """The `fast_forward` option of `layer`'s forward: as stated, else derived (module docstring)."""
    ff = layer.fast_forward
    if ff is not None:
        return NodeOption(FAST_FORWARD, ff.fwd_time, ff.fwd_overhead, list(ff.fwd_steps))
    opts = layer.options
    return NodeOption(FAST_FORWARD, min(o.fwd_time for o in opts), max(_fwd_transient(o) for o in opts))


def has_backward(layer) -> bool:
    """A layer has a backward unless its only option is `fast_forward`."""
    return bool(layer.options)


def build_hgraph(g: LayeredGraph) -> HGraph:
    """The H-graph of a layered graph; DataError (located) when the layers are inconsistent."""
    if not g.layers:
        raise DataError(f"graph '{g.name}' has no layers: the H-graph needs `data`, `layer` and "
                        "`loss` declarations", g.loc)
    for layer in g.layers:
        if not layer.options and layer.fast_forward is None:
            raise DataError(f"layer '{layer.name}' has no option", layer.loc or g.loc)
        if not has_backward(layer) and (layer.grad_inputs or layer.grad_outputs):
            raise DataError(f"layer '{layer.name}' has no backward (its only option is "
                            f"`{FAST_FORWARD}`), so it takes no `grad` statement: declare the "
                            "options of its backward, or drop the gradients", layer.loc or g.loc)
    h = HGraph(g.name)
    for datum in g.data:
        h.data[datum.name] = datum.size
        if datum.role == "input":
            h.inputs.append(datum.name)
        elif datum.role == "output":
            h.outputs.append(datum.name)
    for layer in g.layers:
        opts = layer.options
        ff = fast_forward_option(layer)
        h.compute.append(ComputeNode(fwd_name(layer.name), "fwd", layer.name,
                                     [NodeOption(o.name, o.fwd_time, o.fwd_overhead, o.fwd_steps)
                                      for o in opts] + [ff],
                                     layer.loc))
        h.creates += [(fwd_name(layer.name), d) for d in layer.outputs]
        h.uses += [(fwd_name(layer.name), d) for d in layer.inputs]
        for o in opts:
            if o.name == FAST_FORWARD:
                raise DataError(f"option name '{FAST_FORWARD}' is reserved (every forward has it)", o.loc)
            h.phantoms[(layer.name, o.name)] = o.phantom
            for d in o.needs:
                if d not in layer.outputs and d not in layer.inputs:
                    raise DataError(f"option '{o.name}' of layer '{layer.name}' needs '{d}', which is "
                                    f"neither an input nor an output of the layer", o.loc)
    loss = g.layered_loss()
    h.loss = "loss"
    h.compute.append(ComputeNode("loss", "loss", None, [NodeOption("loss", loss.time, 0)], loss.loc))
    h.creates += [("loss", d) for d in loss.outputs]
    h.uses += [("loss", d) for d in loss.inputs]
    for layer in reversed(g.layers):
        if not has_backward(layer):
            continue
        k = bwd_name(layer.name)
        h.compute.append(ComputeNode(k, "bwd", layer.name,
                                     [NodeOption(o.name, o.bwd_time, o.bwd_overhead, o.bwd_steps)
                                      for o in layer.options],
                                     layer.loc))
        h.uses += [(k, d) for d in layer.grad_inputs]
        h.creates += [(k, d) for d in layer.grad_outputs]
        h.option_uses += [(k, o.name, d) for o in layer.options for d in o.needs]
    _check(h, g)
    h.chained = chained_layers(g)
    return h


def chained_layers(g: LayeredGraph) -> list[tuple[str, str]]:
    """The pairs (a, b) of layers declared one after the other where b alone reads what a
    creates (no other layer, not the loss) and none of it is an `output` (module docstring)."""
    readers: dict[str, set[str]] = {}
    for layer in g.layers:
        for d in layer.inputs:
            readers.setdefault(d, set()).add(layer.name)
    for d in g.layered_loss().inputs:
        readers.setdefault(d, set()).add("loss")
    returned = {d.name for d in g.data if d.role == "output"}
    return [(a.name, b.name) for a, b in zip(g.layers, g.layers[1:])
            if a.outputs and all(readers.get(d) == {b.name} and d not in returned
                                 for d in a.outputs)]


def _check(h: HGraph, g: LayeredGraph) -> None:
    locs = {k.name: k.loc for k in h.compute}
    creators = h.creators()
    for d, ks in creators.items():
        if d in h.inputs and ks:
            raise DataError(f"data '{d}' is an input but '{ks[0]}' creates it", locs[ks[0]])
    users = h.users()
    for d in h.data:
        if not creators[d] and d not in h.inputs and users[d]:
            raise DataError(f"data '{d}' is read by '{users[d][0]}' but nothing creates it and it is not "
                            "an `input`", locs[users[d][0]])
    for d in h.outputs:
        if not creators[d]:
            raise DataError(f"output '{d}' is never created", g.loc)
    # a step frees the node's inputs and creates its outputs, nothing else
    reads: dict[str, set] = {k.name: set() for k in h.compute}
    for k, d in h.uses:
        reads[k].add(d)
    needs: dict[tuple[str, str], set] = {(k, o): set() for k, o, _ in h.option_uses}
    for k, o, d in h.option_uses:
        needs[(k, o)].add(d)
    writes: dict[str, set] = {k.name: set() for k in h.compute}
    for k, d in h.creates:
        writes[k].add(d)
    for node in h.compute:
        for opt in node.options:
            for st in opt.steps:
                bad = [d for d in st.frees
                       if d not in reads[node.name] | needs.get((node.name, opt.name), set())]
                if bad:
                    raise DataError(f"a step of option '{opt.name}' of '{node.name}' frees '{bad[0]}', "
                                    f"which '{node.name}' does not read", node.loc)
                bad = [d for d in st.creates if d not in writes[node.name]]
                if bad:
                    raise DataError(f"a step of option '{opt.name}' of '{node.name}' creates '{bad[0]}', "
                                    f"which '{node.name}' does not create", node.loc)
    # the compute order must be topological: every creator of a datum runs before its users
    order = {k.name: i for i, k in enumerate(h.compute)}
    dag = nx.DiGraph()
    dag.add_nodes_from(order)
    for d, ks in creators.items():
        for u in users[d]:
            for k in ks:
                if k == u:
                    raise DataError(f"'{k}' both creates and reads '{d}'", locs[k])
                dag.add_edge(k, u)
                if order[k] > order[u]:
                    raise DataError(f"'{u}' reads '{d}', created by '{k}', which runs after it in the "
                                    "order forwards, loss, backwards (reversed): declare layers in a "
                                    "topological order", locs[u])
    if not nx.is_directed_acyclic_graph(dag):  # unreachable after the order check; kept cheap
        raise DataError(f"graph '{h.name}' has a cycle", g.loc)


@dataclass
class HIndex:
    """The H-graph of a layered graph by position (`index_hgraph`; `Graph.layered_index`)."""

    graph_name: str
    names: list[str]  # compute nodes in H-graph order
    index: dict[str, int]
    kind: list[str]  # "fwd", "bwd", "loss"
    layer: list[int]  # layer index of each compute node, -1 for the loss
    opt_names: list[list[str]]
    opt_index: list[dict[str, int]]
    opt_time: list[list[float]]
    opt_overhead: list[list[int]]
    # per node and option: the sub-step profile, [(overhead, freed data, created data)]
    opt_steps: list[list[list[tuple[int, frozenset, frozenset]]]]
    opt_layer_opt: list[list[int]]  # the layer option of each node option (-1: fast_forward, loss)
    uses: list[tuple[int, ...]]  # data read whatever the option (deduplicated)
    opt_uses: list[list[tuple[int, ...]]]  # per option: data read in addition to `uses`
    creates: list[tuple[tuple[int, int], ...]]  # (datum, this creator's bit in the datum's mask)
    data: list[str]
    data_index: dict[str, int]
    size: list[int]
    full: list[int]  # every creator's bit; 0 for a datum nobody creates (inputs)
    creators: list[list[int]]  # compute nodes; creators[d][j] has bit 1 << j
    inputs: list[int]
    outputs: list[int]
    layers: list[str]
    layer_index: dict[str, int]
    layer_opts: list[list[str]]
    phantom: list[list[int]]  # bytes, per layer and layer option
    loss: int
    # transfers: "offload" / "prefetch" -> bytes per second (as the graph gives them), and
    # what may never be offloaded (per datum; per layer and layer option)
    bandwidth: dict = field(default_factory=dict)
    data_pinned: list[bool] = field(default_factory=list)
    opt_pinned: list[list[bool]] = field(default_factory=list)


def index_hgraph(graph: LayeredGraph, h: HGraph) -> HIndex:
    """Index `h`, the H-graph of `graph`, by position."""
    data = list(h.data)
    data_index = {d: i for i, d in enumerate(data)}
    names = [k.name for k in h.compute]
    index = {n: i for i, n in enumerate(names)}
    layers = [layer.name for layer in graph.layers]
    layer_index = {name: j for j, name in enumerate(layers)}
    layer_opts = [[o.name for o in layer.options] for layer in graph.layers]
    layer_opt_index = [{o: i for i, o in enumerate(opts)} for opts in layer_opts]
    pinned = {d.name: d.pinned for d in graph.data}

    uses: list[list[int]] = [[] for _ in names]
    for k, d in h.uses:
        i, di = index[k], data_index[d]
        if di not in uses[i]:
            uses[i].append(di)
    extra: dict[tuple[int, str], list[int]] = {}
    for k, o, d in h.option_uses:
        i, di = index[k], data_index[d]
        lst = extra.setdefault((i, o), [])
        if di not in uses[i] and di not in lst:
            lst.append(di)
    creators: list[list[int]] = [[] for _ in data]
    creates: list[list[tuple[int, int]]] = [[] for _ in names]
    for k, d in h.creates:
        i, di = index[k], data_index[d]
        if i not in creators[di]:
            creators[di].append(i)
            creates[i].append((di, 1 << (len(creators[di]) - 1)))

    kind, layer_of, opt_names, opt_index, opt_time, opt_overhead, opt_layer_opt, opt_uses = \
        [], [], [], [], [], [], [], []
    opt_steps: list = []
    for i, node in enumerate(h.compute):
        j = layer_index[node.layer] if node.layer is not None else -1
        kind.append(node.kind)
        layer_of.append(j)
        onames = [o.name for o in node.options]
        opt_names.append(onames)
        opt_index.append({o: n for n, o in enumerate(onames)})
        opt_time.append([float(o.time) for o in node.options])
        opt_overhead.append([int(o.overhead) for o in node.options])
        opt_steps.append([[(int(st.overhead), frozenset(data_index[d] for d in st.frees),
                            frozenset(data_index[d] for d in st.creates)) for st in o.steps]
                          for o in node.options])
        opt_layer_opt.append([layer_opt_index[j].get(o, -1) if j >= 0 and o != FAST_FORWARD else -1
                              for o in onames])
        opt_uses.append([tuple(extra.get((i, o), ())) for o in onames])
    return HIndex(
        graph_name=graph.name, names=names, index=index, kind=kind, layer=layer_of,
        opt_names=opt_names, opt_index=opt_index, opt_time=opt_time, opt_overhead=opt_overhead,
        opt_steps=opt_steps,
        opt_layer_opt=opt_layer_opt, uses=[tuple(u) for u in uses], opt_uses=opt_uses,
        creates=[tuple(c) for c in creates], data=data, data_index=data_index,
        size=[int(h.data[d]) for d in data],
        full=[(1 << len(c)) - 1 for c in creators], creators=creators,
        inputs=[data_index[d] for d in h.inputs], outputs=[data_index[d] for d in h.outputs],
        layers=layers, layer_index=layer_index, layer_opts=layer_opts,
        phantom=[[int(h.phantoms[(name, o)]) for o in opts] for name, opts in zip(layers, layer_opts)],
        loss=index[h.loss] if h.loss is not None else -1,
        bandwidth=dict(graph.bandwidths),
        data_pinned=[bool(pinned.get(d, False)) for d in data],
        opt_pinned=[[bool(o.pinned) for o in layer.options] for layer in graph.layers],
    )
