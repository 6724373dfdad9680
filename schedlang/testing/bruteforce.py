"""Exact optimum of the Checkmate stage model by enumeration (a test oracle for tiny graphs).

The space (Jain et al., MLSys 2020): stage t = 0..n-1 (node order) computes node t plus any
subset of the nodes v < t (recomputations), in node order within the stage. Memory is managed
eagerly, which is optimal once the compute sequence is fixed: after each compute, every output
in memory whose next event is not a use (it is recomputed first, or never used again) is
deleted, the just-computed output included. The peak is the maximum over computes of the bytes
in memory with the new output added and the inputs still counted.

`best_checkmate_schedule` returns the least total compute time among schedules whose peak fits
the budget, and a plan (compute and delete ops) that reaches it. `best_sequence_schedule` does
the same over every sequence of at most T computations in any order (the plan space of
`models/sequence.sched`: first computations in any topological order, not the node list's).

Everything is bitmasks over at most 6 nodes: a sequence is checked in a few microseconds, and
the depth-first search over stages prunes on time (subsets are tried cheapest first, against the
best time found) and on memory (the peak of a prefix, managed as if the sequence ended there,
is a lower bound of the peak of every completion).
"""
from __future__ import annotations

import math

from schedlang.graphs.graph import Graph
from schedlang.plans.plan import Op, Plan

MAX_NODES = 6


class _Model:
    def __init__(self, graph: Graph):
        n = len(graph.nodes)
        if n > MAX_NODES:
            raise ValueError(f"brute force is for graphs of at most {MAX_NODES} nodes, not {n}")
        self.names = [node.name for node in graph.nodes]
        index = {name: i for i, name in enumerate(self.names)}
        self.n = n
        self.size = [int(node.size) for node in graph.nodes]
        self.time = [float(node.time) for node in graph.nodes]
        self.pred_mask = [0] * n
        for u, v in graph.edges:
            iu, iv = index[u], index[v]
            if iu >= iv:
                raise ValueError(f"nodes are not in topological order (edge {u} -> {v})")
            self.pred_mask[iv] |= 1 << iu
        # bytes of every set of outputs
        self.mask_bytes = [0] * (1 << n)
        for mask in range(1, 1 << n):
            low = mask & -mask
            self.mask_bytes[mask] = self.mask_bytes[mask ^ low] + self.size[low.bit_length() - 1]

    def keep_masks(self, seq: list[int]) -> list[int]:
        """keep[p]: outputs whose next event after position p is a use (not a recompute)."""
        keep = [0] * len(seq)
        needed = 0
        pred_mask = self.pred_mask
        for p in range(len(seq) - 1, -1, -1):
            keep[p] = needed
            v = seq[p]
            needed = (needed & ~(1 << v)) | pred_mask[v]
        return keep

    def peak(self, seq: list[int]) -> int | None:
        """Peak bytes of `seq` under eager memory management; None if a compute lacks an input
        (cannot happen for stage sequences, kept as a guard)."""
        keep = self.keep_masks(seq)
        mask_bytes, pred_mask, size = self.mask_bytes, self.pred_mask, self.size
        live = 0
        peak = 0
        for p, v in enumerate(seq):
            if pred_mask[v] & ~live:
                return None
            bit = 1 << v
            used = mask_bytes[live | bit] + (size[v] if live & bit else 0)
            if used > peak:
                peak = used
            live = (live | bit) & keep[p]
        return peak

    def plan_ops(self, seq: list[int]) -> list[Op]:
        keep = self.keep_masks(seq)
        ops: list[Op] = []
        live = 0
        for p, v in enumerate(seq):
            ops.append(Op("compute", node=self.names[v]))
            live |= 1 << v
            dead = live & ~keep[p]
            for x in range(self.n):
                if dead >> x & 1:
                    ops.append(Op("delete", data=self.names[x]))
            live &= keep[p]
        return ops


def best_checkmate_schedule(graph: Graph, budget: int) -> tuple[float | None, Plan | None]:
    """(least total time, its plan) over Checkmate stage schedules with peak <= budget;
    (None, None) when no schedule fits."""
    model = _Model(graph)
    n = model.n
    # recomputation choices per stage: (extra time, nodes in order), cheapest first
    choices: list[list[tuple[float, list[int]]]] = []
    for t in range(n):
        options = []
        for mask in range(1 << t):
            members = [v for v in range(t) if mask >> v & 1]
            options.append((sum(model.time[v] for v in members), members))
        options.sort(key=lambda o: (o[0], len(o[1]), o[1]))
        choices.append(options)
    # time of the mandatory computes of stages t.. n-1
    base_after = [0.0] * (n + 1)
    for t in range(n - 1, -1, -1):
        base_after[t] = base_after[t + 1] + model.time[t]

    best_time = math.inf
    best_seq: list[int] | None = None

    def search(t: int, seq: list[int], spent: float) -> None:
        nonlocal best_time, best_seq
        if t == n:
            peak = model.peak(seq)
            if peak is not None and peak <= budget and spent < best_time:
                best_time, best_seq = spent, list(seq)
            return
        for extra, members in choices[t]:
            if spent + extra + base_after[t] >= best_time:
                break  # sorted by cost: no later choice can do better
            stage_seq = seq + members + [t]
            low = model.peak(stage_seq)  # lower bound of every completion's peak
            if low is None or low > budget:
                continue
            search(t + 1, stage_seq, spent + extra + model.time[t])

    search(0, [], 0.0)
    return _found(graph, model, budget, best_seq, best_time, "bruteforce")


def _found(graph: Graph, model: _Model, budget: int, best_seq: list[int] | None,
           best_time: float, planner: str) -> tuple[float | None, Plan | None]:
    """(the search's least time, its sequence as a plan), or (None, None) when nothing fit."""
    if best_seq is None:
        return None, None
    plan = Plan(graph=graph.name, ops=model.plan_ops(best_seq), budget_peak=budget,
                predicted_peak=model.peak(best_seq), predicted_time=best_time,
                meta={"planner": planner})
    return best_time, plan


def best_sequence_schedule(graph: Graph, budget: int,
                           max_computations: int) -> tuple[float | None, Plan | None]:
    """(least total time, its plan) over every sequence of at most `max_computations`
    computations, in any order (the plan space of `models/sequence.sched`), that computes every
    node at least once with its inputs in memory and peaks within `budget` under eager memory
    management; (None, None) when none does. Depth-first over sequences, pruned on time and on
    the peak of the prefix (a lower bound of every completion's)."""
    model = _Model(graph)
    n = model.n
    everything = (1 << n) - 1
    best_time = math.inf
    best_seq: list[int] | None = None

    def search(seq: list[int], done: int, spent: float) -> None:
        nonlocal best_time, best_seq
        if done == everything:
            if spent < best_time:
                best_time, best_seq = spent, list(seq)
            return  # (a longer sequence only adds time)
        missing = sum(model.time[v] for v in range(n) if not done >> v & 1)
        if len(seq) == max_computations or spent + missing >= best_time:
            return
        for v in range(n):
            if model.pred_mask[v] & ~done:
                continue  # an input never computed yet
            seq.append(v)
            low = model.peak(seq)
            if low is not None and low <= budget:
                search(seq, done | 1 << v, spent + model.time[v])
            seq.pop()

    search([], 0, 0.0)
    return _found(graph, model, budget, best_seq, best_time, "bruteforce (any order)")


def assert_oracle_optimum(result, best: float | None, where: str = "", rel: float = 1e-6) -> bool:
    """A solve's result against an oracle's optimum `best` (None: no plan fits): infeasible
    exactly when the oracle found nothing, else optimal with the oracle's objective. Returns
    whether there is a plan to check further."""
    if best is None:
        assert result.status.value == "infeasible", f"{where}: oracle infeasible, solver {result.status}: " \
            f"{result.message}"
        return False
    assert result.status.value == "optimal", f"{where}: oracle {best}, solver {result.status}: {result.message}"
    assert math.isclose(result.objective, best, rel_tol=rel, abs_tol=1e-12), \
        f"{where}: solver {result.objective} != oracle {best}"
    return True
