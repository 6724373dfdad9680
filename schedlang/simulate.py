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

Layered graphs (H-Rockmate view: ``data``, ``layer`` with options and phantoms, ``loss``) are
replayed on their H-graph (`schedlang.hgraph.build_hgraph`): compute nodes ``LAYER.fwd``,
``loss``, ``LAYER.bwd``. The formulations of this vocabulary are held to these rules:

* state: the set of live data; for a data node with several creators (gradient accumulation),
  the set of creators whose contribution it has received since it was last absent; for each
  layer, the phantom it has saved, if any, with its option (at most one option per layer).
* memory = sum of the sizes of live data (a data node counts once, however many contributions
  it holds) + the sizes of saved phantoms. Inputs (``role input``) are live at the start, and
  the peak starts at their total.
* ``compute(node, option)``: `option` names one of the node's options (a forward's options are
  its layer's plus ``fast_forward``; the loss takes none, or ``loss``); it may be omitted only
  on a node with a single option.

  - every datum the node uses must be live and complete (every creator has contributed); a
    backward run with option o also needs the data of o's ``needs`` (``option_uses``), and the
    phantom of its layer saved *with option o*.
  - a forward with option o != fast_forward saves the layer's phantom with option o. A
    phantom saved with another option makes the op invalid (only one phantom option per layer;
    drop it first); one saved with o is replaced: both copies count during the op, one after.
  - a backward consumes its layer's phantom: it is freed right after the backward.
  - the node adds its contribution to each datum it creates; the datum becomes live if it was
    not. Recomputing the only creator of a live datum replaces it (both copies count during the
    op, as for Checkmate); a contribution to a live datum with several creators is accumulated
    in place (no new bytes); adding the same creator's contribution twice to a live datum with
    several creators is invalid (the gradient would be accumulated twice).
  - peak at the op = memory before it + bytes of the data copies it creates + the phantom it
    saves + the option's overhead (transient: it is gone after the op); time += option's time.
    An option with a sub-step profile (``fwd_steps``/``bwd_steps``) has instead the largest of:
    the end state (memory before + new data + phantom, no overhead) and each step (memory
    before + phantom + the step's overhead + the new data created by that step - the inputs
    the step no longer needs *that the plan deletes right after this op*) — the H-Rockmate
    correction terms.
  - the loss is computed exactly once; a second computation is an error at that op.
* ``delete(data)``: the datum must be live; it disappears with all its contributions.
* ``drop_phantom(layer)``: the layer must have a saved phantom; it is freed.
* at the end: every compute node was computed at least once, every ``output`` datum is live
  and complete, and no phantom is saved.
* budgets: peak <= the peak budget (`budget`, else the plan's, else the graph's). Save budget
  (`save_budget`, else ``plan.budget_save``, else ``graph.budgets["save"]``): memory without
  transient overhead during the *loss phase* must stay within it. Phases come from the plan:
  phase t ends with the first computation of the t-th compute node in H-graph order, so the
  loss phase is the ops after the first computation of the last node before the loss in that
  order (for a plan out of H order: the latest first computation, before the loss, of a node
  that precedes the loss), up to the loss's computation. Memory is sampled after each compute
  of the phase together with the deletes and phantom drops that follow it (what the H-Rockmate
  ILP calls U[t, k]); the maximum is ``save_peak_bytes`` (None when the loss is never
  computed). ``fits_budget`` covers both budgets.

Transfers (layered graphs only; the Checkmate view reports them as unsupported). Three
channels: compute, offload (device -> host) and prefetch (host -> device). A tensor is a datum
(``data``) or a layer's saved phantom (``layer``); ``docs/plans.md`` has the full rules.

* time: compute ops run back to back (the current time advances by each compute's time). A
  transfer is issued at the current time, starts when its channel is free (transfers on one
  channel run one after the other, in issue order) and lasts fraction x bytes / bandwidth
  (``graph.bandwidths``; absent or 0: the transfer is an error; ``inf``: it takes no time).
  ``wait(channel[, x])`` moves the current time to the end of every transfer issued so far on
  the channel (of x only, when given). Every transfer must be waited by the end of the plan;
  the plan's time is the current time at its end.
* ``offload(x, fraction)``: x is on the device (a datum: live and complete; a phantom: saved),
  not pinned; its host copy grows by the fraction (at most 1 in all; it persists to the end,
  and is valid for the same value recomputed later; a phantom's host copy belongs to the
  option that saved it). Host memory = sum of host fractions x bytes, checked against the host
  budget (``host_budget``, else ``graph.budgets["host"]``) at each offload. Until the offload
  is waited, freeing x's device copy (delete, drop_phantom, a backward consuming the phantom,
  a recomputation replacing x) is an error.
* ``prefetch(x, fraction)``: the first prefetch of a round needs x off the device and
  allocates x's full size (counted in memory and the peak from then on, save window
  included). The fractions of a round must stay within the fraction of x whose offload has
  ended by the prefetch's issue time. A ``wait`` on the prefetch channel covering x when the
  round's fractions sum to 1 completes it: x is on the device again (a datum, complete; a
  phantom, saved with the option of its host copy). Using x, or creating it, while a round is
  in progress is an error, as is a round never completed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from .errors import DataError, Loc, did_you_mean
from .graph import Graph
from .hgraph import FAST_FORWARD, build_hgraph
from .plan import CHANNELS, OP_KINDS, Op, Plan, _a

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
    # layered graphs: the most memory during the loss phase (None: no loss phase, or a
    # Checkmate graph), and the save budget it was checked against
    save_peak_bytes: int | None = None
    save_budget_bytes: int | None = None
    # layered graphs: the most host memory the offloads use (bytes, rounded; 0 without
    # offloads; None on a Checkmate graph), the host budget checked, and the time the compute
    # channel spent in `wait` ops (included in `time`)
    host_peak_bytes: int | None = None
    host_budget_bytes: int | None = None
    wait_time: float = 0.0

    def to_json(self) -> dict:
        return {
            "valid": self.valid,
            "peak_bytes": self.peak_bytes,
            "time": self.time,
            "fits_budget": self.fits_budget,
            "budget_bytes": self.budget_bytes,
            "save_peak_bytes": self.save_peak_bytes,
            "save_budget_bytes": self.save_budget_bytes,
            "host_peak_bytes": self.host_peak_bytes,
            "host_budget_bytes": self.host_budget_bytes,
            "wait_time": self.wait_time,
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
    index = graph.node_positions()
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
            i = _resolve(k, "compute", name, index, "node", errors)
            if i is None:
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
            i = _resolve(k, "delete", name, index, "data", errors)
            if i is None:
                continue
            if not live[i]:
                errors.add(f"op {k}: delete {name!r}, which is not in memory ({whereabouts(i)})")
                continue
            live[i] = 0
            live_bytes -= size[i]
            deleted_at[i] = k
        elif kind in ("offload", "prefetch", "wait"):
            errors.add(f"op {k}: {kind} ops are not supported for this graph (graph "
                       f"'{graph.name}' is in the Checkmate view; transfers are replayed on "
                       "layered graphs only)")
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


def _resolve(k: int, op_kind: str, name, index: dict[str, int], what: str, errors: "_Errors"):
    """The index of the node/data/layer an op names, or None after recording why not."""
    i = index.get(name) if name is not None else None
    if i is None:
        if name is None:
            errors.add(f"op {k}: {op_kind} op names no {what}")
        else:
            errors.add(f"op {k}: {op_kind} of unknown {what} {name!r}{_hint(name, index, errors)}")
    return i


def _hint(name: str, index: dict[str, int], errors: _Errors) -> str:
    # did_you_mean is cheap for a few listed errors on graphs of a few hundred nodes
    if errors.full or len(index) > 5000:
        return ""
    return did_you_mean(name, index)


def simulate(plan: Plan, graph: Graph, *, budget: int | None = None,
             save_budget: int | None = None, host_budget: int | None = None) -> SimResult:
    """Replay `plan` on `graph`: validity, peak memory (bytes) and total time.

    The peak budget checked is `budget` when given, else the plan's, else the graph's
    (``graph.budgets["peak"]``); with none, `fits_budget` is None. On a layered graph the save
    budget is checked too (`save_budget`, else ``plan.budget_save``, else
    ``graph.budgets["save"]``) against the memory of the loss phase, and the host budget of the
    offloads (`host_budget`, else ``graph.budgets["host"]``; see the module docstring).
    """
    errors = _Errors()
    warnings: list[str] = []
    if plan.graph and graph.name and plan.graph != graph.name:
        warnings.append(f"the plan was made for graph '{plan.graph}', not '{graph.name}'")

    layered = _is_layered(graph)
    try:
        arrays: _Arrays | _HArrays = _harrays(graph) if layered else _arrays(graph)
    except DataError as exc:
        what = "this layered graph" if layered else "this graph"
        errors.add(f"cannot simulate {what}: {exc.message}")
        return SimResult(False, 0, 0.0, errors.finish(), None, warnings)

    save_peak: int | None = None
    save_at = -1
    host_peak: int | None = None
    host_over = False
    wait_time = 0.0
    if isinstance(arrays, _HArrays):
        if host_budget is None:
            host_budget = graph.budgets.get("host")
        out = _replay_layered(plan, arrays, errors, host_budget=host_budget)
        peak, total_time, computes = out.peak, out.time, out.computes
        save_peak, save_at = out.save_peak, out.save_at
        host_peak, host_over, wait_time = out.host_peak, out.host_over, out.wait_time
    else:
        host_budget = None
        peak, total_time, computes = _replay(plan, graph, arrays, errors)

    if budget is None:
        budget = plan.budget_peak if plan.budget_peak is not None else graph.budgets.get("peak")
    checks: list[bool] = []
    if budget is not None:
        checks.append(peak <= budget)
        if peak > budget:
            errors.add(f"peak memory {peak} B exceeds the peak budget {budget} B "
                       f"by {peak - budget} B", always=True)
    if layered:
        if save_budget is None:
            save_budget = plan.budget_save if plan.budget_save is not None \
                else graph.budgets.get("save")
        if save_budget is not None and save_peak is not None:
            checks.append(save_peak <= save_budget)
            if save_peak > save_budget:
                where = ("before its first op" if save_at < 0
                         else f"after op {save_at} and the frees that follow it")
                errors.add(f"memory during the loss phase reaches {save_peak} B ({where}), over "
                           f"the save budget {save_budget} B by {save_peak - save_budget} B",
                           always=True)
        if host_budget is not None:
            checks.append(not host_over)  # the excess is reported at the offload
    else:
        save_budget = None
    fits: bool | None = all(checks) if checks else None

    if plan.predicted_peak is not None and int(round(plan.predicted_peak)) != peak:
        warnings.append(f"predicted peak {plan.predicted_peak} B, simulated {peak} B")
    if plan.predicted_time is not None and not _close(plan.predicted_time, total_time):
        warnings.append(f"predicted time {plan.predicted_time}, simulated {total_time}")

    found = errors.finish()
    return SimResult(valid=not found, peak_bytes=peak, time=total_time, errors=found,
                     fits_budget=fits, warnings=warnings, budget_bytes=budget,
                     computes=computes, save_peak_bytes=save_peak,
                     save_budget_bytes=save_budget, host_peak_bytes=host_peak,
                     host_budget_bytes=host_budget, wait_time=wait_time)


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


def no_recompute_plan(graph: Graph) -> Plan:
    """Compute every node once in topological order; free each output after its last use.

    An output is deleted right after its last consumer ran; a node without consumers is
    deleted right after it is computed. Raises `DataError` when the graph's node list is not
    in topological order. A layered graph gets its autograd-like plan (`_no_recompute_layered`).
    """
    if _is_layered(graph):
        return _no_recompute_layered(graph)
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
    if _is_layered(graph):
        peak = _replay_layered(plan, _harrays(graph), errors).peak
    else:
        peak, _, _ = _replay(plan, graph, _arrays(graph), errors)
    if errors.items:  # cannot happen for a topologically ordered graph
        raise DataError(f"graph '{graph.name}': the no-recomputation plan does not replay: "
                        f"{errors.items[0]}", graph.loc)
    return peak


# --- layered graphs: the H-graph view ---------------------------------------------------------
def _is_layered(graph: Graph) -> bool:
    """A graph in the H-Rockmate vocabulary (layers, a loss, or data without compute nodes)."""
    return bool(graph.layers) or graph.loss is not None or (bool(graph.data) and not graph.nodes)


@dataclass
class _HArrays:
    """The H-graph of a layered graph, indexed for the replay."""

    graph_name: str
    names: list[str]  # compute nodes in H-graph order
    index: dict[str, int]
    kind: list[str]  # "fwd", "bwd", "loss"
    layer: list[int]  # layer index of each compute node, -1 for the loss
    opt_names: list[list[str]]
    opt_index: list[dict[str, int]]
    opt_time: list[list[float]]
    opt_overhead: list[list[int]]
    # per node and option: the sub-step profile, [(overhead, freed data, created data)]
    opt_steps: list[list[list[tuple[int, frozenset, frozenset]]]]
    opt_layer_opt: list[list[int]]  # the layer option of each node option (-1: fast_forward, loss)
    uses: list[tuple[int, ...]]  # data read whatever the option (deduplicated)
    opt_uses: list[list[tuple[int, ...]]]  # per option: data read in addition to `uses`
    creates: list[tuple[tuple[int, int], ...]]  # (datum, this creator's bit in the datum's mask)
    data: list[str]
    data_index: dict[str, int]
    size: list[int]
    full: list[int]  # every creator's bit; 0 for a datum nobody creates (inputs)
    creators: list[list[int]]  # compute nodes; creators[d][j] has bit 1 << j
    inputs: list[int]
    outputs: list[int]
    layers: list[str]
    layer_index: dict[str, int]
    layer_opts: list[list[str]]
    phantom: list[list[int]]  # bytes, per layer and layer option
    loss: int
    # transfers: "offload" / "prefetch" -> bytes per second (as the graph gives them), and
    # what may never be offloaded (per datum; per layer and layer option)
    bandwidth: dict = field(default_factory=dict)
    data_pinned: list[bool] = field(default_factory=list)
    opt_pinned: list[list[bool]] = field(default_factory=list)


def _harrays(graph: Graph) -> _HArrays:
    """Index the H-graph of `graph`; raise `DataError` when the layered data is inconsistent."""
    if graph.nodes and (graph.layers or graph.loss is not None):
        raise DataError(f"graph '{graph.name}' has both compute nodes (Checkmate view) and layers "
                        "or a loss (H-Rockmate view); a graph uses one vocabulary", graph.loc)
    for layer in graph.layers:
        if not layer.options:
            raise DataError(f"layer '{layer.name}' has no option", layer.loc or graph.loc)
    h = build_hgraph(graph)
    data = list(h.data)
    data_index = {d: i for i, d in enumerate(data)}
    names = [k.name for k in h.compute]
    index = {n: i for i, n in enumerate(names)}
    layers = [layer.name for layer in graph.layers]
    layer_index = {name: j for j, name in enumerate(layers)}
    layer_opts = [[o.name for o in layer.options] for layer in graph.layers]
    layer_opt_index = [{o: i for i, o in enumerate(opts)} for opts in layer_opts]
    pinned = {d.name: getattr(d, "pinned", False) for d in graph.data}

    uses: list[list[int]] = [[] for _ in names]
    for k, d in h.uses:
        i, di = index[k], data_index[d]
        if di not in uses[i]:
            uses[i].append(di)
    extra: dict[tuple[int, str], list[int]] = {}
    for k, o, d in h.option_uses:
        i, di = index[k], data_index[d]
        lst = extra.setdefault((i, o), [])
        if di not in uses[i] and di not in lst:
            lst.append(di)
    creators: list[list[int]] = [[] for _ in data]
    creates: list[list[tuple[int, int]]] = [[] for _ in names]
    for k, d in h.creates:
        i, di = index[k], data_index[d]
        if i not in creators[di]:
            creators[di].append(i)
            creates[i].append((di, 1 << (len(creators[di]) - 1)))

    kind, layer_of, opt_names, opt_index, opt_time, opt_overhead, opt_layer_opt, opt_uses = \
        [], [], [], [], [], [], [], []
    opt_steps: list = []
    for i, k in enumerate(h.compute):
        j = layer_index[k.layer] if k.layer is not None else -1
        kind.append(k.kind)
        layer_of.append(j)
        onames = [o.name for o in k.options]
        opt_names.append(onames)
        opt_index.append({o: n for n, o in enumerate(onames)})
        opt_time.append([float(o.time) for o in k.options])
        opt_overhead.append([int(o.overhead) for o in k.options])
        opt_steps.append([[(int(st.overhead), frozenset(data_index[d] for d in st.frees),
                            frozenset(data_index[d] for d in st.creates)) for st in o.steps]
                          for o in k.options])
        opt_layer_opt.append([layer_opt_index[j].get(o, -1) if j >= 0 and o != FAST_FORWARD else -1
                              for o in onames])
        opt_uses.append([tuple(extra.get((i, o), ())) for o in onames])
    return _HArrays(
        graph_name=graph.name, names=names, index=index, kind=kind, layer=layer_of,
        opt_names=opt_names, opt_index=opt_index, opt_time=opt_time, opt_overhead=opt_overhead,
        opt_steps=opt_steps,
        opt_layer_opt=opt_layer_opt, uses=[tuple(u) for u in uses], opt_uses=opt_uses,
        creates=[tuple(c) for c in creates], data=data, data_index=data_index,
        size=[int(h.data[d]) for d in data],
        full=[(1 << len(c)) - 1 for c in creators], creators=creators,
        inputs=[data_index[d] for d in h.inputs], outputs=[data_index[d] for d in h.outputs],
        layers=layers, layer_index=layer_index, layer_opts=layer_opts,
        phantom=[[int(h.phantoms[(name, o)]) for o in opts] for name, opts in zip(layers, layer_opts)],
        loss=index[h.loss] if h.loss is not None else -1,
        bandwidth=dict(graph.bandwidths),
        data_pinned=[bool(pinned.get(d, False)) for d in data],
        opt_pinned=[[bool(getattr(o, "pinned", False)) for o in layer.options]
                    for layer in graph.layers],
    )


@dataclass
class _LayeredReplay:
    peak: int
    time: float
    computes: int
    save_peak: int | None  # None: no loss phase
    save_at: int  # op index of the save peak, -1: before the loss phase's first op
    host_peak: int = 0  # bytes, rounded
    host_over: bool = False  # an offload went over the host budget
    wait_time: float = 0.0  # time the compute channel spent waiting for transfers


#: tolerance on sums of transfer fractions
_FRACTION_EPS = 1e-9


def _replay_layered(plan: Plan, ha: _HArrays, errors: _Errors,
                    host_budget: int | None = None) -> _LayeredReplay:
    """Replay the ops on the H-graph; fills `errors`."""
    names, index, kind, layer_of = ha.names, ha.index, ha.kind, ha.layer
    opt_index, opt_names, opt_time, opt_overhead = ha.opt_index, ha.opt_names, ha.opt_time, ha.opt_overhead
    opt_layer_opt, uses, opt_uses, creates = ha.opt_layer_opt, ha.uses, ha.opt_uses, ha.creates
    data, data_index, size, full, creators = ha.data, ha.data_index, ha.size, ha.full, ha.creators
    layers, layer_index, layer_opts, phantom = ha.layers, ha.layer_index, ha.layer_opts, ha.phantom
    loss = ha.loss
    ncre = [len(c) for c in creators]
    n, nd, nl = len(names), len(data), len(layers)

    live = bytearray(nd)
    mask = [0] * nd  # contributions received since the datum was last absent
    deleted_at = [-1] * nd
    for d in ha.inputs:
        live[d] = 1
    saved = [-1] * nl  # layer option of the saved phantom, -1: none
    saved_by = [-1] * nl  # op that saved it
    gone = [""] * nl  # how the last phantom went away, for messages
    computed = [0] * n
    first_at = [-1] * n

    mem = sum(size[d] for d in ha.inputs)
    peak = mem
    total_time = 0.0  # the compute channel's current time
    computes = 0

    # Transfers. A tensor t is a datum (t < nd) or the phantom of layer t - nd.
    host_frac = [0.0] * (nd + nl)  # fraction of t offloaded (its host copy)
    host_opt = [-1] * nl  # the layer option of a phantom's host copy
    offloads: list[list[tuple[float, float]]] = [[] for _ in range(nd + nl)]  # (end, fraction)
    # per channel: unwaited transfers, t -> [(op, end)]; every tensor ever transferred
    pending: dict[str, dict[int, list[tuple[int, float]]]] = {c: {} for c in CHANNELS}
    offloading = pending["offload"]  # the unwaited offloads, by tensor
    issued: dict[str, set] = {c: set() for c in CHANNELS}
    free_at = {c: 0.0 for c in CHANNELS}  # when each transfer channel becomes free
    round_frac = [-1.0] * (nd + nl)  # fraction prefetched in the round in progress; -1: none
    round_at = [-1] * (nd + nl)  # the op that started it
    round_bytes = [0] * (nd + nl)  # the device buffer it allocated
    host_used = 0.0
    host_peak = 0.0
    host_over = False
    wait_time = 0.0
    # The loss phase: memory is sampled after each compute together with the deletes and drops
    # that follow it (the H-Rockmate ILP's U[t, k]), i.e. just before the next compute or the
    # transfers issued for it (a prefetch buffer belongs to the step it is issued for); the
    # window restarts at each first computation of a node before the loss, and closes at the
    # first compute or transfer after the loss's (or at the end of the plan).
    window_max, window_at = mem, -1
    save_peak: int | None = None
    save_at = -1
    loss_done = False
    last_compute = -1
    sampled = False  # the state after the last compute and its frees is already sampled

    freed_after: dict[int, set] = {}  # compute op -> data deleted right after it
    last = -1
    for k, op in enumerate(plan.ops):
        if op.op == "compute":
            last = k
        elif op.op == "delete" and last >= 0 and op.data in ha.data_index:
            freed_after.setdefault(last, set()).add(ha.data_index[op.data])

    def datum_state(d: int) -> str:
        if round_frac[d] >= 0:
            return round_state(d)
        if deleted_at[d] >= 0:
            return f"deleted by op {deleted_at[d]}{on_host(d)}"
        if not creators[d]:
            return "nothing creates it and it is not an input"
        return "never created before"

    def phantom_state(j: int) -> str:
        if round_frac[nd + j] >= 0:
            return round_state(nd + j)
        return (gone[j] or "its forward never saved one") + on_host(nd + j)

    def on_host(t: int) -> str:
        if host_frac[t] >= 1.0 - _FRACTION_EPS:
            return "; a copy is on the host: prefetch it back"
        return f"; {host_frac[t]:g} of it is on the host" if host_frac[t] > 0 else ""

    def round_state(t: int) -> str:
        return (f"its prefetch started by op {round_at[t]} has not completed: "
                f"{round_frac[t]:g} of it prefetched, and a wait on channel 'prefetch' "
                "completes it once the fractions sum to 1")

    def label(t: int) -> str:
        return repr(data[t]) if t < nd else f"the phantom of layer {layers[t - nd]!r}"

    def keep_for_offload(k: int, t: int, action: str) -> None:
        """`action` at op k frees t's device copy: an error while an offload of t is unwaited."""
        waiting = offloading.pop(t, None)  # reported once
        if waiting:
            errors.add(f"op {k}: {action}, but the offload of {label(t)} (op {waiting[0][0]}) "
                       "is not waited: the transfer still reads it (wait on channel 'offload' "
                       "first)")

    def cancel_round(k: int, t: int, action: str) -> None:
        """`action` at op k creates t on the device: an error during a prefetch round of t."""
        nonlocal mem
        if round_frac[t] >= 0:
            errors.add(f"op {k}: {action} while a prefetch of {label(t)} is in progress "
                       f"(started by op {round_at[t]}): one copy at a time")
            mem -= round_bytes[t]
            round_frac[t] = -1.0

    def transfer_target(k: int, op: Op) -> int | None:
        if (op.data is None) == (op.layer is None):
            errors.add(f"op {k}: {_a(op.op)} op names exactly one of 'data' (a data node) or "
                       f"'layer' (that layer's saved phantom), not "
                       f"{'neither' if op.data is None else 'both'}")
            return None
        if op.data is not None:
            return _resolve(k, op.op, op.data, data_index, "data", errors)
        j = _resolve(k, op.op, op.layer, layer_index, "layer", errors)
        return None if j is None else nd + j

    def transfer_fraction(k: int, op: Op) -> float | None:
        f = 1.0 if op.fraction is None else op.fraction
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0.0 < f <= 1.0:
            errors.add(f"op {k}: the fraction of {_a(op.op)} op must be between 0 (excluded) and "
                       f"1, not {f!r}")
            return None
        return float(f)

    def bandwidth(k: int, op: Op, t: int) -> float | None:
        chan = op.op
        bw = ha.bandwidth.get(chan, 0)
        if isinstance(bw, bool) or not isinstance(bw, (int, float)) or math.isnan(bw) or bw < 0:
            errors.add(f"op {k}: {chan} of {label(t)}: the graph's {chan} bandwidth is {bw!r}, "
                       "not a number of bytes per second")
            return None
        if bw == 0:
            errors.add(f"op {k}: {chan} of {label(t)}, but the {chan} bandwidth is 0 (the "
                       f"graph gives none: declare `bandwidth {chan} ...`), so no transfer is "
                       "possible")
            return None
        return float(bw)

    def issue(k: int, chan: str, t: int, nbytes: float, bw: float) -> float:
        """Start a transfer of `nbytes` on `chan` at op k; returns its end time."""
        start = max(total_time, free_at[chan])
        end = start + (nbytes / bw if nbytes else 0.0)
        free_at[chan] = end
        pending[chan].setdefault(t, []).append((k, end))
        issued[chan].add(t)
        return end

    for k, op in enumerate(plan.ops):
        kind_k = op.op
        if kind_k in ("compute", "offload", "prefetch") and save_peak is None and not sampled:
            if mem > window_max:  # after the previous compute and what followed it
                window_max, window_at = mem, last_compute
            if loss_done:
                save_peak, save_at = window_max, window_at
            sampled = True
        if kind_k == "compute":
            last_compute = k
            sampled = False
            name = op.node
            i = _resolve(k, "compute", name, index, "node", errors)
            if i is None:
                continue
            ki = kind[i]
            oname = op.option
            if oname is None:
                if len(opt_names[i]) != 1:
                    errors.add(f"op {k}: compute {name!r} needs an option, one of "
                               f"{', '.join(repr(o) for o in opt_names[i])}")
                    continue
                o = 0
            else:
                o = opt_index[i].get(oname, -1)
                if o < 0:
                    if ki == "loss":
                        errors.add(f"op {k}: compute 'loss' with option {oname!r}: the loss has a "
                                   "single way to run (omit 'option', or use 'loss')")
                    else:
                        errors.add(f"op {k}: compute {name!r} with unknown option {oname!r}"
                                   f"{did_you_mean(oname, opt_names[i])} (options: "
                                   f"{', '.join(repr(x) for x in opt_names[i])})")
                    continue
            if ki == "loss" and computed[i]:
                errors.add(f"op {k}: the loss is computed a second time (first by op "
                           f"{first_at[i]}); it must be computed exactly once")
            for d in uses[i]:
                if not live[d]:
                    errors.add(f"op {k}: compute {name!r} needs {data[d]!r}, which is "
                               f"{_not_here(round_frac[d])} ({datum_state(d)})")
                elif mask[d] != full[d]:
                    errors.add(f"op {k}: compute {name!r} needs {data[d]!r}, which is "
                               f"incomplete: {_missing(ha, d, mask[d])}")
            j = layer_of[i]
            lo = opt_layer_opt[i][o]
            if ki == "bwd":
                for d in opt_uses[i][o]:
                    if not live[d]:
                        errors.add(f"op {k}: compute {name!r} with option {opt_names[i][o]!r} needs "
                                   f"{data[d]!r}, which is {_not_here(round_frac[d])} "
                                   f"({datum_state(d)})")
                    elif mask[d] != full[d]:
                        errors.add(f"op {k}: compute {name!r} with option {opt_names[i][o]!r} needs "
                                   f"{data[d]!r}, which is incomplete: {_missing(ha, d, mask[d])}")
                if saved[j] < 0 and round_frac[nd + j] >= 0:
                    errors.add(f"op {k}: backward {name!r} with option {opt_names[i][o]!r} needs "
                               f"the phantom of layer {layers[j]!r}, which is used before its "
                               f"prefetch completed ({phantom_state(j)})")
                elif saved[j] < 0:
                    errors.add(f"op {k}: backward {name!r} with option {opt_names[i][o]!r} needs "
                               f"the phantom of layer {layers[j]!r}, but no phantom of "
                               f"{layers[j]!r} is saved ({phantom_state(j)})")
                elif saved[j] != lo:
                    errors.add(f"op {k}: backward {name!r} runs with option {opt_names[i][o]!r}, "
                               f"but the phantom of layer {layers[j]!r} is saved with option "
                               f"{layer_opts[j][saved[j]]!r} (by op {saved_by[j]})")
            # the peak: inputs, new data copies, the phantom saved, the transient overhead
            add = 0
            for d, bit in creates[i]:
                if live[d] and ncre[d] > 1 and not (mask[d] & bit):
                    continue  # accumulated in place
                add += size[d]
            ph = phantom[j][lo] if ki == "fwd" and lo >= 0 else 0
            profile = ha.opt_steps[i][o]
            if not profile:
                here = mem + add + ph + opt_overhead[i][o]
            else:
                # a sub-step profile: the end state (no overhead) and each step, where outputs
                # not created yet do not count and freed inputs that the plan deletes right
                # after this node are gone (the H-Rockmate correction terms)
                here = mem + add + ph
                new = [d for d, bit in creates[i]
                       if not (live[d] and ncre[d] > 1 and not (mask[d] & bit))]
                deleted_next = freed_after.get(k, set())
                for overhead_s, frees_s, creates_s in profile:
                    step = (mem + ph + overhead_s + sum(size[d] for d in new if d in creates_s)
                            - sum(size[d] for d in frees_s if d in deleted_next and live[d]))
                    here = max(here, step)
            if here > peak:
                peak = here
            # the effects
            for d, bit in creates[i]:
                if not live[d]:
                    if round_frac[d] >= 0:
                        cancel_round(k, d, f"compute {name!r} creates {data[d]!r}")
                    live[d] = 1
                    mem += size[d]
                    mask[d] = bit
                elif mask[d] & bit:
                    if ncre[d] > 1:
                        errors.add(f"op {k}: {name!r} adds its contribution to {data[d]!r} a second "
                                   f"time (the gradient would be accumulated twice; delete "
                                   f"{data[d]!r} first)")
                    else:  # a single creator: the new copy replaces the old one
                        if d in offloading:
                            keep_for_offload(k, d, f"compute {name!r} replaces {data[d]!r}")
                else:
                    mask[d] |= bit
            if ki == "fwd" and lo >= 0:
                cur = saved[j]
                if cur < 0:
                    if round_frac[nd + j] >= 0:
                        cancel_round(k, nd + j, f"forward {name!r} saves a phantom of layer "
                                     f"{layers[j]!r}")
                    mem += ph
                elif nd + j in offloading:
                    keep_for_offload(k, nd + j, f"forward {name!r} replaces the phantom of layer "
                                     f"{layers[j]!r}")
                if cur >= 0 and cur != lo:
                    errors.add(f"op {k}: forward {name!r} with option {opt_names[i][o]!r} saves a "
                               f"phantom of layer {layers[j]!r}, which already has one saved with "
                               f"option {layer_opts[j][cur]!r} (by op {saved_by[j]}): only one "
                               f"phantom option per layer (drop it first)")
                    mem += ph - phantom[j][cur]
                # cur == lo: the new phantom replaces the old one
                saved[j] = lo
                saved_by[j] = k
            elif ki == "bwd" and saved[j] >= 0:
                if nd + j in offloading:
                    keep_for_offload(k, nd + j, f"backward {name!r} consumes the phantom of "
                                     f"layer {layers[j]!r}")
                mem -= phantom[j][saved[j]]
                saved[j] = -1
                gone[j] = f"consumed by the backward at op {k}"
            total_time += opt_time[i][o]
            computes += 1
            first = not computed[i]
            computed[i] += 1
            if first:
                first_at[i] = k
            if save_peak is None:
                if i == loss:
                    loss_done = True
                elif first and i < loss:
                    window_max, window_at = -1, k  # a new phase: sampled before the next compute
            continue
        if kind_k == "delete":
            name = op.data
            d = _resolve(k, "delete", name, data_index, "data", errors)
            if d is None:
                continue
            if not live[d]:
                errors.add(f"op {k}: delete {name!r}, which is not in memory ({datum_state(d)})")
                continue
            if d in offloading:
                keep_for_offload(k, d, f"delete {name!r}")
            live[d] = 0
            mask[d] = 0
            mem -= size[d]
            deleted_at[d] = k
        elif kind_k == "drop_phantom":
            name = op.layer
            j = _resolve(k, "drop_phantom", name, layer_index, "layer", errors)
            if j is None:
                continue
            if saved[j] < 0:
                errors.add(f"op {k}: drop_phantom {name!r}, but no phantom of layer {name!r} is "
                           f"saved ({phantom_state(j)})")
                continue
            if nd + j in offloading:
                keep_for_offload(k, nd + j, f"drop_phantom {name!r}")
            mem -= phantom[j][saved[j]]
            saved[j] = -1
            gone[j] = f"dropped by op {k}"
        elif kind_k == "offload":
            t = transfer_target(k, op)
            f = transfer_fraction(k, op)
            if t is None or f is None:
                continue
            if t < nd:
                if ha.data_pinned[t]:
                    errors.add(f"op {k}: offload of {label(t)}, which is pinned: it may never be "
                               "offloaded")
                    continue
                if not live[t]:
                    errors.add(f"op {k}: offload of {label(t)}, which is not on the device "
                               f"({datum_state(t)})")
                    continue
                if mask[t] != full[t]:
                    errors.add(f"op {k}: offload of {label(t)}, which is incomplete: "
                               f"{_missing(ha, t, mask[t])}")
                    continue
                nbytes = size[t]
            else:
                j = t - nd
                lo = saved[j]
                if lo < 0:
                    errors.add(f"op {k}: offload of {label(t)}, but no phantom of "
                               f"{layers[j]!r} is saved ({phantom_state(j)})")
                    continue
                if ha.opt_pinned[j][lo]:
                    errors.add(f"op {k}: offload of {label(t)}, saved with option "
                               f"{layer_opts[j][lo]!r}, which is pinned: its phantom may never be "
                               "offloaded")
                    continue
                if host_frac[t] > 0 and host_opt[j] != lo:
                    errors.add(f"op {k}: offload of {label(t)}, saved with option "
                               f"{layer_opts[j][lo]!r}, but the host holds its phantom of option "
                               f"{layer_opts[j][host_opt[j]]!r}: a host copy holds one option")
                    continue
                nbytes = phantom[j][lo]
            if host_frac[t] + f > 1.0 + _FRACTION_EPS:
                errors.add(f"op {k}: offload of {label(t)} offloads more than the whole tensor "
                           f"({host_frac[t]:g} already offloaded, plus {f:g})")
                continue
            bw = bandwidth(k, op, t)
            if bw is None:
                continue
            if t >= nd:
                host_opt[t - nd] = saved[t - nd]
            host_frac[t] += f
            host_used += f * nbytes
            host_peak = max(host_peak, host_used)
            if host_budget is not None and host_used > host_budget + 1e-9 * max(1.0, host_budget):
                host_over = True
                errors.add(f"op {k}: offload of {label(t)} brings host memory to "
                           f"{round(host_used)} B, over the host budget {host_budget} B by "
                           f"{round(host_used - host_budget)} B")
            offloads[t].append((issue(k, "offload", t, f * nbytes, bw), f))
        elif kind_k == "prefetch":
            t = transfer_target(k, op)
            f = transfer_fraction(k, op)
            if t is None or f is None:
                continue
            if round_frac[t] < 0:  # a new round
                here = live[t] if t < nd else saved[t - nd] >= 0
                if here:
                    where = ("still in memory" if t < nd
                             else f"saved by op {saved_by[t - nd]}")
                    errors.add(f"op {k}: prefetch of {label(t)}, which is on the device "
                               f"({where}): one copy at a time")
                    continue
                if host_frac[t] <= 0:
                    errors.add(f"op {k}: prefetch of {label(t)}, which was never offloaded")
                    continue
            bw = bandwidth(k, op, t)
            if bw is None:
                continue
            if round_frac[t] < 0:
                round_frac[t] = 0.0
                round_at[t] = k
                round_bytes[t] = size[t] if t < nd else phantom[t - nd][host_opt[t - nd]]
                mem += round_bytes[t]  # the whole tensor's buffer, from the round's first op
                if mem > peak:
                    peak = mem
            done = sum(fr for end, fr in offloads[t] if end <= total_time)
            got = round_frac[t] + f
            if got > done + _FRACTION_EPS:
                errors.add(f"op {k}: prefetch of {label(t)} brings back {got:g} of it in this "
                           f"round, more than has been offloaded by then ({done:g}; an offload "
                           "counts once it has ended: wait on channel 'offload' first)")
            round_frac[t] = got
            issue(k, "prefetch", t, f * round_bytes[t], bw)
        elif kind_k == "wait":
            chan = op.channel
            if chan not in CHANNELS:
                errors.add(f"op {k}: wait on channel {chan!r}: a channel is 'offload' or "
                           f"'prefetch'{did_you_mean(str(chan), CHANNELS)}")
                continue
            if op.data is not None and op.layer is not None:
                errors.add(f"op {k}: a wait op names at most one of 'data' or 'layer', not both")
                continue
            if op.data is None and op.layer is None:
                waited = list(pending[chan].items())
                pending[chan].clear()
            else:
                t = transfer_target(k, op)
                if t is None:
                    continue
                if t not in issued[chan]:
                    errors.add(f"op {k}: wait for {label(t)} on channel {chan!r}, but no {chan} "
                               f"of {label(t)} was issued before")
                    continue
                waited = [(t, pending[chan].pop(t, []))]
            latest = max((end for _, lst in waited for _, end in lst), default=total_time)
            if latest > total_time:
                wait_time += latest - total_time
                total_time = latest
            if chan == "prefetch":
                for t, _ in waited:
                    if round_frac[t] >= 0 and abs(round_frac[t] - 1.0) <= _FRACTION_EPS:
                        round_frac[t] = -1.0  # complete: the tensor is on the device again
                        if t < nd:
                            live[t] = 1
                            mask[t] = full[t]
                        else:
                            saved[t - nd] = host_opt[t - nd]
                            saved_by[t - nd] = k
        elif kind_k in OP_KINDS:  # unreachable while every op kind is handled above
            errors.add(f"op {k}: {kind_k} ops are not supported on layered graphs")
            continue
        else:
            errors.add(f"op {k}: unknown op kind {kind_k!r}")
            continue

    if save_peak is None and loss_done:  # the plan ends in the loss phase
        if mem > window_max:
            window_max, window_at = mem, last_compute
        save_peak, save_at = window_max, window_at

    never = [names[i] for i in range(n) if not computed[i]]
    if never:
        shown = ", ".join(repr(x) for x in never[:10])
        more = f" and {len(never) - 10} more" if len(never) > 10 else ""
        noun = "node is" if len(never) == 1 else "nodes are"
        errors.add(f"{len(never)} {noun} never computed: {shown}{more}", always=True)
    for d in ha.outputs:
        if not live[d]:
            errors.add(f"output {data[d]!r} is not in memory at the end ({datum_state(d)})",
                       always=True)
        elif mask[d] != full[d]:
            errors.add(f"output {data[d]!r} is incomplete at the end: {_missing(ha, d, mask[d])}",
                       always=True)
    for j in range(nl):
        if saved[j] >= 0:
            errors.add(f"phantom of layer {layers[j]!r} still saved at the end (option "
                       f"{layer_opts[j][saved[j]]!r}, saved by op {saved_by[j]})", always=True)
    for chan in CHANNELS:
        for t, lst in sorted(pending[chan].items()):
            ops = ", ".join(str(kk) for kk, _ in lst)
            errors.add(f"transfer of {label(t)} on channel {chan!r} (op{'s' if len(lst) > 1 else ''}"
                       f" {ops}) never waited", always=True)
    for t in range(nd + nl):
        if round_frac[t] >= 0 and t not in pending["prefetch"]:
            errors.add(f"the prefetch of {label(t)} started by op {round_at[t]} never completed "
                       f"({round_frac[t]:g} of it prefetched; a wait on channel 'prefetch' "
                       "completes it once the fractions sum to 1)", always=True)
    return _LayeredReplay(peak=peak, time=total_time, computes=computes, save_peak=save_peak,
                          save_at=save_at, host_peak=round(host_peak), host_over=host_over,
                          wait_time=wait_time)


def _not_here(prefetching: float) -> str:
    return "used before its prefetch completed" if prefetching >= 0 else "not in memory"


def _missing(ha: _HArrays, d: int, got: int) -> str:
    missing = [ha.names[c] for b, c in enumerate(ha.creators[d]) if not got >> b & 1]
    total = len(ha.creators[d])
    return (f"the contribution of {', '.join(repr(c) for c in missing)} is missing "
            f"({total - len(missing)} of {total} received)")


def _no_recompute_layered(graph: Graph) -> Plan:
    """The autograd-like plan of a layered graph, without recomputation.

    Forwards in layer order with the layer's first option, the loss, backwards in reverse
    order with the same option; each datum is deleted right after the last compute that reads
    or creates it (an input after its last reader, before anything when nothing reads it), an
    ``output`` never; phantoms are consumed by their backward. Raises `DataError` when the
    layered data is inconsistent.
    """
    ha = _harrays(graph)
    # (compute node, option) in H-graph order; option 0: the layer's first, the loss's only one
    steps: list[tuple[int, int]] = [(i, 0) for i in range(len(ha.names))]
    last = [-2] * len(ha.data)  # -2: never touched; -1: delete before the first step
    for d in ha.inputs:
        last[d] = -1
    for p, (i, o) in enumerate(steps):
        for d in ha.uses[i] + (ha.opt_uses[i][o] if ha.kind[i] == "bwd" else ()):
            last[d] = p
        for d, _ in ha.creates[i]:
            last[d] = p
    outputs = set(ha.outputs)
    freed_after: list[list[int]] = [[] for _ in range(len(steps) + 1)]
    for d, p in enumerate(last):
        if p >= -1 and d not in outputs:
            freed_after[p + 1].append(d)
    ops: list[Op] = [Op("delete", data=ha.data[d]) for d in freed_after[0]]
    for p, (i, o) in enumerate(steps):
        option = None if len(ha.opt_names[i]) == 1 else ha.opt_names[i][o]
        ops.append(Op("compute", node=ha.names[i], option=option))
        ops += [Op("delete", data=ha.data[d]) for d in freed_after[p + 1]]
    plan = Plan(graph=graph.name, ops=ops, meta={"planner": "no_recompute"})
    errors = _Errors()
    out = _replay_layered(plan, ha, errors)
    peak, total = out.peak, out.time
    if errors.items:  # cannot happen for a consistent H-graph
        raise DataError(f"graph '{graph.name}': the no-recomputation plan does not replay: "
                        f"{errors.items[0]}", graph.loc)
    plan.predicted_peak = peak
    plan.predicted_time = total
    return plan
