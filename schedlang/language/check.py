"""Static checks of a formulation, before any data is bound.

Every expression gets a static type:
  num (a constant number, with a dimension: '', 'size' or 'time'), bool (a constant truth
  value), elem (a set element), set, tuple, lin (linear in the variables), formula (a truth
  value that depends on variables: comparisons of linear forms, binary literals, logic).
Errors: unknown names (with did-you-mean), arity, non-linear products, variables where a
constant is required, unit mismatches, bindings that are not `name in set`.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import ast
from .builtins import BUILTIN_SCALARS, BUILTIN_SETS, FUNCTIONS
from .errors import CheckError, ErrorList, LintWarning, Loc, did_you_mean
from .parser import name_loc
from .program import Program
from .units import dimension

# The names graph data provides (sets, scalars, functions): one entry each in builtins.py.


@dataclass
class T:
    kind: str  # num bool elem set tuple lin formula
    dim: str = ""
    binary_literal: bool = False  # a binary variable, or `not` of one
    arity: int | None = None  # of a set: the length of its tuples, when known statically
    loc: Loc | None = None  # of an index name: where it is bound (for the lint)
    bare: bool = False  # a number written without a unit (not 0): no quantity


BOOL, ELEM, SET = T("bool"), T("elem"), T("set")


class _Cycle(CheckError):
    """A param whose value reads itself, directly or through other params."""


class Checker:
    def __init__(self, program: Program):
        self.p = program
        self.errors: list[CheckError] = []
        self.expr_types: dict[str, T] = {}
        self.in_progress: set[str] = set()
        self.params_in_progress: list[str] = []  # params being checked, outermost first
        self.param_dims: dict[str, str] = {}
        self.param_kinds: dict[str, str] = {}
        self.set_arities: dict[str, int | None] = {}
        self.warnings: list[LintWarning] = []

    # --- entry point
    def run(self) -> None:
        for decl in self.p.decls.values():
            try:
                self.not_builtin(decl)
                self.guard(decl)
                self.declaration(decl)
            except CheckError as e:
                self.errors.append(e)
        for exts in self.p.extensions.values():
            for ext in exts:
                try:
                    self.guard(ext)
                    self.extension(ext)
                except CheckError as e:
                    self.errors.append(e)
        for obj in [self.p.objective] + self.p.objective_terms:
            if obj is None:
                continue
            try:
                t = self.expr(obj.body, {})
                if t.kind not in ("num", "lin"):
                    raise CheckError("the objective must be a number or a linear expression, "
                                     f"not {_describe(t)}", obj.body.loc)
            except CheckError as e:
                self.errors.append(e)
        if self.p.has_formulation and self.p.objective is None:
            first_var = next((d for d in self.p.decls.values() if isinstance(d, ast.VarDecl)), None)
            loc = (name_loc(self.p.model.name, self.p.model.loc) if self.p.model else
                   name_loc(first_var.name, first_var.loc) if first_var else None)
            self.errors.append(CheckError("the formulation has no objective: add `minimize NAME: ...` or "
                                          "`maximize NAME: ...`", loc))
        if self.p.decode is not None:
            for role, target in self.p.decode.roles.items():
                if isinstance(target, ast.Num):
                    continue
                d = self.p.decls.get(target)
                if not isinstance(d, (ast.VarDecl, ast.ExprDecl)):
                    self.errors.append(CheckError(
                        f"decode role '{role}' names '{target}', which is not a variable or expression"
                        f"{did_you_mean(target, self.names())}", self.p.decode.role_locs.get(role, self.p.decode.loc)))
        self.p.warnings = list({(w.loc, w.message): w for w in self.warnings}.values())
        unique: dict[tuple[Loc | None, str], CheckError] = {}
        for err in self.errors:
            unique.setdefault((err.loc, err.message), err)
        self.errors = list(unique.values())
        if self.errors:
            raise ErrorList(self.errors) if len(self.errors) > 1 else self.errors[0]

    def names(self):
        return list(self.p.decls) + list(BUILTIN_SETS) + list(BUILTIN_SCALARS)

    # --- declarations
    def not_builtin(self, d) -> None:
        """A declaration may not take a built-in's name: every use would read the built-in
        (names resolve to the graph data first), and the declaration would be ignored. A
        constraint is never read, so its name is free."""
        if isinstance(d, ast.ConstraintDecl):
            return
        what = ("a built-in set of the graph data" if d.name in BUILTIN_SETS else
                "a built-in number" if d.name in BUILTIN_SCALARS else
                "a built-in function" if d.name in FUNCTIONS else None)
        if what is not None:
            raise CheckError(f"'{d.name}' is {what} (docs/language.md): uses of the name would "
                             "read the built-in, not this declaration; pick another name",
                             name_loc(d.name, d.loc))

    def guard(self, d) -> None:
        """A `when` condition: a constant truth value, known before the index is bound."""
        if getattr(d, "when", None) is not None:
            self.constant(d.when, {}, "the condition of 'when'", want="bool",
                          hint=f"; 'when' decides whether '{d.name}' exists at all: move a condition on "
                               "variables into the declaration (e.g. with 'implies')")

    def extension(self, ext) -> None:
        """`expr NAME[...] += term` or `constraint NAME[...]: lhs/rhs += term`."""
        base = self.p.decls[ext.name]
        want = index_arity(base.index) if base.index else 0
        got = index_arity(ext.index) if ext.index else 0
        if got != want:
            where = ext.index.loc if ext.index else name_loc(ext.name, ext.loc)
            raise CheckError(f"'{ext.name}' takes {want} index{'es' if want != 1 else ''}, and this '+=' binds "
                             f"{got}: write the domain of the rows it adds to, one name per index of "
                             f"'{ext.name}' (declared at {name_loc(base.name, base.loc)})", where)
        scope = self.index(ext.index) if ext.index else {}
        t = self.expr(ext.value, scope)
        if t.kind not in ("num", "lin"):
            raise CheckError(f"'+=' adds a number or a linear expression, not {_describe(t)}", ext.value.loc)
        if isinstance(base, ast.ExprDecl) and not ext.side:
            side, what = self.expr_type(base), f"expression '{ext.name}'"
        elif isinstance(base, ast.ConstraintDecl) and ext.side:
            body = base.body
            if not isinstance(body, ast.Compare) or body.op == "!=":
                raise CheckError(f"cannot add to a side of constraint '{ext.name}': its body (at {body.loc}) is "
                                 "not a comparison; redefine the constraint instead", name_loc(ext.name, ext.loc))
            bscope = self.index(base.index) if base.index else {}
            side = self.expr(body.left if ext.side == "lhs" else body.right, bscope)
            what = f"the {ext.side} of constraint '{ext.name}'"
        else:  # not reached: program merging lets '+=' extend only a declaration of its kind
            raise CheckError(f"'+=' cannot add to '{ext.name}' (declared at "
                             f"{name_loc(base.name, base.loc)})", name_loc(ext.name, ext.loc))
        if side.dim and t.dim and side.dim != t.dim:
            raise CheckError(f"unit mismatch: '+=' adds a {t.dim} to {what}, a {side.dim}; divide by a unit "
                             "(e.g. / 1MiB, / 1ms) to get a plain number", ext.value.loc)

    def declaration(self, d) -> None:
        scope = self.index(d.index) if d.index else {}
        if isinstance(d, ast.SetDecl):
            t = self.expr(d.value, scope)
            if t.kind != "set":
                raise CheckError(f"set '{d.name}' must be defined by a set, not {_describe(t)}", d.value.loc)
        elif isinstance(d, ast.ParamDecl):
            self.params_in_progress.append(d.name)
            try:
                self.param_declaration(d, scope)
            finally:
                self.params_in_progress.pop()
        elif isinstance(d, ast.VarDecl):
            for b in (d.lb, d.ub):
                if b is not None:
                    t = self.expr(b, scope)
                    self.require_constant(t, b, f"a bound of variable '{d.name}'",
                                          "; bound it with a constraint instead")
                    if t.kind != "num":
                        raise CheckError(f"a bound of variable '{d.name}' must be a number, not {_describe(t)}",
                                         b.loc)
        elif isinstance(d, ast.ExprDecl):
            self.expr_type(d)
        elif isinstance(d, ast.ConstraintDecl):
            t = self.expr(d.body, scope)
            if t.kind not in ("formula", "bool"):
                raise CheckError(f"constraint '{d.name}' must be a comparison (==, <=, >=) or a logical "
                                 f"formula, not {_describe(t)}", d.body.loc)

    def param_declaration(self, d, scope) -> None:
        if d.value is None:
            raise CheckError(f"param '{d.name}' has no value: give `= expression` or `default expression`",
                             name_loc(d.name, d.loc))
        if isinstance(d.value, ast.Table):
            for key, val in d.value.pairs:
                for k in key.items if isinstance(key, ast.Tuple) else [key]:
                    if isinstance(k, ast.Name) and k.id not in self.p.decls and k.id not in BUILTIN_SCALARS:
                        continue  # a bare key is an element's name: {a: 1} is {"a": 1}
                    t = self.constant(k, {}, f"a key of param '{d.name}'")
                    if t.kind not in ("elem", "num"):
                        raise CheckError(f"a key of param '{d.name}' must be an element, not {_describe(t)}",
                                         k.loc)
                self.constant(val, {}, f"a value of param '{d.name}'")
            return
        t = self.expr(d.value, scope)
        self.require_constant(t, d.value, f"param '{d.name}'",
                              f"; declare it as `expr {d.name} = ...` to name an expression over variables")
        if t.kind not in ("num", "bool"):
            raise CheckError(f"param '{d.name}' must be a number, not {_describe(t)}", d.value.loc)
        self.param_dims[d.name] = t.dim
        self.param_kinds[d.name] = t.kind  # a number, or a condition (`param on = x > 0`)

    def set_arity(self, d: ast.SetDecl) -> int | None:
        """The tuple length of a declared set, or None when it cannot be told (or is wrong)."""
        if d.name not in self.set_arities:
            self.set_arities[d.name] = None  # guards recursion
            try:
                scope = self.index(d.index) if d.index else {}
                self.set_arities[d.name] = self.expr(d.value, scope).arity
            except CheckError:
                pass  # reported with the declaration itself
        return self.set_arities[d.name]

    def expr_type(self, d: ast.ExprDecl) -> T:
        name = d.name
        if name in self.expr_types:
            return self.expr_types[name]
        if name in self.in_progress:  # a recursive expression: linear by construction
            return T("lin")
        self.in_progress.add(name)
        try:
            scope = self.index(d.index) if d.index else {}
            t = self.expr(d.value, scope)
            if t.kind not in ("num", "lin"):
                raise CheckError(f"expression '{name}' must be numeric, not {_describe(t)}", d.value.loc)
            for ext in self.p.extensions.get(name, []):  # terms added with `+=` (checked apart)
                try:
                    escope = self.index(ext.index) if ext.index else {}
                    if self.expr(ext.value, escope).kind == "lin":
                        t = T("lin", t.dim)
                except CheckError:
                    pass  # reported by extension()
        finally:
            self.in_progress.discard(name)
        self.expr_types[name] = t
        return t

    def index(self, index: ast.Index, outer: dict | None = None) -> dict:
        scope = dict(outer or {})
        for item in index.items:
            names, set_type = self.binding(item, scope)
            self.lint_rebinding(item, names, scope)
            for n, loc in names:
                if n not in scope:
                    scope[n] = T("elem", loc=loc)
        if index.where is not None:
            self.constant(index.where, scope, "a 'where' filter", want="bool",
                          hint="; it selects index elements before solving: move the condition into the "
                               "constraint (e.g. with 'implies')")
        return scope

    def binding(self, item, scope) -> tuple[list, T]:
        if not isinstance(item, ast.Member) or item.negated:
            raise CheckError("expected a binding 'name in set' or '(a, b) in set'", item.loc)
        el = item.element
        if isinstance(el, ast.Name):
            names = [(el.id, el.loc)]
        elif isinstance(el, ast.Tuple) and all(isinstance(x, ast.Name) for x in el.items):
            names = [(x.id, x.loc) for x in el.items]
        else:
            raise CheckError("the left side of a binding must be a name or a tuple of names", el.loc)
        t = self.expr(item.set, scope)
        if t.kind != "set":
            raise CheckError(f"a binding ranges over a set, not {_describe(t)}", item.set.loc)
        if t.arity is not None and t.arity != len(names):
            count = len(names)
            example = "v" if t.arity == 1 else "(" + ", ".join("abcdefgh"[:t.arity]) + ")"
            raise CheckError(f"binding {count} name{'s' if count > 1 else ''} to a set of {_tuples(t.arity)}; "
                             f"write {example} in {_set_text(item.set)}", el.loc)
        for n, loc in names:
            decl = self.p.decls.get(n)
            # only a declaration the index's author could see: a user's name never makes an
            # error in the shipped model it uses
            if (decl is not None and self.p.sees(loc.path, decl.loc.path)) \
                    or n in BUILTIN_SETS or n in BUILTIN_SCALARS:
                raise CheckError(f"index name '{n}' hides the declaration of '{n}'; pick another name", loc)
        return names, t

    def lint_rebinding(self, item: ast.Member, names: list, scope: dict) -> None:
        """Warn when a binding binds no new name: `t in K` with t bound already is a filter."""
        fresh = [n for n, _ in names if n != "_" and n not in scope]
        if fresh or all(n == "_" for n, _ in names):
            return
        n, loc = next((n, loc) for n, loc in names if n != "_")
        first = scope[n].loc
        at = f" (at {first})" if first is not None else ""
        pattern = n if len(names) == 1 else "(" + ", ".join(m for m, _ in names) + ")"
        self.warnings.append(LintWarning(
            f"'{n}' is already bound{at}, so `{pattern} in {_set_text(item.set)}` binds no new name: it "
            f"only keeps the rows where {pattern} is in {_set_text(item.set)} (one term at most); "
            "rename the index to range over the set, or write the test as a 'where' condition", loc))

    def constant(self, e, scope, what: str, want: str | None = None, hint: str = "") -> T:
        t = self.expr(e, scope)
        self.require_constant(t, e, what, hint)
        if want == "bool" and t.kind != "bool":
            raise CheckError(f"{what} must be a condition, not {_describe(t)}", e.loc)
        return t

    def require_constant(self, t: T, e, what: str, hint: str = "") -> None:
        if t.kind in ("lin", "formula"):
            raise CheckError(f"{what} must be a constant, but it depends on variables{hint}", e.loc)

    # --- expressions
    def expr(self, e, scope: dict) -> T:
        method = getattr(self, "e_" + type(e).__name__)
        return method(e, scope)

    def e_Num(self, e, s):
        return T("num", dimension(e.unit), bare=not e.unit and e.value != 0)

    def e_Str(self, e, s):
        return ELEM

    def e_Name(self, e, s):
        if e.id in s:
            return s[e.id]
        if e.id in BUILTIN_SETS:
            return T("set", arity=BUILTIN_SETS[e.id])
        if e.id in BUILTIN_SCALARS:
            return T("num", BUILTIN_SCALARS[e.id])
        d = self.p.decls.get(e.id)
        if d is None:
            for prefix, what in (("budget.", "budget"), ("bandwidth.", "bandwidth")):
                if e.id.startswith(prefix):
                    known = [n for n in BUILTIN_SCALARS if n.startswith(prefix)]
                    raise CheckError(f"unknown {what} '{e.id}'{did_you_mean(e.id, known)}; the {what}s "
                                     f"are {', '.join(known)}", e.loc)
            raise CheckError(f"unknown name '{e.id}'{did_you_mean(e.id, list(s) + self.names())}", e.loc)
        if d.index is not None and not isinstance(d, ast.ConstraintDecl):
            n = index_arity(d.index)
            raise CheckError(f"'{e.id}' is indexed by {n} index{'es' if n > 1 else ''}; write {e.id}[...]", e.loc)
        return self._decl_type(d, e)

    def _decl_type(self, d, e) -> T:
        if isinstance(d, ast.SetDecl):
            return T("set", arity=self.set_arity(d))
        if isinstance(d, ast.ParamDecl):
            if d.name in self.params_in_progress:
                path = self.params_in_progress[self.params_in_progress.index(d.name):] + [d.name]
                raise _Cycle(f"param '{d.name}' is defined in terms of itself "
                             f"({' -> '.join(path)})", e.loc)
            if d.name not in self.param_dims and d.value is not None and not isinstance(d.value, ast.Table):
                try:
                    self.declaration(d)
                except _Cycle:
                    raise
                except CheckError:
                    pass
            return T(self.param_kinds.get(d.name, "num"), self.param_dims.get(d.name, ""))
        if isinstance(d, ast.VarDecl):
            return T("lin", binary_literal=(d.kind == "binary"))
        if isinstance(d, ast.ExprDecl):
            return self.expr_type(d)
        raise CheckError(f"constraint '{d.name}' cannot be used in an expression", e.loc)

    def e_Subscript(self, e, s):
        d = self.p.decls.get(e.name)
        if d is None:
            if e.name in BUILTIN_SETS or e.name in BUILTIN_SCALARS:
                raise CheckError(f"'{e.name}' is not indexed", e.loc)
            raise CheckError(f"unknown name '{e.name}'{did_you_mean(e.name, list(s) + self.names())}", e.loc)
        if isinstance(d, ast.ConstraintDecl):
            raise CheckError(f"constraint '{e.name}' cannot be used in an expression", e.loc)
        want = index_arity(d.index) if d.index else 0
        if isinstance(d, ast.ParamDecl) and d.index is None and isinstance(d.value, ast.Table):
            want = None  # a table param takes the arity of its keys
        if want is not None and len(e.args) != want:
            raise CheckError(f"'{e.name}' takes {want} index{'es' if want != 1 else ''}, got {len(e.args)}", e.loc)
        for a in e.args:
            t = self.expr(a, s)
            if t.kind in ("lin", "formula"):
                raise CheckError(f"an index of '{e.name}' depends on variables; indices must be constants", a.loc)
            if t.kind == "set":
                raise CheckError(f"an index of '{e.name}' is a set; indices are elements", a.loc)
        return self._decl_type(d, e)

    def e_Call(self, e, s):
        f = FUNCTIONS.get(e.func)
        if f is None:
            if e.func in self.p.decls:
                raise CheckError(f"'{e.func}' is not a function; write {e.func}[...] to index it", e.loc)
            raise CheckError(f"unknown function '{e.func}'{did_you_mean(e.func, FUNCTIONS)}", e.loc)
        lo, hi = f.min_args, f.max_args
        if not lo <= len(e.args) <= hi:
            want = str(lo) if lo == hi else f"{lo} or {hi}"
            raise CheckError(f"{e.func}() takes {want} argument{'s' if hi > 1 else ''}, got {len(e.args)}", e.loc)
        ts = [self.expr(a, s) for a in e.args]
        for a, t in zip(e.args, ts):
            if t.kind in ("lin", "formula"):
                raise CheckError(f"{e.func}() needs constants, but its argument depends on variables", a.loc)
        if f.takes is not None and ts[0].kind != f.takes:
            what = "a set" if f.takes == "set" else "an element"
            raise CheckError(f"{e.func}() takes {what}, not {_describe(ts[0])}", e.args[0].loc)
        dim = ts[0].dim if f.dim is None else f.dim
        return T(f.result, dim, arity=1 if f.result == "set" else None)

    def e_Aggregate(self, e, s):
        inner = self.index(ast.Index(e.loc, e.items, e.where), s)
        t = self.expr(e.body, inner)
        if e.op == "sum":
            if t.kind not in ("num", "lin"):
                raise CheckError(f"sum() adds numbers, not {_describe(t)}", e.body.loc)
            return T(t.kind, t.dim)
        if e.op in ("max", "min"):
            if t.kind == "lin":
                raise CheckError(f"{e.op}() over variables is not linear; {e.op}() takes constants "
                                 "(bound it with a variable and constraints instead)", e.body.loc)
            if t.kind != "num":
                raise CheckError(f"{e.op}() takes numbers, not {_describe(t)}", e.body.loc)
            return T("num", t.dim)
        # any / all
        return self._logic_operand(t, e.body, e.op)

    def _logic_operand(self, t: T, e, op: str) -> T:
        if t.kind == "bool":
            return BOOL
        if t.kind == "formula":
            return T("formula")
        if t.kind == "lin" and t.binary_literal:
            return T("formula", binary_literal=True)
        if t.kind == "lin":
            raise CheckError(f"'{op}' takes conditions; this linear expression is not a binary variable "
                             "(compare it with a number, e.g. x >= 1)", e.loc)
        raise CheckError(f"'{op}' takes conditions, not {_describe(t)}", e.loc)

    def e_BinOp(self, e, s):
        a, b = self.expr(e.left, s), self.expr(e.right, s)
        op = e.op
        if op in ("union", "diff", "inter"):
            for x, side in ((a, e.left), (b, e.right)):
                if x.kind != "set":
                    raise CheckError(f"'{op}' combines sets, not {_describe(x)}", side.loc)
            if a.arity is not None and b.arity is not None and a.arity != b.arity:
                raise CheckError(f"'{op}' of a set of {_tuples(a.arity)} and a set of {_tuples(b.arity)}",
                                 _op_loc(e))
            return T("set", arity=a.arity if a.arity is not None else b.arity)
        if a.kind == "elem" and op in "+-" and b.kind == "num":
            return ELEM  # t + 1: the next element of t's ordered set
        for x, side in ((a, e.left), (b, e.right)):
            if x.kind not in ("num", "lin"):
                raise CheckError(f"'{op}' needs numbers, not {_describe(x)}", side.loc)
        if op in "+-":
            if a.dim and b.dim and a.dim != b.dim:
                raise CheckError(f"unit mismatch: '{op}' between a {a.dim} (left) and a {b.dim} (right); "
                                 "divide by a unit (e.g. / 1MiB, / 1ms) to get a plain number", _op_loc(e))
            for x, y, side in ((a, b, "left"), (b, a, "right")):
                if x.bare and y.dim:  # 1 + rec[j]: which unit is the 1 in?
                    raise CheckError(f"unit mismatch: '{op}' between a number without a unit "
                                     f"({side}) and a {y.dim}; write its unit (e.g. 1ms, "
                                     "1MiB)", _op_loc(e))
            return T("lin" if "lin" in (a.kind, b.kind) else "num", a.dim or b.dim,
                     bare=a.bare and b.bare)
        if op == "*":
            if a.kind == "lin" and b.kind == "lin":
                raise CheckError("non-linear product of variables: one side of '*' must be a constant "
                                 "(for a product of binaries, introduce a binary variable and constraints)",
                                 _op_loc(e))
            dim = a.dim if not b.dim else (b.dim if not a.dim else "")
            return T("lin" if "lin" in (a.kind, b.kind) else "num", dim)
        # division
        if b.kind == "lin":
            raise CheckError("division by an expression with variables is not linear; divide by a constant",
                             e.right.loc)
        dim = "" if a.dim == b.dim else (a.dim if not b.dim else "")
        return T(a.kind, dim)

    def e_Neg(self, e, s):
        t = self.expr(e.operand, s)
        if t.kind not in ("num", "lin"):
            raise CheckError(f"'-' needs a number, not {_describe(t)}", e.loc)
        return T(t.kind, t.dim)

    def e_Compare(self, e, s):
        a, b = self.expr(e.left, s), self.expr(e.right, s)
        if a.kind == "elem" or b.kind == "elem":
            if not (a.kind == "elem" and b.kind == "elem"):
                bad = b if a.kind == "elem" else a
                hint = "; compare an element's position with ord(...)" if bad.kind == "num" else ""
                raise CheckError(f"cannot compare an element with {_describe(bad)}{hint}", _op_loc(e))
            return BOOL
        for x, side in ((a, e.left), (b, e.right)):
            if x.kind not in ("num", "lin"):
                raise CheckError(f"'{e.op}' compares numbers, not {_describe(x)}", side.loc)
        if a.dim and b.dim and a.dim != b.dim:
            raise CheckError(f"unit mismatch: '{e.op}' compares a {a.dim} (left) with a {b.dim} (right); "
                             "divide by a unit (e.g. / 1MiB, / 1ms) to get a plain number", _op_loc(e))
        if "lin" in (a.kind, b.kind):
            if e.op == "!=":
                raise CheckError("'!=' between expressions with variables is not supported; write "
                                 "`a <= b - 1 or a >= b + 1` (integers) or use a binary variable", _op_loc(e))
            return T("formula")
        return BOOL

    def e_Member(self, e, s):
        a, b = self.expr(e.element, s), self.expr(e.set, s)
        if b.kind != "set":
            raise CheckError(f"'in' needs a set on its right, not {_describe(b)}", e.set.loc)
        if a.kind not in ("elem", "tuple", "num"):
            raise CheckError(f"'in' needs an element on its left, not {_describe(a)}", e.element.loc)
        if b.arity is not None and _width(e.element) != b.arity:
            raise CheckError(f"'in' tests {_tuples(_width(e.element), one=True)} against a set of "
                             f"{_tuples(b.arity)}", e.element.loc)
        return BOOL

    def e_Logic(self, e, s):
        a = self._logic_operand(self.expr(e.left, s), e.left, e.op)
        b = self._logic_operand(self.expr(e.right, s), e.right, e.op)
        return BOOL if a.kind == b.kind == "bool" else T("formula")

    def e_Not(self, e, s):
        t = self._logic_operand(self.expr(e.operand, s), e.operand, "not")
        return t if t.kind == "bool" else T("formula", binary_literal=t.binary_literal)

    def e_Tuple(self, e, s):
        for x in e.items:
            t = self.expr(x, s)
            if t.kind not in ("elem", "num"):
                raise CheckError(f"a tuple holds elements, not {_describe(t)}", x.loc)
        return T("tuple")

    def e_Range(self, e, s):
        for x in (e.lo, e.hi):
            t = self.constant(x, s, "a range bound")
            if t.kind != "num":
                raise CheckError(f"a range bound must be a number, not {_describe(t)}", x.loc)
        return T("set", arity=1)

    def e_SetLit(self, e, s):
        if e.items and all(isinstance(x, ast.Member) and not x.negated for x in e.items) and (
                e.where is not None or _is_binding(e.items[0])):
            self.index(ast.Index(e.loc, e.items, e.where), s)
            names = {n for x in e.items for n in _pattern_names(x.element)} - {"_"}
            return T("set", arity=len(names))
        if e.where is not None:
            raise CheckError("a set with 'where' needs bindings: {x in S where ...}", e.loc)
        for x in e.items:
            t = self.expr(x, s)
            if t.kind not in ("elem", "num", "tuple"):
                raise CheckError(f"a set holds elements, not {_describe(t)}", x.loc)
        widths = {_width(x) for x in e.items}
        return T("set", arity=widths.pop() if len(widths) == 1 else None)

    def e_SetFor(self, e, s):
        inner = self.index(ast.Index(e.loc, e.items, e.where), s)
        t = self.expr(e.expr, inner)
        if t.kind not in ("elem", "num", "tuple"):
            raise CheckError(f"a set holds elements, not {_describe(t)}", e.expr.loc)
        return T("set", arity=_width(e.expr))

    def e_Table(self, e, s):
        raise CheckError("a table {key: value, ...} can only define a param", e.loc)

    def e_Cond(self, e, s):
        self.constant(e.cond, s, "the condition of 'if'", want="bool")
        a, b = self.expr(e.then, s), self.expr(e.other, s)
        kinds = {a.kind, b.kind}
        if kinds <= {"num", "lin"}:
            return T("lin" if "lin" in kinds else "num", a.dim or b.dim)
        if kinds <= {"bool", "formula"}:
            return T("formula" if "formula" in kinds else "bool")
        if a.kind == b.kind:
            return a
        raise CheckError(f"the branches of 'if' differ: {_describe(a)} and {_describe(b)}", e.loc)


def index_arity(index: ast.Index) -> int:
    """How many indices a declaration takes: one per name bound by its domain."""
    n = 0
    for item in index.items:
        el = item.element if isinstance(item, ast.Member) else None
        n += len(el.items) if isinstance(el, ast.Tuple) else 1
    return n


def _is_binding(item) -> bool:
    el = item.element
    return isinstance(el, ast.Name) or (isinstance(el, ast.Tuple) and all(isinstance(x, ast.Name) for x in el.items))


def _describe(t: T) -> str:
    """The kind of a value, with its article: 'a number', 'an element', ..."""
    return {"num": "a number", "bool": "a condition", "elem": "an element", "set": "a set",
            "tuple": "a tuple", "lin": "a linear expression",
            "formula": "a formula with variables"}[t.kind]


def _width(e) -> int:
    """How many elements a set item or a binding pattern stands for."""
    return len(e.items) if isinstance(e, ast.Tuple) else 1


def _pattern_names(el) -> list[str]:
    return [x.id for x in el.items] if isinstance(el, ast.Tuple) else [el.id]


def _tuples(k: int, one: bool = False) -> str:
    """'single elements', 'pairs', 'triples', '4-tuples' (or 'a single element', 'a pair', ...)."""
    if one:
        return {1: "a single element", 2: "a pair", 3: "a triple"}.get(k, f"a {k}-tuple")
    return {1: "single elements", 2: "pairs", 3: "triples"}.get(k, f"{k}-tuples")


def _set_text(e) -> str:
    """A short rendering of a set expression for a message: its name, or '...'."""
    if isinstance(e, ast.Name):
        return e.id
    if isinstance(e, ast.Subscript) and all(isinstance(a, ast.Name) for a in e.args):
        return f"{e.name}[{', '.join(a.id for a in e.args)}]"
    return "..."


def _op_loc(e) -> Loc:
    """Where a binary expression's operator is written (the start of the expression if unknown)."""
    return name_loc(e.op, e.loc)


def check_program(program: Program) -> None:
    Checker(program).run()
