"""Write the op graphs of issue 29's benchmarks to `bench/data/opgraphs/` as graph data.

    python bench/export_op_graphs.py [--names NAME ...] [--repeats 5]

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

Graphs of models the route was not tuned on (issue 29, "graphs we have not seen"):

* unet: the U-Net-like CNN of `schedlang/testing/torch_models.make_unet()`: 69 nodes;
* stages: the two-stage residual conv net of `make_stages()` (branches: each block's skip):
  72 nodes;
* resnet: transformers' ResNet of `schedlang/testing/hf_models.resnet()` (2 stages of 3 basic
  blocks), its logits: 113 nodes;
* bert1: transformers' one-layer BERT of `hf_models.bert(layers=1)` (no attention mask: the
  mask's data-dependent check does not trace to aten ops), its logits: 90 nodes;
* mixer: a two-block MLP-Mixer (`Mixer` here: token and channel MLPs, batch 8, 16 tokens,
  width 32): 69 nodes.

The files carry graph data only (no `use`): `schedlang solve FILE` solves them with the
default formulation, and `--model` picks another.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

OUT = ROOT / "bench" / "data" / "opgraphs"


class _MixerBlock(torch.nn.Module):
    """One MLP-Mixer block: an MLP across the tokens, then one across the channels."""

    def __init__(self, tokens: int, width: int):
        super().__init__()
        nn = torch.nn
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.tokens = nn.Sequential(nn.Linear(tokens, 2 * tokens), nn.GELU(),
                                    nn.Linear(2 * tokens, tokens))
        self.channels = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(),
                                      nn.Linear(2 * width, width))

    def forward(self, x):
        x = x + self.tokens(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channels(self.norm2(x))


class Mixer(torch.nn.Module):
    def __init__(self, tokens: int = 16, width: int = 32, depth: int = 2, classes: int = 5):
        super().__init__()
        self.blocks = torch.nn.Sequential(*[_MixerBlock(tokens, width) for _ in range(depth)])
        self.head = torch.nn.Linear(width, classes)

    def forward(self, x):
        return self.head(self.blocks(x).mean(1))


class _Logits(torch.nn.Module):
    """A transformers model's logits (`record_ops` traces a function of tensors to a tensor)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, *inputs):
        return self.model(*inputs).logits


def _mixer():
    torch.manual_seed(0)
    return Mixer(), (torch.randn(8, 16, 32),), None


def _hf(make, **kw):
    from schedlang.testing import hf_models

    model, args, kwargs, _ = getattr(hf_models, make)(**kw)
    inputs = args if args else (kwargs["input_ids"],)
    return _Logits(model), inputs, None


def _models():
    from bench_hierarchy import FLAT_MODELS, scale_model

    from schedlang.testing.torch_models import ALL, make_stages

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
        "unet": (lambda: ALL["unet"](), True, "schedlang/testing/torch_models.make_unet()"),
        "stages": (lambda: make_stages()[:2] + (None,), True,
                   "schedlang/testing/torch_models.make_stages()"),
        "resnet": (lambda: _hf("resnet"), True, "schedlang/testing/hf_models.resnet()'s logits"),
        "bert1": (lambda: _hf("bert", layers=1), True,
                  "schedlang/testing/hf_models.bert(layers=1)'s logits, no attention mask"),
        "mixer": (_mixer, True, "bench/export_op_graphs.py's Mixer(tokens=16, width=32, depth=2), "
                  "batch 8"),
    }


def export(name: str, repeats: int) -> Path:
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
