"""Builders of tiny layered graphs (H-Rockmate view) for the tests: chains of layers and a
skip connection, with options written in MiB and placeholder names for a layer's own tensors."""
from __future__ import annotations

from pathlib import Path

from schedlang.graphs.elements import DataNode, Layer, Loss, Option, Step
from schedlang.graphs.graph import Graph
from schedlang.plans.plan import Op, Plan
from schedlang.plans.planners.no_recompute import no_recompute_plan
from schedlang.problem import load

MiB = 2**20

#: a pinned copy of examples/tiny_transformer.sched (budgets: peak 200MiB, save 120MiB), so that
#: the hand computations of the simulator tests do not follow edits of the example
TINY_TEXT = (Path(__file__).resolve().parent / "data" / "tiny_transformer_pinned.sched").read_text()


def opt(name: str, fwd: float, bwd: float, phantom_mib: float, needs=(), fwd_over_mib: float = 0,
        bwd_over_mib: float = 0, fwd_steps=(), bwd_steps=()) -> Option:
    """An option; steps are (overhead MiB, frees, creates) with the names "in", "out" (the
    layer's input and output), "gin", "gout" (the gradients its backward reads and writes)."""
    return Option(name, fwd, int(fwd_over_mib * MiB), bwd, int(bwd_over_mib * MiB),
                  int(phantom_mib * MiB), list(needs),
                  fwd_steps=[Step(int(m * MiB), list(f), list(c)) for m, f, c in fwd_steps],
                  bwd_steps=[Step(int(m * MiB), list(f), list(c)) for m, f, c in bwd_steps])


def resolved(o: Option, names: dict[str, list[str]]) -> Option:
    """`o` with the placeholder names of its needs and steps replaced."""
    def sub(xs):
        return [d for x in xs for d in names.get(x, [x])]

    return Option(o.name, o.fwd_time, o.fwd_overhead, o.bwd_time, o.bwd_overhead, o.phantom,
                  sub(o.needs), fwd_steps=[Step(st.overhead, sub(st.frees), sub(st.creates))
                                           for st in o.fwd_steps],
                  bwd_steps=[Step(st.overhead, sub(st.frees), sub(st.creates)) for st in o.bwd_steps])


def chain(name: str, act_mib: list[float], options: list[list[Option]], loss_time: float = 1,
          grad_mib: list[float] | None = None) -> Graph:
    """x -> L1 -> h1 -> ... -> Ln -> hn -> loss. act_mib[i] is the size of h_i (act_mib[0]: x);
    an option's needs may name "in" and "out": the layer's input and output."""
    n = len(options)
    grad_mib = grad_mib or act_mib
    g = Graph(name)
    acts = ["x"] + [f"h{i}" for i in range(1, n + 1)]
    g.data.append(DataNode("x", int(act_mib[0] * MiB), "input"))
    g.data += [DataNode(a, int(act_mib[i] * MiB)) for i, a in enumerate(acts) if i]
    g.data.append(DataNode("loss", MiB))
    g.data += [DataNode(f"{a}.grad", int(grad_mib[i] * MiB)) for i, a in reversed(list(enumerate(acts))) if i]
    g.data.append(DataNode("x.grad", int(grad_mib[0] * MiB), "output"))
    for i in range(1, n + 1):
        inp, out = acts[i - 1], acts[i]
        names = {"in": [inp], "out": [out], "gin": [f"{out}.grad"], "gout": [f"{inp}.grad"]}
        opts = [resolved(o, names) for o in options[i - 1]]
        g.layers.append(Layer(f"L{i}", [inp], [out], [f"{out}.grad"], [f"{inp}.grad"], opts))
    g.loss = Loss([acts[-1]], ["loss", f"{acts[-1]}.grad"], loss_time)
    return g


def skip3(name: str, options: list[list[Option]]) -> Graph:
    """A: x -> a, B: a -> b, C: (a, b) -> c, loss(c): a.grad has two contributions (B.bwd and
    C.bwd). needs "in" names every input of the layer, "out" its output."""
    g = Graph(name)
    sizes = {"x": 2, "a": 2, "b": 1, "c": 2}
    g.data.append(DataNode("x", 2 * MiB, "input"))
    g.data += [DataNode(d, sizes[d] * MiB) for d in ("a", "b", "c")]
    g.data.append(DataNode("loss", MiB))
    g.data += [DataNode(f"{d}.grad", sizes[d] * MiB) for d in ("c", "b", "a")]
    g.data.append(DataNode("x.grad", 2 * MiB, "output"))
    spec = [("A", ["x"], "a"), ("B", ["a"], "b"), ("C", ["a", "b"], "c")]
    for (lname, ins, out), opts in zip(spec, options):
        names = {"in": ins, "out": [out], "gin": [f"{out}.grad"], "gout": [f"{i}.grad" for i in ins]}
        g.layers.append(Layer(lname, ins, [out], [f"{out}.grad"], [f"{i}.grad" for i in ins],
                              [resolved(o, names) for o in opts]))
    g.loss = Loss(["c"], ["loss", "c.grad"], 1)
    return g


def random_dag(name: str, seed: int, layers: int = 3) -> Graph:
    """A random DAG of `layers` layers: layer i reads the previous activation and, at random,
    earlier ones (x included), so gradients have several creators; 1-2 random options per layer
    (keep everything, or recompute from the inputs, or keep a small phantom and need the
    output), random sizes, times and overheads. Deterministic in `seed`."""
    import random

    rng = random.Random(seed)
    acts = ["x"] + [f"h{i}" for i in range(1, layers + 1)]
    size = {a: rng.randint(1, 3) * MiB for a in acts}
    g = Graph(name)
    g.data.append(DataNode("x", size["x"], "input"))
    g.data += [DataNode(a, size[a]) for a in acts[1:]]
    g.data.append(DataNode("loss", MiB))
    g.data += [DataNode(f"{a}.grad", size[a]) for a in reversed(acts[1:])]
    g.data.append(DataNode("x.grad", size["x"], "output"))
    for i in range(1, layers + 1):
        ins = [a for a in acts[:i - 1] if rng.random() < 0.6] + [acts[i - 1]]
        out = acts[i]
        names = {"in": ins, "out": [out], "gin": [f"{out}.grad"], "gout": [f"{a}.grad" for a in ins]}
        fwd = rng.randint(1, 3)
        kinds = rng.sample(["keep", "recomp", "sel"], rng.randint(1, 2))
        opts = []
        for kind in kinds:
            over = dict(fwd_over_mib=rng.choice([0, 0, 1]), bwd_over_mib=rng.choice([0, 1, 2]))
            if kind == "keep":
                opts.append(opt("keep", fwd, fwd + rng.randint(0, 2), rng.randint(1, 4), **over))
            elif kind == "recomp":
                opts.append(opt("recomp", fwd, 2 * fwd + rng.randint(0, 2), 0, ["in"], **over))
            else:
                opts.append(opt("sel", fwd, fwd + rng.randint(1, 3), rng.randint(0, 2), ["out"], **over))
        g.layers.append(Layer(f"L{i}", ins, [out], [f"{out}.grad"], [f"{a}.grad" for a in ins],
                              [resolved(o, names) for o in opts]))
    g.loss = Loss([acts[-1]], ["loss", f"{acts[-1]}.grad"], 1)
    return g


def long_plan_on_a_deep_chain(n: int = 200, ops: int = 100_000) -> tuple[Plan, Graph]:
    """A plan of about `ops` ops on x -> b1 -> ... -> bn -> loss (each layer with a stored
    option `ag` and a recomputing one `rc`): the no-recomputation plan after pairs of
    (b1.fwd without autograd, delete h1), for the simulator's speed on long plans."""
    lines = ["use rockmate", "graph deep {", "  data x 1MiB input"]
    lines += [f"  data h{i} {1 + i % 3}MiB" for i in range(1, n + 1)]
    lines += ["  data lv 4B"] + [f"  data h{i}.grad 1MiB" for i in range(n, 0, -1)]
    lines += ["  data x.grad 1MiB output"]
    for i in range(1, n + 1):
        src = "x" if i == 1 else f"h{i - 1}"
        lines.append(f"  layer b{i} ({src}) -> (h{i}) {{ grad (h{i}.grad) -> ({src}.grad)\n"
                     f"    option ag fwd 1ms overhead 1MiB bwd 2ms phantom 3MiB\n"
                     f"    option rc fwd 1ms bwd 3ms phantom 0 needs ({src}) }}")
    lines += [f"  loss (h{n}) -> (lv, h{n}.grad) time 1ms", "}"]
    g = load(text="\n".join(lines) + "\n").graph
    assert g is not None  # the text is a graph
    base = no_recompute_plan(g).ops
    pad = [Op("compute", node="b1.fwd", option="fast_forward"), Op("delete", data="h1")]
    return Plan(graph="deep", ops=pad * ((ops - len(base)) // 2) + base), g
