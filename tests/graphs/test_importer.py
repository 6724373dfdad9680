"""networkx node-link JSON -> Graph, and Graph -> .sched graph data text."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from schedlang.graphs.checkmate_nx import load_checkmate_nx
from schedlang.graphs.elements import Node
from schedlang.graphs.graph import Graph
from schedlang.graphs.writer import format_time, quote_name, write_graph
from schedlang.language.errors import DataError

from ..paths import GRAPHS, needs_graphs

EXPECTED = {  # file stem -> (nodes, edges, backward nodes)
    "vgg16_train": (45, 87, 23),
    "vgg19_train": (51, 99, 26),
    "mobilenet_train": (185, 367, 93),
    "resnet50_train": (353, 751, 177),
    "vgg16_test": (22, 21, 0),
    "random_layered_n100": (100, 236, 0),
    "random_layered_n1000": (1000, 5875, 0),
}


@needs_graphs
def test_all_shared_graphs_are_covered():
    assert {p.stem for p in GRAPHS.glob("*.json")} == set(EXPECTED)


@needs_graphs
@pytest.mark.parametrize("stem", sorted(EXPECTED))
def test_shared_graph_imports(stem):
    g = load_checkmate_nx(GRAPHS / f"{stem}.json")
    n_nodes, n_edges, n_backward = EXPECTED[stem]
    assert g.name == stem
    assert len(g.nodes) == n_nodes
    assert len(g.edges) == n_edges
    assert sum(n.kind == "backward" for n in g.nodes) == n_backward
    assert g.time_unit == "" and g.budgets == {}
    names = [n.name for n in g.nodes]
    assert len(set(names)) == len(names)
    position = {name: i for i, name in enumerate(names)}
    for u, v in g.edges:
        assert position[u] < position[v], f"edge {u} -> {v} goes backwards"
    for node in g.nodes:
        assert isinstance(node.size, int) and node.size >= 0
        assert isinstance(node.time, float) and node.time >= 0
        assert node.kind in ("forward", "backward")


@needs_graphs
def test_checkmate_convention_details():
    g = load_checkmate_nx(GRAPHS / "vgg16_train.json")
    assert g.title == "VGG16 (MLSys)_256_(224, 224, 3)_train"
    first = g.nodes[0]
    assert (first.name, first.time, first.size, first.kind) == (
        "block1_conv1", 385.0, 3288334336, "forward")
    loss = g.node("Loss")
    assert loss.kind == "backward"  # where backward begins is not marked specially
    assert g.nodes[-1].name == "block1_conv1_backward"
    assert ("block1_conv1", "block1_conv1_backward") in g.edges
    assert g.loc is not None and g.loc.path.endswith("vgg16_train.json")


@needs_graphs
def test_random_layered_convention_details():
    path = GRAPHS / "random_layered_n100.json"
    raw = json.loads(path.read_text())
    g = load_checkmate_nx(path)
    # graph.order is the node order; the int ids become n<id>
    assert [n.name for n in g.nodes] == [f"n{i}" for i in raw["graph"]["order"]]
    assert g.title == raw["graph"]["name"]
    by_id = {n["name"]: n for n in raw["nodes"]}
    n3 = g.node("n3")
    assert n3.size == by_id[3]["out_cost"] and n3.time == by_id[3]["duration"]
    assert ("n0", "n2") in g.edges
    assert all(n.kind == "forward" for n in g.nodes)


@needs_graphs
@pytest.mark.parametrize("stem", sorted(EXPECTED))
def test_write_graph_is_deterministic(stem):
    path = GRAPHS / f"{stem}.json"
    text = write_graph(load_checkmate_nx(path))
    assert text == write_graph(load_checkmate_nx(path))
    lines = text.splitlines()
    n_nodes, n_edges, _ = EXPECTED[stem]
    assert sum(line.startswith("  node ") for line in lines) == n_nodes
    edge_lines = [line for line in lines if line.startswith("  edge ")]
    assert sum(len(line.split(" -> ")[1].split(", ")) for line in edge_lines) == n_edges
    assert lines[-1] == "}"


@needs_graphs
def test_write_graph_text_of_vgg16():
    g = load_checkmate_nx(GRAPHS / "vgg16_train.json")
    g.budgets["peak"] = 14242598093
    lines = write_graph(g).splitlines()
    assert lines[0].startswith("#")
    assert lines[1] == 'graph vgg16_train "VGG16 (MLSys)_256_(224, 224, 3)_train" {'
    assert lines[2] == "  node block1_conv1 time 385 size 3288334336B"
    assert "  node block1_conv1_backward backward time 390 size 3288334336B" in lines
    assert "  edge block1_conv1 -> block1_conv2, block1_conv1_backward" in lines
    assert lines[-2:] == ["}", "budget peak 14242598093B"]


def test_write_graph_quoting_kinds_units_and_budgets():
    g = Graph(
        name="tiny-net",
        title='say "hi" \\ bye',
        nodes=[Node("odd/name:0", 0.0125, 4), Node("h2.grad", 1.5, 8, "backward"),
               Node("node", 2e-7, 1, "loss"), Node("x", 3.0, 2)],
        edges=[("odd/name:0", "x"), ("odd/name:0", "h2.grad"), ("h2.grad", "node"),
               ("odd/name:0", "x")],
        budgets={"save": 100, "peak": 200},
        time_unit="s",
    )
    assert write_graph(g).splitlines() == [
        "# schedlang graph data: 4 nodes, 3 edges",
        'graph "tiny-net" "say \\"hi\\" \\\\ bye" {',
        '  node "odd/name:0" time 12.5ms size 4B',
        "  node h2.grad backward time 1.5s size 8B",
        '  node "node" loss time 0.2us size 1B',
        "  node x time 3s size 2B",
        '  edge "odd/name:0" -> h2.grad, x',
        '  edge h2.grad -> "node"',
        "}",
        "budget peak 200B",
        "budget save 100B",
    ]


def test_write_graph_abstract_times():
    g = Graph(name="g", nodes=[Node("a", 12.5, 4), Node("b", 3.0, 1), Node("c", 1e-7, 1)])
    lines = write_graph(g).splitlines()
    assert lines[1] == "graph g {"
    assert lines[2:5] == ["  node a time 12.5 size 4B", "  node b time 3 size 1B",
                          "  node c time 0.0000001 size 1B"]


def test_quote_name_and_format_time():
    assert quote_name("block1_conv1") == "block1_conv1"
    assert quote_name("h2.grad") == "h2.grad"
    assert quote_name("1abc") == '"1abc"'
    assert quote_name("a.") == '"a."'
    assert quote_name('a"b\\c') == '"a\\"b\\\\c"'
    assert format_time(0.0019, "s") == "1.9ms"
    assert format_time(385.0, "") == "385"
    assert format_time(250.0, "ms") == "250ms"
    assert format_time(2500.0, "ms") == "2.5s"
    with pytest.raises(DataError):
        quote_name("new\nline")
    with pytest.raises(DataError):
        format_time(1.0, "h")


def test_write_graph_rejects_edges_to_unknown_nodes():
    g = Graph(name="g", nodes=[Node("a", 1, 1)], edges=[("a", "b")])
    with pytest.raises(DataError, match="unknown node 'b'"):
        write_graph(g)


# --- bad inputs ----------------------------------------------------------------------------
def checkmate_doc(nodes, links, **graph):
    return {"directed": True, "multigraph": False, "graph": graph, "nodes": nodes,
            "links": links}


def cm_node(i, name=None, backward=False, cpu=1, ram=8):
    return {"name": name or f"v{i}", "backward": backward, "cost_cpu": cpu, "cost_ram": ram,
            "id": i}


def save(tmp_path, doc, name="bad.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return path


def import_error(path) -> DataError:
    with pytest.raises(DataError) as info:
        load_checkmate_nx(path)
    err = info.value
    assert err.loc.path == str(path)
    return err


def test_cycle_is_rejected_naming_a_node(tmp_path):
    doc = checkmate_doc([cm_node(0), cm_node(1), cm_node(2)],
                        [{"source": 0, "target": 1}, {"source": 1, "target": 2},
                         {"source": 2, "target": 1}])
    err = import_error(save(tmp_path, doc))
    assert "cycle" in err.message
    assert err.message.startswith("node 1 ") or err.message.startswith("node 2 ")


def test_unknown_edge_endpoint(tmp_path):
    doc = checkmate_doc([cm_node(0), cm_node(1)],
                        [{"source": 0, "target": 1}, {"source": 1, "target": 7}])
    err = import_error(save(tmp_path, doc))
    assert err.message == "links[1]: target 7 is not a node"


def test_missing_attribute(tmp_path):
    bad = cm_node(1)
    del bad["cost_ram"]
    doc = checkmate_doc([cm_node(0), bad], [{"source": 0, "target": 1}])
    path = save(tmp_path, doc)
    err = import_error(path)
    assert "node 1: missing attribute 'cost_ram'" in err.message
    assert str(err).startswith(f"{path}: error: node 1")


def test_missing_random_layered_attribute(tmp_path):
    doc = {"directed": True, "graph": {}, "nodes": [
        {"name": 0, "out_cost": 1, "duration": 1},
        {"name": 1, "out_cost": 1}], "links": [{"0": 0, "1": 1}]}
    err = import_error(save(tmp_path, doc))
    assert "node 1: missing attribute 'duration'" in err.message


def test_negative_size_and_time(tmp_path):
    doc = checkmate_doc([cm_node(0, ram=-5)], [])
    assert "must not be negative" in import_error(save(tmp_path, doc)).message
    doc = checkmate_doc([cm_node(0, cpu=-1)], [])
    assert "must not be negative" in import_error(save(tmp_path, doc)).message
    doc = checkmate_doc([cm_node(0, cpu="fast")], [])
    assert "must be a number" in import_error(save(tmp_path, doc)).message


def test_json_syntax_error_is_located(tmp_path):
    path = save(tmp_path, '{"nodes": [\n  {"id": 0,}\n]}')
    err = import_error(path)
    assert (err.loc.line, err.loc.col) == (2, 12)


@pytest.mark.parametrize("doc, expected", [
    ([], "expected a networkx node-link JSON object"),
    ({"links": []}, "missing 'nodes'"),
    ({"nodes": [{"id": 0}], "links": []}, "cannot tell the attribute convention"),
    ({"directed": False, "nodes": [], "links": []}, "undirected"),
])
def test_not_a_graph(tmp_path, doc, expected):
    assert expected in import_error(save(tmp_path, doc)).message


def test_ids_not_in_topological_order_are_sorted_topologically(tmp_path):
    doc = checkmate_doc([cm_node(0, "late"), cm_node(1, "early"), cm_node(2, "mid")],
                        [{"source": 1, "target": 2}, {"source": 2, "target": 0}])
    g = load_checkmate_nx(save(tmp_path, doc, "order.json"))
    assert [n.name for n in g.nodes] == ["early", "mid", "late"]
    assert g.edges == [("early", "mid"), ("mid", "late")]
    assert g.name == "order" and g.title == ""


def test_bad_graph_order(tmp_path):
    nodes = [{"name": i, "out_cost": 1, "duration": 1} for i in range(3)]
    links = [{"0": 0, "1": 1}, {"0": 1, "1": 2}]
    doc = {"directed": True, "graph": {"order": [0, 2, 1]}, "nodes": nodes, "links": links}
    err = import_error(save(tmp_path, doc))
    assert "graph.order is not a topological order: edge 1 -> 2" in err.message
    doc["graph"]["order"] = [0, 1]
    assert "leaves out node 2" in import_error(save(tmp_path, doc)).message


def test_duplicate_or_missing_names_fall_back_to_ids(tmp_path):
    doc = checkmate_doc([cm_node(0, "x"), cm_node(1, "x"), cm_node(2, "n0")],
                        [{"source": 0, "target": 1}])
    g = load_checkmate_nx(save(tmp_path, doc))
    # 'x' is not unique -> n0, n1; but 'n0' is a real name, so id 0 becomes n0_1
    assert [n.name for n in g.nodes] == ["n0_1", "n1", "n0"]


def test_fractional_sizes_round_up_and_backward_flags(tmp_path):
    doc = checkmate_doc([cm_node(0, ram=10.2, cpu=1.5), cm_node(1, backward=True)],
                        [{"source": 0, "target": 1}])
    g = load_checkmate_nx(save(tmp_path, doc))
    assert g.nodes[0].size == 11 and g.nodes[0].time == 1.5
    assert [n.kind for n in g.nodes] == ["forward", "backward"]
