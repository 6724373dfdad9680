"""The Python API: load -> check -> lower -> solve -> decode -> simulate, timed per stage.

    prob = schedlang.load("examples/chain.sched", budget="90%")
    result = prob.solve(backend="pyomo", solver="highs", time_limit=60)
    result.status, result.objective, result.plan, result.simulated

`schedlang.cli.main` is a thin layer over this module.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import budgets
from . import progress as reporting
from .compile.ir import IRModel
from .compile.lower import lower_program
from .graphs.checkmate_nx import is_node_link_file, load_checkmate_nx
from .graphs.graph import Graph
from .language.check import check_program
from .language.errors import CheckError, Loc, SchedError, did_you_mean
from .language.program import Program, attach_graph, load_program, set_params
from .plans import planners as registry
from .plans.decoders import decode, encode, plan_space
from .plans.decoders.encode import check_point, objective_value
from .plans.plan import Plan
from .plans.planners import graph_view, run_planner
from .plans.planners.no_recompute import no_recompute_plan
from .plans.simulate import NO_LIMIT, SimResult, simulate
from .results import PlanReport, Result, WarmStart
from .solve import backends
from .solve.incumbent import at_bound, keep_better, outside_incumbent, outside_result
from .solve.solution import Solution, Status
from .solve.solvers import requested_gap, supports_warm_start
from .solve.solvers.highs import WATCHDOG_GRACE
from .solve.status import relative_gap, within_gap

log = logging.getLogger("schedlang")

# the budget parser (schedlang.budgets), under the name callers have imported it by
resolve_budget = budgets.for_graph




@dataclass
class Problem:
    program: Program
    timings: dict = field(default_factory=dict)
    ir: IRModel | None = None
    max_elements: int | None = None  # the size guard's limit (sizes.py); None: the default
    # time.monotonic() when `load` began (the CLI's `solve --time-limit` counts from here)
    started: float = field(default_factory=time.monotonic)

    @property
    def graph(self) -> Graph | None:
        return self.program.graph

    @property
    def budgets(self) -> dict:
        return self.program.budgets

    def check(self) -> None:
        t0 = time.perf_counter()
        g = self.graph
        if not self.program.has_formulation and g is not None and g.layers:
            raise CheckError(f"graph '{g.name}' is layered data and no formulation was "
                             "given: `use` a model that indexes the H-graph, or pass --model",
                             g.loc)
        check_program(self.program)
        self.timings["check"] = time.perf_counter() - t0

    def lower(self) -> IRModel:
        if "check" not in self.timings:
            self.check()
        if not self.program.has_formulation:  # an empty file is not a problem solved
            g = self.program.graph
            hint = ("; layered graph data is solved by `use rockmate`" if g is not None
                    and g.layers else "; write a model, or `use` one (e.g. `use checkmate`)")
            raise CheckError(f"nothing to solve: no variable and no objective is declared"
                             f"{hint}", Loc(self.program.files[0] if self.program.files
                                             else "<input>"))
        t0 = time.perf_counter()
        self.ir = lower_program(self.program, self.graph, self.budgets, self.max_elements)
        self.timings["lower"] = time.perf_counter() - t0
        return self.ir

    def solve(self, backend: str = "pyomo", solver: str = "highs", time_limit: float | None = None,
              gap: float | None = None, threads: int | None = None, presolve: bool = True,
              warm_start=None, verbose: bool = False, progress=None,
              since: float | None = None, solver_options: dict | None = None) -> Result:
        """Solve the lowered model. `warm_start`: a MIP start given as a planner name (run on
        the graph at the peak budget; "auto": the best of `AUTO_PLANNERS`), a `Plan`, or a
        full-length column vector; a plan is
        encoded in the model's variables (`decoders.encode`). Only a start that satisfies the
        model is passed to the solver; otherwise the solve runs cold, and `Result.warm_start`
        and `Result.message` say why. `progress`: called with a
        `schedlang.solve.progress.Progress` while the solver runs, where it reports one
        (default: into the active `schedlang.progress` session, if any). `solver_options`:
        the solver's own options, as its interface spells them (`backends.solve_ir`).

        `time_limit` bounds the whole call, from `since` (a `time.monotonic()` instant; by
        default this call's start; the CLI passes `started`, so that parsing and lowering
        count too) to the simulated plan: the solver gets what is left after lowering, the
        warm start and the build, less a reserve for decoding and simulating
        (`decode_reserve`), and a watchdog stops HiGHS (through the Pyomo backend) if it
        overruns, keeping its incumbent or the warm start (`solve_ir`'s `deadline`)."""
        since = time.monotonic() if since is None else since
        ir = self.ir if self.ir is not None else self.lower()
        deadline = None
        if time_limit is not None:
            deadline = since + float(time_limit) - decode_reserve(ir, float(time_limit))
        ws = None
        x0 = None
        ws_time = None
        if warm_start is not None:
            t0 = time.perf_counter()
            ws = self.prepare_warm_start(warm_start, ir)
            ws_time = time.perf_counter() - t0
            x0 = ws.x if ws.feasible else None
            ws.passed = x0 is not None
            if ws.outside:  # a plan that fits, outside the model (schedlang.solve.incumbent)
                if at_bound(self, ws):  # optimal among all plans: no solver run
                    return outside_result(self, ir, ws, {**self.timings, "warm_start": ws_time},
                                          backend, solver, "it meets the bound: no solver run")

        args = dict(backend=backend, solver=solver, time_limit=time_limit, gap=gap,
                    threads=threads, presolve=presolve, verbose=verbose,
                    progress=reporting.solver_callback(progress), deadline=deadline,
                    solver_options=solver_options)
        with reporting.phase("solving"):  # the solver's incumbent and bound, where it has them
            reporting.step(None, f"{solver}, {ir.size_summary().get('variables', '?')} "
                                 "variables")
            sol = backends.solve_ir(ir, warm_start=x0, **args)
        if ws is not None and ws.passed:
            ignored = sol.warm_start_ignored
            ws.accepted = (supports_warm_start(sol.solver, sol.backend) and not ignored
                           and sol.status != Status.ERROR)
            if not ws.accepted and not ws.message:
                ws.message = ("the backend did not pass it to the solver" if not ignored
                              else "the backend ignored it (see the message)")
        timings = dict(self.timings)
        if ws_time is not None:
            timings["warm_start"] = ws_time  # planner, simulation, encoding and check
        timings["presolve"] = sol.timings.get("presolve", 0.0)
        timings["build"] = sol.timings.get("build", 0.0)
        timings["solve"] = sol.timings.get("solve", 0.0)
        plan, sim = self._decoded(ir, sol, timings)
        over = budget_excess(plan, sim, self.graph) if sim is not None else {}
        if over:
            t0 = time.perf_counter()
            sol, plan, sim = self._solve_below(ir, sol, plan, sim, over, args, x0)
            timings["resolve"] = time.perf_counter() - t0
        message = "; ".join(m for m in (sol.message, plan_space(self.program, ir)) if m)
        if ws is not None:
            message = "; ".join(m for m in (message, ws.summary()) if m)
        result = Result(sol.status, sol.objective, sol.bound, sol.gap, sol.backend, sol.solver,
                        sol.model_size or ir.size_summary(), timings, plan, sim, sol, message,
                        self.budgets.get("peak"), warm_start=ws)
        if ws is not None and ws.outside:
            result = keep_better(self, ir, ws, result)
        return result

    def _decoded(self, ir: IRModel, sol: Solution, timings: dict) -> tuple:
        """(plan, replay) of a solution: the decoded plan, with the problem's budgets, and the
        simulator's replay of it against them, to the byte; (None, None) without a solution,
        graph data or decoder. Adds the times to `timings` ("decode", "simulate")."""
        if not sol.status.has_solution or self.graph is None:
            return None, None
        t0 = time.perf_counter()
        plan = decode(self.program, ir, sol, self.graph)
        timings["decode"] = timings.get("decode", 0.0) + time.perf_counter() - t0
        if plan is None:
            return None, None
        plan.budget_peak = self.budgets.get("peak")
        plan.budget_save = self.budgets.get("save")
        t0 = time.perf_counter()
        sim = simulate(plan, self.graph)
        timings["simulate"] = timings.get("simulate", 0.0) + time.perf_counter() - t0
        return plan, sim

    def _solve_below(self, ir: IRModel, first: Solution, plan: Plan, sim: SimResult,
                     over: dict, args: dict, x0) -> tuple:
        """(solution, plan, replay) once the plan of `first` replayed over a budget by the
        bytes in `over` (`budget_excess`): the models hold budgets exact to the byte, but a
        solver compares them within its feasibility and integrality tolerances (a binary
        at 1 - 1e-9 times a large size, a memory row of 1e6 MiB passing a few bytes over), and
        the decoder rounds binaries; the replay counts exact bytes. The model is lowered and
        solved again with that budget lowered by the excess, the cut at least doubling on
        each further excess, at most `MAX_RESOLVES` times, each one logged and noted in the
        message. The first solve's bound still bounds the optimum at the exact budget: the
        result is optimal when the new plan is within the requested gap of it. A plan still
        over a budget is never returned as a solution (status `no_solution`, the plan and its
        replay kept); without a plan at a lowered budget, that solve's status is returned."""
        cut: dict[str, int] = {}
        notes: list[str] = []
        sol = first
        solves = 0
        for _ in range(MAX_RESOLVES):
            for kind, excess in over.items():
                kind = kind if kind in self.budgets else "peak"
                cut[kind] = max(cut.get(kind, 0) + excess, 2 * cut.get(kind, 0))
            at = {k: v - cut.get(k, 0) for k, v in self.budgets.items()}
            said = ", ".join(f"{kind} {excess} B over its budget {self.budgets.get(kind)} B"
                             for kind, excess in over.items())
            lowered = ", ".join(f"{kind} {at[kind]} B" for kind in cut)
            note = (f"the solver's plan replays {said} (its tolerances): solved again at "
                    f"{lowered}")
            log.info("schedlang: %s", note)
            notes.append(note)
            deadline = args.get("deadline")
            if min(at[k] for k in cut) <= 0 or (deadline is not None
                                                  and time.monotonic() >= deadline):
                notes[-1] = note.replace("solved again at", "no time or budget left to solve "
                                         "again at")
                break
            solves += 1
            ir_at = lower_program(self.program, self.graph, at, self.max_elements)
            start = x0 if x0 is not None and check_point(ir_at, x0)[0] else None
            sol = backends.solve_ir(ir_at, warm_start=start, **args)
            if not sol.status.has_solution:
                sol.message = "; ".join(m for m in (*notes, sol.message) if m)
                return sol, None, None
            plan, sim = self._decoded(ir_at, sol, {})
            over = budget_excess(plan, sim, self.graph) if sim is not None else {}
            if not over:
                break
        if over:  # still over a budget: no solution, the plan kept to look at
            notes.append(f"no plan within the budgets after {solves} solve(s) below them")
            return (Solution(Status.NO_SOLUTION, bound=first.bound, backend=sol.backend,
                             solver=sol.solver, message="; ".join((*notes, sol.message)),
                             timings=sol.timings, model_size=sol.model_size), plan, sim)
        # the first solve's bound holds at the exact budget; its optimum, without a bound
        bound = first.bound if first.bound is not None else (
            first.objective if first.status == Status.OPTIMAL else None)
        status = sol.status
        if bound is not None and status == Status.OPTIMAL and not within_gap(
                ir, sol.objective, bound, requested_gap(sol.solver, args.get("gap"))):
            status = Status.FEASIBLE
            notes.append("optimal below the budget, not proven at it: reported as feasible")
        sol.status, sol.bound = status, bound
        sol.gap = relative_gap(ir, sol.objective, bound) if bound is not None else None
        sol.message = "; ".join(m for m in (*notes, sol.message) if m)
        return sol, plan, sim

    def prepare_warm_start(self, warm_start, ir: IRModel | None = None) -> WarmStart:
        """A `WarmStart` for a planner name, a `Plan` or a vector: the plan replayed by the
        simulator, encoded, and the vector checked against the model's rows and bounds.
        An unknown planner name raises `SchedError`; every other failure is reported in the
        result (`feasible` False, `message`)."""
        import numpy as np


        ir = ir if ir is not None else (self.ir if self.ir is not None else self.lower())
        budget = self.budgets.get("peak")
        if isinstance(warm_start, str) and warm_start == AUTO:
            return self.auto_warm_start(ir)
        ws = WarmStart()
        if isinstance(warm_start, str):
            ws.planner = warm_start
            if self.graph is None:
                ws.message = "the problem has no graph data to run a planner on"
                return ws
            check_planner_name(warm_start)
            try:
                plan = run_named_planner(warm_start, self.graph, budget)
            except SchedError as exc:
                ws.message = f"the planner failed: {getattr(exc, 'message', exc)}"
                return ws
            except Exception as exc:  # a planner's bug must not stop the solve
                ws.message = f"the planner failed: {type(exc).__name__}: {exc}"
                return ws
        elif isinstance(warm_start, Plan):
            plan = warm_start
            ws.planner = str(plan.meta.get("planner", "plan"))
        else:
            x = np.asarray(warm_start, dtype=float).ravel()
            if x.shape[0] != ir.n_columns:
                raise SchedError(f"warm start has {x.shape[0]} values, the model "
                                 f"{ir.n_columns} columns")
            ws.x, ws.encoded = x, True
            ws.feasible, why = check_point(ir, x)
            ws.objective = objective_value(ir, x)
            if not ws.feasible:
                ws.message = f"it violates the model: {why}"
            return ws

        ws.plan = plan
        if self.graph is not None:
            # replayed without limits: valid is "replays, the budgets aside"
            sim = simulate(plan, self.graph, budget=NO_LIMIT, save_budget=NO_LIMIT)
            ws.time, ws.peak_bytes = sim.time, sim.peak_bytes
            ws.valid = sim.valid
            limit = budget if budget is not None else (
                plan.budget_peak if plan.budget_peak is not None
                else self.graph.budgets.get("peak"))  # the peak budget simulate() would check
            save = self.budgets.get("save")
            ws.fits = bool(ws.valid and (limit is None or sim.peak_bytes <= limit)
                           and (save is None or sim.save_peak_bytes is None
                                or sim.save_peak_bytes <= save))
        notes: list[str] = []
        x = encode(self.program, ir, plan, self.graph, notes) if self.graph is not None else None
        if x is None:
            ws.message = notes[0] if notes else "the plan cannot be encoded"
            return ws
        ws.x, ws.encoded = x, True
        ws.feasible, why = check_point(ir, x)
        ws.objective = objective_value(ir, x)
        if not ws.feasible:
            if ws.fits is False and ws.valid:
                # how far over, in bytes a user reads (the encoding's row is in the model's units)
                excess = "" if limit is None or ws.peak_bytes is None or ws.peak_bytes <= limit \
                    else f" (it peaks at {ws.peak_bytes} B, {ws.peak_bytes - limit} B over)"
                ws.message = (f"the plan is over the budget{excess}, its encoding violates the "
                              f"model ({why})")
            elif ws.valid is False:
                ws.message = f"the plan does not replay, its encoding violates the model ({why})"
            else:
                ws.message = f"its encoding violates the model: {why}"
        return ws

    def plan(self, name: str, budget=None) -> PlanReport:
        """Planner `name` (`schedlang.plans.planners`) run on the graph data, its plan replayed by
        the simulator and checked against the budgets: `budget` (bytes, a size, a percent
        of the no-recomputation peak), else the data's peak budget; the save budget is the
        data's. Raises `SchedError` without graph data or for an unknown planner."""
        graph = self.graph
        if graph is None:
            raise SchedError("this problem has no graph data to run a planner on")
        check_planner_name(name)
        for key, value in self.budgets.items():  # planners read the save budget off the graph
            graph.budgets.setdefault(key, value)
        peak = budgets.peak_budget(budget, graph, self.budgets)
        save = self.budgets.get("save")
        timings = {"parse": self.timings.get("parse", 0.0)}
        t0 = time.perf_counter()
        plan = run_named_planner(name, graph, peak)
        timings["plan"] = time.perf_counter() - t0
        plan.budget_peak = peak
        if save is not None:
            plan.budget_save = save
        t0 = time.perf_counter()
        sim = simulate(plan, graph, budget=NO_LIMIT, save_budget=NO_LIMIT)
        timings["simulate"] = time.perf_counter() - t0
        ref = simulate(no_recompute_plan(graph), graph, budget=NO_LIMIT, save_budget=NO_LIMIT)

        problems = list(sim.errors)
        fits = sim.valid
        if peak is not None and sim.peak_bytes > peak:
            fits = False
            problems.append(f"peak memory {sim.peak_bytes} B exceeds the peak budget {peak} B "
                            f"by {sim.peak_bytes - peak} B")
        if save is not None and sim.save_peak_bytes is not None and sim.save_peak_bytes > save:
            fits = False
            problems.append(f"memory during the loss phase reaches {sim.save_peak_bytes} B, "
                            f"over the save budget {save} B by {sim.save_peak_bytes - save} B")
        overhead = sim.time / ref.time - 1.0 if ref.time > 0 else None
        return PlanReport(name, graph, plan, sim, ref, peak, save, fits, overhead, problems,
                          timings)


    def auto_warm_start(self, ir: IRModel | None = None) -> WarmStart:
        """The best MIP start among the cheap heuristic planners (`AUTO_PLANNERS` that apply
        to the graph): the feasible encoding with the lowest objective. When none is feasible,
        the first candidate's `WarmStart` says why (the solve runs cold)."""
        table = registry.planners()
        names = [n for n in AUTO_PLANNERS
                 if n in table and self.graph is not None
                 and graph_view(self.graph) in table[n].views]
        tried = [self.prepare_warm_start(name, ir) for name in names]
        usable = [ws for ws in tried if ws.feasible and ws.objective is not None]
        if not usable and self.graph is not None:
            extra = outside_incumbent(self, ir, tried)
            if extra is not None:
                tried.append(extra)
                usable = [extra] if extra.feasible else []
                if extra.outside:
                    extra.auto = [ws.planner for ws in tried]
                    return extra
        if usable:
            best = min(usable, key=lambda ws: ws.objective)
        else:
            best = tried[0] if tried else WarmStart(message="no heuristic planner applies")
            if tried:
                best.message = "no heuristic plan fits and satisfies the model (" + "; ".join(
                    f"{ws.planner}: {ws.message}" for ws in tried) + ")"
        best.auto = [ws.planner for ws in tried]
        return best


def decode_reserve(ir: IRModel, time_limit: float) -> float:
    """Seconds a whole-run time limit keeps back for the end of the run: the watchdog's grace
    (`solvers.highs.WATCHDOG_GRACE`), then checking, decoding and simulating the point and
    writing the result: a second plus 5 µs a column (resnet50_train's 349,199 columns: 0.3-0.8
    s to decode, as much again for the rest, on a loaded 2-core machine), at most a quarter of
    the limit."""
    return min(0.25 * time_limit, WATCHDOG_GRACE + 1.0 + 5e-6 * ir.n_columns)


#: at most this many solves below a budget when a plan replays over it (`Problem.solve`)
MAX_RESOLVES = 4

#: the largest excess over a budget, as a share of it, that a solver's tolerances explain
#: (integrality tolerances reach 1e-5 of a size, Gurobi's; sizes add up to a few budgets): a
#: plan further over is the model's, which counts less memory than the replay, and is left
#: for the replay's error to report, not hidden by a lower budget
TOLERANCE_SHARE = 1e-3


def budget_excess(plan: Plan, sim: SimResult, graph: Graph) -> dict[str, int]:
    """{"peak": bytes, "save": bytes}: how far the replayed `plan` (`sim`) goes over its peak
    and save budgets, when a solver's tolerances explain it (`TOLERANCE_SHARE`); {} when it
    fits them, when it goes further over (the model counts less than the replay), or when it
    does not replay for another reason (no budget makes it replay)."""
    over = {}
    for kind, used, budget in (("peak", sim.peak_bytes, sim.budget_bytes),
                               ("save", sim.save_peak_bytes, sim.save_budget_bytes)):
        if used is not None and budget is not None and used > budget:
            if used - budget > TOLERANCE_SHARE * budget:
                return {}
            over[kind] = used - budget
    if over and not simulate(plan, graph, budget=NO_LIMIT, save_budget=NO_LIMIT).valid:
        return {}
    return over


# `Problem.solve(warm_start=AUTO)` (the CLI's default): try these planners, start from the best.
AUTO = "auto"
AUTO_PLANNERS = ("knapsack", "mutwo", "chen_greedy")


def run_named_planner(name: str, graph: Graph, budget: int | None) -> Plan:
    """Run planner `name` from the registry (`schedlang.plans.planners`); `no_recompute` works
    even while the registry does not list it (the simulator's reference plan)."""
    if name == "no_recompute" and name not in registry.planners():
        plan = no_recompute_plan(graph)
        plan.budget_peak = budget
        return plan
    return run_planner(name, graph, budget)


def check_planner_name(name: str) -> None:
    """`SchedError` (exit 2) naming the known planners when `name` is not one of them."""
    known = dict.fromkeys(["no_recompute", *registry.planners()])
    if name not in known:
        raise SchedError(f"unknown planner '{name}'{did_you_mean(name, known)}; planners: "
                         f"{', '.join(known)}")


def load(*paths, model=None, budget=None, text: str | None = None, graph: Graph | None = None,
         params: dict | None = None, max_elements: int | None = None) -> Problem:
    """Parse and merge files (and/or text) into a Problem.

    `model`: a shipped model name or a path, or a list of them, read before the files (as
    ``--model``); `graph`: graph data as a `Graph` object instead of (not in addition to) a
    file's `graph` block; `budget` overrides the data's peak budget (`schedlang.budgets`);
    `params`: values for scalar params declared with `default` (name -> number);
    `max_elements`: the size guard's limit on one declaration's elements (`schedlang.compile.sizes`,
    default `DEFAULT_MAX_ELEMENTS`), checked before anything that large is built. Node/edge
    graph data without a formulation is solved with `checkmate`. A ``.json`` path is
    Checkmate's or Moccasin's graph data (networkx node-link JSON, `load_checkmate_nx`), read
    as `graph` is."""
    started = time.monotonic()
    t0 = time.perf_counter()
    files = [Path(p) for p in paths]
    graphs = [f for f in files if is_node_link_file(f)]
    if graphs:
        if graph is not None or len(graphs) > 1:
            raise SchedError("one source of graph data at a time: a .json graph file cannot "
                             "be combined with another one or with a Graph object",
                             Loc(str(graphs[-1])))
        graph = load_checkmate_nx(graphs[0])
        files = [f for f in files if f not in graphs]
    models = [model] if isinstance(model, (str, Path)) else list(model or [])
    program = _load_program(files, [str(m) for m in models], text, graph)
    if not program.has_formulation and program.graph is not None and not program.graph.layers:
        # node/edge graph data alone: solve it with Checkmate, the classic formulation
        program = _load_program(files, ["checkmate"], text, graph)
    if params:
        set_params(program, params)
    elapsed = time.perf_counter() - t0
    if budget is not None:
        program.budgets["peak"] = budgets.for_graph(budget, program.graph)
    return Problem(program, {"parse": elapsed}, max_elements=max_elements, started=started)


def _load_program(files: list, models: list, text: str | None, graph: Graph | None) -> Program:
    program = load_program(files, models or None, text=text)
    return attach_graph(program, graph) if graph is not None else program
