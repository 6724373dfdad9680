"""Find a model's layer structure from its module tree and one real run (no symbolic trace).

    from schedlang.pytorch.frontends.blocks.find import find_blocks
    found = find_blocks(model, (input_ids,), {"attention_mask": mask})
    for call in found.blocks: print(call.name, call.inputs, "->", call.outputs)

**Which submodules are blocks** (`candidate_blocks`): walking the module tree from the root,
the first `nn.ModuleList` / `nn.Sequential` on each path that holds at least two structurally
identical children (same types of the submodules that hold parameters or buffers, same
parameter and buffer shapes; settings such as a stochastic-depth rate, or a parameter-free
submodule such as Swin's first `nn.Identity` in place of a drop path, may differ) gives all
its children as blocks: `model.layers.*` (Llama), `transformer.h.*` (GPT-2),
`bert.encoder.layer.*`, `model.encoder.layers.*` and `model.decoder.layers.*` (BART),
`vit.encoder.layer.*`, the `layers` of every ResNet/ConvNeXt stage, the `blocks` of every
Swin stage; where no container has two such children, the first `nn.ModuleList` with two
children of one class (a two-layer T5, whose first block alone has the relative position
bias); and, as
optional blocks,
the submodules with parameters beside the blocks' ancestors (embeddings, a convolutional stem,
final norms, heads) that the run calls once. An `nn.Sequential` root
gives its children. A model with no such container gives its direct children that the run
calls exactly once (a U-Net's encoder, bottleneck and decoder modules). `names=[...]` chooses
the submodules instead (they must not nest).

**Finer blocks** (`finer_blocks`): in each of these automatic choices, a block that is a plain
`nn.Sequential` (its forward is `nn.Sequential`'s own) whose children are all composite
modules (each has submodules of its own: residual blocks, stages) is replaced by its children,
in order, recursively: recomputing one child then holds only that child's internals in its
backward, not the whole Sequential's. A Sequential with a leaf layer among its children
(`Conv2d`, `ReLU`, `Linear`...) stays one block: a leaf block saves nothing beyond its input
and output, which a per-block plan keeps (it never recomputes a block's outputs), so leaf
blocks would turn every intermediate tensor into kept data (the U-Net of
`tests/torch_models.py` split down to its convolutions needs 100.5% of plain execution's peak
at the least, against 86.9% with its double convolutions as blocks). `whole=[...]` names
submodules never split (`fit` on a `fully_shard`-ed model passes its FSDP units: a unit stays
one block). The choice depends only on the module tree: it is deterministic.

**What the run records** (`find_blocks`): the model runs once on the sample inputs, with
forward pre/post hooks (keyword arguments included) on the blocks, a dispatch mode that sees
every op, and saved-tensor hooks. Each tensor is a *datum*, keyed by its storage: the model's
inputs (``input0``, ``input1``, ... for positional ones, the keyword for keyword ones), the
new tensors each block returns (``<block>.out``, or ``.out0``, ``.out1``... inside tuples,
`ModelOutput`s, lists; a returned tensor sharing storage with one of the block's inputs is
that input, not an output), and the tensors the *glue* creates that something later reads
(``glueK.out0``...). The glue is everything the model's own forward runs outside the blocks:
segment ``glue0`` runs before the first block call, ``glueK`` between block calls K-1 and K,
the last one after the last block (embeddings, masks, position embeddings, the final norm and
head, an internal loss). For each glue segment the run records the data it reads, the data it
creates, the storages autograd saves for its backward (``saved``: bytes, parameters and data
excepted; ``needs``: the data it saved), its parameters, its time and its transient peak.

**Key/value caches**: a `transformers` block handed a cache (`past_key_values`, a
`transformers` `Cache`) runs without it in training, as transformers' own gradient
checkpointing does (`training_call`): the recording run, the profile and the planned step
all pass ``None`` (and ``use_cache=False`` where the call had it). A cache would keep every
block's keys and values alive to the end of the step, which training never reads, and a
recomputed block would write its entries twice. `FoundBlocks.cache_dropped` names the blocks;
`fit` logs it once, and the model's output then carries an empty cache.

**The model's own checkpointing** (`transformers`' `gradient_checkpointing_enable()`: a
``gradient_checkpointing`` flag on its layers) is off while schedlang runs the model (the
recording run, the profile) and while its blocks are wrapped (`hooked.BlockWrappers`,
restored by `unwrap`): the plan decides what is recomputed, and a block checkpointed by its
own code would look, to the profile, as if autograd saved nothing in it.

Blocks must each be called exactly once per forward; a block called twice (weight sharing) or
never is an error that names it (`BlockError`). A model whose layers are one module called
once per layer (ALBERT's shared layer) has no such blocks: it is planned over its children,
and `FoundBlocks.shared` names the module and its calls (`fit` logs it).
"""
from __future__ import annotations

import itertools
import re
import sys
import weakref
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_unflatten

from ....language.errors import Loc, SchedError, did_you_mean
from ...inputs import tensor_leaves, unsupported
from ...memory import MemoryTracker
from ...model_state import preserved
from ...profile import host_clock
from ..fx.partition import TensorMeta, module_key

__all__ = ["BlockCall", "GlueSegment", "FoundBlocks", "BlockError", "candidate_blocks",
           "finer_blocks", "find_blocks"]

WHERE = Loc("blocks")


class BlockError(SchedError):
    """The model's blocks cannot be found or planned (the message names the submodule)."""


@dataclass
class BlockCall:
    """One block and how the run called it."""

    name: str  # qualified submodule name ("model.layers.0")
    module: nn.Module
    parent: nn.Module
    attr: str  # its name in `parent`
    args: tuple = ()  # as called in the sample run (tensors are the sample's)
    kwargs: dict = field(default_factory=dict)
    leaves: list = field(default_factory=list)  # per tensor leaf of (args, kwargs): datum name
    views: list = field(default_factory=list)  # per leaf: None, or (sizes, strides, offset)
    #                                            of the view of its datum the block was given
    inputs: list[str] = field(default_factory=list)  # data read, each once, in call order
    outputs: list[str] = field(default_factory=list)  # new data returned, in return order
    out_leaves: list = field(default_factory=list)  # per tensor leaf of the output: datum name
    params: list[str] = field(default_factory=list)  # qualified names of its parameters
    signature: str = ""  # equal for identical blocks called on identical shapes
    kept: int = 0  # bytes the block's forward left alive beyond its outputs (saved tensors)


@dataclass
class GlueSegment:
    """The model's own code run between two block calls (or before the first, after the last)."""

    name: str  # "glue0", "glue1", ...
    index: int  # glue K runs right before block K (K == len(blocks): after the last one)
    reads: list[str] = field(default_factory=list)  # data it reads
    creates: list[str] = field(default_factory=list)  # data it makes that are read later
    saved: int = 0  # bytes autograd saves for its backward (not parameters, not data)
    needs: list[str] = field(default_factory=list)  # data autograd saved
    params: list[str] = field(default_factory=list)  # parameters it reads
    time_s: float = 0.0
    overhead: int = 0  # transient bytes above what it leaves behind
    ops: int = 0  # aten ops it ran


@dataclass
class FoundBlocks:
    model: nn.Module
    blocks: list[BlockCall]  # in call order
    segments: list[GlueSegment]  # glue0 .. glueN (N = len(blocks)), some possibly empty
    data: dict[str, TensorMeta]
    # sample value of every datum (from the run, detached: no autograd graph), until
    # `release_samples()` (once profiled)
    values: dict[str, torch.Tensor]
    inputs: list[str]  # the model's input data
    outputs: list[str]  # data the model returns (tensor leaves, each once)
    mode: str  # "blocks" (repeated blocks), "sequential", "children", "user"
    cache_dropped: list[str] = field(default_factory=list)  # blocks called with a cache
    # "children": the outermost submodules with parameters the forward called more than once
    # (shared weights, ALBERT's layer), (name, calls): why no finer blocks were taken
    shared: list[tuple[str, int]] = field(default_factory=list)
    # blocks of the stack the recording run did not call (LayerDrop skips layers at random):
    # a step that runs one runs it unplanned, beyond the prediction
    not_called: list[str] = field(default_factory=list)

    def release_samples(self) -> None:
        """Drop the sample values (the profile has run on them): what the plan needs of the
        recorded run is its metadata, and the values are a forward pass's activations."""
        self.values = {}

    def block(self, name: str) -> BlockCall:
        for b in self.blocks:
            if b.name == name:
                return b
        raise KeyError(name)

    def producers(self) -> dict[str, str]:
        """datum -> the block or glue segment that makes it (model inputs are absent)."""
        out = {d: s.name for s in self.segments for d in s.creates}
        out.update({d: b.name for b in self.blocks for d in b.outputs})
        return out


def _is_cache(x) -> bool:
    """A `transformers` key/value cache (checked without importing transformers)."""
    if not type(x).__module__.startswith("transformers."):
        return False
    cache_utils = sys.modules.get("transformers.cache_utils")
    return cache_utils is not None and isinstance(x, cache_utils.Cache)


def training_call(args: tuple, kwargs: dict) -> tuple[tuple, dict, bool]:
    """(args, kwargs, dropped): a block's call as planned blocks run in training, with any
    key/value cache replaced by None and ``use_cache`` off (see the module docstring)."""
    if not any(_is_cache(x) for x in (*args, *kwargs.values())):
        return args, kwargs, False
    args = tuple(None if _is_cache(x) else x for x in args)
    kwargs = {k: None if _is_cache(v) else v for k, v in kwargs.items()}
    if kwargs.get("use_cache"):
        kwargs["use_cache"] = False
    return args, kwargs, True


# --- which submodules ----------------------------------------------------------------------------
def _shape_key(m: nn.Module) -> tuple:
    """Equal for modules of the same parametrized types and parameter and buffer shapes:
    blocks of one stack that differ only in settings are still a stack — a stochastic-depth
    rate growing with depth (ConvNeXt), or a parameter-free submodule of another type (Swin's
    first block has `nn.Identity` where the others have a drop path; a dropout, an
    activation). (Profiling tells them apart: `module_key`.)"""
    def own(s: nn.Module) -> bool:
        return any(True for _ in itertools.chain(s.parameters(recurse=False),
                                                 s.buffers(recurse=False)))

    return (tuple(type(s) for s in m.modules() if own(s)),
            tuple((n, tuple(p.shape), p.dtype) for n, p in m.named_parameters()),
            tuple((n, tuple(b.shape), b.dtype) for n, b in m.named_buffers()))


def _class_key(m: nn.Module) -> tuple:
    """Equal for modules of one class: the looser stack, taken where no container holds two
    blocks of equal structure (T5's first block alone has the relative position bias: a
    two-layer T5 has no two equal blocks)."""
    return (type(m),)


def _has_repeat(container: nn.Module, key=_shape_key) -> bool:
    keys: dict = {}
    for _, c in container.named_children():
        if not any(True for _ in c.parameters()):
            continue
        k = key(c)
        keys[k] = keys.get(k, 0) + 1
        if keys[k] >= 2:
            return True
    return False


def _containers(module: nn.Module, prefix: str, key=_shape_key,
                kinds=(nn.ModuleList, nn.Sequential)):
    for name, child in module.named_children():
        q = f"{prefix}{name}"
        if isinstance(child, kinds) and len(child) >= 2 and _has_repeat(child, key):
            yield q, child
        else:
            yield from _containers(child, q + ".", key, kinds)


def _splits(module: nn.Module) -> bool:
    """A plain `nn.Sequential` (its forward is `nn.Sequential`'s own: each child runs once, in
    order) whose children are all composite modules (each has submodules of its own)."""
    return isinstance(module, nn.Sequential) and len(module) >= 1 \
        and type(module).forward is nn.Sequential.forward \
        and all(any(True for _ in c.children()) for c in module.children())


def finer_blocks(model: nn.Module, names: list[str], whole=()) -> list[str]:
    """`names`, each plain `nn.Sequential` of composite modules among them replaced by its
    children, recursively (`_splits`); the modules named in `whole` stay as they are."""
    whole = set(whole)
    out = []
    for n in names:
        m = model.get_submodule(n)
        if n not in whole and _splits(m):
            out += finer_blocks(model, [f"{n}.{c}" for c, _ in m.named_children()], whole)
        else:
            out.append(n)
    return out


def _children(model: nn.Module, whole=()) -> list[str]:
    return finer_blocks(model, [n for n, _ in model.named_children()], whole)


def candidate_blocks(model: nn.Module, names=None,
                     whole=()) -> tuple[str, list[str], list[str]]:
    """(how they were chosen, qualified names of the candidate blocks, optional ones) — see
    the module docstring. Optional candidates (and, for the "children" choice, all of them)
    that the run does not call exactly once are dropped by `find_blocks`; a required one is an
    error. `whole`: submodules an automatic choice keeps whole (FSDP units)."""
    modules = dict(model.named_modules())
    if names is not None:
        if isinstance(names, str):
            names = [s.strip() for s in names.split(",") if s.strip()]
        names = [str(n).strip() for n in names]
        if not names:
            raise BlockError("layers is empty: give submodule names, or None to choose "
                             "automatically", WHERE)
        for n in names:
            if not n or n not in modules:
                raise BlockError(f"layers: the model has no submodule '{n}'"
                                 f"{did_you_mean(n, [k for k in modules if k])}", WHERE)
        for a in names:
            for b in names:
                if a != b and b.startswith(a + "."):
                    raise BlockError(f"layers: '{b}' is inside '{a}'; blocks must not nest",
                                     WHERE)
        return "user", list(dict.fromkeys(names)), []
    if isinstance(model, (nn.Sequential, nn.ModuleList)) and len(model) >= 2:
        return "sequential", _children(model, whole), []
    found = []
    # equal structure; else, in a ModuleList (a stack the model's own loop runs; not the
    # Sequential stages of a CNN, whose first block differs: their children), one class
    for key, kinds in ((_shape_key, (nn.ModuleList, nn.Sequential)),
                       (_class_key, (nn.ModuleList,))):
        for q, container in _containers(model, "", key, kinds):
            found += [f"{q}.{c}" for c, _ in container.named_children()]
        if found:
            break
    if found:
        return "blocks", finer_blocks(model, found, whole), _beside(model, found)
    return "children", _children(model, whole), []


def _beside(model: nn.Module, blocks: list[str]) -> list[str]:
    """Submodules with parameters next to the blocks' ancestors (embeddings, a stem, final
    norms, heads): blocks of their own when the run calls them once, so that a plan can
    recompute what they save instead of keeping it as glue."""
    ancestors = {""}
    for b in blocks:
        parts = b.split(".")
        ancestors.update(".".join(parts[:i]) for i in range(1, len(parts)))
    taken = set(blocks)
    out = []
    for a in sorted(ancestors, key=lambda n: (n.count("."), n)):
        mod = model.get_submodule(a) if a else model
        for c, child in mod.named_children():
            q = f"{a}.{c}" if a else c
            if q in ancestors or q in taken or isinstance(child, (nn.ModuleList, nn.ModuleDict)):
                continue
            if any(True for _ in child.parameters()):
                out.append(q)
    return out


# --- the recording run ---------------------------------------------------------------------------
def _key(t: torch.Tensor) -> int | None:
    try:
        s = t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None
    return s.data_ptr() if s.nbytes() else None


class _Recorder(TorchDispatchMode):
    """Sees every op: in glue, which storages it reads and creates."""

    def __init__(self, rec: _Run):
        super().__init__()
        self.rec = rec

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.rec.op(func, args, kwargs or {}, out)
        return out


class _Run:
    def __init__(self, model: nn.Module, calls: dict[int, BlockCall]):
        self.model = model
        self.calls = calls  # id(module) -> BlockCall
        self.keep: list = []  # every tensor seen: storages are not reused during the run
        self.names: dict[int, str] = {}  # storage -> datum
        self.values: dict[str, torch.Tensor] = {}
        self.meta: dict[str, TensorMeta] = {}
        self.params = {_key(p): n for n, p in model.named_parameters() if _key(p) is not None}
        self.buffers = {_key(b) for b in model.buffers()}
        self.inside: BlockCall | None = None
        self.order: list[BlockCall] = []
        self.seg = GlueSegment("glue0", 0)
        self.segments: list[GlueSegment] = []
        self.created: dict[int, GlueSegment] = {}  # storage made by glue -> segment
        self.created_t: dict[int, torch.Tensor] = {}
        self.tracker: MemoryTracker | None = None

        self.clock = host_clock()  # the profile's clock
        self.t0 = self.clock()
        self.level = 0  # memory when the segment started
        self.saved_keys: dict[int, tuple[GlueSegment, int]] = {}
        self.repeated: list[BlockCall] = []
        self.cache_dropped: list[str] = []  # blocks called with a key/value cache
        self.call_counts: dict[int, int] = {}  # id(module) -> calls in the run (every module)
        self.made_in_run: set = set()  # storages made by an op of the run
        self.made_in_blocks: set = set()  # ... by an op inside a block

    # datum bookkeeping
    def datum(self, t: torch.Tensor, name: str) -> str:
        k = _key(t)
        if k in self.names:
            return self.names[k]
        self.names[k] = name
        self.values[name] = t
        self.meta[name] = TensorMeta(tuple(t.shape), t.dtype, t.untyped_storage().nbytes(),
                                     bool(t.requires_grad), str(t.device))
        self.keep.append(t)
        return name

    def read(self, t: torch.Tensor) -> str | None:
        """The datum `t` is (made by glue: named now), or None."""
        k = _key(t)
        if k is None or k in self.params or k in self.buffers:
            return None
        if k in self.names:
            return self.names[k]
        seg = self.created.get(k)
        if seg is not None:
            name = self.datum(self.created_t[k], f"{seg.name}.out{len(seg.creates)}")
            seg.creates.append(name)
            return name
        return None

    # glue ops
    def op(self, func, args, kwargs, out) -> None:
        made = {_key(t) for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)}
        self.made_in_run |= made
        if self.inside is not None:
            self.made_in_blocks |= made
            return
        seg = self.seg
        seg.ops += 1
        for t in tree_flatten((args, kwargs))[0]:
            if not isinstance(t, torch.Tensor):
                continue
            k = _key(t)
            if k in self.params:
                if self.params[k] not in seg.params:
                    seg.params.append(self.params[k])
                continue
            if self.created.get(k) is seg and k not in self.names:
                continue  # made by this segment and not a datum: internal to the glue
            d = self.read(t)
            if d is not None and d not in seg.reads and d not in seg.creates:
                seg.reads.append(d)
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                k = _key(t)
                if k is not None and k not in self.names and k not in self.created \
                        and k not in self.params and k not in self.buffers:
                    self.created[k] = seg
                    self.created_t[k] = t
                    self.keep.append(t)

    def pack(self, t: torch.Tensor) -> None:
        """A tensor autograd saves (`_record`'s saved-tensor hook): glue's, noted."""
        if self.inside is None:
            k = _key(t)
            if k is not None and k not in self.params and k not in self.buffers \
                    and k not in self.saved_keys:
                self.saved_keys[k] = (self.seg, t.untyped_storage().nbytes())

    def end_segment(self) -> None:
        seg = self.seg
        seg.time_s = self.clock() - self.t0
        if self.tracker is not None:
            seg.overhead = max(0, self.tracker.peak - self.tracker.current)
        self.segments.append(seg)

    def start_segment(self, index: int) -> None:
        self.seg = GlueSegment(f"glue{index}", index)
        if self.tracker is not None:
            self.tracker.reset_peak()
        self.t0 = self.clock()

    # hooks
    def pre(self, module, args, kwargs):
        call = self.calls[id(module)]
        if self.inside is not None:
            return None
        if call in self.order:
            self.repeated.append(call)
            return None
        self.end_segment()
        self.order.append(call)
        args, kwargs, dropped = training_call(args, dict(kwargs))
        if dropped:
            self.cache_dropped.append(call.name)
        call.args, call.kwargs = args, kwargs
        _check_block_arguments(call, args, kwargs)
        leaves, views = [], []
        for t in tree_flatten((args, kwargs))[0]:
            if not isinstance(t, torch.Tensor):
                continue
            d = self.read(t)
            if d is None:
                k = _key(t)
                if k in self.made_in_blocks:  # another block's internal tensor, not returned
                    raise BlockError(
                        f"block '{call.name}' ({type(call.module).__name__}) reads a tensor "
                        f"(argument {_argument_of(t, args, kwargs)}) that a block made but did "
                        "not return: the blocks exchange it outside their outputs, which a "
                        "plan cannot follow; return it, or name other submodules with "
                        "layers=[...]", WHERE)
                if k is None or k in self.params or k in self.buffers \
                        or k not in self.made_in_run:
                    # made before the forward (a tensor attribute, a global): a constant
                    leaves.append(None)
                    views.append(None)
                    continue
                d = self.datum(t, f"{call.name}.in{len(leaves)}")  # made outside any op
            leaves.append(d)
            v = self.values[d]
            same = (t.shape == v.shape and t.stride() == v.stride()
                    and t.storage_offset() == v.storage_offset() and t.dtype == v.dtype)
            views.append(None if same else (tuple(t.shape), tuple(t.stride()),
                                             t.storage_offset()))
        call.leaves, call.views = leaves, views
        call.inputs = list(dict.fromkeys(d for d in leaves if d is not None))
        self.inside = call
        call.kept = self.tracker.current if self.tracker is not None else 0
        return (args, kwargs) if dropped else None

    def post(self, module, args, kwargs, out):
        call = self.calls[id(module)]
        if self.inside is not call:
            return None
        self.inside = None
        tensors = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        new = []  # returned tensors of new storages (an input handed back is that input)
        for t in tensors:
            k = _key(t)
            if k is not None and k not in self.names and k not in self.params \
                    and k not in self.buffers and all(_key(n) != k for n in new):
                new.append(t)
        for i, t in enumerate(new):
            name = f"{call.name}.out" if len(new) == 1 else f"{call.name}.out{i}"
            call.outputs.append(self.datum(t, name))
        call.out_leaves = [self.names.get(_key(t)) for t in tensors]
        if self.tracker is not None:  # what the block leaves alive beyond its outputs
            call.kept = max(0, self.tracker.current - call.kept
                            - sum(t.untyped_storage().nbytes() for t in new))
        self.start_segment(len(self.order))
        return None


def _argument_of(t: torch.Tensor, args: tuple, kwargs: dict) -> str:
    """The path of tensor `t` among a call's arguments (``input1``, ``mask``, ``input0[2]``)."""

    return next((p for p, x in tensor_leaves(args, kwargs) if x is t), "?")


def _check_block_arguments(call: BlockCall, args: tuple, kwargs: dict) -> None:
    """A `BlockError` naming the argument when a block is handed tensors inside an object the
    wrappers cannot look into (a dataclass, a custom class): the plan would not know them."""

    seen = {id(t) for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
    hidden = [p for p, t in tensor_leaves(args, kwargs) if id(t) not in seen]
    path = hidden[0] if hidden else unsupported(args, kwargs)
    if path:
        raise BlockError(f"block '{call.name}' ({type(call.module).__name__}) takes tensors "
                         f"inside argument {path.split('.')[0].split('[')[0]} ({path}), an "
                         "object the block wrappers cannot look into (they follow tensors in "
                         "tuples, lists and dicts): pass its tensors as arguments, or name "
                         "other submodules with layers=[...]", WHERE)


def _unpacked(t: torch.Tensor) -> torch.Tensor:
    return t


def _stand_in(t: torch.Tensor) -> torch.Tensor:
    """A tensor of `t`'s shape, strides and dtype on the meta device (no bytes)."""
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


def _without_samples(call: BlockCall) -> None:
    """`call`'s recorded arguments with each datum's tensor replaced by a stand-in: the
    callers of a recorded call read the data from elsewhere (`hooked._BlockFn`), and the
    sample tensors carry the recording run's autograd graph (a forward pass)."""
    flat, spec = tree_flatten((call.args, call.kwargs))
    leaves, k = [], 0
    for x in flat:
        if isinstance(x, torch.Tensor):
            if call.leaves[k] is not None:
                x = _stand_in(x)
            k += 1
        leaves.append(x)
    call.args, call.kwargs = tree_unflatten(leaves, spec)


def _signature(call: BlockCall, meta: dict[str, TensorMeta]) -> str:
    spec = tree_flatten((call.args, call.kwargs))[1]
    shapes = [None if d is None else (meta[d].shape, str(meta[d].dtype), meta[d].requires_grad)
              for d in call.leaves]
    consts = [repr(x) for x in tree_flatten((call.args, call.kwargs))[0]
              if not isinstance(x, torch.Tensor)]
    return repr((module_key(call.module), str(spec), shapes, consts, len(call.outputs)))


def _sanitize(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.]", "_", name) or "x"


#: an optional block (beside the stack) is kept when it saves at least this share of what the
#: largest block of the stack saves. Small: what the embeddings save stays alive through every
#: block's backward, where per-block checkpointing's peak is, so recomputing them is what lets
#: the blocks run a faster option there (BERT's 266,752 B, 8% of a block: `fit` at
#: `gradient_checkpointing_enable()`'s peak 1.00x its step with 25% here, 0.94x with 5%;
#: bench/README.md, issue 28). Llama's, GPT-2's and BART's optional blocks save less than 5%.
OPTIONAL_SHARE = 0.05


def _record(model, cands, sample_inputs, sample_kwargs):
    modules = dict(model.named_modules())
    pname = {id(p): n for n, p in model.named_parameters()}  # tied weights: the first name
    calls: dict[int, BlockCall] = {}
    for n in cands:
        m = modules[n]
        parent_name, _, attr = n.rpartition(".")
        parent = modules[parent_name] if parent_name else model
        if id(m) in calls:  # the same module under two names
            continue
        params = list(dict.fromkeys(pname[id(p)] for p in m.parameters()))
        calls[id(m)] = BlockCall(n, m, parent, attr, params=params)
    run = _Run(model, calls)

    given = tensor_leaves(sample_inputs, sample_kwargs)  # nested too: a dict batch's tensors
    for path, x in given:
        if _key(x) is not None:
            run.datum(x, _sanitize(path))
    run.inputs = list(run.values)
    # what autograd saves keeps its hooks and what they packed, in C++, where Python's
    # collector cannot follow: a pack hook that holds the run (which keeps every tensor it
    # saw) or returns the live tensor (an output saved by its own grad_fn) closes a cycle
    # that outlives the process when no backward runs (the recording's forward pass did)
    ref = weakref.ref(run)

    def pack(t):
        rec = ref()
        if rec is not None:
            rec.pack(t)
        return t.detach()

    handles = []

    def count(module, args):
        run.call_counts[id(module)] = run.call_counts.get(id(module), 0) + 1

    try:
        handles.append(torch.nn.modules.module.register_module_forward_pre_hook(count))
        for call in calls.values():
            handles.append(call.module.register_forward_pre_hook(run.pre, with_kwargs=True))
            handles.append(call.module.register_forward_hook(run.post, with_kwargs=True))
        # what the segments and blocks add (deltas): the resident storages suffice
        with preserved(model), MemoryTracker(resident=[model, *(t for _, t in given)],
                                              existing=False) as mt:
            run.tracker = mt
            run.start_segment(0)
            with torch.enable_grad(), _Recorder(run), \
                    torch.autograd.graph.saved_tensors_hooks(pack, _unpacked):
                try:
                    out = model(*sample_inputs, **sample_kwargs)
                except SchedError:
                    raise
                except Exception as exc:  # the user's model fails on the sample inputs
                    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                    raise BlockError(f"running {type(model).__name__} on the sample inputs "
                                     f"failed: {type(exc).__name__}: {first}", WHERE) from None
            run.end_segment()
            run.tracker = None
    finally:
        for h in handles:
            h.remove()
    return run, out, list(run.order)


def find_blocks(model: nn.Module, sample_inputs=(), sample_kwargs: dict | None = None,
                names=None, whole=()) -> FoundBlocks:
    """The blocks of `model` and the data they exchange, from one forward on the samples
    (see the module docstring). The run keeps the model's parameters, buffers (running
    statistics), gradients and the global RNG state as they were."""
    if isinstance(sample_inputs, torch.Tensor):
        sample_inputs = (sample_inputs,)
    sample_inputs = tuple(sample_inputs)
    sample_kwargs = dict(sample_kwargs or {})
    mode, cands, optional = candidate_blocks(model, names, whole)
    run, out, blocks = _record(model, cands + optional, sample_inputs, sample_kwargs)
    called = [b for b in blocks if b.name in cands]
    if mode in ("blocks", "sequential") and len(called) < 2 \
            and not (called and len(cands) >= 2):
        # containers the forward does not run block by block: the direct children instead
        # (a stack the forward ran one block of, LayerDrop having skipped the others in the
        # recorded run, is run block by block: those are `not_called`)
        mode, optional = "children", []
        cands = _children(model, whole)
        run, out, blocks = _record(model, cands, sample_inputs, sample_kwargs)
    if mode == "children":
        optional, cands = cands, []
    empty = [b.name for b in blocks if not b.outputs]  # views or in-place: not a layer
    # an optional block that saves little would only make the plan's problem larger
    most = max((b.kept for b in blocks if b.name in cands), default=0)
    empty += [b.name for b in blocks if b.name in optional and mode != "children"
              and b.kept < OPTIONAL_SHARE * most]
    if empty:
        cands = [n for n in cands if n not in empty]
        optional = [n for n in optional if n not in empty]
        run, out, blocks = _record(model, cands + optional, sample_inputs, sample_kwargs)
    if run.repeated:
        required = [c for c in run.repeated if c.name in cands]
        if required:
            c = required[0]
            raise BlockError(f"block '{c.name}' ({type(c.module).__name__}) is called more "
                             "than once in one forward (shared weights): it cannot be wrapped "
                             "as one block; name other submodules with layers=[...]", WHERE)
        twice = {c.name for c in run.repeated}
        optional = [n for n in optional if n not in twice]
        run, out, blocks = _record(model, cands + optional, sample_inputs, sample_kwargs)
    missing = [n for n in cands if n not in {b.name for b in blocks}]
    if mode == "user" and missing:
        raise BlockError(f"layers: submodule '{missing[0]}' is not called by the forward "
                         "on the sample inputs", WHERE)
    if not blocks:
        raise BlockError(f"{type(model).__name__}: no block found (no ModuleList/Sequential of "
                         "repeated blocks, no child called once by the forward); name the "
                         "submodules to plan with layers=[...]", WHERE)
    inputs = list(run.inputs)
    # the model's outputs
    outputs = []
    for t in tree_flatten(out)[0]:
        if isinstance(t, torch.Tensor):
            d = run.read(t)
            if d is None:
                k = _key(t)
                if k is None or k in run.params or k in run.buffers:
                    continue
                d = run.datum(t, f"{run.segments[-1].name}.out{len(run.segments[-1].creates)}")
                run.segments[-1].creates.append(d)
            if d not in outputs:
                outputs.append(d)
    # what each glue segment saved: bytes of storages that are no datum; data it needs
    for k, (seg, nbytes) in run.saved_keys.items():
        if k in run.names:
            d = run.names[k]
            if d not in seg.needs:
                seg.needs.append(d)
        else:
            seg.saved += nbytes
    for call in blocks:
        call.signature = _signature(call, run.meta)
        _without_samples(call)
    values = {d: t.detach() for d, t in run.values.items()}  # no recorded graph
    return FoundBlocks(model, blocks, run.segments, dict(run.meta), values, inputs,
                       outputs, mode, list(run.cache_dropped),
                       _shared(model, run.call_counts) if mode == "children" else [],
                       missing)


def _shared(model: nn.Module, counts: dict[int, int]) -> list[tuple[str, int]]:
    """(name, calls) of the outermost submodules with parameters that one forward called
    more than once (a layer whose weights every layer shares, as ALBERT's)."""
    out: list[tuple[str, int]] = []
    for name, m in model.named_modules():
        if name and counts.get(id(m), 0) >= 2 and any(True for _ in m.parameters()) \
                and not any(name.startswith(n + ".") for n, _ in out):
            out.append((name, counts[id(m)]))
    return out


def describe(found: FoundBlocks) -> str:
    """One line per block and glue segment (for errors and `--verbose`)."""
    lines = []
    for seg in found.segments:
        lines.append(f"{seg.name}: reads {', '.join(seg.reads) or '-'} -> "
                     f"{', '.join(seg.creates) or '-'} (saves {seg.saved} B)")
        if seg.index < len(found.blocks):
            b = found.blocks[seg.index]
            lines.append(f"{b.name}: {', '.join(b.inputs)} -> {', '.join(b.outputs)}")
    return "\n".join(lines)

