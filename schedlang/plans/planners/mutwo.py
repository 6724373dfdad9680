"""μ-TWO's Algorithm B (Purandare et al., MLSys'23): greedy activation checkpointing.

Every activation starts checkpointed (kept). While the simulated peak is over the budget, the
candidate with the best ``recompute_ratio`` = memory saved / total recompute time is evicted
and recomputed before the backward that needs it; with a host link bandwidth, the candidate
with the longest inactive time is swapped instead when its swap overhead is smaller (the swap
branch). After each choice the remaining candidates are updated and the plan built so far is
simulated; the loop stops as soon as the peak fits or no candidate is left.

Checkmate view (nodes with one output each, edges):

* candidates: the *activations*, outputs of forward nodes that a backward node reads;
* recompute sources: the kept tensors an activation is rebuilt from. A forward output that is
  not an activation is freed after its last forward use, so it is never a source: its own
  sources and recompute path are spliced in from the start. When a candidate ``t`` is chosen,
  every candidate (and every earlier choice) that had ``t`` among its sources gets ``t``'s
  sources instead and ``t``'s recompute path added to its own (Capuchin's update);
* total recompute time of a candidate ``c`` = time of its recompute path x (1 + the number of
  earlier choices that list ``c`` among their sources: each of them would then recompute
  ``c`` too);
* swap branch (``bandwidth`` in bytes per time unit): inactive time = compute time between the
  last forward use and the first backward use; swap overhead = max(0, 2 x size / bandwidth -
  inactive time); recompute overhead = the candidate's total recompute time. The swap
  candidate is the one with the longest inactive time; it wins when its overhead is smaller.
* the plan is in Checkmate's stage space: first computations in node order; before each
  backward node, the evicted tensors it reads are recomputed (with the evicted tensors of their
  paths, depth first); a recomputed activation is kept until its last backward use, a tensor
  recomputed only as an intermediate of a path is freed right after the path; every tensor is
  deleted right after its last use. Swapped activations get ``offload`` after their last forward
  use and ``prefetch`` early enough before their first backward use (ops the simulator does
  not replay yet: such plans are for the table and for the runtime to come).

Layered view (H-Rockmate vocabulary): the units are layers. A layer kept runs its forward and
backward with its first option (the autograd-like schedule, which saves the phantom); a layer
recomputed runs its forward with ``fast_forward`` (no phantom), then before its backward the
forward again with its re-forward option (the fastest forward + backward among its options)
and the backward with that option. Memory saved = the first option's phantom; recompute time
= the extra time of that schedule. Data (layer inputs and outputs) stay data: a recomputed
layer keeps its inputs alive until its re-forward, so there is no splicing to do. The swap
branch is not used on layered data.

API: ``PLANNERS["mutwo"]`` (``run(graph, budget, bandwidth=None, prune=False)``), `mutwo_plan`,
`mutwo_table` and `format_table` (CSV text ``activation,decision``).
"""
from __future__ import annotations

import math
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from ...graphs.graph import Graph
from ...graphs.hgraph import FAST_FORWARD, bwd_name, fwd_name, has_backward
from ...language.errors import DataError
from ..plan import Op, Plan
from ..simulate import simulate
from . import Planner

KEEP, RECOMPUTE, SWAP = "keep", "recompute", "swap"


# --- Checkmate view: the graph, indexed ------------------------------------------------------
@dataclass
class CheckmateView:
    names: list[str]
    size: list[int]
    time: list[float]
    preds: list[tuple[int, ...]]
    succs: list[tuple[int, ...]]
    forward: list[bool]  # node kind "forward"
    activations: list[int]  # forward outputs read by a backward node, node order
    last_fwd_use: list[int]  # node position of the last forward reader (or the node itself)
    first_bwd_use: list[int]  # node position of the first backward reader (n: none)
    last_bwd_use: list[int]  # node position of the last backward reader (-1: none)

    @property
    def n(self) -> int:
        return len(self.names)

    def inactive_time(self, x: int) -> float:
        """Compute time strictly between the last forward use and the first backward use."""
        return float(sum(self.time[self.last_fwd_use[x] + 1:self.first_bwd_use[x]]))


def checkmate_view(graph: Graph) -> CheckmateView:
    idx = graph.checkmate_index(topological=True)
    names, succs = list(idx.names), idx.succs
    n = len(names)
    forward = [kind == "forward" for kind in idx.kind]
    last_fwd = list(range(n))
    first_bwd = [n] * n
    last_bwd = [-1] * n
    for i in range(n):
        for j in succs[i]:
            if forward[j]:
                last_fwd[i] = max(last_fwd[i], j)
            else:
                first_bwd[i] = min(first_bwd[i], j)
                last_bwd[i] = max(last_bwd[i], j)
    activations = [i for i in range(n) if forward[i] and last_bwd[i] >= 0]
    return CheckmateView(names=names, size=list(idx.size), time=list(idx.time),
                         preds=list(idx.preds), succs=list(succs), forward=forward,
                         activations=activations, last_fwd_use=last_fwd,
                         first_bwd_use=first_bwd, last_bwd_use=last_bwd)


# --- candidates and their update -----------------------------------------------------------
@dataclass
class Candidate:
    """A recompute candidate: its sources (kept tensors), its recompute path (the nodes run to
    rebuild it, itself included) and how many chosen recomputations list it as a source."""

    node: int
    size: int
    srcs: set[int]
    path: set[int]
    rp_time: float
    n_dep: int = 0

    @property
    def total_time(self) -> float:
        return self.rp_time * (1 + self.n_dep)

    @property
    def ratio(self) -> float:
        t = self.total_time
        return math.inf if t <= 0 else self.size / t


class CandidateSet:
    """Algorithm B's bookkeeping on the Checkmate view (no simulation here)."""

    def __init__(self, view: CheckmateView):
        self.view = view
        act = set(view.activations)
        self.evicted: set[int] = {i for i in range(view.n) if view.forward[i] and i not in act}
        self.candidates: dict[int, Candidate] = {}
        self.recomps: dict[int, Candidate] = {}  # chosen for recomputation, in choice order
        self.swaps: list[int] = []
        for a in view.activations:
            srcs, path = self._closure(a)
            self.candidates[a] = Candidate(a, view.size[a], srcs, path, self._time(path))

    def _time(self, path: set[int]) -> float:
        return float(sum(self.view.time[i] for i in path))

    def _closure(self, a: int) -> tuple[set[int], set[int]]:
        """Sources and path of `a`: its predecessors, with the evicted ones spliced in."""
        srcs: set[int] = set()
        path = {a}
        stack = list(self.view.preds[a])
        while stack:
            p = stack.pop()
            if p in path or p in srcs:
                continue
            if p in self.evicted:
                path.add(p)
                stack.extend(self.view.preds[p])
            else:
                srcs.add(p)
        return srcs, path

    def _splice(self, c: Candidate, t: Candidate) -> None:
        c.srcs.discard(t.node)
        c.srcs |= t.srcs - c.path
        c.path |= t.path
        c.srcs -= c.path
        c.rp_time = self._time(c.path)

    def _recount(self) -> None:
        for c in self.candidates.values():
            c.n_dep = sum(1 for r in self.recomps.values() if c.node in r.srcs)

    def best_recompute(self) -> Candidate | None:
        if not self.candidates:
            return None
        return max(self.candidates.values(), key=lambda c: (c.ratio, c.size, -c.node))

    def best_swap(self) -> int | None:
        if not self.candidates:
            return None
        v = self.view
        return max(self.candidates, key=lambda a: (v.inactive_time(a), v.size[a], -a))

    def choose_recompute(self, a: int) -> Candidate:
        t = self.candidates.pop(a)
        for r in self.recomps.values():
            if a in r.srcs:
                self._splice(r, t)
        for c in self.candidates.values():
            if a in c.srcs:
                self._splice(c, t)
        self.recomps[a] = t
        self.evicted.add(a)
        self._recount()
        return t

    def choose_swap(self, a: int) -> None:
        # a swapped activation is back (prefetched) for the backward: it stays a source
        self.candidates.pop(a)
        self.swaps.append(a)


def swap_overhead(view: CheckmateView, a: int, bandwidth: float) -> float:
    transfer = view.size[a] / bandwidth
    return max(0.0, 2 * transfer - view.inactive_time(a))


# --- Checkmate view: the plan ------------------------------------------------------------
def checkmate_ops(view: CheckmateView, recompute: set[int], swap: AbstractSet[int] = frozenset(),
                  bandwidth: float | None = None) -> list[Op]:
    """The plan of a decision set, in Checkmate's stage space (see the module docstring)."""
    n = view.n
    names, preds = view.names, view.preds
    act = set(view.activations)
    # tensors dropped after their forward phase: evicted activations, swapped ones (until
    # their prefetch), and forward outputs that no backward reads
    dropped = {i for i in range(n) if view.forward[i] and (i not in act or i in recompute
                                                           or i in swap)}
    prefetch_at: dict[int, list[int]] = {}
    for a in sorted(swap):
        transfer = view.size[a] / bandwidth if bandwidth else 0.0
        k, lead = view.first_bwd_use[a], 0.0
        while k - 1 > view.last_fwd_use[a] and lead < transfer:
            k -= 1
            lead += view.time[k]
        prefetch_at.setdefault(k, []).append(a)
    # pass 1: the events (compute / offload / prefetch), with a residency policy
    events: list[tuple[str, int]] = []
    resident: set[int] = set()
    retained_until: dict[int, int] = {}  # recomputed activation -> last backward reader

    def ensure(x: int, burst: list[int]) -> None:
        if x in resident:
            return
        for p in preds[x]:
            ensure(p, burst)
        burst.append(x)
        resident.add(x)

    for j in range(n):
        for a in prefetch_at.get(j, ()):
            events.append(("prefetch", a))
            resident.add(a)
        if not view.forward[j]:
            burst: list[int] = []
            for p in preds[j]:
                ensure(p, burst)
            for x in burst:
                events.append(("compute", x))
            for x in burst:
                if x in preds[j] and view.last_bwd_use[x] > j:
                    retained_until[x] = view.last_bwd_use[x]
                elif x not in preds[j]:
                    resident.discard(x)  # an intermediate of the path: freed after it
        events.append(("compute", j))
        resident.add(j)
        for x in preds[j]:
            if x in dropped and view.forward[j] and view.last_fwd_use[x] == j:
                if x in swap:
                    events.append(("offload", x))
                resident.discard(x)
            if retained_until.get(x) == j or (x in dropped and not view.forward[j]
                                                and x not in retained_until):
                resident.discard(x)
                retained_until.pop(x, None)
        if j in dropped and view.last_fwd_use[j] == j:  # no forward reader
            if j in swap:
                events.append(("offload", j))
            resident.discard(j)
    # pass 2: liveness; each incarnation is deleted right after its last event
    delete_after: list[list[int]] = [[] for _ in events]
    last_evt: dict[int, int] = {}
    for e, (kind, x) in enumerate(events):
        if kind == "compute":
            for p in preds[x]:
                last_evt[p] = e
        if kind in ("compute", "prefetch"):
            if x in last_evt:
                delete_after[last_evt[x]].append(x)
            last_evt[x] = e
        else:  # offload: the device copy is freed after the transfer is issued
            last_evt[x] = e
    for x, e in last_evt.items():
        delete_after[e].append(x)
    ops: list[Op] = []
    for e, (kind, x) in enumerate(events):
        if kind == "compute":
            ops.append(Op("compute", node=names[x]))
        else:
            ops.append(Op(kind, data=names[x]))
        ops += [Op("delete", data=names[d]) for d in sorted(delete_after[e])]
    return ops


def replay_peak(view: CheckmateView, ops: list[Op]) -> tuple[int, float]:
    """Peak bytes and compute time of a Checkmate-view op list: the simulator's memory rules
    (a compute counts its new copy on top of what is live), plus ``prefetch`` (allocates its
    datum) and ``offload`` (no device memory). Assumes a valid plan; see `simulate`."""
    index = {name: i for i, name in enumerate(view.names)}
    live = bytearray(view.n)
    mem = peak = 0
    total = 0.0
    for op in ops:
        if op.op == "compute":
            i = index[op.required("node")]
            peak = max(peak, mem + view.size[i])
            if not live[i]:
                live[i] = 1
                mem += view.size[i]
            total += view.time[i]
        elif op.op == "prefetch":
            i = index[op.required("data")]
            if not live[i]:
                live[i] = 1
                mem += view.size[i]
                peak = max(peak, mem)
        elif op.op == "delete":
            i = index[op.required("data")]
            if live[i]:
                live[i] = 0
                mem -= view.size[i]
    return peak, total


# --- the greedy loop -----------------------------------------------------------------------
@dataclass
class Outcome:
    decisions: list[tuple[str, str]]  # every candidate unit, in graph order
    ops: list[Op]
    peak: int
    time: float
    base_peak: int
    base_time: float
    fits: bool | None
    steps: list[dict] = field(default_factory=list)
    swap_overhead: float = 0.0


def _mutwo_checkmate(graph: Graph, budget: int | None, bandwidth: float | None,
                     prune: bool = False) -> Outcome:
    view = checkmate_view(graph)
    cands = CandidateSet(view)
    recompute: set[int] = set()
    swap: set[int] = set()
    ops = checkmate_ops(view, recompute)
    peak, total = replay_peak(view, ops)
    base_peak, base_time = peak, total
    steps: list[dict] = []
    swap_time = 0.0
    best: tuple[int, list[Op], float, set[int], set[int], float] = (
        peak, ops, total, set(), set(), 0.0)
    while budget is not None and peak > budget and (r := cands.best_recompute()) is not None:
        step: dict = {}
        if bandwidth and (s := cands.best_swap()) is not None:
            s_over = swap_overhead(view, s, bandwidth)
            if s_over < r.total_time:
                cands.choose_swap(s)
                swap.add(s)
                swap_time += s_over
                step = {"activation": view.names[s], "decision": SWAP, "overhead": s_over,
                        "inactive_time": view.inactive_time(s)}
        if not step:
            cands.choose_recompute(r.node)
            recompute.add(r.node)
            step = {"activation": view.names[r.node], "decision": RECOMPUTE,
                    "ratio": r.ratio, "overhead": r.total_time,
                    "sources": sorted(view.names[i] for i in r.srcs)}
        ops = checkmate_ops(view, recompute, swap, bandwidth)
        peak, total = replay_peak(view, ops)
        step["peak"] = peak
        steps.append(step)
        if peak < best[0]:
            best = (peak, ops, total, set(recompute), set(swap), swap_time)
    if budget is not None and peak > budget:  # nothing fits: the lowest peak seen
        peak, ops, total, recompute, swap, swap_time = best
    elif prune and budget is not None:
        # not in Algorithm B: undo choices, latest first, that the fit does not need
        for step in reversed(steps):
            a = view.names.index(step["activation"])
            trial_r, trial_s = recompute - {a}, swap - {a}
            trial = checkmate_ops(view, trial_r, trial_s, bandwidth)
            t_peak, t_total = replay_peak(view, trial)
            if t_peak <= budget:
                if a in swap and bandwidth:  # swaps are chosen only with a bandwidth
                    swap_time -= swap_overhead(view, a, bandwidth)
                recompute, swap, ops, peak, total = trial_r, trial_s, trial, t_peak, t_total
                step["pruned"] = True
    decisions = [(view.names[a], SWAP if a in swap else RECOMPUTE if a in recompute else KEEP)
                 for a in view.activations]
    return Outcome(decisions, ops, peak, total, base_peak, base_time,
                   None if budget is None else peak <= budget, steps, swap_time)


# --- layered view ------------------------------------------------------------------------
def _layered_ops(graph: Graph, recompute: set[str]) -> list[Op]:
    layers = graph.layers
    roles = {d.name: d.role for d in graph.data}
    creators: dict[str, int] = {}
    steps: list[tuple[str, str | None, list[str], list[str]]] = []  # node, option, uses, creates
    for layer in layers:
        option = FAST_FORWARD if layer.name in recompute or not has_backward(layer) \
            else layer.options[0].name
        steps.append((fwd_name(layer.name), option, list(layer.inputs), list(layer.outputs)))
    if graph.loss is not None:
        steps.append(("loss", None, list(graph.loss.inputs), list(graph.loss.outputs)))
    for layer in reversed(layers):
        if not has_backward(layer):  # forward only: no phantom, nothing to recompute
            continue
        keep = layer.options[0]
        if layer.name in recompute:
            opt = refwd_option(layer)
            steps.append((fwd_name(layer.name), opt.name, list(layer.inputs),
                          list(layer.outputs)))
        else:
            opt = keep
        steps.append((bwd_name(layer.name), opt.name, list(layer.grad_inputs) + list(opt.needs),
                      list(layer.grad_outputs)))
    for layer in layers:
        for d in layer.outputs:
            creators[d] = creators.get(d, 0) + 1
        for d in layer.grad_outputs:
            creators[d] = creators.get(d, 0) + 2  # several contributions: never re-created
    delete_after: list[list[str]] = [[] for _ in steps]
    last_evt: dict[str, int] = {d.name: -1 for d in graph.data if d.role == "input"}
    before: list[str] = []
    for e, (_, _, uses, creates) in enumerate(steps):
        for d in uses:
            last_evt[d] = e
        for d in creates:
            if d in last_evt and creators.get(d) == 1 and roles.get(d) != "output":
                (delete_after[last_evt[d]] if last_evt[d] >= 0 else before).append(d)
            last_evt[d] = e
    for d, e in last_evt.items():
        if roles.get(d) != "output":
            (delete_after[e] if e >= 0 else before).append(d)
    ops = [Op("delete", data=d) for d in before]
    for e, (node, chosen, _, _) in enumerate(steps):
        ops.append(Op("compute", node=node, option=chosen))
        ops += [Op("delete", data=d) for d in delete_after[e]]
    return ops


def refwd_option(layer):
    """The option a recomputed layer re-runs its forward and backward with: the fastest."""
    return min(layer.options, key=lambda o: (o.fwd_time + o.bwd_time, o.phantom))


def layer_recompute_time(layer) -> float:
    keep, opt = layer.options[0], refwd_option(layer)
    ff = min(o.fwd_time for o in layer.options)
    return (ff - keep.fwd_time) + opt.fwd_time + (opt.bwd_time - keep.bwd_time)


def _mutwo_layered(graph: Graph, budget: int | None) -> Outcome:
    def measure(rec: set[str]) -> tuple[list[Op], int, float]:
        ops = _layered_ops(graph, rec)
        res = simulate(Plan(graph=graph.name, ops=ops), graph, budget=10**30, save_budget=10**30)
        if not res.valid:  # a bug, not a data problem: the op list is built to replay
            raise DataError(f"mutwo: the layered plan does not replay: {res.errors[0]}",
                            graph.loc)
        return ops, res.peak_bytes, res.time

    recompute: set[str] = set()
    ops, peak, total = measure(recompute)
    base_peak, base_time = peak, total
    cands = {layer.name: layer for layer in graph.layers
             if has_backward(layer) and layer.options[0].phantom > 0}
    steps: list[dict] = []
    best: tuple[int, list[Op], float, set[str]] = (peak, ops, total, set())
    while budget is not None and peak > budget and cands:
        def ratio(name: str) -> float:
            t = layer_recompute_time(cands[name])
            return math.inf if t <= 0 else cands[name].options[0].phantom / t
        name = max(cands, key=lambda x: (ratio(x), cands[x].options[0].phantom))
        r = ratio(name)
        layer = cands.pop(name)
        recompute.add(name)
        ops, peak, total = measure(recompute)
        steps.append({"activation": name, "decision": RECOMPUTE, "ratio": r,
                      "overhead": layer_recompute_time(layer), "peak": peak})
        if peak < best[0]:
            best = (peak, ops, total, set(recompute))
    if budget is not None and peak > budget:
        peak, ops, total, recompute = best
    decisions = [(layer.name, RECOMPUTE if layer.name in recompute else KEEP)
                 for layer in graph.layers]
    return Outcome(decisions, ops, peak, total, base_peak, base_time,
                   None if budget is None else peak <= budget, steps)


# --- API -----------------------------------------------------------------------------------
def mutwo(graph: Graph, budget: int | None = None, bandwidth: float | None = None,
          prune: bool = False) -> Outcome:
    """Run Algorithm B; `budget` in bytes (None: keep everything), `bandwidth` in bytes per
    time unit of the graph (None: no swapping). `prune` (not in the paper; Checkmate view):
    once the peak fits, undo the choices, latest first, that the fit does not need."""
    if bandwidth is not None and not bandwidth > 0:
        raise DataError(f"mutwo: bandwidth must be positive, not {bandwidth!r}")
    if graph.is_layered:
        return _mutwo_layered(graph, budget)
    return _mutwo_checkmate(graph, budget, bandwidth, prune)


def mutwo_plan(graph: Graph, budget: int | None = None, bandwidth: float | None = None,
               prune: bool = False) -> Plan:
    out = mutwo(graph, budget, bandwidth, prune)
    swaps = sum(1 for _, d in out.decisions if d == SWAP)
    meta: dict[str, object] = {
        "planner": "mutwo",
        "decisions": [list(row) for row in out.decisions],
        "fits": out.fits,
        "no_recompute_peak": out.base_peak,
        "steps": out.steps,
    }
    if swaps:
        meta["swap_overhead"] = out.swap_overhead
        meta["note"] = ("the plan swaps (offload/prefetch ops), which the simulator does not "
                        "replay yet")
    return Plan(graph=graph.name, ops=out.ops, budget_peak=budget, predicted_peak=out.peak,
                predicted_time=out.time, meta=meta)


def mutwo_table(graph: Graph, budget: int | None = None, bandwidth: float | None = None,
                prune: bool = False) -> list[tuple[str, str]]:
    """(activation, keep | recompute | swap) for every activation (layer, on layered data)."""
    return mutwo(graph, budget, bandwidth, prune).decisions


def format_table(rows: list[tuple[str, str]] | list[list[str]]) -> str:
    """The decisions as CSV text: a header ``activation,decision`` and one row per unit."""
    def cell(s: str) -> str:
        return '"' + s.replace('"', '""') + '"' if any(c in s for c in ',"\n') else s
    return "activation,decision\n" + "".join(f"{cell(a)},{d}\n" for a, d in rows)


PLANNERS = {
    "mutwo": Planner(
        name="mutwo",
        description="μ-TWO Algorithm B: greedy recompute (and swap, given a bandwidth) by "
                    "memory saved / recompute time until the simulated peak fits",
        run=mutwo_plan,
    ),
}

__all__ = ["PLANNERS", "mutwo", "mutwo_plan", "mutwo_table", "format_table", "Candidate",
           "CandidateSet", "checkmate_view", "checkmate_ops", "replay_peak", "swap_overhead",
           "KEEP", "RECOMPUTE", "SWAP"]
