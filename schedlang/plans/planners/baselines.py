"""Baseline planners: the heuristics of Checkmate, Chen et al., PyTorch and torch._functorch.

Each planner turns graph data (+ an optional peak budget) into a `Plan` that replays in
`schedlang.plans.simulate.simulate`. All of them are built on one idea, a **keep set**: which
forward data are held from the forward pass to the backward pass (a *checkpoint*); the rest
is freed after its forward use and recomputed when the backward needs it. A planner chooses
the keep set; `checkmate_plan` / `layered_plan` turn it into ops. When a budget cannot be
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

import math

import numpy as np

from ...graphs.graph import Graph
from ...graphs.hgraph import FAST_FORWARD
from ..plan import Op, Plan
from . import Planner
from .no_recompute import no_recompute_plan
from .sequences import (
    CheckmateView,
    Replay,
    checkmate_plan,
    checkpoint_names,
    graph_save_budget,
    layered_plan,
    pick_best,
    plan_for_checkpoints,
    replay,
    view_of,
)

#: a budget no plan reaches: replays checked for structure only


# --- the planners -------------------------------------------------------------------------------
def plan_no_recompute(graph: Graph, budget: int | None = None) -> Plan:
    plan = no_recompute_plan(graph)
    plan.meta["planner"] = "no_recompute"
    return plan


def plan_checkpoint_all(graph: Graph, budget: int | None = None) -> Plan:
    view = view_of(graph)
    plan = plan_for_checkpoints(view, [], "checkpoint_all", keep_all=True)
    replay(plan, graph, budget)
    return plan


def plan_recompute_all(graph: Graph, budget: int | None = None) -> Plan:
    view = view_of(graph)
    plan = plan_for_checkpoints(view, [], "recompute_all", last_kept=False, strict=True)
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
    view = view_of(graph)
    candidates = view.articulation_units() if articulation else view.units()
    if articulation and not candidates:
        candidates = view.units()
    plan = plan_for_checkpoints(view, sqrt_checkpoints(candidates), "chen_sqrt")
    replay(plan, graph, budget, graph_save_budget(graph))
    plan.meta["checkpoints"] = checkpoint_names(view, sqrt_checkpoints(candidates))
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
    view = view_of(graph)
    units = view.units()
    candidates = set(view.articulation_units()) or set(units)
    sizes = [view.unit_size(u) for u in units if view.unit_size(u) > 0]
    total = sum(sizes)
    grid: list[float] = [math.inf]
    if sizes:
        lo, hi = max(1, min(sizes)) / 2, total
        grid += [lo * (hi / lo) ** (k / (thresholds - 1)) for k in range(thresholds)]
    seen: dict[tuple, Replay] = {}
    save = graph_save_budget(graph)
    for b in grid:
        cps = tuple(greedy_checkpoints(view, candidates, b))
        if cps in seen:
            continue
        plan = plan_for_checkpoints(view, list(cps), "chen_greedy")
        plan.meta["checkpoints"] = checkpoint_names(view, cps)
        plan.meta["threshold_bytes"] = None if math.isinf(b) else int(b)
        seen[cps] = replay(plan, graph, budget, save)
    best = pick_best(list(seen.values()), prefer_low_peak=budget is None)
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
    view = view_of(graph)
    units = view.units()
    save = graph_save_budget(graph)
    seen: dict[tuple, Replay] = {}
    for k in range(1, max(1, len(units)) + 1):
        cps = tuple(sequential_checkpoints(units, k))
        if cps in seen:
            continue
        plan = plan_for_checkpoints(view, list(cps), "checkpoint_sequential")
        plan.meta["segments"] = k
        seen[cps] = replay(plan, graph, budget, save)
        if budget is None:
            break  # k = 1: no recomputation, the fastest
    return pick_best(list(seen.values())).plan


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
    the plan the hook front end runs (`schedlang.pytorch.frontends.blocks.families.group_plans`), and the one the
    bench prices checkpoint_sequential with."""
    options = options or {}
    ha = graph.layered_index()
    names = [lay.name for lay in graph.layers]
    position = {n: k for k, n in enumerate(names)}
    group_of: dict[str, int] = {}
    for g, members in enumerate(groups):
        if not members:
            raise ValueError(f"group {g + 1} of {len(groups)} is empty: a group holds one layer "
                             "or more")
        at = [position[m] for m in members if m in position]
        if len(at) < len(members) or at != list(range(at[0], at[0] + len(at))):
            raise ValueError(f"group {members}: not consecutive layers of '{graph.name}'")
        group_of.update((m, g) for m in members)
        for m in members:
            if FAST_FORWARD not in ha.opt_names[ha.index[f"{m}.fwd"]]:
                raise ValueError(f"layer '{m}' has no fast_forward option to run in a group")

    def option(n: str) -> str:
        # a layer without a backward (frozen, or nothing of it needs a gradient) has no
        # options: it runs fast_forward
        lay = graph.layers[position[n]]
        return options.get(n) or (lay.options[0].name if lay.options else FAST_FORWARD)

    seq: list[tuple[str, str | None]] = [(f"{n}.fwd", FAST_FORWARD if n in group_of else option(n))
                                         for n in names]
    seq.append(("loss", None))
    for n in reversed(names):
        grp = group_of.get(n)
        if grp is not None and n == groups[grp][-1]:  # the group's recomputation
            seq += [(f"{m}.fwd", option(m)) for m in groups[grp]]
        if f"{n}.bwd" in ha.index:
            seq.append((f"{n}.bwd", option(n)))
    # the checkpoint holds what a group's layers read from outside it (their recomputation's
    # inputs) until the group's backward ends, its first layer's
    held: dict[str, set[int]] = {}
    for members in groups:
        inside = {d for m in members for d in graph.layers[position[m]].outputs}
        held[f"{members[0]}.bwd"] = {ha.data_index[d] for m in members
                                     for d in graph.layers[position[m]].inputs if d not in inside}
    # a gradient several backwards add to stays from its first part on: adding is reading
    makers: dict[str, int] = {}
    for lay in graph.layers:
        for d in (*lay.outputs, *lay.grad_outputs):
            makers[d] = makers.get(d, 0) + 1
    for d in graph.layered_loss().outputs:
        makers[d] = makers.get(d, 0) + 1
    summed = {ha.data_index[d] for d, n in makers.items() if n > 1}
    touched = []  # per step: (data read, data made)
    for node, opt in seq:
        i = ha.index[node]
        o = ha.opt_index[i].get(opt, 0) if opt is not None else 0
        extra = ha.opt_uses[i][o] if ha.kind[i] == "bwd" else ()
        made = {d for d, _ in ha.creates[i]}
        touched.append((set(ha.uses[i]) | set(extra) | held.get(node, set()) | (made & summed),
                        made - summed))
    keep = set(ha.outputs) | {ha.data_index[d] for d in graph.layered_loss().inputs}
    ops = []
    for k, (node, opt) in enumerate(seq):
        ops.append(Op("compute", node=node, option=opt))
        for di in sorted(set().union(*touched[k]) - keep):
            later = next(("read" if di in r else "made" for r, c in touched[k + 1:]
                          if di in r or di in c), None)
            if later != "read":
                ops.append(Op("delete", data=ha.data[di]))
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
    if isinstance(view, CheckmateView):
        readers_bwd = {i for i in view.fwd
                       if any(view.kind[j] != "forward" for j in view.succs[i])}
        items = [u for u in view.units() if u in readers_bwd]
        groups = [[(0, view.time[u]), (view.size[u], 0.0)] for u in items]

        def build(picks: list[int], strict: bool) -> Plan:
            keep = {u for u, c in zip(items, picks) if c == 1}
            return checkmate_plan(view, keep, strict=strict, name="knapsack")
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
        return layered_plan(view, strategy, keep_data, strict=strict, name="knapsack")
    return groups, build


def plan_knapsack(graph: Graph, budget: int | None = None, grid: int = 32,
                  bisections: int = 8) -> Plan:
    view = view_of(graph)
    groups, build = _knapsack_items(view)
    top = sum(max(w for w, _ in g) for g in groups)
    save = graph_save_budget(graph)
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
            tried[capacity] = pick_best(both)
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
    return pick_best(list(tried.values())).plan


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
