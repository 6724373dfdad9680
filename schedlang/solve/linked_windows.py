"""The window bound with its windows linked: one MILP over the memory at several computations.

`schedlang.solve.window_bound` bounds each window (P_b, P_c] on its own, from the memory at P_b
alone (the moment the stage model computes node b for the first time), and adds the windows
of a chain. Here the memory at every chosen point p_1 < ... < p_k is a set of binaries K_i,
and what is in memory at P_{p_i} was in memory at P_{p_(i-1)} or computed again in the window
between, so a plan that keeps an output in one window pays for it in the memory of the next.
For each window i, (P_{p_i}, P_{p_(i+1)}] (the last one open to the end), with A_i the outputs
computed again inside it:

* the outputs in K_i, with p_i's, fit the budget; p_i's inputs are in K_i;
* an output v <= p_i read by a node first computed in the window is in K_i or in A_i;
* an output in A_i has its inputs (those <= p_i) in K_i or in A_i;
* an output v < p_i in K_i was in K_(i-1) or in A_(i-1) (or v = p_(i-1); outputs first
  computed inside the window before are free: a relaxation).

Every plan of the stage model gives such sets with at least sum_i time(A_i) of recomputation
(the windows are disjoint), so the least of it, plus the node times, is a lower bound of the
stage model's optimum in the graph's node order. Solved to the end it is at least the chain's
bound over the same points (a solution here gives each window of a chain a solution that costs
no more), but it takes seconds to a minute where the chain takes one, and its points are fewer:
the default solve takes the larger of the two. CP-SAT solves it where installed, HiGHS (through
`scipy.optimize.milp`) otherwise (`schedlang.solve.binary_rows`: CP-SAT closes the 12 points of
the 124-node GPT at 60% in about 20 s where HiGHS takes a minute to minutes), with dominance
rows that leave out needless recomputations and keeps (`_needless`); the proven dual bound is
what is used when it stops early.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .binary_rows import SparseRows, least_recomputation
from .window_bound import StageView

#: how many points (computations) the linked MILP takes: those with the largest LP values
POINTS = 12


@dataclass
class LinkedBound:
    bound: float  # the sum of the node times plus `extra`
    extra: float  # the least recomputation time over the linked windows (a proven bound)
    points: list[str]
    seconds: float
    closed: bool  # whether the solver closed the MILP (else `extra` is its dual bound)

    def describe(self) -> str:
        return (f"memory at the first computations of {len(self.points)} nodes, linked: "
                f"at least {self.extra:.6g} of recomputation"
                + ("" if self.closed else " (the MILP's dual bound, stopped early)"))


def linked_bound(g: StageView, points: list[int], budget: float,
                 seconds: float, solver: str = "cpsat") -> tuple[float, bool] | None:
    """(the least recomputation time over the linked windows of `points` (sorted indices of
    `g`'s nodes), whether the solver closed it) within `seconds`; None when infeasible (a point's
    inputs and output alone exceed the budget)."""
    n = len(g.names)
    ends = [*points[1:], n - 1]
    keep: list[dict[int, int]] = []  # point i: node -> column of k_{i,v}
    redo: list[dict[int, int]] = []  # point i: node -> column of a_{i,v}
    columns = 0
    for p in points:
        keep.append({v: columns + v for v in range(p + 1)})
        columns += p + 1
        redo.append({v: columns + v for v in range(p)})
        columns += p
    rows = SparseRows()
    lower, upper = np.zeros(columns), np.ones(columns)
    cost = np.zeros(columns)
    reads: list[set[int]] = []
    for i, p in enumerate(points):
        k, a = keep[i], redo[i]
        lower[k[p]] = 1.0
        for u in g.inputs[p]:
            lower[k[u]] = 1.0
        rows.add([(k[v], g.size[v]) for v in range(p + 1)], -np.inf, budget)
        read = {v for v in range(p) if any(p < w <= ends[i] for w in g.readers[v])}
        for v in sorted(read):
            rows.add([(k[v], 1.0), (a[v], 1.0)], 1.0, np.inf)
        for v in range(p):
            cost[a[v]] = g.cost[v]
            for u in g.inputs[v]:  # (u < v <= p: every input is in the model's past)
                rows.add([(a[v], 1.0), (k[u], -1.0), *([(a[u], -1.0)] if u < p else [])],
                         -np.inf, 0.0)
        if i > 0:
            q = points[i - 1]
            for v in range(q):  # present at p_i, computed before p_(i-1): kept or redone
                rows.add([(k[v], 1.0), (keep[i - 1][v], -1.0), (redo[i - 1][v], -1.0)],
                         -np.inf, 0.0)
        reads.append(read)
    _needless(g, points, keep, redo, reads, rows)
    return least_recomputation(cost, rows, lower, upper, True, seconds, solver)


def _needless(g: StageView, points: list[int], keep: list[dict[int, int]],
              redo: list[dict[int, int]], reads: list[set[int]], rows: SparseRows) -> None:
    """Dominance rows: an output not read in window i by a first computation is recomputed
    (a_{i,v}) or kept (k_{i,v}) at point i only when a recomputation of the window reads it or
    it is kept to the next point. Dropping such a recomputation or keep breaks no row and
    costs nothing (repeated until none is left), so the least cost is unchanged; the solver
    no longer searches among the needless ones (CP-SAT's bound on the 124-node GPT at 60% with
    20 points: 0.012965 after 60 s with them, 0.012797 without)."""
    for i, p in enumerate(points):
        k, a = keep[i], redo[i]
        after = keep[i + 1] if i + 1 < len(points) else {}
        for v in range(p):
            if v in reads[i]:
                continue
            used = [(a[r], -1.0) for r in g.readers[v] if r < p]
            if v in after:
                used.append((after[v], -1.0))
            rows.add([(a[v], 1.0), *used], -np.inf, 0.0)
            if v not in g.inputs[p]:
                rows.add([(k[v], 1.0), *used], -np.inf, 0.0)


def linked_window_bound(graph, budget: float | None, time_limit: float = 30.0,
                        points: int = POINTS, solver: str = "cpsat") -> LinkedBound | None:
    """The bound of the module docstring over the `points` computations with the largest LP
    windows (`window_bound`'s screening), or None where `window_bound` gives none. `solver`:
    "cpsat" (HiGHS where OR-Tools is missing) or "highs"."""
    if graph is None or graph.is_layered or not graph.nodes or budget is None:
        return None
    t0 = time.monotonic()
    g = StageView(graph)
    if not g.ordered or (g.cost < 0).any():
        return None
    excess, working = g.over_budget(float(budget))
    if (working > 0).any():
        return None
    n = len(g.names)
    screened = sorted((b for b in range(1, n) if excess[b] > 0), key=lambda b: -excess[b])
    lp = [(g.window(b, n - 1, float(budget), integral=False), b) for b in screened[:3 * points]]
    chosen = sorted(b for value, b in sorted(lp, reverse=True)[:points] if value > 0)
    total = float(g.cost.sum())
    if not chosen:
        return LinkedBound(total, 0.0, [], time.monotonic() - t0, True)
    left = max(0.1, time_limit - (time.monotonic() - t0))
    found = linked_bound(g, chosen, float(budget), left, solver)
    if found is None:
        return None
    extra, closed = found
    return LinkedBound(total + extra, extra, [g.names[b] for b in chosen],
                       time.monotonic() - t0, closed)
