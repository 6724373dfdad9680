"""Baseline planners: the heuristics of Checkmate, Chen et al., PyTorch and torch._functorch.

Each planner turns graph data (+ an optional peak budget) into a `Plan` that replays in
`schedlang.plans.simulate.simulate`. All of them are built on one idea, a **keep set**: which
forward data are held from the forward pass to the backward pass (a *checkpoint*); the rest
is freed after its forward use and recomputed when the backward needs it. A planner chooses
the keep set; `_checkmate_plan` / `_layered_plan` turn it into ops. When a budget cannot be
met, a budget-aware planner returns its lowest-peak plan (the caller sees ``fits_budget``
false); nothing here raises for a budget.

Both graph vocabularies are served:

* **Checkmate view** (nodes, edges; kinds forward / loss / backward). The *units* are the
  forward nodes in the graph's (topological) order. Graph inputs (forward nodes without
  predecessors), the loss and backward nodes are always kept.
* **Layered view** (data, layers with options and phantoms, loss). The *units* are the
  layers in declaration order (a chain; skip data such as a U-Net's are handled, they are
  just data that the chain does not checkpoint). A layer is either

  - *kept* with option o: its forward runs with o and saves o's phantom for the backward
    (o's ``needs`` are kept too), or
  - *dropped* (recomputed): its forward runs with ``fast_forward`` (no autograd, no
    phantom), and before its backward the forward runs again with the layer's first option
    (the autograd-like one, as in the no-recomputation plan), from its inputs, recomputing
    them from the nearest kept data when they are gone. This works on every layered graph;
    a layer's own recompute-style option (phantom 0, ``needs`` its input), when the data has
    one, is what `knapsack` may pick as a *kept* option instead.

How a keep set becomes a plan (both views): stages run in the graph's order (layered: the
forwards, the loss, the backwards in reverse). A datum that is not kept lives, during the
forward pass, until its last read by a forward stage (or by the first backward stage, which
follows the forward immediately); in the backward pass a stage that needs a datum that is
gone recomputes it, and the ancestors that are gone, from the nearest data still in memory.
Recomputed data then live until their last read by a later stage (``segment`` retention:
Chen's "recompute a segment once, during its backward") or only for the stage that needed
them (``strict``: recomputed afresh each time). Deletes are placed last, by exact liveness
of the resulting compute sequence: every datum is freed right after its last read.

Planners (`PLANNERS`):

* ``no_recompute`` -- `schedlang.plans.planners.no_recompute`: everything once, frees after
  last use.
* ``checkpoint_all`` -- Checkmate's baseline of that name (``solve_checkpoint_all``): *every
  forward output is a checkpoint*, i.e. kept until its last use; nothing is recomputed. On
  both views it is the no-recomputation schedule, built through the keep-set machinery.
* ``recompute_all`` -- the opposite extreme: keep nothing but the graph inputs; every
  forward output is freed after its forward use and recomputed from the inputs whenever a
  backward stage needs it, and freed again after that stage (quadratic time on a chain, the
  least memory these baselines reach).
* ``chen_sqrt`` -- Chen et al. (2016) sqrt(n): split the n units (topological order of the
  forward part) into segments of round(sqrt(n)) units; the last unit of every segment but
  the last is a checkpoint; the last segment is kept (its backward follows its forward).
  Budget-oblivious. Option ``articulation=True``: segments over the articulation points
  only (Checkmate's variant).
* ``chen_greedy`` -- Chen's greedy under a budget: walk the units, adding their memory
  (output bytes; layered: outputs + phantom); at a candidate unit whose running sum exceeds
  a threshold b, checkpoint it and restart the sum. Candidates: the articulation points of
  the undirected forward graph (all units when there are none). Thresholds b: a geometric
  grid from the smallest unit to the whole forward memory; the fastest plan that fits the
  budget is returned (no budget: the lowest-peak plan, Chen's aim), else the lowest peak.
* ``checkpoint_sequential`` -- `torch.utils.checkpoint.checkpoint_sequential`: for k
  segments, segment size s = n // k; the first k - 1 segments are checkpointed (only their
  inputs kept, everything inside recomputed in the backward), the last one (the remainder)
  runs normally. Every k in 1..n is tried; the fastest plan that fits the budget wins (no
  budget: k = 1, no recomputation), else the lowest peak.
* ``knapsack`` -- torch._functorch's activation-budget idea: a 0/1 knapsack (multiple-choice
  on layered data) over the saved activations, maximising the recompute time saved (=
  minimising the time added) within a capacity of saved bytes. Checkmate view: items are the
  forward nodes read by the loss or a backward node (keep: weight = output bytes; drop: adds
  the node's time). Layered view: per layer, keep with any of its options (weight = phantom
  + bytes of the option's ``needs``, time = the option's forward + backward minus the first
  option's), drop with its inputs kept (weight = input bytes, time = fast_forward), or drop
  bare (weight 0, time = its fast_forward and its producers'). Exact DP with weights
  rounded *up* to 1/1024 of the capacity (never over the capacity, unlike a rounded DP).
  Each capacity's choice is built with both retentions of recomputed data (segment and
  strict; the better one counts), and the capacity is searched (a grid of 33, then
  bisection) for the fastest plan whose *simulated* peak fits the budget; no budget:
  everything kept.

Planner options are keyword arguments of ``run`` (e.g. ``articulation`` for chen_sqrt);
``schedlang plan`` passes none.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

import networkx as nx
import numpy as np

from ...graphs.graph import Graph
from ...graphs.hgraph import FAST_FORWARD, bwd_name, fwd_name, has_backward
from ...language.errors import DataError
from ..plan import Op, Plan
from ..simulate import NO_LIMIT, simulate
from . import Planner, PlannerNotApplicable
from .no_recompute import no_recompute_plan

#: a budget no plan reaches: replays checked for structure only


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


def _pick(candidates: list[Replay], prefer_low_peak: bool = False) -> Replay:
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


def _save_budget(graph: Graph) -> int | None:
    return graph.budgets.get("save")


# --- the Checkmate view -------------------------------------------------------------------------
class _CView:
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


def _checkmate_sequence(cv: _CView, keep: set[int], strict: bool) -> list[int]:
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


def _checkmate_plan(cv: _CView, keep: set[int], strict: bool = False, name: str = "") -> Plan:
    """Pass 2: the plan of the compute sequence, each output deleted right after its last read."""
    seq = _checkmate_sequence(cv, keep, strict)
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
class _LView:
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
class _Step:
    node: str
    option: str | None
    reads: tuple[str, ...]
    creates: tuple[str, ...]


def _layered_sequence(lv: _LView, strategy: list[tuple[str, str]], keep_data: set[str],
                      strict: bool) -> list[_Step]:
    """Pass 1: the compute steps for per-layer strategies ("keep"|"drop", option) and kept data."""
    layers, L = lv.layers, lv.L
    loss = lv.graph.loss
    fb = lv.first_bwd
    stage_reads: dict[str, list[int]] = {}

    def add_read(d: str, s: int) -> None:
        stage_reads.setdefault(d, []).append(s)

    for j, layer in enumerate(layers):
        for d in layer.inputs:
            add_read(d, j)
    for d in loss.inputs:
        add_read(d, lv.loss_stage)
    for j, layer in enumerate(layers):
        o = lv.opt[j][strategy[j][1]]
        for d in (*layer.grad_inputs, *o.needs):
            add_read(d, lv.bwd_stage[j])
    for reads in stage_reads.values():
        reads.sort()

    live: set[str] = {d.name for d in lv.graph.data if d.role == "input"}
    phantom: list[str | None] = [None] * L
    bwd_done = [False] * L
    pending: dict[str, int] = {}
    steps: list[_Step] = []

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

    def fwd_step(j: int, option: str) -> _Step:
        layer = layers[j]
        return _Step(fwd_name(layer.name), option, tuple(layer.inputs), tuple(layer.outputs))

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

    def run_stage(s: int, work: list[_Step]) -> None:
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

    def recompute_steps(needed: list[str], virtual: set[str], saving: set[int]) -> list[_Step]:
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
    work.append(_Step("loss", None, tuple(loss.inputs), tuple(loss.outputs)))
    run_stage(lv.loss_stage, work)
    # the backward pass
    for j in reversed(range(L)):
        layer = layers[j]
        mode, o = strategy[j]
        opt = lv.opt[j][o]
        virtual = set(live)
        saving: set[int] = set()
        work: list[_Step] = []
        if phantom[j] != o:
            work += recompute_steps(list(layer.inputs), virtual, saving)
            work.append(fwd_step(j, o))
            virtual.update(layer.outputs)
            saving.add(j)
        work += recompute_steps([*layer.grad_inputs, *opt.needs], virtual, saving)
        work.append(_Step(bwd_name(layer.name), o, tuple(dict.fromkeys((*layer.grad_inputs,
                                                                         *opt.needs))),
                          tuple(layer.grad_outputs)))
        run_stage(lv.bwd_stage[j], work)
        phantom[j] = None
        bwd_done[j] = True
    return steps


def _layered_plan(lv: _LView, strategy: list[tuple[str, str]], keep_data: set[str],
                  strict: bool = False, name: str = "") -> Plan:
    """Pass 2: ops for the steps, each datum deleted right after its last read.

    A datum with several creators (a gradient accumulated from several backwards) stays in
    memory from its first contribution on: a contribution counts as a read.
    """
    steps = _layered_sequence(lv, strategy, keep_data, strict)
    ncreators: dict[str, int] = {}
    for layer in lv.layers:
        for d in layer.grad_outputs:
            ncreators[d] = ncreators.get(d, 0) + 1
        for d in layer.outputs:
            ncreators[d] = ncreators.get(d, 0) + 1
    for d in lv.graph.loss.outputs:
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
def _view(graph: Graph):
    return _LView(graph) if graph.is_layered else _CView(graph)


def _plan_for_checkpoints(view, checkpoints: list[int], name: str, *, last_kept: bool = True,
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
    if isinstance(view, _CView):
        return _checkmate_plan(view, chosen | tail, strict=strict, name=name)
    strategy, keep_data = [], set()
    for j, layer in enumerate(view.layers):
        first = layer.options[0].name
        if j in tail or keep_all:
            strategy.append(("keep", first))
        else:
            strategy.append(("drop", first))
        if j in chosen:
            keep_data.update(layer.outputs)
    return _layered_plan(view, strategy, keep_data, strict=strict, name=name)


# --- the planners -------------------------------------------------------------------------------
def plan_no_recompute(graph: Graph, budget: int | None = None) -> Plan:
    plan = no_recompute_plan(graph)
    plan.meta["planner"] = "no_recompute"
    return plan


def plan_checkpoint_all(graph: Graph, budget: int | None = None) -> Plan:
    view = _view(graph)
    plan = _plan_for_checkpoints(view, [], "checkpoint_all", keep_all=True)
    replay(plan, graph, budget)
    return plan


def plan_recompute_all(graph: Graph, budget: int | None = None) -> Plan:
    view = _view(graph)
    plan = _plan_for_checkpoints(view, [], "recompute_all", last_kept=False, strict=True)
    replay(plan, graph, budget)
    return plan


def sqrt_checkpoints(units: list[int]) -> list[int]:
    """Chen's sqrt(n) segments of round(sqrt(n)) units: the last unit of every segment but the
    last one is a checkpoint."""
    n = len(units)
    if n <= 1:
        return []
    seg = max(1, round(math.sqrt(n)))
    return [units[k] for k in range(seg - 1, n - 1, seg)]


def plan_chen_sqrt(graph: Graph, budget: int | None = None, articulation: bool = False) -> Plan:
    view = _view(graph)
    candidates = view.articulation_units() if articulation else view.units()
    if articulation and not candidates:
        candidates = view.units()
    plan = _plan_for_checkpoints(view, sqrt_checkpoints(candidates), "chen_sqrt")
    replay(plan, graph, budget, _save_budget(graph))
    plan.meta["checkpoints"] = _checkpoint_names(view, sqrt_checkpoints(candidates))
    return plan


def greedy_checkpoints(view, candidates: set[int], threshold: float) -> list[int]:
    """Chen's greedy: a candidate unit whose running memory exceeds `threshold` is a checkpoint."""
    out, running = [], 0
    for u in view.units():
        running += view.unit_size(u)
        if u in candidates and running > threshold:
            out.append(u)
            running = 0
    return out


def plan_chen_greedy(graph: Graph, budget: int | None = None, thresholds: int = 48) -> Plan:
    view = _view(graph)
    units = view.units()
    candidates = set(view.articulation_units()) or set(units)
    sizes = [view.unit_size(u) for u in units if view.unit_size(u) > 0]
    total = sum(sizes)
    grid: list[float] = [math.inf]
    if sizes:
        lo, hi = max(1, min(sizes)) / 2, total
        grid += [lo * (hi / lo) ** (k / (thresholds - 1)) for k in range(thresholds)]
    seen: dict[tuple, Replay] = {}
    save = _save_budget(graph)
    for b in grid:
        cps = tuple(greedy_checkpoints(view, candidates, b))
        if cps in seen:
            continue
        plan = _plan_for_checkpoints(view, list(cps), "chen_greedy")
        plan.meta["checkpoints"] = _checkpoint_names(view, cps)
        plan.meta["threshold_bytes"] = None if math.isinf(b) else int(b)
        seen[cps] = replay(plan, graph, budget, save)
    best = _pick(list(seen.values()), prefer_low_peak=budget is None)
    return best.plan


def sequential_checkpoints(units: list[int], k: int) -> list[int]:
    """checkpoint_sequential with k segments of n // k units: the output of each of the first
    k - 1 segments is kept (the next segment's input); the last segment runs normally."""
    n = len(units)
    size = n // k
    if k <= 1 or size == 0:
        return []
    return [units[(i + 1) * size - 1] for i in range(k - 1)]


def plan_checkpoint_sequential(graph: Graph, budget: int | None = None) -> Plan:
    view = _view(graph)
    units = view.units()
    save = _save_budget(graph)
    seen: dict[tuple, Replay] = {}
    for k in range(1, max(1, len(units)) + 1):
        cps = tuple(sequential_checkpoints(units, k))
        if cps in seen:
            continue
        plan = _plan_for_checkpoints(view, list(cps), "checkpoint_sequential")
        plan.meta["segments"] = k
        seen[cps] = replay(plan, graph, budget, save)
        if budget is None:
            break  # k = 1: no recomputation, the fastest
    return _pick(list(seen.values())).plan


def plan_checkpoint_groups(graph: Graph, groups: list[list[str]],
                           options: dict[str, str] | None = None, name: str = "") -> Plan:
    """The plan that `torch.utils.checkpoint` runs around each group of consecutive layers
    (`groups`: lists of layer names of a layered graph; checkpoint_sequential's segments, or
    the hook front end's grouped blocks): in the forward a group's layers run ``fast_forward``
    (nothing saved) and only the group's input stays; in the backward, when the group's last
    layer's backward comes, all its layers run forward again saving (the first option, or
    `options`' choice), then their backwards in reverse; what the group's layers read from
    outside it stays until the group's backward ends (the checkpoint holds it). Every other
    layer runs once with its first option (or `options`' choice). Data are deleted right after
    their last read before they are made again; what the loss reads stays (the caller holds
    it). Unlike the keep-set planners here (`checkpoint_sequential` among them: a dropped
    layer is recomputed when a backward needs it), this is torch's own order, step for step:
    the plan the hook front end runs (`schedlang.pytorch.hooked.group_plans`), and the one the
    bench prices checkpoint_sequential with."""
    options = options or {}
    ha = graph.layered_index()
    names = [lay.name for lay in graph.layers]
    position = {n: k for k, n in enumerate(names)}
    group_of: dict[str, int] = {}
    for g, members in enumerate(groups):
        at = [position.get(m) for m in members]
        if None in at or at != list(range(at[0], at[0] + len(at))):
            raise ValueError(f"group {members}: not consecutive layers of '{graph.name}'")
        group_of.update((m, g) for m in members)
        for m in members:
            if FAST_FORWARD not in ha.opt_names[ha.index[f"{m}.fwd"]]:
                raise ValueError(f"layer '{m}' has no fast_forward option to run in a group")

    def option(n: str) -> str:
        return options.get(n) or graph.layers[position[n]].options[0].name

    seq = [(f"{n}.fwd", FAST_FORWARD if n in group_of else option(n)) for n in names]
    seq.append(("loss", None))
    for n in reversed(names):
        g = group_of.get(n)
        if g is not None and n == groups[g][-1]:  # the group's recomputation
            seq += [(f"{m}.fwd", option(m)) for m in groups[g]]
        seq.append((f"{n}.bwd", option(n)))
    # the checkpoint holds what a group's layers read from outside it (their recomputation's
    # inputs) until the group's backward ends, its first layer's
    held: dict[str, set[int]] = {}
    for members in groups:
        made = {d for m in members for d in graph.layers[position[m]].outputs}
        held[f"{members[0]}.bwd"] = {ha.data_index[d] for m in members
                                     for d in graph.layers[position[m]].inputs if d not in made}
    # a gradient several backwards add to stays from its first part on: adding is reading
    makers: dict[str, int] = {}
    for lay in graph.layers:
        for d in (*lay.outputs, *lay.grad_outputs):
            makers[d] = makers.get(d, 0) + 1
    for d in graph.loss.outputs:
        makers[d] = makers.get(d, 0) + 1
    summed = {ha.data_index[d] for d, n in makers.items() if n > 1}
    touched = []  # per step: (data read, data made)
    for node, opt in seq:
        i = ha.index[node]
        o = ha.opt_index[i].get(opt, 0)
        extra = ha.opt_uses[i][o] if ha.kind[i] == "bwd" else ()
        made = {d for d, _ in ha.creates[i]}
        touched.append((set(ha.uses[i]) | set(extra) | held.get(node, set()) | (made & summed),
                        made - summed))
    keep = set(ha.outputs) | {ha.data_index[d] for d in graph.loss.inputs}
    ops = []
    for k, (node, opt) in enumerate(seq):
        ops.append(Op("compute", node=node, option=opt))
        for d in sorted(set().union(*touched[k]) - keep):
            later = next(("read" if d in r else "made" for r, c in touched[k + 1:]
                          if d in r or d in c), None)
            if later != "read":
                ops.append(Op("delete", data=ha.data[d]))
    return Plan(graph=graph.name, ops=ops,
                meta={"planner": name or "checkpoint_groups",
                      "groups": [list(m) for m in groups]})


# --- knapsack -----------------------------------------------------------------------------------
def knapsack_choose(groups: list[list[tuple[int, float]]], capacity: int,
                    resolution: int = 1024) -> list[int]:
    """Multiple-choice knapsack: one choice (weight bytes, added time) per group, total weight
    <= `capacity`, least added time. Weights are rounded up to units of capacity/resolution,
    so a solution never exceeds the capacity. A group without a choice that fits makes the
    problem infeasible: give every group a weight-0 choice."""
    if capacity >= sum(max(w for w, _ in options) for options in groups):
        # everything fits: no rounding, the least time in each group (ties: the lighter)
        return [min(range(len(options)), key=lambda c: (options[c][1], options[c][0]))
                for options in groups]
    unit = max(1, -(-capacity // resolution))
    cap = capacity // unit
    best = np.zeros(cap + 1)
    choice = np.zeros((len(groups), cap + 1), dtype=np.int32)
    qweights = []
    for g, options in enumerate(groups):
        q = [-(-w // unit) for w, _ in options]
        qweights.append(q)
        new = np.full(cap + 1, np.inf)
        arg = np.zeros(cap + 1, dtype=np.int32)
        for c in sorted(range(len(options)), key=lambda c: q[c]):
            w, t = q[c], options[c][1]
            if w > cap:
                continue
            cand = np.full(cap + 1, np.inf)
            cand[w:] = best[:cap + 1 - w] + t
            better = cand < new - 1e-12 * max(1.0, abs(t))
            new[better] = cand[better]
            arg[better] = c
        if np.isinf(new).all():
            raise ValueError("a group has no choice within the capacity")
        best = new
        choice[g] = arg
    picks = [0] * len(groups)
    c = cap
    for g in range(len(groups) - 1, -1, -1):
        picks[g] = int(choice[g][c])
        c -= qweights[g][picks[g]]
    return picks


def _knapsack_items(view):
    """(groups of (weight, time) choices, a function picks -> plan)."""
    if isinstance(view, _CView):
        readers_bwd = {i for i in view.fwd
                       if any(view.kind[j] != "forward" for j in view.succs[i])}
        items = [u for u in view.units() if u in readers_bwd]
        groups = [[(0, view.time[u]), (view.size[u], 0.0)] for u in items]

        def build(picks: list[int], strict: bool) -> Plan:
            keep = {u for u, c in zip(items, picks) if c == 1}
            return _checkmate_plan(view, keep, strict=strict, name="knapsack")
        return groups, build

    groups, meaning = [], []
    for j, layer in enumerate(view.layers):
        first = layer.options[0]
        base = first.fwd_time + first.bwd_time
        ff = view.fwd_ff_time(j)
        producers = {view.creator[d] for d in layer.inputs if d in view.creator}
        bare = ff + sum(view.fwd_ff_time(p) for p in producers)
        # on ties (same weight and time) the earlier choice wins: the data's own options first
        choices, means = [], []
        for o in layer.options:
            needs = tuple(o.needs)
            choices.append((int(o.phantom) + sum(view.size.get(d, 0) for d in needs),
                            o.fwd_time + o.bwd_time - base))
            means.append(("keep", o.name, needs))
        inputs = tuple(layer.inputs)
        choices.append((sum(view.size.get(d, 0) for d in inputs), ff))
        means.append(("drop", first.name, inputs))
        choices.append((0, bare))
        means.append(("drop", first.name, ()))
        groups.append(choices)
        meaning.append(means)

    def build(picks: list[int], strict: bool) -> Plan:
        strategy, keep_data = [], set()
        for j, c in enumerate(picks):
            mode, option, data = meaning[j][c]
            strategy.append((mode, option))
            keep_data.update(data)
        return _layered_plan(view, strategy, keep_data, strict=strict, name="knapsack")
    return groups, build


def plan_knapsack(graph: Graph, budget: int | None = None, grid: int = 32,
                  bisections: int = 8) -> Plan:
    view = _view(graph)
    groups, build = _knapsack_items(view)
    top = sum(max(w for w, _ in g) for g in groups)
    save = _save_budget(graph)
    tried: dict[int, Replay] = {}

    def at(capacity: int) -> Replay:
        """The better of the two retentions of recomputed data for this capacity."""
        capacity = max(0, int(capacity))
        if capacity not in tried:
            picks = knapsack_choose(groups, capacity)
            both = []
            for strict in (False, True):
                plan = build(picks, strict)
                plan.meta["capacity_bytes"] = capacity
                plan.meta["retention"] = "strict" if strict else "segment"
                both.append(replay(plan, graph, budget, save))
            tried[capacity] = _pick(both)
        return tried[capacity]

    if budget is None and save is None:
        return at(top).plan
    caps = sorted({round(top * k / grid) for k in range(grid + 1)})
    results = [(c, at(c)) for c in caps]
    # refine between the largest capacity that fits and the next one that does not
    fit_caps = [c for c, r in results if r.fits]
    if fit_caps:
        lo = max(fit_caps)
        above = [c for c in caps if c > lo]
        if above:
            hi = min(above)
            for _ in range(bisections):
                if hi - lo <= 1:
                    break
                mid = (lo + hi) // 2
                if at(mid).fits:
                    lo = mid
                else:
                    hi = mid
    return _pick(list(tried.values())).plan


def _checkpoint_names(view, checkpoints) -> list[str]:
    if isinstance(view, _CView):
        return [view.names[u] for u in checkpoints]
    return [view.layers[j].name for j in checkpoints]


PLANNERS: dict[str, Planner] = {
    p.name: p for p in [
        Planner("no_recompute", "every node once in order, each output freed after its last "
                "use (the reference)", plan_no_recompute),
        Planner("checkpoint_all", "Checkmate's checkpoint-all: every forward output kept until "
                "its last use, nothing recomputed", plan_checkpoint_all),
        Planner("recompute_all", "keep only the graph inputs; recompute every forward output "
                "from them each time a backward needs it (least memory, quadratic time)",
                plan_recompute_all),
        Planner("chen_sqrt", "Chen et al. sqrt(n): checkpoints every round(sqrt(n)) forward "
                "units, segments recomputed once in the backward (budget-oblivious)",
                plan_chen_sqrt),
        Planner("chen_greedy", "Chen et al. greedy over articulation points: segment-memory "
                "thresholds searched for the fastest plan within the budget", plan_chen_greedy),
        Planner("checkpoint_sequential", "torch checkpoint_sequential: k equal segments, the "
                "last run normally; the fastest k within the budget", plan_checkpoint_sequential),
        Planner("knapsack", "torch activation-budget knapsack: keep the activations that save "
                "the most recompute time per byte, capacity searched against the budget",
                plan_knapsack),
    ]
}
