"""Columns: variable families and their bounds, auxiliary variables for recursive
expressions, named expressions and their `+=` terms. A mixin of `lower.Lowering`."""
from __future__ import annotations

import numpy as np

from ..language import ast
from ..language.errors import CheckError, DataError
from ..language.parser import name_loc
from .ir import VarFamily
from .logic import TOL
from .lowering_state import LoweringState
from .relational import Const, Family, Lin, Table
from .walk import lowering


class Variables(LoweringState):
    # --- variables
    @lowering
    def _declare_var(self, d: ast.VarDecl):
        fam = self.decl_family(d)
        lb, ub = self.var_bounds(d, fam)
        self._add_family(d.name, fam, d.kind, lb, ub, d.loc, d.doc)

    @lowering
    def var_bounds(self, d: ast.VarDecl, fam: Family) -> tuple[np.ndarray, np.ndarray]:
        """The column bounds of variable `d` over its domain `fam` (parametric.py evaluates
        them again when a budget moves)."""
        n = len(fam.keys)
        lb = np.zeros(n) if d.kind == "binary" else np.full(n, -np.inf)
        ub = np.ones(n) if d.kind == "binary" else np.full(n, np.inf)
        if d.lb is not None:
            lb = self._num(d.lb, fam.table)
        if d.ub is not None:
            ub = self._num(d.ub, fam.table)
        if d.kind == "integer":
            lb, ub = np.ceil(lb - 1e-9), np.floor(ub + 1e-9)
        if d.kind == "binary" and (d.lb is not None or d.ub is not None):
            lb, ub = np.maximum(lb, 0), np.minimum(ub, 1)
        bad = lb > ub + TOL
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise DataError(f"variable {d.name}{self._fmt_key(fam.keys[i]) if fam.keys.shape[1] else ''} has "
                            f"lower bound {lb[i]:g} above its upper bound {ub[i]:g}", d.loc)
        return lb, ub

    def _add_family(self, name, fam: Family, kind, lb, ub, loc, doc=""):
        keys = [tuple(self.u.value(int(c)) for c in row) for row in fam.keys]
        self.add_columns(name, fam, keys, kind, lb, ub, loc, doc)

    def add_columns(self, name, fam: Family, keys: list, kind, lb, ub, loc, doc="") -> int:
        """A new variable family: one column per row of `fam`; returns its first column."""
        offset = self.n_cols
        self.vars[name] = (fam, offset)
        self.var_families.append(VarFamily(name, keys, kind, lb.astype(float), ub.astype(float), offset, loc, doc))
        self.lb.append(lb.astype(float))
        self.ub.append(ub.astype(float))
        self.n_cols += len(keys)
        return offset

    def _var_lookup(self, name: str, args, t: Table) -> Lin:
        fam, offset = self.vars[name]
        if fam.keys.shape[1] == 0:
            rows = np.zeros(t.m, dtype=np.int64) if len(fam.keys) else np.full(t.m, -1)
        else:
            rows = fam.index.lookup(args, t.m)
        hit = np.flatnonzero(rows >= 0)  # outside the declared domain: 0
        return Lin(t.m, hit, offset + rows[hit], np.ones(len(hit)), np.zeros(t.m))

    def is_binary(self, name: str) -> bool:
        d = self.p.decls.get(name)
        return isinstance(d, ast.VarDecl) and d.kind == "binary"

    def column_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        if not self.lb:
            return np.zeros(0), np.zeros(0)
        return np.concatenate(self.lb), np.concatenate(self.ub)

    # --- expressions
    @lowering
    def _declare_aux(self, d: ast.ExprDecl):
        fam = self.decl_family(d)
        n = len(fam.keys)
        self._add_family(d.name, fam, "continuous", np.full(n, -np.inf), np.full(n, np.inf), d.loc,
                         "auxiliary variable of the recursive expression")

    @lowering
    def _define_aux(self, d: ast.ExprDecl):
        fam, offset = self.vars[d.name]
        body = self._lin_of(self._expr_body(d, fam), fam.table)
        m = fam.table.m
        aux = Lin(m, np.arange(m), offset + np.arange(m), np.ones(m), np.zeros(m))
        self._emit(f"{d.name}.definition", fam, aux + body.scale(-np.ones(m)), "==", d.loc)

    @lowering
    def _expr_lookup(self, d: ast.ExprDecl, args, t: Table):
        if d.name in self.recursive:
            return self._var_lookup(d.name, args, t)
        if d.name not in self.exprs:
            fam = self.decl_family(d)
            self.exprs[d.name] = (fam, self._expr_body(d, fam))
        fam, val = self.exprs[d.name]
        if fam.keys.shape[1] == 0:
            rows = np.zeros(t.m, dtype=np.int64) if len(fam.keys) else np.full(t.m, -1, dtype=np.int64)
        else:
            rows = fam.index.lookup(args, t.m)
        if isinstance(val, Const):
            out = np.zeros(t.m)
            ok = rows >= 0
            out[ok] = np.broadcast_to(val.v, (fam.table.m,))[rows[ok]]
            return Const(out, val.dim)
        return val.gather(rows)

    def _expr_body(self, d: ast.ExprDecl, fam: Family) -> Const | Lin:
        """The value of an expression on its domain rows: its body plus the terms added with `+=`."""
        if fam.table.m == 0:
            return Const(np.zeros(0))
        val = self.value(d.value, fam.table)
        for ext in self.p.extensions.get(d.name, []):
            term = self._added_term(ext, fam)
            if term is None:
                continue
            if isinstance(val, Const) and isinstance(term, Const):
                val = Const(np.broadcast_to(val.v.astype(float), (fam.table.m,)) + term.v, val.dim or term.dim)
            else:
                val = self._lin_of(val, fam.table) + self._lin_of(term, fam.table)
        return val

    def _added_term(self, ext, fam: Family):
        """A `+=` term evaluated on its own domain and summed into the rows of `fam` (the
        declaration's rows with the same keys); None when its `when` is false. A key outside the
        declaration's domain is an error."""
        if not self.is_active(ext):
            return None
        own = self.family(ext.index)
        if fam.keys.shape[1] == 0:
            rows = np.zeros(len(own.keys), dtype=np.int64)
        else:
            rows = fam.index.lookup([own.keys[:, j] for j in range(own.keys.shape[1])], len(own.keys))
        if (rows < 0).any():
            i = int(np.flatnonzero(rows < 0)[0])
            base = self.p.decls[ext.name]
            raise DataError(f"'+=' adds to {ext.name}{self._fmt_key(own.keys[i])}, which is outside the domain "
                            f"of '{ext.name}' (declared at {name_loc(base.name, base.loc)})",
                            ext.index.loc if ext.index else ext.loc)
        v = self.value(ext.value, own.table)
        m = fam.table.m
        if isinstance(v, Const):
            vals = np.broadcast_to(v.v.astype(float), (own.table.m,))
            return Const(np.bincount(rows, vals, minlength=m)[:m], v.dim)
        if isinstance(v, Lin):
            return v.reduce(rows, m)
        raise CheckError("'+=' adds a number or a linear expression", ext.value.loc)

