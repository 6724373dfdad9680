"""The option model's sub-solves on the op graphs of `transformers` blocks, HiGHS with and
without its own presolve, side by side in one run.

    python bench/bench_option_solves.py [--graphs FILE ...] [--time-limit 10]
        [--fractions 0.8 0.6 0.4 0.2] [--save 0.4 0.1] [--json OUT]

Graphs: `bench/data/blockgraphs/*.sched`, the op graphs (Checkmate view, no loss node) that
`fit(..., block_options=...)` solves `models/layer_options.sched` on for one block of the
bench's `transformers` models (`bench_baselines.py` sizes: BERT, GPT-2, Llama, T5's encoder
and decoder blocks; two graphs per block where the generator records the block two ways,
over its call's tensors and under a selective-checkpoint policy). `index.json` holds each
graph's `saved_total` (what autograd saves inside the block), which the budgets are
fractions of, as `schedlang.pytorch.options.solve_spans` sets them: `--fractions` on the
backward's peak (`budget peak`), `--save` on the phantom alone (`budget save`, the peak left
free).

Each row: one graph at one budget, `Problem.solve` with the time limit (parsing and lowering
counted, as a sub-solve counts them), once with HiGHS's defaults and once with
`layer_solves.SUB_SOLVE_OPTIONS` (HiGHS without its presolve, what `fit` uses): status,
objective (ms of recomputation), seconds. Met: the second finds a cut wherever the first
does, never a slower one where both prove an optimum.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import schedlang
from schedlang.layer_solves import SUB_SOLVE_OPTIONS, budget_series

DATA = Path(__file__).resolve().parent / "data" / "blockgraphs"


def budgets_of(graph, saved_total: int, fractions, save) -> list[tuple[str, dict]]:
    """(label, budgets) of the series `solve_spans` solves (`layer_solves.budget_series`):
    the backward's peak at `fractions`, then the phantom alone at `save`."""
    peak = budget_series(graph, saved_total, fractions)[0]
    phantom = budget_series(graph, saved_total, save)[1]
    return [(f"peak {f}", b) for f, b in zip(fractions, peak)] + \
        [(f"save {f}", b) for f, b in zip(save, phantom)]


def solve_once(graph, budgets: dict, limit: float, options: dict | None) -> dict:
    g = copy.copy(graph)
    g.budgets = dict(budgets)
    t0 = time.monotonic()
    prob = schedlang.load(model="layer_options", graph=g)
    res = prob.solve(time_limit=limit, since=t0, solver_options=options)
    return {"status": res.status.value, "objective": res.objective,
            "seconds": round(time.monotonic() - t0, 2)}


def verdict(default: dict, chosen: dict) -> str:
    found = default["objective"] is not None
    if found and chosen["objective"] is None:
        return "NOT met: no cut"
    if default["status"] == chosen["status"] == "optimal" and \
            chosen["objective"] > default["objective"] * (1 + 1e-6) + 1e-12:
        return "NOT met: slower optimum"
    return "met"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", nargs="*", help="graph files (default: bench/data/blockgraphs)")
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--fractions", type=float, nargs="*", default=[0.8, 0.6, 0.4, 0.2])
    ap.add_argument("--save", type=float, nargs="*", default=[0.4, 0.1])
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    index = json.loads((DATA / "index.json").read_text())
    paths = [Path(p) for p in args.graphs] if args.graphs else sorted(DATA.glob("*.sched"))
    chosen_opts = SUB_SOLVE_OPTIONS.get("highs")
    rows = []
    print(f"time limit {args.time_limit:g} s a solve; objective: ms of recomputation")
    print(f"{'graph':32} {'budget':9} {'HiGHS defaults':30} {'sub-solve options':30} target")
    for path in paths:
        entry = index.get(path.name)
        if entry is None:
            print(f"{path.name}: not in {DATA / 'index.json'} (its saved_total)", file=sys.stderr)
            return 2
        graph = schedlang.load(path).graph
        for label, budgets in budgets_of(graph, entry["saved_total"], args.fractions, args.save):
            default = solve_once(graph, budgets, args.time_limit, None)
            chosen = solve_once(graph, budgets, args.time_limit, chosen_opts)
            row = {"graph": path.stem, "nodes": len(graph.nodes), "budget": label,
                   "budgets": budgets, "default": default, "chosen": chosen,
                   "target": verdict(default, chosen)}
            rows.append(row)

            def cell(r):
                obj = "-" if r["objective"] is None else f"{r['objective'] * 1e3:.4f}"
                return f"{r['status'][:10]:10} {obj:>9} {r['seconds']:6.1f}s"

            print(f"{path.stem:32} {label:9} {cell(default):30} {cell(chosen):30} "
                  f"{row['target']}", flush=True)
    met = sum(r["target"] == "met" for r in rows)
    print(f"\nmet on {met} of {len(rows)} rows")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0 if met == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
