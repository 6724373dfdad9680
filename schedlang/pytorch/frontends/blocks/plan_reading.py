"""How the wrappers read a plan (`plan_choices`: the option each block runs, or its
checkpointed group), which blocks may group (`block_chains`), and what the simulator misses of
how the wrappers run a plan: the time of a group's reruns (`rerun_correction`) and the memory
of its last block under torch's early stop (`early_stops`). `Frontend.time_correction` and
`Frontend.priced_graph` of the hook front end are these two."""
from __future__ import annotations

import dataclasses
import itertools

from ....graphs.graph import Graph
from ....graphs.hgraph import FAST_FORWARD
from ....plans.interpreter import PlanInterpreter
from ....plans.plan import Op, Plan
from .find import WHERE, BlockError
from .offload import OFFLOAD
from .rerun import RERUN

__all__ = ["GROUP", "block_chains", "plan_choices", "rerun_correction", "early_stops"]

#: the choice of a block in a checkpointed group: GROUP + the members' names, joined by "|"
GROUP = "group:"


def block_chains(graph: Graph, blocks: list[str]) -> list[list[str]]:
    """Runs of consecutive blocks that one checkpoint can hold as a group (`groups.Group`): each
    pair of neighbours chained in the graph data (`hgraph.chained_layers`, the set `chained`
    that models/extensions/block_groups.sched groups along: adjacent layers, the glue between
    them running no op, each block's outputs read by the next block alone, not returned)."""
    linked = set(graph.hgraph().chained)
    is_block = set(blocks)
    chains: list[list[str]] = []
    prev = None
    for lay in graph.layers:
        if lay.name not in is_block:
            prev = None
            continue
        if (prev, lay.name) in linked:
            chains[-1].append(lay.name)
        else:
            chains.append([lay.name])
        prev = lay.name
    return chains


def _rerun_priced(options: dict):
    """The option whose measured backward prices a group member's rerun: ``rerun`` where the
    block has it (a group of such blocks runs that way: `groups.Group`), else ``recompute``
    (torch's checkpoint); as `models/extensions/block_groups.sched` prices it."""
    return options.get(RERUN) or options.get("recompute")


def rerun_correction(plan: Plan, graph: Graph) -> float:
    """Seconds to add to the simulator's time of a group plan: it prices a block's forward run
    again in the backward as the block's first ``autograd`` forward, but that rerun is what
    a ``rerun`` block (else a ``recompute`` block) runs inside its backward, which the
    profile measured apart (that backward's time over autograd's: `_rerun_priced`). They
    differ on the CPU, where a first forward writes fresh memory (bench/README.md). Priced
    so, a group of one block costs what that option costs; and a rerun never less than the
    forward it runs again (so a group plan never predicts a negative overhead)."""
    layers = {lay.name: lay for lay in graph.layers}
    extra, backward = 0.0, False
    for op in plan.ops:
        if op.op != "compute" or not op.node:
            continue
        layer, _, side = op.node.rpartition(".")
        backward = backward or op.node == "loss"
        if backward and side == "fwd" and op.option == "autograd" and layer in layers:
            opts = {o.name: o for o in layers[layer].options}
            auto, rec = opts.get("autograd"), _rerun_priced(opts)
            if auto is not None and rec is not None:
                extra += max(auto.fwd_time, rec.bwd_time - auto.bwd_time) - auto.fwd_time
    return extra


def early_stops(plan: Plan, graph: Graph) -> Graph:
    """`graph` as `plan`'s checkpointed groups run on it. torch's checkpoint stops
    recomputing once every tensor the backward saved is back (its early stop), so a group's
    last block holds less in its backward than its option ``autograd``, which a group's
    rerun is priced with, measured alone: what its option ``rerun`` (the group's way around
    the block alone; else ``recompute``, the same checkpoint) measured. That
    block's ``autograd`` backward overhead is lowered
    by the difference (never below nothing). Without it the plan of checkpoint_sequential(2)
    on ViT was predicted 256 B over its own measured peak, and `fit` at that peak took a plan
    5% slower; T5's blocks differ by 96-288 KB. `graph` itself where nothing changes."""
    reading = _PlanReading()
    try:
        reading.run(plan.ops)
    except BlockError:  # not a plan the wrappers run: priced as it is
        return graph
    layers = {lay.name: lay for lay in graph.layers}
    savings = {}
    for run in reading.reruns:
        last = layers.get(run[-1])
        opts = {} if last is None else {o.name: o for o in last.options}
        auto, rec = opts.get("autograd"), _rerun_priced(opts)
        if auto is not None and rec is not None:
            saving = min(auto.phantom + auto.bwd_overhead - rec.bwd_overhead, auto.bwd_overhead)
            if saving > 0:
                savings[last.name] = saving
    if not savings:
        return graph

    def lowered() -> Graph:
        out = []
        for lay in graph.layers:
            if lay.name in savings:
                lay = dataclasses.replace(lay, options=[
                    dataclasses.replace(o, bwd_overhead=o.bwd_overhead - savings[lay.name])
                    if o.name == "autograd" else o for o in lay.options])
            out.append(lay)
        return dataclasses.replace(graph, layers=out)

    key = (id(graph), tuple(sorted(savings.items())))
    hit = _LOWERED.get(key)
    if hit is None or hit[0] is not graph:
        hit = _LOWERED[key] = (graph, lowered())
        while len(_LOWERED) > LOWERED_KEPT:
            _LOWERED.pop(next(iter(_LOWERED)))
    return hit[1]


#: the last graphs `early_stops` made, by (graph, savings): a family's plans share their
#: groups' last blocks (GPT-2 and ViT: about 100 distinct sets in 1,000 plans), and each made
#: graph builds its own index when simulated; bounded, as each holds a copy of that index
LOWERED_KEPT = 32
_LOWERED: dict = {}


class _PlanReading(PlanInterpreter):
    """What a plan asks of each block (`plan_choices`): the options of its forwards and
    backwards, and the runs of forwards run again after the loss (checkpointed groups). The
    walk is `PlanInterpreter`'s; a transfer op is an error (the wrappers cannot time a copy
    inside the model's forward)."""

    def __init__(self):
        self.fwd: dict[str, list[str]] = {}
        self.bwd: dict[str, list[str]] = {}
        self.reruns: list[list[str]] = []  # the runs of forwards run again after the loss
        self.pending: list[str] = []  # the current run
        self.backward = False

    def on_compute(self, op: Op) -> None:
        if op.node == "loss":
            self.backward = True
            return
        if not op.node:
            return
        layer, _, side = op.node.rpartition(".")
        (self.fwd if side == "fwd" else self.bwd).setdefault(layer, []).append(
            op.option or "autograd")
        if self.backward and side == "fwd" and len(self.fwd[layer]) > 1:  # run again
            self.pending.append(layer)
        elif self.pending:
            if layer != self.pending[-1]:
                raise BlockError(f"the plan runs layers {self.pending} forward again in the "
                                 f"backward, then '{op.node}': a checkpointed group's "
                                 "last block's backward comes right after them", WHERE)
            self.reruns.append(self.pending)
            self.pending = []

    def _transfer(self, op: Op) -> None:
        what = f"datum '{op.data}'" if op.data else (
            f"the phantom of '{op.layer}'" if op.layer else f"channel {op.channel}")
        raise BlockError(f"the plan has a transfer ({op.op} {what}): per-block wrappers "
                         "cannot time a copy inside the model's forward; a block keeps "
                         "what it saves in host memory with its option 'offload' "
                         "(fit(..., bandwidth=...)), and the fx front end runs transfer "
                         "ops", WHERE)

    on_offload = on_prefetch = on_wait = _transfer


def plan_choices(plan: Plan, graph: Graph, blocks: list[str]) -> dict[str, str]:
    """block -> the option its forward runs with in `plan` (a per-block plan: each forward
    once, the same option as its backward; the option ``offload``, `block_offload`, runs as
    ``autograd+offload``); a block of a checkpointed group (forward ``fast_forward``, again
    ``autograd`` with the group's other blocks right before the last one's backward,
    `plan_checkpoint_groups`): `GROUP` + the group's blocks. A transfer op is an error."""
    reading = _PlanReading()
    reading.run(plan.ops)
    fwd, bwd, reruns, pending = reading.fwd, reading.bwd, reading.reruns, reading.pending
    next_block = {a: b for chain in block_chains(graph, blocks)
                  for a, b in itertools.pairwise(chain)}
    grouped: dict[str, str] = {}
    for members in reruns + ([pending] if pending else []):
        if any(next_block.get(a) != b for a, b in itertools.pairwise(members)) \
                or any(m not in blocks for m in members):
            raise BlockError(f"the plan runs {members} forward again in the backward: only "
                             "consecutive blocks, each feeding the next alone, run as a "
                             "checkpointed group", WHERE)
        for m in members:
            if fwd.get(m) != [FAST_FORWARD, "autograd"] or bwd.get(m) != ["autograd"]:
                raise BlockError(f"the plan runs block '{m}' forward {fwd.get(m)} and backward "
                                 f"{bwd.get(m)}: a checkpointed group's block runs fast_forward, "
                                 "then autograd and its backward", WHERE)
            grouped[m] = GROUP + "|".join(members)
    out = {}
    for layer in [lay.name for lay in graph.layers]:
        if layer in grouped:
            out[layer] = grouped[layer]
            continue
        f, b = fwd.get(layer, []), bwd.get(layer, [])
        if len(f) != 1 or (b and b != f):
            raise BlockError(f"the plan runs layer '{layer}' forward {f} and backward {b}: "
                             "per-block wrappers run each forward once, with its backward's "
                             "option (or as part of a checkpointed group)", WHERE)
        if layer in blocks:
            out[layer] = "autograd+offload" if f[0] == OFFLOAD else f[0]
        elif f[0] != "autograd":
            raise BlockError(f"the plan runs glue '{layer}' with '{f[0]}': glue runs as the "
                             "model's own code", WHERE)
    return out
