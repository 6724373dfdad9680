"""Backends and solver registry on hand-built IR models with known optima.

Every installed solver on both backends must give the brute-force optimum; statuses are
normalized the same way everywhere (a time-limited run is never `optimal`).
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.sparse as sp

from schedlang.compile.ir import ConstraintBlock, IRModel, Objective, VarFamily
from schedlang.language.errors import SchedError, SolverUnavailable
from schedlang.solve import backends as B
from schedlang.solve import solvers
from schedlang.solve import status as S
from schedlang.solve.backends import BACKENDS, build_model, solve_ir
from schedlang.solve.solution import Status
from schedlang.solve.solvers import SOLVER_NAMES, available_solvers, is_available, native_options
from schedlang.testing.irmodels import make_ir

INF = np.inf
ALL_CASES = [(b, s) for b in BACKENDS for s in SOLVER_NAMES]


def need(backend, solver):
    if not is_available(solver, backend):
        pytest.skip(f"{solver} is not installed for the {backend} backend")


# --------------------------------------------------------------------------- model helpers


def brute_force(ir: IRModel) -> float | None:
    """The optimum over all integer points in the (finite) bounds; None if infeasible."""
    lb, ub = ir.column_bounds()
    assert ir.integrality().all()
    X = np.array(list(itertools.product(*[np.arange(l, u + 1) for l, u in zip(lb, ub)])),
                 dtype=float)
    A, lo, hi = ir.stacked()
    act = (A @ X.T).T
    X = X[np.all((act >= lo - 1e-9) & (act <= hi + 1e-9), axis=1)]
    if not X.shape[0]:
        return None
    vals = X @ ir.objective.c + ir.objective.constant
    return float(vals.max() if ir.objective.sense == "max" else vals.min())


def assert_feasible(ir: IRModel, x, tol=1e-6):
    assert x is not None and x.shape == (ir.n_columns,)
    lb, ub = ir.column_bounds()
    assert np.all(x >= lb - tol) and np.all(x <= ub + tol)
    mask = ir.integrality()
    np.testing.assert_array_equal(x[mask], np.round(x[mask]))
    A, lo, hi = ir.stacked()
    act = A @ x
    assert np.all(act >= lo - tol) and np.all(act <= hi + tol)


def knapsack(n=14, seed=3):
    rng = np.random.default_rng(seed)
    w = rng.integers(3, 20, size=(2, n)).astype(float)
    v = rng.integers(1, 30, size=n) + rng.random(n).round(2)
    cap = np.floor(w.sum(axis=1) * 0.4)
    return make_ir([("take", "binary", np.zeros(n), np.ones(n))],
                   [("cap", w, [-INF, -INF], cap)], v, sense="max", constant=2.5)


def assignment():
    """3 workers x 4 tasks (binaries), each task exactly once (equality rows), each worker
    1..2 tasks (range rows), task pair coverage (a >= row), plus an integer overtime
    variable 0..3 that relaxes worker 0's range at a cost."""
    W, T = 3, 4
    cost = np.array([[4, 2, 7, 5], [3, 6, 2, 8], [5, 4, 6, 1]], dtype=float)
    n = W * T + 1
    rows, lo, hi, names = [], [], [], []
    for t in range(T):  # each task exactly once
        a = np.zeros(n)
        a[[w * T + t for w in range(W)]] = 1
        rows.append(a), lo.append(1), hi.append(1), names.append("once")
    for w in range(W):  # 1 <= tasks of w <= 2 (+ overtime for worker 0)
        a = np.zeros(n)
        a[w * T:(w + 1) * T] = 1
        if w == 0:
            a[-1] = -1
        rows.append(a), lo.append(1), hi.append(2), names.append("load")
    a = np.zeros(n)  # worker 2 does task 3 or task 0
    a[[2 * T + 3, 2 * T + 0]] = 1
    rows.append(a), lo.append(1), hi.append(INF), names.append("cover")
    A = np.array(rows)
    c = np.r_[cost.ravel(), 2.5]
    blocks = []
    for bname in ("once", "load", "cover"):
        idx = [i for i, nm in enumerate(names) if nm == bname]
        blocks.append((bname, A[idx], np.array(lo)[idx], np.array(hi)[idx]))
    return make_ir([("assign", "binary", np.zeros(W * T), np.ones(W * T)),
                    ("overtime", "integer", [0], [3])], blocks, c, sense="min", constant=-1.0)


def small_lp():
    """max 3x + 2y + z: x + y <= 4, x + 3y <= 6, x <= 3, z = 2 - y (equality),
    -1 <= x - y <= 2 (range), free z. Optimum x=3, y=1, z=1: 12 (+ constant 0.5)."""
    A_le = [[1, 1, 0], [1, 3, 0]]
    return make_ir([("x", "continuous", [0, 0], [3, INF]), ("z", "continuous", [-INF], [INF])],
                   [("res", A_le, [-INF, -INF], [4, 6]), ("link", [[0, 1, 1]], [2], [2]),
                    ("band", [[1, -1, 0]], [-1], [2])],
                   [3, 2, 1], sense="max", constant=0.5)


def mkp(n=100, m=10, seed=7):
    """A random multi-dimensional knapsack: HiGHS does not prove it optimal in 30 s
    (measured: gap 0.6% left at 30 s), so a 0.1 s run cannot end optimal."""
    rng = np.random.default_rng(seed)
    w = rng.uniform(1, 100, size=(m, n)).round(3)
    v = (w.mean(0) + rng.uniform(0, 20, size=n)).round(3)
    return make_ir([("take", "binary", np.zeros(n), np.ones(n))],
                   [("cap", w, np.full(m, -INF), w.sum(1) * 0.5)], v, sense="max")


KNAPSACK, ASSIGNMENT, LP = knapsack(), assignment(), small_lp()
KNAPSACK_OPT = brute_force(KNAPSACK)
ASSIGNMENT_OPT = brute_force(ASSIGNMENT)
LP_OPT = 12.5


# --------------------------------------------------------------------------- known optima

@pytest.mark.parametrize("backend,solver", ALL_CASES)
def test_every_solver_finds_the_known_optima(backend, solver):
    need(backend, solver)
    for ir, opt, presolve in ((KNAPSACK, KNAPSACK_OPT, False), (KNAPSACK, KNAPSACK_OPT, True),
                              (ASSIGNMENT, ASSIGNMENT_OPT, True), (LP, LP_OPT, True)):
        sol = solve_ir(ir, backend=backend, solver=solver, presolve=presolve)
        assert sol.status == Status.OPTIMAL, (ir.name, sol.message)
        assert sol.objective == pytest.approx(opt, abs=1e-6)
        assert_feasible(ir, sol.x)
        assert float(ir.objective.c @ sol.x + ir.objective.constant) == \
            pytest.approx(sol.objective)
        if sol.bound is not None:
            assert sol.bound == pytest.approx(opt, rel=1e-4, abs=1e-6)
            assert sol.gap is not None and sol.gap <= 1e-4
        assert sol.backend == backend and sol.solver == solver
        assert set(sol.model_size) == {"variables", "constraints", "nonzeros"}
        assert set(sol.timings) >= {"presolve", "build", "solve"}
    assert LP_OPT == pytest.approx(3 * 3 + 2 * 1 + 1 + 0.5)


def test_highs_gives_bounds_on_both_backends():
    for backend in BACKENDS:
        sol = solve_ir(ASSIGNMENT, backend=backend, presolve=False)
        assert sol.bound == pytest.approx(ASSIGNMENT_OPT) and sol.gap == 0.0
        assert sol.model_size == ASSIGNMENT.size_summary()


def test_the_solvers_own_options_reach_it():
    """`solver_options` go to the solver as it spells them: HiGHS without its presolve finds
    the same optimum, and an option it does not know is its error, named, not a traceback."""
    sol = solve_ir(KNAPSACK, solver="highs", solver_options={"presolve": "off"})
    assert sol.status == Status.OPTIMAL and sol.objective == pytest.approx(KNAPSACK_OPT)
    sol = solve_ir(KNAPSACK, solver="highs", solver_options={"presolve": "sideways"})
    assert sol.status == Status.ERROR
    assert "HiGHS rejected option presolve='sideways'" in sol.message


@pytest.mark.parametrize("interface", ["stdform_highs", "appsi_highs", "highs"])
def test_pyomo_highs_interfaces_agree(interface):
    from schedlang.solve.backends import pyomo_backend
    run = B.SolveRun(solvers.SOLVERS["highs"], native_options("highs", "pyomo"),
                     interface=interface)
    for ir, opt in ((ASSIGNMENT, ASSIGNMENT_OPT), (KNAPSACK, KNAPSACK_OPT), (LP, LP_OPT)):
        raw = pyomo_backend.solve(ir, run)
        assert raw.termination == S.OPTIMAL, raw.detail
        assert raw.objective == pytest.approx(opt)
        assert raw.bound == pytest.approx(opt, rel=1e-4)
        x = raw.x.copy()
        x[ir.integrality()] = np.round(x[ir.integrality()])
        assert_feasible(ir, x)


def test_presolved_and_plain_solutions_agree():
    # presolve fixes most of this model; x is returned for every original column
    n = 8
    A = np.zeros((4, n))
    A[0, [0, 1, 2]] = 1          # forcing: x0 = x1 = x2 = 1
    A[1, [3, 4]] = 1             # forcing: x3 = x4 = 0
    A[2, [5, 6, 7]] = [3, 4, 5]  # knapsack on the rest
    A[3, 0] = 1                  # singleton
    ir = make_ir([("x", "binary", np.zeros(n), np.ones(n))],
                 [("f", A[:2], [3, -INF], [INF, 0]), ("k", A[2:3], [-INF], [8]),
                  ("s", A[3:], [1], [1])], [1, 2, 3, 9, 9, 4, 5, 6.5], sense="max")
    for backend in BACKENDS:
        with_pre = solve_ir(ir, backend=backend)
        without = solve_ir(ir, backend=backend, presolve=False)
        assert with_pre.status == without.status == Status.OPTIMAL
        np.testing.assert_array_equal(with_pre.x, without.x)
        assert with_pre.objective == pytest.approx(brute_force(ir))
        assert with_pre.model_size["variables"] == 3 < without.model_size["variables"]
        assert "presolve" in with_pre.message


def test_model_solved_by_presolve_alone():
    ir = make_ir([("x", "binary", [0, 0], [1, 1])], [("f", [[1, 1]], [2], [INF])], [1, 1])
    for backend in BACKENDS:
        sol = solve_ir(ir, backend=backend)
        assert sol.status == Status.OPTIMAL and sol.objective == 2
        np.testing.assert_array_equal(sol.x, [1, 1])
        assert "solved by presolve" in sol.message and sol.model_size["variables"] == 0


def test_feasibility_model_without_objective():
    ir = make_ir([("n", "integer", [0, 0], [4, 4])], [("r", [[2, 3]], [7], [7])], None)
    for backend in BACKENDS:
        sol = solve_ir(ir, backend=backend, presolve=False)
        assert sol.status == Status.OPTIMAL and sol.objective == 0.0
        assert 2 * sol.x[0] + 3 * sol.x[1] == pytest.approx(7)


# --------------------------------------------------------------------------- infeasible, unbounded

INFEASIBLE_MIP = make_ir([("n", "integer", [0, 0], [5, 5])], [("odd", [[2, 2]], [1], [1])],
                         [1, 1])
INFEASIBLE_LP = make_ir([("x", "continuous", [0, 0], [INF, INF])],
                        [("r", [[1, 1], [1, -1]], [-INF, 2], [1, INF])], [1, 1])
UNBOUNDED_LP = make_ir([("x", "continuous", [0, 0], [INF, INF])],
                       [("r", [[1, -1]], [-INF], [1])], [-1, 0])
UNBOUNDED_MIP = make_ir([("n", "integer", [0, 0], [INF, INF])],
                        [("r", [[1, -1]], [-INF], [1])], [-1, 0])


@pytest.mark.parametrize("backend,solver", ALL_CASES)
def test_solver_proves_infeasibility_and_unboundedness(backend, solver):
    need(backend, solver)
    for ir in (INFEASIBLE_MIP, INFEASIBLE_LP):
        sol = solve_ir(ir, backend=backend, solver=solver, presolve=False)
        assert sol.status == Status.INFEASIBLE, sol.message
        assert sol.x is None and sol.objective is None
    for ir in (UNBOUNDED_LP, UNBOUNDED_MIP):
        sol = solve_ir(ir, backend=backend, solver=solver, presolve=False)
        assert sol.status == Status.UNBOUNDED, sol.message


@pytest.mark.parametrize("backend", BACKENDS)
def test_presolve_infeasibility_names_the_row(backend):
    ir = make_ir([("b", "binary", np.zeros(3), np.ones(3))],
                 [("demand", [[1, 1, 0], [1, 1, 1]], [1, 4], [INF, INF])], [1, 1, 1])
    sol = solve_ir(ir, backend=backend)
    assert sol.status == Status.INFEASIBLE
    assert "demand[demand, 1]" in sol.message
    assert "build" not in sol.timings  # no model was built
    # without presolve, the solver finds the same
    assert solve_ir(ir, backend=backend, presolve=False).status == Status.INFEASIBLE


def test_crossed_bounds_are_infeasible_without_presolve():
    ir = make_ir([("x", "continuous", [3], [1])], [], [1])
    for backend in BACKENDS:
        sol = solve_ir(ir, backend=backend, presolve=False)
        assert sol.status == Status.INFEASIBLE and "x[x, 0]" in sol.message


# --------------------------------------------------------------------------- time limits

HARD = mkp()


@pytest.mark.parametrize("backend", BACKENDS)
def test_time_limited_highs_run_is_never_optimal(backend):
    sol = solve_ir(HARD, backend=backend, solver="highs", time_limit=0.1)
    assert sol.status in (Status.FEASIBLE, Status.NO_SOLUTION), sol.message
    if sol.status == Status.FEASIBLE:
        assert_feasible(HARD, sol.x)
        assert sol.bound is not None and sol.bound > sol.objective
        assert sol.gap > 1e-4
        assert "limit" in sol.message
    else:
        assert sol.x is None


@pytest.mark.parametrize("backend,solver", [c for c in ALL_CASES if c[1] != "highs"])
def test_time_limited_runs_of_other_solvers_are_never_optimal(backend, solver):
    need(backend, solver)
    sol = solve_ir(HARD, backend=backend, solver=solver, time_limit=0.1)
    assert sol.status in (Status.FEASIBLE, Status.NO_SOLUTION), sol.message
    if sol.status == Status.FEASIBLE:
        assert_feasible(HARD, sol.x)
        if sol.bound is not None:
            assert sol.gap > 1e-4


def test_requested_gap_ends_optimal_within_it():
    ir = mkp(n=60)
    for backend in BACKENDS:
        sol = solve_ir(ir, backend=backend, gap=0.03, time_limit=20)
        assert sol.status == Status.OPTIMAL, sol.message
        assert 0 < sol.gap <= 0.03 * (1 + 1e-3)


# --------------------------------------------------------------------------- warm starts

def test_warm_start_is_used_or_reported():
    good = solve_ir(HARD, solver="highs", time_limit=1.0)
    assert good.status == Status.FEASIBLE
    for backend in BACKENDS:
        for solver in available_solvers(backend):
            sol = solve_ir(HARD, backend=backend, solver=solver, time_limit=0.1,
                           warm_start=good.x)
            if solvers.supports_warm_start(solver, backend):
                assert sol.status == Status.FEASIBLE, (backend, solver, sol.message)
                assert sol.objective >= good.objective - 1e-6, (backend, solver)
                assert "warm start ignored" not in sol.message
            else:
                assert "warm start ignored" in sol.message, (backend, solver)


def test_warm_start_of_wrong_length_is_rejected():
    with pytest.raises(SchedError):
        solve_ir(KNAPSACK, warm_start=np.zeros(3))


# --------------------------------------------------------------------------- registry

def test_registry_names_and_availability():
    assert SOLVER_NAMES == ("highs", "gurobi", "scip", "cbc", "glpk", "cpsat")
    assert solvers.DEFAULT_SOLVER == "highs"
    for backend in BACKENDS:
        avail = available_solvers(backend)
        assert "highs" in avail and set(avail) <= set(SOLVER_NAMES)


def test_unknown_solver_suggests_a_name_and_lists_available():
    with pytest.raises(SolverUnavailable) as err:
        solve_ir(KNAPSACK, backend="cvxpy", solver="gurobii")
    msg = err.value.message
    assert "did you mean 'gurobi'" in msg and "highs" in msg
    assert err.value.exit_code == 5
    with pytest.raises(SolverUnavailable, match="did you mean 'pyomo'"):
        solve_ir(KNAPSACK, backend="pyomoo")


def test_uninstalled_solver_lists_installed_ones(monkeypatch):
    monkeypatch.setattr(solvers, "_cvxpy_installed", lambda: frozenset({"HIGHS", "CBC"}))
    with pytest.raises(SolverUnavailable) as err:
        solve_ir(KNAPSACK, backend="cvxpy", solver="gurobi")
    assert err.value.message == ("solver 'gurobi' is not available with the cvxpy backend: "
                                 "install it with `pip install gurobipy (a size-limited "
                                 "licence comes with it; larger models need a Gurobi "
                                 "licence)`; available: highs, cbc")
    monkeypatch.setattr(solvers, "pyomo_interface",
                        lambda s: "stdform_highs" if s == "highs" else None)
    with pytest.raises(SolverUnavailable, match="available: highs$"):
        solve_ir(KNAPSACK, backend="pyomo", solver="scip")


@pytest.mark.parametrize("backend,solver", ALL_CASES)
def test_option_mapping(backend, solver):
    opts = native_options(solver, backend, time_limit=12.5, gap=0.01, threads=2)
    flat = dict(opts.options)
    flat.update(flat.pop("scip_params", {}))
    names = {
        "highs": ("time_limit", "mip_rel_gap", "mip_abs_gap", "threads"),
        "gurobi": ("TimeLimit", "MIPGap", "MIPGapAbs", "Threads"),
        "scip": ("limits/time", "limits/gap", "limits/absgap", None),
        "cbc": {"pyomo": ("sec", "ratioGap", "allowableGap", "threads"),
                "cvxpy": ("maximumSeconds", "allowableFractionGap", "allowableGap",
                          "numberThreads")}[backend],
        "glpk": {"pyomo": ("tmlim", "mipgap", None, None),
                 "cvxpy": ("tm_lim", "mip_gap", None, None)}[backend],
        "cpsat": ("max_time_in_seconds", "relative_gap_limit", "absolute_gap_limit",
                  "num_workers"),
    }[solver]
    tl, gap, absgap, threads = names
    assert flat[gap] == 0.01
    if solver == "glpk":
        assert flat[tl] == (13 if backend == "pyomo" else 12500)  # whole s / ms
    else:
        assert flat[tl] == 12.5
    if absgap:
        assert flat[absgap] == 0.0  # objectives in seconds: no absolute-gap early stop
    if threads:
        assert flat[threads] == 2
    else:
        assert any("threads" in n for n in opts.notes)
    with pytest.raises(ValueError):
        native_options(solver, backend, time_limit=-1)


# --------------------------------------------------------------------------- status rules

class _FakeBackend:
    """Stands in for a backend module and returns scripted RawResults."""

    def __init__(self, *results):
        self.results = list(results)
        self.calls = 0

    def solve(self, ir, run):
        self.calls += 1
        res = self.results.pop(0)
        if isinstance(res, Exception):
            raise res
        return res


def _with_fake(monkeypatch, *results):
    fake = _FakeBackend(*results)
    monkeypatch.setattr(B, "_backend_module", lambda backend: fake)
    return fake


def test_status_rules(monkeypatch):
    ir = KNAPSACK
    good = solve_ir(ir, presolve=False)
    x, obj = good.x, good.objective
    cases = [
        # solver says optimal, but the gap to its bound is 10%: feasible
        (S.RawResult(S.OPTIMAL, x=x, bound=obj * 1.1), Status.FEASIBLE),
        (S.RawResult(S.OPTIMAL, x=x, bound=obj * (1 + 5e-5)), Status.OPTIMAL),
        (S.RawResult(S.OPTIMAL, x=x, bound=None), Status.OPTIMAL),
        (S.RawResult(S.LIMIT, x=x, bound=obj), Status.FEASIBLE),
        (S.RawResult(S.LIMIT, x=np.full(ir.n_columns, 0.5)), Status.NO_SOLUTION),  # not integral
        (S.RawResult(S.LIMIT, x=np.ones(ir.n_columns)), Status.NO_SOLUTION),  # over capacity
        (S.RawResult(S.LIMIT), Status.NO_SOLUTION),
        (S.RawResult(S.UNKNOWN, x=x), Status.FEASIBLE),
        (S.RawResult(S.UNKNOWN), Status.ERROR),
        (S.RawResult(S.ERROR, detail="boom"), Status.ERROR),
        (RuntimeError("solver crashed"), Status.ERROR),
        (S.RawResult(S.INFEASIBLE), Status.INFEASIBLE),
        (S.RawResult(S.UNBOUNDED), Status.UNBOUNDED),
    ]
    for raw, expected in cases:
        _with_fake(monkeypatch, raw)
        sol = solve_ir(ir, presolve=False, time_limit=1.0)
        assert sol.status == expected, (raw, sol.message)
        if expected == Status.ERROR:
            assert sol.message
        if not expected.has_solution:
            assert sol.x is None
    _with_fake(monkeypatch, RuntimeError("solver crashed"))
    assert "solver crashed" in solve_ir(ir, presolve=False).message
    # a bound on the wrong side of the objective is dropped, not trusted
    _with_fake(monkeypatch, S.RawResult(S.OPTIMAL, x=x, bound=obj * 0.5))
    sol = solve_ir(ir, presolve=False)
    assert sol.bound is None and "wrong side" in sol.message


def test_infeasible_or_unbounded_is_resolved_by_a_feasibility_check(monkeypatch):
    ir = KNAPSACK
    x = solve_ir(ir, presolve=False).x
    fake = _with_fake(monkeypatch, S.RawResult(S.INF_OR_UNBD), S.RawResult(S.OPTIMAL, x=x))
    assert solve_ir(ir, presolve=False).status == Status.UNBOUNDED and fake.calls == 2
    _with_fake(monkeypatch, S.RawResult(S.INF_OR_UNBD), S.RawResult(S.INFEASIBLE))
    assert solve_ir(ir, presolve=False).status == Status.INFEASIBLE
    _with_fake(monkeypatch, S.RawResult(S.INF_OR_UNBD), S.RawResult(S.ERROR))
    assert solve_ir(ir, presolve=False).status == Status.ERROR


@pytest.mark.parametrize("backend", BACKENDS)
def test_solver_rejecting_an_option_is_an_error_not_a_traceback(backend, monkeypatch):
    real = B.native_options

    def bad_options(*args, **kwargs):
        opts = real(*args, **kwargs)
        opts.options["no_such_highs_option"] = 1
        return opts

    monkeypatch.setattr(B, "native_options", bad_options)
    sol = solve_ir(KNAPSACK, backend=backend, presolve=False)
    assert sol.status == Status.ERROR and sol.message


# --------------------------------------------------------------------------- native models

def test_build_model_pyomo_names_and_sizes():
    import pyomo.environ as pyo
    ir = make_ir([("x.y", "binary", [0, 0], [1, 1]), ("for", "integer", [0], [4])],
                 [("acc.definition", [[1, 1, 1], [1, 0, -1]], [-INF, 0], [3, 0]),
                  ("name", [[1, 2, 3]], [1], [10])], [1, 2, 3])
    m = build_model(ir, "pyomo")
    assert isinstance(m, pyo.ConcreteModel)
    assert len(m.x_y) == 2 and len(m._for) == 1 and len(m.acc_definition) == 2
    assert m.x_y[0].is_binary() and m._for[0].is_integer() and m._for[0].ub == 4
    assert len(m.name_2) == 1  # 'name' is a ConcreteModel attribute
    assert m.acc_definition[1].equality and m.name_2[0].lb == 1 and m.name_2[0].ub == 10
    assert sum(1 for _ in m.component_data_objects(pyo.Constraint)) == 3


def test_build_model_cvxpy_is_vectorized():
    import cvxpy as cp
    rng = np.random.default_rng(0)
    m, n = 3000, 500
    A = sp.random(m, n, density=0.01, random_state=1, format="csr")
    lo = np.where(rng.random(m) < 0.3, -INF, -1.0)
    hi = np.where(rng.random(m) < 0.3, lo, 5.0)
    hi[np.isinf(lo)] = 5.0
    ir = IRModel("v", [VarFamily("x", [(i,) for i in range(n)], "continuous", np.zeros(n),
                                 np.ones(n))],
                 [ConstraintBlock("a", [(i,) for i in range(m)], A, lo, hi),
                  ConstraintBlock("b", [(i,) for i in range(m)], A, lo, hi)],
                 Objective("o", "min", np.ones(n)))
    prob = build_model(ir, "cvxpy")
    assert isinstance(prob, cp.Problem)
    assert len(prob.constraints) <= 3 * 2  # eq, <=, >= per block, never one per row
    assert prob.variables()[0].shape == (n,)
