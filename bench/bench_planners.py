"""Heuristic planners against the ILP optimum, in one table.

For every shared Checkmate training graph (``/work/shared/graphs/*_train.json``, loaded with
``schedlang.graphs.checkmate_nx.load_checkmate_nx``) and for ``examples/transformer12.sched``
(layered data, the H-Rockmate ILP), at each budget of ``--budgets`` (default 90% and 80% of the
no-recomputation peak):

* every planner that ``schedlang.plans.planners.planners()`` registers (baselines, mutwo, shift, ...,
  whatever is there) on the graph's view: its simulated time overhead versus the
  no-recomputation plan, whether its plan replays, whether it fits the budget, its peak;
* the ILP: ``schedlang.load(<graph written with schedlang.graphs.writer.write_graph>, budget=B)``
  (``checkmate`` for node/edge graphs; the file's own ``rockmate`` for transformer12) solved
  with HiGHS under ``--time-limit`` (default 60 s): status, overhead of its simulated plan,
  gap.

A cell reads ``+4.1%`` (fits), ``+4.1%>`` (replays but over the budget: the planner's best
effort), ``INVALID`` (does not replay: a planner bug), ``n/a`` (planner not applicable to the
view), ``-`` (skipped). ILP cells add the status and the gap when not optimal.

    python bench/bench_planners.py [--graphs vgg16_train mobilenet_train ...] [--budgets 90% 80%]
                                   [--time-limit 60] [--backend pyomo|cvxpy] [--no-ilp]
                                   [--ilp-max-nodes 200] [--long] [--json OUT.json]

The ILP is skipped on node/edge graphs with more than ``--ilp-max-nodes`` nodes (Checkmate's
model grows as n^2 + n|E|: resnet50_train would be ~640k variables); such cells read
``skipped``. Exit status 1 when some planner's plan does not replay.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from graphs import SHARED_GRAPHS  # noqa: E402

from schedlang.language.errors import SchedError  # noqa: E402
from schedlang.plans.planners import PlannerNotApplicable, graph_view, planners, run_planner  # noqa: E402
from schedlang.plans.planners.no_recompute import no_recompute_plan  # noqa: E402
from schedlang.plans.simulate import simulate  # noqa: E402
from schedlang.problem import resolve_budget  # noqa: E402

NO_LIMIT = 1 << 62


def load_graphs(names: list[str] | None, layered: bool):
    """[(graph, budgets, ILP source path or None, model or None)]"""
    from schedlang.cli.main import load_graph
    from schedlang.graphs.checkmate_nx import load_checkmate_nx

    out = []
    paths = ([SHARED_GRAPHS / f"{n}.json" for n in names] if names
             else sorted(SHARED_GRAPHS.glob("*_train.json")))
    for path in paths:
        if not path.exists():
            print(f"skipping {path}: not found", file=sys.stderr)
            continue
        out.append((load_checkmate_nx(path), {}, None, "checkmate"))
    if layered:
        sched = ROOT / "examples" / "transformer12.sched"
        graph, budgets = load_graph(str(sched))
        out.append((graph, budgets, sched, None))
    return out


def run_heuristic(name: str, graph, budget: int, save_budget):
    t0 = time.perf_counter()
    try:
        plan = run_planner(name, graph, budget)
    except PlannerNotApplicable:
        return {"planner": name, "cell": "n/a"}
    except SchedError as exc:
        return {"planner": name, "cell": "error", "message": str(exc)}
    seconds = time.perf_counter() - t0
    sim = simulate(plan, graph, budget=NO_LIMIT, save_budget=NO_LIMIT)
    fits = sim.valid and sim.peak_bytes <= budget
    if fits and save_budget is not None and sim.save_peak_bytes is not None:
        fits = sim.save_peak_bytes <= save_budget
    return {"planner": name, "valid": sim.valid, "fits": fits, "peak_bytes": sim.peak_bytes,
            "time": sim.time, "seconds": seconds,
            "errors": sim.errors[:3] if not sim.valid else []}


def run_ilp(graph, source: Path | None, model: str | None, budget: int, args, tmp: Path):
    import schedlang
    from schedlang.graphs.writer import write_graph

    if source is None:
        if len(graph.nodes) > args.ilp_max_nodes:
            return {"planner": "ILP", "cell": "skipped",
                    "message": f"{len(graph.nodes)} nodes > --ilp-max-nodes {args.ilp_max_nodes}"}
        source = tmp / f"{graph.name}.sched"
        if not source.exists():
            source.write_text(write_graph(graph))
    t0 = time.perf_counter()
    try:
        prob = schedlang.load(str(source), model=model, budget=budget)
        res = prob.solve(backend=args.backend, solver="highs", time_limit=args.time_limit)
    except SchedError as exc:
        return {"planner": "ILP", "cell": "error", "message": str(exc)}
    seconds = time.perf_counter() - t0
    out = {"planner": "ILP", "status": res.status.value, "gap": res.gap, "seconds": seconds,
           "objective": res.objective}
    if res.simulated is not None:
        out.update(valid=res.simulated.valid, fits=res.simulated.valid,
                   peak_bytes=res.simulated.peak_bytes, time=res.simulated.time)
    return out


def cell(r: dict, ref_time: float) -> str:
    if "cell" in r:
        return r["cell"]
    if r["planner"] == "ILP":
        if r.get("time") is None:
            return r["status"]
        text = f"{100 * (r['time'] / ref_time - 1) + 0.0:+.1f}%"
        if r["status"] != "optimal":
            gap = "" if r.get("gap") is None else f" gap {100 * r['gap']:.2g}%"
            text += f" ({r['status']}{gap})"
        return text
    if not r["valid"]:
        return "INVALID"
    text = f"{100 * (r['time'] / ref_time - 1) + 0.0:+.1f}%"
    return text if r["fits"] else text + ">"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", nargs="+", help="names in the shared graphs folder "
                    "(default: every *_train.json)")
    ap.add_argument("--budgets", nargs="+", default=["90%", "80%"])
    ap.add_argument("--time-limit", type=float, default=60.0, help="ILP seconds per solve")
    ap.add_argument("--backend", default="cvxpy", choices=["pyomo", "cvxpy"])
    ap.add_argument("--no-ilp", action="store_true")
    ap.add_argument("--no-layered", action="store_true", help="skip examples/transformer12.sched")
    ap.add_argument("--ilp-max-nodes", type=int, default=200)
    ap.add_argument("--long", action="store_true", help="also one line per planner run "
                    "(peak, seconds)")
    ap.add_argument("--json", metavar="OUT", help="write every result as JSON here")
    args = ap.parse_args(argv)

    names = list(planners())
    rows, records, broken = [], [], []
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        for graph, budgets, source, model in load_graphs(args.graphs, not args.no_layered):
            ref = simulate(no_recompute_plan(graph), graph, budget=NO_LIMIT, save_budget=NO_LIMIT)
            save_budget = budgets.get("save")
            if save_budget is not None:
                graph.budgets.setdefault("save", save_budget)
            for spec in args.budgets:
                budget = resolve_budget(spec, graph)
                results = []
                if not args.no_ilp:
                    print(f"{graph.name} at {spec}: ILP ...", file=sys.stderr, flush=True)
                    results.append(run_ilp(graph, source, model, budget, args, tmp))
                for name in names:
                    results.append(run_heuristic(name, graph, budget, save_budget))
                for r in results:
                    if r.get("valid") is False:
                        broken.append((graph.name, spec, r["planner"], r.get("errors")))
                    records.append({"graph": graph.name, "view": graph_view(graph),
                                    "budget": spec, "budget_bytes": budget,
                                    "reference_time": ref.time,
                                    "reference_peak_bytes": ref.peak_bytes, **r})
                rows.append((graph.name, spec, results, ref))

    header = ["graph", "budget"] + (["ILP"] if not args.no_ilp else []) + names
    table = []
    for gname, spec, results, ref in rows:
        table.append([gname, spec] + [cell(r, ref.time) for r in results])
    widths = [max(len(str(row[i])) for row in table + [header]) for i in range(len(header))]
    print("time overhead vs no recomputation; '>' = over the budget (best effort), "
          "n/a = not applicable to the view")
    for row in [header] + table:
        print("  ".join(str(c).ljust(w) if i < 2 else str(c).rjust(w)
                        for i, (c, w) in enumerate(zip(row, widths))))
    if args.long:
        print()
        for rec in records:
            if "time" not in rec:
                continue
            print(f"{rec['graph']:16} {rec['budget']:5} {rec['planner']:22} "
                  f"peak {100 * rec['peak_bytes'] / rec['reference_peak_bytes']:6.1f}%  "
                  f"{rec.get('seconds', 0):7.2f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1, default=str))
    for gname, spec, name, errors in broken:
        print(f"INVALID: {name} on {gname} at {spec}: {errors}", file=sys.stderr)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
