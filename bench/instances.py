"""Layered (H-Rockmate) instances for examples, tests and benchmarks, as `Graph` objects.

    python bench/instances.py          # rewrites examples/{transformer12,unet}.sched

Times and sizes are made up but shaped like real blocks: autograd keeps every activation
(large phantom, fastest backward), recompute keeps nothing (backward re-runs the forward from
the block's input), selective keeps the outputs of the expensive ops (middle ground).
"""
from __future__ import annotations

import sys
from pathlib import Path

from schedlang.graphs.elements import DataNode, Layer, Loss, Option
from schedlang.graphs.graph import Graph

MiB = 2**20
ms = 1e-3


def _options(inp: str, out: str, scale: float = 1.0) -> list[Option]:
    f, a = 2.0 * ms * scale, int(16 * MiB * scale)
    return [
        Option("autograd", f, a, 2 * f, 2 * a, int(96 * MiB * scale)),
        Option("recompute", f, a, 3 * f, 3 * a, 0, [inp]),
        Option("selective", f, a, 2.4 * f, 2 * a, int(40 * MiB * scale), [out]),
    ]


def transformer_chain(n_layers: int, act: int = 16 * MiB) -> Graph:
    """n blocks in a chain, 3 options each, with the loss after the last block."""
    g = Graph(f"transformer{n_layers}", title=f"{n_layers} transformer-like blocks, 3 options each",
              time_unit="s")
    names = ["x"] + [f"h{i}" for i in range(1, n_layers + 1)]
    g.data.append(DataNode("x", act, "input"))
    g.data += [DataNode(h, act) for h in names[1:]]
    g.data.append(DataNode("loss", 4))
    g.data += [DataNode(f"{h}.grad", act) for h in reversed(names[1:])]
    g.data.append(DataNode("x.grad", act, "output"))
    for i in range(1, n_layers + 1):
        inp, out = names[i - 1], names[i]
        g.layers.append(Layer(f"block{i}", [inp], [out], [f"{out}.grad"], [f"{inp}.grad"],
                              _options(inp, out)))
    g.loss = Loss([names[-1]], ["loss", f"{names[-1]}.grad"], 0.1 * ms)
    return g


def unet(depth: int = 3, act: int = 16 * MiB) -> Graph:
    """Encoder e1..eD, decoder dD..d1 where d_i also reads the encoder output e_i (a skip):
    e_i's gradient receives two contributions (from e_{i+1}/the bottom and from d_i)."""
    g = Graph(f"unet{depth}", title=f"U-Net-like, depth {depth}, skip connections", time_unit="s")
    g.data.append(DataNode("x", act, "input"))
    enc = [f"e{i}" for i in range(1, depth + 1)]
    dec = [f"d{i}" for i in range(depth, 0, -1)]
    g.data += [DataNode(e, act // (2 ** i)) for i, e in enumerate(enc)]
    g.data.append(DataNode("mid", act // (2 ** depth)))
    g.data += [DataNode(d, act // (2 ** (int(d[1:]) - 1))) for d in dec]
    g.data.append(DataNode("loss", 4))
    grads = ["d1", *reversed(dec[:-1]), "mid", *reversed(enc)]
    sizes = {d.name: d.size for d in g.data}
    g.data += [DataNode(f"{n}.grad", sizes[n]) for n in grads]
    g.data.append(DataNode("x.grad", act, "output"))
    prev = "x"
    for i, e in enumerate(enc, 1):
        g.layers.append(Layer(f"down{i}", [prev], [e], [f"{e}.grad"], [f"{prev}.grad"],
                              _options(prev, e, 1 / 2 ** (i - 1))))
        prev = e
    g.layers.append(Layer("bottom", [prev], ["mid"], ["mid.grad"], [f"{prev}.grad"],
                          _options(prev, "mid", 1 / 2 ** depth)))
    below = "mid"
    for d in dec:
        i = int(d[1:])
        skip = f"e{i}"
        ins = [below, skip]
        g.layers.append(Layer(f"up{i}", ins, [d], [f"{d}.grad"], [f"{below}.grad", f"{skip}.grad"],
                              [Option(o.name, o.fwd_time, o.fwd_overhead, o.bwd_time, o.bwd_overhead,
                                      o.phantom, ins if o.name == "recompute" else o.needs)
                               for o in _options(below, d, 1 / 2 ** (i - 1))]))
        below = d
    g.loss = Loss(["d1"], ["loss", "d1.grad"], 0.1 * ms)
    return g


def write_example(graph: Graph, path: Path, header: str, budget: str | None = None,
                  model: str = "rockmate") -> None:
    from schedlang.graphs.writer import write_graph
    from schedlang.problem import resolve_budget

    if budget:
        graph.budgets["peak"] = resolve_budget(budget, graph)
    text = "".join(f"# {line}\n" for line in header.strip().splitlines()) + f"use {model}\n\n"
    path.write_text(text + write_graph(graph))


def write_offload_examples(root: Path, n_layers: int = 6, bandwidth: float = 24e9) -> None:
    """examples/transformer6_offload.sched (recompute and offload) and two one-line variants
    that switch either off: the three curves of the offload sweep."""
    g = transformer_chain(n_layers)
    g.bandwidths = {"offload": bandwidth, "prefetch": bandwidth}
    name = f"transformer{n_layers}"
    both = root / "examples" / f"{name}_offload.sched"
    write_example(g, both,
                  f"{n_layers} transformer-like blocks (3 options each) and a host link of "
                  f"{bandwidth / 1e9:g} GB/s each way,\n"
                  "solved with models/offload.sched: each activation and phantom is kept, recomputed\n"
                  "or offloaded. Made by bench/instances.py. Budget: 40% of the no-recomputation peak.\n"
                  "The same graph with offloading or recomputation switched off, as three curves:\n"
                  f"  schedlang sweep examples/{name}_offload.sched --compare examples/{name}_recompute_only.sched\n"
                  f"      --compare examples/{name}_offload_only.sched --budgets 30%..100%/8 --plot offload.png",
                  "40%", model="offload")
    for variant, line, what in (("recompute_only", "param allow_offload = 0", "no offloading"),
                                ("offload_only", "param allow_recompute = 0", "no recomputation")):
        (root / "examples" / f"{name}_{variant}.sched").write_text(
            f"# examples/{both.name} with {what}: a one-line override of models/offload.sched\n"
            f'use "{both.name}"\n{line}\n')


if __name__ == "__main__":
    root = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(root))
    write_example(transformer_chain(12), root / "examples" / "transformer12.sched",
                  "12 transformer-like blocks with 3 options each (autograd, recompute, selective),\n"
                  "made by bench/instances.py. Budget: 60% of the no-recomputation peak.\n"
                  "  schedlang solve examples/transformer12.sched --gap 0.01", "60%")
    write_example(unet(3), root / "examples" / "unet.sched",
                  "A U-Net-like graph: each decoder block also reads its encoder's output (skip\n"
                  "connections: data used far from where it is produced), so each encoder output's\n"
                  "gradient gets two contributions. Made by bench/instances.py. Budget: 70% of the\n"
                  "no-recomputation peak.\n  schedlang solve examples/unet.sched", "70%")
    write_offload_examples(root)
