"""The names the language provides: built-in sets, scalars and functions, one entry each.

An entry holds everything about one built-in: its signature and units (read by `check.py`)
and its evaluation on graph data (called by `lower.py`). Built-ins read graph data and the
budgets; none creates IR columns or rows: a function evaluates to a constant column, an
element column or a set, which the expressions around it turn into rows. The user-facing list
is the Expressions table of docs/language.md.

`GraphData` binds one graph: the built-in sets (Checkmate view and H-graph, `hgraph.py`) as
ordered sets of element codes, and the per-node and per-(node, option) numbers the functions
read.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import networkx as nx
import numpy as np

from ..compile.relational import INVALID, Const, Elem, KeyIndex, SetRel, SetVal, Universe, with_row_id
from ..graphs.graph import Graph
from .errors import CheckError, DataError, Loc
from .units import budget_value, float_at_least

# ------------------------------------------------------------------------------- sets
# name -> tuple arity. The first four are the Checkmate view (nodes with one output each,
# edges); the others are the H-graph of layered data (hgraph.py).
BUILTIN_SETS = {
    "nodes": 1, "edges": 2, "forward_nodes": 1, "backward_nodes": 1,
    "compute_nodes": 1, "data_nodes": 1, "creates": 2, "uses": 2, "option_uses": 3,
    "options": 2, "layers": 1, "phantom_options": 2, "inputs": 1, "outputs": 1,
    # sub-step profiles (correction terms): options that have one, their steps (k, o, i), the
    # inputs a step frees (k, o, i, d) and the outputs not created yet at a step (k, o, i, d)
    "stepped": 2, "steps": 3, "step_frees": 4, "step_pending": 4,
    # what may be offloaded to host memory: data nodes and (layer, option) phantoms not `pinned`
    "offloadable_data": 1, "offloadable_phantoms": 2,
    # consecutive layers one checkpoint can hold as a group (`hgraph.chained_layers`)
    "chained": 2,
}
CHECKMATE_VIEW = ("nodes", "edges", "forward_nodes", "backward_nodes")


# ------------------------------------------------------------------------------- scalars
@dataclass(frozen=True)
class Scalar:
    """A built-in number: its dimension ('size', 'time' or '') and its value."""

    dim: str
    value: Callable  # (lowering, name, loc) -> float


def _budget(low, name: str, loc: Loc) -> float:
    """budget.peak / budget.save: the budget given with the graph or --budget (bytes, as
    `units.budget_value` enters it: exact to the byte up to 8 GiB); save
    falls back to peak. A missing budget is reported where the fix goes: the graph data."""
    kind = name.split(".", 1)[1]
    if kind == "save" and "save" not in low.budgets and "peak" in low.budgets:
        kind = "peak"  # no save budget: the peak budget bounds what is saved, too
    if kind not in low.budgets:
        hint = f"add `budget {kind} SIZE` after the graph" + (" or pass --budget" if kind == "peak" else "")
        if low.g is not None and low.g.loc is not None:
            raise DataError(f"missing budget: graph '{low.g.name}' has no {kind} budget, and the "
                            f"model uses {name} (at {loc}); {hint}", low.g.loc)
        raise DataError(f"missing budget: the model uses {name}, and no {kind} budget was "
                        f"given; {hint}", loc)
    return budget_value(low.budgets[kind])


def _host(low, name: str, loc: Loc) -> float:
    """budget.host: host memory for offloaded copies (bytes); inf when not given."""
    if "host" in low.budgets:
        return budget_value(low.budgets["host"])
    host = low.g.budgets.get("host") if low.g is not None else None
    return np.inf if host is None else budget_value(host)


def _bandwidth(low, name: str, loc: Loc) -> float:
    """bandwidth.offload / bandwidth.prefetch: bytes per second; 0 when not given."""
    return float(low.g.bandwidths.get(name.split(".", 1)[1], 0.0)) if low.g is not None else 0.0


SCALARS = {
    "budget.peak": Scalar("size", _budget), "budget.save": Scalar("size", _budget),
    "budget.host": Scalar("size", _host),
    "bandwidth.offload": Scalar("", _bandwidth), "bandwidth.prefetch": Scalar("", _bandwidth),
    "inf": Scalar("", lambda low, name, loc: np.inf),
}
# name -> dimension, for the checker
BUILTIN_SCALARS = {name: s.dim for name, s in SCALARS.items()}


# ------------------------------------------------------------------------------- functions
@dataclass(frozen=True)
class Function:
    """A built-in function: its signature and units (check.py) and its evaluation (lower.py).

    `result` is the static kind of its value ('num', 'elem', 'set' or 'bool'); `dim` the
    dimension of a number ('size', 'time', '', or None: that of the first argument); `takes`
    what the first argument must be ('elem', 'set', or None: not checked). `value(lowering,
    call, table)` evaluates it on every row of the table; a set-valued function has
    `set_value(lowering, call, table)` instead (a SetRel, used after `in`).
    """

    name: str
    min_args: int
    max_args: int
    result: str
    dim: str | None
    takes: str | None
    value: Callable | None = None
    set_value: Callable | None = None


FUNCTIONS: dict[str, Function] = {}


def _builtin(names, args: tuple[int, int], result: str, dim: str | None, takes: str | None,
             kind: str = "value"):
    """Register the decorated evaluator for each of `names` (one entry per name)."""
    def register(fn):
        for name in names.split():
            FUNCTIONS[name] = Function(name, args[0], args[1], result, dim, takes, **{kind: fn})
        return fn
    return register


def _table_lookup(low, e, t, f: str) -> Const:
    """f(k, o) / f(j, o) / f(k, o, i): a per-option number of the H-graph, looked up by key."""
    tables = low.data.tables
    if f not in tables:
        raise DataError(f"{f}(k, o) needs layered graph data (layers with options)", e.loc)
    index, values = tables[f]
    args = [low._elem_codes(a, t) for a in e.args]
    rows = index.lookup(args, t.m)
    if (rows < 0).any():
        i = int(np.flatnonzero(rows < 0)[0])
        key = ", ".join(str(low.u.value(int(a[i]))) for a in args)
        what = {"phantom": "layer option", "step_overhead": "step"}.get(f, "node option")
        raise DataError(f"{f}({key}): no such {what}", e.loc)
    return Const(values[rows], "time" if f == "time" else "size")


def _node_attr(low, e, t, f: str) -> Const:
    """f(v): a per-node number of the graph (node or data size, node time, is_backward)."""
    if low.g is None:
        raise DataError(f"{f}() needs graph data, and no graph was given", e.loc)
    codes = low._elem_codes(e.args[0], t)
    arr = low.data.node_attrs[f]
    ok = (codes >= 0) & (codes < len(arr))
    if not ok.all():
        bad = low.u.value(int(codes[~ok][0]))
        raise DataError(f"{f}({bad!r}): not a node of graph '{low.g.name}'", e.loc)
    return Const(arr[codes], {"size": "size", "time": "time"}.get(f, ""))


@_builtin("size", (1, 1), "num", "size", "elem")
def _size(low, e, t):
    """size(v): the size of node or datum v in bytes. Reads the graph's nodes (and the
    H-graph's data sizes). A number per row; no IR columns or rows."""
    return _node_attr(low, e, t, "size")


@_builtin("is_backward", (1, 1), "bool", "", "elem")
def _is_backward(low, e, t):
    """is_backward(v): whether node v is a backward node. Reads the graph's nodes. A truth
    value per row; no IR columns or rows."""
    return _node_attr(low, e, t, "is_backward")


@_builtin("time", (1, 2), "num", "time", "elem")
def _time(low, e, t):
    """time(v): node v's compute time; time(k, o): compute node k's time with option o. Reads
    the graph's nodes or the H-graph's options. A number per row (seconds); no IR columns or rows."""
    return _table_lookup(low, e, t, "time") if len(e.args) == 2 else _node_attr(low, e, t, "time")


@_builtin("overhead phantom", (2, 2), "num", "size", "elem")
def _per_option(low, e, t):
    """overhead(k, o): the transient memory of node k with option o; phantom(j, o): the size of
    layer j's phantom (what its forward saves for the backward) with option o. Reads the
    H-graph's options. A number per row (bytes); no IR columns or rows."""
    return _table_lookup(low, e, t, e.func)


@_builtin("step_overhead", (3, 3), "num", "size", "elem")
def _step_overhead(low, e, t):
    """step_overhead(k, o, i): the transient memory at sub-step i of node k with option o.
    Reads the options' sub-step profiles. A number per row (bytes); no IR columns or rows."""
    return _table_lookup(low, e, t, "step_overhead")


@_builtin("fwd bwd layer", (1, 1), "elem", "", "elem")
def _layer_node(low, e, t):
    """fwd(j) / bwd(j): the forward / backward compute node of layer j; layer(k): the layer of
    compute node k. Reads the H-graph. An element per row (ordered like compute_nodes / layers); no IR
    columns or rows."""
    f = e.func
    table = low.data.elems.get(f)
    if table is None:
        raise DataError(f"{f}() needs layered graph data", e.loc)
    codes = low._elem_codes(e.args[0], t)
    known = (codes >= 0) & (codes < len(table))
    out = np.full(len(codes), INVALID, dtype=np.int64)
    out[known] = table[codes[known]]
    if (out < 0).any():
        bad = low.u.value(int(codes[out < 0][0]))
        raise DataError(f"{f}({bad!r}): not a {'layer' if f != 'layer' else 'layer node'}", e.loc)
    return Elem(out, low.sets["layers" if f == "layer" else "compute_nodes"])


@_builtin("backward_of", (1, 1), "elem", "", "elem")
def _backward_of(low, e, t):
    """backward_of(v): the backward node of forward node v in a Checkmate view whose backward
    nodes are named `g.<forward node>` (op graphs: `trace --ops`, `schedlang.pytorch.opgraph`);
    no element where v has none. Reads the graph's nodes. An element per row; no IR columns
    or rows."""
    if low.g is None:
        raise DataError("backward_of() needs graph data, and no graph was given", e.loc)
    table = low.data.elems.get("backward_of")
    codes = low._elem_codes(e.args[0], t)
    out = np.full(len(codes), INVALID, dtype=np.int64)
    if table is not None:
        known = (codes >= 0) & (codes < len(table))
        out[known] = table[codes[known]]
    return Elem(out, low.sets["backward_nodes"])


@_builtin("next prev", (1, 2), "elem", "", "elem")
def _next_prev(low, e, t):
    """next(v) / prev(v): the element after / before v in the ordered set v was bound from;
    next(v, S) / prev(v, S): in S. Past either end: no element (so references are out of
    domain). An element per row; no IR columns or rows."""
    f = e.func
    a = low.value(e.args[0], t)
    if not isinstance(a, Elem):
        raise CheckError(f"{f}() takes an element", e.args[0].loc)
    if len(e.args) == 2:
        sv = low.set_value(e.args[1], t)
        if not isinstance(sv, SetVal) or sv.arity != 1:
            raise CheckError(f"{f}(v, S) needs a constant set of single elements", e.args[1].loc)
        a = Elem(a.codes, sv)
    return low._shift(a, np.full(t.m, 1 if f == "next" else -1), e.loc, positional=True)


@_builtin("first last", (1, 1), "elem", "", "set")
def _first_last(low, e, t):
    """first(S) / last(S): the first / last element of a constant ordered set. An element per row;
    no IR columns or rows."""
    f = e.func
    sv = low.set_value(e.args[0], t)
    if isinstance(sv, SetVal):
        if len(sv) == 0:
            raise DataError(f"{f}() of an empty set", e.loc)
        return Elem(np.full(t.m, sv.cols[0 if f == "first" else -1, 0]), sv)
    raise CheckError(f"{f}() needs a set that does not depend on the index", e.loc)


@_builtin("ord", (1, 1), "num", "", "elem")
def _ord(low, e, t):
    """ord(v): the 1-based position of v in the ordered set it was bound from. A number per
    row; no IR columns or rows."""
    a = low.value(e.args[0], t)
    if not isinstance(a, Elem) or a.home is None:
        raise CheckError("ord() needs an element of an ordered set", e.args[0].loc)
    return Const(a.home.positions(len(low.u))[np.maximum(a.codes, 0)].astype(float) + 1)


@_builtin("card", (1, 1), "num", "", "set")
def _card(low, e, t):
    """card(S): the number of elements of S, per row when S depends on the row's names. A
    number per row; no IR columns or rows."""
    sv = low.set_value(e.args[0], with_row_id(t))
    if isinstance(sv, SetVal):
        return Const(np.full(t.m, float(len(sv))))
    return Const(np.bincount(sv.rows, minlength=t.m)[: t.m].astype(float))


@_builtin("abs floor ceil", (1, 1), "num", None, None)
def _math(low, e, t):
    """abs(x), floor(x), ceil(x) of a constant. A number per row, in x's unit; no IR columns
    or rows."""
    x = low._num(e.args[0], t)
    return Const({"abs": np.abs, "floor": np.floor, "ceil": np.ceil}[e.func](x))


@_builtin("preds succs", (1, 1), "set", "", "elem", kind="set_value")
def _preds_succs(low, e, t):
    """preds(v) / succs(v): the nodes with an edge into / out of v (Checkmate view). Reads the
    edges. A set per row (SetRel), used after `in`; no IR columns or rows."""
    v = low._elem_codes(e.args[0], t)
    edges = low.sets["edges"].cols
    key, other = (1, 0) if e.func == "preds" else (0, 1)
    idx = KeyIndex(edges[:, [key]], len(low.u))
    trows, erows = idx.join([v])
    return SetRel(trows, edges[erows][:, [other]])


@_builtin("ancestors descendants", (1, 1), "set", "", "elem", kind="set_value")
def _ancestors_descendants(low, e, t):
    """ancestors(v) / descendants(v): the nodes with a path of edges into / out of v
    (Checkmate view): every node computed before v's first computation / after it, in any
    order. Reads the edges. A set per row (SetRel), used after `in`; no IR columns or rows."""
    v = low._elem_codes(e.args[0], t)
    closure = _closure_pairs(low.sets["edges"].cols, e.func == "ancestors")
    idx = KeyIndex(closure[:, [0]], len(low.u))
    trows, crows = idx.join([v])
    return SetRel(trows, closure[crows][:, [1]])


def _closure_pairs(edges: np.ndarray, upward: bool) -> np.ndarray:
    """(node, other) code pairs for every path of `edges` (a DAG): other an ancestor of node
    (`upward`) or a descendant (networkx's transitive closure)."""
    paths = nx.transitive_closure_dag(nx.DiGraph(edges.tolist())).edges()
    pairs = sorted((b, a) for a, b in paths) if upward else sorted(paths)
    return np.array(pairs, dtype=np.int64).reshape(-1, 2)


# ------------------------------------------------------------------------------- graph data
class GraphData:
    """One graph bound to element codes: the built-in sets and the numbers functions read."""

    def __init__(self, g: Graph | None, u: Universe):
        self.sets: dict[str, SetVal] = {}
        self.tables: dict[str, tuple[KeyIndex, np.ndarray]] = {}  # time(k, o), overhead, ...
        self.elems: dict[str, np.ndarray] = {}  # fwd, bwd, layer: code -> code
        self.node_attrs: dict[str, np.ndarray] = {}  # size, time, is_backward: code -> value
        self.u = u
        if g is None:
            return
        data_codes = data_sizes = None
        g.check_total_bytes()
        if g.layers:
            data_codes, data_sizes = self._bind_hgraph(g, g.hgraph())
        codes = u.codes_of([n.name for n in g.nodes])  # topological order = code order
        size = np.zeros(len(u))
        time = np.zeros(len(u))
        backward = np.zeros(len(u), dtype=bool)
        if g.layers:
            size[data_codes] = data_sizes
        size[codes] = [float_at_least(n.size) for n in g.nodes]
        time[codes] = [n.time for n in g.nodes]
        backward[codes] = [n.kind == "backward" for n in g.nodes]
        self.node_attrs = {"size": size, "time": time, "is_backward": backward}
        self.sets["nodes"] = SetVal(codes.reshape(-1, 1), "nodes")
        self.sets["forward_nodes"] = SetVal(codes[~backward[codes]].reshape(-1, 1), "forward_nodes")
        self.sets["backward_nodes"] = SetVal(codes[backward[codes]].reshape(-1, 1), "backward_nodes")
        if g.edges:
            e = np.array([[u.code(a), u.code(b)] for a, b in g.edges], dtype=np.int64)
        else:
            e = np.zeros((0, 2), dtype=np.int64)
        self.sets["edges"] = SetVal(e, "edges")
        # backward_of(v): forward node v -> its backward node `g.<v>` (op graphs' naming)
        named = {n.name for n in g.nodes if n.kind == "backward"}
        grads = [(u.code(n.name), u.code("g." + n.name)) for n in g.nodes
                 if n.kind != "backward" and "g." + n.name in named]
        if grads:
            lookup = np.full(len(u), INVALID, dtype=np.int64)
            src, dst = np.array(grads, dtype=np.int64).T
            lookup[src] = dst
            self.elems["backward_of"] = lookup

    def _bind_hgraph(self, g: Graph, h):
        """The H-graph's sets, and its per-(node, option) data as tables (see BUILTIN_SETS)."""
        code = self.u.code
        compute = [code(k.name) for k in h.compute]  # registered first: code order = H-graph order
        data_codes = np.array([code(d) for d in h.data], dtype=np.int64)
        data_sizes = np.array([float_at_least(b) for b in h.data.values()], dtype=float)

        def rows(items, width):
            arr = np.array([[code(x) for x in item] for item in items], dtype=np.int64)
            return SetVal(arr.reshape(len(items), width))

        self.sets["compute_nodes"] = SetVal(np.array(compute, dtype=np.int64).reshape(-1, 1))
        self.sets["data_nodes"] = SetVal(data_codes.reshape(-1, 1))
        self.sets["creates"] = rows(h.creates, 2)
        self.sets["uses"] = rows(h.uses, 2)
        self.sets["option_uses"] = rows(h.option_uses, 3)
        node_opts = [(k.name, o.name) for k in h.compute for o in k.options]
        self.sets["options"] = rows(node_opts, 2)
        self.sets["layers"] = rows([(k.layer,) for k in h.compute if k.kind == "fwd"], 1)
        self.sets["phantom_options"] = rows(list(h.phantoms), 2)
        self.sets["inputs"] = rows([(d,) for d in h.inputs], 1)
        self.sets["outputs"] = rows([(d,) for d in h.outputs], 1)
        self.sets["chained"] = rows(h.chained, 2)
        pinned_data = {d.name for d in g.data if d.pinned}
        pinned_opts = {(layer.name, o.name) for layer in g.layers for o in layer.options if o.pinned}
        self.sets["offloadable_data"] = rows([(d,) for d in h.data if d not in pinned_data], 1)
        self.sets["offloadable_phantoms"] = rows([jo for jo, b in h.phantoms.items()
                                                  if b > 0 and jo not in pinned_opts], 2)
        base = len(self.u) + 1
        opts = self.sets["options"].cols
        self.tables["time"] = (KeyIndex(opts, base), np.array([o.time for k in h.compute for o in k.options]))
        self.tables["overhead"] = (KeyIndex(opts, base),
                                   np.array([float_at_least(o.overhead) for k in h.compute for o in k.options], float))
        self.tables["phantom"] = (KeyIndex(self.sets["phantom_options"].cols, base),
                                  np.array([float_at_least(b) for b in h.phantoms.values()], dtype=float))
        # sub-step profiles: steps are numbered 1..n per (node, option)
        steps, frees, pending, step_mem = [], [], [], []
        outputs = {k.name: [d for c, d in h.creates if c == k.name] for k in h.compute}
        for k in h.compute:
            for o in k.options:
                for i, st in enumerate(o.steps, 1):
                    steps.append((k.name, o.name, i))
                    step_mem.append(float_at_least(st.overhead))
                    frees += [(k.name, o.name, i, d) for d in st.frees]
                    pending += [(k.name, o.name, i, d) for d in outputs[k.name] if d not in st.creates]
        self.sets["stepped"] = rows(list(dict.fromkeys((k, o) for k, o, _ in steps)), 2)
        self.sets["steps"] = rows(steps, 3)
        self.sets["step_frees"] = rows(frees, 4)
        self.sets["step_pending"] = rows(pending, 4)
        self.tables["step_overhead"] = (KeyIndex(self.sets["steps"].cols, len(self.u) + 1),
                                        np.array(step_mem, dtype=float))
        # fwd(j), bwd(j), layer(k): code -> code lookup arrays (INVALID where undefined)
        pairs = {"fwd": [(code(k.layer), code(k.name)) for k in h.compute if k.kind == "fwd"],
                 "bwd": [(code(k.layer), code(k.name)) for k in h.compute if k.kind == "bwd"],
                 "layer": [(code(k.name), code(k.layer)) for k in h.compute if k.layer]}
        for f, items in pairs.items():
            lookup = np.full(len(self.u), INVALID, dtype=np.int64)
            src, dst = np.array(items, dtype=np.int64).reshape(-1, 2).T
            lookup[src] = dst
            self.elems[f] = lookup
        return data_codes, data_sizes
