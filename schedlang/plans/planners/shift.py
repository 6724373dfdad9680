"""The shift scheduler: reorder a DAG of ops to minimise sum-liveness (poprithms schedule::shift).

The problem (seed ``003_*``)
----------------------------
A DAG of *ops* and a list of *allocations*; each allocation has a size and the set of ops that
require it. A schedule is a topological order of the ops. An allocation is live from the first
op of the schedule that requires it to the last one, both included, so its *duration* is
``last - first + 1`` schedule steps. Then

* sum-liveness = Σ over allocations of ``size * duration`` — equivalently Σ over schedule steps
  of the bytes live at that step; this is the objective;
* max-liveness = max over schedule steps ``t`` of Σ of the sizes of the allocations with
  ``first <= t <= last`` — reported, not optimised directly.

A Checkmate-style `Graph` maps onto this with one allocation per node: the node's output, of
``node.size`` bytes, required by the node and by each of its consumers. With that mapping the
max-liveness of an order is exactly the simulated peak of the no-recomputation plan in that
order (compute, then free each output after its last use), which is what planner ``shift``
emits.

The algorithm
-------------
1. An initial schedule by Kahn's algorithm with the *greedy* tie-breaker: among the ready ops
   pick the one whose scheduling changes the live bytes the least (allocations it opens minus
   allocations it closes, i.e. for which it is the last outstanding op); ties go to the op that
   became ready last (the ready list is a stack). ``initial="fifo"`` (plain Kahn, ties to the
   lowest op index), ``"random"`` (seeded) or an explicit order are also accepted.
2. Rotations: a rotation ``(a, b, c)`` swaps the adjacent sub-schedules ``[a, b)`` and
   ``[b, c)``. At ladder rung ``n`` (an "n-shift") we take each block of ``n`` consecutive ops
   and look at every position it can move to, backwards (past ops ``[a, s)``) or forwards
   (past ops ``[s+n, c)``), as far as the topological constraints allow: a block cannot move
   back past a producer of one of its ops, nor forwards past a consumer. Only moves over at
   least ``n`` ops are new at rung ``n`` (a move over ``d < n`` ops is a ``d``-shift of the
   other sub-schedule, seen at rung ``d``). The best move of the block is applied when it
   reduces sum-liveness (as poprithms does; the seed's pseudo-code takes the first reducing
   one). Blocks are visited in a seeded random order of their first op.
3. The n-shift ladder: rounds are repeated at rung ``n`` while they change the schedule. A
   round without change at a rung reached without any change since the last reset climbs to
   ``n + 1``; a round without change after changes at this rung goes back to rung 1. The
   search ends when a rung is reached, without changes since the last reset, at which no
   block can move over ``n`` ops (or at a rotation/time limit). So the final schedule is a
   local minimum for rotations of every size (when no limit stopped it).

Incremental costs
-----------------
The sum-liveness is never recomputed per candidate. For every allocation we keep the sorted
schedule positions of its ops; the duration after a rotation ``(a, b, c)`` follows from a few
bisections (the first/last position outside the window and in each of the two segments).
Moving a block one more step adds one op to the window, so for each block and direction the
costs of all distances are found in one sweep ("ripple"), touching only the allocations of the
block and of the op just passed. Applying a rotation updates only the allocations of the ops
in the window. `ShiftScheduler.rotation_delta` exposes the incremental cost, and
`sum_liveness_of` the from-scratch value, so tests can compare them.
"""
from __future__ import annotations

import random
import time as _time
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ...graphs.graph import Graph
from ...language.errors import DataError
from ..plan import Op, Plan
from . import Planner

__all__ = ["Dag", "ShiftScheduler", "ShiftStats", "shift_schedule", "reorder", "shift_plan",
           "sum_liveness_of", "max_liveness_of", "dag_from_graph", "PLANNERS"]


# --- the generic problem --------------------------------------------------------------------
@dataclass
class Dag:
    """A small DAG spec: op names, edges (producer, consumer) and allocations.

    ``allocs`` is a list of ``(size, ops)``: an allocation of ``size`` bytes required by each
    op named in ``ops``. Build one from names with `Dag.build`.
    """

    ops: list[str]
    edges: list[tuple[int, int]] = field(default_factory=list)  # op indices
    allocs: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)

    @classmethod
    def build(cls, ops: Sequence[str], edges: Iterable[tuple[str, str]] = (),
              allocs: Iterable[tuple[int, Iterable[str]]] = ()) -> Dag:
        index: dict[str, int] = {}
        for i, name in enumerate(ops):
            if name in index:
                raise DataError(f"shift: two ops named {name!r}")
            index[name] = i

        def ix(name: str, what: str) -> int:
            try:
                return index[name]
            except KeyError:
                raise DataError(f"shift: {what} names an unknown op {name!r}") from None

        e = [(ix(u, "an edge"), ix(v, "an edge")) for u, v in edges]
        a = []
        for size, names in allocs:
            if size < 0:
                raise DataError(f"shift: allocation of negative size {size}")
            a.append((size, tuple(sorted({ix(x, "an allocation") for x in names}))))
        return cls(ops=list(ops), edges=e, allocs=a)


def dag_from_graph(graph: Graph) -> Dag:
    """The Checkmate view as a `Dag`: each node's output is an allocation of ``node.size``
    bytes, required by the node and its consumers."""
    if graph.is_layered:
        raise DataError(f"shift: graph '{graph.name}' is layered data; the shift scheduler "
                        "works on the Checkmate view (nodes and edges)", graph.loc)
    idx = graph.checkmate_index()
    allocs = [(idx.size[i], tuple(sorted({i, *idx.succs[i]}))) for i in range(idx.n)]
    return Dag(ops=list(idx.names), edges=list(idx.edges), allocs=allocs)


def _as_dag(obj: Any) -> Dag:
    if isinstance(obj, Dag):
        return obj
    if isinstance(obj, Graph):
        return dag_from_graph(obj)
    if isinstance(obj, Mapping):  # {"ops"/"nodes": [...], "edges": [...], "allocs": [...]}
        ops = obj.get("ops", obj.get("nodes"))
        if ops is None:
            raise DataError("shift: a DAG spec needs 'ops' (or 'nodes')")
        return Dag.build(list(ops), obj.get("edges", ()), obj.get("allocs", ()))
    raise DataError(f"shift: cannot schedule a {type(obj).__name__} (a Graph, a Dag or a "
                    "mapping with ops, edges and allocs)")


# --- liveness from scratch (the reference) ---------------------------------------------------
def _spans(dag: Dag, order: Sequence[int]) -> list[tuple[int, int] | None]:
    pos = [0] * len(dag.ops)
    for p, op in enumerate(order):
        pos[op] = p
    out: list[tuple[int, int] | None] = []
    for _, ops in dag.allocs:
        if ops:
            ps = [pos[o] for o in ops]
            out.append((min(ps), max(ps)))
        else:
            out.append(None)
    return out


def sum_liveness_of(dag: Dag, order: Sequence[int]) -> int:
    """Σ over allocations of size × (last − first + 1), computed from scratch."""
    total = 0
    for (size, _), span in zip(dag.allocs, _spans(dag, order)):
        if span is not None:
            total += size * (span[1] - span[0] + 1)
    return total


def liveness_profile(dag: Dag, order: Sequence[int]) -> list[int]:
    """Live bytes at each schedule step."""
    diff = [0] * (len(order) + 1)
    for (size, _), span in zip(dag.allocs, _spans(dag, order)):
        if span is not None:
            diff[span[0]] += size
            diff[span[1] + 1] -= size
    out, cur = [], 0
    for p in range(len(order)):
        cur += diff[p]
        out.append(cur)
    return out


def max_liveness_of(dag: Dag, order: Sequence[int]) -> int:
    return max(liveness_profile(dag, order), default=0)


def _check_order(dag: Dag, order: Sequence[int]) -> None:
    n = len(dag.ops)
    if sorted(order) != list(range(n)):
        raise DataError("shift: the initial order must hold every op exactly once")
    pos = [0] * n
    for p, op in enumerate(order):
        pos[op] = p
    for u, v in dag.edges:
        if pos[u] >= pos[v]:
            raise DataError(f"shift: the order is not topological (edge {dag.ops[u]} -> "
                            f"{dag.ops[v]})")


# --- initial schedules -----------------------------------------------------------------------
def _kahn(dag: Dag, preds: list[list[int]], succs: list[list[int]], op_allocs: list[list[int]],
          how: str, rng: random.Random) -> list[int]:
    n = len(dag.ops)
    waiting = [len(p) for p in preds]
    ready = [i for i in range(n) if waiting[i] == 0]
    outstanding = [len(ops) for _, ops in dag.allocs]
    live = [False] * len(dag.allocs)
    sizes = [s for s, _ in dag.allocs]
    order: list[int] = []
    while ready:
        if how == "greedy":
            best_k, best_delta = 0, None
            for k, op in enumerate(ready):
                delta = 0
                for a in op_allocs[op]:
                    if outstanding[a] == 1:
                        delta -= sizes[a]
                    if not live[a]:
                        delta += sizes[a]
                if best_delta is None or delta <= best_delta:  # ties: the latest ready op
                    best_k, best_delta = k, delta
            op = ready.pop(best_k)
        elif how == "random":
            op = ready.pop(rng.randrange(len(ready)))
        else:  # fifo: lowest index first
            k = min(range(len(ready)), key=ready.__getitem__)
            op = ready.pop(k)
        order.append(op)
        for a in op_allocs[op]:
            live[a] = True
            outstanding[a] -= 1
        for v in succs[op]:
            waiting[v] -= 1
            if waiting[v] == 0:
                ready.append(v)
    if len(order) != n:
        stuck = [dag.ops[i] for i in range(n) if waiting[i] > 0][:5]
        raise DataError(f"shift: the graph has a cycle (through {', '.join(stuck)})")
    return order


# --- the scheduler ---------------------------------------------------------------------------
@dataclass
class ShiftStats:
    initial_sum: int = 0
    final_sum: int = 0
    initial_max: int = 0
    final_max: int = 0
    rotations: int = 0  # applied
    candidates: int = 0  # block moves whose cost was evaluated
    rounds: int = 0
    max_rung: int = 1  # the largest n of an n-shift round
    seconds: float = 0.0
    stopped: str = "local minimum"  # or "rotation limit", "time limit"

    def to_json(self) -> dict:
        return dict(self.__dict__)


class ShiftScheduler:
    """The state of one scheduling: the order, positions and allocation spans.

    ``ShiftScheduler(dag, initial="greedy", seed=1)`` builds the initial order; `run` climbs
    the ladder; `order`/`names` give the result; `rotation_delta` and `apply_rotation` are
    the incremental primitives.
    """

    def __init__(self, dag_or_graph: Any, initial: str | Sequence[str] = "greedy",
                 seed: int = 1) -> None:
        dag = _as_dag(dag_or_graph)
        self.dag = dag
        n = len(dag.ops)
        self.n = n
        self.preds: list[list[int]] = [[] for _ in range(n)]
        self.succs: list[list[int]] = [[] for _ in range(n)]
        seen = set()
        for u, v in dag.edges:
            if u == v:
                raise DataError(f"shift: self-loop on {dag.ops[u]!r}")
            if (u, v) not in seen:
                seen.add((u, v))
                self.preds[v].append(u)
                self.succs[u].append(v)
        self.size = [s for s, _ in dag.allocs]
        self.alloc_ops = [tuple(ops) for _, ops in dag.allocs]
        self.op_allocs: list[list[int]] = [[] for _ in range(n)]
        for a, ops in enumerate(self.alloc_ops):
            for o in ops:
                self.op_allocs[o].append(a)
        self.rng = random.Random(seed)
        if isinstance(initial, str) and initial in ("greedy", "fifo", "random"):
            order = _kahn(dag, self.preds, self.succs, self.op_allocs, initial, self.rng)
        else:
            index = {name: i for i, name in enumerate(dag.ops)}
            try:
                order = [index[x] if isinstance(x, str) else int(x) for x in initial]
            except KeyError as exc:
                raise DataError(f"shift: initial order names an unknown op {exc.args[0]!r}") \
                    from None
            _check_order(dag, order)  # a topological order: the graph has no cycle
        self.sch: list[int] = list(order)
        self.pos: list[int] = [0] * n
        for p, op in enumerate(self.sch):
            self.pos[op] = p
        # sorted schedule positions of each allocation's ops
        self.P: list[list[int]] = [sorted(self.pos[o] for o in ops) for ops in self.alloc_ops]
        self.sum_live = sum(s * (P[-1] - P[0] + 1) for s, P in zip(self.size, self.P) if P)
        self.stats = ShiftStats(initial_sum=self.sum_live,
                                initial_max=max_liveness_of(dag, self.sch))

    # --- views ---------------------------------------------------------------------------
    @property
    def order(self) -> list[int]:
        return list(self.sch)

    @property
    def names(self) -> list[str]:
        return [self.dag.ops[i] for i in self.sch]

    def max_liveness(self) -> int:
        return max_liveness_of(self.dag, self.sch)

    # --- incremental costs ---------------------------------------------------------------
    def _span_change(self, alloc: int, a: int, b: int, c: int) -> int:
        """size × (new duration − old duration) of `alloc` under rotation (a, b, c)."""
        P = self.P[alloc]
        m = len(P)
        if not m or P[-1] < a or P[0] >= c:
            return 0
        i0 = bisect_left(P, a)
        i2 = bisect_left(P, c, i0)
        if i0 == i2:
            return 0
        i1 = bisect_left(P, b, i0, i2)
        left, right = b - a, c - b
        if i0 > 0:
            first = P[0]
        elif i1 < i2:
            first = P[i1] - left  # the second segment's first op comes first
        else:
            first = P[0] + right
        if i2 < m:
            last = P[-1]
        elif i0 < i1:
            last = P[i1 - 1] + right  # the first segment's last op ends the window
        else:
            last = P[i2 - 1] - left
        return self.size[alloc] * ((last - first) - (P[-1] - P[0]))

    def rotation_delta(self, a: int, b: int, c: int) -> int:
        """Change of sum-liveness if the sub-schedules [a, b) and [b, c) were swapped.

        Only the allocations of the ops in the window are looked at. Topological validity is
        not checked here (see `rotation_valid`)."""
        if not (0 <= a < b < c <= self.n):
            raise ValueError(f"bad rotation ({a}, {b}, {c}) for {self.n} ops")
        touched = set()
        for p in range(a, c):
            touched.update(self.op_allocs[self.sch[p]])
        return sum(self._span_change(x, a, b, c) for x in touched)

    def rotation_valid(self, a: int, b: int, c: int) -> bool:
        """No op of [a, b) produces an op of [b, c)."""
        for p in range(b, c):
            for u in self.preds[self.sch[p]]:
                if a <= self.pos[u] < b:
                    return False
        return True

    def apply_rotation(self, a: int, b: int, c: int, delta: int | None = None) -> None:
        sch, pos = self.sch, self.pos
        touched = set()
        for p in range(a, c):
            touched.update(self.op_allocs[sch[p]])
        if delta is None:
            delta = sum(self._span_change(x, a, b, c) for x in touched)
        sch[a:c] = sch[b:c] + sch[a:b]
        for p in range(a, c):
            pos[sch[p]] = p
        for x in touched:
            self.P[x] = sorted(pos[o] for o in self.alloc_ops[x])
        self.sum_live += delta
        self.stats.rotations += 1

    def _best_move(self, s: int, k: int) -> tuple[int, int, int, int] | None:
        """The best reducing move of block [s, s+k) over >= k ops: (delta, a, b, c)."""
        sch, pos = self.sch, self.pos
        block = sch[s:s + k]
        block_allocs: set[int] = set()
        for op in block:
            block_allocs.update(self.op_allocs[op])
        end = s + k
        # backwards: past ops [a, s); not past a producer of a block op
        lo = max((q for op in block for u in self.preds[op] if (q := pos[u]) < s), default=-1)
        # forwards: past ops [s+k, c); not past a consumer of a block op
        hi = min((q for op in block for v in self.succs[op] if (q := pos[v]) >= end),
                 default=self.n)
        best = None
        if s - lo - 1 >= k:
            backwards = ((sch[a], s - a, (a, s, end)) for a in range(s - 1, lo, -1))
            best = self._best_rotation(backwards, block_allocs, k, best)
        if hi - end >= k:
            forwards = ((sch[c - 1], c - end, (s, end, c)) for c in range(end + 1, hi + 1))
            best = self._best_rotation(forwards, block_allocs, k, best)
        return best

    def _best_rotation(self, rotations: Iterable[tuple[int, int, tuple[int, int, int]]],
                       block_allocs: set[int], k: int,
                       best: tuple[int, int, int, int] | None
                       ) -> tuple[int, int, int, int] | None:
        """Scan rotations (op passed, ops passed so far, (a, b, c)) in order of distance,
        keeping the running span change of the passed ops' allocations (each counted once, at
        its latest rotation); the best reducing one of >= k ops passed, or `best`."""
        span = self._span_change
        contrib: dict[int, int] = {}
        total = 0
        for passed, count, (a, b, c) in rotations:
            for al in self.op_allocs[passed]:
                if al not in block_allocs:
                    v = span(al, a, b, c)
                    total += v - contrib.get(al, 0)
                    contrib[al] = v
            if count >= k:
                self.stats.candidates += 1
                t = total + sum(span(al, a, b, c) for al in block_allocs)
                if t < 0 and (best is None or t < best[0]):
                    best = (t, a, b, c)
        return best

    def _room(self, s: int, k: int) -> int:
        """How many ops block [s, s+k) can move over, backwards or forwards (the larger)."""
        pos = self.pos
        block = self.sch[s:s + k]
        lo, hi = -1, self.n
        for op in block:
            for u in self.preds[op]:
                if lo < pos[u] < s:
                    lo = pos[u]
            for v in self.succs[op]:
                if s + k <= pos[v] < hi:
                    hi = pos[v]
        return max(s - lo - 1, hi - s - k)

    # --- the ladder ------------------------------------------------------------------------
    def run(self, max_rotations: int | None = None, time_limit: float | None = None,
            max_rung: int | None = None) -> ShiftScheduler:
        t0 = _time.perf_counter()
        n = self.n
        stats = self.stats
        visit = list(range(n))
        self.rng.shuffle(visit)
        rung = 1
        no_change_since_reset = True
        susceptible = [True] * n
        stop = None
        applied0 = stats.rotations
        while n > 1 and stop is None:
            stats.rounds += 1
            stats.max_rung = max(stats.max_rung, rung)
            current, susceptible = susceptible, [False] * n
            changes = 0
            for op0 in visit:
                s = self.pos[op0]
                if s > n - rung:
                    continue
                if not any(current[o] for o in self.sch[s:s + rung]):
                    continue
                move = self._best_move(s, rung)
                if move is None:
                    continue
                delta, a, b, c = move
                for p in range(a, c):  # ops whose neighbourhood changes
                    op = self.sch[p]
                    susceptible[op] = True
                    for al in self.op_allocs[op]:
                        for o in self.alloc_ops[al]:
                            susceptible[o] = True
                self.apply_rotation(a, b, c, delta)
                changes += 1
                if max_rotations is not None and stats.rotations - applied0 >= max_rotations:
                    stop = "rotation limit"
                    break
                if time_limit is not None and _time.perf_counter() - t0 > time_limit:
                    stop = "time limit"
                    break
            if stop is not None:
                break
            no_change_since_reset = no_change_since_reset and changes == 0
            if no_change_since_reset:
                rung += 1  # climb the ladder
                susceptible = [True] * n
                if rung > n // 2 or (max_rung is not None and rung > max_rung) or not any(
                        self._room(s, rung) >= rung for s in range(n - rung + 1)):
                    break
            elif changes == 0:
                rung = 1  # back to 1-shifts
                no_change_since_reset = True
                susceptible = [True] * n
            if time_limit is not None and _time.perf_counter() - t0 > time_limit:
                stop = "time limit"
        stats.stopped = stop or "local minimum"
        stats.final_sum = self.sum_live
        stats.final_max = self.max_liveness()
        stats.seconds += _time.perf_counter() - t0
        return self


def shift_schedule(graph_or_dag: Any, *, initial: str | Sequence[str] = "greedy", seed: int = 1,
                   max_rotations: int | None = None, time_limit: float | None = None,
                   max_rung: int | None = None, stats: dict | None = None) -> list[str]:
    """A topological order of the ops (node names) with locally minimal sum-liveness.

    `graph_or_dag`: a Checkmate-view `Graph`, a `Dag`, or a mapping ``{"ops": [...],
    "edges": [(u, v), ...], "allocs": [(size, [op, ...]), ...]}``. `initial`: ``"greedy"``
    (Kahn with the greedy tie-breaker), ``"fifo"``, ``"random"`` or a topological order of op
    names. Pass a dict as `stats` to receive the `ShiftStats` fields (sums, maxima, counts).
    """
    sched = ShiftScheduler(graph_or_dag, initial=initial, seed=seed)
    sched.run(max_rotations=max_rotations, time_limit=time_limit, max_rung=max_rung)
    if stats is not None:
        stats.update(sched.stats.to_json())
    return sched.names


def reorder(graph: Graph, **options) -> Graph:
    """A copy of a Checkmate-view graph with its nodes in the shift order (still topological),
    e.g. to choose the node order that the Checkmate ILP assumes."""
    order = shift_schedule(graph, **options)
    by_name = {n.name: n for n in graph.nodes}
    rank = {name: i for i, name in enumerate(order)}
    edges = sorted(graph.edges, key=lambda e: (rank[e[0]], rank[e[1]]))
    return replace(graph, nodes=[replace(by_name[x]) for x in order], edges=edges,
                   budgets=dict(graph.budgets))


def shift_plan(graph: Graph, order: Sequence[str] | None = None, **options) -> Plan:
    """The no-recomputation plan in `order` (default: the shift order): compute each node
    once, delete each output right after its last consumer (a node without consumers right
    after itself)."""
    stats: dict = {}
    if order is None:
        order = shift_schedule(graph, stats=stats, **options)
    dag = dag_from_graph(graph)
    index = {name: i for i, name in enumerate(dag.ops)}
    seq = [index[x] for x in order]
    _check_order(dag, seq)
    pos = [0] * len(seq)
    for p, i in enumerate(seq):
        pos[i] = p
    freed_after: list[list[int]] = [[] for _ in seq]
    for i, (_, ops) in enumerate(dag.allocs):
        freed_after[max(pos[o] for o in ops)].append(i)
    ops_out: list[Op] = []
    live = peak = 0
    total = 0.0
    for p, i in enumerate(seq):
        ops_out.append(Op("compute", node=dag.ops[i]))
        live += dag.allocs[i][0]
        peak = max(peak, live)
        total += float(graph.nodes[i].time)
        for j in sorted(freed_after[p], key=lambda j: pos[j]):
            ops_out.append(Op("delete", data=dag.ops[j]))
            live -= dag.allocs[j][0]
    meta: dict = {"planner": "shift"}
    if stats:
        meta["shift"] = {k: stats[k] for k in ("initial_sum", "final_sum", "initial_max",
                                               "final_max", "rotations", "rounds", "max_rung",
                                               "stopped")}
        meta["shift"]["seconds"] = round(stats["seconds"], 4)
    return Plan(graph=graph.name, ops=ops_out, predicted_peak=peak, predicted_time=total,
                meta=meta)


def _run_shift(graph: Graph, budget: int | None = None, **options) -> Plan:
    allowed = {"initial", "seed", "max_rotations", "time_limit", "max_rung"}
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise DataError(f"planner 'shift': unknown option(s) {', '.join(unknown)} (options: "
                        f"{', '.join(sorted(allowed))})")
    return shift_plan(graph, **options)


PLANNERS = {
    "shift": Planner(
        name="shift",
        description="poprithms shift scheduler: reorder to minimise sum-liveness, "
                    "no recomputation (ignores the budget)",
        run=_run_shift,
        views=("checkmate",),
    ),
}
