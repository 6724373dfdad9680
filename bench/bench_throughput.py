"""Throughput of the simulator, the presolve and the shift planner on long inputs.

These used to be wall-clock assertions in unit tests, which a loaded shared machine broke; the
tests now check the results and this script prints the speeds (median of `--reps`, ops or
rows per second) next to the targets they held:

* a 100,000-op plan on a 300-node chain (Checkmate view): target < 3 s;
* a 100,000-op plan on a 200-layer chain (layered view): target < 1 s;
* the shift planner on vgg16_train (when shared/graphs is present): target < 10 s.

    python bench/bench_throughput.py [--reps 5]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from graphs import load_shared  # noqa: E402

from schedlang.graphs.elements import Node  # noqa: E402
from schedlang.graphs.graph import Graph  # noqa: E402
from schedlang.plans.plan import Op, Plan  # noqa: E402
from schedlang.plans.planners import run_planner  # noqa: E402
from schedlang.plans.planners.no_recompute import no_recompute_plan  # noqa: E402
from schedlang.plans.simulate import simulate  # noqa: E402
from schedlang.testing.layered_instances import long_plan_on_a_deep_chain  # noqa: E402


def checkmate_case() -> tuple[Plan, Graph]:
    n = 300
    g = Graph("g", nodes=[Node(f"v{i}", 1.0, 1 + i % 7) for i in range(n)],
              edges=[(f"v{i}", f"v{i + 1}") for i in range(n - 1)])
    base = no_recompute_plan(g).ops
    ops: list[Op] = []
    while len(ops) < 100_000:
        ops.extend(base)
    return Plan(graph="g", ops=ops), g


def median_seconds(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    rows = []
    for name, (plan, g), target in (("simulate, checkmate view", checkmate_case(), 3.0),
                                    ("simulate, layered view", long_plan_on_a_deep_chain(), 1.0)):
        assert simulate(plan, g).valid
        s = median_seconds(lambda: simulate(plan, g), args.reps)
        rows.append((f"{name}, {len(plan.ops)} ops", s, target))
    try:
        vgg = load_shared("vgg16_train")
    except (FileNotFoundError, OSError):
        vgg = None
    if vgg is not None:
        s = median_seconds(lambda: run_planner("shift", vgg), args.reps)
        rows.append(("shift planner, vgg16_train", s, 10.0))
    print(f"{'case':44} {'median s':>9} {'target s':>9}  met")
    for name, s, target in rows:
        print(f"{name:44} {s:9.3f} {target:9.1f}  {'yes' if s < target else 'NO'}")


if __name__ == "__main__":
    main()
