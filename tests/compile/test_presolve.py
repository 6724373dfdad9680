"""Presolve on hand-built IR models: what it removes, that it keeps the optimum, what it proves.

Optima are computed by brute force over the integer columns, so these tests need no solver.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.sparse as sp

from schedlang.compile.ir import ConstraintBlock, IRModel, Objective, VarFamily
from schedlang.compile.presolve import Postsolve, presolve, trivial_infeasibility
from schedlang.testing.irmodels import make_ir

INF = np.inf


# --------------------------------------------------------------------------- helpers


def brute_force(ir: IRModel):
    """(best objective, argmax/argmin x) over all integer points within bounds, or (None, None).

    Every column must be integer with finite bounds (small models only).
    """
    lb, ub = ir.column_bounds()
    assert ir.integrality().all()
    ranges = [np.arange(np.ceil(l - 1e-9), np.floor(u + 1e-9) + 1) for l, u in zip(lb, ub)]
    if any(r.size == 0 for r in ranges):
        return None, None
    if not ranges:
        X = np.zeros((1, 0))
    else:
        X = np.array(list(itertools.product(*ranges)), dtype=float)
    A, lo, hi = ir.stacked()
    if A.shape[0]:
        act = (A @ X.T).T
        ok = np.all((act >= lo - 1e-9) & (act <= hi + 1e-9), axis=1)
        X = X[ok]
    if X.shape[0] == 0:
        return None, None
    vals = X @ ir.objective.c + ir.objective.constant
    k = int(np.argmax(vals) if ir.objective.sense == "max" else np.argmin(vals))
    return float(vals[k]), X[k]


def feasible(ir: IRModel, x: np.ndarray, tol=1e-7) -> bool:
    lb, ub = ir.column_bounds()
    A, lo, hi = ir.stacked()
    act = A @ x
    return bool(np.all(x >= lb - tol) and np.all(x <= ub + tol)
                and np.all(act >= lo - tol) and np.all(act <= hi + tol))


def forcing_model():
    """12 binaries; singleton and forcing rows fix 9 of them, a knapsack on 3 remains."""
    n = 12
    rows, lo, hi = [], [], []

    def row(coefs, l, h):
        a = np.zeros(n)
        for j, v in coefs.items():
            a[j] = v
        rows.append(a)
        lo.append(l)
        hi.append(h)

    row({0: 1}, -INF, 0)                      # singleton: x0 <= 0
    row({1: 2}, 2, INF)                       # singleton: 2 x1 >= 2 -> x1 = 1
    row({2: 1, 3: 1, 4: 1}, 3, INF)           # forcing at max: x2 = x3 = x4 = 1
    row({5: 1, 6: 1}, -INF, 0)                # forcing at min: x5 = x6 = 0
    row({7: 1, 8: -1}, 1, INF)                # forcing at max: x7 = 1, x8 = 0
    row({0: 1, 1: 1, 9: 1, 10: 1, 11: 1}, -INF, 3)  # after fixing: x9 + x10 + x11 <= 2
    row({9: 3, 10: 4, 11: 5, 2: 1}, -INF, 9)  # after fixing: 3 x9 + 4 x10 + 5 x11 <= 8
    A = np.array(rows)
    c = np.array([5, 1, 2, 2, 2, 7, 7, 3, 3, 4, 5, 6.5])
    return make_ir([("x", "binary", np.zeros(n), np.ones(n))],
                   [("sing", A[:2], lo[:2], hi[:2]), ("force", A[2:5], lo[2:5], hi[2:5]),
                    ("pack", A[5:], lo[5:], hi[5:])], c, sense="max", constant=1.5)


# --------------------------------------------------------------------------- reductions

def test_singleton_and_forcing_rows_fix_most_columns():
    ir = forcing_model()
    red, post = presolve(ir)
    assert post.infeasible is None
    assert red.n_columns == 3 and red.n_rows == 2  # only the knapsack remains
    assert red.n_rows < ir.n_rows and red.nnz < ir.nnz
    fixed = post.fixed
    assert fixed.sum() == 9
    assert list(np.flatnonzero(~fixed)) == [9, 10, 11]
    expected = {0: 0, 1: 1, 2: 1, 3: 1, 4: 1, 5: 0, 6: 0, 7: 1, 8: 0}
    for j, v in expected.items():
        assert post.values[j] == v
    # names and keys survive for the backends
    assert red.variables[0].name == "x"
    assert red.variables[0].keys == [("x", 9), ("x", 10), ("x", 11)]
    assert [b.name for b in red.constraints] == ["pack"]
    assert red.constraints[0].keys == [("pack", 0), ("pack", 1)]
    # the moved contributions: x0 + x1 = 1 leaves 2 on the first row, x2 = 1 leaves 8
    np.testing.assert_allclose(red.constraints[0].hi, [2, 8])


def test_postsolved_optimum_equals_unpresolved_optimum():
    ir = forcing_model()
    best, x_best = brute_force(ir)
    red, post = presolve(ir)
    red_best, red_x = brute_force(red)
    assert red_best == pytest.approx(best)  # objective constant carries the fixed part
    x = post(red_x)
    assert x.shape == (ir.n_columns,)
    np.testing.assert_array_equal(x, x_best)  # the optimum is unique
    assert float(ir.objective.c @ x + ir.objective.constant) == pytest.approx(best)
    assert feasible(ir, x)


def test_integer_bounds_are_rounded_and_singletons_become_bounds():
    ir = make_ir([("n", "integer", [0.5, -3.0, 0.0], [2.7, 3.0, 10.0])],
                 [("half", [[0, 2, 0]], [-INF], [3.0]),      # 2 n1 <= 3 -> n1 <= 1
                  ("mix", [[1, 1, 1]], [3.0], [INF])],
                 [1, 2, 3])
    red, post = presolve(ir)
    assert post.infeasible is None
    assert red.n_columns == 3 and [b.name for b in red.constraints] == ["mix"]
    fam = red.variables[0]
    np.testing.assert_array_equal(fam.lb, [1, -3, 0])
    np.testing.assert_array_equal(fam.ub, [2, 1, 10])
    best, x_best = brute_force(ir)
    red_best, red_x = brute_force(red)
    assert red_best == pytest.approx(best) == 4
    np.testing.assert_array_equal(post(red_x), x_best)
    np.testing.assert_array_equal(x_best, [2, 1, 0])


def test_redundant_rows_and_lonely_columns_disappear():
    # x + y <= 5 can never bind for binaries; z is in no row and costs 2 (min) -> lb;
    # w is in no row, free of cost -> 0 (clipped into its bounds)
    ir = make_ir([("b", "binary", [0, 0], [1, 1]),
                  ("z", "continuous", [1.5], [9.0]),
                  ("w", "continuous", [-INF], [INF])],
                 [("loose", [[1, 1, 0, 0]], [-INF], [5.0])],
                 [-1, -2, 2, 0])
    red, post = presolve(ir)
    assert red.n_columns == 0 and red.n_rows == 0
    np.testing.assert_allclose(post.values, [1, 1, 1.5, 0])
    assert red.objective.constant == pytest.approx(-1 - 2 + 3)


def test_unbounded_direction_is_left_to_the_solver():
    ir = make_ir([("z", "continuous", [0.0], [INF])], [], [-1.0])
    red, post = presolve(ir)
    assert post.infeasible is None and red.n_columns == 1  # not fixed at +inf


def test_free_columns_are_never_fixed():
    # acc1 = x1, acc2 = acc1 + x2, acc <= 1.5: free continuous columns with infinite bounds
    A = [[-1, 0, 1, 0], [0, -1, -1, 1]]
    ir = make_ir([("x", "continuous", [0, 0], [1, 1]), ("acc", "continuous", [-INF, -INF],
                                                          [INF, INF])],
                 [("def", A, [0, 0], [0, 0]), ("cap", [[0, 0, 0, 1]], [-INF], [1.5])],
                 [1, 1, 0, 0], sense="max")
    with np.errstate(invalid="raise"):
        red, post = presolve(ir)
    assert post.infeasible is None
    assert np.all(np.isfinite(post.values))
    assert red.n_columns >= 3


def test_presolve_reaches_a_fixpoint():
    ir = forcing_model()
    red, _ = presolve(ir)
    again, post2 = presolve(red)
    assert again.n_columns == red.n_columns and again.n_rows == red.n_rows
    assert post2.stats["columns_removed"] == 0


def test_postsolve_checks_lengths_and_restricts():
    ir = forcing_model()
    red, post = presolve(ir)
    with pytest.raises(ValueError):
        post(np.zeros(red.n_columns + 1))
    full = np.arange(ir.n_columns, dtype=float)
    np.testing.assert_array_equal(post.restrict(full), [9, 10, 11])
    ident = Postsolve.identity(ir)
    np.testing.assert_array_equal(ident(full), full)


# --------------------------------------------------------------------------- infeasibility

def test_infeasible_row_is_named_with_its_block_and_key():
    # three binaries cannot reach 4: the row need[('need', 1)] is impossible
    ir = make_ir([("b", "binary", np.zeros(3), np.ones(3))],
                 [("ok", [[1, 1, 1]], [-INF], [3]),
                  ("need", [[1, 0, 0], [1, 1, 1]], [0, 4], [INF, INF])],
                 [1, 1, 1])
    red, post = presolve(ir)
    assert post.infeasible is not None
    assert "need[need, 1]" in post.infeasible
    assert "at least 4" in post.infeasible
    assert red is ir


def test_crossed_bounds_from_singleton_rows_name_variable_and_rows():
    ir = make_ir([("y", "continuous", [0, 0], [10, 10])],
                 [("low", [[1, 0]], [3], [INF]), ("high", [[2, 0]], [-INF], [4])],
                 [1, 1])
    _, post = presolve(ir)
    msg = post.infeasible
    assert msg is not None
    assert "y[y, 0]" in msg and "low[low, 0]" in msg and "high[high, 0]" in msg


def test_integer_rounding_proves_infeasibility():
    # 2 n = 3 has no integer solution: bounds become [2, 1] after rounding
    ir = make_ir([("n", "integer", [0], [5])], [("odd", [[2]], [3], [3])], [1])
    _, post = presolve(ir)
    assert post.infeasible is not None and "n[n, 0]" in post.infeasible
    assert "odd[odd, 0]" in post.infeasible


def test_violated_empty_row_after_fixing_is_named():
    # x is fixed at 1 by its bounds; the row 2 x + 0 >= 3 becomes 0 >= 1 once x is removed
    ir = make_ir([("x", "continuous", [1, 0], [1, 5])],
                 [("r", [[2, 0], [0, 1]], [3, -INF], [INF, 4])], [1, 1])
    _, post = presolve(ir)
    assert post.infeasible is not None and "r[r, 0]" in post.infeasible


def test_trivial_infeasibility_without_presolve():
    ir = make_ir([("x", "continuous", [2], [1])], [], [1])
    assert "x[x, 0]" in trivial_infeasibility(ir)
    ir = make_ir([("x", "continuous", [0], [1])], [("e", [[0]], [1], [INF])], [1])
    assert "e[e, 0]" in trivial_infeasibility(ir)
    assert trivial_infeasibility(forcing_model()) is None


# --------------------------------------------------------------------------- random check

def _random_model(rng):
    n = int(rng.integers(2, 8))
    kinds = rng.choice(["binary", "integer"], size=n, p=[0.7, 0.3])
    lb = np.where(kinds == "binary", 0, rng.integers(-2, 1, size=n)).astype(float)
    ub = np.where(kinds == "binary", 1, rng.integers(0, 3, size=n)).astype(float)
    m = int(rng.integers(1, 7))
    A = rng.integers(-3, 4, size=(m, n)) * (rng.random((m, n)) < 0.5)
    for i in range(m):  # some singleton rows
        if rng.random() < 0.3:
            keep = rng.integers(0, n)
            A[i] = 0
            A[i, keep] = rng.choice([-2, -1, 1, 2])
    lo = rng.integers(-4, 3, size=m).astype(float)
    hi = lo + rng.integers(0, 5, size=m)
    lo[rng.random(m) < 0.3] = -INF
    hi[rng.random(m) < 0.3] = INF
    eq = rng.random(m) < 0.15
    hi[eq & np.isfinite(lo)] = lo[eq & np.isfinite(lo)]
    fams = [("v", "integer", lb, ub)]
    if (kinds == "binary").all():
        fams = [("v", "binary", lb, ub)]
    c = rng.integers(-5, 6, size=n).astype(float)
    return make_ir(fams, [("r", A, lo, hi)], c, sense=rng.choice(["min", "max"]),
                   constant=float(rng.integers(-3, 4)))


def test_random_models_keep_their_optimum_and_feasibility():
    rng = np.random.default_rng(12345)
    infeasible = reduced = 0
    for _ in range(300):
        ir = _random_model(rng)
        best, _ = brute_force(ir)
        with np.errstate(invalid="raise"):
            red, post = presolve(ir)
        if post.infeasible is not None:
            assert best is None, post.infeasible  # presolve never cuts feasible models
            infeasible += 1
            continue
        reduced += red.n_columns < ir.n_columns
        red_best, red_x = brute_force(red)
        if best is None:
            assert red_best is None
            continue
        assert red_best == pytest.approx(best)
        x = post(red_x)
        assert feasible(ir, x)
        assert float(ir.objective.c @ x + ir.objective.constant) == pytest.approx(best)
    assert infeasible > 5 and reduced > 50  # the sample exercises both paths


def test_large_model_is_presolved_quickly():
    """200k binaries in 100k forcing rows x[2i] + x[2i+1] <= 0, 100k singleton rows
    y[i] >= 1, and 100k columns z under one loose knapsack: only z stays. Vectorized, so
    this takes well under a second (a per-row Python loop would take many)."""
    n = 100_000
    ncol = 4 * n
    pairs = np.arange(n)
    A1 = sp.csr_matrix((np.ones(2 * n), (np.repeat(pairs, 2), np.arange(2 * n))),
                       shape=(n, ncol))
    A2 = sp.csr_matrix((np.ones(n), (pairs, 2 * n + pairs)), shape=(n, ncol))
    A3 = sp.csr_matrix((np.ones(n), (np.zeros(n, dtype=int), 3 * n + pairs)), shape=(1, ncol))
    fams = [VarFamily("x", [(i,) for i in range(2 * n)], "binary", np.zeros(2 * n),
                      np.ones(2 * n)),
            VarFamily("y", [(i,) for i in range(n)], "binary", np.zeros(n), np.ones(n),
                      offset=2 * n),
            VarFamily("z", [(i,) for i in range(n)], "binary", np.zeros(n), np.ones(n),
                      offset=3 * n)]
    blocks = [ConstraintBlock("pair", [(i,) for i in range(n)], A1, np.full(n, -INF),
                              np.zeros(n)),
              ConstraintBlock("one", [(i,) for i in range(n)], A2, np.ones(n), np.full(n, INF)),
              ConstraintBlock("cap", [()], A3, np.array([-INF]), np.array([n / 2]))]
    ir = IRModel("big", fams, blocks, Objective("o", "max", np.ones(ncol)))
    red, post = presolve(ir)
    assert post.infeasible is None
    assert red.n_columns == n and red.n_rows == 1
    assert [f.name for f in red.variables] == ["z"]
    assert np.all(post.values[: 2 * n] == 0) and np.all(post.values[2 * n: 3 * n] == 1)
    assert red.objective.constant == n


def test_long_chains_are_cut_by_the_round_limit_and_stay_correct():
    """x0 <= 0 and x[i] >= x[i+1]: each round fixes one more link; the round cap stops
    propagation, the rest is left to the solver, and the optimum is unchanged."""
    n = 12
    A = np.zeros((n, n))
    A[0, 0] = 1
    for i in range(n - 1):
        A[i + 1, i], A[i + 1, i + 1] = 1, -1
    lo = np.r_[-INF, np.zeros(n - 1)]
    hi = np.r_[0.0, np.full(n - 1, INF)]
    ir = make_ir([("x", "binary", np.zeros(n), np.ones(n))], [("chain", A, lo, hi)],
                 np.arange(1, n + 1), sense="max")
    red, post = presolve(ir, max_rounds=4)
    assert 0 < red.n_columns < n and post.stats["rounds"] == 4
    best, _ = brute_force(ir)
    red_best, red_x = brute_force(red)
    assert red_best == pytest.approx(best) == 0
    assert feasible(ir, post(red_x))
    full, post_full = presolve(ir)
    assert full.n_columns == 0 and np.all(post_full.values == 0)
