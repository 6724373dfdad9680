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
replayed on their H-graph (`schedlang.graphs.hgraph.build_hgraph`): compute nodes ``LAYER.fwd``,
``loss``, ``LAYER.bwd``. The formulations of this vocabulary are held to these rules:

* state: the set of live data; for a data node with several creators (gradient accumulation),
  the set of creators whose contribution it has received since it was last absent; for each
  layer, the phantom it has saved, if any, with its option (at most one option per layer).
* memory = sum of the sizes of live data (a data node counts once, however many contributions
  it holds) + the sizes of saved phantoms. Inputs (``role input``) are live at the start, and
  the peak starts at their total.
* ``compute(node, option)``: `option` names one of the node's options (a forward's options are
  its layer's plus ``fast_forward``, whose numbers are those of the H-graph: stated by the
  graph data or derived, `schedlang.graphs.hgraph`; the loss takes none, or ``loss``); it may be
  omitted only on a node with a single option. A layer whose only option is ``fast_forward``
  has no backward node: its forward saves nothing and nothing consumes a phantom of it.

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
    The memory before a backward holds the phantom it consumes: a backward's overhead does not
    (docs/language.md, "Overheads").
    An option with a sub-step profile (``fwd_steps``/``bwd_steps``) has instead the largest of:
    the end state (memory before + new data + phantom saved, no overhead, - the inputs any
    step frees that the plan deletes right after this op, - for a backward the phantom it
    consumes: a profile describes the whole node, whose inputs and phantom are gone by its
    end) and each step (memory before + phantom + the step's overhead + the new data created
    by that step - the inputs the step no longer needs *that the plan deletes right after this
    op*) — the H-Rockmate correction terms.
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
* ``offload(x, fraction)``: x is on the device (a datum: live and complete, or, with several
  creators, holding some of their contributions; a phantom: saved), not pinned; its host copy
  grows by the fraction (at most 1 in all; it persists to the end, and is valid for the same
  value recomputed later; a datum's host copy holds the contributions its device copy had,
  every fraction the same ones; a phantom's host copy belongs to the option that saved it).
  Host memory = sum of host fractions x bytes, checked against the host budget
  (``host_budget``, else ``graph.budgets["host"]``) at each offload. Until the offload
  is waited, freeing x's device copy (delete, drop_phantom, a backward consuming the phantom,
  a recomputation replacing x) is an error.
* ``prefetch(x, fraction)``: the first prefetch of a round needs x off the device and
  allocates x's full size (counted in memory and the peak from then on, save window
  included). The fractions of a round must stay within the fraction of x whose offload has
  ended by the prefetch's issue time. A ``wait`` on the prefetch channel covering x when the
  round's fractions sum to 1 completes it: x is on the device again (a datum, with the
  contributions of its host copy; a phantom, saved with the option of its host copy). Using x,
  or creating it, while a round is in progress is an error, as is a round never completed.

Code: the replay is a state machine per view, `CheckmateReplay` and `LayeredReplay`, one
method per op kind (``compute``, ``delete``, ``drop_phantom``, ``offload``, ``prefetch``,
``wait``) over the state above, with the end-of-plan checks in ``finish``. They read the
graph's cached indexes (`Graph.checkmate_index`, `Graph.layered_index`). `replay` returns what
the ops measure, budgets aside; `simulate` adds the budget checks. The no-recomputation plan
and its peak live in `schedlang.plans.planners.no_recompute`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..graphs.graph import Graph
from ..language.errors import DataError
from ..language.units import MAX_BYTES
from .layered_replay import LayeredReplay
from .plan import Plan
from .replay import CheckmateReplay, Errors, Replayed

#: a budget no plan reaches (a graph's sizes add up to at most MAX_BYTES,
#: `Graph.check_total_bytes`): replay without a memory limit
NO_LIMIT = MAX_BYTES


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


def replay(plan: Plan, graph: Graph, *, host_budget: int | None = None,
           record: bool = False) -> Replayed:
    """Replay `plan`'s ops on `graph` without budgets (the errors are in the result).
    `record`: also the memory and time at each op (`Replayed.steps`, `OpMemory`s); the
    largest `peak` of the steps is the replay's peak.

    Raises `DataError` when the graph is inconsistent; `simulate` reports that as an error.
    """
    errors = Errors()
    replayer = _replayer(plan, graph, errors, host_budget)
    if record:
        replayer.steps = []
    out = replayer.replay()
    out.errors = errors.finish()
    out.steps = replayer.steps
    return out


def _replayer(plan: Plan, graph: Graph, errors: Errors,
              host_budget: int | None) -> CheckmateReplay | LayeredReplay:
    if graph.is_layered:
        return LayeredReplay(plan, graph.layered_index(), errors, host_budget)
    return CheckmateReplay(plan, graph.name, graph.checkmate_index(), errors)


def simulate(plan: Plan, graph: Graph, *, budget: int | None = None,
             save_budget: int | None = None, host_budget: int | None = None) -> SimResult:
    """Replay `plan` on `graph`: validity, peak memory (bytes) and total time.

    The peak budget checked is `budget` when given, else the plan's, else the graph's
    (``graph.budgets["peak"]``); with none, `fits_budget` is None. On a layered graph the save
    budget is checked too (`save_budget`, else ``plan.budget_save``, else
    ``graph.budgets["save"]``) against the memory of the loss phase, and the host budget of the
    offloads (`host_budget`, else ``graph.budgets["host"]``; see the module docstring).
    """
    errors = Errors()
    warnings: list[str] = []
    if plan.graph and graph.name and plan.graph != graph.name:
        warnings.append(f"the plan was made for graph '{plan.graph}', not '{graph.name}'")

    layered = graph.is_layered
    if not layered:
        host_budget = None
    elif host_budget is None:
        host_budget = graph.budgets.get("host")
    try:
        replayer = _replayer(plan, graph, errors, host_budget)
    except DataError as exc:
        what = "this layered graph" if layered else "this graph"
        errors.add(f"cannot simulate {what}: {exc.message}")
        return SimResult(False, 0, 0.0, errors.finish(), None, warnings)
    out = replayer.replay()
    peak, total_time = out.peak, out.time

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
        if save_budget is not None and out.save_peak is not None:
            checks.append(out.save_peak <= save_budget)
            if out.save_peak > save_budget:
                where = ("before its first op" if out.save_at < 0
                         else f"after op {out.save_at} and the frees that follow it")
                errors.add(f"memory during the loss phase reaches {out.save_peak} B ({where}), "
                           f"over the save budget {save_budget} B by "
                           f"{out.save_peak - save_budget} B", always=True)
        if host_budget is not None:
            checks.append(not out.host_over)  # the excess is reported at the offload
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
                     computes=out.computes, save_peak_bytes=out.save_peak,
                     save_budget_bytes=save_budget, host_peak_bytes=out.host_peak,
                     host_budget_bytes=host_budget, wait_time=out.wait_time)


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


