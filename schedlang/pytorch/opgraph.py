"""Op graphs: a callable's aten-level graph, profiled op by op, in the Checkmate view.

`record_ops(fn, inputs)` takes any callable `fn(*inputs) -> tensor(s)` (a layer of
`partition`, a whole `nn.Module`: how layers are found does not matter here) and

* traces it with `make_fx` into an fx graph of aten ops whose placeholders are the module's
  parameters, its buffers, then the inputs (`torch.func.functional_call`, so the graph runs
  on the real parameters and their gradients land in `.grad`);
* runs that graph under autograd, op by op, `repeats` times: per op its forward time, the
  storages it creates, and which tensors autograd saves for it (a `saved_tensors_hooks` that
  attributes each packed storage to the op running); then the backward, timing each op's
  autograd node (node pre-hooks and hooks);
* groups the ops into **units**, the smallest runs of ops between which the graph can be cut:
  a `getitem` stays with the op it reads, an in-place op with the op before it, and a cut is
  legal only where every value crossing it is a tensor that no later op modifies in place.
  A unit is what the formulations see as one node and what a generated option may cut at.

`OpGraph.checkmate()` writes the units as Checkmate-view graph data: a forward node per unit
(its time, the bytes of the storages it creates: a view creates none), a backward node
`g.<unit>` per unit with an autograd node (the backward's time; size: the gradients of the
unit's inputs), edges for the forward's data (a view's readers also read the storage's owner),
for what autograd saves (owner of the saved storage -> backward node), and for the gradient
flow (a reader's backward -> the unit's backward). With `loss=True` a `loss` node reads the
outputs and starts the backward (a whole model: `schedlang trace --ops`); without, the
backward nodes of the outputs start it (one layer: `models/layer_options.sched`).
Parameters, buffers and inputs are not nodes: they are resident.
"""
from __future__ import annotations

import hashlib
import operator
import time
from dataclasses import dataclass, field

import torch
import torch.fx as fx
from torch import nn
from torch.utils._pytree import tree_flatten

from ..graphs.elements import Node
from ..graphs.graph import Graph
from ..language.errors import DataError, Loc
from .loss_node import LOSS_TIME
from .memory import storage_key

__all__ = ["OpUnit", "OpGraph", "record_ops", "run_graph"]

WHERE = Loc("opgraph")
#: the time of a parameter-gradient node (the backward node `g.<unit>` carries the measured
#: time of both) and the name of the node that holds them all to the end of the step
PARAM_GRAD_TIME = 1e-9
PARAM_GRADS_END = "params.grad"


@dataclass
class OpUnit:
    name: str
    nodes: list[str]  # fx node names, in order
    # seconds (the least over the repeats: the load of a shared CPU only adds)
    fwd_time: float = 0.0
    bwd_time: float = 0.0
    created: int = 0  # bytes of the storages its ops create
    reads: list[str] = field(default_factory=list)  # units whose values it reads
    saved_from: list[str] = field(default_factory=list)  # units owning what autograd saves for it
    grad_bytes: int = 0  # bytes of the gradients of its inputs (values read from others)
    has_backward: bool = False
    saves_input: bool = False  # autograd saves a layer input or its views for it
    ops: list[str] = field(default_factory=list)  # aten op names
    # bytes of the parameter gradients its backward creates: the parameters (with their views)
    # whose last reader in the forward it is, so the first to run in the backward
    param_grad_bytes: int = 0


@dataclass
class OpGraph:
    gm: fx.GraphModule  # placeholders: parameters, buffers, inputs
    n_params: int
    n_buffers: int
    units: list[OpUnit]
    outputs: list[str]  # units whose values the callable returns (owners of their storages)
    output_reads: list[str]  # units whose values are returned (the views included)
    n_ops: int
    signature: str
    input_bytes: list[int] = field(default_factory=list)
    saved_total: int = 0  # bytes autograd saves inside (outside the inputs and parameters)

    def unit(self, name: str) -> OpUnit:
        return next(u for u in self.units if u.name == name)

    def checkmate(self, name: str = "ops", loss: bool = True, prefix: str = "",
                  param_grads: bool = False) -> Graph:
        """The Checkmate-view graph data of the units (see the module docstring)."""
        g = Graph(name, f"{len(self.units)} units of {self.n_ops} aten ops", time_unit="s")
        append_checkmate(g, self, prefix, loss, param_grads)
        return g


def append_checkmate(g: Graph, og: OpGraph, prefix: str = "", loss: bool = True,
                     param_grads: bool = False) -> None:
    """Add the nodes and edges of `og` to `g` (names prefixed by `prefix`)."""
    def p(u: str) -> str:
        return prefix + u

    for u in og.units:
        g.nodes.append(Node(p(u.name), _round(u.fwd_time), int(u.created)))
    with_bwd = {u.name for u in og.units if u.has_backward}
    readers: dict[str, list[str]] = {u.name: [] for u in og.units}
    for u in og.units:
        for r in u.reads:
            readers[r].append(u.name)
            g.edges.append((p(r), p(u.name)))
    if loss:
        g.nodes.append(Node(p("loss") if prefix else "loss", LOSS_TIME, 4))
        for o in og.output_reads:
            g.edges.append((p(o), p("loss") if prefix else "loss"))
    held: list[str] = []
    for u in reversed(og.units):
        if u.name not in with_bwd:
            continue
        gu = p("g." + u.name)
        g.nodes.append(Node(gu, _round(u.bwd_time), int(u.grad_bytes), "backward"))
        ins = [p(s) for s in u.saved_from]
        ins += [p("g." + w) for w in readers[u.name] if w in with_bwd]
        if loss and u.name in og.output_reads:
            ins.append(p("loss") if prefix else "loss")
        g.edges += [(a, gu) for a in ins]
        if param_grads and u.param_grad_bytes:
            # its parameter gradients: computed from what its backward reads, held to the end
            pg = p("pg." + u.name)
            g.nodes.append(Node(pg, PARAM_GRAD_TIME, int(u.param_grad_bytes), "backward"))
            g.edges += [(a, pg) for a in ins]
            held.append(pg)
    if held:
        g.nodes.append(Node(p(PARAM_GRADS_END), PARAM_GRAD_TIME, 0, "backward"))
        g.edges += [(pg, p(PARAM_GRADS_END)) for pg in held]
    g.edges = list(dict.fromkeys(g.edges))


def _round(t: float) -> float:
    return float(f"{float(t):.4g}")


# --- tracing ---------------------------------------------------------------------------------
def _functional(fn, params: dict, buffers: dict):
    if isinstance(fn, nn.Module):
        from torch.func import functional_call

        def call(p, b, *xs):
            return functional_call(fn, {**p, **b}, xs)
    else:
        def call(p, b, *xs):
            return fn(*xs)
    return call


def _make_graph(fn, inputs: tuple):
    from torch.fx.experimental.proxy_tensor import make_fx

    if isinstance(fn, nn.Module):
        params = dict(fn.named_parameters())
        buffers = dict(fn.named_buffers())
    else:
        params, buffers = {}, {}
    dev = inputs[0].device if inputs else torch.device("cpu")
    try:
        with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
            gm = make_fx(_functional(fn, params, buffers))(params, buffers, *inputs)
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise DataError(f"make_fx cannot trace {type(fn).__name__} to aten ops: "
                        f"{type(exc).__name__}: {first}", WHERE) from None
    return gm, list(params.values()), list(buffers.values())


#: a tensor constant of a traced graph up to this many elements is rebuilt by a call of
#: `constant_tensor` where it is read, from its values kept as Python numbers
CONSTANT_NUMEL = 64


def constant_tensor(values, dtype: torch.dtype, device: str) -> torch.Tensor:
    """A tensor constant of a recorded graph (`_constants_as_calls`), made where it is read."""
    return torch.tensor(values, dtype=dtype, device=device)


def _constants_as_calls(gm: fx.GraphModule) -> None:
    """Each small tensor constant make_fx keeps on the graph module (a ``get_attr`` node: a
    tensor the forward made from Python values, as GPT-Neo's and Falcon's attention mask
    value ``torch.tensor(finfo.min)``) replaced by a call of `constant_tensor` with its
    values: the graph, which the process caches per layer structure, then holds no tensor
    of the model once the model is gone. (Not an aten op: a selective checkpoint's policy
    does not count it, as it does not count the eager ``lift_fresh`` it stands for.)"""
    changed = False
    for n in list(gm.graph.nodes):
        if n.op != "get_attr":
            continue
        value = operator.attrgetter(n.target)(gm)
        if not isinstance(value, torch.Tensor) or isinstance(value, nn.Parameter) \
                or value.numel() > CONSTANT_NUMEL:
            continue
        with gm.graph.inserting_before(n):
            call = gm.graph.call_function(constant_tensor, (value.tolist(), value.dtype,
                                                           str(value.device)))
        call.meta["val"] = torch.empty_like(value, device="meta")
        n.replace_all_uses_with(call)
        gm.graph.erase_node(n)
        owner, _, attr = n.target.rpartition(".")
        delattr(gm.get_submodule(owner) if owner else gm, attr)
        changed = True
    if changed:
        gm.graph.lint()
        gm.recompile()


def _mutates(n: fx.Node) -> bool:
    schema = getattr(n.target, "_schema", None)
    return bool(schema is not None and schema.is_mutable)


def _is_view(n: fx.Node) -> bool:
    """An op whose output shares its first input's storage (view, transpose, expand, split,
    a getitem of a split, ...): it moves no memory."""
    if n.op != "call_function":
        return False
    if n.target is operator.getitem:
        return bool(n.args) and isinstance(n.args[0], fx.Node) and _is_view(n.args[0])
    schema = getattr(n.target, "_schema", None)
    return bool(schema is not None and not schema.is_mutable and schema.returns
                and any(r.alias_info is not None for r in schema.returns))


def may_alias(n: fx.Node) -> bool:
    """Whether `n` may return memory of one of its inputs: a view, an in-place op, or a call
    that is not an aten op (unknown: assumed so)."""
    schema = getattr(n.target, "_schema", None)
    if n.op != "call_function" or schema is None:
        return True
    return any(r.alias_info is not None for r in schema.returns)


def _view_bases(nodes: list[fx.Node]) -> dict:
    """Each call node of `nodes` (in graph order) -> the node owning its storage: itself, or
    for a view (`_is_view`) the base of the node it views. A placeholder is its own base
    (`base.get(a, a)`)."""
    base: dict = {}
    for n in nodes:
        first = n.args[0] if n.args and isinstance(n.args[0], fx.Node) else None
        base[n] = base.get(first, first) if _is_view(n) and first is not None else n
    return base


def _nbytes(n) -> int:
    val = n.meta.get("val") if isinstance(n, fx.Node) else None
    return val.untyped_storage().nbytes() if isinstance(val, torch.Tensor) else 0


def hoist_copies(gm: fx.GraphModule) -> int:
    """Move a copy up to the previous reader of the storage it copies, when it is that
    storage's last reader and its output is smaller (e.g. attention's `v.contiguous()`, which
    the traced order runs after the scores and the softmax): the storage can then be freed
    right after, in the forward and in every recomputation. Only pure ops move (no in-place
    op, no random op: the RNG stream keeps its order), with the views they read. Returns how
    many copies moved."""
    moved = 0
    for _ in range(len(gm.graph.nodes)):
        nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
        pos = {n: k for k, n in enumerate(nodes)}
        base = _view_bases(nodes)
        readers: dict = {}
        for n in nodes:
            if not _is_view(n):
                for a in n.all_input_nodes:
                    readers.setdefault(base.get(a, a), []).append(n)
        change = None
        for n in nodes:
            if _is_view(n) or _mutates(n) or n.target is operator.getitem:
                continue
            tags = getattr(n.target, "tags", ())
            if torch.Tag.nondeterministic_seeded in tags:
                continue
            bases = {base.get(a, a) for a in n.all_input_nodes}
            if len(bases) != 1:
                continue
            src = next(iter(bases))
            rs = readers.get(src, [])
            if not rs or rs[-1] is not n or len(rs) < 2 or pos[rs[-2]] + 1 >= pos[n]:
                continue
            if not 0 < _nbytes(n) < _nbytes(src):
                continue
            prev = rs[-2]
            # the views n reads that come after `prev` move with it
            chain, stack, ok = [], list(n.all_input_nodes), True
            while stack:
                a = stack.pop()
                if a.op != "call_function" or pos[a] <= pos[prev] or a in chain:
                    continue
                if not _is_view(a):
                    ok = False
                    break
                chain.append(a)
                stack += a.all_input_nodes
            between = nodes[pos[prev] + 1:pos[n]]
            touched = any(_mutates(m) and any(base.get(a, a) is src for a in m.all_input_nodes)
                          for m in between)  # an in-place op on the copied storage
            if ok and not touched:
                change = (prev, sorted(chain, key=pos.get) + [n])
                break
        if change is None:
            return moved
        at, group = change
        for m in group:
            at.append(m)
            at = m
        moved += 1
    return moved


def _units_of(gm: fx.GraphModule) -> list[list[fx.Node]]:
    """Group the call nodes into units: the legal cut points (module docstring)."""
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    units: list[list[fx.Node]] = []
    for n in calls:
        if units and (n.target is operator.getitem or _mutates(n)):
            units[-1].append(n)
        else:
            units.append([n])
    # merge where a cut is illegal: a non-tensor crosses, or a later op mutates a crossing value
    changed = True
    while changed:
        changed = False
        for k in range(len(units) - 1):
            produced = [n for us in units[:k + 1] for n in us]
            later = {n for us in units[k + 1:] for n in us}
            crossing = {n for n in produced
                        if any(u in later or u.op == "output" for u in n.users)}
            bad = any(not isinstance(n.meta.get("val"), torch.Tensor) for n in crossing)
            if not bad:
                bad = any(_mutates(m) and m.args and m.args[0] in crossing for m in later)
            if bad:
                units[k] += units[k + 1]
                del units[k + 1]
                changed = True
                break
    return units


def run_graph(gm: fx.GraphModule, args: list, nodes=None, env=None, hook=None) -> dict:
    """Run the call nodes `nodes` of `gm` (all by default) on `env` (placeholder values by
    name, given as `args` in placeholder order when env is None); returns the env."""
    if env is None:
        env = {}
        ph = [n for n in gm.graph.nodes if n.op == "placeholder"]
        for n, a in zip(ph, args):
            env[n.name] = a
    nodes = nodes if nodes is not None else [n for n in gm.graph.nodes if n.op == "call_function"]

    def load(a):
        if not isinstance(a, fx.Node):
            return a
        if a.name not in env and a.op == "get_attr":
            # a tensor the traced code made from Python values (GPT-Neo's mask value,
            # ``torch.tensor(finfo.min)``): make_fx keeps it on the graph module
            env[a.name] = operator.attrgetter(a.target)(gm)
        return env[a.name]

    for n in nodes:
        a = fx.node.map_arg(n.args, load)
        kw = fx.node.map_arg(n.kwargs, load)
        if hook is not None:
            hook(n, True)
        env[n.name] = n.target(*a, **kw)
        if hook is not None:
            hook(n, False)
    return env


def graph_outputs(gm: fx.GraphModule) -> list[fx.Node]:
    out = next(n for n in gm.graph.nodes if n.op == "output")
    return [a for a in tree_flatten(out.args[0])[0] if isinstance(a, fx.Node)]


# --- recording ---------------------------------------------------------------------------------
def _leaf_args(params, buffers, inputs, requires_grad) -> list:
    ps = [p.detach().requires_grad_(p.requires_grad) for p in params]
    xs = [x.detach().requires_grad_(bool(rg) and x.is_floating_point())
          for x, rg in zip(inputs, requires_grad)]
    return ps + [b.detach() for b in buffers] + xs



def record_ops(fn, inputs, requires_grad=None, repeats: int = 3) -> OpGraph:
    """The profiled op graph of `fn(*inputs)` (module docstring). `requires_grad`: per input,
    whether its gradient is wanted (default: floating-point inputs)."""
    inputs = tuple(inputs) if not isinstance(inputs, torch.Tensor) else (inputs,)
    gm, params, buffers = _make_graph(fn, inputs)
    _constants_as_calls(gm)
    if hoist_copies(gm):
        gm.graph.lint()
        gm.recompile()
    if requires_grad is None:
        requires_grad = [x.is_floating_point() for x in inputs]
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    n_params, n_buffers = len(params), len(buffers)
    n_fixed = n_params + n_buffers
    units = _units_of(gm)
    unit_of = {n.name: k for k, us in enumerate(units) for n in us}
    calls = [n for us in units for n in us]
    names = [_unit_name(us) for us in units]
    dev = inputs[0].device if inputs else torch.device("cpu")
    K = len(units)

    fwd: dict[str, list[float]] = {n.name: [] for n in calls}
    bwd: list[list[float]] = [[] for _ in range(K)]
    # structure, from the first run (its values stay alive until read: equal storage pointers
    # then mean shared storage)
    owner: dict[int, int] = {}  # storage -> creating unit (-1: a placeholder)
    ptr_of: dict[str, int] = {}
    sizes: dict[int, int] = {}
    created = [0] * K
    saved: list[set] = [set() for _ in range(K)]
    has_bwd = [False] * K
    grad_size: dict[str, int] = {}  # value -> bytes of its gradient
    input_ptrs: set = set()
    current = [None]
    clock = [0.0]
    first = [True]

    def hook(n, before):
        if before:
            current[0] = unit_of[n.name]
            clock[0] = time.perf_counter()
        else:
            fwd[n.name].append(time.perf_counter() - clock[0])

    def pack(t):
        if first[0] and current[0] is not None:
            saved[current[0]].add(storage_key(t))
        return t.detach()  # the live tensor would tie its grad_fn to itself (a C++ cycle)

    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
        for r in range(repeats + 1):
            first[0] = r == 0
            args = _leaf_args(params, buffers, inputs, requires_grad)
            env = {n.name: a for n, a in zip(placeholders, args)}
            with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                run_graph(gm, args, calls, env, hook)
            current[0] = None
            if first[0]:
                input_ptrs = {storage_key(a) for a in args[n_fixed:]}
                _record_structure(placeholders, args, calls, env, unit_of, owner, ptr_of, sizes,
                                  created, grad_size)
            acc = _timed_backward(gm, calls, env, unit_of, has_bwd)
            if r:
                for k in range(K):
                    bwd[k].append(acc[k])
            else:
                for n in calls:
                    fwd[n.name].clear()
            del env, args

    group, members = _merged_units(created)
    unit_of = {n: group[k] for n, k in unit_of.items()}
    owner = {p: (group[k] if k >= 0 else -1) for p, k in owner.items()}
    names = [names[ks[0]] for ks in members]
    param_grad_bytes = _param_grad_bytes(calls, placeholders, params, unit_of, len(members))
    ops_units: list[OpUnit] = []
    saved_total = 0
    counted: set = set()
    for k, ks in enumerate(members):
        us = [n for j in ks for n in units[j]]
        reads: list[str] = []
        for n in us:
            for a in n.all_input_nodes:
                j = unit_of.get(a.name)
                o = owner.get(ptr_of.get(a.name), -1)
                for c in (j, o):
                    if c is not None and c >= 0 and c != k and names[c] not in reads:
                        reads.append(names[c])
        sv = []
        ksaved = set().union(*(saved[j] for j in ks))
        for p in ksaved:
            o = owner.get(p, -1)
            if o >= 0 and names[o] not in sv:
                sv.append(names[o])
            if o >= 0 and p not in counted:
                counted.add(p)
                saved_total += sizes.get(p, 0)
        reads_in = {a for n in us for a in n.all_input_nodes
                    if a.op == "placeholder" or unit_of.get(a.name) != k}
        gbytes = sum(grad_size.get(a.name, 0) for a in reads_in
                     if not (a.op == "placeholder" and placeholders.index(a) < n_fixed))
        ops_units.append(OpUnit(
            names[k], [n.name for n in us],
            min(sum(fwd[n.name][r] for n in us) for r in range(repeats)),
            min(sum(bwd[j][r] for j in ks) for r in range(repeats)),
            sum(created[j] for j in ks), reads, sv, gbytes, any(has_bwd[j] for j in ks),
            any(p in input_ptrs for p in ksaved), [_op_name(n) for n in us],
            param_grad_bytes[k]))
    out_units, out_reads = _output_units(gm, unit_of, owner, ptr_of, names)
    return OpGraph(gm, n_params, n_buffers, ops_units, out_units, out_reads, len(calls),
                   _signature(gm, inputs), [x.numel() * x.element_size() for x in inputs],
                   saved_total)



def _record_structure(placeholders, args, calls, env, unit_of: dict, owner: dict, ptr_of: dict,
                      sizes: dict, created: list, grad_size: dict) -> None:
    """From the first run (its values alive: equal storage pointers mean shared storage):
    each value's storage (`ptr_of`), each storage's creating unit (`owner`, -1 for a
    placeholder) and size, the bytes each unit creates, and each value's gradient size."""
    for n, a in zip(placeholders, args):
        ptr_of[n.name] = storage_key(a)
        owner.setdefault(storage_key(a), -1)
    for n in calls:
        k = unit_of[n.name]
        for t in tree_flatten(env[n.name])[0]:
            if not isinstance(t, torch.Tensor):
                continue
            ptr_of.setdefault(n.name, storage_key(t))
            if storage_key(t) not in owner and t.untyped_storage().nbytes():
                owner[storage_key(t)] = k
                sizes[storage_key(t)] = t.untyped_storage().nbytes()
                created[k] += t.untyped_storage().nbytes()
    for name, v in env.items():
        if isinstance(v, torch.Tensor) and v.requires_grad:
            grad_size[name] = v.numel() * v.element_size()


def _timed_backward(gm, calls, env, unit_of, has_bwd: list) -> list[float]:
    """Seconds of each unit's autograd nodes in one backward of the recorded run `env`
    (node pre-hooks and hooks); `has_bwd[k]` set for the units that have nodes."""
    grad_fns: dict = {}
    for n in calls:
        for t in tree_flatten(env[n.name])[0]:
            if isinstance(t, torch.Tensor) and t.grad_fn is not None:
                grad_fns.setdefault(t.grad_fn, unit_of[n.name])
    starts: dict = {}
    acc = [0.0] * len(has_bwd)
    handles = []
    for gf, k in grad_fns.items():
        has_bwd[k] = True

        def pre(gout, gf=gf):
            starts[gf] = time.perf_counter()

        def post(gin, gout, gf=gf, k=k):
            acc[k] += time.perf_counter() - starts.get(gf, time.perf_counter())

        handles.append(gf.register_prehook(pre))
        handles.append(gf.register_hook(post))
    outs = [env[o.name] for o in graph_outputs(gm)]
    roots = [o for o in outs if isinstance(o, torch.Tensor) and o.requires_grad]
    if roots:
        torch.autograd.backward(roots, [torch.ones_like(o) for o in roots])
    for h in handles:
        h.remove()
    return acc


def _merged_units(created: list[int]) -> tuple[list[int], list[list[int]]]:
    """(unit -> its group, group -> its units): a unit that creates no storage (views,
    getitems) joins the unit before it, since cutting right before or right after it saves
    the same bytes."""
    group: list[int] = []
    for k in range(len(created)):
        group.append(group[-1] if k and created[k] == 0 else (group[-1] + 1 if k else 0))
    members: list[list[int]] = [[] for _ in range(group[-1] + 1 if group else 0)]
    for k, g in enumerate(group):
        members[g].append(k)
    return group, members


def _param_grad_bytes(calls, placeholders, params, unit_of: dict, count: int) -> list[int]:
    """Bytes of the parameter gradients each unit's backward makes: a trainable parameter's
    gradient appears in the backward of its last reader (through views: `t(weight)` is read
    by the matmul)."""
    base = _view_bases(calls)
    trainable = {placeholders[i]: p.numel() * p.element_size()
                 for i, p in enumerate(params) if p.requires_grad}
    last_reader: dict = {}
    for n in calls:
        if base[n] is not n:  # a view: its readers read the parameter
            continue
        for a in n.all_input_nodes:
            b = base.get(a, a)
            if b in trainable:
                last_reader[b] = max(last_reader.get(b, -1), unit_of[n.name])
    out = [0] * count
    for b, k in last_reader.items():
        out[k] += trainable[b]
    return out


def _output_units(gm, unit_of: dict, owner: dict, ptr_of: dict, names: list[str]) -> tuple:
    """(units whose values the graph returns, units whose storages it returns: views too)."""
    out_units: list[str] = []
    out_reads: list[str] = []
    for a in graph_outputs(gm):
        j = unit_of.get(a.name)
        for o in (j, owner.get(ptr_of.get(a.name), -1)):
            if o is not None and o >= 0 and names[o] not in out_reads:
                out_reads.append(names[o])
        if j is not None and names[j] not in out_units:
            out_units.append(names[j])
    return out_units, out_reads

def _unit_name(nodes: list[fx.Node]) -> str:
    return nodes[0].name


def _op_name(n: fx.Node) -> str:
    """`addmm`, `relu_`, `getitem`: the aten op's name without its overload."""
    t = n.target
    packet = getattr(t, "overloadpacket", None)
    return getattr(packet, "__name__", None) or getattr(t, "__name__", None) or str(t)


def _signature(gm: fx.GraphModule, inputs) -> str:
    items = [tuple((tuple(x.shape), str(x.dtype)) for x in inputs)]
    for n in gm.graph.nodes:
        val = n.meta.get("val")
        shape = tuple(val.shape) if isinstance(val, torch.Tensor) else None
        items.append((n.op, str(n.target), str(n.args), str(n.kwargs), shape))
    return hashlib.sha1(repr(items).encode()).hexdigest()[:16]
