"""Budget sweeps: today's per-budget re-lowering vs the sweep as it runs now, and on Ray.

    python bench/bench_sweep.py                                  # transformer12, 8 budgets, 2 rounds
    python bench/bench_sweep.py --file examples/unet.sched --budgets 40%..100%/4 --rounds 3
    python bench/bench_sweep.py --ray                            # + `sweep --ray` (local Ray)

Side by side, in one process, the rounds interleaved (ABBA...) so that machine load hits all:

* **relower**: `sweep_problem(..., parametric=False)`: each budget lowered from the program and
  solved cold, one after the other (the sweep before issue 15: the baseline of the ratios);
* **parametric**: the program lowered once and moved to each budget (`schedlang.compile.parametric`),
  solved cold, serial;
* **warm**: parametric, each budget started from the best fitting heuristic plan at that
  budget (`warm_start="auto"`, as `solve` does by default), serial (`--jobs 1`);
* **jobs-cold**: parametric, cold, on `--jobs` worker processes (default: as many as cores
  allow; `schedlang.parallel`);
* **default**: what `schedlang sweep` does by default: parametric, warm start auto, on
  `--jobs` workers;
* **neighbour** (with `--neighbour`): parametric, serial, each budget's solve started from the
  solution of the budget below it.

Per round: wall seconds of the whole sweep (worker start-up included), seconds spent lowering
and in the solver (summed over budgets: with workers, more than the wall time), and per budget
the status, objective and solve time. Then per variant the ratio relower / variant of the
wall medians (issue 15's target: >= 2x for the default) and whether it gives relower's table
(status and objective per budget; an objective may differ only at a budget stopped at a gap,
`feasible`). With `--ray`, the CLI's `sweep --ray` (a local Ray instance, started and stopped
by the sweep: its start-up is in the wall time) against the serial CLI sweep (`--jobs 1`), and
the same check. The machine's load average is printed with every figure.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from schedlang.parallel import default_jobs
from schedlang.sweep import prepare, sweep_problem

ROOT = Path(__file__).resolve().parents[1]


def load() -> str:
    return "load {:.1f} {:.1f} {:.1f}".format(*os.getloadavg())


def table(points) -> list:
    return [(p.budget_bytes, p.status.value, None if p.objective is None else round(p.objective, 9))
            for p in points]


def same(a, b) -> bool:
    for x, y in zip(a, b):
        if x[:2] != y[:2]:
            return False
        if x[1] == "optimal" and x[2] != y[2]:
            return False
    return len(a) == len(b)


VARIANTS = {  # name: sweep_problem's options
    "relower": {"parametric": False, "warm_start": None, "jobs": 1},
    "parametric": {"warm_start": None, "jobs": 1},
    "warm": {"warm_start": "auto", "jobs": 1},
    "jobs-cold": {"warm_start": None, "jobs": None},
    "default": {"warm_start": "auto", "jobs": None},
    "neighbour": {"warm_start": None, "jobs": 1, "neighbour": True},
}


def run_once(path: str, budgets: str, name: str, time_limit, jobs):
    prob = prepare(path)
    options = dict(VARIANTS[name])
    if options["jobs"] is None:
        options["jobs"] = jobs
    t0 = time.perf_counter()
    points = sweep_problem(prob, budgets, time_limit=time_limit, **options)
    wall = time.perf_counter() - t0
    lower = sum(p.result.timings.get("lower", 0.0) for p in points)
    solve = sum(p.result.timings.get("solve", 0.0) for p in points)
    return wall, lower, solve, points


def cli_sweep(path: str, budgets: str, ray: bool, time_limit) -> tuple[float, list]:
    argv = [sys.executable, "-c", "from schedlang.cli.main import main; raise SystemExit(main())",
            "sweep", path, "--budgets", budgets, "--json", "--no-warm-start"]
    if time_limit is not None:
        argv += ["--time-limit", str(time_limit)]
    argv += ["--ray"] if ray else ["--jobs", "1"]
    t0 = time.perf_counter()
    out = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    if out.returncode not in (0, 4):
        raise SystemExit(f"sweep failed ({out.returncode}): {out.stderr[-2000:]}")
    pts = json.loads(out.stdout)
    return wall, [(p["budget_bytes"], p["status"],
                   None if p["objective"] is None else round(p["objective"], 9)) for p in pts]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--file", default="examples/transformer12.sched")
    ap.add_argument("--budgets", default="30%..100%/8")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--time-limit", type=float, default=None)
    ap.add_argument("--jobs", type=int, default=0, help="workers of the parallel variants "
                    "(default 0: as many as cores allow)")
    ap.add_argument("--only", help="comma list of variants besides relower (default: "
                    "parametric,warm,jobs-cold,default)")
    ap.add_argument("--neighbour", action="store_true", help="also the neighbour warm start")
    ap.add_argument("--ray", action="store_true", help="also time `sweep --ray` vs the serial CLI")
    args = ap.parse_args()
    path = str(ROOT / args.file) if not Path(args.file).is_absolute() else args.file

    others = (args.only.split(",") if args.only else ["parametric", "warm", "jobs-cold", "default"])
    names = ["relower"] + others + (["neighbour"] if args.neighbour else [])
    print(f"{Path(path).name}, budgets {args.budgets}, {args.rounds} rounds, jobs "
          f"{args.jobs or default_jobs()} on {default_jobs()} cores; {load()}", flush=True)
    rows = {n: [] for n in names}
    tables = {}
    for r in range(args.rounds):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            before = load()
            wall, lower, solve, points = run_once(path, args.budgets, name, args.time_limit,
                                                  args.jobs)
            rows[name].append(wall)
            tables.setdefault(name, table(points))
            print(f"round {r + 1} {name:10s} wall {wall:7.2f} s  lower {lower:6.3f} s  "
                  f"solve {solve:7.2f} s  ({before} -> {load()})", flush=True)
            for p in points:
                print(f"    {p.budget_percent or 0:7.3g}%  {p.status.value:9s} "
                      f"{p.objective!s:22s} solve {p.solve_time:6.2f} s", flush=True)
    a = statistics.median(rows["relower"])
    print()
    for name in names[1:]:
        b = statistics.median(rows[name])
        ok = same(tables["relower"], tables[name])
        target = " (target >= 2x)" if name == "default" else ""
        print(f"relower median {a:.2f} s, {name:10s} median {b:7.2f} s: ratio {a / b:.2f}x"
              f"{target}; same table: {ok}; {load()}")

    if args.ray:
        print()
        before = load()
        ws, serial = cli_sweep(path, args.budgets, False, args.time_limit)
        print(f"serial CLI sweep      wall {ws:7.2f} s  ({before} -> {load()})", flush=True)
        before = load()
        wr, on_ray = cli_sweep(path, args.budgets, True, args.time_limit)
        print(f"sweep --ray (local)   wall {wr:7.2f} s  ({before} -> {load()})", flush=True)
        print(f"same table: {same(serial, on_ray)}")


if __name__ == "__main__":
    main()
