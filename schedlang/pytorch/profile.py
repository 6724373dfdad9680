"""Profile the layers of a partitioned module: times, memory overheads, phantoms per option.

`profile(part, repeats=5, options=("autograd", "recompute", "selective"), device=None)` runs
every layer (identical signatures once) on the tensors it receives in one sample pass, and
measures, per option, what the runtime will execute:

* ``autograd``: ``outs = module(*xs)`` with grad on detached inputs (those that require grad);
  backward: ``torch.autograd.backward(outs, out_grads)``. Phantom: the bytes autograd saves,
  seen by an outer `torch.autograd.graph.saved_tensors_hooks` that sums the storages it packs,
  each once, leaving out parameters and buffers (resident) and the layer's own inputs and
  outputs (data nodes: the option *needs* those that autograd saved).
* ``recompute``: the forward runs under `torch.no_grad()` (no phantom); the backward runs the
  forward again with grad, then the backward: its time is both; it needs the layer's inputs.
  Dropout must see the same random numbers in both forwards: the runtime restores the RNG state.
* ``selective``: ``torch.utils.checkpoint.checkpoint(module, *xs, use_reentrant=False,
  context_fn=selective_context)``: the outputs of matmul, convolution and attention ops
  (`SAVE_OPS`) are kept, the rest is recomputed in the backward (a kept op that draws random
  numbers, attention with dropout on CUDA, is recomputed too: `selective_policy`). Its
  phantom is what the policy keeps (an outer hook cannot see it: the tensors stay in the
  checkpoint's frame), recorded by a dispatch mode inside the checkpoint's forward context,
  leaving out the layer's outputs; it needs the layer's inputs (the checkpoint keeps them) and
  the outputs it kept. Offered only for layers that run
  such an op and where it keeps less than ``autograd``.
* ``offload`` (asked for by name; the hook front end's wrappers with a host link,
  `schedlang.pytorch.frontends.blocks.offload`): the forward under saved-tensor hooks that copy what
  autograd saves to host memory, the backward copying each back when it reads it. Its phantom
  is what the forward leaves on the device beyond its outputs (nothing it saved stays there);
  it needs no datum; `host_bytes` is what the hooks copied (the link's time is added by
  `block_offload.with_offload_options`, not measured here).
* ``rerun`` (asked for by name; the hook front end's blocks): `recompute.rerun_call`, a
  forward without autograd and, in the backward, the forward again with autograd then its
  backward (torch's reentrant checkpoint, done as the runtime does it): no phantom; it needs
  the layer's inputs.
* ``fast_forward`` (every layer, measured on its own): the forward under ``torch.no_grad()``,
  what the runtime runs for the H-graph's `fast_forward` option: time and overhead (the graph
  data's `option fast_forward fwd T overhead M`). A layer whose outputs need no gradient (a
  frozen layer at the input side, parameter-free glue on inputs that need none) has nothing
  to differentiate: it gets no other option, so no backward and no phantom.

Times are medians of `repeats` runs after one warm-up, in seconds: CUDA events on a GPU; on
the CPU `host_clock()`, the calling thread's CPU time when PyTorch computes with one intra-op
thread (so that other processes on a loaded machine do not distort the layers' times, which
are taken one after the other), wall time otherwise (the hook front end then times its blocks
again in whole steps, as its wrappers run them: `frontends/blocks/in_context.py`). Memory is
measured with `MemoryTracker` in one
more run: the forward
overhead is the forward's peak above (memory before + outputs + phantom), the backward overhead
the backward's peak above (memory before, the phantom it consumes included, + the gradients
it creates), as the H-Rockmate formulation adds them (docs/language.md, "Overheads"). Parameter
gradients: the first backward to reach a parameter (the
backward of the last layer, in forward order, that uses it) creates its gradient; the others
accumulate into it (a temporary, part of their overhead).
"""
from __future__ import annotations

import statistics
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from .. import progress
from ..graphs.hgraph import FAST_FORWARD
from ..language.errors import Loc, SchedError
from .frontends.blocks.offload import offloading
from .frontends.fx.partition import LayerPart, Partitioned
from .memory import MemoryTracker, storage_bytes, storage_key
from .recompute import GradFeed, rerun_call

__all__ = ["OptionProfile", "LayerProfile", "ProfiledGraph", "profile", "SAVE_OPS",
           "selective_policy", "selective_context", "OPTIONS"]

WHERE = Loc("profile")
OPTIONS = ("autograd", "recompute", "selective")
#: options measured only when asked for by name
EXTRA_OPTIONS = ("offload", "rerun")

_aten = torch.ops.aten
#: ops whose outputs the `selective` option keeps (the rest is recomputed)
SAVE_OPS = frozenset(getattr(_aten, n) for n in (
    "mm", "addmm", "bmm", "baddbmm", "convolution", "_convolution", "convolution_overrideable",
    "cudnn_convolution", "mkldnn_convolution", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_flash_attention_for_cpu", "_flash_attention_forward",
    "_efficient_attention_forward") if hasattr(_aten, n))


def _is_save_op(func) -> bool:
    return getattr(func, "overloadpacket", func) in SAVE_OPS


def draws_random_numbers(func, args, kwargs) -> bool:
    """Whether this call of `func` advances the RNG: an op tagged ``nondeterministic_seeded``
    (dropout, the attention kernels), unless its ``dropout_p`` argument is 0 (attention without
    dropout draws nothing)."""
    if torch.Tag.nondeterministic_seeded not in getattr(func, "tags", ()):
        return False
    schema = getattr(func, "_schema", None)
    for k, arg in enumerate(schema.arguments if schema is not None else ()):
        if arg.name == "dropout_p":
            p = kwargs.get("dropout_p", args[k] if k < len(args) else arg.default_value)
            return bool(p)
    return True


def selective_policy(ctx, func, *args, **kwargs):
    """Keep the outputs of `SAVE_OPS`; recompute everything else. A kept op is not run again
    in the recomputation, so one that draws random numbers (CUDA's attention kernels with
    dropout) would leave the generator behind where the first run had advanced it, and every
    later random op of the block (its residual dropouts) would draw other masks: such a call
    is recomputed too, from the restored state."""
    return CheckpointPolicy.MUST_SAVE if _kept(func, args, kwargs) \
        else CheckpointPolicy.PREFER_RECOMPUTE


def _kept(func, args, kwargs) -> bool:
    """Whether the selective option keeps this call's outputs (`selective_policy`)."""
    return _is_save_op(func) and not draws_random_numbers(func, args, kwargs)


def selective_context():
    """The `context_fn` of the `selective` option (give it to `checkpoint`)."""
    return create_selective_checkpoint_contexts(selective_policy)


@dataclass
class OptionProfile:
    name: str
    fwd_time: float  # seconds
    bwd_time: float
    fwd_overhead: int  # bytes
    bwd_overhead: int
    phantom: int
    needs: list[str] = field(default_factory=list)  # data names the backward reads again
    memory_delta: int = 0  # measured bytes left by the forward above its outputs (= phantom)
    # the backward as sub-steps (graph data `bwd_steps`): [(overhead, frees, creates)]
    bwd_steps: list = field(default_factory=list)
    fwd_steps: list = field(default_factory=list)  # the forward's, the same way
    host_bytes: int = 0  # ``offload``: the bytes its hooks copy to host memory (each way)


@dataclass
class LayerProfile:
    name: str
    options: list[OptionProfile]
    output_bytes: dict[str, int]  # data name -> bytes
    param_bytes: int  # bytes of the parameters the layer uses
    param_grad_bytes: int  # bytes of the parameter gradients its backward creates
    param_grads: list[str]  # qualified names of those parameters
    grad_inputs: list[str] = field(default_factory=list)  # output gradients its backward reads
    grad_outputs: list[str] = field(default_factory=list)  # input gradients it produces
    signature: str = ""
    measured_as: str = ""  # the layer whose measurement this one reuses (same signature)
    skipped: dict[str, str] = field(default_factory=dict)  # option -> why it is not offered
    # the forward under ``no_grad`` (the runtime's `fast_forward`): time and overhead, measured
    # as its own option; a layer with no `options` (nothing to differentiate) has no backward
    fast_forward: OptionProfile | None = None

    def option(self, name: str) -> OptionProfile:
        for o in self.options:
            if o.name == name:
                return o
        raise KeyError(name)


@dataclass
class ProfiledGraph:
    part: Partitioned
    layers: list[LayerProfile]
    device: str
    resident_bytes: int  # parameters and buffers (unique storages): fixed memory
    param_bytes: int
    buffer_bytes: int
    input_grads: list[str]  # the model inputs that require grad
    repeats: int = 5

    def layer(self, name: str) -> LayerProfile:
        for lp in self.layers:
            if lp.name == name:
                return lp
        raise KeyError(name)


# --- helpers -------------------------------------------------------------------------------

def host_clock():
    """The clock of CPU timings: the calling thread's CPU time when PyTorch computes on that
    thread alone (one intra-op thread: the forward and the CPU autograd engine run there),
    else wall time (`perf_counter`)."""
    return time.thread_time if torch.get_num_threads() == 1 else time.perf_counter


class Timer:
    """Times of what runs on `device`: CUDA events there, else `host_clock()` (the clock of
    every CPU timing: layers here, generated options in `options.measure`)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device
        self.clock = host_clock()

    def start(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return self.clock()

    def stop(self, start) -> float:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            ev.synchronize()
            return start.elapsed_time(ev) / 1000.0
        return self.clock() - start


class _SaveRecorder(TorchDispatchMode):
    """Inside a selective checkpoint's forward: the storages of the outputs the policy keeps."""

    def __init__(self):
        super().__init__()
        # storage -> bytes; no reference to the tensors: holding them would keep them alive
        # through the backward, whose peak (the option's backward overhead) then comes out
        # higher than the runtime's. The checkpoint keeps them during the forward, so a
        # storage's address is not reused while recording.
        self.saved: dict[int, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if _kept(func, args, kwargs or {}):
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes():
                    self.saved.setdefault(storage_key(t), t.untyped_storage().nbytes())
        return out


def _recording_context(recorder: _SaveRecorder):
    fwd_ctx, recompute_ctx = create_selective_checkpoint_contexts(selective_policy)

    @contextmanager
    def forward():
        with ExitStack() as stack:
            stack.enter_context(fwd_ctx)
            stack.enter_context(recorder)
            yield

    return forward(), recompute_ctx


@contextmanager
def _param_grads_cleared(params: list[torch.Tensor]):
    saved = [p.grad for p in params]
    try:
        yield
    finally:
        for p, g in zip(params, saved):
            p.grad = g


def _outputs(outs) -> tuple:
    if isinstance(outs, torch.Tensor):
        return (outs,)
    return tuple(outs)


class _Runner:
    """Runs one layer under an option on fresh leaf inputs, measuring what is asked."""

    def __init__(self, layer: LayerPart, values: list[torch.Tensor], requires: list[bool],
                 params: list[torch.Tensor], recompute_by: str = "reforward"):
        self.layer = layer
        self.values = values
        self.recompute_by = recompute_by
        self.grads_freed = False  # the engine frees output gradients as the backward reads them
        self.requires = requires
        self.params = params
        self.out_grads: list | None = None
        self.resident_keys: set = set()  # storages the `offload` hooks leave on the device
        self.copied: list[int] = [0]  # bytes the `offload` hooks copied (the last forward)

    def leaves(self) -> list[torch.Tensor]:
        return [v.detach().requires_grad_(rg) if rg else v.detach()
                for v, rg in zip(self.values, self.requires)]

    def grads_for(self, outs, grads=None) -> tuple[list, list]:
        grads = self.out_grads if grads is None else grads
        pairs = [(o, g) for o, g in zip(outs, grads) if g is not None and o.requires_grad]
        return [o for o, _ in pairs], [g for _, g in pairs]

    def forward(self, option: str, xs, recorder=None):
        m = self.layer.module
        if option == "autograd":
            return _outputs(m(*xs))
        if option == "recompute" and self.recompute_by == "checkpoint":
            return _outputs(checkpoint(m, *xs, use_reentrant=False))
        if option == "recompute":
            with torch.no_grad():
                return _outputs(m(*xs))
        if option == "selective":
            ctx = (lambda: _recording_context(recorder)) if recorder is not None \
                else selective_context
            return _outputs(checkpoint(m, *xs, use_reentrant=False, context_fn=ctx))
        if option == "rerun":
            return _outputs(rerun_call(m, tuple(xs), {}, getattr(m, "rerun_apart", ())))
        if option == "offload":

            self.copied[0] = 0
            with offloading(self.resident_keys, self.copied):
                return _outputs(m(*xs))
        raise SchedError(f"unknown option '{option}' (options: {', '.join(OPTIONS)})", WHERE)

    def fresh_grads(self) -> list | None:
        """With `grads_freed`: copies of the output gradients for one backward (they count
        as present before it, as the graph's gradient data are), else None."""
        if not self.grads_freed:
            return None
        return [None if g is None else g.clone() for g in self.out_grads]

    def backward(self, option: str, xs, outs, given: list | None = None) -> None:
        if option == "recompute" and self.recompute_by == "reforward":
            outs = _outputs(self.layer.module(*xs))
        os, gs = self.grads_for(outs)
        if not os:
            return
        if not self.grads_freed:
            torch.autograd.backward(os, gs)
            return
        # copies that only autograd's engine holds once the backward starts: it frees each
        # when the node that reads it has run, as it frees the gradient a block receives from
        # the block after it
        given = self.fresh_grads() if given is None else given
        _, feed = self.grads_for(outs, given)
        given.clear()
        del gs
        root = GradFeed.apply(feed, *os)
        torch.autograd.backward(root, root.new_empty(0))


def _median_times(runner: _Runner, option: str, repeats: int, timer: Timer) -> tuple[float, float]:
    fwd, bwd = [], []
    for r in range(repeats + 1):
        for p in runner.params:
            p.grad = None
        xs = runner.leaves()
        t = timer.start()
        outs = runner.forward(option, xs)
        tf = timer.stop(t)
        t = timer.start()
        runner.backward(option, xs, outs)
        tb = timer.stop(t)
        del outs, xs
        if r:  # the first run warms up
            fwd.append(tf)
            bwd.append(tb)
    return statistics.median(fwd), statistics.median(bwd)


@dataclass
class _Measured:
    option: str
    fwd_time: float
    bwd_time: float
    fwd_overhead: int
    bwd_overhead: int
    phantom: int
    needs_in: list[int]  # positions in the layer's inputs
    needs_out: list[int]  # positions in its outputs
    saves_matmul: bool = False
    fwd_delta: int = 0  # memory left after the forward, above the outputs (checks the phantom)
    host_bytes: int = 0  # ``offload``: bytes copied to the host


def _measure(runner: _Runner, option: str, resident: list[torch.Tensor], resident_keys: set[int],
             device: torch.device, repeats: int, timer: Timer,
             owned: list[torch.Tensor]) -> _Measured:
    fwd_time, bwd_time = _median_times(runner, option, repeats, timer)
    for p in runner.params:
        p.grad = None
    xs = runner.leaves()
    in_keys = [storage_key(x) for x in xs]
    packed: dict[int, int] = {}

    def pack(t):
        s = t.untyped_storage()
        if s.nbytes():
            packed.setdefault(s.data_ptr(), s.nbytes())
        return t.detach()  # the live tensor would tie its grad_fn to itself (a C++ cycle)

    recorder = _SaveRecorder() if option == "selective" else None
    grads = [g for g in runner.out_grads if g is not None]
    with MemoryTracker(resident=resident + xs + grads, device=device, existing=False) as mt:
        if option == "autograd":
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                outs = runner.forward(option, xs)
        else:
            outs = runner.forward(option, xs, recorder)
        fwd_peak = mt.peak
        out_keys = [storage_key(o) for o in outs]
        new_out = {}
        for o, k in zip(outs, out_keys):
            if k not in in_keys and k not in resident_keys and o.untyped_storage().nbytes():
                new_out.setdefault(k, o.untyped_storage().nbytes())
        out_bytes = sum(new_out.values())
        after_fwd = mt.current
        if option == "autograd":
            kept = packed
        elif option == "selective":
            kept = dict(recorder.saved)
        else:
            kept = {}
        skip = resident_keys | set(in_keys) | set(out_keys)
        phantom = sum(b for k, b in kept.items() if k not in skip)
        if option == "offload":  # what stays on the device: nothing saved is there
            phantom = max(0, after_fwd - mt.baseline - out_bytes)
        needs_in = [i for i, k in enumerate(in_keys) if k in kept]
        needs_out = [i for i, k in enumerate(out_keys) if k in kept and k not in in_keys]
        if option in ("recompute", "selective", "rerun"):
            needs_in = list(range(len(xs)))
        fwd_overhead = max(0, fwd_peak - mt.baseline - out_bytes - phantom)
        given = runner.fresh_grads()
        mt.reset_peak()
        before_bwd = mt.current
        runner.backward(option, xs, outs, given)
        bwd_peak = mt.peak
        created = sum(x.grad.untyped_storage().nbytes() for x in xs
                      if x.requires_grad and x.grad is not None)
        created += sum(p.grad.untyped_storage().nbytes() for p in owned if p.grad is not None)
        bwd_overhead = max(0, bwd_peak - before_bwd - created)
    del outs
    saves_matmul = bool(recorder.saved) if recorder is not None else False
    return _Measured(option, fwd_time, bwd_time, fwd_overhead, bwd_overhead, phantom,
                     needs_in, needs_out, saves_matmul, after_fwd - mt.baseline - out_bytes,
                     runner.copied[0] if option == "offload" else 0)


def _measure_fast_forward(runner: _Runner, resident: list[torch.Tensor], device: torch.device,
                          repeats: int, timer: Timer) -> _Measured:
    """The forward under ``no_grad`` (the runtime's `fast_forward`): its median time, and its
    overhead, the peak above the memory before it plus its new outputs (docs/language.md,
    "Overheads")."""
    times = []
    for r in range(repeats + 1):
        xs = runner.leaves()
        t = timer.start()
        with torch.no_grad():
            outs = _outputs(runner.layer.module(*xs))
        tf = timer.stop(t)
        del outs, xs
        if r:  # the first run warms up
            times.append(tf)
    xs = runner.leaves()
    in_keys = {storage_key(x) for x in xs} | {storage_key(t) for t in resident}
    with MemoryTracker(resident=resident + xs, device=device, existing=False) as mt:
        with torch.no_grad():
            outs = _outputs(runner.layer.module(*xs))
        peak = mt.peak - mt.baseline
        new_out = {}
        for o in outs:
            k = storage_key(o)
            if k not in in_keys and o.untyped_storage().nbytes():
                new_out.setdefault(k, o.untyped_storage().nbytes())
        del outs
    return _Measured(FAST_FORWARD, statistics.median(times), 0.0,
                     max(0, peak - sum(new_out.values())), 0, 0, [], [])


# --- the profiler ----------------------------------------------------------------------------

def _measure_options(runner, name: str, options, resident, resident_keys, dev, repeats: int,
                     timer, owned) -> tuple[dict, dict]:
    """({option: measures}, {option: why it was skipped}) of one layer: each of `options`
    (none for a layer with nothing to differentiate), then its forward without autograd, its
    own option (for a layer with no backward, the only one)."""
    measured: dict = {}
    skipped: dict[str, str] = {}
    for option in options:
        try:
            measured[option] = _measure(runner, option, resident, resident_keys, dev, repeats,
                                        timer, owned)
        except RuntimeError as exc:
            # e.g. selective: "Tensor cached during selective activation checkpoint has been
            # mutated" (an in-place op on a matmul output)
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            if option == "autograd":
                raise SchedError(f"layer '{name}' fails under autograd: {first}",
                                 WHERE) from None
            skipped[option] = first
    measured[FAST_FORWARD] = _measure_fast_forward(runner, resident, dev, repeats, timer)
    return measured, skipped


def profile(part: Partitioned, *, repeats: int = 5, options=OPTIONS, device=None,
            sample_inputs: tuple | None = None, recompute_by: str = "reforward",
            grads_freed: bool = False) -> ProfiledGraph:
    """Measure every layer of `part` (see the module docstring).

    `recompute_by`: how the runtime runs the ``recompute`` option, which the profile mirrors:
    ``"reforward"`` (the plan executor: a no-grad forward, and a forward with grad right before
    the backward) or ``"checkpoint"`` (the hook front end's wrappers:
    `torch.utils.checkpoint`, non-reentrant, which drops each recomputed tensor once the
    backward has used it and keeps no recomputed output: a lower backward peak).
    `grads_freed`: the backward's output gradients are held by autograd's engine alone, which
    frees each once the node reading it has run (the hook front end, where a block's gradient
    comes from the block after it), not by the caller to the node's end (the plan executor,
    which deletes them at the plan's op): a backward's overhead is then measured so.

    The layers run on the tensors of one pass over `sample_inputs` (default: the inputs given to
    `partition`, when it kept them; else pass them here). The module's parameters' `.grad` and
    the global RNG state are restored afterwards.
    """
    options = tuple(options)
    if recompute_by not in ("reforward", "checkpoint"):
        raise SchedError(f"recompute_by must be 'reforward' or 'checkpoint', got "
                         f"{recompute_by!r}", WHERE)
    bad = [o for o in options if o not in OPTIONS + EXTRA_OPTIONS]
    if bad:
        raise SchedError(f"unknown option '{bad[0]}' (options: "
                         f"{', '.join(OPTIONS + EXTRA_OPTIONS)})", WHERE)
    if "autograd" not in options:
        raise SchedError("the options must include 'autograd' (the reference schedule)", WHERE)
    if not isinstance(repeats, int) or repeats < 1:
        raise SchedError(f"repeats must be a positive integer, got {repeats!r}", WHERE)
    inputs = sample_inputs if sample_inputs is not None else getattr(part, "sample_inputs", None)
    if inputs is None:
        raise SchedError("profile needs the sample inputs (sample_inputs=...)", WHERE)
    inputs = tuple(inputs)
    if len(inputs) != len(part.inputs):
        raise SchedError(f"the model takes {len(part.inputs)} tensor inputs, got "
                         f"{len(inputs)}", WHERE)
    root = part.root
    named = dict(root.named_parameters())
    params_all = list(named.values())
    buffers = list(root.buffers())
    if device is None:
        dev = params_all[0].device if params_all else inputs[0].device
    else:
        dev = torch.device(device)
    resident = params_all + buffers
    resident_keys = {storage_key(t) for t in resident}

    param_bytes = storage_bytes(params_all)
    buffer_bytes = storage_bytes(buffers)
    timer = Timer(dev)

    # the first backward to reach a parameter owns its gradient: the last layer using it
    owner: dict[str, str] = {}
    for layer in part.layers:
        for p in layer.params:
            if named[p].requires_grad:
                owner[p] = layer.name

    # which data get a gradient: walk the layers backwards from the model's outputs
    has_grad = {d for d in part.outputs if part.data[d].requires_grad}
    grad_in: dict[str, list[str]] = {}
    grad_out: dict[str, list[str]] = {}
    for layer in reversed(part.layers):
        gi = [d for d in layer.outputs if d in has_grad]
        grad_in[layer.name] = gi
        go = [d for d in layer.inputs if part.data[d].requires_grad] if gi else []
        grad_out[layer.name] = go
        has_grad.update(go)
    input_grads = [d for d in part.inputs if d in has_grad]

    # consumers left per datum, to free sample values once no later layer reads them
    remaining: dict[str, int] = {}
    for layer in part.layers:
        for d in layer.inputs:
            remaining[d] = remaining.get(d, 0) + 1
    env = dict(zip(part.inputs, inputs))
    cache: dict[tuple, tuple[str, dict[str, _Measured], dict[str, str]]] = {}
    results: list[LayerProfile] = []

    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []), \
            _param_grads_cleared(params_all), progress.phase("profiling", len(part.layers)):
        for k, layer in enumerate(part.layers, 1):
            progress.step(k, layer.name)
            values = [env[d] for d in layer.inputs]
            requires = [d in has_grad and part.data[d].requires_grad for d in layer.inputs]
            lparams = [named[p] for p in layer.params]
            owned = [named[p] for p in layer.params if owner.get(p) == layer.name]
            runner = _Runner(layer, values, requires, lparams, recompute_by)
            runner.resident_keys = resident_keys
            runner.grads_freed = grads_freed
            with torch.no_grad():
                sample_outs = _outputs(layer.module(*values))
            runner.out_grads = [torch.randn_like(o) if d in grad_in[layer.name] else None
                                for d, o in zip(layer.outputs, sample_outs)]
            # the same layer with and without gradients to compute measures differently
            key = (layer.signature, bool(grad_in[layer.name]), tuple(requires))
            if key in cache:
                measured_as, measured, skipped = cache[key]
            else:
                measured, skipped = _measure_options(
                    runner, layer.name, options if grad_in[layer.name] else (), resident,
                    resident_keys, dev, repeats, timer, owned)
                measured_as = layer.name
                cache[key] = (measured_as, measured, skipped)
            results.append(_layer_profile(layer, measured, measured_as, part, named, owner,
                                          grad_in[layer.name], grad_out[layer.name]))
            results[-1].skipped = dict(skipped)
            for d, o in zip(layer.outputs, sample_outs):
                env[d] = o
            for d in layer.inputs:
                remaining[d] -= 1
                if remaining[d] == 0 and d not in part.outputs:
                    env.pop(d, None)
            del runner, values, sample_outs
    return ProfiledGraph(part, results, str(dev), param_bytes + buffer_bytes, param_bytes,
                         buffer_bytes, input_grads, repeats)


def _layer_profile(layer: LayerPart, measured: dict[str, _Measured], measured_as: str,
                   part: Partitioned, named: dict, owner: dict, grad_in: list[str],
                   grad_out: list[str]) -> LayerProfile:
    opts: list[OptionProfile] = []
    auto = measured.get("autograd")
    ff = measured[FAST_FORWARD]
    for name, m in measured.items():
        if name == FAST_FORWARD:
            continue
        if name == "selective" and (not m.saves_matmul or m.phantom >= auto.phantom):
            continue
        needs = [layer.inputs[i] for i in m.needs_in] + [layer.outputs[i] for i in m.needs_out]
        opts.append(OptionProfile(name, m.fwd_time, m.bwd_time,
                                  m.fwd_overhead, m.bwd_overhead, m.phantom, needs,
                                  m.fwd_delta, host_bytes=m.host_bytes))
    owned = [p for p in layer.params if owner.get(p) == layer.name]
    return LayerProfile(
        layer.name, opts,
        {d: part.data[d].nbytes for d in layer.outputs},
        sum(named[p].numel() * named[p].element_size() for p in layer.params),
        sum(named[p].numel() * named[p].element_size() for p in owned),
        owned, grad_in, grad_out, layer.signature,
        "" if measured_as == layer.name else measured_as,
        fast_forward=OptionProfile(FAST_FORWARD, ff.fwd_time, 0.0, ff.fwd_overhead, 0, 0))
