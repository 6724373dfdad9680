"""Offloading combined with recomputation (models/offload.sched) next to each alone.

    python bench/bench_offload.py [--layers 12] [--bandwidth 24e9] [--budgets 40% 60% 80%]
                                  [--time-limit 120]

On the transformer-like chain of bench/instances.py with a host link of --bandwidth bytes per
second each way, solves at each budget: rockmate.sched (recompute only), offload.sched with
`allow_offload = 0` (must equal it), with `allow_recompute = 0` (offload only) and with both,
in one run. Prints the model size given to the solver, status, gap, solve seconds, and the
time overhead vs no recomputation of each, plus the ratio of the combined model's overhead to
the better single technique's. Every plan is replayed by the simulator (valid, time = objective).

    python bench/bench_offload.py --layers 6 --models offload offload_windows offload_steps

compares the offloading formulations instead (transfers at the frontier only, over each
phase's recomputation window too, at every step: docs/plans.md, "Which offloading model").
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from instances import transformer_chain  # noqa: E402

import schedlang  # noqa: E402
from schedlang.graphs.writer import write_graph  # noqa: E402
from schedlang.plans.planners.no_recompute import no_recompute_plan  # noqa: E402
from schedlang.plans.simulate import simulate  # noqa: E402

VARIANTS = (
    ("recompute (rockmate)", "use rockmate\n", ""),
    ("recompute (offload model, allow_offload = 0)", "use offload\n", "param allow_offload = 0\n"),
    ("offload only", "use offload\n", "param allow_recompute = 0\n"),
    ("recompute + offload", "use offload\n", ""),
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--bandwidth", type=float, default=24e9, help="bytes per second, each way")
    ap.add_argument("--budgets", nargs="+", default=["40%", "60%", "80%"])
    ap.add_argument("--time-limit", type=float, default=120.0)
    ap.add_argument("--gap", type=float, default=None)
    ap.add_argument("--models", nargs="+", default=None,
                    help="offloading models to compare (recompute + offload each) instead")
    args = ap.parse_args()
    variants = VARIANTS if not args.models else tuple(
        (f"recompute + offload ({m})", f"use {m}\n", "") for m in args.models)

    graph = transformer_chain(args.layers)
    graph.bandwidths = {"offload": args.bandwidth, "prefetch": args.bandwidth}
    data = write_graph(graph)
    base = simulate(no_recompute_plan(graph), graph).time
    print(f"transformer chain of {args.layers} layers x 3 options, host link {args.bandwidth / 1e9:g} GB/s "
          f"each way; HiGHS, time limit {args.time_limit:g} s; no-recomputation time {base:.6g} s")
    print(f"{'budget':>7}  {'formulation':<46} {'vars':>6} {'rows':>6} {'nnz':>7}  {'status':<11} "
          f"{'gap':>7} {'solve s':>8}  {'overhead':>9}  replay")
    for budget in args.budgets:
        overheads = {}
        for name, use, switch in variants:
            prob = schedlang.load(text=use + data + switch, budget=budget)
            r = prob.solve(time_limit=args.time_limit, gap=args.gap)
            size = r.model_size or {}
            over = None if r.objective is None else r.objective / base - 1
            overheads[name] = over
            sim = r.simulated
            replay = "-" if sim is None else (
                "valid" if sim.valid and abs(sim.time - r.objective) <= 1e-6 * max(1.0, r.objective)
                else "MISMATCH" if sim.valid else "INVALID")
            print(f"{budget:>7}  {name:<46} {size.get('variables', 0):>6} {size.get('constraints', 0):>6} "
                  f"{size.get('nonzeros', 0):>7}  {r.status.value:<11} "
                  f"{'-' if r.gap is None else f'{100 * r.gap:.2f}%':>7} {r.timings.get('solve', 0.0):>8.2f}  "
                  f"{'-' if over is None else f'{100 * over:+.2f}%':>9}  {replay}")
        both = overheads.get("recompute + offload")
        singles = [v for k, v in overheads.items() if k != "recompute + offload" and v is not None]
        if both is not None and singles and min(singles) > 0:
            print(f"{'':>7}  combined overhead / best single technique = {both / min(singles):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
