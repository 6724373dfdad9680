"""Cut a PyTorch module into layers called one after the other, exchanging tensors.

`partition(model, sample_inputs, layers=None)` traces `model` with `torch.fx` (a tracer that
keeps the chosen layer submodules as leaves), then groups the traced nodes into consecutive
segments, one per layer: a layer's submodule call plus the glue operations (additions, `cat`,
views...) placed next to it, so that every layer is a callable `module(*inputs) -> tuple`. The
layers form a DAG over *data*: a tensor one layer produces may be read by any later layer (a
U-Net's skip connection).

Which submodules become layers when `layers` is None:

* an `nn.Sequential` root: each child;
* a module holding an `nn.ModuleList` / `nn.Sequential` of at least two structurally identical
  blocks (GPT, BERT, Llama shapes): each child of that container; what runs before the first
  block becomes the layer `embed`, what runs after the last one the layer `head`;
* otherwise the root's direct children that are called (the children of a top-level
  `ModuleList`/`ModuleDict` instead of the container).

Glue between two layer calls joins the following layer; glue before the first (after the last)
call joins it, unless it calls modules or uses parameters, in which case it becomes a layer of
its own (`pre` / `post`; `embed` / `head` for block models). A layer whose outputs all share
storage with its inputs (a view like `Flatten`, `Identity`, an in-place `ReLU(inplace=True)`)
joins the previous layer; `getitem` on a tuple a layer returns runs in that layer. Only tensors
may cross layer boundaries; a non-tensor computed from tensors (`x.size(0)`) is computed again
by the layer that uses it.

Data names (the runtime relies on them): the model's inputs `input0`, `input1`...; a layer's
outputs `<layer>.out` (one output) or `<layer>.out0`, `<layer>.out1`...; gradients
`<data>.grad`.
"""
from __future__ import annotations

import hashlib
import inspect
import operator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch import nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from ..language.errors import DataError, Loc, SchedError, did_you_mean

__all__ = ["TensorMeta", "LayerPart", "Partitioned", "partition", "module_key"]

WHERE = Loc("partition")


@dataclass
class TensorMeta:
    shape: tuple
    dtype: torch.dtype
    nbytes: int
    requires_grad: bool
    device: str = "cpu"


@dataclass
class LayerPart:
    name: str  # layer name in the graph data ("blocks.3", "embed", "head")
    module: nn.Module  # module(*input tensors) -> tuple of output tensors (always a tuple)
    inputs: list[str]  # data names read, in call order
    outputs: list[str]  # data names produced, in return order
    signature: str  # equal for structurally identical layers (profiled once)
    params: list[str]  # qualified names (in the root) of the parameters this layer uses
    calls: list[str] = field(default_factory=list)  # qualified names of the submodules it calls


@dataclass
class Partitioned:
    root: nn.Module  # the user's module (parameters are the root's, shared)
    layers: list[LayerPart]  # execution order
    inputs: list[str]  # data names of the model's tensor inputs, in call order
    outputs: list[str]  # data names of the tensors the model returns (flattened, no repeats)
    data: dict[str, TensorMeta]  # every data name -> meta from one sample run
    mode: str = ""  # how the layers were chosen: "sequential", "blocks", "children", "user"
    sample_inputs: tuple = ()  # the inputs given to `partition` (profile runs on them)
    _spec: Any = None  # pytree spec of the module's output
    _slots: list = field(default_factory=list)  # per output leaf: ("data", i) or ("const", v)

    def layer(self, name: str) -> LayerPart:
        for part in self.layers:
            if part.name == name:
                return part
        raise KeyError(name)

    def producers(self) -> dict[str, str]:
        """data name -> name of the layer producing it (model inputs are absent)."""
        return {d: part.name for part in self.layers for d in part.outputs}

    def unflatten(self, tensors: list) -> Any:
        """The module's output structure rebuilt from tensors given in `outputs` order."""
        tensors = list(tensors)
        if len(tensors) != len(self.outputs):
            raise SchedError(f"unflatten needs {len(self.outputs)} tensors (the model's outputs "
                             f"{', '.join(self.outputs)}), got {len(tensors)}", WHERE)
        leaves = [tensors[v] if kind == "data" else v for kind, v in self._slots]
        return tree_unflatten(leaves, self._spec)

    def run_eager(self, *inputs):
        """Run the layers in order with plain autograd; equals `root(*inputs)`."""
        if len(inputs) != len(self.inputs):
            raise SchedError(f"the model takes {len(self.inputs)} tensor inputs, got {len(inputs)}",
                             WHERE)
        env = dict(zip(self.inputs, inputs))
        for part in self.layers:
            outs = part.module(*[env[d] for d in part.inputs])
            env.update(zip(part.outputs, outs))
        return self.unflatten([env[d] for d in self.outputs])


# --- structural keys -----------------------------------------------------------------------
def module_key(m: nn.Module) -> tuple:
    """Equal for modules with the same type, structure, parameter shapes and mode."""
    params = tuple((n, tuple(p.shape), str(p.dtype), p.requires_grad)
                   for n, p in m.named_parameters())
    buffers = tuple((n, tuple(b.shape), str(b.dtype)) for n, b in m.named_buffers())
    types = tuple(f"{type(s).__module__}.{type(s).__qualname__}" for s in m.modules())
    modes = tuple(s.training for s in m.modules())
    return (types, repr(m), params, buffers, modes)


def _target_name(target) -> str:
    if isinstance(target, str):
        return target
    mod = getattr(target, "__module__", None) or ""
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or repr(target)
    return f"{mod}.{name}"


# --- tracing -------------------------------------------------------------------------------
class _Tracer(fx.Tracer):
    def __init__(self, leaves: set[str]):
        super().__init__()
        self.leaves = leaves

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        if qualname in self.leaves:
            return True
        return super().is_leaf_module(m, qualname)


def _block_container(root: nn.Module) -> tuple[str, list[str]] | None:
    """The shallowest ModuleList/Sequential whose children are mostly identical blocks."""
    best = None
    for name, m in root.named_modules():
        if not isinstance(m, (nn.ModuleList, nn.Sequential)) or m is root:
            continue
        children = list(m.named_children())
        if len(children) < 2:
            continue
        groups: dict = {}
        for cname, c in children:
            if not any(True for _ in c.parameters()):
                continue
            groups.setdefault(module_key(c), []).append(cname)
        size = max((len(g) for g in groups.values()), default=0)
        if size < 2 or 2 * size < len(children):
            continue
        depth = name.count(".")
        rank = (depth, -size)
        if best is None or rank < best[0]:
            best = (rank, name, [f"{name}.{c}" for c, _ in children])
    return None if best is None else (best[1], best[2])


def _choose_leaves(root: nn.Module, layers) -> tuple[str, list[str]]:
    if layers is not None:
        if isinstance(layers, str):
            layers = [s for s in layers.split(",") if s.strip()]
        names = [str(s).strip() for s in layers]
        if not names:
            raise SchedError("layers is empty: give submodule names, or None to choose "
                             "automatically", WHERE)
        modules = dict(root.named_modules())
        for n in names:
            if n == "" or n not in modules:
                raise SchedError(f"layers: the model has no submodule '{n}'"
                                 f"{did_you_mean(n, [k for k in modules if k])}", WHERE)
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise SchedError(f"layers: '{dup}' is listed twice", WHERE)
        for a in names:
            for b in names:
                if a != b and b.startswith(a + "."):
                    raise SchedError(f"layers: '{b}' is inside '{a}'; layers must not nest", WHERE)
        return "user", names
    if isinstance(root, nn.Sequential):
        return "sequential", [n for n, _ in root.named_children()]
    found = _block_container(root)
    if found is not None:
        return "blocks", found[1]
    names = []
    for n, c in root.named_children():
        if isinstance(c, (nn.ModuleList, nn.ModuleDict)):
            names += [f"{n}.{k}" for k, _ in c.named_children()]
        else:
            names.append(n)
    return "children", names


def _trace(root: nn.Module, leaves: list[str], n_inputs: int) -> fx.GraphModule:
    try:
        params = list(inspect.signature(root.forward).parameters.values())
    except (TypeError, ValueError):
        params = []
    concrete = {}
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if params and not any(p.kind == p.VAR_POSITIONAL for p in params):
        if len(positional) < n_inputs:
            raise SchedError(f"the model's forward takes {len(positional)} positional inputs, "
                             f"{n_inputs} sample inputs were given", WHERE)
        for p in positional[n_inputs:]:
            if p.default is p.empty:
                raise SchedError(f"the model's forward needs input '{p.name}' and only {n_inputs} "
                                 "sample inputs were given", WHERE)
            concrete[p.name] = p.default
    tracer = _Tracer(set(leaves))
    try:
        graph = tracer.trace(root, concrete_args=concrete or None)
    except SchedError:
        raise
    except Exception as exc:  # fx raises many types (TraceError, TypeError, RuntimeError...)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataError(f"torch.fx cannot trace {type(root).__name__}: {first}; choose layers "
                        "(layers=[...] / --layers) that contain the untraceable code, which "
                        "then is not traced", WHERE) from None
    return fx.GraphModule(tracer.root, graph, type(root).__name__)


class _MetaRecorder(fx.Interpreter):
    """One sample run: the meta of every value and the storage of every tensor. Values are kept
    alive until the run ends, so that equal storages mean aliasing, not a reused address."""

    def __init__(self, gm):
        super().__init__(gm, garbage_collect_values=False)
        self.values: dict[str, Any] = {}
        self.storage: dict[str, int] = {}  # node -> data_ptr of its output's storage

    def run_node(self, n):
        out = super().run_node(n)
        if isinstance(out, torch.Tensor):
            try:
                self.storage[n.name] = out.untyped_storage().data_ptr()
            except (RuntimeError, NotImplementedError):
                pass
            self.values[n.name] = TensorMeta(tuple(out.shape), out.dtype,
                                             out.numel() * out.element_size(),
                                             bool(out.requires_grad), str(out.device))
        else:
            self.values[n.name] = out if isinstance(out, (int, float, bool, type(None), str)) \
                else type(out).__name__
        return out


_INPLACE_FUNCS = {operator.iadd, operator.isub, operator.imul, operator.itruediv,
                  operator.ifloordiv, operator.imod, operator.ipow, operator.iand, operator.ior,
                  operator.ixor, operator.ilshift, operator.irshift, operator.imatmul}


def _is_inplace(n: fx.Node) -> bool:
    if n.op == "call_function":
        return n.target in _INPLACE_FUNCS or (getattr(n.target, "__name__", "").endswith("_")
                                              and not getattr(n.target, "__name__", "").endswith("__"))
    if n.op == "call_method":
        return n.target.endswith("_") and not n.target.endswith("__")
    return False


# --- partition -----------------------------------------------------------------------------
def partition(model: nn.Module, sample_inputs: tuple, layers: list[str] | None = None) -> Partitioned:
    """Cut `model` into layers (see the module docstring); `sample_inputs` are its tensor inputs."""
    if not isinstance(model, nn.Module):
        raise SchedError(f"partition needs an nn.Module, got {type(model).__name__}", WHERE)
    if isinstance(sample_inputs, torch.Tensor):
        sample_inputs = (sample_inputs,)
    sample_inputs = tuple(sample_inputs)
    for i, x in enumerate(sample_inputs):
        if not isinstance(x, torch.Tensor):
            raise SchedError(f"sample input {i} is a {type(x).__name__}; only tensor inputs are "
                             "supported (bind other arguments with a wrapper module or "
                             "functools.partial)", WHERE)
    mode, leaves = _choose_leaves(model, layers)
    gm = _trace(model, leaves, len(sample_inputs))
    nodes = list(gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    if len(placeholders) != len(sample_inputs):
        raise SchedError(f"the traced model takes {len(placeholders)} inputs, "
                         f"{len(sample_inputs)} sample inputs were given", WHERE)

    # one sample run: metas of every value (no autograd graph kept)
    rec = _MetaRecorder(gm)
    try:
        with torch.no_grad():
            rec.run(*sample_inputs)
        rec.env.clear()
    except Exception as exc:  # the user's model fails on the sample inputs
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise DataError(f"running {type(model).__name__} on the sample inputs failed: "
                        f"{type(exc).__name__}: {first}", WHERE) from None
    metas = rec.values
    for p, x in zip(placeholders, sample_inputs):
        metas[p.name] = TensorMeta(tuple(x.shape), x.dtype, x.numel() * x.element_size(),
                                   bool(x.requires_grad), str(x.device))

    # --- segments: consecutive runs of compute nodes ---------------------------------------
    leafset = set(leaves)
    ops = [n for n in nodes if n.op not in ("placeholder", "output", "get_attr")]
    if not ops:
        raise DataError(f"{type(model).__name__} computes nothing (it returns its inputs or "
                        "constants): there is nothing to schedule", WHERE)
    calls = [i for i, n in enumerate(ops) if n.op == "call_module" and n.target in leafset]
    if mode == "user":
        called = {ops[i].target for i in calls}
        missing = [n for n in leaves if n not in called]
        if missing:
            raise SchedError(f"layers: submodule '{missing[0]}' is never called by the model's "
                             "forward (or is called inside another listed layer)", WHERE)
    seg_of: list[int] = [0] * len(ops)
    names: list[str] = []
    if not calls:
        seg_of = [0] * len(ops)
        names = ["model"]
    else:
        def substantial(span) -> bool:
            return any(n.op == "call_module" or any(a.op == "get_attr" for a in n.all_input_nodes)
                       for n in span)

        first, last = calls[0], calls[-1]
        pre_own = first > 0 and (mode == "blocks" or substantial(ops[:first]))
        post_own = last < len(ops) - 1 and (mode == "blocks" or substantial(ops[last + 1:]))
        seg = 0
        if pre_own:
            names.append("embed" if mode == "blocks" else "pre")
            seg_of[:first] = [0] * first
            seg = 1
        count: dict[str, int] = {}
        start = first if pre_own else 0
        for ci in calls:
            target = ops[ci].target
            count[target] = count.get(target, 0) + 1
            base = target if not target[0].isdigit() else "layer" + target
            names.append(base if count[target] == 1 else f"{base}_{count[target]}")
            for j in range(start, ci + 1):
                seg_of[j] = seg
            start = ci + 1
            seg += 1
        if post_own:
            names.append("head" if mode == "blocks" else "post")
            for j in range(last + 1, len(ops)):
                seg_of[j] = seg
        else:
            for j in range(last + 1, len(ops)):
                seg_of[j] = seg - 1
        taken = set(names)
        for k, nm in enumerate(names):  # pre/post/embed/head must not clash with a module name
            if nm in ("embed", "head", "pre", "post") and names.count(nm) > 1:
                new = nm + "_"
                while new in taken:
                    new += "_"
                names[k] = new
                taken.add(new)

    memo: dict[fx.Node, bool] = {}

    def dupable(n: fx.Node) -> bool:
        """A non-tensor value (a size, a shape) computed from tensors without side effects:
        a later layer computes it again rather than receiving it."""
        if n not in memo:
            memo[n] = (n.op in ("call_function", "call_method")
                       and not isinstance(metas.get(n.name), TensorMeta)
                       and not _is_inplace(n)
                       and all(a.op in ("placeholder", "get_attr")
                               or isinstance(metas.get(a.name), TensorMeta) or dupable(a)
                               for a in n.all_input_nodes))
        return memo[n]

    # an accessor of a non-tensor a layer returns (`x, aux = block(x)`: getitem on a tuple)
    # runs in that layer, so that the tuple does not cross a boundary
    pos = {n: i for i, n in enumerate(ops)}
    for i, n in enumerate(ops):
        if n.op != "call_function" or n.target not in (operator.getitem, getattr):
            continue
        srcs = [a for a in n.all_input_nodes if a in pos]
        if any(not isinstance(metas.get(a.name), TensorMeta) and not dupable(a)
               and seg_of[pos[a]] < seg_of[i] for a in srcs):
            seg_of[i] = max(seg_of[pos[a]] for a in srcs)

    segs: list[list[fx.Node]] = [[] for _ in names]
    for n, s in zip(ops, seg_of):
        segs[s].append(n)
    out_node = next(n for n in nodes if n.op == "output")
    seg_index = {n: s for n, s in zip(ops, seg_of)}

    def used_outside(n: fx.Node, s: int) -> bool:
        if any(u is out_node for u in n.users):
            return True
        return not dupable(n) and any(seg_index.get(u, s) != s for u in n.users)

    def aliases_inputs(s: int) -> bool:
        """Every output of segment s shares storage with one of its inputs: a view (Flatten)
        or an in-place op (ReLU(inplace=True)) of a tensor another layer made. It cannot be a
        layer: its output would not be new memory, and an in-place op on a layer's input
        breaks recomputation."""
        members = set(segs[s])
        outs = [n for n in segs[s] if used_outside(n, s)]
        ins = {a for n in segs[s] for a in n.all_input_nodes
               if a not in members and a.op != "get_attr"}
        ptrs = {rec.storage[a.name] for a in ins if a.name in rec.storage}
        return bool(outs) and all(rec.storage.get(n.name) in ptrs for n in outs)

    # merge segments that produce nothing used later into the next (or previous) one, and
    # segments that only alias their inputs into the previous (or next) one
    while len(segs) > 1:
        s, into = None, None
        for k in range(len(segs)):
            if not any(used_outside(n, k) for n in segs[k]):
                s, into = k, (k + 1 if k + 1 < len(segs) else k - 1)
                break
            if aliases_inputs(k):
                s, into = k, (k - 1 if k > 0 else k + 1)
                break
        if s is None:
            break
        if into > s:  # joins the next layer, which keeps its name
            segs[into] = segs[s] + segs[into]
        else:  # joins the previous layer, which keeps its name
            segs[into] = segs[into] + segs[s]
        del segs[s]
        del names[s]
        seg_index = {n: k for k, nodes_s in enumerate(segs) for n in nodes_s}

    # --- data names -------------------------------------------------------------------------
    data_name: dict[fx.Node, str] = {p: f"input{i}" for i, p in enumerate(placeholders)}
    seg_outputs: list[list[fx.Node]] = []
    for k, nodes_s in enumerate(segs):
        outs = [n for n in nodes_s if used_outside(n, k)]
        seg_outputs.append(outs)
        for i, n in enumerate(outs):
            data_name[n] = f"{names[k]}.out" if len(outs) == 1 else f"{names[k]}.out{i}"

    def check_tensor(n: fx.Node, consumer: str) -> None:
        meta = metas.get(n.name)
        if not isinstance(meta, TensorMeta):
            where = "the model's input" if n.op == "placeholder" else \
                f"layer '{names[seg_index[n]]}'"
            kind = type(meta).__name__ if not isinstance(meta, str) else meta
            raise DataError(f"value '{n.name}' ({kind} {meta!r}) computed in {where} is used by "
                            f"{consumer}; only tensors can cross layer boundaries: choose layers "
                            "(layers=[...] / --layers) so that it is computed where it is used",
                            WHERE)

    # --- the layer modules --------------------------------------------------------------------
    canon: dict[int, str] = {}
    for pname, p in model.named_parameters():
        canon.setdefault(id(p), pname)
    parts: list[LayerPart] = []
    for k, nodes_s in enumerate(segs):
        g = fx.Graph()
        env: dict[fx.Node, fx.Node] = {}
        inputs: list[fx.Node] = []
        copies: set[fx.Node] = set()
        members = set(nodes_s)

        def bring(a: fx.Node) -> None:
            if a in members or a in copies or a in inputs or a.op == "get_attr":
                return
            if dupable(a):
                for b in a.all_input_nodes:
                    bring(b)
                copies.add(a)
                return
            check_tensor(a, f"layer '{names[k]}'")
            inputs.append(a)

        for n in nodes_s:
            for a in n.all_input_nodes:
                bring(a)
        for a in inputs:
            env[a] = g.placeholder(_ident(data_name[a]))
        for n in [n for n in nodes if n in copies] + nodes_s:
            if n in copies:
                for a in n.all_input_nodes:
                    if a.op == "get_attr" and a not in env:
                        env[a] = g.node_copy(a)
                env[n] = g.node_copy(n, lambda a: env[a])
                continue
            if _is_inplace(n) and n.args and isinstance(n.args[0], fx.Node) and n.args[0] in inputs:
                raise DataError(f"layer '{names[k]}' modifies its input '{data_name[n.args[0]]}' in "
                                f"place ({n.format_node()}); a layer's inputs must stay intact "
                                "(they may be read again): choose other layers", WHERE)
            for a in n.all_input_nodes:
                if a.op == "get_attr" and a not in env:
                    env[a] = g.node_copy(a)
            env[n] = g.node_copy(n, lambda a: env[a])
        outs = seg_outputs[k]
        for n in outs:
            check_tensor(n, "a later layer" if any(u is not out_node for u in n.users)
                         else "the model's output")
        g.output(tuple(env[n] for n in outs))
        sub = fx.GraphModule(gm, g, f"Layer_{_ident(names[k])}")
        params: list[str] = []
        called: list[str] = []
        for n in g.nodes:
            if n.op == "call_module":
                called.append(n.target)
                for _, p in gm.get_submodule(n.target).named_parameters():
                    name = canon.get(id(p))
                    if name is not None and name not in params:
                        params.append(name)
            elif n.op == "get_attr":
                obj = _get_attr(gm, n.target)
                if isinstance(obj, nn.Parameter):
                    name = canon.get(id(obj))
                    if name is not None and name not in params:
                        params.append(name)
        parts.append(LayerPart(names[k], sub, [data_name[a] for a in inputs],
                               [data_name[n] for n in outs],
                               _signature(gm, g, [metas[a.name] for a in inputs]), params, called))

    # --- model outputs --------------------------------------------------------------------------
    leaves_out, spec = tree_flatten(out_node.args[0])
    outputs: list[str] = []
    slots = []
    for leaf in leaves_out:
        if isinstance(leaf, fx.Node):
            if leaf.op == "get_attr":
                raise DataError(f"the model returns the attribute '{leaf.target}' itself; return "
                                "computed tensors only", WHERE)
            check_tensor(leaf, "the model's output")
            name = data_name[leaf]
            if name not in outputs:
                outputs.append(name)
            slots.append(("data", outputs.index(name)))
        else:
            slots.append(("const", leaf))
    if not outputs:
        raise DataError("the model returns no tensor", WHERE)

    # --- metas of the data: requires_grad as under autograd --------------------------------------
    param_rg = {n: p.requires_grad for n, p in model.named_parameters()}
    data: dict[str, TensorMeta] = {}
    for p in placeholders:
        data[data_name[p]] = metas[p.name]
    for part, outs in zip(parts, seg_outputs):
        grad_in = any(data[d].requires_grad for d in part.inputs) or \
            any(param_rg.get(p, False) for p in part.params)
        for d, n in zip(part.outputs, outs):
            m = metas[n.name]
            rg = grad_in and (m.dtype.is_floating_point or m.dtype.is_complex)
            data[d] = TensorMeta(m.shape, m.dtype, m.nbytes, rg, m.device)
    return Partitioned(model, parts, [data_name[p] for p in placeholders], outputs, data, mode,
                       sample_inputs, spec, slots)


def _ident(name: str) -> str:
    out = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    return out if out and not out[0].isdigit() else "_" + out


def _get_attr(root: nn.Module, target: str):
    obj = root
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _signature(root: fx.GraphModule, g: fx.Graph, input_metas: list[TensorMeta]) -> str:
    index: dict[fx.Node, int] = {}
    items: list = [tuple((m.shape, str(m.dtype), m.requires_grad) for m in input_metas)]

    def norm(a):
        if isinstance(a, fx.Node):
            return ("%", index[a])
        if isinstance(a, (list, tuple)):
            return (type(a).__name__, tuple(norm(x) for x in a))
        if isinstance(a, dict):
            return ("dict", tuple((k, norm(v)) for k, v in a.items()))
        if isinstance(a, (torch.dtype, torch.device, torch.memory_format, torch.layout)):
            return str(a)
        if isinstance(a, slice):
            return ("slice", norm(a.start), norm(a.stop), norm(a.step))
        return repr(a)

    for i, n in enumerate(g.nodes):
        index[n] = i
        if n.op == "placeholder":
            items.append(("placeholder",))
            continue
        if n.op == "call_module":
            target = module_key(root.get_submodule(n.target))
        elif n.op == "get_attr":
            obj = _get_attr(root, n.target)
            target = (tuple(obj.shape), str(obj.dtype), obj.requires_grad) \
                if isinstance(obj, torch.Tensor) else repr(obj)
        else:
            target = _target_name(n.target)
        items.append((n.op, target, norm(n.args), norm(n.kwargs)))
    return hashlib.sha1(repr(items).encode()).hexdigest()[:16]
