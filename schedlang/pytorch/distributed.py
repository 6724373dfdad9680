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

**FSDP2** (`fully_shard`, torchtitan's order: each block, then the root; `FSDP_ORDER`).
`fit` on a sharded model (`prepare_sharded`) profiles an unsharded copy with the hook front
end, checks the units against the blocks (`fsdp_model`), adds to each layer of the graph data
what FSDP2 holds on a rank around it (`fsdp_layer_memory`, `with_fsdp_memory`: unsharded
parameters and all-gather buffers in the forward, again in the backward with the gradients and
the reduce-scatter buffers; the comment above `FSDP_ORDER` says what and when), counts the
shards (and the root's unsharded parameters) as resident, and wraps the sharded blocks: a
recomputation runs inside the block's backward, under its pre-backward all-gather.
`shard_blocks` (``fit(..., fsdp=True)``) shards a model in that order.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from dataclasses import dataclass

from ..graphs.graph import Graph
from ..language.errors import SchedError
from ..plans.plan import Plan
from ..plans.planners.no_recompute import no_recompute_plan
from ..plans.simulate import simulate
from .frontends.blocks.find import find_blocks
from .frontends.blocks.hooked import BlockMixin
from .inputs import split_inputs
from .model_state import preserved
from .outputs import loss_moment
from .prepare import prepare

__all__ = ["active", "agree_graph", "agree_plan", "solves_here", "graph_digest", "plan_digest",
           "DistributedPlanError",
           "FSDPLayer", "fsdp_layer_memory", "param_bytes_of", "with_fsdp_memory", "FSDP_ORDER",
           "FSDPModel", "FSDPUnit", "fsdp_model", "fsdp_storages", "is_fsdp", "unsharded_copy",
           "prepare_sharded", "shard_blocks",
           "check_not_sharded_after"]


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
    # the graph data only: its trace info holds rank 0's profiled model and samples, which
    # every other rank would unpickle and keep (a copy of the model on its device); each rank
    # keeps its own
    info = getattr(graph, "trace_info", None)
    sent = copy.copy(graph)
    sent.trace_info = None
    box = [(sent, plain_time)]
    _dist().broadcast_object_list(box, src=_global_rank(group, 0), group=group)
    agreed, time = box[0]
    agreed.trace_info = info
    return agreed, time


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
# What FSDP2 (torch 2.13, `torch.distributed.fsdp.fully_shard`) allocates on a rank, read off
# its code and checked against the CPU tracker (tests/pytorch/test_distributed.py). For a unit U (a
# module given to `fully_shard`) with unsharded parameters of F bytes (dim 0 padded to a
# multiple of the world size: F = world x the padded shard) and a shard of S = F / world:
# * forward: U's pre-forward hook all-gathers into a flat buffer of F bytes and copies it out
#   into the unsharded parameters (F more). The flat buffer is kept until the next unit's
#   copy-out (overlap of copy-out and the next all-gather), the previous unit's buffer is freed
#   just before U's copy-out: U's forward holds F + max(F_prev, F) beyond the shards, and the
#   code run between two units holds the previous unit's buffer. The post-forward hook frees
#   the unsharded parameters (``reshard_after_forward=True``); the root's post-forward frees the
#   last buffer. The root is never resharded after the forward: its unsharded parameters live
#   from its pre-forward to the end of the backward.
# * backward: U's pre-backward hook all-gathers again (buffer freed right after the copy-out);
#   the backward -- and a recomputation inside it, which runs the block's forward without its
#   hooks, under these parameters -- produces F bytes of unsharded gradients; the post-backward
#   hook frees the parameters, copies the gradients into a reduce-scatter input of F bytes and
#   reduce-scatters into the S-byte gradient shard. That input is kept until the next unit's
#   post-backward (one buffer in flight, `set_reduce_scatter_max_input_buffers(1)`): U's
#   backward holds 2F + F_ret (F_ret: the input of the unit whose backward ran before), and
#   the code between two units holds the last input.
FSDP_ORDER = ("fully_shard on each block that fit finds (e.g. every model.layers[i]), then on "
              "the root, then fit(model, ...)")


@dataclass
class FSDPLayer:
    """What FSDP2 adds on one rank to one layer of the layered graph data (bytes; see the
    comment above). `full_params`/`shard_params`: the layer's unit (0 when the layer is not a
    unit of its own: glue, or layers whose parameters the root holds); `fwd_extra`,
    `bwd_extra`: what the layer's forward and backward overheads grow by; `phantom_extra`:
    what stays from its forward to its backward (the unsharded parameters of a unit with
    ``reshard_after_forward=False``)."""

    layer: str
    full_params: int
    shard_params: int
    fwd_extra: int
    bwd_extra: int
    phantom_extra: int = 0

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def _shard(nbytes: int, world: int) -> int:
    # fully_shard pads dim 0 to a multiple of the world size: ceil per rank
    return -(-int(nbytes) // world)


def param_bytes_of(graph: Graph) -> dict[str, int]:
    """Each layer's parameter bytes, read off the graph data: the size of its datum
    ``<layer>.params.grad`` (what the front ends write: the gradients of the layer's
    parameters, the size of the parameters)."""
    sizes = {d.name: d.size for d in graph.data}
    return {lay.name: int(sizes.get(f"{lay.name}.params.grad", 0)) for lay in graph.layers}


def fsdp_layer_memory(graph: Graph, world: int, param_bytes: dict[str, int] | None = None,
                      reshard_after_forward=True, root_bytes: int = 0) -> list[FSDPLayer]:
    """Per layer of `graph` (forward order), what FSDP2 on `world` ranks adds on one rank.

    `param_bytes`: layer -> the unsharded bytes of the unit that layer is (a layer absent or
    at 0 is not a unit); default: every layer with parameters is a unit (`param_bytes_of`).
    `reshard_after_forward`: a bool for every unit, or a dict layer -> bool. `root_bytes`: the
    root unit's unsharded parameters (all-gathered first; its flat buffer lives until the first
    unit's copy-out). The root's unsharded parameters themselves live the whole step: the
    caller counts them as resident (`FSDPModel.resident_bytes`)."""
    if world < 1:
        raise ValueError("world size must be at least 1")
    if param_bytes is None:
        param_bytes = param_bytes_of(graph)
    out = []
    prev = int(root_bytes)  # the flat all-gather buffer alive when the layer starts
    for lay in graph.layers:
        full = int(param_bytes.get(lay.name, 0))
        if full:
            reshard = reshard_after_forward.get(lay.name, True) \
                if isinstance(reshard_after_forward, dict) else bool(reshard_after_forward)
            out.append(FSDPLayer(lay.name, full, _shard(full, world), full + max(prev, full), 0,
                                 0 if reshard else full))
            prev = full
        else:
            out.append(FSDPLayer(lay.name, 0, 0, prev, 0))
    ret = 0  # the reduce-scatter input kept from the last post-backward
    for x in reversed(out):
        if x.full_params:
            # all-gather again (unless kept: then it is the phantom), gradients, kept input
            x.bwd_extra = (x.full_params if not x.phantom_extra else 0) + x.full_params + ret
            ret = x.full_params
        else:
            x.bwd_extra = ret
    return out


def with_fsdp_memory(graph: Graph, layers: list[FSDPLayer]) -> Graph:
    """A copy of `graph` whose options carry what FSDP2 adds (`fsdp_layer_memory`): forward
    and backward overheads (and sub-step profiles) grow by `fwd_extra`/`bwd_extra`, phantoms
    by `phantom_extra` (memory no plan can drop). A recomputing option's backward runs the
    forward inside the backward, under the same all-gather: it adds nothing more. The gradient
    datum of each unit's parameters (``<layer>.params.grad``, alive to the end of the step)
    becomes the shard the reduce-scatter leaves (the full gradients are in `bwd_extra`)."""
    by_name = {x.layer: x for x in layers}
    g = copy.copy(graph)
    shards = {f"{x.layer}.params.grad": x.shard_params for x in layers if x.full_params}
    g.data = [dataclasses.replace(d, size=min(d.size, shards[d.name])) if d.name in shards
              else d for d in graph.data]
    new_layers = []
    for lay in graph.layers:
        x = by_name.get(lay.name)
        if x is None or not (x.fwd_extra or x.bwd_extra or x.phantom_extra):
            new_layers.append(lay)
            continue
        lay = copy.copy(lay)
        opts = []
        for o in lay.options:
            o = dataclasses.replace(o, fwd_overhead=o.fwd_overhead + x.fwd_extra,
                                    bwd_overhead=o.bwd_overhead + x.bwd_extra,
                                    phantom=o.phantom + x.phantom_extra)
            if o.fwd_steps:
                o.fwd_steps = [dataclasses.replace(s, overhead=s.overhead + x.fwd_extra)
                               for s in o.fwd_steps]
            if o.bwd_steps:
                o.bwd_steps = [dataclasses.replace(s, overhead=s.overhead + x.bwd_extra)
                               for s in o.bwd_steps]
            opts.append(o)
        lay.options = opts
        new_layers.append(lay)
    g.layers = new_layers
    return g


# --- a live fully_shard-ed model ------------------------------------------------------------------
def _fsdp_module_type():
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without FSDP2
        return None
    return FSDPModule


def is_fsdp(model) -> bool:
    """Whether `model` or one of its submodules was given to `fully_shard`."""
    cls = _fsdp_module_type()
    return cls is not None and any(isinstance(m, cls) for m in model.modules())


@dataclass
class FSDPUnit:
    name: str  # qualified module name ("" for the root)
    full: int  # unsharded parameter bytes (padded: world x shard)
    shard: int  # this rank's shard bytes (padded)
    reshard_after_forward: bool


@dataclass
class FSDPModel:
    """The FSDP2 units of a model (`fsdp_model`)."""

    world: int
    root: FSDPUnit
    units: list[FSDPUnit]  # the others, in module order
    other_bytes: int  # parameters no unit manages and buffers (plain tensors, whole)

    @property
    def resident_bytes(self) -> int:
        """What a rank holds for the whole step: every shard, the root's unsharded
        parameters (the root is not resharded after the forward), the rest whole."""
        return sum(u.shard for u in self.units) + self.root.shard + self.root.full \
            + self.other_bytes

    def layer_memory(self, graph: Graph) -> list[FSDPLayer]:
        units = {u.name: u for u in self.units}
        return fsdp_layer_memory(graph, self.world, {n: u.full for n, u in units.items()},
                                 {n: u.reshard_after_forward for n, u in units.items()},
                                 root_bytes=self.root.full)


def _local_bytes(p) -> int:
    from torch.distributed.tensor import DTensor

    t = p.to_local() if isinstance(p, DTensor) else p
    return int(t.untyped_storage().nbytes())


def check_not_sharded_after(model) -> None:
    """Raise `DistributedPlanError` when `model` (fitted unsharded) was given to `fully_shard`
    after `fit`: its plan counts whole parameters and none of FSDP2's buffers."""
    cls = _fsdp_module_type()
    if cls is not None and isinstance(model, cls):
        raise DistributedPlanError(
            "the model was fully_shard-ed after fit: its plan was made for the unsharded model "
            f"(whole parameters, none of FSDP2's buffers). Shard first: {FSDP_ORDER}; or "
            "fit(model, ..., fsdp=True)")


def fsdp_model(model, blocks: list[str]) -> FSDPModel:
    """The units of a `fully_shard`-ed `model`, checked against the wrapping order `fit`
    plans (`FSDP_ORDER`): the root is a unit, and every other unit is one of `blocks` (the
    layers the hook front end found). Raises `DistributedPlanError` naming the first unit out
    of that order."""
    from torch.distributed.tensor import DTensor

    fsdp_cls = _fsdp_module_type()
    unit_mods = [(n, m) for n, m in model.named_modules() if isinstance(m, fsdp_cls)]
    if not isinstance(model, fsdp_cls):
        inner = unit_mods[0][0] if unit_mods else "?"
        raise DistributedPlanError(
            f"'{inner}' is fully_shard-ed but the root module is not: fit plans {FSDP_ORDER}")
    allowed = set(blocks)
    by_state: dict[int, list[str]] = {}
    for n, m in unit_mods:
        by_state.setdefault(id(_state_of(m)), []).append(n or "<root>")
    for names_ in by_state.values():
        if len(names_) > 1:
            raise DistributedPlanError(
                f"one fully_shard call holds {', '.join(names_)}: fit plans one unit per "
                f"block ({FSDP_ORDER})")
    for n, _ in unit_mods:
        if n and n not in allowed:
            raise DistributedPlanError(
                f"fully_shard on '{n}', which is not one of the blocks fit found "
                f"({blocks[0]} ... {blocks[-1]}): fit plans {FSDP_ORDER}; or pass "
                "layers=[...] naming the sharded modules")
    unit_names = {n for n, _ in unit_mods}

    def owner(pname: str) -> str | None:
        parts = pname.split(".")[:-1]
        for i in range(len(parts), -1, -1):
            q = ".".join(parts[:i])
            if q in unit_names:
                return q
        return None

    state = {n: _unit_reshard(m) for n, m in unit_mods}
    world = 1
    full = dict.fromkeys(unit_names, 0)
    shard = dict.fromkeys(unit_names, 0)
    other = 0
    seen = set()
    for pname, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        u = owner(pname)
        if u is None or not isinstance(p, DTensor):
            other += _local_bytes(p)
            continue
        world = max(world, p.device_mesh.size())
        s = _local_bytes(p)
        shard[u] += s
        full[u] += s * p.device_mesh.size()
    other += sum(int(b.untyped_storage().nbytes()) for b in model.buffers())
    units = [FSDPUnit(n, full[n], shard[n], state[n]) for n, _ in unit_mods if n]
    return FSDPModel(world, FSDPUnit("", full[""], shard[""], False), units, other)


def _state_of(module):
    try:
        return module._get_fsdp_state()
    except AttributeError:
        return module


def _unit_reshard(module) -> bool:
    """Whether a unit reshards after its forward (FSDP2 keeps this on its parameter
    groups; the root never does, see the comment above)."""
    try:
        groups = module._get_fsdp_state()._fsdp_param_groups
    except AttributeError:
        return True
    return all(g.post_forward_mesh_info is not None for g in groups) if groups else True


def unsharded_copy(model):
    """A plain (not sharded) copy of a `fully_shard`-ed `model`, for profiling without
    collectives: the same classes without FSDP's, FSDP's hooks dropped, each parameter
    all-gathered (`DTensor.full_tensor`: a collective, every rank calls this in the same
    order), buffers shared. The copy's blocks have the qualified names of the original's."""
    import torch
    from torch import nn
    from torch.distributed.tensor import DTensor

    fsdp_cls = _fsdp_module_type()

    def plain_class(cls):
        for c in cls.__mro__:
            if not issubclass(c, (fsdp_cls, BlockMixin)):
                return c
        return cls

    def not_fsdp_hook(h) -> bool:  # FSDP's hooks: its state's methods, or its closures
        for obj in (h, getattr(h, "__self__", None), getattr(h, "func", None)):
            if obj is not None and "torch.distributed.fsdp" in (
                    getattr(obj, "__module__", None) or type(obj).__module__):
                return False
        return True

    def cp(m):
        new = object.__new__(plain_class(type(m)))
        new.__dict__.update(m.__dict__)
        new.__dict__.pop("_schedlang_choice", None)
        for attr in ("_forward_pre_hooks", "_forward_hooks"):
            hooks = getattr(m, attr)
            setattr(new, attr, type(hooks)((k, h) for k, h in hooks.items() if not_fsdp_hook(h)))
        params = {}
        for k, p in m._parameters.items():
            if isinstance(p, DTensor):
                with torch.no_grad():
                    p = nn.Parameter(p.full_tensor().detach().clone(),
                                     requires_grad=p.requires_grad)
            params[k] = p
        new._parameters = type(m._parameters)(params)
        new._buffers = type(m._buffers)(m._buffers)
        new._modules = type(m._modules)((k, None if c is None else cp(c))
                                        for k, c in m._modules.items())
        return new

    return cp(model)


def fsdp_storages(model) -> list:
    """The tensors FSDP2 keeps across steps whose storages it frees and allocates again
    (the unsharded parameters: `FSDPParam.all_gather_outputs`): the CPU tracker watches them
    (`MemoryTracker(watch=...)`), since an allocation by resizing a storage is no op its
    dispatch mode sees. Read off FSDP2's internals; empty when they are not there."""
    out = []
    fsdp_cls = _fsdp_module_type()
    for m in model.modules():
        if not isinstance(m, fsdp_cls):
            continue
        try:
            groups = m._get_fsdp_state()._fsdp_param_groups
        except AttributeError:
            continue
        for g in groups:
            for fp in g.fsdp_params:
                out += [t for t in getattr(fp, "all_gather_outputs", []) or []
                        if t is not None]
    return out


def prepare_sharded(model, args: tuple, kwargs: dict, layers=None, loss_fn=None,
                    frontend: str = "auto", outputs_held: bool = True, **trace_kwargs):
    """`fit.prepare` for a `fully_shard`-ed `model` (`FSDP_ORDER`): the hook front end
    profiles an unsharded copy (`unsharded_copy`: no collectives while profiling), the units
    are checked against the blocks found (`fsdp_model`), the graph data get what FSDP2 adds
    (`FSDPModel.layer_memory`, `with_fsdp_memory`), the resident bytes become the rank's
    (`FSDPModel.resident_bytes`), and the found blocks are those of `model` (the wrappers go on
    the sharded blocks, inside FSDP's hooks). Every rank calls this (it all-gathers)."""

    if frontend == "fx":
        raise DistributedPlanError(
            "frontend 'fx' cannot run a fully_shard-ed model (its plan executor calls the "
            "layers outside FSDP's hooks): use frontend='blocks' (or 'auto')")
    plain = unsharded_copy(model)
    # the automatic block choice splits no unit (a Sequential unit stays one block)
    units = [n for n, m in model.named_modules() if n and isinstance(m, _fsdp_module_type())]
    prep = prepare(plain, args, layers=layers, loss_fn=loss_fn, frontend="blocks",
                   sample_kwargs=kwargs, whole=units, outputs_held=outputs_held,
                   **trace_kwargs)
    found = prep.partitioned.found
    info = fsdp_model(model, [b.name for b in found.blocks])
    rows = info.layer_memory(prep.graph)
    graph = with_fsdp_memory(prep.graph, rows)
    mods = dict(model.named_modules())
    blocks = [dataclasses.replace(b, module=mods[b.name], parent=mods[b.name.rpartition(".")[0]])
              for b in found.blocks]
    tr = dataclasses.replace(prep.partitioned, found=dataclasses.replace(
        found, model=model, blocks=blocks), profiled=None)  # the copy is dropped
    plain_bytes = sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                       for t in list(plain.parameters()) + list(plain.buffers())}.values())
    resident = prep.resident_bytes - plain_bytes + info.resident_bytes
    base = no_recompute_plan(graph)
    sim = simulate(base, graph)
    peak = max(sim.peak_bytes, loss_moment(base, graph) + prep.loss_overhead)
    return dataclasses.replace(prep, partitioned=tr, graph=graph, resident_bytes=resident,
                               plain_peak=peak + resident, info=None,
                               fsdp={"world": info.world, "layers": [x.to_json() for x in rows],
                                     "resident": info.resident_bytes,
                                     "root_full": info.root.full})


def shard_blocks(model, sample_inputs, layers=None, sample_kwargs=None, **fully_shard_kwargs):
    """`model` sharded in the order `fit` plans (`FSDP_ORDER`): `fully_shard` on each block
    the hook front end finds on the samples (`find_blocks`, one run whose effects are undone),
    then on the root; `fully_shard_kwargs` go to every call (e.g. ``mesh=``,
    ``reshard_after_forward=``). What ``fit(..., fsdp=True)`` does first. Returns `model`."""
    from torch.distributed.fsdp import fully_shard

    args, kwargs = split_inputs(sample_inputs, sample_kwargs)
    with preserved(model):
        found = find_blocks(model, args, kwargs, layers)
    for b in found.blocks:
        fully_shard(b.module, **fully_shard_kwargs)
    fully_shard(model, **fully_shard_kwargs)
    return model
