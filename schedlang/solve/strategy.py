"""The default solve: the formulation and solvers a problem gets when the user names none.

`schedlang solve FILE` without `--model`, `--solver`, `--backend` or `--warm-start` runs
`solve(problem, ...)`, which picks one of three routes from the problem and says which in
`Result.strategy` (the CLI prints it; `--json` has it as "strategy"):

* **as written** -- layered data, a formulation other than the shipped `checkmate.sched` as it
  is (a user's model or extension), and Checkmate-view graphs of at most `SMALL_NODES` nodes:
  the file's model with HiGHS, warm-started from the best heuristic plan, as `Problem.solve`
  does by default. Small graphs close in seconds this way, and their optima and plans stay
  what they were. On such a small graph with the shipped checkmate where no heuristic plan
  fits, CP-SAT on the order-free model (`models/sequence.sched`, `schedlang.solve.order_free`,
  `SEQUENCE_SHARE` of the time) runs first; a plan it finds gives the stage model its order
  (`Route.order` "sequence") and is the answer when the stage model has nothing faster.
* **op graph** -- Checkmate-view graphs of `SMALL_NODES` to `LARGE_NODES` nodes solved with the
  shipped `checkmate`: the same plans' optimum, reformulated as `models/checkmate_tight.sched`
  (a tighter relaxation, infeasibility proven sooner). First planner shift reorders the nodes
  (up to `SHIFT_SHARE` of the time): the model keeps the graph's order, and a reordered plan
  that recomputes nothing is optimal in any order (returned at once); one that is faster than
  the model's best plan at the end is returned instead of it, with the order-free bound. The
  model's start is the fastest fitting plan
  of the cheap heuristic planners, recompute_gaps also at smaller budgets (a plan that fits a
  smaller budget fits this one: `schedlang.solve.ladder`), with its needless recomputations
  undone (`planners.prune`);
  when recompute_gaps in shift's order (at the budget or below) fits and is faster, the stage
  model is built in shift's
  node order instead (`schedlang.solve.orders`; `Route.order` and the message say which order
  the status, gap and bounds are for: the stage model's optimum holds for its order only);
  when none fits, phase one (`models/extensions/soft_budget.sched`, the budget as a goal,
  from the lowest-peak heuristic plan, up to `PHASE_ONE_SHARE` of the time: HiGHS, then
  CP-SAT from HiGHS's least excess, `PHASE_ONE_SOLVERS`) finds one or proves the budget
  infeasible. The window bound (`schedlang.solve.window_bound`: the least
  recomputation that the memory at a chain of computations forces, up to `BOUND_SHARE` of the
  time left) is computed next; on op graphs it is far above the solvers' bounds. Then the
  linked windows (`schedlang.solve.linked_windows`: one MILP over the memory at a dozen
  computations, each linked to the one before, up to `LINKED_SHARE` of the time left), the
  larger of the two kept. CP-SAT then
  improves the plan (`CPSAT_SHARE` of the time left; on these graphs it finds better plans
  than HiGHS; `OTHER_ORDER_SHARE` of that in the node order not taken, when recompute_gaps
  fits in shift's order, and the order with the faster plan goes on), and HiGHS,
  warm-started from CP-SAT's best plan, spends the rest, unless
  CP-SAT's plan is already within the requested gap of the window bound. Both solve the same
  model, so either's proof of optimality or infeasibility holds, and the better plan and the
  best of the three bounds are reported. Without CP-SAT installed, HiGHS alone. A plan the
  route had in hand that is faster than the answer (each order's start, shift's plan, the
  other order's CP-SAT plan) is returned instead, with the order-free bound.
* **large graph** -- above `LARGE_NODES` nodes the stage model has n^2 columns (resnet50's 353
  nodes: 350,000; 1,000 nodes: over 20 million elements in one declaration): the `best`
  heuristic planner's plan (shift reordering and recomputation in the gaps between reads
  included), replayed, with the order-free bound (every node computed once) as its proven
  bound, so that the plan carries a gap; when the plan recomputes, the window bound of the
  stage model in the plan's order of first computations (`window_bound`, linear in the graph
  per window), where it is higher, with `Route.order` saying which order it holds for.

The routes' thresholds and shares are measured choices (bench/README.md, issue 29); each route
returns the `Result` of `Problem.solve`'s kind, every plan replayed by the simulator.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace

from .. import load
from ..language.resources import models_dir
from ..plans import planners as registry
from ..plans.planners.portfolio import plan_best
from ..plans.planners.prune import prune_recomputations
from ..plans.simulate import simulate
from ..problem import AUTO, AUTO_PLANNERS, Problem, run_named_planner
from ..results import Result
from . import order_free
from .incumbent import SAME, order_free_bound
from .ladder import ladder_plans
from .linked_windows import linked_window_bound
from .orders import GRAPH_ORDER, SEQUENCE_ORDER, SHIFT_ORDER, describe, first_computations, in_order
from .route import Route, Step
from .solution import Status
from .solvers import is_available, requested_gap
from .solvers.cpsat import PORTFOLIO_WORKERS
from .status import relative_gap, within_gap
from .window_bound import window_bound

#: Checkmate-view graphs up to this many nodes are solved as written (today's path)
SMALL_NODES = 50
#: above this many nodes the stage model is not built: heuristic plans with a proven bound
LARGE_NODES = 300
#: the large-graph route's heuristic planners get this share of the time limit, and its window
#: bound this share of what they leave (at most `BOUND_SECONDS`)
LARGE_PLAN_SHARE = 0.8
LARGE_BOUND_SHARE = 0.5
#: the share of the time limit CP-SAT gets on the op-graph route (HiGHS the rest)
CPSAT_SHARE = 0.4
#: CP-SAT's seconds on the op-graph route without a time limit (HiGHS then runs to the end)
CPSAT_SECONDS = 60.0
#: the equivalent reformulation the op-graph route solves
TIGHT_MODEL = "checkmate_tight"
#: phase one's extension (the budget as a goal) and its share of the time left
SOFT_BUDGET = "soft_budget.sched"
PHASE_ONE_SHARE = 0.8
#: phase one's solvers in turn, each with its share of what phase one has left; the next one
#: starts from the least excess the last one reached. Neither wins everywhere (60 s, from the
#: same start): HiGHS fits gpt1 at 65% in 5 s and `stages` at 60% in 15 s, where CP-SAT takes
#: 30 s and finds none; CP-SAT fits bert1 at 60% in 7 s, where HiGHS ends 3.3 KB over after
#: 42 s and after 236 s (bench/README.md, issue 29)
PHASE_ONE_SOLVERS = (("highs", 0.4), ("cpsat", 1.0))
SOLVER_WORDS = {"highs": "HiGHS", "cpsat": "CP-SAT"}
#: the share of the time left (and the most seconds) the op-graph route's window bound may take
BOUND_SHARE = 0.1
BOUND_SECONDS = 30.0
#: the same for the linked windows (one MILP over the memory at several computations)
LINKED_SHARE = 0.2
LINKED_SECONDS = 60.0
#: the same for planner shift's reordering on the op-graph route
SHIFT_SHARE = 0.05
SHIFT_SECONDS = 10.0
#: the share of CP-SAT's time on the op-graph route that goes to the other node order (the
#: graph's when the stage model takes shift's, and shift's when recompute_gaps fits in it but
#: the graph's order starts faster): which order has the faster plans is not known from the
#: starts (gpt1 at 80%: shift's order starts 0.4% faster, and its plans stay 21% slower than
#: the graph order's at 70%)
OTHER_ORDER_SHARE = 0.25


def is_shipped_checkmate(problem: Problem) -> bool:
    """Whether the formulation is `models/checkmate.sched` as shipped: every declaration and
    the objective come from that file, nothing extends or overrides them."""
    program = problem.program
    shipped = str((models_dir() / "checkmate.sched").resolve())
    if program.model is None or program.model.name != "checkmate" or program.extensions \
            or program.objective_terms or program.param_tables or program.objective is None:
        return False

    def from_shipped(node) -> bool:
        loc = getattr(node, "loc", None)
        try:
            return loc is not None and str(os.path.realpath(loc.path)) == shipped
        except (TypeError, ValueError):
            return False

    return all(from_shipped(d) for d in program.decls.values()) and from_shipped(program.objective)


def choose(problem: Problem) -> Route:
    """The route for `problem` (module docstring)."""
    graph = problem.graph
    if graph is None or graph.is_layered:
        return Route("as written", "layered data" if graph is not None else "no graph data")
    if not is_shipped_checkmate(problem):
        return Route("as written", f"the formulation is {problem.program.name}, not the shipped "
                     "checkmate")
    n = len(graph.nodes)
    if n <= SMALL_NODES:
        return Route("as written", f"{n} nodes <= {SMALL_NODES}")
    if n > LARGE_NODES:
        return Route("large graph", f"{n} nodes > {LARGE_NODES}: no n^2 stage model")
    return Route("op graph", f"{n} nodes", TIGHT_MODEL)


def solve(problem: Problem, time_limit: float | None = None, gap: float | None = None,
          threads: int | None = None, presolve: bool = True, verbose: bool = False,
          progress=None, since: float | None = None) -> Result:
    """Solve `problem` by its route (`choose`); `Result.strategy` says what was used."""
    since = time.monotonic() if since is None else since
    route = choose(problem)
    if route.name == "large graph":
        result = _large_graph(problem, route, time_limit, since)
    elif route.name == "op graph":
        result = _op_graph(problem, route, time_limit, gap, threads, presolve, verbose,
                           progress, since)
    else:
        if problem.ir is None:
            problem.lower()
        seeded = _order_free_first(problem, route, time_limit, since, threads)
        target, start = (problem, "auto") if seeded is None else seeded[:2]
        t0 = time.perf_counter()
        result = target.solve(solver="highs", time_limit=_left(time_limit, since), gap=gap,
                              threads=threads, presolve=presolve, warm_start=start,
                              verbose=verbose, progress=progress, since=since)
        route.model = problem.program.name
        route.order = GRAPH_ORDER if problem.graph is not None and not problem.graph.is_layered \
            else None
        route.steps.append(_step("highs", route.model, t0, result,
                                 "" if seeded is None else "from the order-free model's plan"))
        if seeded is not None:
            route.order = SEQUENCE_ORDER
            result = _faster(result, [seeded[2]], route)
    result.strategy = route
    return result


def _order_free_first(problem: Problem, route: Route, time_limit, since, threads):
    """(the shipped checkmate in the order of the order-free model's plan, that plan, the plan
    as a `Result` with the every-plan bound) for a small Checkmate-view graph with the shipped
    checkmate on which no heuristic plan fits, when CP-SAT on `models/sequence.sched`
    (`schedlang.solve.order_free`, its share of the time) finds one; else None."""
    graph = problem.graph
    if graph is None or graph.is_layered or len(graph.nodes) > SMALL_NODES \
            or not is_shipped_checkmate(problem) or not order_free.available():
        return None
    start, _, _, _ = _start_plan(problem, route)
    if start is not None:
        return None  # a heuristic plan fits: the model's own start
    left = _left(time_limit, since)
    seconds = order_free.SEQUENCE_SECONDS if left is None else order_free.SEQUENCE_SHARE * left
    sequence = _load_like(problem, [order_free.SEQUENCE_MODEL])
    plan, sim = order_free.order_free_plan(sequence, problem, route, seconds, threads)
    ordered = None if plan is None else order_free.graph_in_its_order(problem, plan)
    if ordered is None:
        return None
    staged = load(model=["checkmate"], graph=ordered)
    staged.program.budgets.update(problem.budgets)
    staged.started = problem.started
    staged.lower()
    # the stage model's start: the plan with each stage's computations in node order, when
    # that fits too (else the stage model starts cold, and the plan stays the answer to beat)
    stages = order_free.in_stage_form(plan, ordered)
    fits = simulate(stages, ordered, budget=problem.budgets.get("peak")).valid
    return staged, stages if fits else "auto", _replayed(problem, plan, sim, "order-free (CP-SAT on "
                                   "models/sequence.sched)", {"plan": 0.0})


def _step(what: str, model: str | None, t0: float, result: Result, note: str = "") -> Step:
    return Step(what, model, time.perf_counter() - t0, result.status.value, result.objective,
                result.bound, note)


def _left(time_limit: float | None, since: float) -> float | None:
    return None if time_limit is None else max(0.0, since + time_limit - time.monotonic())


# --------------------------------------------------------------------------- large graphs

def _large_graph(problem: Problem, route: Route, time_limit: float | None, since: float) -> Result:
    """The `best` heuristic plan, replayed, with the order-free bound, or the window bound in
    the plan's node order where that is higher (`_in_its_order`)."""
    t0 = time.perf_counter()
    peak = problem.budgets.get("peak")
    left = _left(time_limit, since)
    # within the time limit, less the bound's, the replay's and the output's share
    plan = plan_best(problem.graph, peak, **({} if left is None else
                                             {"time_limit": LARGE_PLAN_SHARE * left}))
    plan.budget_peak = peak
    timings = {**problem.timings, "plan": time.perf_counter() - t0}
    t1 = time.perf_counter()
    sim = simulate(plan, problem.graph, budget=peak)
    timings["simulate"] = time.perf_counter() - t1
    chosen = plan.meta.get("chosen", "best")
    route.model = None
    if sim.valid:
        result = _replayed(problem, plan, sim, f"{chosen} (the best of the heuristic planners)",
                           timings)
        route.steps.append(Step("planner", None, time.perf_counter() - t0, result.status.value,
                                result.objective, result.bound, chosen))
        if result.status != Status.OPTIMAL:
            result = _in_its_order(problem, result, chosen, route, time_limit, since)
        return result
    over = "" if not peak else f", {100 * (sim.peak_bytes - peak) / peak:.1f}% over"
    message = (f"no heuristic plan fits the budget (the lowest peak, planner {chosen}: "
               f"{sim.peak_bytes} B{over}); the stage model of {len(problem.graph.nodes)} "
               f"nodes is not built (n^2 columns: `--model checkmate` builds it where "
               f"`--max-elements` allows)")
    bound = order_free_bound(problem.graph)
    route.steps.append(Step("planner", None, time.perf_counter() - t0,
                            Status.NO_SOLUTION.value, None, bound, chosen))
    return Result(Status.NO_SOLUTION, None, bound, None, "none", "none", {}, timings, None, None,
                  None, message, problem.budgets.get("peak"))


def _in_its_order(problem: Problem, result: Result, chosen: str, route: Route, time_limit,
                  since) -> Result:
    """`result` with the window bound (`schedlang.solve.window_bound`) of the stage model in
    its plan's order of first computations, when that is above the order-free bound: status,
    gap and bound are then for plans in that order (`Route.order` and the message say so).
    On a 963-node transformer op graph at 80% of its plain peak, the order-free bound leaves
    recompute_gaps's plan a gap of 3.98%, the window bound in the graph's order 0.43% (3 s)."""
    order = first_computations(result.plan)
    graph = problem.graph
    named = GRAPH_ORDER if order == [x.name for x in graph.nodes] else (
        SHIFT_ORDER if "shift" in chosen else chosen)
    ordered = graph if named == GRAPH_ORDER else in_order(graph, order)
    left = _left(time_limit, since)
    seconds = BOUND_SECONDS if left is None else min(BOUND_SECONDS, LARGE_BOUND_SHARE * left)
    if ordered is None or seconds <= 0:
        return result
    t0 = time.perf_counter()
    try:
        windows = window_bound(ordered, problem.budgets.get("peak"), time_limit=seconds)
    except KeyboardInterrupt:  # (Ctrl-C: the plan in hand is the answer, as on op graphs)
        result.message = f"{result.message}; interrupted while bounding"
        return result
    if windows is None or result.bound is not None and windows.bound <= result.bound:
        return result
    route.steps.append(Step("bound", None, time.perf_counter() - t0, "bound",
                            bound=windows.bound, note="memory windows"))
    route.order = named
    status, gap = _against(float(result.objective), windows.bound)
    above = "" if result.bound is None else f", above the order-free {result.bound:.6g}"
    said = (f"window bound {windows.bound:.6g} ({windows.describe()}){above}; status, gap and "
            f"bound are for {describe(named)}")
    return replace(result, status=status, bound=windows.bound, gap=gap,
                   message=f"{result.message}; {said}",
                   timings={**result.timings, "bound": time.perf_counter() - t0})


def _against(objective: float, bound: float | None) -> tuple[Status, float | None]:
    """(status, gap) of a replayed heuristic plan of time `objective` against a proven lower
    `bound`: optimal when it meets the bound, else feasible with the relative gap."""
    if bound is not None and objective <= bound * (1 + 1e-9) + 1e-12:
        return Status.OPTIMAL, 0.0
    gap = None if bound is None else max(0.0, objective - bound) / max(abs(objective), 1e-12)
    return Status.FEASIBLE, gap


def _replayed(problem: Problem, plan, sim, chosen: str, timings: dict) -> Result:
    """The `Result` of a heuristic plan that fits (replayed: `sim`), with the order-free bound
    (every node computed once, in any order): optimal when its time meets it."""
    bound = order_free_bound(problem.graph)
    objective = float(sim.time)
    status, gap = _against(objective, bound)
    message = (f"the plan of planner {chosen}; bound: the sum of the node times (every node "
               f"computed once)")
    return Result(status, objective, bound, gap, "none", "none", {},
                  {**problem.timings, **timings}, plan, sim, None, message,
                  problem.budgets.get("peak"))


# --------------------------------------------------------------------------- op graphs

def _op_graph(problem: Problem, route: Route, time_limit, gap, threads, presolve, verbose,
              progress, since) -> Result:
    """On the tight reformulation: a fitting plan (a heuristic's, else phase one's), the
    window bound (`window_bound`), CP-SAT from the plan (a share of it in the other node
    order, `OTHER_ORDER_SHARE`, the faster order going on), then HiGHS from CP-SAT's best plan,
    unless the bound already closes the gap; the better plan and the best bound, or a faster
    plan of another order that the route had in hand (`_faster`)."""
    reordered, shift_order = _reordered(problem, route, time_limit, since)
    if reordered is not None and reordered.status == Status.OPTIMAL:
        return reordered  # no recomputation: no plan in any order is faster
    tight = _load_like(problem, [TIGHT_MODEL])
    kw = {"gap": gap, "presolve": presolve, "verbose": verbose, "progress": progress}
    start, start_note, lowest, start_time = _start_plan(tight, route)
    main = Side(GRAPH_ORDER, tight, start, start_note)
    other = _shift_side(problem, route, start_time, shift_order)
    if other is not None and other.faster:
        main, other = other, main
    route.order, tight, start, start_note = main.order, main.tight, main.start, main.note
    kept = [reordered, *(_as_candidate(problem, s) for s in (main, other) if s is not None)]
    if start is None:
        start, start_note, proof = _phase_one(problem, route, lowest, time_limit, since, kw,
                                                  threads)
        if proof is not None:
            return _faster(proof, kept, route)
    try:
        windows = _window_bound(tight, route, time_limit, since)
    except KeyboardInterrupt:  # Ctrl-C while bounding: keep the plan found so far, as a
        if start is None:      # solver's interrupt keeps its incumbent
            raise
        return _interrupted(problem, start, start_note, since)
    results: list[Result] = []
    if is_available("cpsat", "pyomo"):
        cp, switched = _cpsat_steps(problem, route, main, other, start, start_note, time_limit,
                                    since, threads, kw)
        if switched is not None:  # the other order's plan is faster: it goes on
            route.order, tight, windows = switched.order, switched.tight, None
            kept.append(_as_candidate(problem, main, cp[0]))
            cp = cp[1:]
        results += cp
        last = results[-1]
        if last.status in (Status.OPTIMAL, Status.INFEASIBLE) or _closed(tight, last, windows,
                                                                          gap):
            return _faster(_combine(tight, results, gap, windows), kept, route)
        if last.status.has_solution and last.plan is not None and last.simulated.valid:
            start, start_note = last.plan, "from CP-SAT's plan"
    t0 = time.perf_counter()
    hi = tight.solve(solver="highs", time_limit=_left(time_limit, since), threads=threads,
                     warm_start=start, **kw)
    route.steps.append(_step("highs", TIGHT_MODEL, t0, hi, start_note))
    results.append(hi)
    return _faster(_combine(tight, results, gap, windows), kept, route)


@dataclass
class Side:
    """One node order of the stage model on the op-graph route: `tight`, the tight model in
    that order, and its start (None: no heuristic plan fits in it); `faster`: its start is
    faster than the graph order's (the route's main order then)."""

    order: str
    tight: Problem
    start: object
    note: str
    faster: bool = False


def _cpsat_steps(problem: Problem, route: Route, main: Side, other: Side | None, start,
                 start_note: str, time_limit, since, threads, kw):
    """([the main order's CP-SAT result], None), or with the other order tried first for
    `OTHER_ORDER_SHARE` of CP-SAT's time: ([main's, other's], None) when main's plan is at
    least as fast, ([main's, other's] with `other` to go on) when the other order's plan is
    faster (or main has none): the route then solves in that order."""
    left = _left(time_limit, since)
    share = CPSAT_SECONDS if left is None else CPSAT_SHARE * left
    alt = None
    if other is not None:
        t0 = time.perf_counter()
        alt = other.tight.solve(solver="cpsat", time_limit=OTHER_ORDER_SHARE * share,
                                threads=_cpsat_workers(threads),
                                warm_start=other.start if other.start is not None else AUTO, **kw)
        route.steps.append(_step("cpsat", TIGHT_MODEL, t0, alt, f"in {_order_words(other)}, "
                                 f"{other.note or 'cold'}"))
        share *= 1.0 - OTHER_ORDER_SHARE
    t0 = time.perf_counter()
    cp = main.tight.solve(solver="cpsat", time_limit=share, threads=_cpsat_workers(threads),
                          warm_start=start, **kw)
    route.steps.append(_step("cpsat", TIGHT_MODEL, t0, cp, start_note))
    if alt is None:
        return [cp], None
    if _has_plan(alt) and (not _has_plan(cp) or alt.objective < cp.objective * (1 - 1e-9)):
        return [cp, alt], other
    return [cp], None


def _order_words(side: Side) -> str:
    return "the graph's order" if side.order == GRAPH_ORDER else f"{side.order}'s order"


def _has_plan(result: Result) -> bool:
    return (result.status.has_solution and result.plan is not None and result.objective is not None
            and result.simulated is not None and result.simulated.valid)


def _as_candidate(problem: Problem, side: Side, result: Result | None = None) -> Result | None:
    """`side`'s start plan (or `result`'s plan), replayed, as a `Result` with the order-free
    bound: a plan the route had in hand, returned when the route ends with nothing faster."""
    plan = side.start if result is None else (result.plan if _has_plan(result) else None)
    if plan is None or isinstance(plan, str):
        return None
    sim = simulate(plan, problem.graph, budget=problem.budgets.get("peak"))
    if not sim.valid:
        return None
    what = (plan.meta.get("planner", "the start") if result is None else "CP-SAT") + \
        f", in {_order_words(side)}"
    return _replayed(problem, plan, sim, what, {"plan": 0.0})


def _cpsat_workers(threads: int | None) -> int:
    """CP-SAT's workers on the op-graph route: the user's --threads, else `PORTFOLIO_WORKERS`."""
    return PORTFOLIO_WORKERS if threads is None else threads


def _reordered(problem: Problem, route: Route, time_limit,
               since) -> tuple[Result | None, list[str] | None]:
    """(planner shift's plan as a `Result` with the order-free bound when it fits the budget,
    else None; shift's order of the nodes, or None). Shift reorders the nodes and recomputes
    nothing (within its share of the time left): a reordered plan may be faster than the
    optimum of the stage model in the graph's order (random layered graphs at 90%: no
    recomputation at all), and its order may be a better one for the stage model."""
    table = registry.planners()
    if "shift" not in table:
        return None, None
    left = _left(time_limit, since)
    seconds = SHIFT_SECONDS if left is None else min(SHIFT_SECONDS, SHIFT_SHARE * left)
    peak = problem.budgets.get("peak")
    t0 = time.perf_counter()
    try:
        plan = table["shift"].run(problem.graph, peak, time_limit=max(0.5, seconds))
    except Exception:  # noqa: BLE001 (the model's route goes on without it)
        return None, None
    plan.budget_peak = peak
    sim = simulate(plan, problem.graph, budget=peak)
    order = first_computations(plan)
    if not sim.valid:
        route.steps.append(Step("planner", None, time.perf_counter() - t0, "no_solution",
                                note="shift (reordered): over the budget"))
        return None, order
    result = _replayed(problem, plan, sim, "shift", {"plan": time.perf_counter() - t0})
    route.steps.append(Step("planner", None, time.perf_counter() - t0, result.status.value,
                            result.objective, result.bound, "shift (reordered)"))
    return result, order


def _shift_side(problem: Problem, route: Route, start_time: float | None,
                order: list[str] | None) -> Side | None:
    """The stage model in shift's node order (`Side`) when recompute_gaps in that order
    (needless recomputations undone) fits the budget, `faster` when it is faster than the
    graph order's start (`start_time`, its time in the model; None: none fits), else None.
    The stage model's plans keep their order of first computations, and a start in a better
    order is one its solvers do not reach from the graph's (`schedlang.solve.orders`)."""
    graph, peak = problem.graph, problem.budgets.get("peak")
    table = registry.planners()
    if order is None or order == [n.name for n in graph.nodes] or "recompute_gaps" not in table:
        return None
    shifted = in_order(graph, order)
    if shifted is None:
        return None
    t0 = time.perf_counter()
    try:
        plans = [table["recompute_gaps"].run(shifted, peak)]
    except Exception:  # noqa: BLE001 (the graph's order goes on)
        return None
    plans[0] = prune_recomputations(shifted, plans[0], peak)
    plans[0].meta["planner"] = "recompute_gaps"
    plans += ladder_plans(shifted, peak)
    # (the fastest that fits, at the budget or below it: the graph order's start has the same)
    replays = [(p, simulate(p, shifted, budget=peak)) for p in plans]
    plan, sim = min(replays, key=lambda ps: (not ps[1].valid, float(ps[1].time or 0.0)))
    # (against the start's time in the model, not a replay of the planner's plan as it is:
    # the model runs it with its own deletions, and the plan as written may peak above the
    # budget where the model's does not: resnet at 60%, by 871 B)
    faster = sim.valid and (start_time is None or sim.time < start_time * (1 - 1e-9))
    route.steps.append(Step("planner", None, time.perf_counter() - t0,
                            "feasible" if sim.valid else "no_solution",
                            float(sim.time) if sim.valid else None,
                            note="recompute_gaps in shift's order" + (
                                ": faster, the model takes that order" if faster else "")))
    if not sim.valid:
        return None
    plan.meta["planner"] = f"{plan.meta.get('planner', 'recompute_gaps')} (shift's order)"
    return Side(SHIFT_ORDER, _load_like(problem, [TIGHT_MODEL], shifted), plan,
                "from recompute_gaps's plan in shift's order", faster)


def _faster(result: Result, kept: list[Result | None], route: Route) -> Result:
    """The fastest of the plans the route had in hand (`kept`: `Result`s of replayed plans,
    each with the order-free bound, None entries ignored: shift's reordered plan, the starts
    of each node order, a CP-SAT plan of the order not taken) when it is faster than
    `result`'s plan (or `result` has none), with what the model proved in its message; else
    `result`, its message saying which stage model (node order) its optimum and bound are for."""
    held = [r for r in kept if r is not None and r.objective is not None]
    best = min(held, key=lambda r: r.objective) if held else None
    # (faster by more than rounding: the model's objective and a replay's sum of the same
    # node times differ in the last digits, and the model's answer carries its own bound)
    if best is None or (result.objective is not None and result.plan is not None
                        and result.objective <= best.objective + SAME * (1.0 + abs(best.objective))):
        if route.order is not None:  # (an infeasibility proof too: another order may fit)
            result.message = "; ".join(m for m in (
                result.message, f"status, gap and bound are for {describe(route.order)}") if m)
        return result
    said = f"{describe(route.order or GRAPH_ORDER)}: {result.status.value}" + (
        f", {result.objective:.6g}" if result.objective is not None else "") + (
        f", bound {result.bound:.6g}" if result.bound is not None else "")
    best.message = f"{best.message}; faster than {said}"
    best.strategy = route
    return best


def _window_bound(tight: Problem, route: Route, time_limit, since):
    """The window bound (`schedlang.solve.window_bound`) within its share of the time left,
    then the linked windows (`schedlang.solve.linked_windows`) within theirs, each a step of
    the route; the larger of the two, or None when they do not apply."""
    windows = _bound_step(window_bound, tight, route, time_limit, since,
                          BOUND_SECONDS, BOUND_SHARE, "memory windows")
    if windows is None:
        return None
    linked = _bound_step(linked_window_bound, tight, route, time_limit, since,
                         LINKED_SECONDS, LINKED_SHARE, "linked memory windows")
    return linked if linked is not None and linked.bound > windows.bound else windows


def _bound_step(bound_of, tight: Problem, route: Route, time_limit, since, most: float,
                share: float, note: str):
    """`bound_of` on the tight problem's graph and budget within its share of the time left
    (at most `most` seconds), reported as a step of the route; None when it does not apply."""
    left = _left(time_limit, since)
    seconds = most if left is None else min(most, share * left)
    t0 = time.perf_counter()
    found = bound_of(tight.graph, tight.budgets.get("peak"), time_limit=seconds)
    if found is not None:
        route.steps.append(Step("bound", None, time.perf_counter() - t0, "bound",
                                bound=found.bound, note=note))
    return found


def _interrupted(problem: Problem, start, start_note: str, since: float) -> Result:
    """The start plan, replayed, as the answer of a solve interrupted (Ctrl-C) before a solver
    ran: feasible with the order-free bound (optimal only when it meets it)."""
    t0 = time.perf_counter()
    peak = problem.budgets.get("peak")
    sim = simulate(start, problem.graph, budget=peak)
    if not sim.valid:
        raise KeyboardInterrupt
    timings = {"solve": t0 - since, "simulate": time.perf_counter() - t0}
    result = _replayed(problem, start, sim, f"the start plan ({start_note})", timings)
    result.message = f"interrupted while bounding; {result.message}"
    return result


def _closed(tight: Problem, result: Result, windows, gap: float | None) -> bool:
    """Whether `result`'s plan is within the requested gap of the window bound."""
    return (windows is not None and result.status.has_solution and result.objective is not None
            and result.simulated is not None and result.simulated.valid
            and within_gap(tight.ir, result.objective, windows.bound,
                           requested_gap(result.solver, gap)))


def _load_like(problem: Problem, models: list[str], graph=None) -> Problem:
    """`problem`'s graph (or `graph`, the same in another node order) and budgets with the
    formulation `models`, lowered."""
    other = load(model=models, graph=problem.graph if graph is None else graph)
    other.program.budgets.update(problem.budgets)
    other.started = problem.started
    other.lower()
    return other


def _start_plan(tight: Problem, route: Route):
    """(the MIP start, how it is described, the plan with the lowest peak, the start's time in
    the model): the fastest fitting plan of the auto planners and recompute_gaps, the latter
    also at smaller budgets (`ladder.ladder_plans`) (plans in the graph's order, so in the
    model's stage space), each with its needless recomputations undone (`planners.prune`), or
    None (and time None) when none fits."""
    t0 = time.perf_counter()
    budget = tight.budgets.get("peak")
    tried = []
    for name in (*AUTO_PLANNERS, "recompute_gaps"):
        try:
            plan = run_named_planner(name, tight.graph, budget)
        except Exception:  # noqa: BLE001, S112 (a planner's failure leaves the others)
            continue
        plan = prune_recomputations(tight.graph, plan, budget)
        plan.meta["planner"] = name
        tried.append(tight.prepare_warm_start(plan))
    # (phase one starts from the lowest peak at the budget itself: from the ladder's lowest,
    # gpt1 at 65% took 15.2 s instead of 5.8 s and the route ended at 0.006595, not 0.005830)
    replayed = [ws for ws in tried if ws.valid and ws.plan is not None]
    tried += [tight.prepare_warm_start(plan) for plan in ladder_plans(tight.graph, budget)]
    fitting = [ws for ws in tried if ws.feasible and ws.objective is not None]
    lowest = min(replayed, key=lambda ws: ws.peak_bytes).plan if replayed else None
    seconds = time.perf_counter() - t0
    if not fitting:
        route.steps.append(Step("planner", None, seconds, "no_solution",
                                note="no heuristic plan fits"))
        return None, "", lowest, None
    best = min(fitting, key=lambda ws: ws.objective)
    route.steps.append(Step("planner", None, seconds, "feasible", best.objective,
                            note=best.planner))
    return best.plan, f"from {best.planner}'s plan", lowest, best.objective


def _phase_one(problem: Problem, route: Route, lowest, time_limit, since, kw, threads=None):
    """(start, note, proof): the solvers of `PHASE_ONE_SOLVERS` in turn lower the excess memory
    of the lowest-peak heuristic plan (`models/extensions/soft_budget.sched`) until a plan fits
    (the start), for `PHASE_ONE_SHARE` of the time left (without a time limit, HiGHS alone,
    to the end); `proof` is an infeasible `Result` when one proves the least excess above zero.
    Without a fitting plan the start is "auto" (the solvers start cold)."""
    soft = _load_like(problem, [TIGHT_MODEL, str(models_dir() / "extensions" / SOFT_BUDGET)])
    left = _left(time_limit, since)
    until = None if left is None else time.monotonic() + PHASE_ONE_SHARE * left
    solvers = [("highs", 1.0)] if left is None else \
        [(s, part) for s, part in PHASE_ONE_SOLVERS if is_available(s, "pyomo")]
    start = lowest if lowest is not None else AUTO
    note = "excess memory, from the lowest-peak heuristic plan" if lowest is not None else \
        "excess memory, cold"
    for solver, part in solvers:
        limit = None if until is None else part * max(0.0, until - time.monotonic())
        if limit is not None and limit < 1.0:  # (a share too short to build the model in)
            continue
        t0 = time.perf_counter()
        res = soft.solve(solver=solver, time_limit=limit, warm_start=start,
                         **({"threads": _cpsat_workers(threads)} if solver == "cpsat" else {}),
                         **kw)
        route.steps.append(_step(solver, SOFT_BUDGET, t0, res, note))
        fits = (res.plan is not None and res.simulated is not None and res.simulated.valid
                and res.objective is not None and res.objective <= 0)
        if res.status == Status.OPTIMAL and not fits and res.objective is not None:
            res.status = Status.INFEASIBLE
            res.message = (f"infeasible: no plan fits the budget (the least excess over it is "
                           f"{res.objective:.6g} MiB, proven optimal with "
                           f"models/extensions/{SOFT_BUDGET}); " + res.message)
            res.plan = res.simulated = None
            res.objective = res.bound = res.gap = None
            return None, "", res
        if res.status == Status.INFEASIBLE:  # (its rows hold for every plan: the graph's own)
            return None, "", res
        if fits:
            plan = prune_recomputations(problem.graph, res.plan, problem.budgets.get("peak"))
            plan.meta["planner"] = "phase one"
            return plan, "from phase one's plan", None
        if res.plan is not None and res.status.has_solution:
            start, note = res.plan, f"excess memory, from {SOLVER_WORDS[solver]}'s least"
    return AUTO, "cold", None


def _combine(tight: Problem, results: list[Result], gap: float | None, windows=None) -> Result:
    """The result with the fastest valid plan, with the best bound of all (both solved the
    same model: each bound and each proof holds for it, and so does the window bound)."""
    ir = tight.ir
    proven = [r for r in results if r.status == Status.INFEASIBLE]
    if proven:
        return proven[0]
    solved = [r for r in results if r.status.has_solution and r.simulated is not None
              and r.simulated.valid]
    bounds = [r.bound for r in results if r.bound is not None]
    if windows is not None:
        bounds.append(windows.bound)
    if not solved:
        last = results[-1]
        if bounds:
            last.bound = max(bounds)
        return last
    best = min(solved, key=lambda r: r.objective)
    bound = max(bounds) if bounds else best.bound
    status = best.status
    if any(r.status == Status.OPTIMAL for r in results) and bound is not None:
        status = Status.OPTIMAL if within_gap(ir, best.objective, bound, requested_gap(
            best.solver, gap)) else best.status
    elif bound is not None and within_gap(ir, best.objective, bound,
                                          requested_gap(best.solver, gap)):
        status = Status.OPTIMAL
    out = replace(best, status=status, bound=bound,
                  gap=relative_gap(ir, best.objective, bound) if bound is not None else None)
    others = [f"{r.solver}: {r.status.value}" + (f", bound {r.bound:.6g}" if r.bound else "")
              for r in results if r is not best]
    if windows is not None:
        others.append(f"window bound {windows.bound:.6g} ({windows.describe()})")
    if others:
        out.message = "; ".join(m for m in (out.message, "also " + ", ".join(others)) if m)
    return out
