"""Rows and the objective: constraints turned into IR blocks (through `logic.Formulas`).
A mixin of `lower.Lowering`."""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..language import ast
from ..language.errors import CheckError
from .ir import ConstraintBlock, Objective
from .logic import Rows
from .lowering_state import LoweringState
from .relational import Family, Lin, Table
from .walk import lowering


class Emission(LoweringState):
    # ================================================================== constraints (rows: logic.py)
    @lowering
    def _constraint(self, d: ast.ConstraintDecl):
        if not self.is_active(d):
            return
        fam = self.family(d.index)
        rows = Rows(fam.table.m)
        origin = np.arange(fam.table.m)
        added = [(x.side, self._added_term(x, fam)) for x in self.p.extensions.get(d.name, [])]
        added = [(side, term) for side, term in added if term is not None]
        if added:  # `lhs += ...` / `rhs += ...`: the body is a comparison (check.py)
            body = d.body
            if not isinstance(body, ast.Compare):  # not reached: the checker rejects it
                raise CheckError(f"cannot add to a side of constraint '{d.name}': its body is not "
                                 "a comparison", body.loc)
            t = fam.table
            sides = {"lhs": self._lin(body.left, t), "rhs": self._lin(body.right, t)}
            for side, term in added:
                sides[side] = sides[side] + self._lin_of(term, t)
            self.logic.compare(body, sides["lhs"], sides["rhs"], t, origin, [], rows)
        else:
            self.logic.enforce(d.body, fam.table, origin, [], rows, d.name)
        self._emit_rows(d.name, fam, rows, d.loc)

    def _emit(self, name, fam: Family, lin: Lin, op: str, loc):
        rows = Rows(fam.table.m)
        rows.add(lin, np.arange(fam.table.m), op)
        self._emit_rows(name, fam, rows, loc)

    def _emit_rows(self, name: str, fam: Family, rows: Rows, loc):
        if not rows.parts:
            return
        A_rows, A_cols, A_vals, lo, hi, origin = [], [], [], [], [], []
        base = 0
        for lin, orig, op in rows.parts:
            A_rows.append(lin.rows + base)
            A_cols.append(lin.cols)
            A_vals.append(lin.coefs)
            rhs = -lin.const
            lo.append(rhs if op == "==" else np.full(lin.m, -np.inf))
            hi.append(rhs)
            origin.append(orig)
            base += lin.m
        A = sp.csr_matrix((np.concatenate(A_vals), (np.concatenate(A_rows), np.concatenate(A_cols))),
                          shape=(base, self.n_cols))
        A.sum_duplicates()
        A.eliminate_zeros()
        origin_rows = np.concatenate(origin)
        keys = [tuple(self.u.value(int(c)) for c in fam.keys[i]) for i in origin_rows]
        self.blocks.append(ConstraintBlock(name, keys, A, np.concatenate(lo), np.concatenate(hi), loc))

    # ================================================================== objective
    def _objective(self) -> Objective | None:
        obj = self.p.objective
        if obj is None:
            return None
        with self.building(obj):
            return self._objective_of(obj)

    def _objective_of(self, obj) -> Objective:
        one = Table.unit()
        lin = self._lin(obj.body, one)
        for extra in self.p.objective_terms:
            lin = lin + self._lin(extra.body, one)
        c = np.bincount(lin.cols, lin.coefs, minlength=self.n_cols)[: self.n_cols] if self.n_cols else np.zeros(0)
        return Objective(obj.name, obj.sense, c.astype(float), float(lin.const[0]), obj.loc)

    def finish_blocks(self):
        """Constraint matrices were built while columns were still being added: pad them."""
        for b in self.blocks:
            if b.A.shape[1] != self.n_cols:
                b.A = sp.csr_matrix((b.A.data, b.A.indices, b.A.indptr), shape=(b.A.shape[0], self.n_cols))


