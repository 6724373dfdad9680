"""Import the Checkmate / Moccasin computation graphs (networkx node-link JSON) as a `Graph`.

Two attribute conventions exist (see ``shared/graphs/README.md``):

* Checkmate (graphs extracted from Keras models): nodes carry ``id`` (the key links refer to),
  ``name``, ``backward`` (bool), ``cost_cpu`` (time) and ``cost_ram`` (bytes of the output);
  links use ``source`` / ``target``.
* Moccasin's ``random_layered`` generator: the node key is ``name`` (an int id), nodes carry
  ``out_cost`` (output bytes), ``duration`` (time) and ``param_cost`` (not used: the
  Checkmate view has no parameters); links use ``"0"`` (source) and ``"1"`` (target);
  ``graph.order`` may give a topological order.

Node order: ``graph.order`` when present (it must be a topological order of all nodes), else
the ids in increasing order when that is topological, else a topological sort that breaks
ties by id. Times are in the file's abstract units (``time_unit == ""``).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import networkx as nx

from ..language.errors import DataError, Loc
from ..language.paths import read_text
from .elements import Node
from .graph import Graph

# convention name -> (node key, size attribute, time attribute, backward attribute or None)
_CONVENTIONS = {
    "checkmate": ("id", "cost_ram", "cost_cpu", "backward"),
    "random_layered": ("name", "out_cost", "duration", None),
}


def is_node_link_file(path: str | Path) -> bool:
    """Whether `schedlang.load` and the CLI read `path` as node-link JSON graph data (a
    ``.json`` file) rather than as a `.sched` file."""
    return Path(path).suffix.lower() == ".json"


def load_checkmate_nx(path: str | Path) -> Graph:
    """Read a networkx node-link JSON graph; problems raise `DataError` located at `path`."""
    source = str(path)
    try:
        text = read_text(path, what="graph file")
    except DataError as exc:
        raise DataError(f"cannot read graph file: {exc.message}", exc.loc) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"invalid JSON: {exc.msg}", Loc(source, exc.lineno, exc.colno)) from None
    return graph_from_node_link(data, name=Path(path).stem, source=source)


def graph_from_node_link(data: Any, name: str, source: str = "<graph>") -> Graph:
    """Build a `Graph` from decoded node-link data (the work of `load_checkmate_nx`)."""
    loc = Loc(source)

    def fail(message: str) -> DataError:
        return DataError(message, loc)

    if not isinstance(data, dict):
        raise fail("expected a networkx node-link JSON object")
    if data.get("directed") is False:
        raise fail("the graph is undirected ('directed': false); a computation graph is directed")
    raw_nodes = data.get("nodes")
    if not isinstance(raw_nodes, list):
        raise fail("missing 'nodes' list (expected networkx node-link JSON)")
    links_key = "links" if "links" in data else "edges" if "edges" in data else None
    if links_key is None:
        raise fail("missing 'links' list (expected networkx node-link JSON)")
    raw_links = data[links_key]
    if not isinstance(raw_links, list):
        raise fail(f"'{links_key}' must be a list")
    if not raw_nodes:
        raise fail("the graph has no nodes")
    raw_graph = data.get("graph")
    graph_attrs: dict = raw_graph if isinstance(raw_graph, dict) else {}

    convention = _detect(raw_nodes, fail)
    key, size_attr, time_attr, backward_attr = _CONVENTIONS[convention]

    # --- nodes ---------------------------------------------------------------------------
    ids: list[Any] = []
    seen: set[Any] = set()
    for pos, raw in enumerate(raw_nodes):
        if not isinstance(raw, dict):
            raise fail(f"nodes[{pos}] is not an object")
        if key not in raw:
            raise fail(f"nodes[{pos}]: missing node key '{key}'")
        nid = raw[key]
        if isinstance(nid, bool) or not isinstance(nid, (int, str)):
            raise fail(f"nodes[{pos}]: node key '{key}' must be an integer or a string, "
                       f"not {nid!r}")
        if nid in seen:
            raise fail(f"node {nid!r}: the id is used by two nodes")
        seen.add(nid)
        ids.append(nid)
    by_id = {nid: raw for nid, raw in zip(ids, raw_nodes)}

    sizes: dict[Any, int] = {}
    times: dict[Any, float] = {}
    kinds: dict[Any, str] = {}
    for nid, raw in by_id.items():
        sizes[nid] = _size(raw, nid, size_attr, fail)
        times[nid] = _time(raw, nid, time_attr, fail)
        kind = "forward"
        if backward_attr is not None:
            if backward_attr not in raw:
                raise fail(f"node {nid!r}: missing attribute '{backward_attr}'")
            flag = raw[backward_attr]
            if not isinstance(flag, (bool, int)) or flag not in (0, 1):
                raise fail(f"node {nid!r}: attribute '{backward_attr}' must be true or false, "
                           f"not {flag!r}")
            kind = "backward" if flag else "forward"
        kinds[nid] = kind

    # --- links ---------------------------------------------------------------------------
    for pos, raw in enumerate(raw_links):
        if not isinstance(raw, dict):
            raise fail(f"{links_key}[{pos}] is not an object")
        ends = _link_ends(raw)
        if ends is None:
            raise fail(f"{links_key}[{pos}]: a link needs 'source' and 'target' "
                       "(or '0' and '1')")
        for role, end in zip(("source", "target"), ends):
            if isinstance(end, bool) or not isinstance(end, (int, str)) or end not in by_id:
                raise fail(f"{links_key}[{pos}]: {role} {end!r} is not a node")

    # networkx builds the graph; every id and endpoint is known to be valid by now
    src_key, dst_key = ("0", "1") if raw_links and "source" not in raw_links[0] else (
        "source", "target")
    uniform = all(src_key in lk and dst_key in lk for lk in raw_links)
    if uniform:
        g = nx.node_link_graph({"directed": True, "multigraph": False, "graph": {},
                                "nodes": raw_nodes, links_key: raw_links},
                               directed=True, multigraph=False, source=src_key,
                               target=dst_key, name=key, edges=links_key)
    else:  # links mixing both conventions
        g = nx.DiGraph()
        g.add_nodes_from(ids)
        g.add_edges_from(_link_ends(lk) for lk in raw_links)

    try:
        cycle = nx.find_cycle(g)
    except nx.NetworkXNoCycle:
        cycle = None
    if cycle:
        path = " -> ".join(repr(u) for u, _ in cycle) + f" -> {cycle[0][0]!r}"
        raise fail(f"node {cycle[0][0]!r} is on a cycle ({path}); a computation graph "
                   "must be acyclic")

    order = _order(g, ids, graph_attrs, fail)
    names = _names(by_id, ids)

    nodes = [Node(name=names[nid], time=times[nid], size=sizes[nid], kind=kinds[nid])
             for nid in order]
    position = {nid: i for i, nid in enumerate(order)}
    edges = sorted(set(g.edges()), key=lambda e: (position[e[0]], position[e[1]]))
    title = graph_attrs.get("name")
    return Graph(
        name=name,
        title=title if isinstance(title, str) else "",
        nodes=nodes,
        edges=[(names[u], names[v]) for u, v in edges],
        time_unit="",
        loc=loc,
    )


def _detect(raw_nodes: list, fail) -> str:
    first = raw_nodes[0] if isinstance(raw_nodes[0], dict) else {}
    for convention, (_, size_attr, time_attr, _) in _CONVENTIONS.items():
        if size_attr in first or time_attr in first:
            return convention
    raise fail("cannot tell the attribute convention: the first node has none of "
               "'cost_ram'/'cost_cpu' (Checkmate) or 'out_cost'/'duration' (random_layered)")


def _link_ends(raw: dict) -> tuple[Any, Any] | None:
    if "source" in raw and "target" in raw:
        return raw["source"], raw["target"]
    if "0" in raw and "1" in raw:
        return raw["0"], raw["1"]
    return None


def _number(raw: dict, nid: Any, attr: str, what: str, fail) -> float | int:
    if attr not in raw:
        raise fail(f"node {nid!r}: missing attribute '{attr}' ({what})")
    value = raw[attr]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise fail(f"node {nid!r}: attribute '{attr}' ({what}) must be a number, not {value!r}")
    if not math.isfinite(value):
        raise fail(f"node {nid!r}: attribute '{attr}' ({what}) must be finite, not {value!r}")
    if value < 0:
        raise fail(f"node {nid!r}: attribute '{attr}' ({what}) must not be negative ({value!r})")
    return value


def _size(raw: dict, nid: Any, attr: str, fail) -> int:
    value = _number(raw, nid, attr, "output bytes", fail)
    # a fractional byte count rounds up: memory is never under-estimated
    return int(value) if isinstance(value, int) else int(math.ceil(value))


def _time(raw: dict, nid: Any, attr: str, fail) -> float:
    return float(_number(raw, nid, attr, "time", fail))


def _id_key(nid: Any) -> tuple:
    # ints before strings, each in natural order
    return (0, nid, "") if isinstance(nid, int) else (1, 0, nid)


def _order(g: nx.DiGraph, ids: list, graph_attrs: dict, fail) -> list:
    given = graph_attrs.get("order")
    if given is not None:
        if not isinstance(given, list):
            raise fail("graph.order must be a list of node ids")
        known = set(ids)
        unknown = [x for x in given if isinstance(x, bool) or not isinstance(x, (int, str))
                   or x not in known]
        if unknown:
            raise fail(f"graph.order names {unknown[0]!r}, which is not a node")
        if len(set(given)) != len(given):
            raise fail("graph.order lists a node twice")
        if len(given) != len(ids):
            missing = [x for x in ids if x not in set(given)]
            raise fail(f"graph.order leaves out node {missing[0]!r}")
        bad = _backward_edge(g, given)
        if bad:
            raise fail(f"graph.order is not a topological order: edge {bad[0]!r} -> {bad[1]!r} "
                       "goes backwards")
        return list(given)
    by_id = sorted(ids, key=_id_key)
    if _backward_edge(g, by_id) is None:
        return by_id
    return list(nx.lexicographical_topological_sort(g, key=_id_key))


def _backward_edge(g: nx.DiGraph, order: list) -> tuple | None:
    position = {nid: i for i, nid in enumerate(order)}
    for u, v in g.edges():
        if position[u] >= position[v]:
            return u, v
    return None


def _names(by_id: dict, ids: list) -> dict[Any, str]:
    """The node's string `name` when unique, else ``n<id>`` (made unique when it collides)."""
    counts: dict[str, int] = {}
    for raw in by_id.values():
        value = raw.get("name")
        if isinstance(value, str) and value:
            counts[value] = counts.get(value, 0) + 1
    names: dict[Any, str] = {}
    taken: set[str] = set()
    fallback: list[Any] = []
    for nid in ids:
        value = by_id[nid].get("name")
        if isinstance(value, str) and value and counts[value] == 1:
            names[nid] = value
            taken.add(value)
        else:
            fallback.append(nid)
    for nid in fallback:
        candidate = f"n{nid}"
        suffix = 1
        while candidate in taken:
            candidate = f"n{nid}_{suffix}"
            suffix += 1
        names[nid] = candidate
        taken.add(candidate)
    return names
