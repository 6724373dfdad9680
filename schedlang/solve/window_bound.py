"""A lower bound on the Checkmate stage model's optimum from the memory at a few computations.

Checkmate's LP relaxation is weak on op graphs: fractional keeps share the budget between
plans that each fit at different moments, and its bound stays near the sum of the node times.
This bound looks at the moments themselves. In the stage model (`models/checkmate.sched`) node
b is computed for the first time at the end of stage b, so at that moment P_b the nodes before
b have all been computed and none after it. Whatever the plan, at P_b

* the outputs in memory, K, with b's output, fit the budget, and b's inputs are in K;
* every output v < b read by a node computed for the first time in a window (P_b, P_c] (the
  readers w with b < w <= c) is in K, or computed again inside the window, before its reader;
* each such recomputation has its inputs in K or computed again in the window too.

So the least time of the recomputations inside the window is at least the optimum of a small
knapsack-with-closure problem over the nodes before b: choose K (bytes <= budget - size(b))
and the recomputed set A (K and A cover the outputs read in the window; A's inputs lie in K or
A), minimize the time of A. Windows of different points do not overlap, so along a chain of
points b1 < b2 < ... < bk the windows' least times add up (the last window is open to the end),
and the sum of the node times plus the best chain's total is a lower bound of every plan of the
stage model (a longest path over the chosen points: `window_bound`).

Each window problem is a MILP of 2b binaries solved by HiGHS (`scipy.optimize.milp`); its
proven dual bound is what is added, so a window stopped early still gives a valid figure. The
points are the `POINTS` computations whose window to the end has the largest LP value.
The bound is for the stage model's node order (plans that reorder nodes may be faster).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .binary_rows import SparseRows, least_recomputation

#: how many computations the chain of windows chooses from (the largest LP values)
POINTS = 20
#: how many computations, those with the most bytes over the budget without recomputation,
#: get their LP value computed (the others' windows need no recomputation, or less)
SCREENED = 3 * POINTS
#: seconds one window's MILP may take (its dual bound is used when it stops early)
WINDOW_SECONDS = 5.0


@dataclass
class WindowBound:
    bound: float  # the sum of the node times plus `extra`
    extra: float  # the least recomputation time proven along `chain`
    chain: list[str]  # the points (nodes) whose windows add up to `extra`
    seconds: float
    complete: bool  # False when the time limit stopped the search over chains early

    def describe(self) -> str:
        return (f"memory at the first computation of {', '.join(self.chain) or 'no node'}: "
                f"at least {self.extra:.6g} of recomputation")


class StageView:
    """The stage model's view: nodes in order, inputs and readers as indices."""

    def __init__(self, graph):
        self.names = [n.name for n in graph.nodes]
        index = {x: i for i, x in enumerate(self.names)}
        self.cost = np.array([float(n.time) for n in graph.nodes])
        self.size = np.array([float(n.size) for n in graph.nodes])
        self.inputs: list[list[int]] = [[] for _ in self.names]
        self.readers: list[list[int]] = [[] for _ in self.names]
        self.ordered = True
        for u, v in graph.edges:
            iu, iv = index[u], index[v]
            self.ordered &= iu < iv
            self.inputs[iv].append(iu)
            self.readers[iu].append(iv)

    def over_budget(self, budget: float) -> tuple[np.ndarray, np.ndarray]:
        """(bytes over `budget` at each P_b if nothing were recomputed: the outputs before b
        read by b or after it, and b's, less the budget; the same for b's working set alone,
        its inputs and output)."""
        n = len(self.names)
        last = np.array([max(r, default=-1) for r in self.readers])
        index = np.arange(n)
        excess = np.empty(n)
        working = np.empty(n)
        for b in range(n):
            inputs = list(self.inputs[b])
            crossing = (index < b) & (last > b)
            crossing[inputs] = True
            excess[b] = self.size[crossing].sum() + self.size[b] - budget
            working[b] = self.size[sorted(set(inputs))].sum() + self.size[b] - budget
        return excess, working

    def window(self, b: int, end: int, budget: float, integral: bool,
               seconds: float = WINDOW_SECONDS) -> float:
        """The least recomputation time in the window (P_b, P_end] (module docstring): the
        MILP's proven dual bound (stopped after `seconds`), or its LP value when not
        `integral`; inf when b's inputs and output alone exceed the budget."""
        n = b
        read = {v for v in range(b) if any(b < w <= end for w in self.readers[v])}
        read.update(self.inputs[b])
        rows = SparseRows()
        rows.add([(v, float(self.size[v])) for v in range(n)], -np.inf,
                 budget - self.size[b])  # the bytes of K <= budget - size(b)
        for v in sorted(read):  # k_v + a_v >= 1
            rows.add([(v, 1.0), (n + v, 1.0)], 1.0, np.inf)
        for v in range(n):  # a_v <= k_u + a_u for each input u of v
            for u in self.inputs[v]:
                rows.add([(n + v, 1.0), (u, -1.0), (n + u, -1.0)], -np.inf, 0.0)
        lower, upper = np.zeros(2 * n), np.ones(2 * n)
        for u in self.inputs[b]:  # b's inputs are in memory, not recomputed after P_b
            lower[u], upper[n + u] = 1.0, 0.0
        cost = np.concatenate([np.zeros(n), self.cost[:n]])
        found = least_recomputation(cost, rows, lower, upper, integral, seconds)
        return float("inf") if found is None else found[0]  # None: not even b's working set fits


def window_bound(graph, budget: float | None, time_limit: float | None = None,
                 points: int = POINTS) -> WindowBound | None:
    """The lower bound of the module docstring for `graph` (node/edge data, the stage model's
    order) at the peak budget `budget` bytes; None when it does not apply (layered data, no
    budget, negative times, edges against the node order) or when a point's working set
    alone exceeds the budget (the solvers prove that)."""
    if graph is None or graph.is_layered or not graph.nodes or budget is None:
        return None
    t0 = time.monotonic()
    deadline = None if time_limit is None else t0 + time_limit
    g = StageView(graph)
    if not g.ordered or (g.cost < 0).any():
        return None
    n = len(g.names)
    total = float(g.cost.sum())
    excess, working = g.over_budget(float(budget))
    if (working > 0).any():
        return None

    def seconds() -> float:
        return WINDOW_SECONDS if deadline is None else \
            min(WINDOW_SECONDS, deadline - time.monotonic())

    # a point whose outputs fit without recomputation has windows that need none
    screened = sorted((b for b in range(1, n) if excess[b] > 0), key=lambda b: -excess[b])
    lp = []
    complete = True
    for b in screened[:SCREENED]:
        if deadline is not None and time.monotonic() > deadline:
            complete = False
            break
        lp.append((g.window(b, n, float(budget), integral=False), b))
    chosen = sorted(b for value, b in sorted(lp, reverse=True)[:points] if value > 0)
    # longest chain from each point: best[b] = (extra, chain); windows to the end first
    best: dict[int, tuple[float, list[int]]] = {}
    for i in reversed(range(len(chosen))):
        if deadline is not None and time.monotonic() > deadline:
            complete = False
            break
        b = chosen[i]
        to_end = g.window(b, n, float(budget), integral=True, seconds=seconds())
        here = (to_end, [b])
        for c in chosen[i + 1:]:
            if deadline is not None and time.monotonic() > deadline:
                complete = False
                break
            after, chain = best[c]
            if to_end + after <= here[0]:  # the window (b, c] is at most the window to the end
                continue
            value = g.window(b, c, float(budget), integral=True, seconds=seconds()) + after
            if value > here[0]:
                here = (value, [b, *chain])
        best[b] = here
    extra, chain = max(best.values(), default=(0.0, []))
    return WindowBound(total + extra, extra, [g.names[b] for b in chain],
                       time.monotonic() - t0, complete)
