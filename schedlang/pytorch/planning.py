"""Solving and choosing `fit`'s plan: the budget, the solve (`solve_plan`), the smallest
feasible budget, the frees the runtime adds and the plan's price (`priced`), plans with a host
link against recompute-only ones, and the hook front end's group plans."""
from __future__ import annotations

import copy
import dataclasses
import logging
import time

import torch
from torch import nn

from .. import budgets, progress
from ..graphs.graph import Graph
from ..language.errors import Loc, SchedError
from ..language.resources import extension_path
from ..language.units import format_size
from ..plans.plan import Plan
from ..plans.simulate import simulate
from ..problem import load
from ..solve.bisection import ANY_PLAN_GAP
from ..solve.bisection import smallest_feasible as bisect
from ..solve.solution import Status
from ..solve.solvers import requested_gap
from . import distributed
from .hostlink import HostLink, resolve_link
from .outputs import loss_moment, released_bytes, uncounted_outputs
from .prepare import Prepared
from .tensors import flat

__all__ = ["FitError", "resolve_fit_budget", "solve_plan", "smallest_feasible", "solve_extra",
           "solve_at", "solve_or_raise", "priced", "with_link", "solve_linked", "linked",
           "group_plans_priced", "as_before"]

log = logging.getLogger("schedlang.pytorch")


class FitError(SchedError):
    """The budget cannot be met (exit code 3, like an infeasible solve)."""

    exit_code = 3


def resolve_fit_budget(budget, plain_peak: int) -> int:
    """Bytes from a size ('2GiB', 3e9, 1000000) or a percentage ('60%') of `plain_peak`
    (`schedlang.budgets`: one parser and one rounding rule for every budget)."""

    return budgets.parse(budget, plain_peak, Loc("budget"), "the plain execution peak")


# the second solve of `solve_plan`: the least peak among the fastest plans, a .sched extension
# of the shipped formulations (models/extensions/least_peak.sched)
LEAST_PEAK = "least_peak"


#: the extension that keeps the model's outputs from their forward to the step's end (the
#: caller holds them: models/extensions/held_outputs.sched)
HELD_OUTPUTS = "held_outputs"


#: the least-peak solve's time, at least this many seconds (below, the first solve's): a
#: margin that small models' second solves (about 1 s) do not reach on a loaded machine, where
#: a cut-short solve could leave a higher peak at a lower budget
LEAST_PEAK_MIN_SECONDS = 10.0


def least_peak_seconds(first_seconds: float, time_limit: float | None) -> float:
    """The time limit of `solve_plan`'s second (least-peak) solve: the first solve's seconds,
    at least `LEAST_PEAK_MIN_SECONDS`, at most the caller's limit."""
    cap = max(LEAST_PEAK_MIN_SECONDS, first_seconds)
    return cap if time_limit is None else min(cap, float(time_limit))


def solve_plan(graph: Graph, activation_budget: int, solver: str = "highs",
               time_limit: float | None = None, backend: str = "pyomo",
               loss_overhead: int = 0, output_bytes: int = 0,
               extensions: tuple = (), least_peak: bool = True,
               outputs_held: bool = True, warm_start: Plan | None = None,
               must_beat: float | None = None, gap: float | None = None) -> Plan | None:
    """The rockmate plan of `graph` within `activation_budget` bytes, or None if none found.

    The model's outputs stay in memory from their forward to the step's end, as the caller
    holds them (models/extensions/held_outputs.sched; `outputs_held` False: not, for a loop
    that releases them, on a graph from `outputs.released_graph`); `extensions`: more.
    `loss_overhead`: memory the loss function adds at the loss (the graph's loss node has
    none); the save budget (memory during the loss phase) keeps room for it, and for the part
    of the model's outputs (`output_bytes`) that the graph's data read by the loss do not
    count (those are in the loss phase's memory already: counting them again refused plans
    that fit, e.g. checkpoint_sequential's own schedule at its measured peak). Released
    outputs (`outputs_held` False) are deleted after the loss, where the save budget samples
    the loss phase's memory, while the loss function's overhead is measured with them
    present: the save budget leaves room for them too. `warm_start`: a plan to start the
    solver from (`Problem.solve`; one the model cannot express is ignored). `must_beat`:
    a plan not faster than this many seconds (by more than the solver's relative gap) is not
    wanted: None, without the second (least-peak) solve. `gap`: the solver's relative gap
    (None: its default; 1.0 takes the first plan found, for a probe that asks only whether
    one exists). A plan whose prediction (the loss
    phase's included) is over `activation_budget` is not returned."""
    g = copy.copy(graph)
    g.budgets = {"peak": int(activation_budget)}
    # with a host link, recompute or offload (models/offload.sched); else recompute only
    linked = g.bandwidths.get("offload") and g.bandwidths.get("prefetch")
    model = "offload" if linked else "rockmate"
    if loss_overhead:
        save = int(activation_budget) - loss_overhead - uncounted_outputs(graph, output_bytes)
        if not outputs_held:
            save -= released_bytes(graph)
        if save <= 0:
            return None
        g.budgets["save"] = save
    held = (HELD_OUTPUTS,) if outputs_held else ()
    exts = [str(extension_path(e)) for e in (*held, *extensions)]
    prob = load(model=[model, *exts], graph=g)
    t0 = time.monotonic()
    res = prob.solve(backend=backend, solver=solver, time_limit=time_limit, gap=gap,
                     warm_start=warm_start)
    first_seconds = time.monotonic() - t0
    if res.plan is None or res.status not in (Status.OPTIMAL, Status.FEASIBLE):
        return None
    if must_beat is not None and \
            res.objective >= must_beat * (1 - requested_gap(solver, None)):
        return None
    # Among plans as fast as this one, the one with the smallest peak: equally fast plans
    # differ in memory, and this choice makes the peak fall as the budget falls. The status
    # stays the first solve's: the second proves the least peak, not the least time (a time
    # solve stopped early reported "optimal" kept `solve_at` from its per-block solve)
    status = res.status
    fastest = res.objective * (1 + 1e-7) + 1e-12
    second = None if not least_peak else load(
        model=[model, *exts, extension_path(LEAST_PEAK)], graph=g,
                            params={"fastest_time": fastest})
    # It starts from the first plan (so it never ends with a higher peak than that plan's)
    # and gets at most the first solve's time: proving the least peak can cost more than the
    # time optimum did, and the plan it starts from is most often that least peak already.
    least = None if second is None else \
        second.solve(backend=backend, solver=solver, warm_start=res.plan,
                     time_limit=least_peak_seconds(first_seconds, time_limit))
    if least is not None and least.plan is not None \
            and least.status in (Status.OPTIMAL, Status.FEASIBLE):
        res = least
    sim = simulate(res.plan, graph, budget=int(activation_budget))
    if not sim.valid:
        return None
    res.plan.predicted_peak = max(sim.peak_bytes, loss_moment(res.plan, graph) + loss_overhead)
    if res.plan.predicted_peak > activation_budget:
        return None
    res.plan.predicted_time = sim.time
    res.plan.meta.setdefault("planner", model)
    res.plan.meta["status"] = status.value
    res.plan.meta["model_size"] = res.model_size
    return res.plan


def smallest_feasible(graph: Graph, low: int, high: int, solver: str, time_limit,
                      backend: str = "pyomo", rel: float = 0.03, max_solves: int = 8,
                      shown_offset: int = 0, **kw) -> int | None:
    """Bisection with the solver between an infeasible `low` and `high` (activation bytes):
    the smallest budget found feasible (within `rel`, at most `max_solves` solves), or None
    if `high` is not. The budget, not the plan's peak: a plan also needs the save budget that
    its budget implies (the loss phase), so a budget of its peak may admit no plan."""

    # after the first, a probe asks only whether a plan exists: the first plan found answers
    # (`ANY_PLAN_GAP`), not the fastest one, and no least-peak solve; solving each probe to its
    # optimum made an infeasible `fit` on a small model take most of a minute
    return bisect(
        lambda b: solve_plan(graph, b, solver, time_limit, backend, least_peak=False,
                             gap=ANY_PLAN_GAP, **kw) is not None,
        low, high, rel=rel, max_steps=max_solves, shown_offset=shown_offset,
        first=lambda b: solve_plan(graph, b, solver, time_limit, backend, **kw) is not None)


def groups_run(prep: Prepared) -> bool:
    """May checkpointed groups of blocks run? Not with FSDP (a group's recomputation runs its
    first blocks when their parameters may be resharded: their backward has not begun), nor
    under torch.distributed (every rank runs rank 0's plan, `distributed.agree_plan`)."""
    return bool(prep.front is not None and prep.front.groups and prep.fsdp is None
                and not distributed.active())


def frontend_extensions(prep: Prepared) -> tuple:
    """The .sched extensions the front end's runtime needs (beyond `solve_plan`'s held
    outputs): per-block wrappers run only the plans of models/extensions/block_groups.sched
    (per_block.sched where groups do not run, `groups_run`)."""

    return prep.front.extensions(groups_run(prep)) if prep.front is not None else ()


def solve_extra(prep: Prepared) -> dict:
    """`solve_plan`'s keyword arguments for plans of `prep`: the loss's memory, the outputs
    (held or not) and the front end's extensions."""
    return {"loss_overhead": prep.loss_overhead, "output_bytes": prep.output_bytes,
            "extensions": frontend_extensions(prep), "outputs_held": prep.outputs_held}


def solve_or_raise(prep: Prepared, want: int, margin: int, solver, time_limit, backend,
                    extra: dict, why: str = "") -> tuple[Plan, float]:
    activation = want - prep.resident_bytes - margin
    if activation <= 0:
        raise FitError(f"budget {format_size(want)} ({want} B) is below the resident memory "
                       f"alone ({format_size(prep.resident_bytes)}: parameters, buffers and "
                       "inputs)" + (f" and the measured margin {format_size(margin)}"
                                    if margin else ""))
    t0 = time.perf_counter()
    with progress.phase("planning"):
        progress.step(None, f"budget {format_size(want)}, activations {format_size(activation)}")
        found = solve_at(prep, activation, solver, time_limit, backend, extra)
    solve_s = time.perf_counter() - t0
    if found is None:
        # plain execution's activation peak admits its plan (budgets are exact to the byte);
        # a KiB above it, as a margin
        high = prep.plain_peak - prep.resident_bytes + prep.output_bytes + 1024
        # (the front end's heuristic plans: a cold probe may miss a plan near the least
        # budget that one of them has, and below the least they need is where to look)
        heuristic = min(group_plans_priced(prep), key=lambda np: np[0], default=None)
        if heuristic is not None and activation < heuristic[0] < high:
            high = heuristic[0]
        # each probe of the bisection is capped as the group solve is (`solve_at`): its
        # larger space can keep a feasibility solve unproven for minutes on many blocks
        limit = time_limit
        if groups_run(prep):
            limit = GROUP_SOLVE_S if time_limit is None else min(time_limit, GROUP_SOLVE_S)
        fixed = prep.resident_bytes + margin
        best = smallest_feasible(prep.graph, activation, high, solver, limit, backend,
                                 shown_offset=fixed, **extra)
        how = f"bisection with the solver {solver}"
        if heuristic is not None and (best is None or heuristic[0] < best):
            best, how = heuristic[0], f"the plan '{heuristic[1].meta.get('planner')}'"
        smallest = "unknown" if best is None else \
            f"{format_size(best + fixed)} ({best + fixed} B)"
        gen = (f", with {prep.generated['options']} generated layer options"
               if prep.generated else "")
        raise FitError(f"no plan fits the budget {format_size(want)} ({want} B){why}: the "
                       f"smallest feasible budget found is {smallest} ({how}{gen}; plain "
                       f"execution needs "
                       f"{format_size(prep.plain_peak)}, of which "
                       f"{format_size(prep.resident_bytes)} resident)")
    return found, solve_s


#: seconds the solve with checkpointed groups may take before the per-block solve backs it
#: up (models/extensions/block_groups.sched's space is larger: a 48-block GPT-2 is not proven
#: optimal in 60 s where per_block.sched's solve takes 12; `solve_at`)
GROUP_SOLVE_S = 10.0


def solve_at(prep: Prepared, activation: int, solver, time_limit, backend, extra: dict,
           warm_start: Plan | None = None, groups: bool = True,
           must_beat: float | None = None) -> Plan | None:
    """The plan of `prep` within `activation` bytes (the solver's, or a faster group plan
    unless `groups` is False; rank 0's under torch.distributed; an earlier one as fast,
    `as_before`), or None. With checkpointed groups (the hook front end's
    models/extensions/block_groups.sched), the solve starts from the fastest plan of the
    group family that fits (when no `warm_start` is given) and may take `GROUP_SOLVE_S`;
    where it stops before proving its plan optimal, the per-block solve (per_block.sched, a
    smaller space) runs too, and the faster plan is taken."""

    found = None
    if distributed.solves_here():
        grouped = groups and groups_run(prep)
        if grouped and warm_start is None:
            warm_start = fastest_group_plan(prep, activation)
        limit = time_limit
        if grouped:
            limit = GROUP_SOLVE_S if time_limit is None else min(time_limit, GROUP_SOLVE_S)
        found = priced_solve(prep, activation, solver, limit, backend, extra, warm_start,
                             must_beat)
        if grouped and (found is None or found.meta.get("status") != "optimal"):
            # the per-block plan is wanted only if faster than the group solve's: where it is
            # not, its least-peak solve is skipped (`solve_plan`'s `must_beat`)
            beat = must_beat if found is None else \
                min(found.predicted_time, must_beat or found.predicted_time)
            alone = priced_solve(prep, activation, solver, time_limit, backend,
                                 dict(extra, extensions=prep.front.extensions(False)),
                                 None, beat)
            if alone is not None and (found is None or
                                      alone.predicted_time < found.predicted_time):
                found = alone
        if groups:
            found = or_group_plan(prep, activation, found)
        if found is not None:  # data freed where the runtime frees them (`lifetimes`)
            found = as_runtime_frees(found, prep)
    found = distributed.agree_plan(found, prep.graph)  # rank 0's plan; a no-op on one process
    return as_before(prep, found, activation, solver)


def priced_solve(prep: Prepared, activation: int, solver, time_limit, backend, extra: dict,
                 warm_start: Plan | None, must_beat: float | None) -> Plan | None:
    """`solve_plan` on `prep`'s graph, its plan `priced` as the front end runs it (a group's
    reruns and its last block's early stop)."""
    found = solve_plan(prep.graph, activation, solver, time_limit, backend,
                       warm_start=warm_start, must_beat=must_beat, **extra)
    return None if found is None else priced(found, prep)


def as_runtime_frees(plan: Plan, prep: Prepared) -> Plan:
    """`plan` with the deletes the runtime does itself right after their last use, repriced:
    every datum with the hook front end (the model's own code frees it), the outputs of a
    loop that releases them with fx (handed to the caller, freed once the loss is computed)."""
    moved = prep.front.runtime_frees(plan, prep)
    return plan if moved is plan else priced(moved, prep)


def priced(plan: Plan, prep: Prepared) -> Plan:
    """`plan` with its predicted peak (the loss's memory included) and time on `prep`'s
    graph, as the front end's runtime runs it (`Frontend.priced_graph`, `time_correction`:
    e.g. a group's reruns, priced as recomputations, its last block as the checkpoint's early
    stop leaves it)."""
    return _predicted(plan, prep, *_as_run(plan, prep))


def _as_run(plan: Plan, prep: Prepared):
    """(`plan` simulated on the graph data the front end runs it on, the memory of its loss
    phase with the loss function's own)."""
    graph = prep.graph if prep.front is None else prep.front.priced_graph(plan, prep.graph)
    return simulate(plan, graph), loss_moment(plan, graph) + prep.loss_overhead


def _predicted(plan: Plan, prep: Prepared, sim, at_loss: int) -> Plan:
    """`plan` with the predicted peak and time of its simulation `sim` (`_as_run`)."""
    plan.predicted_peak = max(sim.peak_bytes, at_loss)
    plan.predicted_time = sim.time
    if prep.front is not None:
        plan.predicted_time += prep.front.time_correction(plan, prep.graph)
    return plan


def with_link(model: nn.Module, prep: Prepared, bandwidth, args, kwargs) -> tuple:
    """(the preparation to plan with, the recompute-only one to compare it with or None) for
    `fit(bandwidth=...)` (`hostlink`: a rate, or "auto", measured on CUDA; none on the CPU)."""

    tensors = [*model.parameters(), *flat((args, kwargs))]
    device = next((t.device for t in tensors if isinstance(t, torch.Tensor)),
                  torch.device("cpu"))
    link, note = resolve_link(bandwidth, device)
    if link is None or not (link.offload > 0 and link.prefetch > 0):
        if note:
            log.info("schedlang fit: %s", note)
        return dataclasses.replace(prep, host_link={"note": note or "no host link (0 B/s)"}), None
    info = {**link.to_json(), "note": note}
    return linked(dataclasses.replace(prep, host_link=info), link), \
        dataclasses.replace(prep, host_link=info)


def solve_linked(base: Prepared, linked: Prepared, want: int, solver, time_limit,
                  backend) -> tuple[Prepared, Plan, float, tuple | None]:
    """(preparation, plan, seconds, the recompute-only (preparation, plan) it was preferred
    to or None) with a host link: the recompute-only plan of `base` and the plan of `linked`,
    which may also move data to host memory, warm-started from the first (its model contains
    every plan it can express), at the same budget; the offloading plan is kept only when it
    is predicted faster by more than the solver's relative gap. Raises FitError when neither
    meets the budget."""

    t0 = time.perf_counter()
    activation = want - base.resident_bytes
    alone = solve_at(base, activation, solver, time_limit, backend, solve_extra(base)) \
        if activation > 0 else None
    # (group plans, which move nothing, are the recompute-only solve's; a plan with the link
    # that is not faster is dropped before its least-peak solve)
    moved = solve_at(linked, activation, solver, time_limit, backend, solve_extra(linked),
                   warm_start=alone, groups=False,
                   must_beat=None if alone is None else alone.predicted_time) \
        if activation > 0 else None
    solve_s = time.perf_counter() - t0
    if alone is None and moved is None:
        found, _ = solve_or_raise(linked, want, 0, solver, time_limit, backend,
                                   solve_extra(linked))
        return linked, found, solve_s, None
    slack = 1 - requested_gap(solver, None)
    faster = moved is not None and (alone is None or
                                    moved.predicted_time < alone.predicted_time * slack)
    info = dict(linked.host_link or {}, kept="with the link" if faster else "recompute only",
                recompute_only_time=None if alone is None else alone.predicted_time,
                with_link_time=None if moved is None else moved.predicted_time)
    if not faster:
        log.info("schedlang fit: no plan with the host link is predicted faster than "
                 "recomputation alone (%.4g s) at %s: recomputation only",
                 alone.predicted_time, format_size(want))
    chosen, plan = (linked, moved) if faster else (base, alone)
    other = (dataclasses.replace(base, host_link=info), alone) if faster and alone else None
    return dataclasses.replace(chosen, host_link=info), plan, solve_s, other


def group_plans_priced(prep: Prepared) -> list[tuple[int, Plan]]:
    """Hook front end: the plans with checkpointed groups of blocks (`families.group_plans`),
    each with the activation budget it needs (its peak, and its loss phase with the loss
    function's memory and the outputs the graph does not count), predicted peak and time set
    as `solve_plan` sets them. Cached on `prep`. None where groups do not run (`groups_run`)."""

    if not groups_run(prep):
        return []
    key = (prep.loss_overhead, prep.output_bytes)
    if prep.grouped is None or prep.grouped[0] != key or prep.grouped[1] is not prep.graph:

        uncounted = uncounted_outputs(prep.graph, prep.output_bytes)
        priced = []
        for plan in prep.front.group_plans(prep):
            sim, at_loss = _as_run(plan, prep)
            if not sim.valid:
                continue
            _predicted(plan, prep, sim, at_loss)
            plan.meta["status"] = "feasible"
            priced.append((max(sim.peak_bytes, at_loss + uncounted), plan))
        prep.grouped = (key, prep.graph, priced)
    return prep.grouped[2]


def fastest_group_plan(prep: Prepared, activation: int) -> Plan | None:
    """The fastest plan of the group family (`group_plans_priced`) that meets `activation`,
    or None."""
    fits = [plan for need, plan in group_plans_priced(prep) if need <= activation]
    return min(fits, key=lambda p: (p.predicted_time, p.predicted_peak), default=None)


def or_group_plan(prep: Prepared, activation: int, found: Plan | None) -> Plan | None:
    """`found` (the solver's plan, or None), or a faster plan of the group family that meets
    `activation` (`fastest_group_plan`, checkpoint_sequential's schedule among them). Every
    plan of the family is in the solver's space (models/extensions/block_groups.sched), so
    this is a fallback: for a solve stopped early (time limit, gap) or failed."""
    best = fastest_group_plan(prep, activation)
    if best is not None and (found is None or
                             best.predicted_time < found.predicted_time * (1 - 1e-9)):
        log.info("schedlang fit: %s (predicted %.4g s) is faster than the solver's plan (%s)",
                 best.meta["planner"], best.predicted_time,
                 "none found" if found is None else f"{found.predicted_time:.4g} s")
        return best
    return found


def as_before(prep: Prepared, found: Plan | None, activation: int, solver: str) -> Plan | None:
    """`found`, or the fastest plan fit took earlier with `prep` that fits `activation` and is
    as fast, within the solver's relative gap (which is all `found`'s optimality means), or
    faster. Plans of equal predicted time and peak can measure a few hundred bytes apart (ViT:
    which of two identical blocks recomputes, 768 B), so taking the earlier one keeps the
    measured peak from growing as the budget falls. And a plan found at a lower budget can be
    faster, as the front end prices it, than the solver's optimum at a higher one (T5: its
    objective and the groups' repricing differ): the step time must not grow with the budget
    either. Records the result."""

    if found is None or distributed.active():
        return found
    slack = 1 + requested_gap(solver, None)
    earlier = [plan for graph, plan in prep.solved
               if graph is prep.graph and plan.predicted_peak <= activation
               and plan.predicted_time <= found.predicted_time * slack]
    if earlier:  # the fastest; of equals, the first taken
        return min(earlier, key=lambda plan: plan.predicted_time)
    prep.solved.append((prep.graph, found))
    return found


def linked(prep, link: HostLink):
    """`prep` (a `Prepared`) planned with the host link `link` (its front end's
    `with_link`: fx layers get the link's bandwidths, blocks the option ``offload``); the
    caller's `prep` stays as it is."""
    return dataclasses.replace(prep, graph=prep.front.with_link(prep, link), solved=[],
                               grouped=None)
