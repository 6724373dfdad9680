"""The model's outputs in the caller's training loop, and the loss computed on them.

The loss runs outside the module; its memory is measured once (`measure_loss_overhead`) and
added to the plan's memory right after the graph's loss node (`loss_moment`); its time
(`measure_loss_time`) is the loss node's.

Two loops are common, and their peaks differ by up to the outputs' size (GPT-2's logits at
124M parameters and a batch of 8 x 1,024 tokens: 1.65 GB):

* outputs held (``fit(..., outputs_held=True)``, the default)::

      out = model(x)
      loss_fn(out).backward()        # `out` is alive until the backward ends

* outputs released (``fit(..., outputs_held=False)``)::

      loss_fn(model(x)).backward()   # nothing holds the output once the loss is computed

  The output's storage is freed when the loss no longer needs it: at once when the loss saves
  only what it derives from it (cross-entropy keeps its log-softmax, not the logits), during the
  loss's backward when the loss saved the output itself (``out.pow(2).mean()``).

A plan is made for one of them. Held, the graph's outputs have the role ``output`` and
``models/extensions/held_outputs.sched`` keeps them in memory to the step's end. Released
(`released_graph`), they are ordinary data the plan deletes after their last use, the loss;
the loss function's memory is measured in that loop (`measure_released_loss`), so the loss
phase of the prediction (the memory at the loss plus the loss's overhead) counts what is freed
there. The runtimes need nothing more: the fx plan executor keeps no reference to an output its
backward part does not read (`runtime.PlanExecutor.handed_over`), and the hook front end runs
the model's own forward, whose outputs belong to the caller.
"""
from __future__ import annotations

import copy
import statistics

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_map

from ..graphs.graph import Graph
from ..plans.plan import Plan
from ..plans.simulate import replay
from .loss_node import LOSS_VALUE_BYTES
from .memory import MemoryTracker
from .model_state import preserved
from .profile import Timer
from .tensors import model_device

__all__ = ["released_graph", "measure_released_loss", "measure_loss_overhead", "loss_moment",
           "uncounted_outputs", "released_bytes", "measure_loss_time", "LOSS_REPEATS"]

#: timed runs of the loss function (after one warm-up run): their median is the loss's time
LOSS_REPEATS = 5



def released_graph(graph: Graph) -> Graph:
    """A copy of `graph` (data nodes copied) in which the model's outputs — the data the loss
    reads — are no longer role ``output``: the plan may delete them once the loss is computed,
    as a loop that does not hold them frees them (`lifetimes.earliest_deletes` puts the delete
    there). They are pinned: the caller has them, and moving them to the host frees nothing."""
    read = set(graph.loss.inputs) if graph.loss is not None else set()
    g = copy.copy(graph)
    data = []
    for d in graph.data:
        if d.name in read and d.role == "output":
            d = copy.copy(d)
            d.role = ""
            d.pinned = True
        data.append(d)
    g.data = data
    return g


class _Released(torch.autograd.Function):
    """One model output as a loop that does not hold it sees it: a tensor with a gradient
    function (a leaf would stay alive in autograd's graph), sharing the value's storage, whose
    gradient the backward keeps in `kept` (as the graph's loss node keeps the output's gradient
    for the model's backward)."""

    @staticmethod
    def forward(ctx, anchor, value, kept):
        ctx.kept = kept
        return value.view_as(value)

    @staticmethod
    def backward(ctx, grad):
        ctx.kept.append(grad)
        return None, None, None


def measure_released_loss(produce, loss_fn, device) -> tuple[int, int, int]:
    """(the loss's peak above the outputs, the bytes of the outputs' gradients it leaves, the
    bytes of the outputs) in a loop that does not hold the outputs: the output of `produce()`
    (the model's forward, without gradients) is turned into tensors with a gradient function,
    the loss computed, this function's references dropped (only what the loss saved keeps an
    output alive), and the loss's backward run, all under one `MemoryTracker` whose baseline
    is the outputs."""

    kept: list[torch.Tensor] = []
    anchor = torch.zeros((), device=device, requires_grad=True)

    def release(t):
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            return _Released.apply(anchor, t.detach(), kept)
        return t

    # the outputs are made inside the tracker (one declared resident would stay referenced
    # by it, and never be released); the loss's peak is taken from there
    with MemoryTracker(device=device) as mt:
        out = tree_map(release, produce())
        out_bytes = sum(t.numel() * t.element_size() for t in tree_flatten(out)[0]
                        if isinstance(t, torch.Tensor))
        before = mt.current
        mt.reset_peak()
        loss = loss_fn(out)
        del out  # the loop's own reference ends here
        loss.backward()
        del loss
        extra = mt.peak - before
    grads = sum(g.numel() * g.element_size() for g in kept)
    return extra, grads, out_bytes


def loss_moment(plan: Plan, graph: Graph) -> int:
    """Memory (graph bytes) right after the plan's loss: what the simulator's replay holds
    then (live data, saved phantoms, and data an offload plan has already prefetched)."""

    steps = replay(plan, graph, record=True).steps or []
    for op, step in zip(plan.ops, steps):
        if op.op == "compute" and op.node == "loss":
            return step.after
    return 0


def measure_loss_overhead(model: nn.Module, sample_inputs: tuple, loss_fn,
                          sample_kwargs: dict | None = None,
                          outputs_held: bool = True) -> tuple[int, int]:
    """(bytes the loss function's forward and backward use beyond the gradients of the model's
    outputs and the loss value, bytes of the outputs), measured on one sample output; with
    `outputs_held` False, in a loop that releases the outputs once the loss is computed
    (`measure_released_loss`)."""

    dev = model_device(model)

    def produce():
        with preserved(model), torch.no_grad():
            return model(*sample_inputs, **(sample_kwargs or {}))

    if not outputs_held:
        extra, grads, out_bytes = measure_released_loss(produce, loss_fn, dev)
        return max(0, extra - grads - LOSS_VALUE_BYTES), out_bytes
    out = tree_map(lambda t: t.detach().requires_grad_(True)
                   if isinstance(t, torch.Tensor) and t.is_floating_point() else t, produce())
    leaves = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
    out_bytes = sum(t.numel() * t.element_size() for t in leaves)
    with MemoryTracker(resident=leaves, device=dev, existing=False) as mt:
        loss = loss_fn(out)
        loss.backward()
        extra = mt.peak - mt.baseline
    grads = sum(t.grad.numel() * t.grad.element_size() for t in leaves if t.grad is not None)
    # what the graph's loss node creates is counted there: the outputs' gradients and the loss
    # datum (the value and its seed gradient, LOSS_VALUE_BYTES, kept through the backward), so
    # the loss phase's peak is what was there before the loss plus `extra`, to the byte. (The
    # seed gradient is gone by the loss's peak: subtracting the value alone, 4 B, predicted
    # checkpoint_sequential's own schedule 4 B above what it measures.)
    return max(0, extra - grads - LOSS_VALUE_BYTES), out_bytes


def measure_loss_time(model: nn.Module, sample_inputs: tuple, loss_fn,
                      sample_kwargs: dict | None = None, repeats: int = LOSS_REPEATS) -> float:
    """Seconds of the loss function's forward and backward on one sample output: the median
    of `repeats` runs after a warm-up, by the profile's clock (`profile.Timer`). The steps a
    plan is compared with (plain execution's, a user's) run the loss too; priced at 1 us, the
    predicted overhead was a share of a step without it, too high by the loss's share (0.7% of
    a plain step of the README's Llama, 0.26 of 37 ms; more where the loss is heavier)."""

    dev = model_device(model)
    with preserved(model), torch.no_grad():
        out = model(*sample_inputs, **(sample_kwargs or {}))
    out = tree_map(lambda t: t.detach().requires_grad_(True)
                   if isinstance(t, torch.Tensor) and t.is_floating_point() else t, out)
    leaves = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
    timer = Timer(dev)
    times = []
    # a loss that draws random numbers leaves the generator as it found it
    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
        for run in range(repeats + 1):
            start = timer.start()
            loss_fn(out).backward()
            took = timer.stop(start)
            for t in leaves:
                t.grad = None
            if run:  # the first run warms up
                times.append(took)
    return statistics.median(times)


def uncounted_outputs(graph: Graph, output_bytes: int) -> int:
    """The bytes of the model's outputs (`output_bytes`, measured) that the graph's loss phase
    does not count: the data the loss reads are held from their forward to the step's end
    (models/extensions/held_outputs.sched), so their sizes are in its memory already."""
    reads = set(graph.loss.inputs) if graph.loss is not None else set()
    counted = sum(d.size for d in graph.data if d.name in reads)
    return max(0, int(output_bytes) - int(counted))


def released_bytes(graph: Graph) -> int:
    """Bytes of the data the loss reads that the plan may delete (a loop that releases the
    model's outputs: `outputs.released_graph`)."""
    reads = set(graph.loss.inputs) if graph.loss is not None else set()
    return sum(d.size for d in graph.data if d.name in reads and d.role != "output")
