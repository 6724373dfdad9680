"""The simulator's speed: one `simulate` call with the graph's indexes cached, and one that
builds them (a fresh `Graph` each call, as before they were cached).

    python bench/bench_simulate.py [--reps 50]

Replays the no-recomputation plan of shared Checkmate graphs (`/work/shared/graphs` or
`$SCHEDLANG_GRAPHS`) and of the layered transformer-like chain of bench/instances.py; prints
the fastest of --reps calls in milliseconds (as `timeit` does: on a loaded machine the median
mostly measures preemption), the two columns interleaved in one process.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from graphs import load_shared  # noqa: E402
from instances import transformer_chain  # noqa: E402

from schedlang.plans.planners.no_recompute import no_recompute_plan  # noqa: E402
from schedlang.plans.simulate import simulate  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    cases = [(name, load_shared(name)) for name in ("vgg16_train", "resnet50_train")]
    cases += [("transformer_chain(12)", transformer_chain(12)),
              ("transformer_chain(48)", transformer_chain(48))]
    print(f"{'graph':24} {'ops':>5} {'cached ms':>10} {'uncached ms':>12}")
    for name, graph in cases:
        plan = no_recompute_plan(graph)
        warm, cold = [], []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            simulate(plan, graph)
            warm.append(time.perf_counter() - t0)
            fresh = dataclasses.replace(graph)  # same content, no cached index
            t0 = time.perf_counter()
            simulate(plan, fresh)
            cold.append(time.perf_counter() - t0)
        print(f"{name:24} {len(plan.ops):>5} {min(warm) * 1e3:>10.3f} {min(cold) * 1e3:>12.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
