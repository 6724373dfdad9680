"""Expressions evaluated column-wise over a binding table: one `v_<Node>` visitor per AST
node kind, numbers, booleans and linear forms. A mixin of `lower.Lowering`."""
from __future__ import annotations

import numpy as np

from ..language import ast
from ..language.builtins import FUNCTIONS, SCALARS
from ..language.errors import CheckError, DataError
from ..language.units import UNITS, dimension
from .logic import NeedsLowering
from .lowering_state import LoweringState
from .relational import INVALID, Const, Elem, KeyIndex, Lin, SetVal, Table, with_row_id


class Expressions(LoweringState):
    # ================================================================== expression values
    def value(self, e, t: Table):
        return getattr(self, "v_" + type(e).__name__)(e, t)

    def _num(self, e, t: Table) -> np.ndarray:
        v = self.value(e, t)
        if isinstance(v, Const):
            return np.broadcast_to(v.v.astype(np.float64), (t.m,)).copy()
        if isinstance(v, Lin):
            raise CheckError("expected a constant, but this depends on variables", e.loc)
        raise CheckError("expected a number", e.loc)

    def _bool(self, e, t: Table) -> np.ndarray:
        v = self.value(e, t)
        if isinstance(v, Const) and v.v.dtype == bool:
            return np.broadcast_to(v.v, (t.m,)).copy()
        raise CheckError("expected a condition", e.loc)

    def _lin(self, e, t: Table) -> Lin:
        v = self.value(e, t)
        if isinstance(v, Lin):
            return v
        if isinstance(v, Const) and v.v.dtype != bool:
            return Lin.constant(np.broadcast_to(v.v.astype(np.float64), (t.m,)))
        if isinstance(v, Const):
            return Lin.constant(np.broadcast_to(v.v.astype(np.float64), (t.m,)))
        raise CheckError("expected a number or a linear expression", e.loc)

    def v_Num(self, e, t):
        return Const(np.full(t.m, e.value * UNITS.get(e.unit, 1.0)), dimension(e.unit))

    def v_Str(self, e, t):
        return Elem(np.full(t.m, self.u.code(e.value), dtype=np.int64))

    def v_Name(self, e, t):
        if e.id in t.cols:
            return Elem(t.cols[e.id], t.homes.get(e.id))
        scalar = SCALARS.get(e.id)
        if scalar is not None:
            return Const(np.full(t.m, scalar.value(self, e.id, e.loc)), scalar.dim)
        d = self.p.decls.get(e.id)
        if isinstance(d, ast.ParamDecl):
            return self._param_lookup(d, [], t, e.loc)
        if isinstance(d, ast.VarDecl):
            return self._var_lookup(d.name, [], t)
        if isinstance(d, ast.ExprDecl):
            return self._expr_lookup(d, [], t)
        if e.id in self.sets or isinstance(d, ast.SetDecl):
            raise CheckError(f"'{e.id}' is a set; a number or element is expected here", e.loc)
        raise CheckError(f"unknown name '{e.id}'", e.loc)

    def v_Subscript(self, e, t):
        d = self.p.decls.get(e.name)
        args = [self._elem_codes(a, t) for a in e.args]
        if isinstance(d, ast.ParamDecl):
            return self._param_lookup(d, args, t, e.loc)
        if isinstance(d, ast.VarDecl):
            out = self._var_lookup(d.name, args, t)
        elif isinstance(d, ast.ExprDecl):
            out = self._expr_lookup(d, args, t)
        else:
            raise CheckError(f"'{e.name}' cannot be used as a number here", e.loc)
        self._check_literals(d, e)
        return out


    # --- operators
    def v_BinOp(self, e, t):
        if e.op in ("union", "diff", "inter"):
            raise CheckError("a set is not a number", e.loc)
        a = self.value(e.left, t)
        if isinstance(a, Elem) and e.op in "+-":
            k = self._num(e.right, t)
            return self._shift(a, k if e.op == "+" else -k, e.loc)
        b = self.value(e.right, t)
        if isinstance(a, Const) and isinstance(b, Const):
            x, y = a.v.astype(float), b.v.astype(float)
            with np.errstate(divide="ignore", invalid="ignore"):
                out = {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide}[e.op](x, y)
            if e.op == "/" and np.any(y == 0):
                raise DataError("division by zero", e.loc)
            return Const(np.broadcast_to(out, (t.m,)).copy())
        if e.op in "+-":
            la = self._lin(e.left, t) if not isinstance(a, Lin) else a
            lb = self._lin(e.right, t) if not isinstance(b, Lin) else b
            return la + (lb.scale(-np.ones(t.m)) if e.op == "-" else lb)
        if e.op == "*":
            if isinstance(a, Const):
                return self._lin_of(b, t).scale(a.v.astype(float))
            if isinstance(b, Const):
                return self._lin_of(a, t).scale(b.v.astype(float))
            raise CheckError("non-linear product of variables: one side of '*' must be a constant", e.loc)
        if e.op == "/" and isinstance(b, Const):
            if np.any(b.v == 0):
                raise DataError("division by zero", e.loc)
            return self._lin_of(a, t).scale(1.0 / b.v.astype(float))
        raise CheckError("division by an expression with variables is not linear", e.loc)

    def _lin_of(self, v, t) -> Lin:
        if isinstance(v, Lin):
            return v
        return Lin.constant(np.broadcast_to(v.v.astype(float), (t.m,)))

    def _shift(self, a: Elem, k: np.ndarray, loc, positional: bool = False) -> Elem:
        if not np.all(k == np.round(k)):
            raise DataError("an element can only be shifted by an integer", loc)
        k = k.astype(np.int64)
        num = self.u.numeric()
        valid = a.codes >= 0
        # integers: arithmetic (x[i + 1] is x at i + 1 whatever set i came from); symbols
        # (graph nodes, names): the next/previous element of the ordered set they came from
        if valid.any() and np.all(~np.isnan(num[a.codes[valid]])) and not positional:
            vals = num[np.maximum(a.codes, 0)] + k
            codes = self.u.codes_of(vals.astype(np.int64).tolist())
            return Elem(np.where(valid, codes, INVALID))
        if a.home is None:
            raise CheckError("'+'/'-' on an element needs an ordered set: the element must come from "
                             "a binding over a set of single elements (or use next(v, S))", loc)
        pos = a.home.positions(len(self.u))
        p = np.where(valid, pos[np.maximum(a.codes, 0)], -1)
        q = p + k
        ok = (p >= 0) & (q >= 0) & (q < len(a.home))
        out = np.full(len(a.codes), INVALID, dtype=np.int64)
        out[ok] = a.home.cols[q[ok], 0]
        return Elem(out, a.home)

    def v_Neg(self, e, t):
        v = self.value(e.operand, t)
        if isinstance(v, Const):
            return Const(-v.v.astype(float), v.dim)
        return v.scale(-np.ones(t.m))

    def v_Compare(self, e, t):
        a, b = self.value(e.left, t), self.value(e.right, t)
        if isinstance(a, Elem) or isinstance(b, Elem):
            if not (isinstance(a, Elem) and isinstance(b, Elem)):
                raise CheckError("cannot compare an element with a number", e.loc)
            x, y = self._elem_order(a.codes), self._elem_order(b.codes)
            invalid = (a.codes < 0) | (b.codes < 0)
            res = _COMPARE[e.op](x, y)
            return Const(np.where(invalid, e.op == "!=", res))
        if isinstance(a, Const) and isinstance(b, Const):
            return Const(_COMPARE[e.op](a.v.astype(float), b.v.astype(float)))
        raise NeedsLowering()

    def _elem_order(self, codes: np.ndarray) -> np.ndarray:
        num = self.u.numeric()
        c = np.maximum(codes, 0)
        vals = num[c]
        return np.where(np.isnan(vals), c.astype(float), vals)

    def v_Member(self, e, t):
        tup = self._tuple_codes(e.element, t)
        sv = self.set_value(e.set, with_row_id(t) if not isinstance(e.set, ast.Name) else t)
        base = len(self.u) + 1
        if isinstance(sv, SetVal):
            if sv.arity != tup.shape[1]:
                raise CheckError(f"'in' tests a {tup.shape[1]}-tuple against a set of {sv.arity}-tuples", e.loc)
            hit = KeyIndex(sv.cols, base).lookup([tup[:, j] for j in range(tup.shape[1])]) >= 0
        else:
            both = np.concatenate([sv.rows.reshape(-1, 1), sv.cols], axis=1)
            q = [np.arange(t.m, dtype=np.int64)] + [tup[:, j] for j in range(tup.shape[1])]
            hit = KeyIndex(both, max(base, t.m + 1)).lookup(q) >= 0
        return Const(hit != e.negated)

    def v_Logic(self, e, t):
        a, b = self.value(e.left, t), self.value(e.right, t)
        if isinstance(a, Const) and isinstance(b, Const) and a.v.dtype == bool and b.v.dtype == bool:
            x, y = a.v, b.v
            return Const({"and": x & y, "or": x | y, "implies": ~x | y, "iff": x == y}[e.op])
        raise NeedsLowering()

    def v_Not(self, e, t):
        a = self.value(e.operand, t)
        if isinstance(a, Const) and a.v.dtype == bool:
            return Const(~a.v)
        raise NeedsLowering()

    def v_Cond(self, e, t):
        """`if c then a else b`: each branch is evaluated only on the rows that take it."""
        c = self._bool(e.cond, t)
        if c.all():
            return self.value(e.then, t)
        if not c.any():
            return self.value(e.other, t)
        yes, no = np.flatnonzero(c), np.flatnonzero(~c)
        ty, tn = t.take(yes), t.take(no)
        a, b = self.value(e.then, ty), self.value(e.other, tn)
        if isinstance(a, Const) and isinstance(b, Const):
            out = np.empty(t.m, dtype=np.result_type(a.v, b.v))
            out[yes], out[no] = np.broadcast_to(a.v, (ty.m,)), np.broadcast_to(b.v, (tn.m,))
            return Const(out, a.dim or b.dim)
        if isinstance(a, Elem) and isinstance(b, Elem):
            out = np.empty(t.m, dtype=np.int64)
            out[yes], out[no] = a.codes, b.codes
            return Elem(out, a.home if a.home is b.home else None)
        return self._lin_of(a, ty).reduce(yes, t.m) + self._lin_of(b, tn).reduce(no, t.m)

    def v_Tuple(self, e, t):
        raise CheckError("a tuple is not a number", e.loc)

    def v_Aggregate(self, e, t):
        inner = self.domain(ast.Index(e.loc, e.items, e.where), with_row_id(t))
        group = inner.cols["__row"]
        if e.op in ("any", "all"):
            v = self.value(e.body, inner)
            if isinstance(v, Const) and v.v.dtype == bool:
                count = np.bincount(group, v.v.astype(float), minlength=t.m)[: t.m]
                total = np.bincount(group, minlength=t.m)[: t.m]
                return Const(count > 0 if e.op == "any" else count == total)
            raise NeedsLowering()
        v = self.value(e.body, inner)
        if e.op == "sum":
            if isinstance(v, Const):
                weights = np.broadcast_to(v.v.astype(float), (inner.m,))
                return Const(np.bincount(group, weights, minlength=t.m)[: t.m], v.dim)
            return v.reduce(group, t.m)
        if not isinstance(v, Const):
            raise CheckError(f"{e.op}() over variables is not linear", e.loc)
        vals = np.broadcast_to(v.v.astype(float), (inner.m,))
        out = np.full(t.m, -np.inf if e.op == "max" else np.inf)
        (np.maximum if e.op == "max" else np.minimum).at(out, group, vals)
        if len(np.unique(group)) < t.m:
            raise DataError(f"{e.op}() over an empty set", e.loc)
        return Const(out, v.dim)

    def v_Call(self, e, t):
        f = FUNCTIONS.get(e.func)
        if f is None:
            raise CheckError(f"unknown function '{e.func}'", e.loc)
        if f.value is None:
            raise CheckError(f"{e.func}() is a set; use it after 'in'", e.loc)
        return f.value(self, e, t)

    def v_SetLit(self, e, t):
        raise CheckError("a set is not a number", e.loc)

    v_SetFor = v_Range = v_SetLit


_COMPARE = {"<=": np.less_equal, ">=": np.greater_equal, "==": np.equal, "!=": np.not_equal,
            "<": np.less, ">": np.greater}
