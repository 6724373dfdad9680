"""Tiny Checkmate-view graphs for the tests (chains, a diamond, a skip connection, random DAGs)
and the problem of `models/checkmate.sched` on one of them."""
from __future__ import annotations

import random

import schedlang
from schedlang.graphs.elements import Node
from schedlang.graphs.graph import Graph
from schedlang.graphs.writer import write_graph


def graph_of(name: str, nodes: list[tuple], edges: list[tuple]) -> Graph:
    return Graph(name, nodes=[Node(n, t, s) for n, t, s in nodes], edges=edges)


def tiny_graphs() -> list[Graph]:
    """Chains, a diamond, a skip connection and random DAGs, all with <= 6 nodes."""
    M = 2**20
    graphs = [
        graph_of("chain4", [("a", 1, 4 * M), ("b", 2, 4 * M), ("gb", 1, 4 * M), ("ga", 1, 4 * M)],
               [("a", "b"), ("b", "gb"), ("a", "ga"), ("gb", "ga")]),
        graph_of("diamond", [("a", 3, 2 * M), ("b", 1, 6 * M), ("c", 2, 4 * M), ("d", 1, 2 * M), ("e", 1, 2 * M)],
               [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d"), ("d", "e"), ("a", "e")]),
        graph_of("train6", [("f1", 2, 8 * M), ("f2", 3, 8 * M), ("f3", 1, 8 * M), ("g3", 1, 8 * M),
                          ("g2", 1, 8 * M), ("g1", 1, 8 * M)],
               [("f1", "f2"), ("f2", "f3"), ("f3", "g3"), ("f2", "g3"), ("g3", "g2"), ("f1", "g2"),
                ("g2", "g1")]),
    ]
    rng = random.Random(7)
    for k in range(3):
        n = 6
        names = [f"n{i}" for i in range(n)]
        nodes = [(x, rng.randint(1, 5), rng.randint(1, 6) * M) for x in names]
        edges = [(names[i], names[i + 1]) for i in range(n - 1)]
        edges += [(names[i], names[j]) for i in range(n) for j in range(i + 2, n) if rng.random() < 0.3]
        graphs.append(graph_of(f"random{k}", nodes, edges))
    return graphs


def checkmate_problem(graph: Graph, budget: int):
    graph.budgets = {"peak": budget}
    return schedlang.load(text="use checkmate\n" + write_graph(graph))
