"""Random layered graphs in the family of `shared/graphs/random_layered_n100.json`.

    python bench/random_layered.py 250 500 [--seed 0] [--out DIR]   # writes random_layered_n<N>.json

The shared n100 graph (published with Moccasin, Bartan et al., ICML 2023) is a forward-only DAG:
a source node (id 0, duration 0), a sink node (id 1, duration 0), and n - 2 nodes arranged in
levels of 1 to 9 nodes (21 levels including source and sink; mean width about 5); 86% of the
edges join consecutive levels, the rest skip 2 to 17 levels; output sizes (`out_cost`) are
multiples of 10 in [80, 6200], durations integers in [0, 1000], `param_cost` 0. This module
generates graphs with the same shape at any size, from a seed (the generator is ours, written
from those statistics, not Moccasin's code):

* levels: widths drawn uniformly from 1 .. 2*w - 1 with mean width w = round(5.2 * sqrt(n/100))
  (so n100 gets ~5, n250 ~8, n500 ~12), until n - 2 nodes are placed (the last level takes the
  remainder); ids 2, 3, ... level by level;
* consecutive levels: every node gets one predecessor in the previous level and every node one
  successor in the next (both uniform), then each other pair is joined with probability
  `edge_density` (0.2); the source feeds every node of the first level and every node of the
  last level feeds the sink;
* skip connections: `skip_density * n` (0.14 n) extra edges from a uniform node to a uniform
  node 2 to `max_skip` (17) levels further down;
* `out_cost`: uniform multiples of 10 in [80, 6200] (source and sink too); `duration`: uniform
  integers in [1, 1000] (source and sink: 0); `param_cost`: 0;
* `graph.order`: a random topological order (Kahn's algorithm, a uniform pick among the ready
  nodes), as in the shared file; the importer (`schedlang.graphs.checkmate_nx`) uses it as
  the node order, and budgets in percent are fractions of that order's no-recomputation peak.

The output is networkx node-link JSON with edges keyed "0"/"1", like the shared file, so
`schedlang import FILE --format checkmate-nx` and `load_checkmate_nx` read it unchanged.
"""
from __future__ import annotations

import argparse
import json
import math
import random
from pathlib import Path


def generate(n: int, seed: int = 0, edge_density: float = 0.2, skip_density: float = 0.14,
             max_skip: int = 17) -> dict:
    """A node-link dict of n nodes (n >= 3)."""
    if n < 3:
        raise ValueError("a random layered graph needs at least 3 nodes")
    rng = random.Random(seed)
    width = max(1, round(5.2 * math.sqrt(n / 100)))
    levels: list[list[int]] = [[0]]
    nxt = 2
    while nxt < n:
        k = min(rng.randint(1, 2 * width - 1), n - nxt)
        levels.append(list(range(nxt, nxt + k)))
        nxt += k
    levels.append([1])
    level_of = {v: i for i, lv in enumerate(levels) for v in lv}
    edges: set[tuple[int, int]] = set()
    for a, b in zip(levels, levels[1:]):
        if a == [0] or b == [1]:
            edges.update((u, v) for u in a for v in b)
            continue
        for v in b:
            edges.add((rng.choice(a), v))
        for u in a:
            edges.add((u, rng.choice(b)))
        for u in a:
            for v in b:
                if rng.random() < edge_density:
                    edges.add((u, v))
    middle = [v for lv in levels[1:-1] for v in lv]
    for _ in range(round(skip_density * n)):
        u = rng.choice(middle)
        far = [v for v in middle if 2 <= level_of[v] - level_of[u] <= max_skip]
        if far:
            edges.add((u, rng.choice(far)))
    nodes = []
    for v in range(n):
        end = v in (0, 1)
        nodes.append({"out_cost": 10 * rng.randint(8, 620), "param_cost": 0,
                      "duration": 0 if end else rng.randint(1, 1000), "name": v})
    order = _random_topological_order(n, edges, rng)
    pos = {str(v): [j - len(lv) // 2, -i] for i, lv in enumerate(levels) for j, v in enumerate(lv)}
    return {"directed": True, "multigraph": False,
            "graph": {"name": f"random_layered_n{n}_seed{seed}", "pos": pos, "source_node": 0,
                      "target_node": 1, "node_output_cost_tag": "out_cost",
                      "node_param_cost_tag": "param_cost", "node_duration_tag": "duration",
                      "order": order},
            "nodes": nodes,
            "links": [{"0": u, "1": v} for u, v in sorted(edges)]}


def _random_topological_order(n: int, edges, rng: random.Random) -> list[int]:
    succs: dict[int, list[int]] = {v: [] for v in range(n)}
    indeg = dict.fromkeys(range(n), 0)
    for u, v in sorted(edges):
        succs[u].append(v)
        indeg[v] += 1
    ready = [v for v in range(n) if indeg[v] == 0]
    order = []
    while ready:
        v = ready.pop(rng.randrange(len(ready)))
        order.append(v)
        for w in succs[v]:
            indeg[w] -= 1
            if indeg[w] == 0:
                ready.append(w)
    assert len(order) == n, "the generated graph has a cycle"
    return order


def write(n: int, directory: str | Path, seed: int = 0) -> Path:
    path = Path(directory) / f"random_layered_n{n}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(generate(n, seed)))
    return path


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sizes", nargs="+", type=int)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=".")
    args = ap.parse_args(argv)
    for n in args.sizes:
        print(write(n, args.out, args.seed))


if __name__ == "__main__":
    main()
