"""Peak memory of compile and build against the size of the model built (issue 11).

For each graph (linear training chains of n forward + n backward nodes, and the shared
Checkmate graphs that are present) solved with `models/checkmate.sched` at 80%, measures with
`tracemalloc` (Python objects and numpy/scipy buffers, which report to it), each phase from a
fresh start of its peak:

  compile      schedlang.load(...) + prob.lower(): parse, check, instantiate, lower to the IR
  presolve     schedlang.compile.presolve.presolve(ir)
  build pyomo  schedlang.solve.backends.build_model(presolved, "pyomo")

and prints per graph the IR's nonzeros (before presolve) and each phase's peak, in MiB and in
bytes per nonzero. The multiple documented in docs/reliability.md is the largest bytes per
nonzero seen. Imports are done before measuring (a tiny chain first).

    python bench/bench_compile_memory.py [--sizes 32 64 128] [--shared vgg16_train mobilenet_train]
"""
from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from graphs import chain_graph, load_shared, write_sched  # noqa: E402

SHARED = Path(__file__).resolve().parent.parent.parent / "shared" / "graphs"


def measure(path: Path) -> dict:
    import schedlang
    from schedlang.compile.presolve import presolve
    from schedlang.solve.backends import build_model

    out = {}
    gc.collect()
    tracemalloc.start()
    prob = schedlang.load(str(path), budget="80%")
    ir = prob.lower()
    out["compile"] = tracemalloc.get_traced_memory()[1]
    tracemalloc.reset_peak()
    model, _post = presolve(ir)
    out["presolve"] = tracemalloc.get_traced_memory()[1]
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    build_model(model, "pyomo")
    out["build pyomo"] = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    out["nnz"] = ir.nnz
    out["rows"] = ir.n_rows
    out["columns"] = ir.n_columns
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="*", default=[32, 64, 128])
    ap.add_argument("--shared", nargs="*", default=["vgg16_train", "mobilenet_train"])
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        graphs = [(f"chain n={n}", write_sched(chain_graph(n), tmp)) for n in [4] + args.sizes]
        for name in args.shared:
            if (SHARED / f"{name}.json").exists():
                g = load_shared(SHARED / f"{name}.json")
                d = Path(tmp) / name
                d.mkdir()
                graphs.append((name, write_sched(g, d)))
        measure(graphs[0][1])  # imports and caches, not measured
        print(f"{'graph':<18} {'columns':>9} {'rows':>9} {'nonzeros':>10} "
              f"{'compile MiB':>12} {'B/nnz':>6} {'presolve MiB':>13} {'B/nnz':>6} "
              f"{'build MiB':>10} {'B/nnz':>6}")
        worst = 0.0
        for name, path in graphs[1:]:
            r = measure(path)
            nnz = max(r["nnz"], 1)
            row = f"{name:<18} {r['columns']:>9,} {r['rows']:>9,} {r['nnz']:>10,}"
            for phase in ("compile", "presolve", "build pyomo"):
                per = r[phase] / nnz
                worst = max(worst, per)
                row += f" {r[phase] / 2**20:>12.1f} {per:>6.0f}"
            print(row, flush=True)
        print(f"largest peak per nonzero: {worst:.0f} bytes")


if __name__ == "__main__":
    main()
