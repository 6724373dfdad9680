"""A generic presolve on the IR: fix what the domain forces, before any backend sees it.

`presolve(ir)` returns a smaller `IRModel` (same family and block names, the surviving keys)
and a `Postsolve` that maps a solution of the reduced model back to every original column.
Reductions, repeated until nothing changes (at most `max_rounds` rounds):

* integer and binary bounds are rounded (ceil lb, floor ub, with a tolerance);
* a column whose bounds meet is fixed: it leaves the model, its contribution moves into the
  row bounds and the objective constant;
* an empty row is checked and dropped; a singleton row becomes a bound on its column;
* row activity bounds from column bounds: a row that cannot be satisfied proves
  infeasibility; a *forcing* row (min activity == hi, or max activity == lo) fixes every
  column in it at the bound that attains it; a side the activity can never reach is dropped
  (and a row with no side left disappears);
* a column that no longer appears in any row is fixed at the bound its objective
  coefficient prefers (at 0 clipped to its bounds when the coefficient is 0).

Everything is computed on whole arrays (numpy/scipy), no Python loop over rows or columns.
When presolve proves the model infeasible it returns the input model and a `Postsolve`
whose `infeasible` is a message naming the constraint row or variable concerned.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from .ir import ConstraintBlock, IRModel, Objective, VarFamily

FEAS_TOL = 1e-9  # relative tolerance on row and bound feasibility
INT_TOL = 1e-6  # how far from an integer a bound may be and still round to it


@dataclass
class Postsolve:
    """Maps a solution of the reduced model back to the original columns."""

    n_columns: int  # columns of the original model
    kept: np.ndarray  # original index of each reduced column, increasing
    values: np.ndarray  # original-length; the fixed value of every removed column
    infeasible: str | None = None  # set when presolve proved the model infeasible
    stats: dict = field(default_factory=dict)

    def __call__(self, x_reduced) -> np.ndarray:
        return self.expand(x_reduced)

    def expand(self, x_reduced) -> np.ndarray:
        """Values of all original columns from values of the reduced columns."""
        x_reduced = np.asarray(x_reduced, dtype=float).ravel()
        if x_reduced.shape[0] != self.kept.shape[0]:
            raise ValueError(f"reduced solution has {x_reduced.shape[0]} values, "
                             f"the reduced model {self.kept.shape[0]} columns")
        x = self.values.copy()
        x[self.kept] = x_reduced
        return x

    def restrict(self, x_full) -> np.ndarray:
        """The reduced columns' part of an original-length vector (e.g. a warm start)."""
        x_full = np.asarray(x_full, dtype=float).ravel()
        if x_full.shape[0] != self.n_columns:
            raise ValueError(f"vector has {x_full.shape[0]} values, "
                             f"the model {self.n_columns} columns")
        return x_full[self.kept]

    @property
    def fixed(self) -> np.ndarray:
        """Boolean mask over original columns: True where presolve fixed the column."""
        mask = np.ones(self.n_columns, dtype=bool)
        mask[self.kept] = False
        return mask

    def summary(self) -> str:
        s = self.stats
        if not s or not (s.get("columns_removed") or s.get("rows_removed")):
            return ""
        return (f"presolve: {s['columns_removed']} of {s['columns']} columns and "
                f"{s['rows_removed']} of {s['rows']} rows removed in {s['rounds']} rounds")

    def then(self, inner: "Postsolve") -> "Postsolve":
        """This postsolve after `inner`, a presolve of this one's reduced model: one map
        from `inner`'s reduced columns to the original ones (statistics added up)."""
        stats = dict(self.stats)
        for key in ("columns_removed", "rows_removed", "rounds"):
            stats[key] = stats.get(key, 0) + inner.stats.get(key, 0)
        return Postsolve(self.n_columns, self.kept[inner.kept], self.expand(inner.values),
                         stats=stats)

    @classmethod
    def identity(cls, ir: IRModel) -> "Postsolve":
        n = ir.n_columns
        return cls(n, np.arange(n), np.zeros(n))


# --------------------------------------------------------------------------- naming helpers

def format_key(key) -> str:
    if key is None or key == ():
        return ""
    if not isinstance(key, tuple):
        key = (key,)
    return "[" + ", ".join(str(k) for k in key) + "]"


def _where(loc) -> str:
    return f" (declared at {loc})" if loc is not None and getattr(loc, "line", 0) else ""


class _Names:
    """Maps global row/column indices back to block/family names and keys."""

    def __init__(self, ir: IRModel):
        self.ir = ir
        self.col_starts = np.array([f.offset for f in ir.variables], dtype=np.int64)
        sizes = [b.size for b in ir.constraints]
        self.row_starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)

    def column(self, j: int) -> str:
        fi = int(np.searchsorted(self.col_starts, j, side="right") - 1)
        fam = self.ir.variables[fi]
        return f"{fam.name}{format_key(fam.keys[j - fam.offset])}"

    def column_loc(self, j: int):
        fi = int(np.searchsorted(self.col_starts, j, side="right") - 1)
        return self.ir.variables[fi].loc

    def row(self, i: int) -> str:
        bi = int(np.searchsorted(self.row_starts, i, side="right") - 1)
        blk = self.ir.constraints[bi]
        return f"{blk.name}{format_key(blk.keys[i - self.row_starts[bi]])}"

    def row_loc(self, i: int):
        bi = int(np.searchsorted(self.row_starts, i, side="right") - 1)
        return self.ir.constraints[bi].loc


def _num(v: float) -> str:
    return f"{v:.10g}"


# --------------------------------------------------------------------------- checks

def trivial_infeasibility(ir: IRModel) -> str | None:
    """Infeasibility visible without reducing anything: crossed bounds, violated empty rows.

    Used when presolve is off: such models cannot be given to every backend (a row without
    variables is a constant constraint).
    """
    names = _Names(ir)
    lb, ub = ir.column_bounds()
    bad = np.flatnonzero(lb > ub + FEAS_TOL * np.maximum(1.0, _finite_abs(ub)))
    if bad.size:
        j = int(bad[0])
        return (f"variable {names.column(j)} has lower bound {_num(lb[j])} above its upper "
                f"bound {_num(ub[j])}{_where(names.column_loc(j))}")
    A, lo, hi = ir.stacked()
    counts = np.diff(A.indptr)
    tol = FEAS_TOL * (1.0 + np.maximum(_finite_abs(lo), _finite_abs(hi)))
    bad = np.flatnonzero((counts == 0) & ((lo > tol) | (hi < -tol)))
    if bad.size:
        i = int(bad[0])
        return (f"constraint {names.row(i)} has no variables and requires "
                f"{_range_text(lo[i], hi[i])} of 0{_where(names.row_loc(i))}")
    return None


def _finite_abs(v: np.ndarray) -> np.ndarray:
    return np.where(np.isfinite(v), np.abs(v), 0.0)


def _range_text(lo: float, hi: float) -> str:
    if lo == hi:
        return f"a value of {_num(lo)} instead"
    if np.isinf(lo):
        return f"at most {_num(hi)} instead"
    if np.isinf(hi):
        return f"at least {_num(lo)} instead"
    return f"a value in [{_num(lo)}, {_num(hi)}] instead"


# --------------------------------------------------------------------------- presolve

class _Infeasible(Exception):
    pass


def presolve(ir: IRModel, max_rounds: int = 50) -> tuple[IRModel, Postsolve]:
    """Reduce `ir`; see the module docstring. Returns (reduced model, postsolve)."""
    n = ir.n_columns
    names = _Names(ir)
    A, lo, hi = ir.stacked()
    A = sp.csr_matrix(A, dtype=float, copy=True)
    A.sum_duplicates()
    A.eliminate_zeros()
    m = A.shape[0]
    lo = lo.astype(float).copy()
    hi = hi.astype(float).copy()
    lb, ub = (v.astype(float).copy() for v in ir.column_bounds())
    is_int = ir.integrality()
    obj = ir.objective
    c = obj.c.astype(float) if obj is not None else np.zeros(n)
    cmin = -c if (obj is not None and obj.sense == "max") else c  # minimisation sense

    # Entries as three parallel arrays, compacted as rows and columns disappear.
    er = np.repeat(np.arange(m, dtype=np.int64), np.diff(A.indptr))
    ej = A.indices.astype(np.int64)
    ea = A.data.copy()

    row_alive = np.ones(m, dtype=bool)
    col_alive = np.ones(n, dtype=bool)
    value = np.zeros(n)  # the value of each fixed column
    shift = np.zeros(m)  # fixed contributions moved out of each row (for messages)
    lb_src = np.full(n, -1, dtype=np.int64)  # the row that last tightened a bound
    ub_src = np.full(n, -1, dtype=np.int64)
    stats = {"columns": n, "rows": m, "rounds": 0, "bounds_tightened": 0,
             "forcing_rows": 0, "singleton_rows": 0, "empty_columns": 0}

    def bound_problem(j: int) -> str:
        text = (f"variable {names.column(j)} cannot take a value: its lower bound "
                f"{_num(lb[j])} is above its upper bound {_num(ub[j])}")
        srcs = [s for s in (lb_src[j], ub_src[j]) if s >= 0]
        if srcs:
            text += " (implied by constraint " + " and ".join(
                names.row(int(s)) + _where(names.row_loc(int(s))) for s in srcs) + ")"
        else:
            text += _where(names.column_loc(j))
        return text

    def round_integer_bounds() -> None:
        idx = np.flatnonzero(is_int & col_alive)
        if idx.size:
            lb[idx] = np.ceil(lb[idx] - INT_TOL)
            ub[idx] = np.floor(ub[idx] + INT_TOL)

    def check_bounds():
        alive_idx = np.flatnonzero(col_alive)
        span = ub[alive_idx] - lb[alive_idx]
        tol = FEAS_TOL * np.maximum(1.0, _finite_abs(ub[alive_idx]))
        crossed = alive_idx[(span < -tol) | np.isposinf(lb[alive_idx])
                            | np.isneginf(ub[alive_idx])]
        if crossed.size:
            msg = bound_problem(int(crossed[0]))
            if crossed.size > 1:
                msg += f"; {crossed.size - 1} more variables have crossed bounds"
            raise _Infeasible(msg)
        return alive_idx, span, tol

    try:
        for rnd in range(max_rounds):
            stats["rounds"] = rnd + 1
            changed = False

            # 1. bounds: round, check, fix the columns whose bounds meet ----------------------
            round_integer_bounds()
            alive_idx, span, tol = check_bounds()
            newly = alive_idx[(span <= tol) & np.isfinite(lb[alive_idx])
                              & np.isfinite(ub[alive_idx])]
            if newly.size:
                changed = True
                value[newly] = np.where(lb[newly] <= ub[newly], lb[newly],
                                        0.5 * (lb[newly] + ub[newly]))
                col_alive[newly] = False
                hit = ~col_alive[ej]
                if hit.any():
                    contrib = np.bincount(er[hit], weights=ea[hit] * value[ej[hit]], minlength=m)
                    lo -= contrib  # -inf and +inf stay infinite
                    hi -= contrib
                    shift += contrib
                    keep = ~hit
                    er, ej, ea = er[keep], ej[keep], ea[keep]

            # 2. empty and singleton rows -----------------------------------------------------
            counts = np.bincount(er, minlength=m)
            rtol = FEAS_TOL * (1.0 + np.maximum(_finite_abs(lo), _finite_abs(hi)))
            empty = np.flatnonzero(row_alive & (counts == 0))
            if empty.size:
                bad = empty[(lo[empty] > rtol[empty]) | (hi[empty] < -rtol[empty])]
                if bad.size:
                    i = int(bad[0])
                    msg = (f"constraint {names.row(i)} cannot be satisfied: once the variables "
                           f"forced by the model are fixed it reads {_num(shift[i])} in "
                           f"[{_num(lo[i] + shift[i])}, {_num(hi[i] + shift[i])}]"
                           f"{_where(names.row_loc(i))}")
                    if bad.size > 1:
                        msg += f"; {bad.size - 1} more rows are violated"
                    raise _Infeasible(msg)
                row_alive[empty] = False
                changed = True

            single = (counts[er] == 1)
            if single.any():
                r, j, a = er[single], ej[single], ea[single]
                pos = a > 0
                with np.errstate(invalid="ignore", divide="ignore"):
                    new_lb = np.where(pos, lo[r] / a, hi[r] / a)
                    new_ub = np.where(pos, hi[r] / a, lo[r] / a)
                _tighten(lb, ub, lb_src, ub_src, j, r, new_lb, new_ub, stats)
                row_alive[r] = False
                stats["singleton_rows"] += int(r.size)
                keep = ~single
                er, ej, ea = er[keep], ej[keep], ea[keep]
                round_integer_bounds()
                check_bounds()  # activity bounds below assume lb <= ub
                changed = True

            # 3. activity bounds: infeasible, forcing and redundant rows ---------------------
            if er.size:
                lj, uj = lb[ej], ub[ej]
                pos = ea > 0
                tmin = np.where(pos, ea * lj, ea * uj)  # each term's smallest value
                tmax = np.where(pos, ea * uj, ea * lj)
                inf_min = np.isinf(tmin)
                inf_max = np.isinf(tmax)
                n_inf_min = np.bincount(er, weights=inf_min, minlength=m)
                n_inf_max = np.bincount(er, weights=inf_max, minlength=m)
                s_min = np.bincount(er, weights=np.where(inf_min, 0.0, tmin), minlength=m)
                s_max = np.bincount(er, weights=np.where(inf_max, 0.0, tmax), minlength=m)
                mag = np.bincount(er, weights=np.where(inf_min, 0.0, np.abs(tmin))
                                  + np.where(inf_max, 0.0, np.abs(tmax)), minlength=m)
                minact = np.where(n_inf_min > 0, -np.inf, s_min)
                maxact = np.where(n_inf_max > 0, np.inf, s_max)
                rtol = (FEAS_TOL * (1.0 + np.maximum(_finite_abs(lo), _finite_abs(hi)))
                        + 1e-12 * mag)
                live = row_alive
                over = live & (minact > hi + rtol)
                under = live & (maxact < lo - rtol)
                if over.any() or under.any():
                    i = int(np.flatnonzero(over | under)[0])
                    if over[i]:
                        detail = (f"its smallest possible value is {_num(minact[i] + shift[i])} "
                                  f"but it must be at most {_num(hi[i] + shift[i])}")
                    else:
                        detail = (f"its largest possible value is {_num(maxact[i] + shift[i])} "
                                  f"but it must be at least {_num(lo[i] + shift[i])}")
                    msg = (f"constraint {names.row(i)} cannot be satisfied: {detail}"
                           f"{_where(names.row_loc(i))}")
                    extra = int((over | under).sum()) - 1
                    if extra:
                        msg += f"; {extra} more rows cannot be satisfied"
                    raise _Infeasible(msg)

                force_min = live & np.isfinite(minact) & (minact >= hi - rtol)
                force_max = live & np.isfinite(maxact) & (maxact <= lo + rtol) & ~force_min
                if force_min.any() or force_max.any():
                    fe_min = force_min[er]
                    fe_max = force_max[er]
                    # column goes to lb when the term is at its min with a > 0, or at its max
                    # with a < 0; to ub otherwise.
                    to_lb = (fe_min & pos) | (fe_max & ~pos)
                    to_ub = (fe_min & ~pos) | (fe_max & pos)
                    want_lb = np.zeros(n, dtype=bool)
                    want_ub = np.zeros(n, dtype=bool)
                    want_lb[ej[to_lb]] = True
                    want_ub[ej[to_ub]] = True
                    width_tol = FEAS_TOL * np.maximum(1.0, _finite_abs(ub))
                    clash = np.flatnonzero(want_lb & want_ub & (ub - lb > width_tol))
                    if clash.size:
                        j = int(clash[0])
                        rows = np.unique(er[(ej == j) & (to_lb | to_ub)])
                        raise _Infeasible(
                            f"variable {names.column(j)} would have to sit at both of its bounds "
                            f"[{_num(lb[j])}, {_num(ub[j])}] to satisfy constraints "
                            + " and ".join(names.row(int(i)) for i in rows[:2])
                            + _where(names.row_loc(int(rows[0]))))
                    src_rows = np.full(n, -1, dtype=np.int64)
                    src_rows[ej[to_lb]] = er[to_lb]
                    ub_src[want_lb] = src_rows[want_lb]
                    src_rows[ej[to_ub]] = er[to_ub]
                    lb_src[want_ub] = src_rows[want_ub]
                    ub[want_lb] = lb[want_lb]
                    lb[want_ub] = ub[want_ub]
                    stats["forcing_rows"] += int(force_min.sum() + force_max.sum())
                    row_alive[force_min | force_max] = False
                    changed = True

                # sides the activity can never reach are dropped
                drop_lo = live & np.isfinite(lo) & (minact >= lo - rtol)
                drop_hi = live & np.isfinite(hi) & (maxact <= hi + rtol)
                if drop_lo.any() or drop_hi.any():
                    lo[drop_lo] = -np.inf
                    hi[drop_hi] = np.inf
                    changed = True
                free = live & np.isneginf(lo) & np.isposinf(hi)
                if free.any():
                    row_alive[free] = False
                    changed = True

            # drop the entries of dead rows
            keep = row_alive[er]
            if not keep.all():
                er, ej, ea = er[keep], ej[keep], ea[keep]

            # 4. columns left in no row: fix at the bound the objective prefers ----------------
            in_rows = np.zeros(n, dtype=bool)
            in_rows[ej] = True
            lonely = np.flatnonzero(col_alive & ~in_rows)
            if lonely.size:
                cj, lj, uj = cmin[lonely], lb[lonely], ub[lonely]
                target = np.where(cj > 0, lj, np.where(cj < 0, uj, np.clip(0.0, lj, uj)))
                ok = np.isfinite(target) & (lj <= uj)
                sel = lonely[ok]
                if sel.size:
                    lb[sel] = target[ok]
                    ub[sel] = target[ok]
                    stats["empty_columns"] += int(sel.size)
                    changed = True

            if not changed:
                break
        else:
            # out of rounds: still fix what the last round decided
            round_integer_bounds()
        # columns fixed in the last round (bounds met) leave the model too
        alive_idx, span, tol = check_bounds()
        newly = alive_idx[(span <= tol) & np.isfinite(lb[alive_idx]) & np.isfinite(ub[alive_idx])]
        if newly.size:
            value[newly] = lb[newly]
            col_alive[newly] = False
            hit = ~col_alive[ej]
            if hit.any():
                contrib = np.bincount(er[hit], weights=ea[hit] * value[ej[hit]], minlength=m)
                lo -= contrib
                hi -= contrib
    except _Infeasible as exc:
        post = Postsolve.identity(ir)
        post.infeasible = str(exc)
        post.stats = stats
        return ir, post

    kept = np.flatnonzero(col_alive)
    rows_kept = np.flatnonzero(row_alive)
    stats["columns_removed"] = int(n - kept.size)
    stats["rows_removed"] = int(m - rows_kept.size)
    value[kept] = 0.0
    reduced = _build_reduced(ir, A, lo, hi, lb, ub, c, value, kept, row_alive)
    return reduced, Postsolve(n, kept, value, None, stats)


def _tighten(lb, ub, lb_src, ub_src, j, r, new_lb, new_ub, stats) -> None:
    """Tighten column bounds from singleton rows (several rows may hit one column)."""
    old_lb = lb.copy()
    old_ub = ub.copy()
    np.maximum.at(lb, j, new_lb)
    np.minimum.at(ub, j, new_ub)
    got_lb = (new_lb >= lb[j]) & (lb[j] > old_lb[j])
    got_ub = (new_ub <= ub[j]) & (ub[j] < old_ub[j])
    lb_src[j[got_lb]] = r[got_lb]
    ub_src[j[got_ub]] = r[got_ub]
    stats["bounds_tightened"] += int(np.count_nonzero(lb > old_lb) + np.count_nonzero(ub < old_ub))


def _build_reduced(ir: IRModel, A_all: sp.csr_matrix, lo, hi, lb, ub, c, value,
                   kept: np.ndarray, row_alive: np.ndarray) -> IRModel:
    n = ir.n_columns
    new_index = np.full(n, -1, dtype=np.int64)
    new_index[kept] = np.arange(kept.size)
    variables: list[VarFamily] = []
    offset = 0
    for fam in ir.variables:
        cols = np.arange(fam.offset, fam.offset + fam.size)
        local = np.flatnonzero(new_index[cols] >= 0)
        if local.size == 0:
            continue
        g = cols[local]
        keys = fam.keys
        variables.append(VarFamily(
            name=fam.name,
            keys=[keys[i] for i in local.tolist()],
            kind=fam.kind,
            lb=lb[g].copy(), ub=ub[g].copy(),
            offset=offset, loc=fam.loc, doc=fam.doc))
        offset += int(local.size)

    fixed = np.ones(n, dtype=bool)
    fixed[kept] = False
    constraints: list[ConstraintBlock] = []
    start = 0
    for blk in ir.constraints:
        rows = np.arange(start, start + blk.size)
        start += blk.size
        local = np.flatnonzero(row_alive[rows])
        if local.size == 0:
            continue
        g = rows[local]
        Ab = sp.csr_matrix(blk.A, dtype=float)[local][:, kept]
        Ab.sum_duplicates()
        Ab.eliminate_zeros()
        keys = blk.keys
        constraints.append(ConstraintBlock(
            name=blk.name,
            keys=[keys[i] for i in local.tolist()],
            A=sp.csr_matrix(Ab),
            lo=lo[g].copy(), hi=hi[g].copy(), loc=blk.loc))

    objective = None
    if ir.objective is not None:
        o = ir.objective
        constant = float(o.constant) + float(c[fixed] @ value[fixed])
        objective = Objective(name=o.name, sense=o.sense, c=c[kept].copy(),
                              constant=constant, loc=o.loc)
    return IRModel(name=ir.name, variables=variables, constraints=constraints,
                   objective=objective)


