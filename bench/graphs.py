"""Graphs for the benchmarks: synthetic training chains and the shared Checkmate/Moccasin graphs.

* ``chain_graph(n)`` -- Checkmate's "linear training graph": forward f_0..f_{n-1}, then backward
  b_{n-1}..b_0, where f_i -> f_{i+1}, b_i uses f_i and b_{i+1} (b_{n-1} uses f_{n-1} only).
  2n nodes, 3n - 2 edges, deterministic times and sizes.
* ``load_shared(name)`` -- ``/work/shared/graphs/<name>.json`` as a ``schedlang.graphs.graph.Graph``,
  through ``schedlang.graphs.checkmate_nx.load_checkmate_nx`` when it exists, otherwise
  through the TEMPORARY local loader below.
* ``no_recompute_peak(graph)`` -- ``schedlang.plans.planners.no_recompute.no_recompute_peak`` when it exists,
  otherwise a local computation (same definition).
* ``write_sched(graph, directory)`` -- a ``.sched`` file via ``schedlang.graphs.writer.write_graph``.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from schedlang.graphs.elements import Node
from schedlang.graphs.graph import Graph

SHARED_GRAPHS = Path(os.environ.get("SCHEDLANG_GRAPHS", "/work/shared/graphs"))
MIB = 2**20


def chain_graph(n: int, fwd_time: float = 1.0, bwd_time: float = 2.0, size: int = MIB) -> Graph:
    """Linear training graph with n forward and n backward nodes, in topological order
    f_0..f_{n-1}, b_{n-1}..b_0. Every output is `size` bytes (1 MiB); forward nodes take
    `fwd_time`, backward nodes `bwd_time` (backward ~ 2x forward, as usual)."""
    if n < 1:
        raise ValueError("chain_graph needs n >= 1")
    nodes = [Node(name=f"f{i}", time=fwd_time, size=size, kind="forward") for i in range(n)]
    nodes += [Node(name=f"b{i}", time=bwd_time, size=size, kind="backward")
              for i in reversed(range(n))]
    edges = [(f"f{i}", f"f{i + 1}") for i in range(n - 1)]
    for i in reversed(range(n)):
        edges.append((f"f{i}", f"b{i}"))
        if i + 1 < n:
            edges.append((f"b{i + 1}", f"b{i}"))
    return Graph(name=f"chain{n}", title=f"linear training chain, {n} forward + {n} backward",
                 nodes=nodes, edges=edges)


# --- shared graph files ----------------------------------------------------------------------
def load_shared(name_or_path: str | os.PathLike) -> Graph:
    """Load a Checkmate-convention networkx JSON (e.g. "vgg16_train") as a Graph."""
    path = Path(name_or_path)
    if not path.suffix:
        path = SHARED_GRAPHS / f"{name_or_path}.json"
    try:
        from schedlang.graphs.checkmate_nx import load_checkmate_nx
    except ImportError:
        return _temporary_load_checkmate_nx(path)
    return load_checkmate_nx(path)


def _temporary_load_checkmate_nx(path: Path) -> Graph:
    """TEMPORARY stand-in for schedlang.graphs.checkmate_nx.load_checkmate_nx, used only
    while the real importer does not exist. Delete once it lands.

    Keras/Checkmate convention: nodes carry name, backward, cost_cpu (time), cost_ram (output
    bytes), id; links carry source/target ids. Node order: the file's order when it is
    topological (true for all shared *_train/_test files), else a topological sort that breaks
    ties by file position."""
    data = json.loads(Path(path).read_text())
    raw = data["nodes"]
    links = data.get("links", data.get("edges"))
    by_id = {nd["id"]: nd for nd in raw}
    pos = {nd["id"]: p for p, nd in enumerate(raw)}
    pairs = [(lk["source"], lk["target"]) for lk in links]
    if any(pos[u] >= pos[v] for u, v in pairs):
        import heapq

        indeg = {nid: 0 for nid in by_id}
        out: dict = {nid: [] for nid in by_id}
        for u, v in pairs:
            indeg[v] += 1
            out[u].append(v)
        heap = [(pos[nid], nid) for nid, d in indeg.items() if d == 0]
        heapq.heapify(heap)
        order = []
        while heap:
            _, u = heapq.heappop(heap)
            order.append(u)
            for v in out[u]:
                indeg[v] -= 1
                if indeg[v] == 0:
                    heapq.heappush(heap, (pos[v], v))
        if len(order) != len(by_id):
            raise ValueError(f"{path}: graph has a cycle")
    else:
        order = [nd["id"] for nd in raw]
    names = {nid: str(by_id[nid]["name"]) for nid in by_id}
    nodes = [Node(name=names[nid], time=float(by_id[nid]["cost_cpu"]),
                  size=int(by_id[nid]["cost_ram"]),
                  kind="backward" if by_id[nid].get("backward") else "forward")
             for nid in order]
    return Graph(name=Path(path).stem, title=str(data.get("graph", {}).get("name", "")),
                 nodes=nodes, edges=[(names[u], names[v]) for u, v in pairs])


# --- budgets ----------------------------------------------------------------------------------
def no_recompute_peak(graph: Graph) -> int:
    """Peak bytes of the plain topological order without recomputation."""
    try:
        from schedlang.plans.planners.no_recompute import no_recompute_peak as real
    except ImportError:
        return _local_no_recompute_peak(graph)
    return int(real(graph))


def _local_no_recompute_peak(graph: Graph) -> int:
    """Node order; each output lives from its computation until its last consumer has run
    (a node without consumers is freed right after it runs); the peak is the max over
    computations of the live bytes, the new output included."""
    pos = {nd.name: p for p, nd in enumerate(graph.nodes)}
    last_use = list(range(len(graph.nodes)))
    for u, v in graph.edges:
        last_use[pos[u]] = max(last_use[pos[u]], pos[v])
    live = 0
    peak = 0
    frees_after: list[list[int]] = [[] for _ in graph.nodes]
    for p, lu in enumerate(last_use):
        frees_after[lu].append(p)
    for k, nd in enumerate(graph.nodes):
        live += nd.size
        peak = max(peak, live)
        live -= sum(graph.nodes[p].size for p in frees_after[k])
    return peak


# --- .sched files -----------------------------------------------------------------------------
def write_sched(graph: Graph, directory: str | os.PathLike) -> Path:
    """Write `graph` as <directory>/<name>.sched with schedlang.graphs.writer.write_graph."""
    from schedlang.graphs.writer import write_graph  # colleague's, may not exist yet

    path = Path(directory) / f"{graph.name}.sched"
    path.write_text(write_graph(graph))
    return path


# --- the schedlang API the benchmarks code against ----------------------------------------------
DSL_CONTRACT = """\
    import schedlang
    prob = schedlang.load(sched_path, model="checkmate", budget=<bytes>)
    ir = prob.lower()                  # parse/check/instantiate/lower; prob.timings: parse, check, lower
    from schedlang.solve.backends import build_model
    native = build_model(ir, "pyomo")  # or "cvxpy"; builds without solving
    res = prob.solve(backend="pyomo", solver="highs", time_limit=None)
    # res.status, res.objective, res.timings, res.simulated.peak_bytes / .time / .valid
    from schedlang.graphs.writer import write_graph   # Graph -> .sched text"""


def dsl_missing(need_build: bool = True) -> list[str]:
    """The parts of the schedlang API contract (DSL_CONTRACT) that cannot be imported yet."""
    missing = []
    try:
        import schedlang
    except ImportError:
        return ["schedlang"]
    if not callable(getattr(schedlang, "load", None)):
        missing.append("schedlang.load")
    try:
        from schedlang.graphs.writer import write_graph  # noqa: F401
    except ImportError:
        missing.append("schedlang.graphs.writer.write_graph")
    if need_build:
        try:
            from schedlang.solve.backends import build_model  # noqa: F401
        except ImportError:
            missing.append("schedlang.solve.backends.build_model")
    return missing


def dsl_unavailable_message(missing: list[str]) -> str:
    return ("schedlang's DSL path is not available yet (missing: " + ", ".join(missing) + ").\n"
            "Only the hand-written references are measured. The benchmark codes against:\n"
            + DSL_CONTRACT)
