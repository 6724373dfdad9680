"""`Graph`'s one vocabulary test and its cached, validated indexes (schedlang/graphs/graph.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from schedlang.graphs.elements import DataNode, Layer, Loss, Node, Option
from schedlang.graphs.graph import Graph
from schedlang.graphs.writer import write_graph
from schedlang.language.errors import DataError
from schedlang.language.program import load_program
from schedlang.plans.plan import Op, Plan
from schedlang.plans.planners import graph_view
from schedlang.plans.planners.no_recompute import no_recompute_peak, no_recompute_plan
from schedlang.plans.planners.shift import dag_from_graph
from schedlang.plans.simulate import simulate

ROOT = Path(__file__).resolve().parents[2]


def chain() -> Graph:
    return Graph(name="chain", nodes=[Node("a", 1.0, 10), Node("b", 2.0, 20), Node("c", 3.0, 5)],
                 edges=[("a", "b"), ("b", "c")])


def one_layer() -> Graph:
    opt = Option("keep", 1.0, 0, 2.0, 0, 4)
    return Graph(name="one", data=[DataNode("x", 8, "input"), DataNode("h", 8), DataNode("loss", 1),
                                   DataNode("h.grad", 8), DataNode("x.grad", 8, "output")],
                 layers=[Layer("l", ["x"], ["h"], ["h.grad"], ["x.grad"], [opt])],
                 loss=Loss(["h"], ["loss", "h.grad"], 1.0))


@pytest.mark.parametrize("graph,layered", [
    (chain(), False),
    (one_layer(), True),
    (Graph(name="data_only", data=[DataNode("x", 1)]), True),
    (Graph(name="loss_only", loss=Loss([], [], 1.0)), True),
    (Graph(name="empty"), False),
])
def test_one_vocabulary_test_for_every_consumer(graph, layered):
    assert graph.is_layered is layered
    assert graph_view(graph) == ("layered" if layered else "checkmate")


def test_the_checkmate_index():
    g = chain()
    g.edges.append(("a", "b"))  # a repeated edge counts once
    idx = g.checkmate_index(topological=True)
    assert idx.names == ("a", "b", "c") and idx.index == {"a": 0, "b": 1, "c": 2}
    assert idx.preds == ((), (0,), (1,)) and idx.succs == ((1,), (2,), ())
    assert idx.edges == ((0, 1), (1, 2)) and idx.size == (10, 20, 5)


def test_an_unknown_node_gets_one_message_everywhere():
    g = chain()
    g.edges.append(("b", "zz"))
    message = "graph 'chain': edge b -> zz names an unknown node 'zz'"
    for use in (g.checkmate_index, lambda: write_graph(g), lambda: dag_from_graph(g),
                lambda: no_recompute_plan(g)):
        with pytest.raises(DataError) as err:
            use()
        assert err.value.message == message
    r = simulate(Plan(graph="chain", ops=[]), g)
    assert r.errors == [f"cannot simulate this graph: {message}"]


def test_a_backward_edge_is_rejected_only_where_order_matters():
    g = chain()
    g.edges.append(("c", "a"))
    assert g.checkmate_index().backward_edge == ("c", "a")
    with pytest.raises(DataError, match=r"nodes are not in topological order \(edge c -> a\)"):
        g.checkmate_index(topological=True)


def test_nodes_and_layered_data_do_not_mix():
    g = chain()
    g.data.append(DataNode("x", 1))
    for use in (g.checkmate_index, g.hgraph, lambda: write_graph(g)):
        with pytest.raises(DataError, match="both compute nodes"):
            use()


def test_the_indexes_follow_edits_of_the_graph():
    g = chain()
    assert no_recompute_peak(g) == 30
    assert g.checkmate_index() is g.checkmate_index()  # cached
    g.nodes[1].size = 40  # edited in place: the index is rebuilt
    assert no_recompute_peak(g) == 50
    g.edges.append(("a", "c"))
    assert g.checkmate_index().preds[2] == (0, 1)

    lay = one_layer()
    plan = no_recompute_plan(lay)
    assert lay.layered_index() is lay.layered_index() and lay.hgraph() is lay.hgraph()
    before = simulate(plan, lay).peak_bytes
    lay.layers[0].options[0].phantom = 104
    assert simulate(plan, lay).peak_bytes == before + 100
    lay.data[1].pinned = True
    r = simulate(Plan(graph="one", ops=plan.ops[:1] + [Op("offload", data="h")]), lay)
    assert "pinned" in r.errors[0]


def test_the_shipped_layered_example_indexes_its_hgraph():
    g = load_program([ROOT / "examples" / "tiny_transformer.sched"]).graph
    h, idx = g.hgraph(), g.layered_index()
    assert idx.names == [k.name for k in h.compute] and idx.data == list(h.data)


@pytest.mark.parametrize("name", ["decoder.block.0", "model", "node"])
def test_a_written_graph_reads_back_whatever_its_name(tmp_path, name):
    """A graph named as a module path (an op graph of `transformers`' decoder.block.0, as
    the hook front end names a block's) or as a keyword is written quoted and read back."""
    import schedlang

    g = chain()
    g.name = name
    path = tmp_path / "g.sched"
    path.write_text(write_graph(g))
    back = schedlang.load(path).graph
    assert back.name == name
    assert [(n.name, n.size) for n in back.nodes] == [(n.name, n.size) for n in g.nodes]
