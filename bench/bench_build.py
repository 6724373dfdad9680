"""Build-time benchmark: schedlang's DSL path against a hand-written Pyomo model.

For linear training chains of n forward + n backward nodes (default n = 16, 32, 64), measures
in one process, interleaved repetition by repetition (median of --reps, at least 3):

  hand highspy      bench/checkmate_reference.build_highspy (the floor: one passModel call)
  hand Pyomo        bench/checkmate_reference.build_pyomo (ConcreteModel construction only)
  DSL compile       schedlang.load(...) + prob.lower()   (parse + check + instantiate + lower)
  DSL build pyomo   schedlang.solve.backends.build_model(ir, "pyomo")
  DSL build cvxpy   schedlang.solve.backends.build_model(ir, "cvxpy")

and prints the table plus the ratios (DSL compile + build) / (hand-written Pyomo construction).
The .sched file is written once per size before timing (a user's file exists already); every
path is run once on a tiny chain first so that imports are not timed.

With --translate, also the translation into the solver, which the "build" columns leave out
(for Pyomo it is most of a solve's overhead; a cvxpy Problem is only canonicalized then):

  hand Pyomo+load   construction + appsi_highs set_instance (what appsi does before HiGHS runs)
  DSL pyomo+load    DSL compile + build_model(ir, "pyomo") + appsi_highs set_instance
  DSL cvxpy+load    DSL compile + build_model(ir, "cvxpy") + get_problem_data(cp.HIGHS)

    python bench/bench_build.py [--sizes 16 32 64] [--reps 3] [--frac 0.8] [--translate]
"""
from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from checkmate_reference import build_highspy, build_pyomo  # noqa: E402
from graphs import chain_graph, dsl_missing, dsl_unavailable_message, no_recompute_peak, write_sched  # noqa: E402


def _timed(fn):
    gc.collect()
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _appsi_load(model):
    from pyomo.contrib.appsi.solvers import Highs

    opt = Highs()
    opt.highs_options = {"threads": 1}
    opt.set_instance(model)
    return opt


def _cvxpy_load(problem):
    import cvxpy as cp

    return problem.get_problem_data(cp.HIGHS, ignore_dpp=True)


def _dsl_compile(path, budget):
    import schedlang

    prob = schedlang.load(str(path), model="checkmate", budget=budget)
    ir = prob.lower()
    return prob, ir


def _dsl_build(ir, backend):
    from schedlang.solve.backends import build_model

    return build_model(ir, backend)


def _fmt(x):
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    return f"{x:.3f}" if x < 100 else f"{x:.1f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[16, 32, 64],
                    help="forward nodes per chain (graph has 2n nodes)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions per measurement (>= 3)")
    ap.add_argument("--frac", type=float, default=0.8,
                    help="budget as a fraction of the no-recomputation peak (build only)")
    ap.add_argument("--translate", action="store_true",
                    help="also time hand Pyomo construction + appsi_highs set_instance")
    ap.add_argument("--backends", nargs="+", default=["pyomo", "cvxpy"])
    ap.add_argument("--no-dsl", action="store_true", help="measure the hand-written models only")
    args = ap.parse_args(argv)
    reps = max(3, args.reps)

    missing = [] if args.no_dsl else dsl_missing(need_build=True)
    use_dsl = not args.no_dsl and not missing
    if missing:
        print(dsl_unavailable_message(missing), "\n")

    cols = ["hand highspy", "hand Pyomo"]
    if args.translate:
        cols.append("hand Pyomo+load")
    if use_dsl:
        cols.append("DSL compile")
        cols += [f"DSL build {b}" for b in args.backends]
        if args.translate:
            cols += [f"DSL {b}+load" for b in args.backends]
    loaders = {"pyomo": _appsi_load, "cvxpy": _cvxpy_load}

    # warm-up: import everything and run each path once on a tiny chain (not timed)
    g0 = chain_graph(2)
    build_highspy(g0, no_recompute_peak(g0))
    _appsi_load(build_pyomo(g0, no_recompute_peak(g0)))
    if use_dsl:
        with tempfile.TemporaryDirectory() as d0:
            try:
                _, ir0 = _dsl_compile(write_sched(g0, d0), no_recompute_peak(g0))
                for b in args.backends:
                    native = _dsl_build(ir0, b)
                    if args.translate and b in loaders:
                        loaders[b](native)
            except Exception:
                print("warning: DSL warm-up failed:\n" + traceback.format_exc(limit=3))

    results = {}  # n -> {col: [seconds]}
    sizes_info = {}
    dsl_errors = {}
    dsl_phase = {}  # n -> {"parse": [...], ...}
    tmp = tempfile.TemporaryDirectory(prefix="schedlang-bench-")
    for n in args.sizes:
        g = chain_graph(n)
        budget = int(args.frac * no_recompute_peak(g))
        g.budgets["peak"] = budget
        h, _ = build_highspy(g, budget)
        sizes_info[n] = (len(g.nodes), h.getNumRow(), h.getNumCol(), h.getNumNz())
        del h
        path = None
        if use_dsl:
            try:
                path = write_sched(g, tmp.name)
            except Exception as exc:  # colleague's writer may be incomplete
                dsl_errors[n] = f"write_graph failed: {exc!r}"
        times = {c: [] for c in cols}
        for _ in range(reps):
            times["hand highspy"].append(_timed(lambda: build_highspy(g, budget))[0])
            times["hand Pyomo"].append(_timed(lambda: build_pyomo(g, budget))[0])
            if args.translate:
                times["hand Pyomo+load"].append(
                    _timed(lambda: _appsi_load(build_pyomo(g, budget)))[0])
            if use_dsl and path is not None and n not in dsl_errors:
                try:
                    dt, (prob, ir) = _timed(lambda: _dsl_compile(path, budget))
                    times["DSL compile"].append(dt)
                    for key, val in (getattr(prob, "timings", None) or {}).items():
                        dsl_phase.setdefault(n, {}).setdefault(key, []).append(val)
                    for b in args.backends:
                        db, native = _timed(lambda: _dsl_build(ir, b))
                        times[f"DSL build {b}"].append(db)
                        if args.translate and b in loaders:
                            dl = _timed(lambda: loaders[b](native))[0]
                            times[f"DSL {b}+load"].append(dt + db + dl)
                        del native
                    del prob, ir
                except Exception:
                    dsl_errors[n] = traceback.format_exc(limit=3)
        results[n] = {c: (statistics.median(v) if v else None) for c, v in times.items()}
        print(f"n={n} done", file=sys.stderr, flush=True)

    # --- report --------------------------------------------------------------------------------
    print(f"Checkmate MILP build time, linear training chains, budget {args.frac:g} x "
          f"no-recompute peak; median of {reps} interleaved repetitions, seconds")
    head = ["n", "nodes", "rows", "cols", "nnz"] + cols
    widths = [max(len(h), 8) for h in head]
    print("  ".join(h.rjust(w) for h, w in zip(head, widths)))
    for n in args.sizes:
        nodes, rows, ncols, nnz = sizes_info[n]
        cells = [str(n), str(nodes), f"{rows:,}", f"{ncols:,}", f"{nnz:,}"]
        cells += [_fmt(results[n][c]) for c in cols]
        print("  ".join(c.rjust(w) for c, w in zip(cells, widths)))
    print("(rows/cols/nnz: the hand-written model, before presolve)")

    if use_dsl:
        print("\nRatios, DSL / hand-written Pyomo construction "
              "(total = DSL compile + backend build; build = backend build alone):")
        for n in args.sizes:
            r = results[n]
            hp = r["hand Pyomo"]
            parts = []
            for b in args.backends:
                bb = r.get(f"DSL build {b}")
                if bb is None or r["DSL compile"] is None:
                    parts.append(f"{b}: -")
                    continue
                tot = r["DSL compile"] + bb
                parts.append(f"{b}: total {tot / hp:.2f}x, build {bb / hp:.2f}x "
                             f"({tot:.3f} s vs {hp:.3f} s)")
            print(f"  n={n:3d}  " + ";  ".join(parts))
        if args.translate:
            print("\nWith the translation into the solver, DSL (compile+build+load) / hand Pyomo "
                  "(construction+appsi load):")
            for n in args.sizes:
                r = results[n]
                hl = r["hand Pyomo+load"]
                parts = [f"{b}: {r[f'DSL {b}+load'] / hl:.2f}x ({r[f'DSL {b}+load']:.3f} s vs "
                         f"{hl:.3f} s)" for b in args.backends
                         if r.get(f"DSL {b}+load") is not None]
                print(f"  n={n:3d}  " + ";  ".join(parts))
        if dsl_phase:
            print("\nschedlang prob.timings (median s):")
            for n, ph in dsl_phase.items():
                print(f"  n={n:3d}  " + "  ".join(
                    f"{k}={statistics.median(v):.3f}" for k, v in ph.items()
                    if all(isinstance(x, (int, float)) for x in v)))
        for n, err in dsl_errors.items():
            print(f"\nDSL path failed at n={n}:\n{err}")
    tmp.cleanup()
    return 1 if dsl_errors else 0


if __name__ == "__main__":
    sys.exit(main())
