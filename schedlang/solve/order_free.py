"""The order-free step of the default solve: CP-SAT on `models/sequence.sched` for small
Checkmate-view graphs on which no heuristic plan fits.

The stage model (`checkmate.sched`) keeps the graph's order of first computations; on a small op
graph at a tight budget that order may have no plan at all while another order has one (the
traced 3-layer MLP, `bench/data/opgraphs/mlp3.sched`, at 85% of its plain peak: the stage model
in its order is infeasible, proven by `checkmate_tight`; the default solve ended 60 s without a
plan). The step model has no order: CP-SAT finds a plan on it in seconds there. Its plan then
hands on its order of first computations (the stage model is built in that order,
`orders.in_order`, and solved from the plan: its status, gap and bound are for that order,
`Route.order` = `SEQUENCE_ORDER`), and is the answer, with the bound every plan has (each node
computed once), when the stage model ends with nothing faster.

On larger op graphs (the op-graph route, 50 to 300 nodes) the step model measured slower than
the stage model in a good order (bench/README.md, "The order-free model"), so it runs only on
graphs of the small route. Its own bound and an infeasibility proof hold for plans of at most
card(nodes) + recomputations computations only: neither is reported as the problem's.
"""
from __future__ import annotations

import time

from ..plans.decoders.steps import step_computations, step_count
from ..plans.plan import Op, Plan
from ..plans.planners.prune import prune_recomputations
from ..plans.simulate import simulate
from ..problem import Problem
from .orders import first_computations, in_order
from .route import Route, Step
from .solvers import is_available

#: the step model (models/sequence.sched)
SEQUENCE_MODEL = "sequence"
#: the share of the time left CP-SAT spends on it, and its seconds without a time limit
SEQUENCE_SHARE = 0.3
SEQUENCE_SECONDS = 60.0


def available() -> bool:
    return is_available("cpsat", "pyomo")


def order_free_plan(sequence: Problem, problem: Problem, route: Route, seconds: float,
                    threads: int | None):
    """(the plan, pruned and replayed within `problem`'s budget, or None; its `SimResult`):
    CP-SAT on `sequence` (the step model on `problem`'s graph and budgets) for `seconds`,
    reported as a step of the route."""
    graph = problem.graph
    assert graph is not None  # (the caller's gate: a Checkmate-view graph)
    t0 = time.perf_counter()
    result = sequence.solve(solver="cpsat", time_limit=seconds, threads=threads,
                            warm_start="auto")
    peak = problem.budgets.get("peak")
    plan = sim = None
    if result.status.has_solution and result.plan is not None:
        plan = prune_recomputations(graph, result.plan, peak)
        plan.meta["planner"] = "order-free (models/sequence.sched)"
        sim = simulate(plan, graph, budget=peak)
        if not sim.valid:
            plan = sim = None
    steps = step_count(sequence.program.decode, sequence.ir) if sequence.ir is not None else 0
    route.steps.append(Step("cpsat", SEQUENCE_MODEL, time.perf_counter() - t0,
                            result.status.value, None if sim is None else float(sim.time),
                            None, f"order-free: status for plans of at most {steps} "
                            "computations"))
    return plan, sim


def graph_in_its_order(problem: Problem, plan):
    """`problem`'s graph with its nodes in the order of `plan`'s first computations (None
    when that is not an order of all of them)."""
    graph = problem.graph
    return None if graph is None else in_order(graph, first_computations(plan))


def in_stage_form(plan: Plan, ordered) -> Plan:
    """`plan` as the stage model in `ordered` (the graph in the order of the plan's first
    computations) runs it: the recomputations before each first computation in node order,
    each once, and every output deleted right after its last read before it is computed
    again (eager). The same computations, so the same time; the memory may differ from the
    plan's, and the caller replays it (the stage model's start, when it fits)."""
    position = {n.name: i for i, n in enumerate(ordered.nodes)}
    seen: set[str] = set()
    stage: set[str] = set()
    computes: list[str] = []
    for op in plan.ops:
        if op.op != "compute" or op.node is None:
            continue
        if op.node in seen:
            stage.add(op.node)
            continue
        computes += sorted(stage, key=position.__getitem__) + [op.node]
        seen.add(op.node)
        stage = set()
    order, needed = step_computations(Plan(graph=plan.graph, ops=[
        Op("compute", node=v) for v in computes]), ordered)
    ops: list[Op] = []
    live: set[str] = set()
    for s, v in enumerate(order):
        ops.append(Op("compute", node=v))
        live.add(v)
        for u in sorted(live - needed[s], key=position.__getitem__):
            ops.append(Op("delete", data=u))
        live &= needed[s]
    return Plan(graph=plan.graph, ops=ops, budget_peak=plan.budget_peak,
                meta={**plan.meta, "planner": "order-free (models/sequence.sched), in stages"})
