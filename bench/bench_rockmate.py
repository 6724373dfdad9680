"""H-Rockmate on the 12-layer transformer-like instance: model size and time per stage.

    python bench/bench_rockmate.py [--layers 12] [--budget 60%] [--gap 0.01] [--reps 3]

Target (issue): a 12-layer instance with 3 options per layer solves to <= 1% gap with HiGHS.
Prints, per backend, the model size given to the solver, the status and gap reached, and the
median seconds of each stage (parse, check, lower, presolve, build, solve, decode, simulate).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from instances import transformer_chain  # noqa: E402

import schedlang  # noqa: E402
from schedlang.graphs.writer import write_graph  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--budget", default="60%")
    ap.add_argument("--gap", type=float, default=0.01)
    ap.add_argument("--time-limit", type=float, default=600)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--backends", nargs="+", default=["pyomo", "cvxpy"])
    args = ap.parse_args()

    text = "use rockmate\n" + write_graph(transformer_chain(args.layers))
    stages = ["parse", "check", "lower", "presolve", "build", "solve", "decode", "simulate"]
    print(f"H-Rockmate, transformer chain of {args.layers} layers x 3 options, budget {args.budget}, "
          f"gap {args.gap:g}, HiGHS; median of {args.reps}")
    for backend in args.backends:
        runs = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            prob = schedlang.load(text=text, budget=args.budget)
            res = prob.solve(backend=backend, gap=args.gap, time_limit=args.time_limit)
            runs.append((time.perf_counter() - t0, res))
        wall = statistics.median(r[0] for r in runs)
        res = runs[-1][1]
        size = res.model_size
        print(f"\n{backend}: status {res.status.value}, objective {res.objective:.6g}, "
              f"gap {100 * (res.gap or 0):.3f}%, simulated {'valid' if res.simulated.valid else 'INVALID'}, "
              f"total {wall:.2f} s")
        print(f"  model given to the solver: {size['variables']} variables, {size['constraints']} "
              f"constraints, {size['nonzeros']} nonzeros")
        print("  " + "  ".join(f"{s}={statistics.median(r[1].timings.get(s, 0.0) for r in runs):.3f}"
                               for s in stages))
    return 0


if __name__ == "__main__":
    sys.exit(main())
