"""Run Moccasin's published CP-SAT model (Bartan et al., ICML 2023) on one graph, for the table
of `bench/bench_proofs.py`. Not part of schedlang, and it imports nothing from it: it runs
under the interpreter that has Moccasin's dependencies (its era's OR-Tools), from Moccasin's
public source in a scratch folder outside the repository, never copied here.

    python moccasin_driver.py MOCCASIN_SRC GRAPH.json BUDGET_BYTES SECONDS OUT.json

MOCCASIN_SRC: the `src` folder of github.com/haoming-codes/moccasin (its `moccasin/cp.py`
imports `rockmate.def_op` at the top, which `remat` does not use: a stand-in module is put on
the path when Rockmate is absent). GRAPH.json: {"nodes": [[name, time, size], ...] in
topological order, "edges": [[u, v], ...]}, integer times and sizes. `remat` runs as
Moccasin's `main.py` calls it (C = 2 retention intervals, its stage events, interval-length
domain and reservoir precedences, phase 1 minimising memory, then phase 2 minimising time
under the budget), each phase up to SECONDS / 2. OUT.json gets the status, the time of
the schedule, CP-SAT's last best bound (read from its log, in the model's units times the
times' gcd, as `remat` scales its objective) and the schedule (node names, recomputations
included).
"""
from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import sys
import tempfile
import time
import types


def _stand_in_rockmate() -> None:
    try:
        import rockmate.def_op  # noqa: F401
    except ImportError:
        pkg = types.ModuleType("rockmate")
        mod = types.ModuleType("rockmate.def_op")
        for name in ("RunOp", "DelOp", "OpSchedule"):
            setattr(mod, name, type(name, (), {}))
        pkg.def_op = mod
        sys.modules["rockmate"], sys.modules["rockmate.def_op"] = pkg, mod


def main(argv: list[str]) -> int:
    src, graph_path, budget, seconds, out = argv[1], argv[2], int(argv[3]), float(argv[4]), argv[5]
    sys.path.insert(0, src)
    _stand_in_rockmate()
    import networkx as nx
    from moccasin.cp import remat

    with open(graph_path) as f:
        data = json.load(f)
    G = nx.DiGraph()
    G.graph["name"] = data.get("name", "graph")
    for i, (name, t, size) in enumerate(data["nodes"]):
        G.add_node(i, cost_cpu=int(t), cost_ram=int(size), name=name)
    index = {name: i for i, (name, _, _) in enumerate(data["nodes"])}
    for u, v in data["edges"]:
        G.add_edge(index[u], index[v])
    cpus_gcd = math.gcd(*[int(t) for _, t, _ in data["nodes"]])
    logdir = tempfile.mkdtemp(prefix="moccasin-")
    t0 = time.monotonic()
    # CP-SAT logs to stdout from C++: the file descriptor is redirected to read its bound
    log_path = os.path.join(logdir, "log.txt")
    saved = os.dup(1)
    with open(log_path, "w") as log:
        os.dup2(log.fileno(), 1)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                res = remat(G=G, B=budget, C=2, timeout=seconds / 2,
                            topo_order=list(range(len(data["nodes"]))), log_dir=logdir)
        except Exception as exc:  # noqa: BLE001 (its API against this OR-Tools, a model error)
            res = {"status": f"error: {type(exc).__name__}: {exc}"}
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
    wall = time.monotonic() - t0
    with open(log_path) as f:
        text = f.read()
    bounds = re.findall(r"^best_bound: ([-0-9.e+]+)", text, flags=re.MULTILINE)
    names = [n for n, _, _ in data["nodes"]]
    result = {"status": res.get("status"), "objective": res.get("obj_val"),
              "bound": float(bounds[-1]) * cpus_gcd if bounds and "schedule" in res else None,
              "schedule": [names[i] for i in res.get("schedule", [])], "seconds": wall}
    with open(out, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
