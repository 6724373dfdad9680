"""What the baseline planners share: the graph views they plan on (`CheckmateView`: Checkmate,
`LayeredView`: layered), the op sequences of a checkpointing strategy on each view, a plan's
replay against the budgets, and the choice among candidate plans."""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import networkx as nx

from ...graphs.graph import Graph
from ...graphs.hgraph import FAST_FORWARD, bwd_name, fwd_name, has_backward
from ...language.errors import DataError
from ..plan import Op, Plan
from ..simulate import NO_LIMIT, simulate
from . import PlannerNotApplicable


# --- replay helper ------------------------------------------------------------------------------
@dataclass
class Replay:
    """A candidate plan with its simulated peak/time and whether it fits the budgets."""

    plan: Plan
    valid: bool
    peak: int
    time: float
    fits: bool
    errors: list[str] = field(default_factory=list)



def replay(plan: Plan, graph: Graph, budget: int | None,
           save_budget: int | None = None) -> Replay:
    """Simulate `plan` for its structure (no budget) and compare its peaks with the budgets."""
    sim = simulate(plan, graph, budget=NO_LIMIT, save_budget=NO_LIMIT)
    fits = sim.valid and (budget is None or sim.peak_bytes <= budget)
    if fits and save_budget is not None and sim.save_peak_bytes is not None:
        fits = sim.save_peak_bytes <= save_budget
    plan.predicted_peak = sim.peak_bytes
    plan.predicted_time = sim.time
    return Replay(plan, sim.valid, sim.peak_bytes, sim.time, fits, sim.errors)



def pick_best(candidates: list[Replay], prefer_low_peak: bool = False) -> Replay:
    """The fastest candidate that fits (ties: lower peak), else the lowest peak (ties: faster).

    `prefer_low_peak`: among fitting ones, the lowest peak instead (no budget, memory aim).
    """
    ok = [c for c in candidates if c.valid]
    if not ok:  # cannot happen for a consistent graph; surface the first one to the caller
        return candidates[0]
    fitting = [c for c in ok if c.fits]
    if fitting:
        if prefer_low_peak:
            return min(fitting, key=lambda c: (c.peak, c.time))
        return min(fitting, key=lambda c: (c.time, c.peak))
    return min(ok, key=lambda c: (c.peak, c.time))



def graph_save_budget(graph: Graph) -> int | None:
    return graph.budgets.get("save")



# --- the Checkmate view -------------------------------------------------------------------------
class CheckmateView:
    """Indexed Checkmate view: nodes in order, predecessor lists, read positions."""

    def __init__(self, graph: Graph):
        self.graph = graph
        if not graph.nodes:
            raise DataError(f"graph '{graph.name}' has no compute nodes", graph.loc)
        idx = graph.checkmate_index(topological=True)
        n = idx.n
        self.names = idx.names
        self.n = n
        self.kind = idx.kind
        self.size = idx.size
        self.time = idx.time
        self.preds = idx.preds
        self.succs = idx.succs
        self.fwd = [i for i in range(n) if self.kind[i] == "forward"]
        self.first_bwd = next((i for i in range(n) if self.kind[i] == "backward"), n)
        self.sources = {i for i in self.fwd if not self.preds[i]}

    # units for the chain-based planners: forward nodes in order, without the graph inputs
    def units(self) -> list[int]:
        return [i for i in self.fwd if i not in self.sources]

    def unit_size(self, u: int) -> int:
        return self.size[u]

    def articulation_units(self) -> list[int]:
        g = nx.Graph()
        fwd = set(self.fwd)
        g.add_nodes_from(self.fwd)
        for i in self.fwd:
            g.add_edges_from((i, j) for j in self.succs[i] if j in fwd)
        aps = set(nx.articulation_points(g))
        return [u for u in self.units() if u in aps]



def checkmate_sequence(cv: CheckmateView, keep: set[int], strict: bool) -> list[int]:
    """Pass 1: the compute sequence (node indices) for keep set `keep`."""
    n, preds, succs = cv.n, cv.preds, cv.succs
    fb = cv.first_bwd
    kept = [i in keep or cv.kind[i] != "forward" or i in cv.sources for i in range(n)]
    live = [False] * n
    pending = [0] * n
    seq: list[int] = []

    def maybe_free(d: int, s: int) -> None:
        if kept[d] or not live[d] or pending[d] > 0:
            return
        reads = succs[d]
        if s < fb:  # forward pass: until the last read by a forward stage or the first backward
            k = bisect.bisect_right(reads, s)
            if k < len(reads) and reads[k] <= fb:
                return
        elif not strict:  # backward pass, segment retention: until the last later read
            if reads and reads[-1] > s:
                return
        live[d] = False

    for s in range(n):
        # the data this stage needs that are gone, and their missing ancestors, in order
        todo: list[int] = []
        seen: set[int] = set()
        stack = [(p, False) for p in reversed(preds[s])]
        while stack:
            x, expanded = stack.pop()
            if expanded:
                todo.append(x)
                continue
            if live[x] or x in seen:
                continue
            seen.add(x)
            stack.append((x, True))
            stack.extend((p, False) for p in reversed(preds[x]) if not live[p] and p not in seen)
        todo.append(s)
        for x in todo:
            for p in preds[x]:
                pending[p] += 1
        for x in todo:
            seq.append(x)
            live[x] = True
            for p in preds[x]:
                pending[p] -= 1
            for p in preds[x]:
                maybe_free(p, s)
            maybe_free(x, s)
    return seq



def checkmate_plan(cv: CheckmateView, keep: set[int], strict: bool = False, name: str = "") -> Plan:
    """Pass 2: the plan of the compute sequence, each output deleted right after its last read."""
    seq = checkmate_sequence(cv, keep, strict)
    preds = cv.preds
    after: list[list[int]] = [[] for _ in seq]
    live: set[int] = set()
    for k in range(len(seq) - 1, -1, -1):
        x = seq[k]
        dead = [d for d in (*preds[x], x) if d not in live]
        after[k] = sorted(set(dead))
        live.discard(x)
        live.update(preds[x])
    ops: list[Op] = []
    names = cv.names
    for k, x in enumerate(seq):
        ops.append(Op("compute", node=names[x]))
        ops.extend(Op("delete", data=names[d]) for d in after[k])
    return Plan(graph=cv.graph.name, ops=ops, meta={"planner": name} if name else {})



# --- the layered view ---------------------------------------------------------------------------
class LayeredView:
    """Indexed layered view: layers, their data, options, and the stage order."""

    def __init__(self, graph: Graph):
        self.graph = graph
        graph.hgraph()  # validates the layered data (DataError)
        frozen = [layer.name for layer in graph.layers if not has_backward(layer)]
        if frozen:
            raise PlannerNotApplicable(f"layer '{frozen[0]}' has no backward (its only option is "
                                       "fast_forward): this planner needs a backward per layer "
                                       "(mutwo and the solvers handle such layers)", graph.loc)
        self.layers = graph.layers
        self.loss = graph.layered_loss()
        L = len(self.layers)
        self.L = L
        self.size = {d.name: int(d.size) for d in graph.data}
        self.role = {d.name: d.role for d in graph.data}
        creators: dict[str, list[int]] = {}
        for j, layer in enumerate(self.layers):
            for d in layer.outputs:
                creators.setdefault(d, []).append(j)
        # an activation: created by exactly one forward, not an input/output; recomputable
        self.creator = {d: js[0] for d, js in creators.items()
                        if len(js) == 1 and self.role.get(d, "") == ""}
        # stages: 0..L-1 forwards, L the loss, L+1.. the backwards in reverse order
        self.loss_stage = L
        self.first_bwd = L + 1
        self.bwd_stage = {j: L + 1 + (L - 1 - j) for j in range(L)}
        self.opt = [{o.name: o for o in layer.options} for layer in self.layers]

    def fwd_ff_time(self, j: int) -> float:
        return min(o.fwd_time for o in self.layers[j].options)

    def units(self) -> list[int]:
        return list(range(self.L))

    def unit_size(self, j: int) -> int:
        layer = self.layers[j]
        return sum(self.size.get(d, 0) for d in layer.outputs) + int(layer.options[0].phantom)

    def articulation_units(self) -> list[int]:
        """Layers whose outputs are all cut points of the undirected forward data/layer graph."""
        g = nx.Graph()
        for j, layer in enumerate(self.layers):
            g.add_node(("L", j))
            g.add_edges_from((("L", j), ("D", d)) for d in (*layer.inputs, *layer.outputs))
        aps = set(nx.articulation_points(g))
        return [j for j, layer in enumerate(self.layers)
                if layer.outputs and all(("D", d) in aps for d in layer.outputs)]



@dataclass
class Step:
    node: str
    option: str | None
    reads: tuple[str, ...]
    creates: tuple[str, ...]



def stage_reads_of(lv: LayeredView, strategy: list[tuple[str, str]]) -> dict[str, list[int]]:
    """The stages that read each datum, in order: a layer's forward reads its inputs, the
    loss stage the loss's, a backward its gradient inputs and what its option needs."""
    stage_reads: dict[str, list[int]] = {}
    for j, layer in enumerate(lv.layers):
        for d in layer.inputs:
            stage_reads.setdefault(d, []).append(j)
    for d in lv.loss.inputs:
        stage_reads.setdefault(d, []).append(lv.loss_stage)
    for j, layer in enumerate(lv.layers):
        o = lv.opt[j][strategy[j][1]]
        for d in (*layer.grad_inputs, *o.needs):
            stage_reads.setdefault(d, []).append(lv.bwd_stage[j])
    for reads in stage_reads.values():
        reads.sort()
    return stage_reads



def layered_sequence(lv: LayeredView, strategy: list[tuple[str, str]], keep_data: set[str],
                      strict: bool) -> list[Step]:
    """Pass 1: the compute steps for per-layer strategies ("keep"|"drop", option) and kept data."""
    layers, L = lv.layers, lv.L
    loss = lv.loss
    fb = lv.first_bwd
    stage_reads = stage_reads_of(lv, strategy)
    live: set[str] = {d.name for d in lv.graph.data if d.role == "input"}
    phantom: list[str | None] = [None] * L
    bwd_done = [False] * L
    pending: dict[str, int] = {}
    steps: list[Step] = []

    def recomputable_gone(d: str) -> bool:
        return d not in live and d in lv.creator

    def kept(d: str) -> bool:
        return d in keep_data or d not in lv.creator

    def maybe_free(d: str, s: int) -> None:
        if kept(d) or d not in live or pending.get(d, 0) > 0:
            return
        reads = stage_reads.get(d, [])
        if s < fb:
            k = bisect.bisect_right(reads, s)
            if k < len(reads) and reads[k] <= fb:
                return
        elif not strict:
            if reads and reads[-1] > s:
                return
        live.discard(d)

    def fwd_step(j: int, option: str) -> Step:
        layer = layers[j]
        return Step(fwd_name(layer.name), option, tuple(layer.inputs), tuple(layer.outputs))

    def plan_recompute(d: str, virtual: set[str], out: list[tuple[int, str]],
                       saving: set[int]) -> None:
        """Append to `out` the forwards that recreate `d` (and its gone ancestors)."""
        if d in virtual or d not in lv.creator:
            return
        j = lv.creator[d]
        for i in layers[j].inputs:
            if recomputable_gone(i) and i not in virtual:
                plan_recompute(i, virtual, out, saving)
        mode, o = strategy[j]
        if (not strict and mode == "drop" and phantom[j] is None and not bwd_done[j]
                and j not in saving):
            option = o  # recompute it for its own backward too: save the phantom now
            saving.add(j)
        else:
            option = FAST_FORWARD
        out.append((j, option))
        virtual.update(layers[j].outputs)

    def run_stage(s: int, work: list[Step]) -> None:
        for st in work:
            for d in st.reads:
                pending[d] = pending.get(d, 0) + 1
        for st in work:
            steps.append(st)
            live.update(st.creates)
            for d in st.reads:
                pending[d] -= 1
            for d in (*st.reads, *st.creates):
                maybe_free(d, s)
            if st.node.endswith(".fwd") and st.option != FAST_FORWARD:
                phantom[_layer_index(st.node)] = st.option

    index_of = {fwd_name(layer.name): j for j, layer in enumerate(layers)}

    def _layer_index(node: str) -> int:
        return index_of[node]

    def recompute_steps(needed: list[str], virtual: set[str], saving: set[int]) -> list[Step]:
        out: list[tuple[int, str]] = []
        for d in needed:
            if recomputable_gone(d) and d not in virtual:
                plan_recompute(d, virtual, out, saving)
        return [fwd_step(j, option) for j, option in out]

    # the forward pass
    for j, layer in enumerate(layers):
        virtual = set(live)
        work = recompute_steps(list(layer.inputs), virtual, set())
        mode, o = strategy[j]
        work.append(fwd_step(j, o if mode == "keep" else FAST_FORWARD))
        run_stage(j, work)
    virtual = set(live)
    work = recompute_steps(list(loss.inputs), virtual, set())
    work.append(Step("loss", None, tuple(loss.inputs), tuple(loss.outputs)))
    run_stage(lv.loss_stage, work)
    # the backward pass
    for j in reversed(range(L)):
        layer = layers[j]
        mode, o = strategy[j]
        opt = lv.opt[j][o]
        virtual = set(live)
        saving: set[int] = set()
        work = []
        if phantom[j] != o:
            work += recompute_steps(list(layer.inputs), virtual, saving)
            work.append(fwd_step(j, o))
            virtual.update(layer.outputs)
            saving.add(j)
        work += recompute_steps([*layer.grad_inputs, *opt.needs], virtual, saving)
        work.append(Step(bwd_name(layer.name), o, tuple(dict.fromkeys((*layer.grad_inputs,
                                                                         *opt.needs))),
                          tuple(layer.grad_outputs)))
        run_stage(lv.bwd_stage[j], work)
        phantom[j] = None
        bwd_done[j] = True
    return steps



def layered_plan(lv: LayeredView, strategy: list[tuple[str, str]], keep_data: set[str],
                  strict: bool = False, name: str = "") -> Plan:
    """Pass 2: ops for the steps, each datum deleted right after its last read.

    A datum with several creators (a gradient accumulated from several backwards) stays in
    memory from its first contribution on: a contribution counts as a read.
    """
    steps = layered_sequence(lv, strategy, keep_data, strict)
    ncreators: dict[str, int] = {}
    for layer in lv.layers:
        for d in layer.grad_outputs:
            ncreators[d] = ncreators.get(d, 0) + 1
        for d in layer.outputs:
            ncreators[d] = ncreators.get(d, 0) + 1
    for d in lv.loss.outputs:
        ncreators[d] = ncreators.get(d, 0) + 1
    outputs = {d for d, r in lv.role.items() if r == "output"}
    after: list[list[str]] = [[] for _ in steps]
    live: set[str] = set()
    for k in range(len(steps) - 1, -1, -1):
        st = steps[k]
        touched = dict.fromkeys((*st.reads, *st.creates))
        after[k] = [d for d in touched if d not in live and d not in outputs]
        for d in st.creates:
            if ncreators.get(d, 0) <= 1:
                live.discard(d)
        live.update(st.reads)
        live.update(d for d in st.creates if ncreators.get(d, 0) > 1)
    ops: list[Op] = [Op("delete", data=d.name) for d in lv.graph.data
                     if d.role == "input" and d.name not in live]
    for k, st in enumerate(steps):
        ops.append(Op("compute", node=st.node, option=st.option))
        ops.extend(Op("delete", data=d) for d in after[k])
    return Plan(graph=lv.graph.name, ops=ops, meta={"planner": name} if name else {})



# --- views and keep sets ------------------------------------------------------------------------
def view_of(graph: Graph):
    return LayeredView(graph) if graph.is_layered else CheckmateView(graph)



def plan_for_checkpoints(view, checkpoints: list[int], name: str, *, last_kept: bool = True,
                          keep_all: bool = False, strict: bool = False) -> Plan:
    """The plan that keeps the outputs of the `checkpoints` units (and, with `last_kept`, every
    unit after the last checkpoint); the other units are recomputed in the backward."""
    units = view.units()
    pos = {u: k for k, u in enumerate(units)}
    chosen = set(checkpoints)
    last = max((pos[u] for u in chosen), default=-1)
    tail = set(units[last + 1:]) if last_kept else set()
    if keep_all:
        chosen, tail = set(units), set()
    if isinstance(view, CheckmateView):
        return checkmate_plan(view, chosen | tail, strict=strict, name=name)
    strategy, keep_data = [], set()
    for j, layer in enumerate(view.layers):
        first = layer.options[0].name
        if j in tail or keep_all:
            strategy.append(("keep", first))
        else:
            strategy.append(("drop", first))
        if j in chosen:
            keep_data.update(layer.outputs)
    return layered_plan(view, strategy, keep_data, strict=strict, name=name)



def checkpoint_names(view, checkpoints) -> list[str]:
    if isinstance(view, CheckmateView):
        return [view.names[u] for u in checkpoints]
    return [view.layers[j].name for j in checkpoints]
