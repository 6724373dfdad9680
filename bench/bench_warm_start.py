"""Cold vs warm-started Checkmate solve: the MIP gap reached within a time limit.

    python bench/bench_warm_start.py                       # mobilenet_train, 90%, 60 s, HiGHS
    python bench/bench_warm_start.py --graph vgg16_train --budget 80% --time-limit 30

The graph (`/work/shared/graphs/<name>.json`) is imported with
`schedlang.graphs.checkmate_nx.load_checkmate_nx` and written as `.sched` with
`schedlang.graphs.writer.write_graph`; the Checkmate model is lowered once. Every heuristic planner of
`schedlang.plans.planners.planners()` (plus `no_recompute`) is run at the budget and replayed by the
simulator; the start is the fastest plan that fits and whose encoding satisfies the model, else
(said so) the fitting or smallest-peak plan, whatever its encoding. Then the same model is
solved twice, cold and with that start (the cold solve first), and the two gaps are printed
side by side. The issue's target: the warm-started gap is smaller than the cold one.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import schedlang
from schedlang.graphs.checkmate_nx import load_checkmate_nx
from schedlang.graphs.writer import write_graph
from schedlang.language.units import format_size
from schedlang.plans.planners import planners
from schedlang.plans.planners.no_recompute import no_recompute_peak
from schedlang.problem import Problem, run_named_planner

SHARED = Path("/work/shared/graphs")


def _fmt(value, spec: str = ".6g", none: str = "-") -> str:
    return none if value is None else format(value, spec)


def _gap(result) -> str:
    if result.gap is None:
        return "no solution" if result.objective is None else "no bound"
    return f"{100 * result.gap:.3f}%"


def choose_start(prob: Problem, budget: int) -> tuple[dict, list[dict]]:
    """Run every planner; the candidate rows, and the chosen one."""
    names = ["no_recompute", *[n for n in planners() if n != "no_recompute"]]
    rows = []
    for name in names:
        t0 = time.perf_counter()
        row = {"planner": name}
        try:
            plan = run_named_planner(name, prob.graph, budget)
        except Exception as exc:  # a planner that cannot run here is one row of the table
            row.update(error=f"{type(exc).__name__}: {exc}", seconds=time.perf_counter() - t0)
            rows.append(row)
            continue
        ws = prob.prepare_warm_start(plan)
        row.update(plan=plan, ws=ws, seconds=time.perf_counter() - t0)
        rows.append(row)
    usable = [r for r in rows if "ws" in r and r["ws"].fits and r["ws"].feasible]
    if usable:
        best = min(usable, key=lambda r: r["ws"].time)
        best["why"] = "the fastest plan that fits the budget and satisfies the model"
        return best, rows
    fitting = [r for r in rows if "ws" in r and r["ws"].fits]
    if fitting:
        best = min(fitting, key=lambda r: r["ws"].time)
        best["why"] = ("no plan's encoding satisfies the model; using the fastest plan that "
                       "fits (the solve will run cold)")
        return best, rows
    replayed = [r for r in rows if "ws" in r and r["ws"].valid]
    if not replayed:
        raise SystemExit("no planner produced a plan that replays")
    best = min(replayed, key=lambda r: r["ws"].peak_bytes)
    best["why"] = ("no heuristic plan fits the budget; using the smallest-peak one "
                   "(the solve will run cold)")
    return best, rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graph", default="mobilenet_train")
    ap.add_argument("--budget", default="90%")
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--backend", default="pyomo", choices=["pyomo", "cvxpy"])
    ap.add_argument("--solver", default="highs")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", help="also write the figures to this JSON file")
    args = ap.parse_args(argv)

    path = Path(args.graph)
    if not path.suffix:
        path = SHARED / f"{args.graph}.json"
    graph = load_checkmate_nx(path)
    with tempfile.TemporaryDirectory() as tmp:
        sched = Path(tmp) / f"{graph.name}.sched"
        sched.write_text("use checkmate\n" + write_graph(graph))
        prob = schedlang.load(sched, budget=args.budget)
        t0 = time.perf_counter()
        prob.check()
        ir = prob.lower()
        lower_s = time.perf_counter() - t0
    budget = prob.budgets["peak"]
    ref = no_recompute_peak(graph)
    print(f"graph     {graph.name}: {len(graph.nodes)} nodes, {len(graph.edges)} edges; "
          f"no-recomputation peak {format_size(ref)}")
    print(f"budget    {args.budget} = {format_size(budget)} ({budget} B); model "
          f"{ir.n_columns} columns, {ir.n_rows} rows (lowered in {lower_s:.2f} s)")
    print(f"solver    {args.solver} via {args.backend}, time limit {args.time_limit:g} s"
          f"{'' if args.threads is None else f', {args.threads} threads'}")

    best, rows = choose_start(prob, budget)
    print("\nheuristic plans at this budget:")
    print(f"  {'planner':<22} {'time':>10} {'peak':>12} {'fits':>5} {'model':>9} {'s':>6}")
    for r in rows:
        if "error" in r:
            print(f"  {r['planner']:<22} error: {r['error'][:90]}")
            continue
        ws = r["ws"]
        model = "feasible" if ws.feasible else ("n/a" if not ws.encoded else "violated")
        print(f"  {r['planner']:<22} {_fmt(ws.time):>10} {format_size(ws.peak_bytes):>12} "
              f"{'yes' if ws.fits else 'no':>5} {model:>9} {r['seconds']:>6.2f}")
    print(f"start     {best['planner']}: {best['why']}")

    common = dict(backend=args.backend, solver=args.solver, time_limit=args.time_limit,
                  threads=args.threads)
    t0 = time.perf_counter()
    cold = prob.solve(**common)
    cold_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    warm = prob.solve(warm_start=best["plan"], **common)
    warm_s = time.perf_counter() - t0

    print(f"\n{'':<10} {'cold':>16} {'warm':>16}")
    lines = [
        ("status", cold.status.value, warm.status.value),
        ("objective", _fmt(cold.objective), _fmt(warm.objective)),
        ("bound", _fmt(cold.bound), _fmt(warm.bound)),
        ("gap", _gap(cold), _gap(warm)),
        ("solve s", f"{cold.timings.get('solve', 0):.1f}", f"{warm.timings.get('solve', 0):.1f}"),
        ("total s", f"{cold_s:.1f}", f"{warm_s:.1f}"),
        ("simulated", "valid" if cold.simulated and cold.simulated.valid else "-",
         "valid" if warm.simulated and warm.simulated.valid else "-"),
    ]
    for name, a, b in lines:
        print(f"{name:<10} {a:>16} {b:>16}")
    print(f"warm start {warm.warm_start.summary()[len('warm start '):]}")
    if cold.gap is not None and warm.gap is not None:
        verdict = "met" if warm.gap < cold.gap else "NOT met"
        print(f"target    warm gap < cold gap: {verdict} "
              f"({100 * warm.gap:.3f}% vs {100 * cold.gap:.3f}%)")
    elif warm.gap is not None:
        print("target    met: the cold solve found no solution with a bound, the warm one did")

    if args.json:
        Path(args.json).write_text(json.dumps({
            "graph": graph.name, "budget": args.budget, "budget_bytes": budget,
            "time_limit": args.time_limit, "backend": args.backend, "solver": args.solver,
            "start": best["planner"], "start_reason": best["why"],
            "planners": [{"planner": r["planner"], "error": r.get("error"),
                          **({k: v for k, v in r["ws"].to_json().items()} if "ws" in r else {})}
                         for r in rows],
            "cold": cold.to_json() | {"plan": None},
            "warm": warm.to_json() | {"plan": None},
        }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
