"""Index domains: binding tables built by joins (`relational`), set values, the families of
declarations. A mixin of `lower.Lowering`."""
from __future__ import annotations

import numpy as np

from ..language import ast
from ..language.builtins import BUILTIN_SCALARS, BUILTIN_SETS, CHECKMATE_VIEW, FUNCTIONS
from ..language.check import Checker
from ..language.errors import CheckError, DataError
from .lowering_state import LoweringState
from .relational import (
    Const,
    Elem,
    Family,
    KeyIndex,
    SetRel,
    SetVal,
    Table,
    cross_rows,
    expand_ranges,
    unique_rows,
    with_row_id,
)
from .walk import conjuncts, index_names, is_pattern, lowering, pattern, references


class Domains(LoweringState):
    # ================================================================== domains
    def domain(self, index: ast.Index | None, outer: Table | None = None) -> Table:
        """The binding table of an index domain, grown from `outer` (default: one empty row)."""
        t = outer if outer is not None else Table.unit()
        if index is None:
            return t
        pending = conjuncts(index.where) if index.where is not None else []
        for item in index.items:
            names = pattern(item.element)
            t = self._bind(t, names, item.set, pending)
            t = self._filter_ready(t, pending)
        for c in pending:  # anything left (e.g. no-variable conditions)
            t = t.take(np.flatnonzero(self._bool(c, t)))
        pending.clear()
        return t

    def _filter_ready(self, t: Table, conjuncts: list) -> Table:
        """Apply each `where` conjunct as soon as all the names it uses are bound."""
        for c in list(conjuncts):
            if references(c) <= set(t.cols) | self._global_names():
                t = t.take(np.flatnonzero(self._bool(c, t)))
                conjuncts.remove(c)
        return t

    def _global_names(self) -> set:
        return set(self.p.decls) | set(BUILTIN_SETS) | set(BUILTIN_SCALARS)

    def _bind(self, t: Table, names: list[str], set_expr, conjuncts: list) -> Table:
        sv = self.set_value(set_expr, t)
        arity = sv.cols.shape[1] if isinstance(sv, SetRel) else sv.arity
        if arity != len(names):
            raise CheckError(f"binding {len(names)} name{'s' if len(names) > 1 else ''} to a set of "
                             f"{arity}-tuples", set_expr.loc)
        home = sv if isinstance(sv, SetVal) and sv.arity == 1 else None
        if isinstance(sv, SetRel):
            self.guard(len(sv.rows))
            t2 = t.take(sv.rows)
            keep = np.ones(t2.m, dtype=bool)
            for j, n in enumerate(names):
                if n == "_":
                    continue
                if n in t2.cols:
                    keep &= t2.cols[n] == sv.cols[:, j]
                else:
                    t2 = t2.with_col(n, sv.cols[:, j], None)
            return t2.take(np.flatnonzero(keep)) if not keep.all() else t2
        # A constant set: join on the names already bound and on `new == bound` conjuncts.
        keys_t, keys_s = [], []
        for j, n in enumerate(names):
            if n in t.cols:
                keys_t.append(t.cols[n])
                keys_s.append(j)
        for c in list(conjuncts):
            if not (isinstance(c, ast.Compare) and c.op == "=="):
                continue
            # `new == e` where e uses only names bound already: a join key, not a filter
            for side, other in ((c.left, c.right), (c.right, c.left)):
                if (isinstance(side, ast.Name) and side.id in names and side.id not in t.cols
                        and names.count(side.id) == 1
                        and references(other) <= set(t.cols) | self._global_names()):
                    key = self.value(other, t)
                    if not isinstance(key, Elem):
                        key = Elem(self._elem_codes(other, t))
                    keys_t.append(key.codes)
                    keys_s.append(names.index(side.id))
                    conjuncts.remove(c)
                    break
        if keys_t:
            idx = KeyIndex(sv.cols[:, keys_s], len(self.u))
            self.guard(idx.join_size(keys_t))
            trows, srows = idx.join(keys_t)
        else:
            self.guard(t.m * len(sv))
            trows, srows = cross_rows(t.m, len(sv))
        t2 = t.take(trows)
        seen = set(t.cols)
        for j, n in enumerate(names):
            if n == "_" or n in seen:
                continue
            seen.add(n)
            t2 = t2.with_col(n, sv.cols[srows, j], home)
        # a name repeated inside one pattern, e.g. (v, v) in E, must match itself
        for j, n in enumerate(names):
            first = names.index(n)
            if n != "_" and first != j:
                t2 = t2.take(np.flatnonzero(sv.cols[srows, first] == sv.cols[srows, j]))
                srows = srows[np.flatnonzero(sv.cols[srows, first] == sv.cols[srows, j])]
        return t2

    # ================================================================== sets
    def set_value(self, e, t: Table):
        """A constant SetVal, or a SetRel when the set depends on the table's names."""
        if t.m != 1 and not isinstance(e, ast.Name) and not (references(e) & set(t.cols)):
            # uses none of the row names: one ordered set for every row, evaluated once
            key = id(e)
            if key not in self._const_sets:
                self._const_sets[key] = (e, self.set_value(e, Table.unit()))
            return self._const_sets[key][1]
        if isinstance(e, ast.Name):
            if self.g is not None and self.g.layers and e.id in CHECKMATE_VIEW:
                raise DataError(f"'{e.id}' is the Checkmate view of a graph (node and edge "
                                f"declarations), and graph '{self.g.name}' is layered data; index the "
                                "H-graph instead (compute_nodes, data_nodes, options, ...)", e.loc)
            if e.id in self.sets:
                return self.sets[e.id]
            if self.g is None and e.id in BUILTIN_SETS:
                raise DataError(f"the model uses '{e.id}' and no graph data was given: solve a file "
                                "with a `graph` (e.g. one that `use`s this model)", e.loc)
            d = self.p.decls.get(e.id)
            if isinstance(d, ast.SetDecl) and d.index is None:
                return self._set_decl(d)
            raise CheckError(f"'{e.id}' is not a set", e.loc)
        if isinstance(e, ast.Subscript):
            fam, rel = self._indexed_set(e)
            args = [self._elem_codes(a, t) for a in e.args]
            trows, frows = fam.index.join(args)
            # rel rows point at family rows; expand each table row by its family row's elements
            order = np.argsort(rel.rows, kind="stable")
            starts = np.searchsorted(rel.rows[order], np.arange(len(fam.keys)), "left")
            ends = np.searchsorted(rel.rows[order], np.arange(len(fam.keys)), "right")
            counts = ends[frows] - starts[frows]
            self.guard(int(counts.sum()))
            rows = np.repeat(trows, counts)
            offs = np.arange(counts.sum(), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
            pick = order[np.repeat(starts[frows], counts) + offs]
            return SetRel(rows, rel.cols[pick])
        set_of_call = FUNCTIONS[e.func].set_value if isinstance(e, ast.Call) and e.func in FUNCTIONS else None
        if set_of_call is not None:
            return set_of_call(self, e, t)
        if isinstance(e, ast.Range):
            lo = self._num(e.lo, t)
            hi = self._num(e.hi, t)
            if not (np.all(lo == np.round(lo)) and np.all(hi == np.round(hi))):
                raise DataError("range bounds must be integers", e.loc)
            self.guard(int(np.maximum(hi - lo + 1, 0).sum()))
            rows, vals = expand_ranges(lo.astype(np.int64), hi.astype(np.int64))
            codes = self.u.codes_of(vals.tolist()).reshape(-1, 1)
            return self._maybe_const(SetRel(rows, codes), t)
        if isinstance(e, ast.BinOp) and e.op in ("union", "diff", "inter"):
            a = self._as_rel(self.set_value(e.left, t), t)
            b = self._as_rel(self.set_value(e.right, t), t)
            if a.cols.shape[1] != b.cols.shape[1]:
                raise CheckError(f"'{e.op}' of sets of {a.cols.shape[1]}- and {b.cols.shape[1]}-tuples", e.loc)
            return self._maybe_const(_combine(e.op, a, b, len(self.u)), t)
        if isinstance(e, ast.SetLit):
            if e.items and (e.where is not None
                            or all(isinstance(x, ast.Member) and is_pattern(x.element) for x in e.items)):
                inner = self.domain(ast.Index(e.loc, e.items, e.where), with_row_id(t))
                names = [n for x in e.items for n in pattern(x.element) if n != "_"]
                names = list(dict.fromkeys(names))
                cols = np.stack([inner.cols[n] for n in names], axis=1) if names else np.zeros((inner.m, 0), np.int64)
                return self._maybe_const(SetRel(inner.cols["__row"], cols), t)
            item_codes = [self._tuple_codes(x, t) for x in e.items]
            if not item_codes:
                return SetVal(np.zeros((0, 1), dtype=np.int64))
            width = {c.shape[1] for c in item_codes}
            if len(width) > 1:
                raise CheckError("a set literal mixes tuples of different lengths", e.loc)
            rows = np.concatenate([np.arange(t.m, dtype=np.int64)] * len(item_codes))
            data = np.concatenate(item_codes)
            order = np.argsort(rows, kind="stable")
            return self._maybe_const(SetRel(rows[order], data[order]), t)
        if isinstance(e, ast.SetFor):
            inner = self.domain(ast.Index(e.loc, e.items, e.where), with_row_id(t))
            cols = self._tuple_codes(e.expr, inner)
            return self._maybe_const(SetRel(inner.cols["__row"], cols), t)
        if isinstance(e, ast.Cond):
            raise CheckError("'if' cannot choose between sets", e.loc)
        raise CheckError("expected a set", e.loc)

    def _maybe_const(self, rel: SetRel, t: Table):
        """On a one-row table a set is a constant, ordered SetVal."""
        if t.m == 1:
            return SetVal(unique_rows(rel.cols))
        return rel

    def _as_rel(self, sv, t: Table) -> SetRel:
        if isinstance(sv, SetRel):
            return sv
        self.guard(t.m * len(sv))
        rows, srows = cross_rows(t.m, len(sv))
        return SetRel(rows, sv.cols[srows])

    @lowering
    def _set_decl(self, d: ast.SetDecl) -> SetVal:
        if d.name not in self.sets:
            self.sets[d.name] = SetVal(np.zeros((0, 1), np.int64), d.name)  # guards recursion
            if not self.is_active(d):
                self.sets[d.name] = SetVal(np.zeros((0, self._set_arity(d)), np.int64), d.name)
                return self.sets[d.name]
            sv = self.set_value(d.value, Table.unit())
            if isinstance(sv, SetRel):
                sv = SetVal(unique_rows(sv.cols))
            sv.name = d.name
            self.sets[d.name] = sv
        return self.sets[d.name]

    @lowering
    def _indexed_set(self, e: ast.Subscript) -> tuple[Family, SetRel]:
        if e.name in self.indexed_sets:
            return self.indexed_sets[e.name]
        d = self.p.decls.get(e.name)
        if not isinstance(d, ast.SetDecl) or d.index is None:
            raise CheckError(f"'{e.name}' is not an indexed set", e.loc)
        if not self.is_active(d):
            fam = self._empty_family(d.index)
            self.indexed_sets[e.name] = (fam, SetRel(np.zeros(0, np.int64),
                                                     np.zeros((0, self._set_arity(d)), np.int64)))
            return self.indexed_sets[e.name]
        fam = self.family(d.index)
        rel = self._as_rel(self.set_value(d.value, with_row_id(fam.table)), fam.table)
        # distinct elements per row, first occurrence kept
        both = np.concatenate([rel.rows.reshape(-1, 1), rel.cols], axis=1)
        both = unique_rows(both)
        order = np.argsort(both[:, 0], kind="stable")
        both = both[order]
        self.indexed_sets[e.name] = (fam, SetRel(both[:, 0], both[:, 1:]))
        return self.indexed_sets[e.name]

    def is_active(self, d) -> bool:
        """Whether a declaration (or a `+=` term) exists: its `when` condition, evaluated once."""
        if getattr(d, "when", None) is None:
            return True
        if id(d) not in self._active:
            self._active[id(d)] = bool(self._bool(d.when, Table.unit())[0])
        return self._active[id(d)]

    def decl_family(self, d) -> Family:
        """A declaration's domain; empty when its `when` condition is false (nothing evaluated)."""
        return self.family(d.index) if self.is_active(d) else self._empty_family(d.index)

    def _empty_family(self, index: ast.Index | None) -> Family:
        names = index_names(index)
        keys = np.zeros((0, len(names)), np.int64)
        table = Table(0, {n: np.zeros(0, np.int64) for n in names})
        return Family(keys, KeyIndex(keys, len(self.u) + 1), table)

    def _set_arity(self, d: ast.SetDecl) -> int:
        """The tuple length of a declared set, told from its text (for a set that is not built)."""
        return Checker(self.p).set_arity(d) or 1

    def family(self, index: ast.Index | None) -> Family:
        table = self.domain(index)
        names = index_names(index)
        keys = np.stack([table.cols[n] for n in names], axis=1) if names else np.zeros((table.m, 0), np.int64)
        if index is not None and names and len(unique_rows(keys)) != len(keys):
            raise CheckError("this index domain lists an element twice", index.loc)
        return Family(keys, KeyIndex(keys, len(self.u) + 1), table)

    # ================================================================== element and tuple values
    def _elem_codes(self, e, t: Table) -> np.ndarray:
        v = self.value(e, t)
        if isinstance(v, Elem):
            return v.codes
        if isinstance(v, Const) and v.v.dtype != bool:
            vals = v.v
            if not np.all(vals == np.round(vals)):
                raise DataError("an index must be an element or an integer", e.loc)
            return self.u.codes_of(vals.astype(np.int64).tolist())
        raise CheckError("expected an element", e.loc)

    def _tuple_codes(self, e, t: Table) -> np.ndarray:
        if isinstance(e, ast.Tuple):
            return np.stack([self._elem_codes(x, t) for x in e.items], axis=1)
        return self._elem_codes(e, t).reshape(-1, 1)


def _combine(op: str, a: SetRel, b: SetRel, base: int) -> SetRel:
    """union / diff / inter of two row-dependent sets, row by row, order kept."""
    ka = np.concatenate([a.rows.reshape(-1, 1), a.cols], axis=1)
    kb = np.concatenate([b.rows.reshape(-1, 1), b.cols], axis=1)
    width = max(base, int(ka[:, 0].max(initial=0)) + 1, int(kb[:, 0].max(initial=0)) + 1)
    if op == "union":
        both = np.concatenate([ka, kb])
        both = unique_rows(both)
        both = both[np.argsort(both[:, 0], kind="stable")]
        return SetRel(both[:, 0], both[:, 1:])
    in_b = KeyIndex(kb, width).lookup([ka[:, j] for j in range(ka.shape[1])]) >= 0
    keep = in_b if op == "inter" else ~in_b
    return SetRel(a.rows[keep], a.cols[keep])
