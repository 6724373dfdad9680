"""Where the tests find the repository's examples and the Checkmate graph data.

The graphs of `shared/graphs/` sit beside the repository (or where $SCHEDLANG_GRAPHS says);
tests that need one skip when it is absent."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
DATA = Path(__file__).resolve().parent / "data"
GRAPHS = Path(os.environ.get("SCHEDLANG_GRAPHS", ROOT.parent / "shared" / "graphs"))

#: a test that reads shared/graphs skips where the folder is absent (a clone without it beside)
needs_graphs = pytest.mark.skipif(not GRAPHS.is_dir(), reason=f"{GRAPHS} not present")

#: the op graphs of the benchmarks (`bench/export_op_graphs.py`): graph data, in the repository
OPGRAPHS = ROOT / "bench" / "data" / "opgraphs"
