"""The `schedlang` command line: a thin layer over schedlang.problem (docs/architecture.md).

The commands, flags and exit codes are a contract: docs/cli.md's commands table.

Exit codes: 0 ok / solved (optimal or feasible at a limit), 2 bad input, 3 infeasible (or an
invalid plan for `simulate`), 4 no solution within the limit, 5 solver unavailable or failed.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .. import progress
from ..budgets import for_graph, peak_budget
from ..compile.sizes import DEFAULT_MAX_ELEMENTS
from ..compile.stats import declaration_sizes, format_sizes
from ..graphs.checkmate_nx import is_node_link_file, load_checkmate_nx
from ..graphs.writer import write_graph
from ..language.check import check_program
from ..language.errors import DataError, Loc, SchedError, did_you_mean
from ..language.files import write_file
from ..language.paths import writable_file
from ..language.program import attach_graph, load_program, set_params
from ..language.units import format_size
from ..parallel import default_jobs, import_ray
from ..plans import planners as registry
from ..plans.allocator import format_summary, summary
from ..plans.plan import Plan
from ..plans.planners import graph_view
from ..plans.simulate import simulate
from ..plotting import check_plot_target, plot_sweep
from ..problem import load
from ..solve import strategy
from ..solve.bisection import explain_infeasible
from ..solve.solution import EXIT_CODES, Status
from ..solve.solvers import DEFAULT_SOLVER, SOLVERS, resolve
from ..solve.solvers.highs import threads_left_running
from ..sweep import PointLog, exit_code, parse_budgets, prepare, reference, sweep_problem
from . import output
from .pytorch_args import add_run_arguments, add_trace_arguments


def _nonnegative(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
        if value < 0:
            raise argparse.ArgumentTypeError(f"must not be negative, got {text}")
        return value
    return parse


def _param_argument(p) -> None:
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="give a `param NAME ... default` of the model a value (a number; "
                   "repeatable), as a later file's `param NAME = VALUE` would")


def _params(args) -> dict:
    """--param NAME=VALUE options as {name: number}; a malformed one is a located error."""
    out = {}
    for item in getattr(args, "param", None) or []:
        name, sep, value = item.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = None
        if not sep or not name.strip() or number is None or number != number:
            raise UsageError(f"'{item}' is not NAME=VALUE with a number (e.g. "
                             "--param allow_offload=0)", Loc("--param"))
        out[name.strip()] = number
    return out


def _max_elements_argument(p) -> None:
    p.add_argument("--max-elements", type=_nonnegative(int), metavar="N",
                   help="size guard: stop before a declaration (or a table built while lowering "
                   f"it) gets more than N elements (default {DEFAULT_MAX_ELEMENTS:,})")


class UsageError(SchedError):
    """Arguments argparse refuses (an unknown flag, a missing one, a bad number)."""


class _Parser(argparse.ArgumentParser):
    """argparse, whose errors are raised (`UsageError`, exit 2) rather than exiting, so that
    `main` reports them as every other error (one JSON object with --json)."""

    def error(self, message: str):
        self.print_usage(sys.stderr)
        raise UsageError(message, Loc(self.prog))


def _parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="schedlang", description="Declarative memory scheduling for "
                 "neural-network training.")
    sub = ap.add_subparsers(dest="command", required=True)

    c = sub.add_parser("check", help="parse and check .sched files (and instantiate them on "
                       "their graph data, when they have some)")
    c.add_argument("files", nargs="+")
    c.add_argument("--model", help="a shipped model name or a .sched path to check the files against")
    c.add_argument("--stats", action="store_true", help="print each indexed declaration's size: "
                   "elements, and the constraint rows and nonzeros it makes")
    _param_argument(c)
    _max_elements_argument(c)


    solver_help = ", ".join(f"{n} (default)" if n == DEFAULT_SOLVER else n for n in SOLVERS)
    s = sub.add_parser("solve", help="compile, solve, decode and simulate")
    s.add_argument("file")
    s.add_argument("--model", help="shipped model name or .sched path (default: what FILE uses, "
                   "else checkmate)")
    s.add_argument("--backend", choices=["pyomo", "cvxpy"], help="pyomo (default) or cvxpy")
    s.add_argument("--solver", help=solver_help)
    s.add_argument("--budget", help="peak budget: a size (14GiB) or a percent of the "
                   "no-recomputation peak (90%%); overrides the data's `budget peak`")
    s.add_argument("--time-limit", type=_nonnegative(float), help="seconds")
    s.add_argument("--gap", type=_nonnegative(float), help="relative MIP gap at which to stop")
    s.add_argument("--threads", type=_nonnegative(int), help="solver threads (0: the solver's choice)")
    s.add_argument("--no-presolve", action="store_true", help="give the solver the model as lowered")
    s.add_argument("--plan-out", help="write the plan (schedlang.plan/1 JSON) here")
    s.add_argument("--warm-start", metavar="NAME", default="auto", help="run heuristic planner "
                   "NAME at the budget and give its plan to the solver as a MIP start "
                   "(no_recompute, or one of `schedlang plan --list`; default auto: the best "
                   "fitting plan of knapsack, mutwo and chen_greedy, else "
                   "shift's reordered plan as the incumbent)")
    s.add_argument("--no-warm-start", dest="warm_start", action="store_const", const=None,
                   help="solve cold, without a MIP start")
    s.add_argument("--json", action="store_true", help="one JSON object on stdout")
    s.add_argument("--verbose", action="store_true", help="show the solver's log")
    s.add_argument("--quiet", action="store_true",
                   help="no progress on stderr (the solver's incumbent, bound and gap)")
    s.add_argument("--no-explain", dest="explain", action="store_false",
                   help="at an infeasible budget, do not look for the smallest feasible one "
                   "(by default: bisection with the solver, each solve stopping at its first "
                   "plan)")
    _param_argument(s)
    _max_elements_argument(s)

    m = sub.add_parser("simulate", help="replay a plan on its graph")
    m.add_argument("plan")
    m.add_argument("--graph", required=True, help="graph data (.sched or checkmate-nx .json)")
    m.add_argument("--budget", help="peak budget to check against (size or percent)")
    m.add_argument("--json", action="store_true")
    m.add_argument("--allocator", action="store_true", help="also assign buffers: the max-live "
                   "lower bound and the arena size per method (inplace, pool, greedy_by_size)")

    w = sub.add_parser("sweep", help="solve at many budgets: the memory/time trade-off")
    w.add_argument("file")
    w.add_argument("--budgets", required=True, help="budgets: LOW..HIGH/N (30%%..100%%/8, "
                   "1GiB..4GiB/4: N evenly spaced, ends included) or a comma list of sizes and "
                   "percents of the no-recomputation peak (1GiB,2GiB,75%%)")
    w.add_argument("--model", help="shipped model name or .sched path (default: what FILE uses, "
                   "else checkmate)")
    w.add_argument("--backend", default="pyomo", choices=["pyomo", "cvxpy"], help="pyomo (default) or cvxpy")
    w.add_argument("--solver", default="highs", help=solver_help)
    w.add_argument("--time-limit", type=_nonnegative(float), help="seconds, per budget")
    w.add_argument("--gap", type=_nonnegative(float), help="relative MIP gap at which to stop")
    w.add_argument("--threads", type=_nonnegative(int), help="solver threads (0: the solver's choice)")
    w.add_argument("--plot", metavar="OUT.png", help="write the memory/time Pareto curve "
                   "(needs matplotlib)")
    w.add_argument("--json", action="store_true", help="a JSON list on stdout: per budget, the "
                   "solve --json object plus budget_percent and overhead (with --compare: "
                   "{\"curves\": [{\"file\": ..., \"points\": [...]}, ...]})")
    w.add_argument("--compare", metavar="FILE", action="append", default=[],
                   help="another problem to sweep at the same budgets, one more curve in the "
                   "table and the plot (repeatable; e.g. the same graph with offloading or "
                   "recomputation switched off)")
    w.add_argument("--out", metavar="FILE.jsonl", help="stream the points: one JSON line per "
                   "budget (the --json object of the point, plus \"file\"), written and flushed "
                   "as soon as the budget is solved")
    w.add_argument("--resume", action="store_true", help="with --out: keep the points already "
                   "in FILE.jsonl and solve only the budgets it lacks")
    w.add_argument("--warm-start", metavar="NAME", default="auto", help="as for solve: each "
                   "budget's MIP start from heuristic planner NAME at that budget (default auto: "
                   "the best fitting plan of knapsack, mutwo and chen_greedy)")
    w.add_argument("--no-warm-start", dest="warm_start", action="store_const", const=None,
                   help="solve each budget cold, without a MIP start")
    w.add_argument("--jobs", "-j", type=_nonnegative(int), default=0, metavar="N",
                   help="budgets solved at once on N worker processes (default 0: as many as "
                   "cores allow; 1: one after the other in this process); same results")
    w.add_argument("--ray", nargs="?", const="", metavar="ADDRESS", help="solve the budgets as "
                   "Ray tasks, on the cluster at ADDRESS, else on a local Ray instance (needs "
                   "pip install \"schedlang[ray]\")")
    _param_argument(w)
    _max_elements_argument(w)

    i = sub.add_parser("import", help="convert graph data from other tools to .sched")
    i.add_argument("file")
    i.add_argument("--format", required=True, choices=["checkmate-nx"])
    i.add_argument("-o", "--output", required=True)
    i.add_argument("--budget", help="also write `budget peak` (size or percent)")

    p = sub.add_parser("plan", help="make a plan with a heuristic planner (no solver)")
    p.add_argument("file", nargs="?", help="graph data (.sched or checkmate-nx .json)")
    p.add_argument("--planner", help="planner name (schedlang plan --list)")
    p.add_argument("--list", action="store_true", help="list the planners: name, views, description")
    p.add_argument("--budget", help="peak budget: a size (14GiB) or a percent of the "
                   "no-recomputation peak (90%%); overrides the data's `budget peak`")
    p.add_argument("--plan-out", help="write the plan (schedlang.plan/1 JSON) here")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")

    # PyTorch front end (needs torch; the argument definitions import no torch)

    add_trace_arguments(sub.add_parser("trace", help="trace and profile a PyTorch module into "
                                                     "layered graph data (needs torch)"))
    add_run_arguments(sub.add_parser("run", help="train a PyTorch module with a plan; predicted vs "
                                                 "measured peak and time (needs torch)"))
    return ap


_STARTED: list[float] = []  # time.monotonic() when the process began (solve --time-limit)


def _process_start() -> float:
    """`time.monotonic()` when this process started (Linux: /proc/self/stat against
    /proc/uptime, both on the monotonic clock's scale); elsewhere: now."""
    import time

    now = time.monotonic()
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        age = uptime - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return now
    return now - age if 0 <= age < 3600 else now


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit code. Errors are printed located on stderr (and, with
    --json, as one JSON object on stdout: `schedlang.cli.output`)."""
    _STARTED[:] = [_process_start()] if argv is None else []
    argv = sys.argv[1:] if argv is None else list(argv)
    output.reset()
    wants_json = "--json" in argv
    try:
        args = _parser().parse_args(argv)
        wants_json = bool(getattr(args, "json", False))
        with progress.session(_progress_mode(args)):
            return {"check": cmd_check, "solve": cmd_solve, "simulate": cmd_simulate,
                    "import": cmd_import, "sweep": cmd_sweep,
                    "plan": cmd_plan, "trace": cmd_trace, "run": cmd_run}[args.command](args)
    except SchedError as e:
        print(str(e), file=sys.stderr)
        if wants_json:
            output.print_error(e, e.exit_code)
        return e.exit_code
    except KeyboardInterrupt:
        print("schedlang: interrupted", file=sys.stderr)
        if wants_json:
            output.print_error(SchedError("interrupted", Loc("schedlang")), 130)
        return 130
    except Exception as e:  # a bug: its traceback on stderr, and still one JSON object
        if not wants_json:
            raise
        import traceback

        traceback.print_exc()
        output.print_error(e, 1)
        return 1


def _progress_mode(args) -> str:
    """The progress display of a command (`schedlang.progress`): off with --quiet, with
    --verbose (the solver's own log) and for sweep (its own line per budget), else auto
    (a live line on a terminal, plain lines otherwise; $SCHEDLANG_PROGRESS)."""
    if getattr(args, "quiet", False) or getattr(args, "verbose", False) \
            or args.command == "sweep":
        return "off"
    return "auto"


def cmd_trace(args) -> int:
    from ..pytorch.trace import trace_main

    return trace_main(args)


def cmd_run(args) -> int:
    from ..pytorch.run import run_main

    return run_main(args)


def cmd_check(args) -> int:
    failed = 0
    params = _params(args)
    for f in args.files:
        try:
            if is_node_link_file(f):  # a Checkmate/Moccasin graph, as solve reads it
                program = attach_graph(load_program([], [args.model] if args.model else None,
                                                    text=""), load_checkmate_nx(f))
            else:
                program = load_program([Path(f)], [args.model] if args.model else None)
            if params:
                set_params(program, params, Loc("--param"))
            check_program(program)
            _print_warnings(program)
            if program.has_formulation:
                # with data, also instantiate: params outside their domain, missing budgets...;
                # without, build the domains that need no data, under the size guard
                sizes, ir = declaration_sizes(program, args.max_elements)
                if args.stats:
                    print(f"{f}:")
                    print(format_sizes(sizes, ir))
        except SchedError as e:
            print(str(e), file=sys.stderr)
            failed = max(failed, e.exit_code)
    if not failed:
        print(f"ok: {len(args.files)} file{'s' if len(args.files) > 1 else ''} checked")
    return failed


def cmd_solve(args) -> int:
    # an unknown or missing solver, before any work (none named: the default strategy's)
    resolve(args.solver, args.backend or "pyomo")
    _writable(args, ("--plan-out", "plan_out", "plan"))
    prob = load(args.file, model=args.model, budget=args.budget, max_elements=args.max_elements,
                params=_params(args))
    prob.check()
    _print_warnings(prob.program)
    since = min([prob.started, *_STARTED])
    # no formulation, solver, backend or warm start named: the default strategy picks them
    chosen = args.model or args.solver or args.backend or args.warm_start != "auto"
    if chosen:
        prob.lower()
        result = prob.solve(backend=args.backend or "pyomo", solver=args.solver or DEFAULT_SOLVER,
                            time_limit=args.time_limit, gap=args.gap, threads=args.threads,
                            presolve=not args.no_presolve, warm_start=args.warm_start,
                            verbose=args.verbose, since=since)
    else:
        result = strategy.solve(prob, time_limit=args.time_limit, gap=args.gap,
                                threads=args.threads, presolve=not args.no_presolve,
                                verbose=args.verbose, since=since)
    if args.plan_out and result.plan is not None:
        result.plan.save(args.plan_out)
        result.plan_path = args.plan_out
    smallest = _explain(prob, result, args, since)
    if args.json:
        out = result.to_json()
        if smallest is not None:
            out["smallest_feasible_budget"] = smallest
        output.print_json(out)
    else:
        _print_result(prob, result)
        if smallest is not None:
            _print_smallest(smallest)
    code = EXIT_CODES[result.status]
    if code == 0 and result.simulated is not None and not result.simulated.valid:
        print("error: the decoded plan does not replay in the simulator; this is a bug in "
              "schedlang or in the model's decoder declaration", file=sys.stderr)
        return 5
    return code


def _explain(prob, result, args, since: float) -> dict | None:
    """At an infeasible budget (exit 3), the smallest feasible one by bisection
    (`schedlang.solve.bisection`), as `fit` says it: {"bytes", "percent", "reference_bytes",
    "stopped_early"}, or None (feasible, --no-explain, no graph data). With --time-limit the
    bisection ends by the command's deadline (`since` + the limit): its solves get what the
    solve left, and "stopped_early" says why it ended before narrowing the interval."""
    if result.status != Status.INFEASIBLE or not getattr(args, "explain", True) \
            or prob.graph is None or result.budget_bytes is None:
        return None
    deadline = None if args.time_limit is None else since + args.time_limit
    found, ref = explain_infeasible(prob, result.budget_bytes, args.backend or "pyomo",
                                    args.solver or DEFAULT_SOLVER, args.time_limit,
                                    deadline=deadline)
    best = None if found is None else found.best
    return {"bytes": best, "reference_bytes": ref,
            "percent": None if best is None or not ref else round(100.0 * best / ref, 3),
            "stopped_early": None if found is None else found.stopped}


def _print_smallest(smallest: dict) -> None:
    best, ref, stopped = smallest["bytes"], smallest["reference_bytes"], smallest["stopped_early"]
    if best is None and stopped:
        print(f"smallest  not found: the bisection stopped early ({stopped}); rerun with a "
              "larger --time-limit")
    elif best is None:
        print("smallest  none up to the no-recomputation peak"
              + (f" ({format_size(ref)}): another constraint than the peak budget binds"
                 if ref else ""))
    else:
        print(f"smallest  feasible budget found: {format_size(best)} ({best} B, "
              f"{smallest['percent']:.4g}% of the no-recomputation peak), by bisection with "
              "the solver" + (f"; stopped early ({stopped}): a smaller budget may have a plan"
                              if stopped else ""))


def _writable(args, *outputs) -> None:
    """Fail before any work when an output file given as (flag, attribute, what) cannot be
    written (`schedlang.language.paths.writable_file`)."""
    for flag, attr, what in outputs:
        path = getattr(args, attr, None)
        if path is not None:
            writable_file(path, Loc(flag), what)


def _print_warnings(program) -> None:
    """The checker's lint findings (path:line:col: warning: ...), on stderr."""
    for w in program.warnings:
        print(str(w), file=sys.stderr)


def _print_result(prob, r) -> None:
    g = prob.graph
    route = r.strategy
    model = route.model if route is not None and route.model else prob.program.name
    if route is not None:
        print(f"strategy  {route.summary()}")
    if r.model_size:
        print(f"model     {model}  on graph {g.name if g else '-'}"
              f"  ({r.model_size.get('variables')} variables, {r.model_size.get('constraints')} "
              f"constraints, {r.model_size.get('nonzeros')} nonzeros after presolve)")
        print(f"solver    {r.solver} via {r.backend}")
    else:  # the default strategy's large-graph route: a heuristic plan, no model built
        print(f"model     none (a heuristic plan)  on graph {g.name if g else '-'}")
    if r.budget_bytes is not None:
        print(f"budget    {format_size(r.budget_bytes)} ({r.budget_bytes} B)")
    line = f"status    {r.status.value}"
    if r.objective is not None:
        line += f"  objective {r.objective:.6g}"
    if r.bound is not None:
        line += f"  bound {r.bound:.6g}"
    if r.gap is not None:
        line += f"  gap {100 * r.gap:.3g}%"
    print(line)
    ws = getattr(r, "warm_start", None)
    # the solver's message; the warm start's summary has its own line
    message = r.solution.message if r.solution is not None else r.message
    if message:
        print(f"message   {message}")
    if ws is not None:
        print(f"warm start {ws.summary()[len('warm start '):]}")
    if r.plan is not None:
        computed = [op.node for op in r.plan.ops if op.op == "compute"]
        print(f"plan      {len(r.plan.ops)} ops, {len(computed)} computes "
              f"({len(computed) - len(set(computed))} recomputations)")
        if r.plan.predicted_peak is not None:
            print(f"predicted peak {format_size(r.plan.predicted_peak)}, time {r.plan.predicted_time:.6g}")
    if r.simulated is not None:
        s = r.simulated
        print(f"simulated {'valid' if s.valid else 'INVALID'}: peak {format_size(s.peak_bytes)}, "
              f"time {s.time:.6g}")
        for err in s.errors[:5]:
            print(f"  {err}")
    if r.plan_path:
        print(f"plan written to {r.plan_path}")
    print("timings   " + ", ".join(f"{k} {v:.3f}s" for k, v in r.timings.items()))


def load_problem(path: str):
    """A `Problem` on the graph data of a .sched file or of a checkmate-nx JSON file."""
    prob = load(path)
    if prob.graph is None:
        raise DataError("this file has no graph data", Loc(path))
    return prob


def load_graph(path: str):
    """Graph data and budgets from a .sched file or a checkmate-nx JSON file."""
    prob = load_problem(path)
    return prob.graph, prob.budgets


def cmd_simulate(args) -> int:
    plan = Plan.load(args.plan)
    graph, budgets = load_graph(args.graph)
    # --budget, else the budgets of the graph file, else (None) the plan's own
    budget = peak_budget(args.budget or None, graph, budgets)
    res = simulate(plan, graph, budget=budget, save_budget=budgets.get("save"))
    alloc = None
    if getattr(args, "allocator", False):
        # 32 seeded restarts of greedy-by-size: the plain order alone can leave gaps between
        # interleaved lifetimes (+13% on the chain example); 32 reach max-live there, <1 s on resnet50
        alloc = summary(plan, graph, restarts=32)
    if args.json:
        out = res.to_json()
        if alloc is not None:
            out["allocator"] = alloc
        output.print_json(out)
    else:
        print(f"{'valid' if res.valid else 'invalid'}: peak {format_size(res.peak_bytes)} "
              f"({res.peak_bytes} B), time {res.time:.6g}, {res.computes} computes")
        # the warnings first: "the plan was made for graph 'chain', not 'unet'" explains the
        # errors that follow it
        for w in res.warnings:
            print(f"  warning: {w}")
        for e in res.errors[:SHOWN_ERRORS]:
            print(f"  error: {e}")
        if len(res.errors) > SHOWN_ERRORS:
            print(f"  ... and {len(res.errors) - SHOWN_ERRORS} more errors (--json lists "
                  "them all)")
        if alloc is not None:
            print(format_summary(alloc))
    return 0 if res.valid else 3


#: errors `simulate` prints (--json gives them all)
SHOWN_ERRORS = 20


def cmd_import(args) -> int:
    _writable(args, ("-o", "output", "graph data"))
    graph = load_checkmate_nx(args.file)
    if args.budget:
        graph.budgets["peak"] = for_graph(args.budget, graph)

    text = write_graph(graph)
    write_file(args.output, text)
    print(f"wrote {args.output}: graph {graph.name}, {len(graph.nodes)} nodes, {len(graph.edges)} edges")
    return 0


def cmd_sweep(args) -> int:

    resolve(args.solver, args.backend)  # an unknown or missing solver: before any work
    if args.resume and not args.out:
        raise SchedError("--resume needs --out FILE.jsonl (the points to resume from)",
                         Loc("--resume"))
    if args.plot is not None:
        check_plot_target(args.plot)  # before a long sweep, not after it
    _writable(args, ("--out", "out", "stream of points"))
    if args.ray is not None:
        import_ray()  # a clear error before any work when Ray is missing
    files = [args.file] + args.compare
    params = _params(args)
    problems = [prepare(f, args.model, args.max_elements, params)  # every file checked
                for f in files]                                    # before any solve
    log = PointLog(args.out, resume=args.resume) if args.out else None
    try:
        return _sweep(args, files, problems, log)
    finally:
        if log is not None:
            log.close()


def _sweep(args, files, problems, log) -> int:
    import time



    tty = sys.stderr.isatty()
    started = [0.0]
    parallel = args.ray is not None or (args.jobs or default_jobs()) > 1
    curves: dict[str, list] = {}
    t0 = time.perf_counter()
    for path, prob in zip(files, problems):
        budgets = parse_budgets(args.budgets, prob.graph)
        ref_peak, ref_time = reference(prob.graph)
        label = f"{Path(path).stem} " if len(files) > 1 else ""
        done = log.resume(path, prob, args.backend, args.solver) if args.resume else {}

        def where(budget, ref_peak=ref_peak):
            pct = f"{100.0 * budget / ref_peak:.4g}%, " if ref_peak else ""
            return f"{pct}{format_size(budget)}"

        def progress(k, n, budget, point, where=where, label=label, done=done):
            head = f"sweep {label}[{k}/{n}] {where(budget)}: "
            if point is not None and parallel and budget not in done:
                started[0] = time.perf_counter() - point.solve_time  # a job's own solve time
            if point is None:
                started[0] = time.perf_counter()
                if tty:
                    print(head + "solving...", end="", file=sys.stderr, flush=True)
                return
            line = head + point.status.value
            if point.objective is not None:
                line += f", objective {point.objective:.6g}"
            if budget in done:
                line += f", from {args.out}"
            else:
                line += f", {time.perf_counter() - started[0]:.2f} s"
            print(("\r\x1b[K" if tty else "") + line, file=sys.stderr, flush=True)

        t1 = time.perf_counter()
        points = sweep_problem(prob, budgets, backend=args.backend, solver=args.solver,
                               time_limit=args.time_limit, gap=args.gap, threads=args.threads,
                               progress=progress, done=done, jobs=args.jobs, ray=args.ray,
                               warm_start=args.warm_start,
                               record=(lambda point, path=path: log.append(path, point))
                               if log is not None else None)
        curves[path] = points
        if not args.json:
            _print_sweep(prob, args, points, ref_peak, ref_time, time.perf_counter() - t1,
                         path if len(files) > 1 else None)
        bad = [p for p in points if p.solved and p.simulated_valid is False]
        if bad:
            print(f"error: the decoded plan of {path} at budget {where(bad[0].budget_bytes)} does "
                  "not replay in the simulator; this is a bug in schedlang or in the model's "
                  "decoder declaration", file=sys.stderr)
            return 5
    if args.json:
        if len(files) == 1:
            output.print_json([p.to_json() for p in curves[args.file]])
        else:
            output.print_json({"curves": [{"file": f, "points": [p.to_json() for p in pts]}
                                          for f, pts in curves.items()]})
    elif len(files) > 1:
        print(f"total     {len(files)} sweeps in {time.perf_counter() - t0:.2f} s")
    if args.plot:
        first = problems[0]
        graph_name = first.graph.name if first.graph else "-"
        ref_peak = reference(first.graph)[0]
        if len(files) == 1:
            plot_sweep(curves[args.file], args.plot, ref_peak=ref_peak,
                       title=f"{graph_name}: memory vs time overhead\nmodel {first.program.name}, "
                             f"{args.solver} via {args.backend}")
        else:
            plot_sweep({Path(f).stem: pts for f, pts in curves.items()}, args.plot, ref_peak=ref_peak,
                       title=f"{graph_name}: memory vs time overhead, {len(files)} formulations\n"
                             f"{args.solver} via {args.backend}")
        if not args.json:
            print(f"plot written to {args.plot}")
    return max(exit_code(pts) for pts in curves.values()) if len(files) > 1 else exit_code(curves[args.file])


def _print_sweep(prob, args, points, ref_peak, ref_time, total, path=None) -> None:
    """One sweep's table; `path`: its file, named in the title when several are compared
    (they often share their model and graph: offload.sched on transformer6)."""
    g = prob.graph
    print(f"sweep     {path + ': ' if path else ''}{prob.program.name} on graph "
          f"{g.name if g else '-'}, {len(points)} budgets, {args.solver} via {args.backend}")
    if ref_peak:
        print(f"reference no recomputation: peak {format_size(ref_peak)}, time {ref_time:.6g}")
    header = ["budget", "%", "status", "objective", "pred. peak", "overhead", "gap", "solve s"]
    rows: list[list[str]] = []
    for p in points:
        rows.append([
            format_size(p.budget_bytes),
            "-" if p.budget_percent is None else f"{p.budget_percent:.4g}%",
            p.status.value,
            "-" if p.objective is None else f"{p.objective:.6g}",
            "-" if p.predicted_peak is None else format_size(p.predicted_peak),
            "-" if p.overhead is None else f"{100 * p.overhead + 0.0:+.2f}%".replace("-0.00%", "+0.00%"),
            "-" if p.gap is None else f"{100 * p.gap:.3g}%",
            f"{p.solve_time:.2f}",
        ])
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    left = {2}  # status is text; the rest are numbers
    for r in [header] + rows:
        print("  ".join(c.ljust(w) if i in left else c.rjust(w)
                        for i, (c, w) in enumerate(zip(r, widths))).rstrip())
    solved = sum(p.solved for p in points)
    counts: dict[str, int] = {}
    for p in points:
        if not p.solved:
            counts[p.status.value] = counts.get(p.status.value, 0) + 1
    rest = "".join(f", {n} {s}" for s, n in counts.items())
    print(f"total     {len(points)} budgets in {total:.2f} s: {solved} solved{rest}")


def cmd_plan(args) -> int:
    """`schedlang plan`: a heuristic planner's plan, replayed; 0 fits, 3 over budget, 2 bad input.

    `simulated.valid` says the plan replays (dependencies, phantoms, every node computed);
    `fits_budget` says its peak (and, on layered data, its loss-phase memory) is within the
    budgets. `status` is "feasible" when it fits or there is no budget, else "infeasible".
    """
    table = registry.planners()
    if args.list:
        rows = [{"name": p.name, "views": list(p.views), "description": p.description}
                for p in table.values()]
        if args.json:
            output.print_json(rows)
        else:
            width = max(len(p.name) for p in table.values())
            vwidth = max(len(", ".join(p.views)) for p in table.values())
            for p in table.values():
                print(f"{p.name.ljust(width)}  {', '.join(p.views).ljust(vwidth)}  "
                      f"{p.description}")
        return 0
    where = Loc("schedlang plan")
    if not args.file:
        raise SchedError("a graph FILE is needed (or --list to list the planners)", where)
    if not args.planner:
        raise SchedError(f"--planner NAME is needed; planners: {', '.join(table)}", where)
    if args.planner not in table:
        raise SchedError(f"unknown planner '{args.planner}'{did_you_mean(args.planner, table)}; "
                         f"planners: {', '.join(table)} (schedlang plan --list)", where)

    _writable(args, ("--plan-out", "plan_out", "plan"))
    prob = load_problem(args.file)
    report = prob.plan(args.planner, budget=args.budget or None)
    if args.plan_out:
        report.plan.save(args.plan_out)
        report.plan_path = args.plan_out
    if args.json:
        output.print_json(report.to_json(), default=str)
    else:
        _print_plan(report)
    if not report.simulated.valid:
        print(f"error: planner '{args.planner}' made a plan that does not replay in the "
              f"simulator; this is a bug in the planner: {report.simulated.errors[0]}",
              file=sys.stderr)
    return report.exit_code


def _print_plan(report) -> None:
    r = report
    name, graph, plan, sim, ref = r.planner, r.graph, r.plan, r.simulated, r.reference
    budget, save_budget, fits, overhead = r.budget_bytes, r.save_budget_bytes, r.fits, r.overhead
    problems, plan_path, timings = r.problems, r.plan_path, r.timings

    print(f"planner   {name}  on graph {graph.name} ({graph_view(graph)} data)")
    if budget is not None:
        print(f"budget    {format_size(budget)} ({budget} B)"
              + (f", save {format_size(save_budget)}" if save_budget is not None else ""))
    computed = [op.node for op in plan.ops if op.op == "compute"]
    print(f"plan      {len(plan.ops)} ops, {len(computed)} computes "
          f"({len(computed) - len(set(computed))} recomputations)")
    if plan.predicted_peak is not None and plan.predicted_time is not None:
        print(f"predicted peak {format_size(plan.predicted_peak)}, time {plan.predicted_time:.6g}")
    if plan.meta.get("lp_bound") is not None:
        gap = plan.meta.get("gap")
        print(f"bound     {plan.meta['lp_bound']:.6g} (LP relaxation)"
              + (f", gap {100 * gap:.3g}%" if gap is not None else ""))
    print(f"simulated {'valid' if sim.valid else 'INVALID'}: peak {format_size(sim.peak_bytes)} "
          f"({sim.peak_bytes} B), time {sim.time:.6g}")
    if overhead is not None:
        print(f"overhead  {100 * overhead + 0.0:+.2f}% vs no recomputation (peak "
              f"{format_size(ref.peak_bytes)}, time {ref.time:.6g})")
    if budget is None and save_budget is None:
        print("fits      yes (no budget)")
    else:
        print(f"fits      {'yes' if fits else 'NO'}")
    for problem in problems[:5]:
        print(f"  {problem}")
    if plan_path:
        print(f"plan written to {plan_path}")
    print("timings   " + ", ".join(f"{k} {v:.3f}s" for k, v in timings.items()))


def entry() -> None:
    """The `schedlang` command: `main`, then exit with its code. When the time limit's
    watchdog left a solver running on its thread (`solvers.highs.threads_left_running`),
    the process ends with os._exit once the output is flushed: a normal interpreter shutdown
    would wait on, or abort in, that thread."""
    try:
        code = main()
    except BrokenPipeError:  # `schedlang ... | head`: the reader left; no traceback
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        code = 141  # as a shell reports SIGPIPE

    if threads_left_running():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
