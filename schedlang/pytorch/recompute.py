"""How a recomputation replays its first run: the RNG state of every device its inputs live on.

A recomputed forward must draw the random numbers its first run drew (dropout masks, stochastic
depth), or its outputs and the gradients through them are not eager PyTorch's. Every path that
runs a forward twice goes through here:

* `checkpoint_call(fn, args, kwargs)`: torch's non-reentrant `torch.utils.checkpoint` with
  ``preserve_rng_state=True`` (the hook front end's ``recompute`` and ``selective`` blocks).
  Torch stashes the CPU generator and the generators of the devices of the *positional*
  tensor arguments only (`get_device_states` walks ``args``, not ``kwargs``): a block called
  with keyword tensors alone (``layer(hidden_states=h, position_embeddings=(cos, sin))``)
  would recompute with the CUDA generator as the backward finds it. So every tensor of
  (args, kwargs) is handed to the checkpoint positionally, and `fn` is called with them put
  back in place.
* `open_checkpoint(fn, tensors)`: the generator torch's checkpoint runs, opened and closed by
  the caller (a checkpointed group of blocks, `groups.Group`), with the group's tensors
  positional; its private signature is bound by name, so that another torch release's
  parameter list does not shift the tensors into its flags.
* `rerun_call(fn, args, kwargs)`: the hook front end's ``rerun`` blocks. The forward runs
  without autograd (nothing saved but the tensor arguments, no graph built, no saved-tensor
  hooks: torch's non-reentrant checkpoint builds the whole graph in the first forward and
  packs every saved tensor through Python), and the block's backward runs it again with
  autograd, from the `FirstRun` state, then its backward, nested, from the gradients it was
  given (torch's reentrant checkpoint, with every tensor positional, the recomputed outputs
  freed before that backward unless the recomputation saved them, the gradients given
  freed once the nested backward's first node has read them: `_RerunCall.catch_gradients`,
  `GradFeed`, and each tensor the recomputation saved let go of once its node has unpacked
  it, as torch's checkpoint does: `_Held`). On the CPU that costs 3-11% less of a step
  than `checkpoint_call` at the same memory (bench/README.md, issue 28).
  The gradients are eager PyTorch's: an argument the block alone reads has its gradient
  summed inside the block, in eager's order, and handed on whole; one that other code reads
  too (the encoder's output, read by every decoder block's cross-attention), named in
  `apart` by the hook front end (`frontends.blocks.rerun`), has each use's gradient handed
  on by itself, for eager adds them to the others one by one.
* `FirstRun`: for the plan executor (fx, `runtime.PlanExecutor`), which runs a layer's
  forward again itself: the CPU generator's state and that of each device the layer's inputs
  and parameters live on, taken before the first run and restored, inside `fork_rng`, for
  every later one (the global streams advance as in eager PyTorch) — and the autocast state
  of the CPU and of those devices' types, as torch's checkpoint restores it: a layer first
  run under ``torch.autocast`` and recomputed in the backward (outside it) runs in the same
  precision again.

`rng_devices(*trees)` is the one rule for "the devices of these inputs": every device of a
tensor leaf that is neither the CPU (always restored) nor meta.
"""
from __future__ import annotations

import contextlib
import inspect
import weakref
from collections import Counter

import torch
from torch.autograd.graph import get_gradient_edge
from torch.utils._pytree import tree_flatten, tree_unflatten

__all__ = ["rng_devices", "checkpoint_call", "open_checkpoint", "rerun_call",
           "rerun_group_call", "FirstRun",
           "nested_backward_allowed", "GradFeed"]


def rng_devices(*trees) -> list[torch.device]:
    """The devices (other than the CPU and meta) of the tensors in `trees` (or of the
    `torch.device` leaves), in first-seen order: the generators a recomputation of a function
    of them must replay."""
    out: list[torch.device] = []
    for leaf in tree_flatten(list(trees))[0]:
        device = leaf.device if isinstance(leaf, torch.Tensor) else leaf
        if isinstance(device, torch.device) and device.type not in ("cpu", "meta") \
                and device not in out:
            out.append(device)
    return out


def _positional(args: tuple, kwargs: dict):
    """(every tensor of (args, kwargs) in order, a function that puts tensors back in place)."""
    flat, spec = tree_flatten((args, kwargs))
    where = [isinstance(x, torch.Tensor) for x in flat]
    tensors = [x for x, t in zip(flat, where) if t]

    def rebuild(given) -> tuple[tuple, dict]:
        it = iter(given)
        return tree_unflatten([next(it) if t else x for x, t in zip(flat, where)], spec)

    return tensors, rebuild


def checkpoint_call(fn, args: tuple, kwargs: dict, context_fn=None):
    """``fn(*args, **kwargs)`` under torch's non-reentrant checkpoint, RNG state preserved on
    the CPU and on every device of a tensor in `args` *or* `kwargs` (see the module
    docstring); `context_fn`: a selective-checkpoint context, as `checkpoint` takes it."""
    from torch.utils.checkpoint import checkpoint

    tensors, rebuild = _positional(args, kwargs)

    def run(*given):
        a, kw = rebuild(given)
        return fn(*a, **kw)

    extra = {} if context_fn is None else {"context_fn": context_fn}
    return checkpoint(run, *tensors, use_reentrant=False, preserve_rng_state=True, **extra)


def open_checkpoint(fn, tensors: list):
    """torch's non-reentrant checkpoint generator for ``fn(*tensors)``, advanced into its
    saved-tensor hooks: ``next(gen)`` again (StopIteration) closes it after the checkpointed
    code ran; ``gen.close()`` abandons it. RNG state preserved on the CPU and the tensors'
    devices; every private parameter but the function and the tensors is passed by name."""
    from torch.utils import checkpoint as ck

    gen_fn = ck._checkpoint_without_reentrant_generator
    wanted = {"fn": fn, "preserve_rng_state": True, "context_fn": ck.noop_context_fn,
              "determinism_check": "default", "debug": False}
    head = []
    for p in inspect.signature(gen_fn).parameters.values():
        if p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD:
            break
        head.append(wanted.get(p.name, p.default))
    gen = gen_fn(*head, *tensors)
    next(gen)
    return gen


#: the node inputs a tensor argument of a ``rerun`` call that other code reads too (`apart`)
#: takes: one per use of it inside the block (BART's and Whisper's decoder blocks read the
#: encoder's output twice, keys and values), so that each use's gradient reaches the engine
#: apart, added to the argument's other gradients in the order eager PyTorch adds them
USE_SLOTS = 8


class _RerunCall:
    """One call of `rerun_call`: the function, the arguments' non-tensor leaves and tree, what
    the first run returned (its tree, its non-tensor leaves) and the state to replay. It holds
    no tensor: the tensor arguments are the autograd node's saved tensors."""

    def __init__(self, fn, flat: list, spec, apart=(), first: FirstRun | None = None,
                 once=None):
        self.spec = spec
        self.where = [isinstance(x, torch.Tensor) for x in flat]
        self.consts = [None if t else x for x, t in zip(flat, self.where)]
        self.fn = fn
        tensors = [x for x, t in zip(flat, self.where) if t]
        self.first = FirstRun(rng_devices(tensors)) if first is None else first
        readers = Counter(apart)  # (a group's: a position once per member that reads it)
        self.apart = [readers[k] > 0 and x.requires_grad for k, x in enumerate(tensors)]
        self.slots = [USE_SLOTS * readers[k] if a else 1 for k, a in enumerate(self.apart)]
        self.out_spec = None
        self.out_where: list[bool] = []
        self.out_consts: list = []
        self.caught: list | None = None  # the outputs' gradients (`catch_gradients`)
        #: the first run, where it is not `fn` on the arguments (`rerun_group_call`): called
        #: once, then dropped with what it holds
        self.once = once

    def inputs(self, tensors) -> list[torch.Tensor]:
        """The node's inputs: each tensor argument once per slot."""
        return [x for x, n in zip(tensors, self.slots) for _ in range(n)]

    def arguments(self, inputs) -> list[torch.Tensor]:
        """The tensor arguments of the node's `inputs` (the first of each one's slots)."""
        out, at = [], 0
        for n in self.slots:
            out.append(inputs[at])
            at += n
        return out

    def slot_grads(self, uses: list[list[torch.Tensor]]) -> list[torch.Tensor | None]:
        """The gradients the node returns: each argument's, one use in each of its slots in
        the order the uses' gradients came (an argument not `apart`: its gradient summed by
        the engine, one slot); with more uses than slots, all of them summed in that order in
        the first (eager's bits only where no other code reads the argument)."""
        out: list[torch.Tensor | None] = []
        for got, n in zip(uses, self.slots):
            if len(got) > n:
                total = got[0]
                for g in got[1:]:
                    total = total + g
                got = [total]
            out += [*got, *[None] * (n - len(got))]
        return out

    def call(self, tensors) -> list[torch.Tensor]:
        """The function on `tensors` (the tensor arguments, in order): its output's tensors."""
        if self.once is not None:
            first, self.once = self.once, None
            flat, spec = tree_flatten(first())
        else:
            it = iter(tensors)
            a, kw = tree_unflatten([next(it) if t else x
                                    for x, t in zip(self.consts, self.where)], self.spec)
            flat, spec = tree_flatten(self.fn(*a, **kw))
        if self.out_spec is None:
            self.out_spec, self.out_where = spec, [isinstance(x, torch.Tensor) for x in flat]
            self.out_consts = [None if t else x for x, t in zip(flat, self.out_where)]
        return [x for x in flat if isinstance(x, torch.Tensor)]

    def catch_gradients(self, outs) -> None:
        """A pre-hook on the node that takes the gradients of its outputs as they reach it and
        hands the engine none in their place (the node's backward then sees None: its
        gradients are not materialized). The engine holds a node's incoming gradients until
        the node returns, which is the whole nested backward here; taken instead, each is fed
        to that backward and freed as soon as its first node has read it, as under torch's
        checkpoint (BERT: 29,440 B less in each block's backward, where ``rerun`` measured
        that much over ``recompute``). Hooks on the block's outputs run before it and see the
        gradients as they are."""
        node = next((o.grad_fn for o in outs if o.grad_fn is not None), None)
        if node is not None:
            node.register_prehook(self._catch)

    def _catch(self, grads: tuple) -> tuple:
        self.caught = list(grads)
        return (None,) * len(grads)

    def taken(self, grads) -> list:
        """The outputs' gradients: as `catch_gradients` caught them, else as given; none held
        here any longer."""
        out, self.caught = (list(grads) if self.caught is None else self.caught), None
        return out

    def output(self, tensors):
        it = iter(tensors)
        return tree_unflatten([next(it) if t else x
                               for x, t in zip(self.out_consts, self.out_where)], self.out_spec)


def _record_uses(outs: list[torch.Tensor], grads, leaves: list[torch.Tensor],
                 apart: list[bool], uses: list[list[torch.Tensor]]) -> None:
    """Hooks that record, in `uses` by argument, each gradient the recomputed graph of `outs`
    sends into an `apart` argument's leaf, one per graph edge, when its node computes it: the
    order in which eager PyTorch adds them to the argument's gradient. (An op that returns its
    input as it is, `.to()` to the same dtype, makes no node: its readers' edges count; an
    argument the block returns as it is gets that output's gradient first, from `grads`.)
    (A function: its loop variables must not outlive it, holding a tensor through the
    backward.)"""
    for o, g in zip(outs, grads):
        for k, x in enumerate(leaves):
            if apart[k] and o is x and g is not None:
                uses[k].append(g)
    accumulators = {}
    for k, x in enumerate(leaves):
        if apart[k]:
            accumulators[get_gradient_edge(x).node] = k
    seen: set = set()
    todo = [o.grad_fn for o in outs if o.grad_fn is not None]
    while todo:
        node = todo.pop()
        if node in seen:
            continue
        seen.add(node)
        mine = [(i, accumulators[nxt]) for i, (nxt, _) in enumerate(node.next_functions)
                if nxt is not None and nxt in accumulators]
        if mine:
            node.register_hook(_recorder(mine, uses))
        todo += [nxt for nxt, _ in node.next_functions if nxt is not None]


def _recorder(mine: list[tuple[int, int]], uses: list[list[torch.Tensor]]):
    def record(grads_in, _grads_out):
        for i, k in mine:
            if grads_in[i] is not None:
                uses[k].append(grads_in[i])
    return record


class GradFeed(torch.autograd.Function):
    """The root of a backward run from given gradients: ``GradFeed.apply(grads, *outs)`` is
    an empty tensor whose backward hands `grads` (a list, emptied) to `outs` as their
    gradients and keeps none; run it with ``torch.autograd.backward(root,
    root.new_empty(0))``. Given to `torch.autograd.backward` as the outputs' gradients
    instead, they would stay alive until that backward ends (the caller's frame and the
    engine's root hold them); here the engine is their only holder, and each is freed once
    its first reader has run. Empty, the root and its gradient hold no memory (a scalar and
    its seed would be 8 B in every measured backward peak on float32). A ``rerun`` block's
    nested backward and the profiler's measured backwards start from it."""

    @staticmethod
    def forward(ctx, grads: list, *outs):
        ctx.grads = grads
        return outs[0].new_empty(0)

    @staticmethod
    def backward(ctx, _):
        grads = tuple(ctx.grads)
        ctx.grads.clear()
        ctx.grads = None
        return (None, *grads)


class _Held:
    """A tensor the rerun's graph saved, let go of by the holder once a node has unpacked it
    (as under torch's checkpoint, which frees an unpacked saved tensor inside its node, not
    when the node returns: ViT's blocks held 128-256 B longer without it); unpacked again in
    the same node (a custom Function reading ``ctx.saved_tensors`` twice), it is still that
    node's."""

    __slots__ = ("tensor", "ref")

    def __init__(self, tensor: torch.Tensor):
        self.tensor: torch.Tensor | None = tensor
        self.ref = None

    def unpack(self) -> torch.Tensor:
        got, self.tensor = self.tensor, None
        if got is not None:
            self.ref = weakref.ref(got)
            return got
        got = None if self.ref is None else self.ref()
        if got is None:
            raise RuntimeError("schedlang: a tensor a rerun block's backward saved was "
                               "unpacked again after its node let go of it (a backward run "
                               "twice through a rerun block's graph?)")
        return got


class _Rerun(torch.autograd.Function):
    """`rerun_call`'s node: forward without autograd, backward = the forward again with
    autograd (the first run's RNG and autocast state), then its backward from the gradients
    given."""

    @staticmethod
    def forward(ctx, run: _RerunCall, *inputs):
        ctx.run = run
        ctx.set_materialize_grads(False)  # (an output no gradient reaches: None, not zeros)
        tensors = run.arguments(inputs)
        ctx.save_for_backward(*tensors)
        outs = run.call(tensors)  # (autograd is off inside a Function's forward)
        ctx.mark_non_differentiable(*(o for o in outs if not o.is_floating_point()
                                      and not o.is_complex()))
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        run: _RerunCall = ctx.run
        grads = run.taken(grads)
        leaves = [x.detach().requires_grad_(x.requires_grad) for x in ctx.saved_tensors]
        # an argument's gradient as the engine summed it, caught before the leaf's
        # accumulation, which would give it the argument's strides: eager hands it on in the
        # strides its ops made (ConvNeXt: a layer-scale gradient reduced over another layout
        # was 1 ulp off eager's). An argument other code reads too (`apart`): each use's
        # gradient, caught as its node makes it, for eager adds them to the argument's other
        # gradients one by one (a block's own sum of two uses, added after, is not eager's);
        # only those: for an argument the block alone reads, the sum inside is eager's, and
        # one gradient is held, not one per use
        uses: list[list[torch.Tensor]] = [[] for _ in leaves]
        for k, x in enumerate(leaves):
            if x.requires_grad and not run.apart[k]:
                x.register_hook(lambda g, k=k: uses[k].append(g))
        with run.first.again(), torch.enable_grad(), \
                torch.autograd.graph.saved_tensors_hooks(_Held, _Held.unpack):
            outs = run.call(leaves)
        if any(run.apart):
            _record_uses(outs, grads, leaves, run.apart, uses)
        # the nested backward starts from a node that hands the gradients on and lets go of
        # them (`GradFeed`): a recomputed output that no node saved is freed now, and each
        # gradient once its first reader has run, not held through the whole backward
        pairs = [(o, g) for o, g in zip(outs, grads) if g is not None and o.requires_grad
                 and not any(o is x for k, x in enumerate(leaves) if run.apart[k])]
        root = None
        if pairs:
            with torch.enable_grad():
                root = GradFeed.apply([g for _, g in pairs], *(o for o, _ in pairs))
        del outs, grads, pairs
        if root is not None:
            torch.autograd.backward(root, root.new_empty(0))
        out = run.slot_grads(uses)
        for got in uses:  # (from here the node's result alone holds them)
            got.clear()
        return (None, *out)


def nested_backward_allowed() -> bool:
    """May a block's backward run nested in the step's (``rerun``)? Not while a
    torch.distributed process group is up: DDP with ``find_unused_parameters=True`` marks the
    parameters it did not see in the forward's graph unused, then fails when the nested
    backward marks them ready ("marked as ready twice"), and FSDP's hooks expect the one
    backward too; torch's non-reentrant checkpoint composes with both."""
    dist = torch.distributed
    return not (dist.is_available() and dist.is_initialized())


def rerun_call(fn, args: tuple, kwargs: dict, apart=()):
    """``fn(*args, **kwargs)`` run without autograd now and again, with it, in its backward
    (see the module docstring); every tensor of (args, kwargs) is an input of the node, its
    gradient returned (none accumulated outside it but the parameters'); `apart`: the
    positions, among the tensors of (args, kwargs), of those other code reads too, whose
    gradient is handed on one use at a time (`USE_SLOTS`). Under torch.distributed
    (`nested_backward_allowed`), torch's checkpoint instead: the same memory, a little
    slower."""
    flat, spec = tree_flatten((args, kwargs))
    # with no input of the node needing a gradient its backward, where the parameters get
    # theirs, would never run (`hooked` offers no ``rerun`` there): torch's checkpoint, which
    # keeps the original graph, if it is asked anyway
    if not nested_backward_allowed() or \
            not any(isinstance(x, torch.Tensor) and x.requires_grad for x in flat):
        return checkpoint_call(fn, args, kwargs)
    tensors = [x for x in flat if isinstance(x, torch.Tensor)]
    return _rerun(_RerunCall(fn, flat, spec, apart), tensors)


def rerun_group_call(replay, tensors: list, last, first: FirstRun, apart=()):
    """A checkpointed group of blocks run the ``rerun`` way, at its last block: `last()` (that
    block on its arguments, which the members before it made without autograd) now, without
    autograd; in the backward, ``replay(*tensors)`` (every member again, in order, from the
    tensors the group reads from outside it: its first block's, and those a later member
    reads besides the output of the one before) with autograd, from `first` (taken before
    the first member ran), then its backward, nested, as `rerun_call`'s. `apart`: the
    positions among `tensors` of those other code reads too, each once per member that reads
    it (`USE_SLOTS` uses a member). The caller checks `nested_backward_allowed()` and that
    one of `tensors` needs a gradient before the first member runs."""
    flat, spec = tree_flatten((tuple(tensors), {}))
    run = _RerunCall(replay, flat, spec, apart, first=first, once=last)
    return _rerun(run, list(tensors))


def _rerun(run: _RerunCall, tensors: list):
    outs = _Rerun.apply(run, *run.inputs(tensors))
    run.catch_gradients(outs)
    return run.output(outs)


class FirstRun:
    """What a first run drew on, taken now: the CPU generator's state and that of each of
    `devices`, and the autocast state of the CPU and of those devices' types. `again()` runs
    a block from it: the generators inside `torch.random.fork_rng` (the global state is as
    before afterwards), under the autocast state of the first run."""

    def __init__(self, devices):
        self.devices = list(devices)
        self.cpu = torch.get_rng_state()
        self.states = [_device_module(d).get_rng_state(d) for d in self.devices]
        kinds = dict.fromkeys(["cpu", *(d.type for d in self.devices)])
        self.autocast = {k: (torch.is_autocast_enabled(k), torch.get_autocast_dtype(k))
                         for k in kinds}
        self.autocast_cache = torch.is_autocast_cache_enabled()

    @contextlib.contextmanager
    def again(self):
        by_type: dict[str, list] = {}
        for d in self.devices:
            by_type.setdefault(d.type, []).append(d)
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.random.fork_rng(devices=[]))  # the CPU's
            for kind, devs in by_type.items():
                stack.enter_context(torch.random.fork_rng(devices=devs, device_type=kind))
            torch.set_rng_state(self.cpu)
            for d, s in zip(self.devices, self.states):
                _device_module(d).set_rng_state(s, d)
            for kind, (enabled, dtype) in self.autocast.items():
                stack.enter_context(torch.autocast(kind, dtype=dtype, enabled=enabled,
                                                   cache_enabled=self.autocast_cache))
            yield


def _device_module(device: torch.device):
    return getattr(torch, device.type)
