"""Recomputation in the gaps between reads: a greedy planner for Checkmate-view graphs.

The nodes are first computed in a fixed order (the graph's, or another topological order such
as the shift scheduler's). Each output is alive from its computation to its last read; where
the memory profile goes over the budget, the planner cuts an output's life between two of its
reads (or its computation and its first read) that enclose over-budget positions: the output
is deleted after the earlier read and computed again right before the later one. A node
computed again needs its inputs there: each cut is tried both ways, the inputs not alive at that
point kept alive until then (their lives extended), or computed again there with their own
missing ancestors up to the nearest alive ones (a chain of at most `CHAIN_LIMIT` nodes). A
chain's nodes live only within the position: each is deleted as soon as the last computation
there that reads it is done, so a chain holds at most its own working set at once (not the sum
of its outputs): long chains cost little memory, which is how the parameter gradients of an op
graph are computed again late (the `tiny` GPT op graph fits 60% of its plain peak this way;
with every chain node counted until the position's end, the greedy stopped at 75%).

Each step takes the cut that removes the most excess memory (bytes over the budget, summed
over positions) per unit of recomputation time; when the profile fits, cuts that are no longer
needed are undone, most expensive first. The profile counts, at each position, every copy
alive there (the recomputations before the position's node included) plus the most its chain
nodes hold at once, which bounds the
simulator's peak from above: the plan fits whenever the profile does.

On Moccasin's `random_layered_n1000` in the shift order this fits 90% of the plain peak at
+0.15% time over computing every node once (`planners.portfolio`'s `best` tries it after the
shift reordering alone is over the budget).
"""
from __future__ import annotations

from itertools import pairwise

import numpy as np

from ...graphs.graph import Graph
from ...language.errors import DataError
from ..plan import Op, Plan
from . import Planner
from .shift import shift_schedule

#: at most this many cuts (the greedy's steps)
MAX_CUTS = 20_000
#: a cut may compute again at most this many missing ancestors of the node it cuts (40: the
#: `tiny` op graph fits 60% from 40 on, not at 20; no slower on the 1,000-node graphs)
CHAIN_LIMIT = 40


class _Lives:
    """The copies of every output as position segments [start, end], and the reads."""

    def __init__(self, graph: Graph, order: list[str]):
        self.order = order
        self.n = len(order)
        self.pos = {v: i for i, v in enumerate(order)}
        if len(self.pos) != len(graph.nodes) or set(self.pos) != {x.name for x in graph.nodes}:
            raise DataError("planner 'recompute_gaps': the order must list every node once")
        self.size = {x.name: int(x.size) for x in graph.nodes}
        self.time = {x.name: float(x.time) for x in graph.nodes}
        self.preds: dict[str, list[str]] = {v: [] for v in order}
        self.reads: dict[str, list[int]] = {v: [] for v in order}
        for u, v in graph.edges:
            if self.pos[u] >= self.pos[v]:
                raise DataError(f"planner 'recompute_gaps': the order puts {v} before its "
                                f"input {u}")
            self.preds[v].append(u)
            self.reads[u].append(self.pos[v])
        for v in order:
            self.reads[v] = sorted(set(self.reads[v]))
        self.segments = {v: [(self.pos[v], self.reads[v][-1] if self.reads[v] else self.pos[v])]
                         for v in order}
        self.recomputed: dict[int, list[str]] = {}  # position -> outputs computed before it
        # position -> the ancestors computed there for a cut (a chain), each deleted once the
        # last recomputation there that reads it is done: alive within the position only
        self.chained: dict[int, list[str]] = {}

    def profile(self) -> np.ndarray:
        delta = np.zeros(self.n + 1)
        for u, segs in self.segments.items():
            for a, b in segs:
                delta[a] += self.size[u]
                delta[b + 1] -= self.size[u]
        prof = np.cumsum(delta)[: self.n]
        for p in self.chained:
            prof[p] += self.chain_peak(p)
        return prof

    def alive_at(self, u: str, p: int) -> bool:
        return any(a <= p <= b for a, b in self.segments[u]) or u in self.chained.get(p, ())

    def recompute_sequence(self, p: int, chain: tuple[str, ...] = (),
                           u: str | None = None) -> list[tuple[str, list]]:
        """The computations before position p's node, in the order, each with the chain nodes
        deleted right after it (those no later computation there reads); with `chain` and `u`,
        as if a cut recomputing u with that chain were added."""
        extra = [*chain, u] if u is not None else list(chain)
        # once each (a chain node may later be cut itself, recomputed at p for a read there)
        seq = sorted(set(self.recomputed.get(p, []) + extra), key=self.pos.__getitem__)
        # a chain node whose own copy starts at p lives by its segment, not deleted here
        chained = {q for q in set(self.chained.get(p, ())) | set(chain)
                   if not any(a <= p <= b for a, b in self.segments[q])}
        last = {}
        for i, x in enumerate(seq):
            for q in self.preds[x]:
                if q in chained:
                    last[q] = i
        out: list[tuple[str, list[str]]] = [(x, []) for x in seq]
        for q, i in last.items():
            out[i][1].append(q)
        # a chain node no recomputation reads (none today) goes right after its computation
        for i, x in enumerate(seq):
            if x in chained and x not in last:
                out[i][1].append(x)
        return out

    def chain_peak(self, p: int, chain: tuple[str, ...] = (), u: str | None = None) -> int:
        """The most memory the chain nodes at p hold at once while its recomputations run
        (the outputs recomputed for a read, u of a cut, are in the segments); with `chain` and
        `u`, as if that cut were added."""
        chained = set(self.chained.get(p, ())) | set(chain)
        live = peak = 0
        for x, deleted in self.recompute_sequence(p, chain, u):
            if x in chained:
                live += self.size[x]
                peak = max(peak, live)
            live -= sum(self.size[q] for q in deleted)
        return peak

    def last_end_before(self, u: str, p: int) -> int:
        return max(b for a, b in self.segments[u] if b < p)

    def cuts(self, over_prefix: np.ndarray):
        """(u, a, b): u alive over [a, b] in one copy, read (or computed) at a and read at b,
        with an over-budget position strictly between them."""
        for u in self.order:
            for s, e in self.segments[u]:
                points = [s] + [r for r in self.reads[u] if s < r <= e]
                for a, b in pairwise(points):
                    if b - a >= 2 and over_prefix[b] - over_prefix[a + 1] > 0:
                        yield u, a, b

    def chain(self, u: str, b: int, limit: int) -> tuple[str, ...] | None:
        """The ancestors of u not alive at b that computing u at b needs computed there too
        (up to the nearest alive ones), in the order; None when there are more than `limit`."""
        need: set[str] = set()
        todo = [q for q in self.preds[u] if not self.alive_at(q, b)]
        while todo:
            q = todo.pop()
            if q in need:
                continue
            need.add(q)
            if len(need) > limit:
                return None
            todo += [r for r in self.preds[q] if r not in need and not self.alive_at(r, b)]
        return tuple(sorted(need, key=self.pos.__getitem__))

    def cut(self, u: str, a: int, b: int, chain: tuple[str, ...] = ()) -> None:
        """Apply a cut: u deleted after a and computed again before b, with `chain` (its
        missing ancestors) computed there first; without a chain, u's missing inputs are kept
        alive until b."""
        segs = []
        for s, e in self.segments[u]:
            segs += [(s, a), (b, e)] if s <= a and b <= e else [(s, e)]
        self.segments[u] = segs
        if chain:
            self.chained.setdefault(b, []).extend(chain)
        # an input still missing (none when the chain was found on this state; some when cuts
        # are replayed without one before it) is kept alive until b
        for q in {q for x in (*chain, u) for q in self.preds[x]}:
            if not self.alive_at(q, b):
                end = self.last_end_before(q, b)
                self.segments[q] = [(s, b if e == end else e) for s, e in self.segments[q]]
        for x in (*chain, u):
            for q in self.preds[x]:
                if b not in self.reads[q]:
                    self.reads[q] = sorted(self.reads[q] + [b])
        self.recomputed.setdefault(b, []).extend((*chain, u))

    def plan(self, name: str) -> Plan:
        ends: dict[int, list[str]] = {}
        for u, segs in self.segments.items():
            for _, e in segs:
                ends.setdefault(e, []).append(u)
        ops = []
        for p, v in enumerate(self.order):
            for u, deleted in self.recompute_sequence(p):
                ops.append(Op("compute", node=u))
                ops += [Op("delete", data=q) for q in deleted]
            ops.append(Op("compute", node=v))
            for u in sorted(ends.get(p, []), key=self.pos.__getitem__):
                ops.append(Op("delete", data=u))
        total = sum(self.time.values()) + sum(self.time[u] for us in self.recomputed.values()
                                              for u in us)
        return Plan(graph=name, ops=ops, predicted_peak=int(self.profile().max()),
                    predicted_time=total, meta={"planner": "recompute_gaps"})


def _excess(profile: np.ndarray, budget: int) -> float:
    return float(np.maximum(profile - budget, 0.0).sum())


def _best_cut(lives: _Lives, prof: np.ndarray, budget: int, chain_limit: int):
    """The cut with the most excess removed per second of recomputation, as the arguments of
    `_Lives.cut`, or None. Each cut is tried both ways: u's missing inputs kept alive until
    the later read, or computed again there with their missing ancestors (a chain of at most
    `chain_limit` nodes, alive at that position only)."""
    over = prof > budget
    over_prefix = np.concatenate([[0], np.cumsum(over)])
    best = None
    for u, a, b in lives.cuts(over_prefix):
        missing = [q for q in lives.preds[u] if not lives.alive_at(q, b)]
        ways = [()]
        if missing and chain_limit:
            chain = lives.chain(u, b, chain_limit)
            if chain is not None:
                ways.append(chain)
        for chain in ways:
            lo = a + 1
            changes = [(a + 1, b, -lives.size[u])]
            if chain:  # the chain's nodes, each deleted once the recomputations there read it
                changes.append((b, b + 1, lives.chain_peak(b, chain, u) - lives.chain_peak(b)))
            else:
                for q in missing:
                    end = lives.last_end_before(q, b)
                    changes.append((end + 1, b + 1, lives.size[q]))
                    lo = min(lo, end + 1)
            window = prof[lo:b + 1].copy()
            for x, y, d in changes:
                window[x - lo:y - lo] += d
            gain = _excess(prof[lo:b + 1], budget) - _excess(window, budget)
            if gain <= 0:
                continue
            cost = lives.time[u] + sum(lives.time[q] for q in chain)
            score = (cost / gain, -gain)
            if best is None or score < best[0]:
                best = (score, (u, a, b, chain))
    return None if best is None else best[1]


def _with_cuts(graph: Graph, order: list[str], cuts: list) -> _Lives:
    lives = _Lives(graph, order)
    for cut in cuts:
        lives.cut(*cut)
    return lives


def _undo_unneeded(graph: Graph, order: list[str], budget: int, cuts: list) -> _Lives:
    """The cuts without those that are no longer needed, most expensive tried first (each
    trial replays the cuts from scratch: a cut's extensions depend on the cuts before it)."""
    kept = list(cuts)
    times = {x.name: float(x.time) for x in graph.nodes}
    for cut in sorted(cuts, key=lambda c: -times[c[0]]):
        trial = [c for c in kept if c is not cut]
        if _with_cuts(graph, order, trial).profile().max() <= budget:
            kept = trial
    return _with_cuts(graph, order, kept)


def plan_recompute_gaps(graph: Graph, budget: int | None = None, order=None,
                        max_cuts: int = MAX_CUTS, chain_limit: int = CHAIN_LIMIT,
                        time_limit: float | None = None) -> Plan:
    """The greedy of the module docstring, in `order` (node names; default the graph's); it
    stops cutting after `time_limit` seconds (the plan may then be over the budget)."""
    import time

    stop = None if time_limit is None else time.monotonic() + time_limit
    order = list(order) if order is not None else [x.name for x in graph.nodes]
    lives = _Lives(graph, order)
    cuts: list = []
    if budget is not None:
        prof = lives.profile()
        while prof.max() > budget and len(cuts) < max_cuts and (
                stop is None or time.monotonic() < stop):
            found = _best_cut(lives, prof, budget, chain_limit)
            if found is None:
                break  # no cut lowers the excess: the plan stays over the budget
            lives.cut(*found)
            cuts.append(found)
            prof = lives.profile()
        if prof.max() <= budget and cuts:
            lives = _undo_unneeded(graph, order, budget, cuts)
    plan = lives.plan(graph.name)
    plan.meta["cuts"] = sum(len(us) for us in lives.recomputed.values())
    return plan


def _run(graph: Graph, budget: int | None = None, **options) -> Plan:
    unknown = sorted(set(options) - {"order", "max_cuts", "chain_limit", "time_limit"})
    if unknown:
        raise DataError(f"planner 'recompute_gaps': unknown option(s) {', '.join(unknown)} "
                        f"(options: order, max_cuts, chain_limit, time_limit)")
    return plan_recompute_gaps(graph, budget, **options)


def _run_shift(graph: Graph, budget: int | None = None, **options) -> Plan:
    plan = plan_recompute_gaps(graph, budget, order=shift_schedule(graph), **options)
    plan.meta["planner"] = "recompute_gaps_shift"
    return plan


PLANNERS = {
    "recompute_gaps": Planner(
        "recompute_gaps", "greedy: delete an output between two reads where the peak is over "
        "the budget and compute it again before the second read", _run, views=("checkmate",)),
    "recompute_gaps_shift": Planner(
        "recompute_gaps_shift", "recompute_gaps in the shift scheduler's node order",
        _run_shift, views=("checkmate",)),
}
