"""Checkpointed groups of blocks inside the solve (issue 28, item 2), against the solve
without them plus the priced family of group plans, side by side on one profile.

    python bench/bench_group_solve.py [--models gpt2:12 gpt2:48] [--points 6]
        [--time-limit 60] [--json OUT] [--graph FILE]

For each model (`schedlang/testing/hf_models.py`'s GPT-2 at bench_baselines' sizes, `:N` its
number of blocks; `tiny` sizes for 48 blocks), profiled once (the hook front end), and at
`--points` activation budgets from the smallest the family or the per-block solve reaches to
plain execution's:

* `before`: the per-block solve (models/extensions/per_block.sched), then the fastest plan of
  the group family (`families.group_plans`, priced by the simulator) where faster: what fit did
  until this change;
* `after`: `planning.solve_at`, what fit does now: the solve of
  models/extensions/block_groups.sched (groups, per-block and generated options in one model),
  warm-started from the family's fastest plan that fits, for `GROUP_SOLVE_S` at most; where it
  stops before proving its plan optimal, the per-block solve as well; the family as the
  fallback.

Printed per budget: both plans' predicted time (the simulator's plus the reruns' correction),
which kind of plan each is, and the seconds each solve took (the family's pricing counted once,
apart). Predicted times only: measured steps are bench_baselines.py's.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from types import SimpleNamespace

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from schedlang.graphs.writer import write_graph  # noqa: E402
from schedlang.problem import load  # noqa: E402
from schedlang.pytorch.frontends.blocks.frontend import BLOCKS  # noqa: E402
from schedlang.pytorch.frontends.blocks.hooked import PER_BLOCK  # noqa: E402
from schedlang.pytorch.frontends.blocks.plan_reading import GROUP, plan_choices  # noqa: E402
from schedlang.pytorch.planning import group_plans_priced, or_group_plan, solve_at, solve_extra, solve_plan  # noqa: E402
from schedlang.pytorch.prepare import prepare  # noqa: E402
from schedlang.testing import hf_models  # noqa: E402

SIZES = {12: {"batch": 8, "seq": 128, "dim": 64}, 48: {"batch": 2, "seq": 32, "dim": 32}}
MiB = 2 ** 20


def kind(plan, prep, blocks) -> str:
    if plan is None:
        return "none"
    choices = plan_choices(plan, prep.graph, blocks)
    groups = {c for c in choices.values() if c.startswith(GROUP)}
    return f"{len(groups)} group(s)" if groups else "per-block"


def solve(prep, activation, extension, args, warm=None):
    extra = dict(solve_extra(prep), extensions=(extension,))
    t0 = time.perf_counter()
    plan = solve_plan(prep.graph, activation, "highs", args.time_limit, "pyomo",
                      warm_start=warm, **extra)
    seconds = time.perf_counter() - t0
    if plan is not None:
        plan.predicted_time += prep.front.time_correction(plan, prep.graph)
    return or_group_plan(prep, activation, plan), seconds, plan


def saved(prep, path: str) -> None:
    """The profile `run` solves on, as graph data and the numbers `solve_at` reads beside it
    (`--graph`: the solves again without profiling; a 48-block profile takes minutes)."""
    with open(path, "w") as f:
        f.write(write_graph(prep.graph))
    with open(path + ".json", "w") as f:
        json.dump({"blocks": [b.name for b in prep.partitioned.found.blocks],
                   "loss_overhead": prep.loss_overhead, "output_bytes": prep.output_bytes,
                   "resident_bytes": prep.resident_bytes, "plain_peak": prep.plain_peak,
                   "outputs_held": prep.outputs_held}, f)


def loaded(path: str):
    """What `solve_at` reads of a `Prepared`, from `saved` files."""
    with open(path + ".json") as f:
        meta = json.load(f)
    found = SimpleNamespace(blocks=[SimpleNamespace(name=n) for n in meta.pop("blocks")])
    return SimpleNamespace(graph=load(path).graph, front=BLOCKS, fsdp=None, grouped=None,
                           solved=[], partitioned=SimpleNamespace(found=found), generated=None,
                           **meta)


def run(name: str, layers: int, args) -> dict:
    t0 = time.perf_counter()
    if args.graph and os.path.exists(args.graph):
        prep = loaded(args.graph)
    else:
        torch.manual_seed(0)
        model, margs, kwargs, loss_fn = hf_models.gpt2(layers=layers, **SIZES[layers])
        prep = prepare(model, margs, loss_fn=loss_fn, sample_kwargs=kwargs,
                       frontend="blocks", repeats=3)
        if args.graph:
            saved(prep, args.graph)
    profile_s = time.perf_counter() - t0
    blocks = [b.name for b in prep.partitioned.found.blocks]
    t0 = time.perf_counter()
    family = group_plans_priced(prep)
    family_s = time.perf_counter() - t0
    high = prep.plain_peak - prep.resident_bytes + prep.output_bytes
    low = min(need for need, _ in family)
    rows = []
    for k in range(args.points):
        activation = int(low + (high - low) * k / max(1, args.points - 1))
        before, before_s, _ = solve(prep, activation, PER_BLOCK, args)
        t0 = time.perf_counter()
        after = solve_at(prep, activation, "highs", args.time_limit, "pyomo", solve_extra(prep))
        after_s = time.perf_counter() - t0
        row = {"activation": activation,
               "before_time": None if before is None else before.predicted_time,
               "before_kind": kind(before, prep, blocks), "before_solve_s": before_s,
               "after_time": None if after is None else after.predicted_time,
               "after_kind": kind(after, prep, blocks), "after_solve_s": after_s,
               "after_from": "solver" if after is None or "planner" not in after.meta
               or not after.meta["planner"].startswith("groups") else "family"}
        rows.append(row)
        bt = "-" if before is None else f"{1000 * before.predicted_time:.2f}"
        at = "-" if after is None else f"{1000 * after.predicted_time:.2f}"
        print(f"{name}:{layers} {activation / MiB:8.2f} MiB  before {bt:>8} ms "
              f"({row['before_kind']}, solve {before_s:.2f} s)  after {at:>8} ms "
              f"({row['after_kind']} from the {row['after_from']}, solve {after_s:.2f} s)",
              flush=True)
    return {"model": f"{name}:{layers}", "blocks": len(blocks), "profile_s": profile_s,
            "family_plans": len(family), "family_s": family_s, "rows": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["gpt2:12", "gpt2:48"])
    ap.add_argument("--points", type=int, default=6)
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--json")
    ap.add_argument("--graph", help="read the profile from this file (written there by a "
                    "first run): one model only")
    args = ap.parse_args()
    out = []
    for spec in args.models:
        name, _, n = spec.partition(":")
        if name != "gpt2" or int(n or 12) not in SIZES:
            ap.error(f"unknown model '{spec}': gpt2:12 or gpt2:48")
        res = run(name, int(n or 12), args)
        print(f"  {res['blocks']} blocks, profile {res['profile_s']:.1f} s, family of "
              f"{res['family_plans']} plans priced in {res['family_s']:.2f} s", flush=True)
        out.append(res)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
