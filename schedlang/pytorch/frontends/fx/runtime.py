"""Executing a layered Plan on the real PyTorch module, with the simulator's exact semantics.

`PlanExecutor(partitioned, plan, graph)` interprets the ops of a Plan made for the layered
graph of a partitioned module (see `schedlang.plans.layered_replay.LayeredReplay` for the semantics):

* every layer runs on *detached* copies of its input data, so the autograd graph of one layer
  never reaches into another: a layer's autograd graph is its **phantom**;
* ``compute(L.fwd, option)``:

  - ``autograd``: the forward runs with autograd on; the graph (the phantom) is kept, the
    outputs become data (plain tensors that share the outputs' storage). Tensors autograd
    saves that are views of the layer's interface data (its inputs and outputs) are not held
    by the phantom: a saved-tensor hook replaces them by a reference to the datum, resolved
    when the backward runs (the datum's value at that time, recomputed or not). The phantom
    therefore holds only what is internal to the layer, as the graph data counts it. The
    graph's roots (the outputs) and leaves (the detached inputs) keep their autograd identity
    but their `.data` becomes a zero-byte placeholder (an expanded scalar), so that neither
    holds the data's memory.
  - ``selective``: the same through ``torch.utils.checkpoint`` (non-reentrant) with the
    selective policy of `schedlang.pytorch.profile`;
  - ``ops`` (generated options ``ops1``, ``ops2``...: `schedlang.pytorch.options`): the same
    as ``autograd`` with the layer's callable replaced by the option's `SegmentedLayer`
    (registered in ``partitioned.op_options[layer][option]``): its aten graph in segments,
    the checkpointed ones recomputed during the backward (one round each); its inputs are
    restored before the backward as for ``selective``;
  - ``recompute``: a forward under ``no_grad``; the phantom is only the RNG state;
  - ``fast_forward``: a forward under ``no_grad``, no phantom.

  The RNG state (the CPU's generator and those of the devices of the layer's inputs and of
  the parameters) and the autocast state (`schedlang.pytorch.recompute.FirstRun`) are
  recorded before the *first* forward of each layer in a training step, and every later run
  of that layer (forward or the ``recompute`` backward) runs from it inside
  ``torch.random.fork_rng`` and that autocast state: dropout masks and precision, hence
  outputs and gradients, are those of the first run, and the global RNG stream advances as in
  eager PyTorch.
* ``compute(L.bwd, option)``: ``torch.autograd.backward`` from the layer's outputs with the
  output gradients; ``recompute`` first runs the forward again with autograd (same RNG).
  Input gradients land in the data ``x.grad`` (accumulated in place when several layers
  contribute); parameter gradients accumulate in ``param.grad`` as plain autograd does. The
  phantom is consumed: autograd frees each node's saved tensors as it runs (as in plain
  PyTorch).
* ``delete(d)`` drops the datum's reference. A phantom that refers to d keeps nothing when
  its option ``needs`` d (the plan brings d back before that backward); otherwise it keeps d
  (counted in ``last_stats["pinned"]``: graph data that forgot a ``needs``). The gradient of a
  model output arrives from the autograd engine, which holds it until the plan's backward
  returns: deleting it frees its storage (``resize_(0)``) when it fills that storage alone.
* ``drop_phantom(L)`` drops the layer's autograd graph.
* ``offload`` / ``prefetch`` / ``wait``: copies to host memory and back. On CUDA the copies are
  non-blocking, into pinned host buffers, on two side streams ordered with events; on CPU they
  are plain copies into a separate host buffer (the same code path, synchronous).

The ops before the loss are the forward part, the ops after it the backward part.
`PlanExecutor.module()` wraps the partitioned module: its forward runs the forward part and
returns the model outputs through a ``torch.autograd.Function`` whose backward runs the
backward part with the loss's gradient as ``<output>.grad``.
"""
from __future__ import annotations

import contextlib
import weakref

import torch

from ....graphs.graph import Graph
from ....graphs.hgraph import FAST_FORWARD
from ....plans.interpreter import OP_METHODS, PlanInterpreter
from ....plans.plan import Op, Plan
from ...guards import check_layer_outputs, checksum_buffer
from ...model_state import once_stats, running_stats_kept
from ...options import release_when_consumed
from ...profile import selective_context
from ...recompute import FirstRun, rng_devices
from ...tensors import constant_dtypes, placeholder, release_engine_grad, scalar
from .plan_module import PlanModule
from .state import (
    CHECKPOINT_OPTIONS,
    GRAPH_OPTIONS,
    NO_GRAD_OPTIONS,
    PARAMS_GRAD,
    Phantom,
    PlanError,
    SavedTensor,
    StepState,
    deleted_after,
    extent,
    is_params_grad,
    recomputed_layers,
    release_blocks,
)
from .transfers import TransferOps

__all__ = ["PlanExecutor", "PlanError", "PlanModule"]


class PlanExecutor(TransferOps):
    """Runs `plan` (made for `graph`) on `partitioned` (see the module docstring)."""

    def __init__(self, partitioned, plan: Plan, graph: Graph):
        self.part = partitioned
        self.plan = plan
        self.graph = graph
        self.layers = {lp.name: lp for lp in partitioned.layers}
        self.glayers = {gl.name: gl for gl in graph.layers}
        missing = [n for n in self.glayers if n not in self.layers]
        if missing:
            raise PlanError(f"graph '{graph.name}' has layer '{missing[0]}', which the "
                            "partitioned module does not have")
        self.data_names = {d.name for d in graph.data}
        self.resident_data = {d.name for d in graph.data if d.size == 0}
        self.needs = {(gl.name, o.name): set(o.needs) for gl in graph.layers for o in gl.options}
        self.loss_outputs = list(graph.loss.outputs) if graph.loss is not None else []
        self.model_outputs = list(partitioned.outputs)
        self.model_inputs = list(partitioned.inputs)
        self.device = self._find_device()
        # the placeholders' scalars and the checksums' buffer, made now rather than inside
        # the first measured step (`constant_bytes`: counted as resident)
        self.constants = [scalar(dtype, self.device)
                          for dtype in constant_dtypes(self.part.root)]
        self.constants.append(checksum_buffer(self.device))
        self._check_plan()
        loss_at = [k for k, op in enumerate(plan.ops) if op.op == "compute" and op.node == "loss"]
        if len(loss_at) != 1:
            raise PlanError(f"the plan computes the loss {len(loss_at)} times; it must be once")
        self.forward_ops = plan.ops[:loss_at[0]]
        self.backward_ops = plan.ops[loss_at[0] + 1:]
        # the checksum of `check_layer_outputs` is only taken where it can be compared
        self.recomputed = recomputed_layers(plan)
        self.deleted_after = deleted_after(plan)
        self.handed_over = self._handed_over()
        self._grad_inputs_of: dict[str, list[bool]] = {}
        self._rng_devices_of: dict[str, list[torch.device]] = {}
        self.streams = None
        self.last_stats: dict = {}
        # called around every op when set (`schedlang.pytorch.timeline.Recorder`)
        self.observer = None
        # called when the plan's backward raises (`FitModule`: close the step's tracker)
        self.on_error = None

    # --- set-up ----------------------------------------------------------------------------
    def _find_device(self) -> torch.device:
        for p in self.part.root.parameters():
            return p.device
        for b in self.part.root.buffers():
            return b.device
        return torch.device("cpu")

    def _check_plan(self) -> None:
        for k, op in enumerate(self.plan.ops):
            if op.op == "compute":
                node = op.node or ""
                if node == "loss":
                    continue
                layer, _, side = node.rpartition(".")
                if side not in ("fwd", "bwd") or layer not in self.glayers:
                    raise PlanError(f"op {k}: compute of unknown node {node!r}")
                opts = [o.name for o in self.glayers[layer].options]
                if side == "fwd":
                    opts.append(FAST_FORWARD)
                option = op.option
                if option is None and len(opts) == 1:
                    option = opts[0]
                if option not in opts:
                    raise PlanError(f"op {k}: compute {node!r} with option {option!r}; the "
                                    f"layer has {', '.join(opts)}")
                kind = self._option_kind(layer, option)
                if kind == "ops" and self._op_layer(layer, option) is None:
                    self._no_callable(k, node, layer, option)
                if kind is None:
                    raise PlanError(f"op {k}: option {option!r} of layer {layer!r} has no "
                                    "runtime: options are autograd, recompute, selective "
                                    "(and fast_forward), and generated options registered "
                                    "in the partitioned module's op_options")
            elif op.op == "delete" or (op.op in ("offload", "prefetch") and op.data):
                if op.data not in self.data_names:
                    raise PlanError(f"op {k}: {op.op} of unknown data {op.data!r}")
            elif op.op == "drop_phantom" or (op.op in ("offload", "prefetch") and op.layer):
                if op.layer not in self.glayers:
                    raise PlanError(f"op {k}: {op.op} of unknown layer {op.layer!r}")

    def _handed_over(self) -> list[str]:
        """The model outputs the backward part reads nowhere and either deletes first or never
        (kept to the end: the graph's role `output`): the forward part hands them over to the
        caller (the loss) and keeps no reference of its own, so that they are freed when the
        caller lets them go, as in eager PyTorch (a loss such as cross-entropy keeps its
        log-softmax, not the logits). A backward reads a datum that is one of its layer's
        inputs or that its option saves (`needs`)."""
        handed = []
        for name in self.model_outputs:
            if name not in self.data_names or name in self.resident_data:
                continue
            for op in self.backward_ops:
                if op.op == "delete" and op.data == name:
                    handed.append(name)
                    break
                if op.op == "compute" and op.node != "loss":
                    layer = op.node.rpartition(".")[0]
                    options = [op.option] if op.option else \
                        [o.name for o in self.glayers[layer].options]
                    if name in self.layers[layer].inputs or any(
                            name in self.needs.get((layer, o), ()) for o in options):
                        break
            else:
                handed.append(name)
        return handed

    def _option_kind(self, layer: str, option: str | None) -> str | None:
        """The runtime behaviour of an option: its name when known; an option named otherwise
        (e.g. by a profiler: ``autograd_0``) maps by prefix."""
        if option is None:
            opts = self.glayers[layer].options
            option = opts[0].name if len(opts) == 1 else None
        if option is None:
            return None
        for kind in ("fast_forward", "autograd", "recompute", "selective", "ops"):
            if option == kind or option.startswith(kind):
                return kind
        return None

    def _no_callable(self, k: int, node: str, layer: str, option: str) -> None:
        """PlanError located at the option's declaration: a generated option without its
        callable on this module."""
        decl = next(o for o in self.glayers[layer].options if o.name == option)
        how = ("its `segments` were not rebuilt on this module (`fit` with the graph data "
               "rebuilds them)" if decl.segments is not None else
               "its graph data carry no `segments` to rebuild it from: trace the model again "
               "with `schedlang trace --op-options` (or leave the option out)")
        raise PlanError(f"generated option '{option}' of layer '{layer}' (computing {node} at "
                        f"op {k} of the plan) has no callable on this module: {how}", decl.loc)

    def _op_layer(self, layer: str, option: str):
        """The callable of a generated option (`schedlang.pytorch.options`), or None."""
        return (getattr(self.part, "op_options", None) or {}).get(layer, {}).get(option)

    # --- public API --------------------------------------------------------------------------
    def new_run(self) -> StepState:
        return StepState()

    def forward(self, run: StepState, inputs: list) -> list[torch.Tensor]:
        """Run the forward part; returns the model outputs (detached tensors)."""
        if len(inputs) != len(self.model_inputs):
            raise PlanError(f"the module takes {len(self.model_inputs)} tensor inputs, got "
                            f"{len(inputs)}")
        for name, x in zip(self.model_inputs, inputs):
            run.values[name] = x.detach() if isinstance(x, torch.Tensor) else x
        run.input_requires_grad = [isinstance(x, torch.Tensor) and x.requires_grad
                                   for x in inputs]
        _StepOps(self, run).run(self.forward_ops)
        outs = []
        for name in self.model_outputs:
            if name not in run.values:
                raise PlanError(f"model output {name!r} is not in memory at the loss")
            outs.append(run.values[name])
        for name in self.handed_over:  # the caller holds them now (see `_handed_over`)
            self._delete(run, name)
            run.handed.add(name)
        return outs

    def backward(self, run: StepState, grads: list) -> list:
        """Run the backward part with the model outputs' gradients; returns the gradients of
        the model inputs (None where an input needs none)."""
        for name, g in zip(self.model_outputs, grads):
            gname = f"{name}.grad"
            if gname in self.data_names and g is not None:
                run.values[gname] = g
                run.engine_grads.add(gname)
        for name in self.loss_outputs:
            if name not in run.values and not name.endswith(".grad") and name in self.data_names:
                run.values[name] = scalar(torch.float32, self.device)  # the loss value: unused
        _StepOps(self, run).run(self.backward_ops)
        out = []
        for name, rg in zip(self.model_inputs, run.input_requires_grad):
            out.append(run.values.get(f"{name}.grad") if rg else None)
        self._finish(run)
        return out

    def run_ops(self, run: StepState, ops: list[Op]) -> None:
        """Run some ops on a run's state (tests and tools)."""
        _StepOps(self, run).run(ops)

    def module(self) -> PlanModule:
        return PlanModule(self)

    # --- ops: the walk is `PlanInterpreter`'s (`_StepOps`), each kind's meaning here --------
    def _compute(self, run: StepState, op: Op) -> None:
        if op.node == "loss":
            return
        layer, _, side = op.node.rpartition(".")
        option = op.option
        if option is None:  # a node with a single option (a layer with no backward: fast_forward)
            opts = self.glayers[layer].options
            option = opts[0].name if opts else FAST_FORWARD
        if side == "fwd":
            self._forward(run, layer, option)
        else:
            self._backward(run, layer, option, op)

    def _inputs_of(self, run: StepState, layer: str) -> list[torch.Tensor]:
        xs = []
        for d in self.layers[layer].inputs:
            if d not in run.values:
                self._late_prefetch(run, d)
            if d not in run.values:
                raise PlanError(f"layer {layer!r} needs {d!r}, which is not in memory")
            xs.append(run.values[d])
        return xs

    def _rng_devices(self, layer: str) -> list[torch.device]:
        """The generators a run of `layer` draws from: the CPU's, and those of the devices
        of its inputs and of the parameters (`recompute.rng_devices`)."""
        got = self._rng_devices_of.get(layer)
        if got is None:
            metas = [self.part.data[d] for d in self.layers[layer].inputs if d in self.part.data]
            got = self._rng_devices_of[layer] = rng_devices(
                [torch.device(m.device) for m in metas], self.device)
        return got

    def _replaying(self, run: StepState, layer: str):
        """A context for a run of `layer` from the RNG and autocast state of its first
        forward (`recompute.FirstRun`)."""
        state = run.rng.get(layer)
        if state is None:
            run.rng[layer] = FirstRun(self._rng_devices(layer))
            return contextlib.nullcontext()
        stack = contextlib.ExitStack()
        stack.enter_context(state.again())
        # a run after the first: BatchNorm running statistics are updated once per step

        stack.enter_context(running_stats_kept(self.layers[layer].module))
        return stack

    def _grad_inputs(self, layer: str) -> list[bool]:
        got = self._grad_inputs_of.get(layer)
        if got is None:
            produced = set(self.glayers[layer].grad_outputs)
            got = self._grad_inputs_of[layer] = [f"{d}.grad" in produced
                                                  for d in self.layers[layer].inputs]
        return got

    def _forward(self, run: StepState, layer: str, option: str) -> None:
        kind = self._option_kind(layer, option)
        lp = self.layers[layer]
        xs = self._inputs_of(run, layer)
        old = run.phantoms.get(layer)
        if kind in GRAPH_OPTIONS or kind == "recompute":
            if old is not None:  # replaced by the new one
                self._drop_phantom(run, layer)
        if kind in NO_GRAD_OPTIONS:
            with self._replaying(run, layer), torch.no_grad():
                outs = lp.module(*xs)
            outs = _as_tuple(outs)
            if layer in self.recomputed:  # a recomputation must repeat the first run
                check_layer_outputs(run, layer, outs)
            for name, t in zip(lp.outputs, outs):
                run.values[name] = t
            if kind == "recompute":
                run.phantoms[layer] = Phantom(option)
            return
        # autograd / selective: keep the graph
        needs = self._grad_inputs(layer)
        leaves = []
        for x, need in zip(xs, needs):
            leaf = x.detach()
            if need and leaf.is_floating_point():
                leaf.requires_grad_(True)
            leaves.append(leaf)
        ph = Phantom(option)
        if kind in ("autograd", "ops"):
            fn = lp.module if kind == "autograd" else self._op_layer(layer, option)

            # what autograd saves keeps these hooks, in C++, where Python's collector cannot
            # follow: held strongly, the step's state (whose phantoms hold the graph's roots)
            # and a saved output held live (tied to its own grad_fn) would close cycles that
            # outlive a forward whose backward never runs (an evaluation pass with gradients on)
            phantom, state = weakref.ref(ph), weakref.ref(run)

            def pack(t):
                rec = SavedTensor(t.detach())
                held = phantom()
                if held is not None:
                    held.saved.append(rec)
                return rec

            def unpack(rec):
                return self._unpack(_alive(state), rec, layer)

            with self._replaying(run, layer), torch.enable_grad(), \
                    torch.autograd.graph.saved_tensors_hooks(pack, unpack):
                outs = _as_tuple(fn(*leaves))
        else:
            from torch.utils.checkpoint import checkpoint

            context_fn = _selective_context_fn()

            with self._replaying(run, layer), torch.enable_grad():
                outs = _as_tuple(checkpoint(once_stats(lp.module, lp.module), *leaves,
                                            use_reentrant=False, context_fn=context_fn))
        if layer in self.recomputed:
            check_layer_outputs(run, layer, outs)
        iface = [(d, leaf) for d, leaf in zip(lp.inputs, leaves)]
        values = []
        for name, t in zip(lp.outputs, outs):
            v = t.detach()
            values.append(v)
            iface.append((name, v))
            run.values[name] = v
        self._refer(run, ph, iface)
        for name, t in zip(lp.outputs, outs):
            if t.requires_grad and t.grad_fn is not None:
                ph.roots.append((name, t))
                t.data = placeholder(t)
            elif t.requires_grad:  # a leaf returned as is: its gradient is the output's
                ph.roots.append((name, t))
        for d, leaf in zip(lp.inputs, leaves):
            if leaf.requires_grad:
                ph.leaves[d] = leaf
                # the memory is the datum's; the checkpoint's frame (selective) reads its
                # inputs again at the backward, which restores them first
                leaf.data = placeholder(leaf)
        run.phantoms[layer] = ph

    def _refer(self, run: StepState, ph: Phantom, iface: list[tuple[str, torch.Tensor]]) -> None:
        """Replace saved tensors that lie inside an interface datum by references to it."""
        if not ph.saved:
            return
        if run.resident_ptrs is None:
            run.resident_ptrs = self._resident_ptrs()
        resident = run.resident_ptrs
        # interface data by storage; a saved tensor's extent is only worked out when its
        # storage is one of theirs (most saved tensors are internal to the layer)
        spans: dict[int, list] = {}
        for name, t in iface:
            if t.numel():
                spans.setdefault(t.untyped_storage().data_ptr(), []).append((name, t))
        device = self.device
        for rec in ph.saved:
            t = rec.tensor
            if t is None:
                continue
            if t.numel() == 0 or t.device != device:
                rec.tensor = t.detach()
                continue
            ptr = t.untyped_storage().data_ptr()
            if ptr in resident:
                rec.tensor = t.detach()
                rec.resident = True
                continue
            found = spans.get(ptr)
            if found:
                lo, hi = extent(t)
                for name, it in found:
                    ilo, ihi = extent(it)
                    if t.dtype == it.dtype and ilo <= lo and hi <= ihi:
                        rec.ref = (name, tuple(t.shape), tuple(t.stride()),
                                   lo - ilo, tuple(it.stride()))
                        rec.tensor = None
                        break
                else:
                    rec.tensor = t.detach()
            else:
                rec.tensor = t.detach()

    def _resident_ptrs(self) -> set:
        """Storages of the module's parameters and buffers (resident, never offloaded)."""
        ptrs = set()
        for t in list(self.part.root.parameters()) + list(self.part.root.buffers()):
            ptrs.add(t.untyped_storage().data_ptr())
        return ptrs

    def _unpack(self, run: StepState, rec: SavedTensor, layer: str) -> torch.Tensor:
        if rec.tensor is not None:
            return rec.tensor
        if rec.block is not None and rec.block.host is not None:
            # offloaded and not prefetched: bring it back now
            self._sync_event(rec.block.event)
            dtype, shape, stride, offset = rec.view
            return rec.block.host.to(self.device).view(dtype).as_strided(shape, stride, offset)
        name, shape, stride, rel, istride = rec.ref
        v = run.values.get(name)
        if v is None:
            raise PlanError(f"the backward of layer {layer!r} reads {name!r}, which is not in "
                            "memory (the graph data should list it in the option's needs)")
        if tuple(v.stride()) != istride:
            if istride != tuple(torch.empty(v.shape, device="meta").stride()):
                raise PlanError(f"{name!r} was recomputed with another memory layout")
            v = v.contiguous()
        return v.as_strided(shape, stride, v.storage_offset() + rel)

    def _backward(self, run: StepState, layer: str, option: str, op: Op | None = None) -> None:
        kind = self._option_kind(layer, option)
        lp = self.layers[layer]
        gl = self.glayers[layer]
        ph = run.phantoms.pop(layer, None)
        if ph is None:
            raise PlanError(f"backward of layer {layer!r} without its phantom")
        needs = self._grad_inputs(layer)
        if kind == "recompute":
            xs = self._inputs_of(run, layer)
            leaves = []
            for d, x, need in zip(lp.inputs, xs, needs):
                leaf = x.detach()
                if need and leaf.is_floating_point():
                    leaf.requires_grad_(True)
                    ph.leaves[d] = leaf
                leaves.append(leaf)
            with self._replaying(run, layer), torch.enable_grad():
                outs = _as_tuple(lp.module(*leaves))
            ph.roots = [(name, t) for name, t in zip(lp.outputs, outs) if t.requires_grad]
            del leaves, outs
        elif kind in CHECKPOINT_OPTIONS:
            for d, leaf in ph.leaves.items():  # the checkpoint recomputes from its inputs
                v = run.values.get(d, ph.kept.get(d))
                if v is None:
                    raise PlanError(f"the backward of layer {layer!r} (selective) needs {d!r}, "
                                    "which is not in memory")
                leaf.data = v
            # no reference of this frame may outlive the loop: the last input's tensor would
            # stay alive through the whole backward, after the plan freed it inside the node
            # (`_in_node_frees`)
            v = leaf = None
        fn = self._op_layer(layer, option) if kind == "ops" else None
        early = self._in_node_frees(run, op, lp, gl, ph, fn) if fn is not None else set()
        roots, grads, gnames = [], [], []
        consumed = set(gl.grad_inputs)
        for name, t in ph.roots:
            gname = f"{name}.grad"
            if gname not in consumed:
                continue
            g = run.values.get(gname)
            if g is None:
                raise PlanError(f"backward of layer {layer!r} needs {gname!r}, which is not in "
                                "memory")
            roots.append(t)
            grads.append(g)
            gnames.append(gname)
        for gname in early:  # held by the backward's caller alone from now on
            if run.values.pop(gname, None) is not None:
                run.engine_grads.discard(gname)
                run.released.add(gname)
        # the graph alone holds the saved tensors now: autograd frees each node's as it runs,
        # as in plain PyTorch (the phantom shrinks during its backward)
        ph.saved.clear()
        release_blocks(ph)
        ph.roots.clear()
        handles = []
        if early:  # the output gradients the plan deletes after this node: freed in it, once
            # the node of their output has run (unless another datum shares the memory)

            def may_free(g):
                ptr = g.untyped_storage().data_ptr()
                return not any(isinstance(v, torch.Tensor) and v.numel() and
                               v.untyped_storage().data_ptr() == ptr
                               for v in run.values.values())

            handles = release_when_consumed(
                roots, [g if n in early else None for n, g in zip(gnames, grads)], may_free)
        if roots:
            try:
                with torch.enable_grad():
                    torch.autograd.backward(roots, grads)
            finally:
                for h in handles:
                    h.remove()
        if fn is not None:
            fn.on_round = None
        del roots, grads
        produced = set(gl.grad_outputs)
        for d in lp.inputs:
            gname = f"{d}.grad"
            if gname not in produced:
                continue
            leaf = ph.leaves.get(d)
            g = leaf.grad if leaf is not None else None
            if leaf is not None:
                leaf.grad = None
            if g is None:
                ref = run.values.get(d)
                meta = self.part.data.get(d)
                if ref is not None:
                    g = torch.zeros_like(ref)
                else:
                    g = torch.zeros(meta.shape, dtype=meta.dtype, device=self.device)
            self._accumulate(run, gname, g)
        for gname in produced:
            if is_params_grad(gname):
                run.values.setdefault(gname, PARAMS_GRAD)
        ph.roots.clear()
        ph.leaves.clear()
        ph.saved.clear()

    def _in_node_frees(self, run: StepState, op: Op | None, lp, gl, ph: Phantom, fn) -> set:
        """Before the backward of a generated option (`fn`, a `SegmentedLayer`): of the data the
        plan deletes right after this node, those the backward reads are released inside it,
        as the option's `bwd_steps` (`schedlang.pytorch.options.measure_steps`) count them: the
        layer's outputs now (what autograd saved of them holds them until it is consumed), each
        input when the recomputation round that reads it last starts (or now, when no round
        reads it: `SegmentedLayer.release_points`), the output gradients once the node of their
        output has run (the caller frees those: returned). Returns the gradients' names."""
        gone = self.deleted_after.get(id(op), set()) if op is not None else set()
        if not gone:
            return set()
        outs = [d for d in lp.outputs if d in gone and d not in lp.inputs and d in run.values]
        points = fn.release_points()
        at_round: dict[int, list[str]] = {}
        now = list(outs)
        for i, d in enumerate(lp.inputs):
            if d in gone and i in points and d in run.values and d not in self.resident_data \
                    and lp.inputs.count(d) == 1:
                if points[i] < 0:
                    now.append(d)
                else:
                    at_round.setdefault(points[i], []).append(d)
        released = set(now) | {d for ds in at_round.values() for d in ds}
        # what the phantom saved of them is held by the saved tensors from now on, not looked
        # up in the data when the backward reads it
        for rec in ph.saved:
            if rec.ref is not None and rec.ref[0] in released:
                name, shape, stride, rel, _ = rec.ref
                v = run.values[name]
                rec.tensor = v.as_strided(shape, stride, v.storage_offset() + rel)
                rec.ref = None

        def release(d: str) -> None:
            leaf = ph.leaves.get(d)
            if leaf is not None:
                leaf.data = placeholder(leaf)
            self._delete(run, d)
            run.released.add(d)

        for d in now:
            release(d)
        if at_round:
            def on_round(s: int) -> None:
                for d in at_round.pop(s, []):
                    release(d)
            fn.on_round = on_round
        return {g for g in gl.grad_inputs if g in gone}

    def _accumulate(self, run: StepState, gname: str, g: torch.Tensor) -> None:
        cur = run.values.get(gname)
        if cur is None:
            run.values[gname] = g
            return
        ptr = cur.untyped_storage().data_ptr()
        shared = any(v is not cur and isinstance(v, torch.Tensor) and v.numel()
                     and v.untyped_storage().data_ptr() == ptr
                     for v in run.values.values())
        if shared or cur.shape != g.shape:
            run.values[gname] = cur + g
        else:
            cur.add_(g)

    def _delete(self, run: StepState, name: str) -> None:
        if name in run.released:  # freed inside the backward before this delete
            run.released.discard(name)
            return
        if name in run.handed and name not in run.values:
            run.handed.discard(name)  # deleted when it was handed over
            return
        v = run.values.pop(name, None)
        if v is None:
            if name in run.offloaded or name in run.fetching:
                return
            raise PlanError(f"delete of {name!r}, which is not in memory")
        if v is PARAMS_GRAD:
            return
        if name in run.engine_grads:
            run.engine_grads.discard(name)
            ptr = v.untyped_storage().data_ptr() if isinstance(v, torch.Tensor) else 0
            shared = any(isinstance(w, torch.Tensor) and w.numel() and
                         w.untyped_storage().data_ptr() == ptr for w in run.values.values())
            if not shared:  # (an identity layer may have passed it on as an input gradient)
                release_engine_grad(v)
            return
        # a phantom that refers to the datum: when the option's backward `needs` it, the plan
        # brings it back before that backward (the reference resolves then); otherwise the
        # phantom keeps it (the graph data did not list it: counted in `pinned`)
        for layer, ph in run.phantoms.items():
            if name in self.needs.get((layer, ph.option), ()):
                continue
            for rec in ph.saved:
                if rec.ref is not None and rec.ref[0] == name:
                    _n, shape, stride, rel, _ = rec.ref
                    rec.tensor = v.as_strided(shape, stride, v.storage_offset() + rel)
                    rec.ref = None
                    run.pinned += 1
                    run.pinned_names.append(name)
            if self._option_kind_of_phantom(ph) in CHECKPOINT_OPTIONS and name in ph.leaves:
                ph.kept[name] = v
                run.pinned += 1
                run.pinned_names.append(name)

    def _option_kind_of_phantom(self, ph: Phantom) -> str | None:
        for kind in ("autograd", "recompute", "selective", "ops"):
            if ph.option == kind or ph.option.startswith(kind):
                return kind
        return None

    def _drop_phantom(self, run: StepState, layer: str) -> None:
        ph = run.phantoms.pop(layer, None)
        if ph is None:
            raise PlanError(f"drop_phantom of layer {layer!r}, which has none")
        if self._keep_host_phantom(run, layer, ph):
            return
        ph.roots.clear()
        ph.leaves.clear()
        ph.kept.clear()
        ph.saved.clear()
        release_blocks(ph)

    def _finish(self, run: StepState) -> None:
        run.phantoms.clear()
        run.offloaded.clear()
        run.fetching.clear()
        run.phantom_host.clear()
        run.rng.clear()
        run.values.clear()
        run.handed.clear()
        run.released.clear()
        self.last_stats = {"pinned": run.pinned, "pinned_data": list(run.pinned_names),
                           "offloaded_bytes": run.offloaded_bytes,
                           "prefetched_bytes": run.prefetched_bytes}


def _as_tuple(outs) -> tuple:
    if isinstance(outs, torch.Tensor):
        return (outs,)
    return tuple(outs)


def _alive(state) -> StepState:
    """The step a backward's saved tensor belongs to (`_forward`'s weak reference)."""
    run = state()
    if run is None:
        raise PlanError("a backward ran after its training step's state was freed")
    return run


def _selective_context_fn():
    """The `context_fn` of the selective option: `schedlang.pytorch.profile`'s, so that the
    runtime keeps what the profiler measured."""

    return selective_context


# --- the autograd.Function and the module ------------------------------------------------------


class _StepOps(PlanInterpreter):
    """The executor's ops on one step's state: `PlanInterpreter` walks them (one method per
    op kind), the executor gives each its meaning; an op observer (`timeline.Recorder`)
    brackets each op."""

    def __init__(self, executor: PlanExecutor, state: StepState):
        self.executor = executor
        self.state = state

    def dispatch(self, op: Op) -> None:
        if op.op not in OP_METHODS:
            raise PlanError(f"unknown op {op.op!r}")
        observer = self.executor.observer
        if observer is None:
            super().dispatch(op)
            return
        with observer.op(self.executor, op):
            super().dispatch(op)

    def on_compute(self, op: Op) -> None:
        self.executor._compute(self.state, op)

    def on_delete(self, op: Op) -> None:
        self.executor._delete(self.state, op.data)

    def on_drop_phantom(self, op: Op) -> None:
        self.executor._drop_phantom(self.state, op.layer)

    def on_offload(self, op: Op) -> None:
        self.executor._offload(self.state, op)

    def on_prefetch(self, op: Op) -> None:
        self.executor._prefetch(self.state, op)

    def on_wait(self, op: Op) -> None:
        self.executor._wait(self.state, op)
