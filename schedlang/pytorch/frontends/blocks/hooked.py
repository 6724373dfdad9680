"""The hook-based front end: layered graph data from a model's blocks, and plans run by
per-block wrappers, with no whole-model trace.

* `trace_blocks(model, args, kwargs)` finds the blocks (`schedlang.pytorch.frontends.blocks.find`),
profiles
  each block's options with `schedlang.pytorch.profile` (``autograd``, ``recompute``,
  ``selective``; identical blocks once) on the tensors the sample run gave it, and writes
  layered graph data: one layer per block, and one layer per glue segment (the model's own
  code between block calls) with the single option ``autograd`` — its time, transient memory
  and what autograd saves for its backward as the recording run measured them. Glue is never
  recomputed: it is fixed memory and time in every plan, and the prediction counts it.
* The plans are rockmate's restricted by `models/extensions/block_groups.sched`: each block
  on its own (`per_block.sched`, which it extends: every forward runs once, with the option its
  backward uses, no `fast_forward`: what a wrapper can do by itself), or in a *checkpointed
  group*: consecutive blocks, each feeding the next alone (`block_chains`), under one
  checkpoint, as `checkpoint_sequential` runs a segment — only the group's input is kept, and
  the backward runs the group's forwards again before its backwards. One solve optimizes
  groups, per-block options and generated options together.
* The heuristic plans of `families.py` (per-block checkpointing, every block at its least
  memory, and checkpointed groups: checkpoint_sequential's schedule among them), priced by the
  simulator, stay as the solve's warm start and fallback (`planning.or_group_plan`: taken
  where faster than the solver's plan, e.g. one a time limit stopped early).
* `BlockWrappers(found)` wraps each block *in place* — the block's class is swapped for a
  subclass whose ``forward`` applies the plan's choice (as ``fully_shard`` does), so parameter
  names, ``state_dict`` keys, hooks, ``train()/eval()`` and the model's own ``forward`` with its
  keyword arguments and outputs stay as they are. Choices: ``autograd`` (plain),
  ``recompute`` (``torch.utils.checkpoint``, non-reentrant, RNG state restored on the CPU and
  on every device of a tensor argument: `schedlang.pytorch.recompute`), ``selective`` (the
  same with the profiler's selective policy), ``rerun`` (`recompute.rerun_call`, where
  `rerun.rerun_blocks` offers it); ``offload`` of a block's saved tensors to host memory
  (saved-tensor hooks, `offload.py`); a checkpointed group (`groups.Group`: run the ``rerun``
  way, or by torch's non-reentrant checkpoint opened by the first block's call and closed by
  the last's). A recomputed forward leaves BatchNorm running statistics as the first forward
  left them (updated once, as in eager). `unwrap()` restores the original classes.
"""
from __future__ import annotations

import contextlib
import weakref
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from .... import progress
from ....graphs.elements import DataNode, Layer, Loss, Option
from ....graphs.graph import Graph
from ....graphs.hgraph import FAST_FORWARD
from ....language.errors import SchedError
from ...loss_node import LOSS_TIME, LOSS_VALUE_BYTES
from ...model_state import once_stats, own_checkpointing, preserved
from ...profile import OPTIONS, profile, selective_context
from ...recompute import checkpoint_call, rerun_call
from ..fx.partition import LayerPart, Partitioned
from .block_ops import add_block_op_options, is_op_option, run_op_option
from .find import WHERE, BlockCall, BlockError, FoundBlocks, GlueSegment, find_blocks, training_call
from .glue_memory import glue_backward_peaks
from .groups import Group
from .in_context import glue_times, timed_in_context
from .offload import OFFLOAD, module_storages, offloading
from .plan_reading import GROUP
from .rerun import RERUN, drop_inexact_reruns, rerun_blocks, shared_arguments

__all__ = ["trace_blocks", "BlockWrappers", "BlockTrace", "PER_BLOCK",
           "BLOCK_GROUPS"]

#: the extension that restricts plans to what per-block wrappers run
PER_BLOCK = "per_block"
#: ... and checkpointed groups of blocks (`groups.Group`), which it extends
BLOCK_GROUPS = "block_groups"


class _BlockFn:
    """A block as `profile` runs layers: ``fn(*input tensors) -> tuple of new outputs``, with
    the recorded call's other arguments (keyword arguments, non-tensor values) as constants."""

    def __init__(self, call: BlockCall, shared=()):
        self.call = call
        self.flat, self.spec = tree_flatten((call.args, call.kwargs))
        self.module = call.module
        #: positions among its inputs of the data other code reads too, for ``rerun``
        #: (`rerun.shared_arguments`: the profile measures what the wrappers run)
        self.rerun_apart = tuple(k for k, d in enumerate(call.inputs) if d in shared)

    def __call__(self, *xs):
        env = dict(zip(self.call.inputs, xs))
        leaves, k = [], 0
        for x in self.flat:
            if isinstance(x, torch.Tensor):
                d, view = self.call.leaves[k], self.call.views[k]
                k += 1
                if d is None:
                    leaves.append(x)
                else:
                    leaves.append(env[d] if view is None else env[d].as_strided(*view))
            else:
                leaves.append(x)
        args, kwargs = tree_unflatten(leaves, self.spec)
        out = self.module(*args, **kwargs)
        tensors = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        by_name = {}
        for t, d in zip(tensors, self.call.out_leaves):
            if d is not None and d in self.call.outputs:
                by_name.setdefault(d, t)
        if len(tensors) != len(self.call.out_leaves) or len(by_name) < len(self.call.outputs):
            raise BlockError(
                f"block '{self.call.name}' ({type(self.module).__name__}) returned "
                f"{len(tensors)} tensor(s) where the recorded run's call returned "
                f"{len(self.call.out_leaves)}: something random inside it (LayerDrop skipping "
                "layers?) changes what it returns from call to call; turn that off in "
                "training (layerdrop=0 in the config), or name blocks below it with "
                "layers=[...]", WHERE)
        return tuple(by_name[d] for d in self.call.outputs)


@dataclass
class BlockTrace:
    """What the hook front end knows of a model: its blocks and the layered graph."""

    found: FoundBlocks
    graph: Graph
    profiled: object = None
    glue_layers: list[str] = field(default_factory=list)
    # block -> its option ``offload`` as measured (`block_offload.offload_profiles`)
    offload: dict | None = None
    # how the times were taken (`in_context.ContextTimes.summary`), for `memory_report()`
    timing: dict = field(default_factory=dict)

    # what `fit.prepare` reads from a partitioned model
    @property
    def inputs(self) -> list[str]:
        return self.found.inputs

    @property
    def outputs(self) -> list[str]:
        return self.found.outputs

    @property
    def data(self):
        return self.found.data


def block_partition(found: FoundBlocks) -> Partitioned:
    """The blocks as a `Partitioned` whose layers are the blocks (for `profile`)."""
    produced = {d for b in found.blocks for d in b.outputs}
    feeds = []
    for b in found.blocks:
        feeds += [d for d in b.inputs if d not in produced and d not in feeds]
    later = set(found.outputs)
    for s in found.segments:
        later.update(s.reads)
    shared = shared_arguments(found)
    layers = [LayerPart(b.name, _BlockFn(b, shared[b.name]), list(b.inputs), list(b.outputs),
                        b.signature, list(b.params), [b.name]) for b in found.blocks]
    outs = [d for d in produced if d in later]
    part = Partitioned(found.model, layers, feeds, outs, dict(found.data), "blocks",
                       tuple(found.values[d] for d in feeds))
    return part


def _profile_blocks(found: FoundBlocks, repeats: int, options):

    part = block_partition(found)
    names = [b.name for b in found.blocks]
    try:
        with preserved(found.model):
            return profile(part, repeats=repeats, options=options or (*OPTIONS, RERUN),
                           recompute_by="checkpoint", grads_freed=True)
    except SchedError as exc:
        raise BlockError(f"{exc.message if hasattr(exc, 'message') else exc}", WHERE) from None
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise BlockError(f"profiling the blocks ({names[0]} ... {names[-1]}) failed: "
                         f"{type(exc).__name__}: {first}", WHERE) from None


def trace_blocks(model: nn.Module, args=(), kwargs=None, names=None, *, repeats: int = 5,
                 options=None, name: str | None = None, whole=(),
                 offload: bool = False, op_options=False, in_context: bool = True) -> BlockTrace:
    """Find, profile and describe the blocks of `model` (see the module docstring); `whole`:
    submodules the automatic block choice must not split (`find_blocks`). `offload`: measure
    the blocks' option ``offload`` too (`block_offload.offload_profiles`, for a host link),
    while the sample values it runs on are at hand. `op_options` (True, or a dict of
    `block_ops.add_block_op_options` arguments): also each block's options generated from
    op-level solves (segments and selective-checkpoint policies). `in_context`: the options'
    and the glue's times measured in whole steps, as the wrappers run them
    (`in_context.timed_in_context`); else the layer profile's and the recording run's."""

    with progress.phase("finding blocks"):
        found = find_blocks(model, args, kwargs, names, whole)
    profiled = _profile_blocks(found, repeats, options)
    drop_inexact_reruns(found, profiled)  # where its gradients would not be eager's bits
    if op_options:
        with preserved(found.model):
            add_block_op_options(profiled, **(op_options if isinstance(op_options, dict)
                                              else {}))
    timed = timed_in_context(found, profiled, BlockWrappers(found), tuple(args), kwargs or {}) \
        if in_context else None
    glue_peaks = glue_backward_peaks(found, tuple(args), kwargs or {})
    graph, glue = _to_graph(found, profiled, name or type(model).__name__, timed, glue_peaks)
    tr = BlockTrace(found, graph, profiled, glue, timing=timed.summary() if timed else
                    {"threads": torch.get_num_threads(), "in_context": False})
    if offload:
        offload_profiles(tr, block_partition(found))
    # the sample values served the profiles: a fitted model keeps no activations of them
    found.release_samples()
    profiled.part.sample_inputs = ()
    return tr


def _to_graph(found: FoundBlocks, profiled, name: str, timed=None,
              glue_peaks: dict[str, int] | None = None) -> tuple[Graph, list[str]]:
    """The layered graph data of `found` and its `profiled` blocks (`timed`: times measured in
    context; `glue_peaks`: each glue segment's backward peak measured in a step,
    `glue_memory.glue_backward_peaks`, else estimated from its forward), and the glue layers'
    names."""
    import re

    meta = found.data
    named = dict(found.model.named_parameters())
    blocks = {lp.name: lp for lp in profiled.layers}
    # the layers in call order: glue segments that do something, and blocks
    order: list = []
    for seg in found.segments:
        if seg.ops or seg.creates or seg.saved:
            order.append(seg)
        if seg.index < len(found.blocks):
            order.append(found.blocks[seg.index])

    def lname(x):
        return x.name

    def ins(x):
        return list(x.reads) if isinstance(x, GlueSegment) else list(x.inputs)

    def outs(x):
        if isinstance(x, GlueSegment):
            return list(x.creates) or [f"{x.name}.none"]
        return list(x.outputs)

    def params(x):
        return list(x.params)

    float_rg = {d for d, m in meta.items() if m.requires_grad and m.dtype.is_floating_point}
    has = {d for d in found.outputs if d in float_rg}
    grad_in: dict[str, list[str]] = {}
    grad_out: dict[str, list[str]] = {}
    for x in reversed(order):
        gi = [d for d in outs(x) if d in has]
        go = [d for d in ins(x) if d in float_rg] if gi else []
        grad_in[lname(x)], grad_out[lname(x)] = gi, go
        has.update(go)
    owner: dict[str, str] = {}
    for x in order:
        if grad_in[lname(x)]:
            for p in params(x):
                if p in named and named[p].requires_grad:
                    owner[p] = lname(x)
    g = Graph(re.sub(r"[^A-Za-z0-9_]", "_", name).lower() or "model",
              f"{name}: blocks and glue recorded by hooks", time_unit="s")
    declared: set[str] = set()

    def data(d, size, role=""):
        if d not in declared:
            declared.add(d)
            g.data.append(DataNode(d, int(size), role))

    def size(d):
        return meta[d].nbytes if d in meta else 0

    for d in found.inputs:
        data(d, size(d), "input")
    returned = set(found.outputs)
    for x in order:
        for d in outs(x):
            # what the forward returns stays alive to the step's end: the caller holds it
            data(d, size(d), "output" if d in returned else "")
    # the loss value and the seed gradient backward() makes for it (4 B each): alive
    # through the whole backward, like the outputs the caller holds
    data("loss", LOSS_VALUE_BYTES, "output")
    loss_outputs = ["loss"]
    for d in found.outputs:
        if d in float_rg:
            data(f"{d}.grad", size(d))
            loss_outputs.append(f"{d}.grad")
    input_grads = [d for d in found.inputs if d in has]
    glue = []
    glue_t = glue_times({lname(x): (x.time_s, bool(grad_in[lname(x)])) for x in order
                         if isinstance(x, GlueSegment)}, timed)
    for x in reversed(order):
        n = lname(x)
        for d in grad_out[n]:
            data(f"{d}.grad", size(d), "output" if d in input_grads else "")
        owned = [p for p in params(x) if owner.get(p) == n]
        if grad_in[n] and owned:
            data(f"{n}.params.grad", sum(named[p].numel() * named[p].element_size()
                                         for p in owned), "output")
    makers = Counter(d for x in order for d in grad_out[lname(x)])
    for x in order:
        n = lname(x)
        owned = [p for p in params(x) if owner.get(p) == n]
        gouts = [f"{d}.grad" for d in grad_out[n]]
        if grad_in[n] and owned:
            gouts.append(f"{n}.params.grad")
        if isinstance(x, GlueSegment):
            glue.append(n)
            io = set(ins(x)) | set(outs(x))
            needs = [d for d in x.needs if d in io]
            fwd, bwd = glue_t[n]
            # the graph adds the gradients the backward creates to its overhead: those of data
            # no other layer's backward adds to, and its parameters'
            created = sum(size(d) for d in grad_out[n] if makers[d] == 1) + \
                sum(named[p].numel() * named[p].element_size() for p in owned)
            opts = [Option("autograd", _t(fwd), int(x.overhead), _t(bwd),
                           _glue_backward(x, bool(grad_in[n]), glue_peaks, created),
                           int(x.saved), needs)]
        else:
            lp = blocks[n]
            opts = [Option(o.name, _t(o.fwd_time), int(o.fwd_overhead), _t(o.bwd_time),
                           int(o.bwd_overhead), int(o.phantom), list(o.needs))
                    for o in lp.options]
        ff = None if isinstance(x, GlueSegment) or blocks[n].fast_forward is None else \
            Option(FAST_FORWARD, _t(blocks[n].fast_forward.fwd_time),
                   int(blocks[n].fast_forward.fwd_overhead), 0.0, 0, 0)
        g.layers.append(Layer(n, ins(x), outs(x), [f"{d}.grad" for d in grad_in[n]], gouts,
                              opts, fast_forward=ff))
    g.loss = Loss(list(found.outputs), loss_outputs, LOSS_TIME)
    return g, glue


def _glue_backward(seg: GlueSegment, has_backward: bool, glue_peaks: dict[str, int] | None,
                   created: int) -> int:
    """A glue segment's backward overhead: its peak measured in a step (`glue_memory`) less
    the `created` gradients, else estimated from the recorded forward (its transient peak
    plus what autograd saved for it)."""
    peaks = glue_peaks or {}
    if not has_backward:
        return 0
    if seg.name in peaks:
        return max(0, peaks[seg.name] - created)
    return int(seg.overhead + seg.saved)


def _t(s: float) -> float:
    return float(f"{max(float(s), 1e-9):.4g}")


# --- the wrappers --------------------------------------------------------------------------------
_WRAPPED: dict[type, type] = {}


class BlockMixin:
    """Swapped in before a block's class: its forward applies the block's current choice."""

    def forward(self, *args, **kwargs):
        state = self.__dict__.get("_schedlang_choice")
        fwd = super().forward  # the block's own forward
        if not torch.is_grad_enabled():  # inference: the block as it is, cache and all
            return fwd(*args, **kwargs)
        args, kwargs, _ = training_call(args, kwargs)  # as recorded and profiled
        if state is None:
            return fwd(*args, **kwargs)
        choice, extra = state  # extra: offload (a bool), or the block's `groups.Group`
        if choice == "group":
            return extra.forward(self, fwd, args, kwargs)
        offload = extra
        if offload and choice == "autograd":
            hooks = offloading(module_storages(self))
        else:
            hooks = contextlib.nullcontext()
        with hooks:
            if is_op_option(choice):  # generated: a policy, or segments (block_ops.py)
                return run_op_option(self, choice, fwd, args, kwargs, once_stats(self, fwd))
            if choice == RERUN:  # the forward without autograd, again in the backward
                return rerun_call(once_stats(self, fwd), args, kwargs,
                                  self.__dict__.get("_schedlang_apart", ()))
            if choice == FAST_FORWARD:  # a block no gradient reaches (its layer has no
                with torch.no_grad():  # backward): nothing saved, as profiled
                    return fwd(*args, **kwargs)
            if choice in ("recompute", "selective"):
                # the RNG of every device of a positional *or keyword* tensor is replayed
                return checkpoint_call(once_stats(self, fwd), args, kwargs,
                                       selective_context if choice == "selective" else None)
            return fwd(*args, **kwargs)


def _wrapped_class(cls: type) -> type:
    new = _WRAPPED.get(cls)
    if new is None:
        new = _WRAPPED[cls] = type(f"Planned{cls.__name__}", (BlockMixin, cls),
                                   {"__module__": cls.__module__})
    return new


#: model -> a weak reference to the `BlockWrappers` whose choices its blocks carry (`ensure`):
#: the wrappers hold the model, and a value holding its key would keep the entry for good
_OWNER: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _owner(model: nn.Module):
    ref = _OWNER.get(model)
    return None if ref is None else ref()


class BlockWrappers:
    """The blocks of `found` wrapped in place; `set(choices)` applies a plan's choices.

    Several fits of one model share its blocks: the wrappers that last applied their choices
    own them (a mark on the model), and `ensure()`, before each call, applies this set's again
    where another fit (or `unwrap()` of another) changed them, so each fitted module runs its
    own plan. `rerun_groups`: whether checkpointed groups of blocks that offer ``rerun`` run
    that way (`groups.Group`); off, every group runs by torch's checkpoint."""

    def __init__(self, found: FoundBlocks, rerun_groups: bool = True):
        self.found = found
        self.blocks = {b.name: b.module for b in found.blocks}
        self.own_checkpointing = own_checkpointing(found.model)  # off while wrapped
        self._classes = {}
        for name, m in self.blocks.items():
            cls = type(m)
            if isinstance(m, BlockMixin):  # wrapped by an earlier fit: rewrap
                cls = cls.__mro__[2]
            self._classes[name] = cls
        self._choices: dict[str, tuple | None] = {name: None for name in self.blocks}
        # a ``rerun`` block's arguments other code reads too, by position among its call's
        # tensors: their gradients go on use by use (`rerun.shared_arguments`); and those the
        # recorded run did not make (`d` None: a parameter passed as an argument, DeBERTa-v2's
        # relative embeddings, read by every layer), which any code may read (those that need
        # no gradient take one slot: `recompute._RerunCall`)
        shared = shared_arguments(found)
        self._apart = {b.name: tuple(k for k, d in enumerate(b.leaves)
                                     if d is None or d in shared[b.name])
                       for b in found.blocks}
        self._groups: list[Group] = []
        # groups of these run the ``rerun`` way (`groups.Group`); with `rerun_groups` off,
        # every group runs by torch's checkpoint, as `checkpoint_sequential` does (a baseline)
        self._rerun_exact = rerun_blocks(found) if rerun_groups else set()
        # a forward that skips a group's last blocks must not leave its checkpoint open (a
        # function, not a bound method: a deepcopy of the model must not copy these wrappers)
        me = weakref.ref(self)

        def groups_closed(module, args, output):
            wrappers = me()
            if wrappers is not None:
                wrappers._groups_closed(output)

        self._end_hook = found.model.register_forward_hook(groups_closed, always_call=True)
        self._apply()

    def _groups_closed(self, output) -> None:
        left = [(g, g.names[g.called]) for g in self._groups if g.called]
        for g, _ in left:
            g.close()
        if left and output is not None:  # (None: the forward raised; its error stands)
            g, missing = left[0]
            raise BlockError(f"the model's forward ended without calling block '{missing}' of "
                             f"its checkpointed group ({', '.join(g.names)}): the model took "
                             "another path than the recorded run; fit it again on inputs "
                             "that take this path", WHERE)

    def _apply(self) -> None:
        for m in self.own_checkpointing:
            m.gradient_checkpointing = False
        for name, m in self.blocks.items():
            m.__class__ = _wrapped_class(self._classes[name])
            m.__dict__["_schedlang_choice"] = self._choices[name]
            m.__dict__["_schedlang_apart"] = self._apart[name]
        _OWNER[self.found.model] = weakref.ref(self)

    def set(self, choices: dict[str, str] | None) -> None:
        for g in self._groups:
            g.close()
        self._groups = []
        groups: dict[str, Group] = {}
        for name in self.blocks:
            c = (choices or {}).get(name, "autograd")
            if c.startswith(GROUP):
                members = c[len(GROUP):].split("|")
                if c not in groups:
                    if any(m not in self.blocks for m in members):
                        raise BlockError(f"block '{name}': group {members} names a module "
                                         "that is not a block", WHERE)
                    groups[c] = Group(members, [self.blocks[m] for m in members],
                                      rerun=all(m in self._rerun_exact for m in members),
                                      apart=[self._apart[m] for m in members])
                    self._groups.append(groups[c])
                self._choices[name] = ("group", groups[c])
                continue
            base, _, extra = c.partition("+")
            kind = next((k for k in ("recompute", "selective", RERUN, "autograd", FAST_FORWARD)
                         if base.startswith(k)),
                        base if is_op_option(base) else None)
            if kind is None:
                raise BlockError(f"block '{name}': option '{c}' has no wrapper", WHERE)
            self._choices[name] = None if (kind == "autograd" and not extra) \
                else (kind, extra == "offload")
        self._apply()

    def ensure(self) -> None:
        """This set's wrappers and choices on the blocks again, if another set took them."""
        if _owner(self.found.model) is not self:
            self._apply()

    @staticmethod
    @contextlib.contextmanager
    def plain(model: nn.Module):
        """Within the context, `model`'s blocks run as plain autograd, whichever fit wrapped
        them (their choices come back on exit): to measure plain execution of a fitted model.
        Every wrapped block, also those of a fitted module dropped without `unwrap()` (no
        owner left: its choices stayed, and "plain" measured its plan)."""
        kept = {m: m.__dict__.get("_schedlang_choice") for m in model.modules()
                if isinstance(m, BlockMixin)}
        for m in kept:
            m.__dict__["_schedlang_choice"] = None
        try:
            yield
        finally:
            for m, choice in kept.items():
                m.__dict__["_schedlang_choice"] = choice

    def unwrap(self) -> None:
        for g in self._groups:
            g.close()
        self._end_hook.remove()
        for name, m in self.blocks.items():
            m.__class__ = self._classes[name]
            m.__dict__.pop("_schedlang_choice", None)
            m.__dict__.pop("_schedlang_apart", None)
        for m in self.own_checkpointing:
            m.gradient_checkpointing = True
        _OWNER.pop(self.found.model, None)


def offload_profiles(trace, part=None) -> dict:
    """block name -> the `OptionProfile` of its option ``offload`` (memory and the bytes
    copied), measured on `part` (the blocks as a `Partitioned`, `hooked.block_partition`)
    once per `trace` (a `hooked.BlockTrace`) and kept on it (later calls need no `part`)."""
    got = trace.offload
    if got is None:
        if part is None:
            raise ValueError("offload_profiles: not measured yet, and no blocks to run")

        with preserved(trace.found.model):
            prof = profile(part, repeats=1, options=("autograd", OFFLOAD),
                           recompute_by="checkpoint", grads_freed=True)
        got = {}
        for lp in prof.layers:
            opt = next((o for o in lp.options if o.name == OFFLOAD), None)
            if opt is not None:
                got[lp.name] = opt
        trace.offload = got
    return got
