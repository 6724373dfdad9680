"""Proven bounds on an IR's objective, with no solver: over the column bounds alone
(`box_bound`), from any row multipliers (`lagrangian_bound`), moved to the next value the
objective can take (`objective_step`, `round_bound`), and the integer columns' bounds a MIP
start's objective value allows (`cutoff_bounds`, reduced-cost fixing).

Read by presolve's caller (the MIP-start cutoff) and by the status table (a bound when a
solver stops without one); both import them from here.
"""
from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from math import gcd, lcm

import numpy as np

from .ir import IRModel, VarFamily
from .presolve import INT_TOL


def lagrangian_bound(ir: IRModel, y: np.ndarray | None = None) -> tuple[float, np.ndarray] | None:
    """A proven lower bound on the objective (min sense; a max objective is negated) from row
    multipliers `y` (any values: an LP relaxation's duals give the LP's bound), and the
    reduced costs d = c - A'y it rests on: for every x within the rows and column bounds,
    c.x = y.(Ax) + d.x >= sum_i min(y_i lo_i, y_i hi_i) + sum_j min(d_j lb_j, d_j ub_j).
    A multiplier whose row side is infinite is taken as 0. y=None: all 0 (the box bound).
    None when a needed column bound is infinite."""
    obj = ir.objective
    if obj is None:
        return None
    c = obj.c if obj.sense == "min" else -obj.c
    lb, ub = ir.column_bounds()
    base = 0.0
    d = np.asarray(c, dtype=float)
    if y is not None and ir.n_rows:
        A, lo, hi = ir.stacked()
        y = np.asarray(y, dtype=float).copy()
        y[(y > 0) & ~np.isfinite(lo)] = 0.0
        y[(y < 0) & ~np.isfinite(hi)] = 0.0
        side = np.where(y > 0, lo, np.where(y < 0, hi, 0.0))
        base = float(np.dot(y, side))
        d = d - A.T @ y
    best = np.where(d > 0, lb, np.where(d < 0, ub, 0.0))
    used = d != 0
    if not np.all(np.isfinite(best[used])):
        return None
    return base + float(d[used] @ best[used]), d



def cutoff_bounds(ir: IRModel, x: np.ndarray, y: np.ndarray | None = None
                  ) -> tuple[IRModel, int, float | None]:
    """`ir` with the integer columns' bounds tightened by the objective value z of `x`, a
    feasible point (a MIP start): the model with these bounds keeps every point at least as
    good as `x` (so every optimum, and `x` itself), and its bounds are the original model's.

    From the proven bound L and reduced costs d of `lagrangian_bound(ir, y)` (min sense),
    c.x >= L + d_j (x_j - lb_j) for d_j > 0, so a point no worse than z has
    x_j <= lb_j + floor((z - L) / d_j), and likewise x_j >= ub_j - floor((z - L) / -d_j) for
    d_j < 0 (reduced-cost fixing). y=None uses the objective's own coefficients (on the
    Checkmate model: no better plan recomputes a node that costs more than the incumbent's
    recomputations; mobilenet_train at 90%: 9,017 of 17,020 columns); an LP relaxation's
    duals fix far more. Returns (the model, the number of bounds tightened, L in the model's
    sense, or None); `ir` itself when nothing is tightened."""
    lag = lagrangian_bound(ir, y)
    is_int = ir.integrality()
    if lag is None or not is_int.any():
        return ir, 0, None
    low, d = lag
    step = objective_step(ir)  # c.x takes multiples of step: round the bound up to one
    if step is not None and abs(low / step) < 1e8:  # (as `round_bound`)
        low = step * np.ceil(low / step - 1e-3)
    sense = 1.0 if ir.objective.sense == "min" else -1.0
    bound = sense * low + float(ir.objective.constant)
    x = np.asarray(x, dtype=float).ravel()
    c = ir.objective.c if ir.objective.sense == "min" else -ir.objective.c
    z = float(c @ x)
    lb, ub = ir.column_bounds()
    # rounding in d and L: a margin relative to the magnitudes summed
    margin = 1e-7 * (1.0 + abs(z) + abs(low))
    slack = z - low + margin
    if not np.isfinite(slack) or slack < 0:  # x is not inside (or the multipliers are off)
        return ir, 0, None
    new_lb, new_ub = lb.copy(), ub.copy()
    up = is_int & (d > 0) & np.isfinite(lb)
    down = is_int & (d < 0) & np.isfinite(ub)
    new_ub[up] = np.minimum(ub[up], lb[up] + np.floor(slack / d[up] + INT_TOL))
    new_lb[down] = np.maximum(lb[down], ub[down] - np.floor(slack / -d[down] + INT_TOL))
    # x stays inside (it does by the argument above; rounding must not cut it off)
    xr = np.where(np.isfinite(x), np.round(x), 0.0)
    new_ub = np.where(up, np.maximum(new_ub, xr), new_ub)
    new_lb = np.where(down, np.minimum(new_lb, xr), new_lb)
    count = int(np.count_nonzero(new_ub < ub) + np.count_nonzero(new_lb > lb))
    if count == 0:
        return ir, 0, bound
    families = []
    for f in ir.variables:
        cols = slice(f.offset, f.offset + f.size)
        families.append(VarFamily(f.name, f.keys, f.kind, new_lb[cols], new_ub[cols],
                                  f.offset, f.loc, f.doc))
    return replace(ir, variables=families), count, bound


def box_bound(model: IRModel) -> float | None:
    """The objective's best value over the columns' bounds alone (rows ignored): a proven
    bound, none tighter than a solver's, but there when the solver stops before reporting
    one. After presolve it counts the columns presolve fixed (Checkmate: each node computed
    once in its own stage, the sum of the node times). None if a needed bound is infinite.
    (`lagrangian_bound` with every row multiplier 0.)"""
    lag = lagrangian_bound(model)
    if lag is None:
        return None
    return (lag[0] if model.objective.sense == "min" else -lag[0]) + float(model.objective.constant)



def objective_step(ir: IRModel) -> float | None:
    """g > 0 when every integer point's objective is the constant plus a multiple of g: the
    columns with a nonzero cost are all integer and their costs are integer multiples of g
    (exact fractions of denominator <= 10^6, each within a relative 1e-12 of the cost), and
    g is at least 1e-5 of the largest cost. None otherwise. HiGHS finds the same ("objective
    function is integral with scale 1/g")."""
    o = ir.objective
    if o is None:
        return None
    used = o.c != 0
    if not used.any() or not ir.integrality()[used].all():
        return None
    num, den = 0, 1
    for v in np.unique(np.abs(o.c[used])):
        f = Fraction(float(v)).limit_denominator(10**6)
        if abs(float(f) - v) > 1e-12 * v:
            return None
        num, den = gcd(num * (lcm(den, f.denominator) // den),
                       f.numerator * (lcm(den, f.denominator) // f.denominator)), \
            lcm(den, f.denominator)
        if den > 10**9:  # no common step worth rounding to
            return None
    step = num / den if num else 0.0
    return step if step >= 1e-5 * float(np.max(np.abs(o.c[used]))) else None



def round_bound(ir: IRModel, bound: float | None) -> float | None:
    """A proven bound moved to the next value the objective can take (`objective_step`):
    up for a min objective, down for a max one. A point at a gap below one step from the
    bound is optimal: HiGHS stops there ("Optimal") and reports the bound unrounded, e.g.
    rockmate on transformer12 at 30% (step 0.0004): objective 0.0901, bound 0.08978."""
    if bound is None or not np.isfinite(bound):
        return bound
    step = objective_step(ir)
    if step is None:
        return bound
    k = (bound - ir.objective.constant) / step
    # the costs are within 1e-12 of the grid, so an objective is within 1e-12 * |k| steps of
    # its grid point: below 1e8 steps that is far inside the 1e-3 step tolerance used here
    if not abs(k) < 1e8:
        return bound
    k = np.ceil(k - 1e-3) if ir.objective.sense == "min" else np.floor(k + 1e-3)
    return float(ir.objective.constant + k * step)
