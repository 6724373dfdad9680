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

    def then(self, inner: Postsolve) -> Postsolve:
        """This postsolve after `inner`, a presolve of this one's reduced model: one map
        from `inner`'s reduced columns to the original ones (statistics added up)."""
        stats = dict(self.stats)
        for key in ("columns_removed", "rows_removed", "rounds"):
            stats[key] = stats.get(key, 0) + inner.stats.get(key, 0)
        return Postsolve(self.n_columns, self.kept[inner.kept], self.expand(inner.values),
                         stats=stats)

    @classmethod
    def identity(cls, ir: IRModel) -> Postsolve:
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
    state = _Presolver(ir)
    try:
        for rnd in range(max_rounds):
            state.stats["rounds"] = rnd + 1
            changed = state.fix_met_columns()
            changed = state.empty_and_singleton_rows() or changed
            changed = state.activity_bounds() or changed
            changed = state.lonely_columns() or changed
            if not changed:
                break
        else:
            # out of rounds: still fix what the last round decided
            state.round_integer_bounds()
        state.fix_last_round()
    except _Infeasible as exc:
        post = Postsolve.identity(ir)
        post.infeasible = str(exc)
        post.stats = state.stats
        return ir, post
    return state.reduced()


class _Presolver:
    """The state of one presolve: the matrix as three parallel arrays of entries (compacted as
    rows and columns disappear), row sides, column bounds and which rows and columns are
    alive; one method per reduction of the module docstring, each saying whether it changed
    anything."""

    def __init__(self, ir: IRModel) -> None:
        self.ir = ir
        self.n = ir.n_columns
        self.names = _Names(ir)
        self.A, self.lo, self.hi = ir.stacked()
        self.A = sp.csr_matrix(self.A, dtype=float, copy=True)
        self.A.sum_duplicates()
        self.A.eliminate_zeros()
        self.m = self.A.shape[0]
        self.lo = self.lo.astype(float).copy()
        self.hi = self.hi.astype(float).copy()
        self.lb, self.ub = (v.astype(float).copy() for v in ir.column_bounds())
        self.is_int = ir.integrality()
        obj = ir.objective
        self.c = obj.c.astype(float) if obj is not None else np.zeros(self.n)
        # the objective in the minimisation sense
        self.cmin = -self.c if (obj is not None and obj.sense == "max") else self.c

        # Entries as three parallel arrays, compacted as rows and columns disappear.
        self.er = np.repeat(np.arange(self.m, dtype=np.int64), np.diff(self.A.indptr))
        self.ej = self.A.indices.astype(np.int64)
        self.ea = self.A.data.copy()

        self.row_alive = np.ones(self.m, dtype=bool)
        self.col_alive = np.ones(self.n, dtype=bool)
        self.value = np.zeros(self.n)  # the value of each fixed column
        self.shift = np.zeros(self.m)  # fixed contributions moved out of each row (for messages)
        self.lb_src = np.full(self.n, -1, dtype=np.int64)  # the row that last tightened a bound
        self.ub_src = np.full(self.n, -1, dtype=np.int64)
        self.stats = {"columns": self.n, "rows": self.m, "rounds": 0, "bounds_tightened": 0,
                      "forcing_rows": 0, "singleton_rows": 0, "empty_columns": 0}

    def bound_problem(self, j: int) -> str:
        text = (f"variable {self.names.column(j)} cannot take a self.value: its lower bound "
                f"{_num(self.lb[j])} is above its upper bound {_num(self.ub[j])}")
        srcs = [s for s in (self.lb_src[j], self.ub_src[j]) if s >= 0]
        if srcs:
            text += " (implied by constraint " + " and ".join(
                self.names.row(int(s)) + _where(self.names.row_loc(int(s))) for s in srcs) + ")"
        else:
            text += _where(self.names.column_loc(j))
        return text

    def round_integer_bounds(self) -> None:
        idx = np.flatnonzero(self.is_int & self.col_alive)
        if idx.size:
            self.lb[idx] = np.ceil(self.lb[idx] - INT_TOL)
            self.ub[idx] = np.floor(self.ub[idx] + INT_TOL)

    def check_bounds(self):
        alive_idx = np.flatnonzero(self.col_alive)
        span = self.ub[alive_idx] - self.lb[alive_idx]
        tol = FEAS_TOL * np.maximum(1.0, _finite_abs(self.ub[alive_idx]))
        crossed = alive_idx[(span < -tol) | np.isposinf(self.lb[alive_idx])
                            | np.isneginf(self.ub[alive_idx])]
        if crossed.size:
            msg = self.bound_problem(int(crossed[0]))
            if crossed.size > 1:
                msg += f"; {crossed.size - 1} more variables have crossed bounds"
            raise _Infeasible(msg)
        return alive_idx, span, tol

    def fix_met_columns(self) -> bool:
        """Round and check the bounds; fix the columns whose bounds meet."""
        changed = False
        # 1. bounds: round, check, fix the columns whose bounds meet ----------------------
        self.round_integer_bounds()
        alive_idx, span, tol = self.check_bounds()
        newly = alive_idx[(span <= tol) & np.isfinite(self.lb[alive_idx])
                          & np.isfinite(self.ub[alive_idx])]
        if newly.size:
            changed = True
            self.value[newly] = np.where(self.lb[newly] <= self.ub[newly], self.lb[newly],
                                    0.5 * (self.lb[newly] + self.ub[newly]))
            self.col_alive[newly] = False
            hit = ~self.col_alive[self.ej]
            if hit.any():
                contrib = np.bincount(self.er[hit], weights=self.ea[hit] * self.value[self.ej[hit]], minlength=self.m)
                self.lo -= contrib  # -inf and +inf stay infinite
                self.hi -= contrib
                self.shift += contrib
                keep = ~hit
                self.er, self.ej, self.ea = self.er[keep], self.ej[keep], self.ea[keep]
        return changed

    def empty_and_singleton_rows(self) -> bool:
        """Check and drop empty rows; a singleton row becomes a bound."""
        changed = False
        # 2. empty and singleton rows -----------------------------------------------------
        counts = np.bincount(self.er, minlength=self.m)
        rtol = FEAS_TOL * (1.0 + np.maximum(_finite_abs(self.lo), _finite_abs(self.hi)))
        empty = np.flatnonzero(self.row_alive & (counts == 0))
        if empty.size:
            bad = empty[(self.lo[empty] > rtol[empty]) | (self.hi[empty] < -rtol[empty])]
            if bad.size:
                i = int(bad[0])
                msg = (f"constraint {self.names.row(i)} cannot be satisfied: once the variables "
                       f"forced by the model are fixed it reads {_num(self.shift[i])} in "
                       f"[{_num(self.lo[i] + self.shift[i])}, {_num(self.hi[i] + self.shift[i])}]"
                       f"{_where(self.names.row_loc(i))}")
                if bad.size > 1:
                    msg += f"; {bad.size - 1} more rows are violated"
                raise _Infeasible(msg)
            self.row_alive[empty] = False
            changed = True

        single = (counts[self.er] == 1)
        if single.any():
            r, j, a = self.er[single], self.ej[single], self.ea[single]
            pos = a > 0
            with np.errstate(invalid="ignore", divide="ignore"):
                new_lb = np.where(pos, self.lo[r] / a, self.hi[r] / a)
                new_ub = np.where(pos, self.hi[r] / a, self.lo[r] / a)
            _tighten(self.lb, self.ub, self.lb_src, self.ub_src, j, r, new_lb, new_ub, self.stats)
            self.row_alive[r] = False
            self.stats["singleton_rows"] += int(r.size)
            keep = ~single
            self.er, self.ej, self.ea = self.er[keep], self.ej[keep], self.ea[keep]
            self.round_integer_bounds()
            self.check_bounds()  # activity bounds below assume lb <= ub
            changed = True
        return changed

    def activity_bounds(self) -> bool:
        """Row activity bounds: infeasible, forcing and redundant rows; then the entries of
        dead rows go."""
        changed = False
        # 3. activity bounds: infeasible, forcing and redundant rows ---------------------
        if self.er.size:
            lj, uj = self.lb[self.ej], self.ub[self.ej]
            pos = self.ea > 0
            tmin = np.where(pos, self.ea * lj, self.ea * uj)  # each term's smallest value
            tmax = np.where(pos, self.ea * uj, self.ea * lj)
            inf_min = np.isinf(tmin)
            inf_max = np.isinf(tmax)
            n_inf_min = np.bincount(self.er, weights=inf_min, minlength=self.m)
            n_inf_max = np.bincount(self.er, weights=inf_max, minlength=self.m)
            s_min = np.bincount(self.er, weights=np.where(inf_min, 0.0, tmin), minlength=self.m)
            s_max = np.bincount(self.er, weights=np.where(inf_max, 0.0, tmax), minlength=self.m)
            mag = np.bincount(self.er, weights=np.where(inf_min, 0.0, np.abs(tmin))
                              + np.where(inf_max, 0.0, np.abs(tmax)), minlength=self.m)
            minact = np.where(n_inf_min > 0, -np.inf, s_min)
            maxact = np.where(n_inf_max > 0, np.inf, s_max)
            rtol = (FEAS_TOL * (1.0 + np.maximum(_finite_abs(self.lo), _finite_abs(self.hi)))
                    + 1e-12 * mag)
            live = self.row_alive
            over = live & (minact > self.hi + rtol)
            under = live & (maxact < self.lo - rtol)
            if over.any() or under.any():
                i = int(np.flatnonzero(over | under)[0])
                if over[i]:
                    detail = (f"its smallest possible self.value is {_num(minact[i] + self.shift[i])} "
                              f"but it must be at most {_num(self.hi[i] + self.shift[i])}")
                else:
                    detail = (f"its largest possible self.value is {_num(maxact[i] + self.shift[i])} "
                              f"but it must be at least {_num(self.lo[i] + self.shift[i])}")
                msg = (f"constraint {self.names.row(i)} cannot be satisfied: {detail}"
                       f"{_where(self.names.row_loc(i))}")
                extra = int((over | under).sum()) - 1
                if extra:
                    msg += f"; {extra} more rows cannot be satisfied"
                raise _Infeasible(msg)

            force_min = live & np.isfinite(minact) & (minact >= self.hi - rtol)
            force_max = live & np.isfinite(maxact) & (maxact <= self.lo + rtol) & ~force_min
            if force_min.any() or force_max.any():
                fe_min = force_min[self.er]
                fe_max = force_max[self.er]
                # column goes to lb when the term is at its min with a > 0, or at its max
                # with a < 0; to ub otherwise.
                to_lb = (fe_min & pos) | (fe_max & ~pos)
                to_ub = (fe_min & ~pos) | (fe_max & pos)
                want_lb = np.zeros(self.n, dtype=bool)
                want_ub = np.zeros(self.n, dtype=bool)
                want_lb[self.ej[to_lb]] = True
                want_ub[self.ej[to_ub]] = True
                width_tol = FEAS_TOL * np.maximum(1.0, _finite_abs(self.ub))
                clash = np.flatnonzero(want_lb & want_ub & (self.ub - self.lb > width_tol))
                if clash.size:
                    j = int(clash[0])
                    rows = np.unique(self.er[(self.ej == j) & (to_lb | to_ub)])
                    raise _Infeasible(
                        f"variable {self.names.column(j)} would have to sit at both of its bounds "
                        f"[{_num(self.lb[j])}, {_num(self.ub[j])}] to satisfy constraints "
                        + " and ".join(self.names.row(int(i)) for i in rows[:2])
                        + _where(self.names.row_loc(int(rows[0]))))
                src_rows = np.full(self.n, -1, dtype=np.int64)
                src_rows[self.ej[to_lb]] = self.er[to_lb]
                self.ub_src[want_lb] = src_rows[want_lb]
                src_rows[self.ej[to_ub]] = self.er[to_ub]
                self.lb_src[want_ub] = src_rows[want_ub]
                self.ub[want_lb] = self.lb[want_lb]
                self.lb[want_ub] = self.ub[want_ub]
                self.stats["forcing_rows"] += int(force_min.sum() + force_max.sum())
                self.row_alive[force_min | force_max] = False
                changed = True

            # sides the activity can never reach are dropped
            drop_lo = live & np.isfinite(self.lo) & (minact >= self.lo - rtol)
            drop_hi = live & np.isfinite(self.hi) & (maxact <= self.hi + rtol)
            if drop_lo.any() or drop_hi.any():
                self.lo[drop_lo] = -np.inf
                self.hi[drop_hi] = np.inf
                changed = True
            free = live & np.isneginf(self.lo) & np.isposinf(self.hi)
            if free.any():
                self.row_alive[free] = False
                changed = True

        # drop the entries of dead rows
        keep = self.row_alive[self.er]
        if not keep.all():
            self.er, self.ej, self.ea = self.er[keep], self.ej[keep], self.ea[keep]
        return changed

    def lonely_columns(self) -> bool:
        """Columns left in no row: fixed at the bound the objective prefers."""
        changed = False
        # 4. columns left in no row: fix at the bound the objective prefers ----------------
        in_rows = np.zeros(self.n, dtype=bool)
        in_rows[self.ej] = True
        lonely = np.flatnonzero(self.col_alive & ~in_rows)
        if lonely.size:
            cj, lj, uj = self.cmin[lonely], self.lb[lonely], self.ub[lonely]
            target = np.where(cj > 0, lj, np.where(cj < 0, uj, np.clip(0.0, lj, uj)))
            ok = np.isfinite(target) & (lj <= uj)
            sel = lonely[ok]
            if sel.size:
                self.lb[sel] = target[ok]
                self.ub[sel] = target[ok]
                self.stats["empty_columns"] += int(sel.size)
                changed = True
        return changed

    def fix_last_round(self) -> None:
        """Columns fixed in the last round (bounds met) leave the model too."""
        # columns fixed in the last round (bounds met) leave the model too
        alive_idx, span, tol = self.check_bounds()
        newly = alive_idx[(span <= tol) & np.isfinite(self.lb[alive_idx]) & np.isfinite(self.ub[alive_idx])]
        if newly.size:
            self.value[newly] = self.lb[newly]
            self.col_alive[newly] = False
            hit = ~self.col_alive[self.ej]
            if hit.any():
                contrib = np.bincount(self.er[hit], weights=self.ea[hit] * self.value[self.ej[hit]], minlength=self.m)
                self.lo -= contrib
                self.hi -= contrib

    def reduced(self) -> tuple[IRModel, Postsolve]:
        """The reduced model and its postsolve."""
        kept = np.flatnonzero(self.col_alive)
        rows_kept = np.flatnonzero(self.row_alive)
        self.stats["columns_removed"] = int(self.n - kept.size)
        self.stats["rows_removed"] = int(self.m - rows_kept.size)
        self.value[kept] = 0.0
        reduced = _build_reduced(self.ir, self.A, self.lo, self.hi, self.lb, self.ub, self.c, self.value,
                                 kept, self.row_alive)
        return reduced, Postsolve(self.n, kept, self.value, None, self.stats)


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


