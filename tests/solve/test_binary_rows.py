"""schedlang/solve/binary_rows.py: the windows' 0-1 solve gives the same least cost with CP-SAT
as with HiGHS (and never more: CP-SAT's costs are rounded down), falls back to HiGHS on rows
CP-SAT cannot take exactly, and says when the rows cannot be met."""
from __future__ import annotations

import itertools
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from schedlang.solve.binary_rows import SparseRows, least_recomputation

from ..paths import OPGRAPHS


def knapsack_cover(weights, capacity):
    """Keep k_v (bytes `weights`, at most `capacity`) or recompute a_v: k_v + a_v >= 1."""
    n = len(weights)
    rows = SparseRows()
    rows.add([(v, float(w)) for v, w in enumerate(weights)], -np.inf, float(capacity))
    for v in range(n):
        rows.add([(v, 1.0), (n + v, 1.0)], 1.0, np.inf)
    return rows, np.zeros(2 * n), np.ones(2 * n)


def brute_force(cost_a, weights, capacity):
    best = None
    for keep in itertools.product([0, 1], repeat=len(weights)):
        if sum(w * k for w, k in zip(weights, keep, strict=True)) <= capacity:
            c = sum(ca for ca, k in zip(cost_a, keep, strict=True) if not k)
            best = c if best is None else min(best, c)
    return best


@pytest.mark.parametrize("capacity", [0, 3, 7, 10, 15])
def test_cpsat_and_highs_find_the_exhaustive_least_cost(capacity):
    weights = [4, 3, 5, 2, 6]
    cost_a = [1.7e-5, 2.3e-5, 9.1e-6, 3.3e-6, 4.0e-5]  # seconds, as the windows' costs are
    rows, lower, upper = knapsack_cover(weights, capacity)
    cost = np.concatenate([np.zeros(len(weights)), cost_a])
    expected = brute_force(cost_a, weights, capacity)
    for solver in ("cpsat", "highs"):
        value, closed = least_recomputation(cost, rows, lower, upper, True, 10.0, solver)
        assert closed
        assert value == pytest.approx(expected, rel=1e-6)
        assert value <= expected * (1 + 1e-12)  # rounded down: still a lower bound


def test_rows_cpsat_cannot_take_exactly_go_to_highs():
    rows, lower, upper = knapsack_cover([4, 3], 5)
    rows.add([(2, 0.5)], -np.inf, 0.4)  # a_0 = 0, written with a fraction: output 0 is kept
    assert not rows.integral()
    cost = np.array([0.0, 0.0, 1.0, 2.0])
    value, closed = least_recomputation(cost, rows, lower, upper, True, 10.0, "cpsat")
    assert closed and value == pytest.approx(2.0)  # (truncated to integers: 1.0)


def test_infeasible_rows_are_none():
    rows, lower, upper = knapsack_cover([4, 3], 5)
    lower[:] = [1, 1, 0, 0]  # both kept: 7 bytes over 5
    cost = np.array([0.0, 0.0, 1.0, 2.0])
    assert least_recomputation(cost, rows, lower, upper, True, 10.0, "cpsat") is None


CHILD = """
import sys
from schedlang import load
from schedlang.solve.linked_windows import linked_bound
from schedlang.solve.window_bound import StageView
prob = load(sys.argv[1], budget="60%")
g = StageView(prob.graph)
points = list(range(10, len(g.names), len(g.names) // 12))
print("ready", flush=True)
try:
    linked_bound(g, points, float(prob.budgets.get("peak")), 120.0, "cpsat")
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def test_ctrl_c_stops_the_cpsat_solve_and_the_process_exits_cleanly():
    # a KeyboardInterrupt raised while waiting on CP-SAT's thread made OR-Tools abort at exit
    # (SIGABRT after the answer was printed); the signal is now recorded and the search stopped
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(OPGRAPHS / "gpt2block.sched")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert out.strip() == "interrupted"
