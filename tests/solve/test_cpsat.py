"""CP-SAT as a solver (`--solver cpsat`, `schedlang.solve.solvers.cpsat`): the IR scaled to integers
exactly, optima equal to HiGHS's on small Checkmate instances, plans that replay within the
budget, models it cannot take refused with a message."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from schedlang.compile.ir import ConstraintBlock, IRModel, Objective, VarFamily
from schedlang.plans.decoders.encode import check_point
from schedlang.plans.planners.no_recompute import no_recompute_peak
from schedlang.solve.backends import solve_ir
from schedlang.solve.solution import Status
from schedlang.solve.solvers import is_available
from schedlang.testing.checkmate_instances import checkmate_problem, tiny_graphs

pytestmark = pytest.mark.skipif(not is_available("cpsat", "pyomo"),
                                reason="ortools is not installed")


def cases():
    for graph in tiny_graphs():
        peak = no_recompute_peak(graph)
        for frac in (1.0, 0.8, 0.65):
            yield graph, int(peak * frac)


@pytest.mark.parametrize("graph,budget", list(cases()),
                         ids=lambda v: v.name if hasattr(v, "name") else str(v))
def test_cpsat_optimum_equals_highs_and_its_plan_replays(graph, budget):
    highs = checkmate_problem(graph, budget).solve(solver="highs", warm_start=None)
    cpsat = checkmate_problem(graph, budget).solve(solver="cpsat", warm_start=None)
    assert cpsat.status.value == highs.status.value
    if highs.status != Status.OPTIMAL:
        assert highs.status == Status.INFEASIBLE
        return
    assert cpsat.objective == pytest.approx(highs.objective, abs=1e-9)
    assert cpsat.bound is not None and cpsat.gap == pytest.approx(0.0, abs=1e-4)
    assert cpsat.simulated.valid and cpsat.simulated.peak_bytes <= budget
    assert cpsat.simulated.time == pytest.approx(cpsat.objective)


def test_scaled_rows_accept_exactly_the_points_the_model_accepts():
    """Checkmate's memory rows are in MiB with a budget exact to the byte; scaled to integers
    they are rows in bytes: a warm start's point satisfies the integer model exactly when it
    satisfies the original one (within its tolerances) and its plan fits the budget to the
    byte, on both sides of the budget (one byte under a plan's peak included)."""
    from schedlang.solve.solvers.cpsat import integral_model

    graph = tiny_graphs()[2]
    peak = no_recompute_peak(graph)
    for budget in (peak, peak - 1, int(0.8 * peak)):
        prob = checkmate_problem(graph, budget)
        ir = prob.lower()
        m = integral_model(ir)
        assert np.all(m.A.data == np.round(m.A.data))
        for planner in ("no_recompute", "checkpoint_all", "chen_greedy"):
            ws = prob.prepare_warm_start(planner, ir)
            y = m.to_y(ws.x)
            assert np.array_equal(m.to_x(y), ws.x)  # the point is on the integer grid
            act = m.A @ y
            ok = bool(np.all(act >= m.lo) and np.all(act <= m.hi)
                      and np.all(y >= m.lb) and np.all(y <= m.ub))
            assert ok == (check_point(ir, ws.x)[0] and ws.fits), (budget, planner)


def _ir(coef: float) -> IRModel:
    fam = VarFamily("x", [(0,), (1,)], "binary", np.zeros(2), np.ones(2))
    row = ConstraintBlock("cap", [()], sp.csr_matrix(np.array([[coef, 1.0]])), np.array([-np.inf]),
                          np.array([1.0]))
    return IRModel("t", [fam], [row], Objective("o", "max", np.array([1.0, 1.0])))


def test_a_model_no_scale_makes_integral_is_refused_with_a_message():
    sol = solve_ir(_ir(1 / 3), solver="cpsat", presolve=False)
    assert sol.status == Status.ERROR
    assert "CP-SAT needs an integer model" in sol.message


def test_decimal_coefficients_are_taken_as_written():
    sol = solve_ir(_ir(0.25), solver="cpsat", presolve=False)  # 0.25 x0 + x1 <= 1
    assert sol.status == Status.OPTIMAL and sol.objective == 1.0
    sol = solve_ir(_ir(0.001), solver="cpsat", presolve=False)
    assert sol.status == Status.OPTIMAL and sol.objective == 1.0
