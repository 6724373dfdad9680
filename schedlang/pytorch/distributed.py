"""`fit` under torch.distributed: one plan on every rank, and what FSDP2 adds to each layer.

**One plan on every rank.** Under DDP or FSDP every rank runs the same collectives in the same
order; ranks that execute different plans (one recomputes a block whose all-gather another
skips) hang or compute wrong gradients. A solve is not reproducible across ranks even with a
deterministic solver: each rank profiles its own copy of the model, and the measured times
differ between ranks (timer noise), so the solver sees different data; a solve stopped by a
time limit also depends on the machine's speed. So `fit` does not try to make N solves agree:
**rank 0's plan is broadcast** and every rank executes it (`agree_plan`). Before that the ranks
exchange a digest of the graph data that does not depend on timing (layers, options, data
sizes and phantoms: `graph_digest`); when they differ (different models, shapes or dtypes on
different ranks) every rank raises `DistributedPlanError` naming the ranks, instead of hanging
later in a collective. Calibration (a re-plan after a step measured over its prediction) is
per rank by nature, so `fit` turns it off when a process group of more than one rank is active.

`fit` calls `agree_plan` when `torch.distributed` is initialized with more than one rank; the
call is a no-op otherwise. Every rank must call `fit` (it is a collective then).

**FSDP2 memory per rank** (`fsdp_layer_memory`). With `fully_shard` on each block, a rank keeps
1/N of each block's parameters; the block's full parameters exist between its all-gather and
its reshard: during its forward, again during its backward (and during a recomputation, which
runs the forward again inside the backward: with ``reshard_after_forward=True`` the backward's
all-gather happens before the recomputation and serves both), and its full-size gradients
exist from the backward until their reduce-scatter has produced the 1/N shard. What this adds
to each layer of the layered graph data is computed here on the graph data; the front end that
traces a `fully_shard`-ed model is `docs/distributed.md`'s "What works today".
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from dataclasses import dataclass

from ..errors import SchedError
from ..graph import Graph
from ..plan import Plan

__all__ = ["active", "agree_graph", "agree_plan", "solves_here", "graph_digest", "plan_digest", "DistributedPlanError",
           "FSDPLayer", "fsdp_layer_memory", "param_bytes_of", "with_fsdp_memory"]


class DistributedPlanError(SchedError):
    """The ranks of a process group cannot execute one plan (exit code 2: bad input)."""


def _dist():
    import torch.distributed as dist

    return dist


def active(group=None) -> bool:
    """A process group of more than one rank is initialized."""
    try:
        dist = _dist()
    except ImportError:
        return False
    return bool(dist.is_available() and dist.is_initialized()
                and dist.get_world_size(group) > 1)


def graph_digest(graph: Graph) -> str:
    """SHA-256 of what a plan depends on and timing does not: the data (names, sizes, roles),
    the layers (inputs, outputs, gradients, options with their phantoms and overheads) and
    the loss. Ranks running the same model on the same shapes give the same digest."""
    layers = [[lay.name, list(lay.inputs), list(lay.outputs), list(lay.grad_inputs),
               list(lay.grad_outputs),
               [[o.name, int(o.phantom), int(o.fwd_overhead), int(o.bwd_overhead)]
                for o in lay.options]]
              for lay in graph.layers]
    data = [[d.name, int(d.size), d.role] for d in graph.data]
    loss = [list(graph.loss.inputs), list(graph.loss.outputs)] if graph.loss else None
    text = json.dumps({"data": data, "layers": layers, "loss": loss}, sort_keys=True,
                      default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def plan_digest(plan: Plan | None) -> str:
    """SHA-256 of a plan's operations (what every rank executes); "none" for plain execution."""
    if plan is None:
        return "none"
    text = json.dumps([op.to_json() for op in plan.ops], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _check_digests(graph: Graph, group) -> None:
    dist = _dist()
    digests: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(digests, graph_digest(graph), group=group)
    if len(set(digests)) > 1:
        groups: dict[str, list[int]] = {}
        for r, d in enumerate(digests):
            groups.setdefault(d, []).append(r)
        parts = "; ".join(f"ranks {rs} digest {d[:12]}" for d, rs in groups.items())
        raise DistributedPlanError(
            f"the ranks traced different graphs ({parts}): every rank must fit the same model "
            "on inputs of the same shapes and dtypes, so that one plan serves all of them")


def agree_graph(graph: Graph, plain_time: float, group=None) -> tuple[Graph, float]:
    """Rank 0's profile on every rank: (graph, plain execution time).

    A collective. The ranks compare `graph_digest`s (raising `DistributedPlanError` on every
    rank when they differ), then take rank 0's graph data, whose times differ from theirs only
    by timer noise: every later decision of `fit` (plain execution, the budget, the plan's
    predictions) is then the same on every rank. A no-op without an active group."""
    if not active(group):
        return graph, plain_time
    _check_digests(graph, group)
    box = [(graph, plain_time)]
    _dist().broadcast_object_list(box, src=_global_rank(group, 0), group=group)
    return box[0]


def solves_here(group=None) -> bool:
    """Whether this process solves the plan: always without a group, else rank 0 only (the
    other ranks receive its plan from `agree_plan`)."""
    return not active(group) or _dist().get_rank(group) == 0


def agree_plan(plan: Plan | None, graph: Graph, group=None) -> Plan | None:
    """Rank 0's plan (or None: plain execution, or no plan found), on every rank of `group`.

    A collective: every rank calls it. The ranks first compare `graph_digest`s and raise
    `DistributedPlanError` on every rank when they differ; then rank 0's plan is broadcast,
    and the returned plan's digest is checked on every rank. A no-op without an active
    process group of more than one rank."""
    if not active(group):
        return plan
    dist = _dist()
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    _check_digests(graph, group)
    box = [None if plan is None else
           {"plan": plan.to_json(), "predicted_peak": plan.predicted_peak,
            "predicted_time": plan.predicted_time, "meta": dict(plan.meta)}]
    dist.broadcast_object_list(box, src=_global_rank(group, 0), group=group)
    got = box[0]
    if got is None:
        chosen = None
    elif rank == 0 and plan is not None:
        chosen = plan
    else:
        chosen = Plan.from_json(got["plan"], "<plan of rank 0>")
        chosen.predicted_peak = got["predicted_peak"]
        chosen.predicted_time = got["predicted_time"]
        chosen.meta.update(got["meta"])
    # the check the issue asks for: every rank now holds the same plan
    mine = plan_digest(chosen)
    every: list = [None] * world
    dist.all_gather_object(every, mine, group=group)
    if len(set(every)) > 1:  # a broadcast that did not arrive whole
        raise DistributedPlanError(f"rank {rank}: the plans of the ranks differ after the "
                                   f"broadcast of rank 0's ({sorted(set(every))})")
    if chosen is not None:
        chosen.meta["plan_digest"] = mine
        chosen.meta["agreed_ranks"] = world
    return chosen


def _global_rank(group, rank: int) -> int:
    if group is None:
        return rank
    return _dist().get_global_rank(group, rank)


# --------------------------------------------------------------------------------- FSDP2
@dataclass
class FSDPLayer:
    """What FSDP2 adds on one rank to one layer of the layered graph data (bytes).

    `full_params`: the layer's parameters unsharded (all-gathered: held while the layer's
    forward runs, and again while its backward runs); `shard_params`: this rank's shard
    (resident for the whole step); `full_grads`: the unsharded gradients of its parameters,
    from its backward until the reduce-scatter (this rank then keeps `shard_grads`);
    `fwd_extra`, `bwd_extra`: what the layer's forward and backward overheads grow by. A
    recomputing backward (the forward run again inside the backward) adds nothing beyond
    `bwd_extra`: FSDP2's pre-backward hook all-gathers the parameters before the
    recomputation runs, and they serve both."""

    layer: str
    full_params: int
    shard_params: int
    full_grads: int
    shard_grads: int
    fwd_extra: int
    bwd_extra: int

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def _shard(nbytes: int, world: int) -> int:
    # fully_shard pads dim 0 to a multiple of the world size: ceil per rank
    return -(-int(nbytes) // world)


def param_bytes_of(graph: Graph) -> dict[str, int]:
    """Each layer's parameter bytes, read off the graph data: the size of its datum
    ``<layer>.params.grad`` (what `schedlang.pytorch.trace` writes: the gradients of the
    layer's parameters, the size of the parameters)."""
    sizes = {d.name: d.size for d in graph.data}
    return {lay.name: int(sizes.get(f"{lay.name}.params.grad", 0)) for lay in graph.layers}


def fsdp_layer_memory(graph: Graph, world: int, param_bytes: dict[str, int] | None = None,
                      reshard_after_forward: bool = True,
                      reduce_dtype_ratio: float = 1.0) -> list[FSDPLayer]:
    """Per layer of `graph`, what FSDP2 on `world` ranks holds on one rank (see `FSDPLayer`).

    `param_bytes`: each layer's parameter bytes (unsharded), by layer name (default: read off
    the graph, `param_bytes_of`); a layer without parameters is not sharded (it adds nothing). Forward: the layer's full parameters are live
    while it runs (`fwd_extra` = full − shard; with ``reshard_after_forward=False`` they stay
    until the backward, which `with_fsdp_memory` counts as a phantom). Backward: the full
    parameters are all-gathered again (when resharded after the forward), the full gradients
    are produced and reduce-scattered at the end of the layer's backward: `bwd_extra` = full
    params − shard + full grads. `reduce_dtype_ratio`: the reduce-scatter buffer's bytes per
    gradient byte (0.5 for a bf16 `reduce_dtype` of fp32 gradients; 1.0 by default)."""
    if world < 1:
        raise ValueError("world size must be at least 1")
    if param_bytes is None:
        param_bytes = param_bytes_of(graph)
    out = []
    for lay in graph.layers:
        full = int(param_bytes.get(lay.name, 0))
        shard = _shard(full, world) if full else 0
        grads = int(round(full * reduce_dtype_ratio)) if full else 0
        fwd = full - shard
        bwd = (full - shard if reshard_after_forward else 0) + grads
        out.append(FSDPLayer(lay.name, full, shard, grads, _shard(grads, world) if grads else 0,
                             fwd, bwd))
    return out


def with_fsdp_memory(graph: Graph, layers: list[FSDPLayer],
                     reshard_after_forward: bool = True) -> Graph:
    """A copy of `graph` whose options carry what FSDP2 adds (`fsdp_layer_memory`): each
    option's forward overhead grows by the layer's `fwd_extra`, its backward overhead by
    `bwd_extra` (a recomputing option's backward runs the forward inside it, under the same
    all-gather). With ``reshard_after_forward=False`` the unsharded parameters stay from the
    forward to the backward: they are added to every option's phantom (what the layer keeps
    between its forward and its backward), which is memory no plan can drop. The resident
    bytes of the step (parameters) are the shards: the caller counts them; the gradient datum
    of each layer's parameters (``<layer>.params.grad``, alive to the end of the step) becomes
    the shard that the reduce-scatter leaves (the full gradients are in `bwd_extra`)."""
    by_name = {x.layer: x for x in layers}
    g = copy.copy(graph)
    shards = {f"{x.layer}.params.grad": x.shard_grads for x in layers if x.full_params}
    g.data = [dataclasses.replace(d, size=shards[d.name]) if d.name in shards else d
              for d in graph.data]
    new_layers = []
    for lay in graph.layers:
        x = by_name.get(lay.name)
        if x is None or (x.fwd_extra == 0 and x.bwd_extra == 0):
            new_layers.append(lay)
            continue
        lay = copy.copy(lay)
        opts = []
        for o in lay.options:
            o = dataclasses.replace(o, fwd_overhead=o.fwd_overhead + x.fwd_extra,
                                    bwd_overhead=o.bwd_overhead + x.bwd_extra)
            if o.fwd_steps:
                o.fwd_steps = [dataclasses.replace(s, overhead=s.overhead + x.fwd_extra)
                               for s in o.fwd_steps]
            if o.bwd_steps:
                o.bwd_steps = [dataclasses.replace(s, overhead=s.overhead + x.bwd_extra)
                               for s in o.bwd_steps]
            if not reshard_after_forward:
                o = dataclasses.replace(o, phantom=o.phantom + x.full_params - x.shard_params)
            opts.append(o)
        lay.options = opts
        new_layers.append(lay)
    g.layers = new_layers
    return g
