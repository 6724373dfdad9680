"""The independent simulator: replay a plan on a graph, check it, measure peak memory and time.

Nothing here reads solver variables or formulation code: the simulator knows only the graph
(nodes, sizes, times, edges) and the op list, so it is the referee for every decoder and
heuristic planner.

Memory model (Checkmate view: each node produces one output, named like the node):

* ``compute(node)`` needs the output of every predecessor in memory. It adds the node's output;
  the peak is taken right then, with the inputs and the new output both counted. Computing an
  output that is already in memory counts the new copy too (the peak sees both), then the old
  copy is released.
* ``delete(data)`` needs the data in memory and frees it.
* time is the sum of the compute times; memory starts empty.
* at the end every node must have been computed at least once.
* with a peak budget (the plan's, else the graph's), the plan is valid only if peak <= budget.

Op indices in messages are 0-based positions in the plan's op list (``op 12`` is ``ops[12]``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .errors import DataError, Loc, did_you_mean
from .graph import Graph
from .plan import OP_KINDS, Op, Plan

#: at most this many replay errors are listed; the rest are counted
MAX_ERRORS = 50


@dataclass
class SimResult:
    valid: bool
    peak_bytes: int
    time: float
    errors: list[str]
    fits_budget: bool | None
    warnings: list[str] = field(default_factory=list)
    budget_bytes: int | None = None  # the peak budget the plan was checked against
    computes: int = 0  # compute ops replayed

    def to_json(self) -> dict:
        return {
            "valid": self.valid,
            "peak_bytes": self.peak_bytes,
            "time": self.time,
            "fits_budget": self.fits_budget,
            "budget_bytes": self.budget_bytes,
            "errors": list(self.errors),
            "warnings": list(self.warnings),
        }


class _Errors:
    """An error list that keeps the first `MAX_ERRORS` messages and counts the rest."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self.dropped = 0

    @property
    def full(self) -> bool:
        return len(self.items) >= MAX_ERRORS

    def add(self, message: str, always: bool = False) -> None:
        if always or len(self.items) < MAX_ERRORS:
            self.items.append(message)
        else:
            self.dropped += 1

    def finish(self) -> list[str]:
        out = list(self.items)
        if self.dropped:
            out.insert(MAX_ERRORS, f"... and {self.dropped} more errors")
        return out


@dataclass
class _Arrays:
    names: list[str]
    index: dict[str, int]
    size: list[int]
    time: list[float]
    preds: list[tuple[int, ...]]  # deduplicated, in node order
    succs: list[tuple[int, ...]]


def _arrays(graph: Graph) -> _Arrays:
    """Index the Checkmate view; raise `DataError` when it is inconsistent."""
    names = [n.name for n in graph.nodes]
    index: dict[str, int] = {}
    for i, name in enumerate(names):
        if name in index:
            raise DataError(f"graph '{graph.name}' has two nodes named '{name}'", graph.loc)
        index[name] = i
    preds: list[set[int]] = [set() for _ in names]
    succs: list[set[int]] = [set() for _ in names]
    for u, v in graph.edges:
        iu, iv = index.get(u), index.get(v)
        if iu is None or iv is None:
            missing = u if iu is None else v
            raise DataError(f"graph '{graph.name}': edge {u} -> {v} names an unknown node "
                            f"'{missing}'", graph.loc)
        preds[iv].add(iu)
        succs[iu].add(iv)
    return _Arrays(
        names=names,
        index=index,
        size=[int(n.size) for n in graph.nodes],
        time=[float(n.time) for n in graph.nodes],
        preds=[tuple(sorted(p)) for p in preds],
        succs=[tuple(sorted(s)) for s in succs],
    )


def _replay(plan: Plan, graph: Graph, arr: _Arrays, errors: _Errors) -> tuple[int, float, int]:
    """Replay the ops; returns (peak bytes, time, compute count) and fills `errors`."""
    names, index, size, ntime, preds = arr.names, arr.index, arr.size, arr.time, arr.preds
    n = len(names)
    live = bytearray(n)
    computed = bytearray(n)
    deleted_at = [-1] * n  # op index of the latest delete, for messages
    live_bytes = 0
    peak = 0
    total_time = 0.0
    computes = 0

    def whereabouts(i: int) -> str:
        if not computed[i]:
            return "never computed before"
        return f"deleted by op {deleted_at[i]}"

    for k, op in enumerate(plan.ops):
        kind = op.op
        if kind == "compute":
            name = op.node
            i = index.get(name) if name is not None else None
            if i is None:
                if name is None:
                    errors.add(f"op {k}: compute op names no node")
                else:
                    hint = _hint(name, index, errors)
                    errors.add(f"op {k}: compute of unknown node {name!r}{hint}")
                continue
            if op.option is not None:
                errors.add(f"op {k}: compute {name!r} with option {op.option!r}, but node "
                           f"{name!r} has a single way to run (omit 'option')")
            for p in preds[i]:
                if not live[p]:
                    errors.add(f"op {k}: compute {name!r} needs {names[p]!r}, which is not in "
                               f"memory ({whereabouts(p)})")
            with_output = live_bytes + size[i]
            if with_output > peak:
                peak = with_output
            if not live[i]:
                live[i] = 1
                live_bytes = with_output
            # else: the old copy is released once the new one exists; live bytes unchanged
            computed[i] = 1
            total_time += ntime[i]
            computes += 1
        elif kind == "delete":
            name = op.data
            i = index.get(name) if name is not None else None
            if i is None:
                if name is None:
                    errors.add(f"op {k}: delete op names no data")
                else:
                    hint = _hint(name, index, errors)
                    errors.add(f"op {k}: delete of unknown data {name!r}{hint}")
                continue
            if not live[i]:
                errors.add(f"op {k}: delete {name!r}, which is not in memory ({whereabouts(i)})")
                continue
            live[i] = 0
            live_bytes -= size[i]
            deleted_at[i] = k
        elif kind in OP_KINDS:
            errors.add(f"op {k}: {kind} ops are not supported for this graph "
                       f"(graph '{graph.name}' has no layers, phantoms or offload channels)")
        else:
            errors.add(f"op {k}: unknown op kind {kind!r}")

    never = [names[i] for i in range(n) if not computed[i]]
    if never:
        shown = ", ".join(repr(x) for x in never[:10])
        more = f" and {len(never) - 10} more" if len(never) > 10 else ""
        noun = "node is" if len(never) == 1 else "nodes are"
        errors.add(f"{len(never)} {noun} never computed: {shown}{more}", always=True)
    return peak, total_time, computes


def _hint(name: str, index: dict[str, int], errors: _Errors) -> str:
    # did_you_mean is cheap for a few listed errors on graphs of a few hundred nodes
    if errors.full or len(index) > 5000:
        return ""
    return did_you_mean(name, index)


def simulate(plan: Plan, graph: Graph, *, budget: int | None = None) -> SimResult:
    """Replay `plan` on `graph`: validity, peak memory (bytes) and total compute time.

    The peak budget checked is `budget` when given, else the plan's, else the graph's
    (``graph.budgets["peak"]``); with none, `fits_budget` is None.
    """
    errors = _Errors()
    warnings: list[str] = []
    if plan.graph and graph.name and plan.graph != graph.name:
        warnings.append(f"the plan was made for graph '{plan.graph}', not '{graph.name}'")

    if not graph.nodes and (graph.layers or graph.data):
        errors.add(f"simulating layered graphs (graph '{graph.name}' has layers and data "
                   "nodes, no compute nodes) is not supported yet")
        return SimResult(False, 0, 0.0, errors.finish(), None, warnings)
    try:
        arr = _arrays(graph)
    except DataError as exc:
        errors.add(exc.message)
        return SimResult(False, 0, 0.0, errors.finish(), None, warnings)

    peak, total_time, computes = _replay(plan, graph, arr, errors)

    if budget is None:
        budget = plan.budget_peak if plan.budget_peak is not None else graph.budgets.get("peak")
    fits: bool | None = None
    if budget is not None:
        fits = peak <= budget
        if not fits:
            errors.add(f"peak memory {peak} B exceeds the peak budget {budget} B "
                       f"by {peak - budget} B", always=True)

    if plan.predicted_peak is not None and int(round(plan.predicted_peak)) != peak:
        warnings.append(f"predicted peak {plan.predicted_peak} B, simulated {peak} B")
    if plan.predicted_time is not None and not _close(plan.predicted_time, total_time):
        warnings.append(f"predicted time {plan.predicted_time}, simulated {total_time}")

    found = errors.finish()
    return SimResult(valid=not found, peak_bytes=peak, time=total_time, errors=found,
                     fits_budget=fits, warnings=warnings, budget_bytes=budget,
                     computes=computes)


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


def no_recompute_plan(graph: Graph) -> Plan:
    """Compute every node once in topological order; free each output after its last use.

    An output is deleted right after its last consumer ran; a node without consumers is
    deleted right after it is computed. Raises `DataError` when the graph's node list is not
    in topological order.
    """
    arr = _arrays(graph)
    names = arr.names
    for i, s in enumerate(arr.succs):
        for j in s:
            if j <= i:
                raise DataError(f"graph '{graph.name}': nodes are not in topological order "
                                f"(edge {names[i]} -> {names[j]})", graph.loc or Loc(graph.name))
    # the last consumer of each output (position in node order)
    freed_after: list[list[int]] = [[] for _ in names]
    for i, s in enumerate(arr.succs):
        freed_after[s[-1] if s else i].append(i)
    ops: list[Op] = []
    live = 0
    peak = 0
    total = 0.0
    for i, name in enumerate(names):
        ops.append(Op("compute", node=name))
        live += arr.size[i]
        peak = max(peak, live)
        total += arr.time[i]
        for j in sorted(freed_after[i]):
            ops.append(Op("delete", data=names[j]))
            live -= arr.size[j]
    return Plan(graph=graph.name, ops=ops, predicted_peak=peak, predicted_time=total,
                meta={"planner": "no_recompute"})


def no_recompute_peak(graph: Graph) -> int:
    """Simulated peak of `no_recompute_plan(graph)`: the reference for budget fractions."""
    plan = no_recompute_plan(graph)
    errors = _Errors()
    peak, _, _ = _replay(plan, graph, _arrays(graph), errors)
    if errors.items:  # cannot happen for a topologically ordered graph
        raise DataError(f"graph '{graph.name}': the no-recomputation plan does not replay: "
                        f"{errors.items[0]}", graph.loc)
    return peak
