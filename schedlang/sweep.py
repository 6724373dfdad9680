"""Budget sweeps: solve one formulation at many peak budgets, for the memory/time trade-off.

    from schedlang.sweep import sweep
    points = sweep("examples/chain.sched", "60%..100%/5", backend="cvxpy")
    for p in points:
        print(p.budget_percent, p.status.value, p.objective, p.overhead)

The files are parsed, checked and lowered once; each budget is then solved by `solve_at` on
that lowering moved to the budget (`schedlang.compile.parametric`: only what reads the budget is
evaluated again, and the model is the one a fresh lowering gives). Budgets are independent of
each other, so `sweep_problem(..., jobs=N)` / `ray=ADDRESS` solves them in parallel through
`schedlang.parallel.run_jobs`, on worker processes (each lowers the program once and moves
it, as the serial sweep does) or as Ray tasks: the program, the options and the `SweepPoint`
results are ordinary picklable data, and the points are those of the serial sweep.

Budget specs (`parse_budgets`, which is `schedlang.budgets.parse_list`), comma-separated
items, each one of:

* a size or a percent of the no-recomputation peak: ``14GiB``, ``900MiB``, ``3221225472``, ``75%``;
* a range ``LOW..HIGH/N``: N budgets evenly spaced from LOW to HIGH, both included
  (``30%..100%/8``, ``1GiB..4GiB/4``; mixing a size and a percent spaces them in bytes).

Percents resolve exactly as ``solve --budget`` does (one rule, `schedlang.budgets`), so
the 70% point of a sweep is the 70% solve. The result is sorted ascending, without duplicates.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from . import budgets
from .compile.parametric import BudgetLowering
from .graphs.graph import Graph
from .language.errors import DataError, Loc, SchedError
from .language.files import write_file
from .language.resources import models_dir
from .parallel import JOBS_LOC, default_jobs, run_jobs
from .plans.plan import SCHEMA, Plan
from .plans.planners.no_recompute import no_recompute_peak, no_recompute_plan
from .plans.simulate import simulate
from .problem import Problem, load
from .results import Result, WarmStart
from .solve.solution import EXIT_CODES, Status

# ---------------------------------------------------------------------------- budget specs
# the parser of budget lists and ranges is `schedlang.budgets.parse_list`
parse_budgets = budgets.parse_list
BUDGETS_LOC = budgets.LIST_LOC
MAX_RANGE = budgets.MAX_RANGE


# ---------------------------------------------------------------------------- sweep points

@dataclass
class SweepPoint:
    """One budget of a sweep: the solve's `Result` and the trade-off numbers derived from it."""

    budget_bytes: int
    budget_percent: float | None  # of the no-recomputation peak (None without compute nodes)
    result: Result
    overhead: float | None  # objective / (time without recomputation) - 1; None when unsolved

    @property
    def status(self) -> Status:
        return self.result.status

    @property
    def solved(self) -> bool:
        return self.result.status.has_solution

    @property
    def objective(self) -> float | None:
        return self.result.objective

    @property
    def gap(self) -> float | None:
        return self.result.gap

    @property
    def solve_time(self) -> float:
        return self.result.timings.get("solve", 0.0)

    @property
    def predicted_peak(self) -> int | None:
        plan = self.result.plan
        return plan.predicted_peak if plan is not None else None

    @property
    def simulated_peak(self) -> int | None:
        sim = self.result.simulated
        return sim.peak_bytes if sim is not None else None

    @property
    def simulated_valid(self) -> bool | None:
        sim = self.result.simulated
        return sim.valid if sim is not None else None

    @property
    def simulated_time(self) -> float | None:
        sim = self.result.simulated
        return sim.time if sim is not None else None

    def to_json(self) -> dict:
        """The `solve --json` object, plus `budget_bytes`, `budget_percent` and `overhead`."""
        obj = self.result.to_json()
        obj["budget_bytes"] = self.budget_bytes
        obj["budget_percent"] = self.budget_percent
        obj["overhead"] = self.overhead
        return obj


def reference(graph: Graph | None) -> tuple[int | None, float | None]:
    """(peak bytes, time) of the no-recomputation plan; (None, None) without graph data."""
    if graph is None or not (graph.nodes or graph.layers):
        return None, None
    plan = no_recompute_plan(graph)
    return _reference_peak(graph), simulate(plan, graph).time


def _reference_peak(graph: Graph) -> int:
    # both vocabularies: the Checkmate view (nodes) and layered data (layers)
    return no_recompute_peak(graph) if graph.nodes or graph.layers else 0


def solve_at(program, budget: int, *, backend: str = "pyomo", solver: str = "highs",
             time_limit: float | None = None, gap: float | None = None,
             threads: int | None = None, presolve: bool = True,
             ref: tuple[int | None, float | None] | None = None,
             timings: dict | None = None, max_elements: int | None = None,
             lowering: BudgetLowering | None = None, warm_start=None) -> SweepPoint:
    """Lower and solve an already loaded and checked `program` at peak budget `budget` (bytes).

    Self-contained, so that a sweep can be mapped over budgets by Ray, Dask or the like: the
    program is not modified (a shallow copy gets the budget). `ref` is `reference(graph)`
    (computed here when not given); `timings` are the shared parse/check times to report.
    `lowering`: the program lowered once (`schedlang.compile.parametric.BudgetLowering`), moved to
    this budget instead of lowered again (the same IR); `warm_start`: a MIP start, as
    `Problem.solve` takes it (a neighbouring budget's solution vector or plan).
    """
    prog = dataclasses.replace(program, budgets={**program.budgets, "peak": int(budget)})
    times = dict(timings) if timings else {}
    times.setdefault("check", 0.0)  # checked once by the caller: Problem.lower skips it
    prob = Problem(prog, times, max_elements=max_elements)
    if lowering is not None:
        t0 = time.perf_counter()
        prob.ir = lowering.at(prog.budgets)
        times["lower"] = time.perf_counter() - t0
    else:
        prob.lower()
    result = prob.solve(backend=backend, solver=solver, time_limit=time_limit, gap=gap,
                        threads=threads, presolve=presolve, warm_start=warm_start)
    ref_peak, ref_time = ref if ref is not None else reference(prog.graph)
    percent = 100.0 * budget / ref_peak if ref_peak else None
    overhead = None
    if result.status.has_solution and result.objective is not None and ref_time:
        overhead = result.objective / ref_time - 1.0
    return SweepPoint(int(budget), percent, result, overhead)


def neighbour_start(points: list[SweepPoint]):
    """The MIP start of the next (larger) budget: the solution of the largest budget solved so
    far. Its plan fits a smaller budget, so it fits this one; `Problem.solve` checks it against
    the model and solves cold when it does not satisfy it. The solver's column vector when
    there is one (same columns: the lowering moved, it did not change shape), else the plan
    (a point read back by `--resume`), which is encoded. None when nothing is solved yet."""
    for point in reversed(points):
        if point.solved:
            sol = point.result.solution
            if sol is not None and sol.x is not None:
                return sol.x
            if point.result.plan is not None:
                return point.result.plan
    return None


def prepare(path_or_paths, model: str | None = None, max_elements: int | None = None,
            params: dict | None = None) -> Problem:
    """Parse and check the files once: the `Problem` every budget of a sweep starts from
    (`params`: values of `param ... default` declarations, as `load`'s)."""
    paths = [path_or_paths] if isinstance(path_or_paths, (str, Path)) else list(path_or_paths)
    prob = load(*paths, model=model, max_elements=max_elements, params=params)
    prob.check()
    return prob


def sweep(path_or_paths, budgets, model: str | None = None, backend: str = "pyomo",
          solver: str = "highs", time_limit: float | None = None, gap: float | None = None,
          threads: int | None = None, progress=None,
          max_elements: int | None = None, parametric: bool = True,
          neighbour: bool = False, jobs: int | None = 1, ray: str | None = None,
          warm_start=None) -> list[SweepPoint]:
    """Solve the files at each budget; one `SweepPoint` per budget, in ascending budget order.

    `budgets` is a spec string (``"30%..100%/8"``, see `parse_budgets`) or a list of sizes,
    percents and byte counts. The files are parsed and checked once (`prepare`); each budget
    is then one call of `solve_at`, independent of the others: `jobs` and `ray` run them in
    parallel (`sweep_problem`). `progress(index, total, budget_bytes, point)` is called before
    each solve (point None; serial sweeps only) and after it; index counts from 1.
    """
    return sweep_problem(prepare(path_or_paths, model, max_elements), budgets, backend=backend,
                         solver=solver, time_limit=time_limit, gap=gap, threads=threads,
                         progress=progress, parametric=parametric, neighbour=neighbour,
                         jobs=jobs, ray=ray, warm_start=warm_start)


def sweep_problem(prob: Problem, budgets, *, backend: str = "pyomo", solver: str = "highs",
                  time_limit: float | None = None, gap: float | None = None,
                  threads: int | None = None, progress=None,
                  done: dict[int, SweepPoint] | None = None, record=None,
                  parametric: bool = True, neighbour: bool = False, jobs: int | None = 1,
                  ray: str | None = None, warm_start=None) -> list[SweepPoint]:
    """`sweep` on a `Problem` from `prepare` (loaded and checked).

    `done`: points already solved, by budget in bytes (from `PointLog.resume`): they are taken
    as they are, not solved again; `record(point)` is called with each newly solved point as
    soon as it is finished (`PointLog.append`). `parametric` (the default): the program is
    lowered once and only moved to each budget (`schedlang.compile.parametric`: the same model a fresh
    lowering gives, so the same results); False: each budget is lowered on its own.
    `warm_start`: each budget's MIP start, as `Problem.solve` takes it (None: cold; "auto",
    the CLI's default as for `solve`: the best fitting heuristic plan at that budget). A start
    changes how fast the solver proves the optimum, not its value; only a budget stopped at a
    gap or a time limit may end elsewhere. `neighbour`: start each budget's solve from the
    solution of the budget below it (`neighbour_start`; `warm_start` for the first). Off by
    default: on transformer12 it made HiGHS no faster overall and once stopped at the
    neighbour's plan, reported `feasible` with a gap, where the cold solve proves a better
    optimum (bench/bench_sweep.py, docs/distributed.md).

    `jobs`: budgets solved at once on worker processes (1, the default: one after the other
    in this process; None or 0: as many as cores allow); `ray`: as Ray tasks on the cluster
    at that address ("" for a local Ray instance). Either way through
    `schedlang.parallel.run_jobs`, with the points of the serial sweep (a budget stopped by a
    time limit aside, which depends on the machine's speed); `progress` is then called as
    each point comes back, and `neighbour` is not available (a budget's solve would wait for
    its neighbour's)."""
    values = parse_budgets(budgets, prob.graph)
    ref = reference(prob.graph)
    shared = {"parse": prob.timings.get("parse", 0.0), "check": prob.timings.get("check", 0.0)}
    todo = [b for b in values if not (done and b in done)]
    if ray is not None or (len(todo) > 1 and min(jobs or default_jobs(), len(todo)) > 1):
        if neighbour:
            raise SchedError("the neighbour warm start needs a serial sweep (jobs=1, no Ray): "
                             "each budget's solve would wait for the one below it", JOBS_LOC)
        options = {"backend": backend, "solver": solver, "time_limit": time_limit, "gap": gap,
                   "threads": threads, "ref": ref, "timings": shared,
                   "max_elements": prob.max_elements, "parametric": parametric,
                   "warm_start": warm_start}
        solved = _sweep_parallel(prob, values, todo, done or {}, options, jobs, ray,
                                 progress, record)
        return monotone(prob, solved, ref)
    points: list[SweepPoint] = []
    lowering = None
    for k, budget in enumerate(values, 1):
        if done and budget in done:
            point = done[budget]
        else:
            if progress is not None:
                progress(k, len(values), budget, None)
            if parametric and lowering is None:  # lowered once, at the first budget solved
                lowering = BudgetLowering(prob.program, {**prob.program.budgets,
                                                         "peak": int(budget)}, prob.max_elements)
            start = neighbour_start(points) if neighbour else None
            point = solve_at(prob.program, budget, backend=backend, solver=solver,
                             time_limit=time_limit, gap=gap, threads=threads, ref=ref,
                             timings=shared, max_elements=prob.max_elements, lowering=lowering,
                             warm_start=warm_start if start is None else start)
            if record is not None:
                record(point)
        points.append(point)
        if progress is not None:
            progress(k, len(values), budget, point)
    return monotone(prob, points, ref)


def monotone(prob: Problem, points: list[SweepPoint], ref) -> list[SweepPoint]:
    """For a formulation whose optimum never rises with the budget (`budget_monotone`): each
    point's plan the fastest of its budget's and the smaller budgets' (`monotone_plans`), then
    each bound the best of its budget's and the larger budgets' (`monotone_bounds`)."""
    if not budget_monotone(prob.program):
        return points
    return monotone_bounds(monotone_plans(points, prob.graph, ref))


#: shipped formulations whose optimal time cannot rise with the peak budget (the budget only
#: bounds memory from above): a bound proven at one budget holds at every smaller one
MONOTONE_MODELS = frozenset({"checkmate", "checkmate_tight", "rockmate", "offload",
                             "offload_windows", "offload_steps"})


def budget_monotone(program) -> bool:
    """Whether `program` is a shipped formulation of `MONOTONE_MODELS` with its own objective."""
    from pathlib import Path


    obj = program.objective
    if program.model is None or program.model.name not in MONOTONE_MODELS or obj is None \
            or program.objective_terms or getattr(obj, "loc", None) is None:
        return False
    try:
        return Path(obj.loc.path).resolve().parent == models_dir().resolve()
    except (OSError, ValueError):
        return False


def monotone_plans(points: list[SweepPoint], graph, ref=None) -> list[SweepPoint]:
    """Each point whose solve ended slower than a smaller budget's plan, or without a plan
    (a time limit), given that plan: it fits every larger budget, and its objective is the
    same there (the budget only bounds memory), so a larger budget never reports a slower
    plan than a smaller one. The plan is replayed against the point's budget; the point keeps
    its own bound and is `feasible` (`optimal` when it meets that bound), its message saying
    where the plan came from. The points are returned in their order."""
    best: SweepPoint | None = None  # the fastest plan so far, in ascending budgets
    fastest = float("inf")  # its objective
    for point in sorted(points, key=lambda p: p.budget_bytes):
        r = point.result
        if r.status.has_solution and r.objective is not None and r.plan is not None \
                and r.simulated is not None and r.simulated.valid:
            if best is None or r.objective < fastest:
                best, fastest = point, r.objective
                continue
        if best is None or r.status in (Status.INFEASIBLE, Status.ERROR, Status.UNBOUNDED) \
                or (r.objective is not None and r.objective <= fastest):
            continue
        _take_plan(point, best, graph, ref)
    return points


def _take_plan(point: SweepPoint, smaller: SweepPoint, graph, ref) -> None:
    """`point` with the plan, solution and objective of `smaller` (a smaller budget's faster
    plan), replayed against `point`'s budget; unchanged when the replay rejects it."""
    r, plan = point.result, smaller.result.plan
    assert plan is not None and smaller.result.objective is not None
    plan = dataclasses.replace(plan, budget_peak=point.budget_bytes)
    sim = simulate(plan, graph, budget=point.budget_bytes)
    if not sim.valid:
        return
    before = (f"its own plan took {r.objective:.6g}" if r.objective is not None
              else f"its solve ended {r.status.value}")
    objective = smaller.result.objective
    gap = None if r.bound is None else max(0.0, objective - r.bound) / max(abs(objective), 1e-10)
    status = Status.OPTIMAL if gap is not None and gap <= 1e-9 else Status.FEASIBLE
    note = (f"the plan of budget {smaller.budget_bytes} B, which fits this one ({before}; "
            f"the optimum never rises with the budget)")
    point.result = dataclasses.replace(
        r, status=status, objective=objective, gap=gap, plan=plan, simulated=sim,
        solution=smaller.result.solution, plan_path=None,
        message="; ".join(m for m in (r.message, note) if m))
    ref_time = ref[1] if ref is not None else None
    point.overhead = objective / ref_time - 1.0 if ref_time else point.overhead


def monotone_bounds(points: list[SweepPoint]) -> list[SweepPoint]:
    """Each point's bound raised to the best bound proven at its budget or a larger one (a plan
    within a smaller budget is within every larger one, so the optimum never rises with the
    budget: a larger budget's bound bounds the smaller budgets too), its gap recomputed and the
    source noted in its message; a point whose plan then meets its bound is optimal. The
    points are returned in their order."""
    best: tuple[float, int] | None = None  # (bound, the budget that proved it)
    for point in sorted(points, key=lambda p: p.budget_bytes, reverse=True):
        r = point.result
        if r.status in (Status.INFEASIBLE, Status.ERROR, Status.UNBOUNDED):
            continue
        if r.bound is not None and (best is None or r.bound >= best[0]):
            best = (r.bound, point.budget_bytes)
            continue
        if best is None:
            continue
        r.bound = best[0]
        note = f"bound from budget {best[1]} B (the optimum never rises with the budget)"
        r.message = "; ".join(m for m in (r.message, note) if m)
        if r.objective is not None:
            r.gap = max(0.0, r.objective - r.bound) / max(abs(r.objective), 1e-10)
            if r.gap <= 1e-9 and r.status == Status.FEASIBLE:
                r.status = Status.OPTIMAL
    return points


def _sweep_parallel(prob, values, todo, done, options, jobs, ray, progress, record):
    """`sweep_problem`'s budgets `todo` through `run_jobs`; `done` reported first; `progress`
    as each point comes back, `record` in budget order."""
    points: dict[int, SweepPoint] = dict(done)
    count = [0]

    def report(budget, point):
        count[0] += 1
        if progress is not None:
            progress(count[0], len(values), budget, point)

    for budget in values:
        if budget in done:
            report(budget, done[budget])

    written = [0]  # `record` in budget order, as the serial sweep writes: a point that
    # finishes before a smaller budget's is recorded right after that one

    def finished(k, budget, point):
        points[budget] = point
        while record is not None and written[0] < len(todo) and todo[written[0]] in points:
            record(points[todo[written[0]]])
            written[0] += 1
        report(budget, point)

    run_jobs(solve_job, todo, args=(prob.program, options), jobs=jobs, ray=ray,
             on_result=finished, preload=(f"schedlang.solve.backends.{options['backend']}_backend",))
    return [points[b] for b in values]


#: in a worker process: the program's lowering, moved from budget to budget (one per program)
_LOWERED: dict = {}


def solve_job(budget: int, program, options: dict) -> SweepPoint:
    """One budget of a parallel sweep, in a worker (`run_jobs`): `solve_at` on the worker's
    lowering of `program`, lowered at its first budget and moved to the next ones
    (`schedlang.compile.parametric`; `options["parametric"]` False: lowered again per budget)."""
    options = dict(options)
    lowering = None
    if options.pop("parametric", True):
        lowering = _LOWERED.get(id(program))
        if lowering is None or lowering.program is not program:
            lowering = BudgetLowering(program, {**program.budgets, "peak": int(budget)},
                                      options.get("max_elements"))
            _LOWERED.clear()  # one program per worker at a time
            _LOWERED[id(program)] = lowering
    return solve_at(program, budget, lowering=lowering, **options)


# ---------------------------------------------------------------------------- streamed points

class PointLog:
    """`sweep --out FILE.jsonl`: one JSON line per finished budget, written and flushed (and
    fsync'ed) as soon as the budget is solved, so that a sweep killed at budget 7 keeps the six
    points before it. Each line is ``{"file": ..., **SweepPoint.to_json()}`` with the plan as
    its list of ops. `--resume` reads the file back (`resume`) and the sweep skips the budgets
    it holds; the results are those of a full run (the plans are replayed again)."""

    def __init__(self, path, resume: bool = False):
        self.path = Path(path)
        self.loc = Loc(str(path))
        self.lines: list[dict] = []
        if resume and self.path.exists():
            self.lines = self._read()
        # start the file from the good lines (a line cut by a kill is dropped), then append

        write_file(self.path, "".join(json.dumps(obj) + "\n" for obj in self.lines))
        try:
            # a raw append descriptor: each point goes down in one write(2), not in a buffered
            # file's 8 KiB chunks; a kill can still cut that write at a page boundary, and
            # _read drops such a last line
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as exc:
            raise DataError(f"cannot write {self.path}: {exc.strerror or exc}", self.loc) from None

    def _read(self) -> list[dict]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise DataError(f"cannot read {self.path}: {getattr(exc, 'strerror', None) or exc}",
                            self.loc) from None
        rows = text.split("\n")  # ends with "" unless the last line was cut short
        out = []
        for n, line in enumerate(rows, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                if n == len(rows):
                    break  # a last line without its newline, cut by a kill: solved again
                raise DataError(f"not a sweep point (JSON): {exc.msg}",
                                Loc(str(self.path), n, exc.colno)) from None
            if not (isinstance(obj, dict) and isinstance(obj.get("budget_bytes"), int)
                    and isinstance(obj.get("status"), str) and "file" in obj):
                raise DataError("not a sweep point: expected an object with 'file', "
                                "'budget_bytes' and 'status'", Loc(str(self.path), n, 1))
            out.append(obj)
        return out

    def resume(self, file: str, prob: Problem, backend: str, solver: str) -> dict[int, SweepPoint]:
        """The points of `file` already in the log, by budget (bytes), rebuilt as `SweepPoint`s."""
        done: dict[int, SweepPoint] = {}
        for obj in self.lines:
            if obj["file"] != file:
                continue
            if (obj.get("backend"), obj.get("solver")) != (backend, solver):
                raise DataError(f"{file} at {obj['budget_bytes']} B was swept with "
                                f"{obj.get('solver')} via {obj.get('backend')}, not {solver} via "
                                f"{backend}: resume with the same options, or write another --out",
                                self.loc)
            done[obj["budget_bytes"]] = point_from_json(obj, prob, self.loc, backend, solver)
        return done

    def append(self, file: str, point: SweepPoint) -> None:
        line = (json.dumps({"file": file, **point.to_json()}, default=str) + "\n").encode("utf-8")
        written = os.write(self._fd, line)
        while written < len(line):  # a short write (disk full, a signal): finish the line
            written += os.write(self._fd, line[written:])
        os.fsync(self._fd)

    def close(self) -> None:
        os.close(self._fd)


def point_from_json(obj: dict, prob: Problem, loc: Loc, backend: str, solver: str) -> SweepPoint:
    """A `SweepPoint` from its JSON line, solved with `solver` via `backend` (`resume` checks
    the line says so): the plan rebuilt from its ops and replayed again."""
    budget = obj["budget_bytes"]
    graph = prob.graph
    plan = sim = None
    try:
        status = Status(obj["status"])
        if isinstance(obj.get("plan"), list) and graph is not None:
            plan = Plan.from_json({"schema": SCHEMA, "graph": graph.name, "ops": obj["plan"],
                                   "budget": {"peak_bytes": budget,
                                              "save_bytes": prob.budgets.get("save")},
                                   "predicted": obj.get("predicted")}, str(loc))
            sim = simulate(plan, graph)
        ws = obj.get("warm_start")
        result = Result(status, obj.get("objective"), obj.get("bound"), obj.get("gap"),
                        backend, solver, obj.get("model_size") or {},
                        obj.get("timings") or {}, plan, sim, None, obj.get("message") or "",
                        budget, warm_start=WarmStart(**ws) if isinstance(ws, dict) else None)
    except (ValueError, TypeError) as exc:
        raise DataError(f"a sweep point at {budget} B cannot be read back: {exc}", loc) from None
    return SweepPoint(budget, obj.get("budget_percent"), result, obj.get("overhead"))


def exit_code(points: list[SweepPoint]) -> int:
    """0 when some budget was solved; else the most severe of the per-budget solve codes
    (5 solver error > 4 no solution within the limit > 3 infeasible)."""
    if any(p.solved for p in points):
        return 0
    return max((EXIT_CODES[p.status] for p in points), default=3)


# ---------------------------------------------------------------------------- plot



