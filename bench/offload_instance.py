"""Write the 12-layer combined offload instance of bench_offload.py as a .sched file.

    python bench/offload_instance.py OUT.sched [--layers 12] [--bandwidth 24e9]

The transformer-like chain of `instances.transformer_chain` with a host link of --bandwidth
bytes per second each way, `use offload` (recompute + offload); bench_scale.py solves it at
40% with and without the automatic warm start.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from instances import transformer_chain  # noqa: E402

from schedlang.graphs.writer import write_graph  # noqa: E402


def write(out: str | Path, layers: int = 12, bandwidth: float = 24e9) -> Path:
    graph = transformer_chain(layers)
    graph.bandwidths = {"offload": bandwidth, "prefetch": bandwidth}
    path = Path(out)
    path.write_text("use offload\n" + write_graph(graph))
    return path


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--bandwidth", type=float, default=24e9)
    a = ap.parse_args()
    print(write(a.out, a.layers, a.bandwidth))
