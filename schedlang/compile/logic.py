"""Logic -> linear rows: the reformulation of constraint bodies over binary literals.

A constraint body is a comparison of linear forms or a formula: `and`, `or`, `not`,
`implies`, `iff`, `any(...)`, `all(...)` over binary literals (a binary variable or `not` of
one) and comparisons. `Formulas` lowers it to rows `lo <= A x <= hi` (docs/language.md,
"Logic"):

* `and` -> separate rows; `all(i in I) f` -> f on one row per element;
* `lits implies f` (a conjunction of literals on the left) -> f with a big-M released when any
  literal is 0; the big-M is the row's largest activity over the column bounds;
* `or` / `any` of literals -> their sum >= 1; a disjunct that is not a literal gets a binary
  indicator column (`NAME.orK`) that implies it;
* `not` is pushed inwards (De Morgan); a strict comparison needs integral sides.

The expressions and domains inside a formula are evaluated by `lower.Lowering`, which this
pass calls; `Lowering` signals a formula met where a value was expected with `NeedsLowering`.
"""
from __future__ import annotations

import numpy as np

from ..language import ast
from ..language.errors import CheckError
from .relational import Const, Family, KeyIndex, Lin, Table, with_row_id

TOL = 1e-9


class NeedsLowering(Exception):
    """A logical or comparison expression over variables met where a value was expected."""


class Rows:
    """The rows a constraint lowers to, in parts: (Lin, origin row per Lin row, "<=" or "==")."""

    def __init__(self, m: int):
        self.m = m
        self.parts: list[tuple[Lin, np.ndarray, str]] = []

    def add(self, lin: Lin, origin: np.ndarray, op: str):
        if lin.m:
            self.parts.append((lin, origin, op))


class Formulas:
    """Constraint bodies -> rows, for one `Lowering` (which owns the columns and evaluates
    expressions and domains)."""

    def __init__(self, low):
        self.low = low

    def enforce(self, f, t: Table, origin: np.ndarray, guards: list[Lin], rows: Rows, name: str):
        """Require formula f on every row of t whenever all guard literals are 1.

        `origin` maps each row of t to the constraint's own row (for keys), guards are Lins over t.
        """
        f = push_not(f)
        if isinstance(f, ast.Logic) and f.op == "and":
            self.enforce(f.left, t, origin, guards, rows, name)
            self.enforce(f.right, t, origin, guards, rows, name)
            return
        if isinstance(f, ast.Logic) and f.op == "iff":
            self.enforce(ast.Logic(f.loc, "implies", f.left, f.right), t, origin, guards, rows, name)
            self.enforce(ast.Logic(f.loc, "implies", f.right, f.left), t, origin, guards, rows, name)
            return
        if isinstance(f, ast.Logic) and f.op == "implies":
            lits = self.conj_literals(f.left, t)
            if lits is not None:
                self.enforce(f.right, t, origin, guards + lits, rows, name)
            else:
                self.enforce(ast.Logic(f.loc, "or", ast.Not(f.loc, f.left), f.right), t, origin, guards, rows, name)
            return
        if isinstance(f, ast.Aggregate) and f.op == "all":
            inner = self.low.domain(ast.Index(f.loc, f.items, f.where), with_row_id(t))
            src = inner.cols["__row"]
            self.enforce(f.body, inner, origin[src], [g.gather(src) for g in guards], rows, name)
            return
        if isinstance(f, ast.Logic) and f.op == "or" or isinstance(f, ast.Aggregate) and f.op == "any":
            total = self.disjunction(f, t, origin, rows, name)
            self.relation(total + Lin.constant(np.full(t.m, -1.0)), ">=", t, origin, guards, rows, f.loc)
            return
        if isinstance(f, ast.Compare):
            self.compare(f, self.low._lin(f.left, t), self.low._lin(f.right, t), t, origin, guards, rows)
            return
        lit = self.literal(f, t)
        if lit is not None:  # a binary literal on its own: it must be 1
            self.relation(lit + Lin.constant(np.full(t.m, -1.0)), ">=", t, origin, guards, rows, f.loc)
            return
        raise CheckError("this formula cannot be lowered to linear constraints", f.loc)

    def compare(self, f: ast.Compare, a: Lin, b: Lin, t: Table, origin, guards: list[Lin], rows: Rows):
        """The comparison `a f.op b` (its sides already lowered), under the guards: one row per
        row of t (two for `==` under guards); a strict `<`/`>` needs integral sides and becomes
        `<= -1`/`>= 1`. No new columns."""
        diff = a + b.scale(-np.ones(t.m))
        op = f.op
        if op in ("<", ">"):
            if not self.integral(diff):
                raise CheckError(f"strict '{op}' between expressions with continuous variables cannot be "
                                 f"modelled; use '{op}='", f.loc)
            diff = diff + Lin.constant(np.full(t.m, 1.0 if op == "<" else -1.0))
            op = op + "="
        if op == "!=":
            raise CheckError("'!=' between expressions with variables is not supported", f.loc)
        self.relation(diff, op, t, origin, guards, rows, f.loc)

    def disjunction(self, f, t: Table, origin, rows: Rows, name: str) -> Lin:
        """Sum of 0/1 indicators, one per disjunct, each implying its disjunct: a literal is
        its own indicator; any other disjunct gets an indicator column (`indicator`) and the
        rows that enforce it under that column. The caller adds the row `sum >= 1`."""
        if isinstance(f, ast.Aggregate):  # any(i in I) body
            lit_body = self.literal_expr(f.body)
            if not lit_body:
                raise CheckError("any() over variables takes a binary literal as its body", f.body.loc)
            inner = self.low.domain(ast.Index(f.loc, f.items, f.where), with_row_id(t))
            lit = self.literal(f.body, inner)
            if lit is None:  # not reached: a literal expression has a literal's value
                raise CheckError("any() over variables takes a binary literal as its body", f.body.loc)
            return lit.reduce(inner.cols["__row"], t.m)
        total = Lin.constant(np.zeros(t.m))
        for part in flatten(f, "or"):
            part = push_not(part)
            lit = self.literal(part, t)
            if lit is not None:
                total = total + lit
            elif isinstance(part, ast.Aggregate) and part.op == "any":
                total = total + self.disjunction(part, t, origin, rows, name)
            else:  # an indicator variable z with z -> part
                z = self.indicator(name, t, origin)
                self.enforce(part, t, origin, [z], rows, name)
                total = total + z
        return total

    def indicator(self, name: str, t: Table, origin) -> Lin:
        """A new binary column per row of t (family `NAME.orK`, keyed by row number): the
        indicator of a disjunct, which implies it."""
        k = sum(1 for f in self.low.var_families if f.name.startswith(f"{name}.or"))
        keys = np.arange(t.m).reshape(-1, 1)
        fam = Family(keys, KeyIndex(keys, t.m + 1), t)
        offset = self.low.add_columns(f"{name}.or{k}", fam, [(int(i),) for i in range(t.m)], "binary",
                                      np.zeros(t.m), np.ones(t.m), None, "indicator of a disjunct")
        return Lin(t.m, np.arange(t.m), offset + np.arange(t.m), np.ones(t.m), np.zeros(t.m))

    def relation(self, diff: Lin, op: str, t, origin, guards: list[Lin], rows: Rows, loc):
        """diff op 0, enforced only when all guards are 1: without guards one row per row of
        diff; with guards, `diff <= M * (len(guards) - sum(guards))` where M is diff's largest
        activity over the column bounds (rows that can never fail are dropped; an infinite M is
        an error). `>=` is `<=` negated, `==` under guards is two rows. No new columns."""
        if op == ">=":
            self.relation(diff.scale(-np.ones(diff.m)), "<=", t, origin, guards, rows, loc)
            return
        if op == "==":
            if not guards:
                rows.add(diff, origin, "==")
                return
            self.relation(diff, "<=", t, origin, guards, rows, loc)
            self.relation(diff.scale(-np.ones(diff.m)), "<=", t, origin, guards, rows, loc)
            return
        if not guards:
            rows.add(diff, origin, "<=")
            return
        lb, ub = self.low.column_bounds()
        _, big = diff.activity_bounds(lb, ub)
        keep = big > TOL  # rows where the relation could fail
        if np.isinf(big[keep]).any():
            raise CheckError("cannot derive a big-M for this condition: give the variables in it finite "
                             "bounds (e.g. `in [0, B]`)", loc)
        slack = Lin.constant(np.full(diff.m, float(len(guards))))
        for g in guards:
            slack = slack + g.scale(-np.ones(diff.m))
        out = diff + slack.scale(-np.where(keep, big, 0.0))
        rows.add(out.take_rows(keep), origin[keep], "<=")

    def integral(self, lin: Lin) -> bool:
        """Whether every row of lin is integral on integral columns (for strict comparisons)."""
        ints = np.concatenate([np.full(f.size, f.kind != "continuous") for f in self.low.var_families]) \
            if self.low.var_families else np.zeros(0, bool)
        return bool(np.all(ints[lin.cols]) and np.all(lin.coefs == np.round(lin.coefs))
                    and np.all(lin.const == np.round(lin.const)))

    def literal_expr(self, f) -> bool:
        """Statically: a binary variable reference, or `not` of one."""
        if isinstance(f, ast.Not):
            return self.literal_expr(f.operand)
        if isinstance(f, (ast.Name, ast.Subscript)):
            name = f.id if isinstance(f, ast.Name) else f.name
            return self.low.is_binary(name)
        return False

    def literal(self, f, t: Table) -> Lin | None:
        """The 0/1 value of a literal as a Lin (constants too), or None if f is not one."""
        if isinstance(f, ast.Not):
            inner = self.literal(f.operand, t)
            return None if inner is None else Lin.constant(np.ones(t.m)) + inner.scale(-np.ones(t.m))
        if self.literal_expr(f):
            return self.low._lin(f, t)
        try:
            v = self.low.value(f, t)
        except NeedsLowering:
            return None
        if isinstance(v, Const) and v.v.dtype == bool:
            return Lin.constant(np.broadcast_to(v.v, (t.m,)).astype(float))
        return None

    def conj_literals(self, f, t) -> list[Lin] | None:
        """The literals of a conjunction of literals (the guards of an `implies`), or None."""
        out = []
        for part in flatten(push_not(f), "and"):
            lit = self.literal(part, t)
            if lit is None:
                return None
            out.append(lit)
        return out


def flatten(e, op: str) -> list:
    if isinstance(e, ast.Logic) and e.op == op:
        return flatten(e.left, op) + flatten(e.right, op)
    return [e]


def push_not(f):
    """Move `not` inwards (De Morgan); comparisons flip; literals keep their `not`."""
    if not isinstance(f, ast.Not):
        return f
    g = f.operand
    L = f.loc
    if isinstance(g, ast.Not):
        return push_not(g.operand)
    if isinstance(g, ast.Logic):
        if g.op == "and":
            return ast.Logic(L, "or", ast.Not(L, g.left), ast.Not(L, g.right))
        if g.op == "or":
            return ast.Logic(L, "and", ast.Not(L, g.left), ast.Not(L, g.right))
        if g.op == "implies":
            return ast.Logic(L, "and", g.left, ast.Not(L, g.right))
        if g.op == "iff":
            return ast.Logic(L, "or", ast.Logic(L, "and", g.left, ast.Not(L, g.right)),
                             ast.Logic(L, "and", ast.Not(L, g.left), g.right))
    if isinstance(g, ast.Aggregate) and g.op in ("any", "all"):
        return ast.Aggregate(g.loc, "all" if g.op == "any" else "any", g.items, g.where, ast.Not(L, g.body))
    if isinstance(g, ast.Compare):
        flip = {"<=": ">", "<": ">=", ">=": "<", ">": "<=", "==": "!=", "!=": "=="}[g.op]
        return ast.Compare(g.loc, flip, g.left, g.right)
    return f
