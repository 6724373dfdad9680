"""Preparing a model for `fit`: its layers (the front end's graph data and profile), the
resident bytes (parameters, buffers, inputs, the loss's own tensors, the executor's
constants), the loss's memory and plain execution's predicted peak (`Prepared`)."""
from __future__ import annotations

import copy
import dataclasses
import logging
from dataclasses import dataclass, field

import torch
from torch import nn

from ..graphs.graph import Graph
from ..language.errors import SchedError
from ..plans.planners.no_recompute import no_recompute_plan
from ..plans.simulate import simulate
from ..progress import reporting
from . import host_malloc
from .frontends.blocks.frontend import BLOCKS
from .frontends.blocks.offload import OFFLOAD
from .frontends.blocks.rerun import RERUN
from .frontends.fx.frontend import FX
from .inputs import split_inputs
from .live import read_before
from .model_state import preserved
from .outputs import loss_moment, measure_loss_overhead, measure_loss_time, released_graph
from .tensors import flat, model_device

__all__ = ["Prepared", "prepare", "loss_tensor_bytes", "LOSS_RESERVE", "LOSS_SCALAR_BYTES",
           "FRONTENDS"]

log = logging.getLogger("schedlang.pytorch")


#: without a `loss_fn`, the memory reserved for the loss, in bytes of the model's floating-point
#: outputs (beyond the outputs' gradients): cross-entropy on logits holds their log-softmax and,
#: in its backward, one more temporary of their size
LOSS_RESERVE = 2


#: ... plus this much for the loss's scalars (the value, its gradient, a reduction's partial
#: sums): BERT's masked-LM loss at 100% measured 4 B over a reserve without it
LOSS_SCALAR_BYTES = 1024


@dataclass
class Prepared:
    partitioned: object
    graph: Graph  # the layered graph data as solved (resident data at 0 bytes)
    resident_bytes: int
    plain_peak: int  # whole step, resident included
    plain_time: float
    info: object = None
    loss_overhead: int = 0  # the loss function's memory beyond the outputs' gradients
    output_bytes: int = 0  # the model's outputs
    loss_assumed: bool = False  # no loss_fn: loss_overhead is the LOSS_RESERVE default
    frontend: str = "fx"  # how the layers were found: "fx" (torch.fx) or "blocks" (hooks)
    note: str = ""  # why `auto` chose the front end it did
    fsdp: dict | None = None  # a fully_shard-ed model: what FSDP2 adds (distributed.py)
    # generated layer options (`with_generated_options`): {"options": count, "seconds": time,
    # "why": text}; None: the fixed options only
    generated: dict | None = None
    # plain execution's peak measured in one eager step (`plain_measured_peak`); None: not yet
    plain_measured: int | None = None
    # [(graph, plan)] the plans `fit` took with this preparation (`as_before`)
    solved: list = field(default_factory=list)
    # the hook front end's group plans, (what they were priced for, graph, [(activation bytes
    # needed, plan)]): `group_plans_priced`
    grouped: tuple | None = None
    # fx: the plan executor's constants (`runtime.constant_bytes`), in `resident_bytes`; plain
    # execution runs no executor
    executor_bytes: int = 0

    # the caller's loop holds the model's outputs through the backward (`outputs.py`)
    outputs_held: bool = True
    # fit(bandwidth=...): the host link planned with and which plan was kept (`solve_linked`)
    host_link: dict | None = None
    # how the times were taken: {"threads": intra-op threads while timing, "in_context": the
    # hook front end's whole-step timing (`in_context`), "rounds": its steps per option}
    timing: dict = field(default_factory=dict)

    @property
    def front(self):
        """The `Frontend` the layers were found by (None: fallback, plain PyTorch)."""
        return FRONTENDS.get(self.frontend)


def loss_tensor_bytes(model: nn.Module, args: tuple, kwargs: dict, loss_fn, known) -> int:
    """Bytes of the tensors `loss_fn` reads of its own on the model's device (targets, class
    weights: alive through every step, memory the device holds as it holds the inputs), not
    counting the model's outputs nor the `known` storages (parameters, buffers, inputs)."""

    dev = model_device(model)
    with preserved(model), torch.no_grad():
        out = model(*args, **kwargs)
        outs = {t.untyped_storage().data_ptr() for t in flat(out) if isinstance(t, torch.Tensor)}
        _, read = read_before(lambda: loss_fn(out), dev)
    return sum(s.nbytes() for key, s in read.items() if key not in known and key not in outs)


#: the front ends by name (`prepare(frontend=...)`); "auto": fx where the model traces
FRONTENDS = {"auto": None, FX.name: FX, BLOCKS.name: BLOCKS}


@reporting("prepare", own_phase_when_nested=False)
def prepare(model: nn.Module, sample_inputs, layers=None, graph: Graph | None = None,
            loss_fn=None, frontend: str = "auto", sample_kwargs: dict | None = None,
            outputs_held: bool = True, offload: bool = False, block_options=False,
            **trace_kwargs) -> Prepared:
    """Partition and profile `model` (or take `graph`, e.g. read from a .sched file).

    `frontend`: ``"fx"`` cuts the model into layers with a whole-model `torch.fx` trace
    (`schedlang.pytorch.frontends.fx.partition`; finer layers: the glue joins them, and the runtime
    replays
    any rockmate plan); ``"blocks"`` finds its blocks from the module tree and one run with
    hooks (`schedlang.pytorch.frontends.blocks.find`; no trace: the model's own forward runs, the
    blocks are
    wrapped in place); ``"auto"`` (the default) uses fx when the model traces and its inputs are
    positional tensors, else blocks.

    `outputs_held`: the plan is for a loop that holds the model's outputs through the backward
    (``out = model(x); loss_fn(out).backward()``); False: one that releases them once the
    loss is computed (``loss_fn(model(x)).backward()``; `schedlang.pytorch.outputs`).

    `offload`: the hook front end measures its blocks' option ``offload`` too (for
    `fit(bandwidth=...)`), while it holds the sample values. `block_options` (the hook front
    end; True or a dict of arguments): generated block options, segments and
    selective-checkpoint policies (`schedlang.pytorch.frontends.blocks.block_ops`).
    `progress`: what it is doing (profiling block i of n, generating options) on stderr, as
    `fit(progress=...)` shows it (called by `fit`: into fit's own lines)."""
    args, kwargs = split_inputs(sample_inputs, sample_kwargs)
    if model_device(model).type == "cpu":
        host_malloc.hold_freed_memory()  # steady step times from the profile on (`host_malloc`)
    if frontend not in FRONTENDS:
        raise SchedError(f"frontend must be one of {', '.join(FRONTENDS)}, got {frontend!r}")
    note = ""
    if frontend == "auto":
        note = "" if graph is not None else FX.accepts(model, args, kwargs, layers)
        frontend = "blocks" if note else "fx"
        if note.startswith("torch.fx"):
            log.info("schedlang fit: %s; using the hook front end (blocks)", note)
    front = FRONTENDS[frontend]
    graph, part = front.prepare(model, args, kwargs, layers, graph, offload=offload,
                                block_options=block_options,
                                trace_kwargs=trace_kwargs)
    info = getattr(graph, "trace_info", None)
    # a copy whose data sizes may change (not a deep copy: the trace info holds the model)
    graph = copy.copy(graph)
    graph.data = [copy.copy(d) for d in graph.data]
    graph.layers = [_consistent_times(lay) for lay in graph.layers]
    graph.layers = _with_accumulation(graph)
    params = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
              for t in list(model.parameters()) + list(model.buffers())}
    resident = sum(params.values())
    # the inputs stay alive through the step (the caller holds them): resident, whatever the
    # plan deletes; their data count 0 bytes in the graph the plan is solved on
    names = set(part.inputs)
    resident += sum(part.data[d].nbytes for d in part.inputs if d in part.data)
    executor_bytes = front.executor_bytes(model)
    resident += executor_bytes
    for d in graph.data:
        if d.name in names:
            d.size = 0
    graph.budgets = {}
    if not outputs_held:  # the plan may delete them after the loss, as the loop frees them

        graph = released_graph(graph)
    loss_overhead = out_bytes = 0
    if loss_fn is not None:
        loss_overhead, out_bytes = measure_loss_overhead(model, args, loss_fn, kwargs,
                                                         outputs_held)
        # the loss's own tensors (targets) stay alive through every step, as the inputs do
        inputs = [t for t in flat((args, kwargs)) if isinstance(t, torch.Tensor)]
        known = set(params) | {t.untyped_storage().data_ptr() for t in inputs}
        resident += loss_tensor_bytes(model, args, kwargs, loss_fn, known)
        if graph.loss is not None:  # the loss runs in every step a plan is compared with
            graph.loss = dataclasses.replace(
                graph.loss, time=measure_loss_time(model, args, loss_fn, kwargs))
    else:  # the loss outside the module still takes memory: reserve a safe default
        out_bytes = sum(part.data[d].nbytes for d in part.outputs
                        if d in part.data and part.data[d].dtype.is_floating_point)
        loss_overhead = LOSS_RESERVE * out_bytes + LOSS_SCALAR_BYTES
    base = no_recompute_plan(graph)
    sim = simulate(base, graph)
    peak = max(sim.peak_bytes, loss_moment(base, graph) + loss_overhead)
    timing = dict(getattr(part, "timing", None) or {"threads": torch.get_num_threads(),
                                                     "in_context": False})
    timing["malloc_held"] = host_malloc.held()
    return Prepared(part, graph, resident, peak + resident, sim.time, info, loss_overhead,
                    out_bytes, loss_fn is None, frontend, note, executor_bytes=executor_bytes,
                    outputs_held=outputs_held, timing=timing)


def _with_accumulation(graph: Graph) -> list:
    """The layers, each backward overhead raised by the gradients it may add into an existing
    one. A datum read by several layers (a skip connection) gets its gradient from each of
    their backwards; the profile measured each backward creating the gradient, while at run
    time all but the first (backwards run in reverse layer order) compute a new contribution
    next to the gradient already there and then add it in place: a transient the size of the
    gradient that the graph data, where a
    second contribution to a live datum costs nothing, would not see."""
    sizes = {d.name: d.size for d in graph.data}
    first: dict[str, str] = {}  # gradient -> the layer whose backward makes it first
    for lay in graph.layers:  # backwards run in reverse layer order: the last maker is first
        for g in lay.grad_outputs:
            first[g] = lay.name
    out = []
    for lay in graph.layers:
        extra = sum(sizes.get(g, 0) for g in lay.grad_outputs
                    if first[g] != lay.name and not g.endswith(".params.grad"))
        if extra:
            lay = copy.copy(lay)
            lay.options = [dataclasses.replace(
                o, bwd_overhead=o.bwd_overhead + extra,
                bwd_steps=[dataclasses.replace(st, overhead=st.overhead + extra)
                           for st in o.bwd_steps]) for o in lay.options]
        out.append(lay)
    return out


def _consistent_times(layer):
    """A copy of `layer` whose option times obey what the options run: a ``recompute``
    backward runs the forward again and then the backward, so it takes at least its own
    forward plus ``autograd``'s backward (``rerun`` too: its forward is the one it repeats);
    a ``selective`` backward at least ``autograd``'s.
    Any other option that recomputes (``selective``, generated ones) runs at least what
    ``autograd`` runs: its forward and backward together take no less than ``autograd``'s, so
    that a plan which recomputes never predicts a negative overhead. Profiles of small layers
    on a loaded CPU break these bounds (timer noise), and the solver then prefers
    recomputation because the noise made it look cheaper."""
    auto = next((o for o in layer.options if o.name == "autograd"), None)
    if auto is None:
        return layer
    fixed = []
    for o in layer.options:
        low = None
        if o.name not in ("autograd", OFFLOAD):
            low = auto.fwd_time + auto.bwd_time - o.fwd_time
        if o.name in ("recompute", RERUN):
            low = max(low or 0.0, o.fwd_time + auto.bwd_time)
        elif o.name == "selective":
            low = max(low or 0.0, auto.bwd_time)
        if low is not None and o.bwd_time < low:
            o = copy.copy(o)
            o.bwd_time = low
        fixed.append(o)
    layer = copy.copy(layer)
    layer.options = fixed
    return layer
