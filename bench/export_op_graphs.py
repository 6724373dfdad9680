"""Write the op graphs of issue 29's benchmarks to `bench/data/opgraphs/` as graph data.

    python bench/export_op_graphs.py [--names gpt2block tiny gpt1 gpt12 mlp3] [--repeats 5]

Each is the Checkmate view that `schedlang trace --ops` writes (`OpGraph.checkmate`: the
model's aten units, the loss, their backward nodes; parameter gradients held to the step's
end unless said otherwise), recorded on this machine's CPU with one intra-op thread. The op
times are measurements: the files are the benchmark's data, committed so that the table
(`bench/bench_proofs.py`) and the tests read the same numbers every time, without tracing.

* gpt2block: the 2-block GPT of `bench_hierarchy.py --parts flat` (width 128, context 64):
  164 aten ops, 124 nodes;
* tiny: the 1-block GPT of `bench_hierarchy.py --flat-model tiny` (width 32, context 16):
  90 aten ops, 72 nodes;
* gpt1: a one-block GPT without dropout, batch 32 x context 32 (`schedlang/testing/torch_models.py`
  defaults otherwise): 60 nodes, the "one-block GPT op graph of ~50 nodes";
* gpt12: the 12-block transformer of `bench_hierarchy.py --parts scale` (RMSNorm, tanh GELU):
  975 nodes (the loss, no parameter-gradient nodes: the count `--parts scale` prints);
* mlp3: a 3-layer MLP (`schedlang/testing/torch_models.make_mlp(depth=3, batch=64, width=32)`): 22 nodes,
  an op graph small enough for the tests to solve to optimality with every model.

The files carry graph data only (no `use`): `schedlang solve FILE` solves them with the
default formulation, and `--model` picks another.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

OUT = ROOT / "bench" / "data" / "opgraphs"


def _models():
    from bench_hierarchy import FLAT_MODELS, scale_model

    from schedlang.testing.torch_models import ALL

    return {
        "gpt2block": (lambda: ALL["gpt"](**FLAT_MODELS["gpt2"]), True,
                      f"bench_hierarchy.py --parts flat's GPT {FLAT_MODELS['gpt2']}"),
        "tiny": (lambda: ALL["gpt"](**FLAT_MODELS["tiny"]), True,
                 f"bench_hierarchy.py --flat-model tiny's GPT {FLAT_MODELS['tiny']}"),
        "gpt1": (lambda: ALL["gpt"](batch=32, context=32, layers=1, dropout=0.0), True,
                 "schedlang/testing/torch_models.make_gpt(batch=32, context=32, layers=1, dropout=0.0)"),
        "gpt12": (lambda: scale_model("gpt-rms-gelu"), False,
                  "bench_hierarchy.py --parts scale's 12-block gpt-rms-gelu"),
        "mlp3": (lambda: ALL["mlp"](depth=3, batch=64, width=32), True,
                 "schedlang/testing/torch_models.make_mlp(depth=3, batch=64, width=32)"),
    }


def export(name: str, repeats: int) -> Path:
    import torch

    from schedlang.graphs.writer import write_graph
    from schedlang.language.files import write_file
    from schedlang.pytorch.opgraph import record_ops

    make, param_grads, what = _models()[name]
    torch.set_num_threads(1)
    model, inputs, _ = make()
    og = record_ops(model, inputs, repeats=repeats)
    graph = og.checkmate(name, loss=True, param_grads=param_grads)
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{name}.sched"
    write_file(path, f"# {what}: {og.n_ops} aten ops in {len(og.units)} units, recorded by "
               f"bench/export_op_graphs.py (torch {torch.__version__}, CPU, 1 thread, "
               f"{repeats} repeats)\n" + write_graph(graph))
    print(f"wrote {path}: {len(graph.nodes)} nodes, {len(graph.edges)} edges")
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--names", nargs="+", default=list(_models()))
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    for name in args.names:
        export(name, args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
