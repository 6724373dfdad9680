"""Lower a program once and move only its budget: the IR at many budgets for a sweep.

A sweep solves one formulation at many peak budgets. Lowering the whole program again at each
budget repeats work that does not depend on the budget (domains, joins, the rows of every
constraint that never reads a budget). `BudgetLowering` lowers once, finds the declarations
that read a budget (`budget.peak`, `budget.save`, `budget.host`, directly or through params,
expressions, variable bounds, `when` guards or `+=` terms), and at each new budget evaluates
only those again, on the same `Lowering` (same columns, same universe of elements):

* params that read a budget are evaluated again (`param B = budget.peak / 1MiB`);
* variable bounds that read one are replaced in place (`var U[...] in [0, B]`);
* constraints that read one are lowered again and their block replaced where it was (the
  right-hand sides of `peak_use <= B`, and the big-M of `R implies step_use <= B`, which comes
  from the column bounds);
* the objective, when it reads one.

The result is the IR a fresh `lower_program` gives at that budget, entry for entry (the tests
compare them); a program whose budget reaches something this cannot redo in place (a set, a
domain, a recursive expression, a `when` guard, a decoded expression, a constraint that adds
columns) is lowered again in full, and `BudgetLowering.incremental` says which happened.
"""
from __future__ import annotations

import copy
import time

import numpy as np

from ..language import ast
from ..language.program import Program
from .ir import IRModel
from .lower import Lowering, lower_program
from .walk import ast_nodes, references

#: the budgets a sweep moves: the peak budget, and the save budget, which is the peak budget
#: when not given (builtins.py); `budget.host` stays fixed
SWEPT = ("peak", "save")


def _uses_bounds(node) -> bool:
    """Whether a constraint body may be lowered with a big-M from column bounds (logic.py:
    `implies`, `iff`, `or`, `any`, `not`); plain comparisons and `and`/`all` of them never."""
    return any(isinstance(x, ast.Not) or (isinstance(x, ast.Logic) and x.op != "and")
               or (isinstance(x, ast.Aggregate) and x.op == "any") for x in ast_nodes(node))


def budget_dependents(program: Program, kinds=SWEPT) -> set[str]:
    """Names of the declarations to evaluate again when a budget moves: params, expressions
    and constraints whose value reads a budget (directly or through params and expressions;
    `when` guards and `+=` terms included), variables whose bounds or domain do, constraints
    with a big-M (logic over binaries) over such a variable, and "objective" when the
    objective's value reads a budget. `kinds`: the budgets that move. A variable's *value*
    does not depend on the budget: a constraint that only mentions one is not redone."""
    decls = program.decls
    refs: dict[str, set[str]] = {}
    for name, d in decls.items():
        found = references(d)
        for ext in program.extensions.get(name, []):
            found |= references(ext)
        table = program.param_tables.get(name)
        if table is not None:
            found |= references(table)
        refs[name] = found
    objective = set()
    for obj in ([program.objective] if program.objective else []) + list(program.objective_terms):
        objective |= references(obj)
    is_var = {n for n, d in decls.items() if isinstance(d, ast.VarDecl)}
    # values: budget roots, then params/expressions/constraints/var bounds that read them
    roots = {f"budget.{k}" for k in kinds}
    value: set[str] = set(roots)
    changed = True
    while changed:
        changed = False
        for name, found in refs.items():
            if name not in value and found & (value - is_var):
                value.add(name)
                changed = True
    bounded = value & is_var  # variables whose bounds (or domain) read a budget
    value -= is_var
    # the variables each name reaches through expressions
    reach: dict[str, set[str]] = {}

    def vars_of(name: str, seen: frozenset = frozenset()) -> set[str]:
        if name in reach:
            return reach[name]
        out: set[str] = set()
        for r in refs.get(name, ()):
            if r in is_var:
                out.add(r)
            elif isinstance(decls.get(r), ast.ExprDecl) and r not in seen:
                out |= vars_of(r, seen | {name})
        reach[name] = out
        return out

    redo = set(value) | bounded
    for name, d in decls.items():
        if isinstance(d, ast.ConstraintDecl) and name not in redo and bounded & vars_of(name):
            bodies = [d.body] + list(program.extensions.get(name, []))
            if any(_uses_bounds(b) for b in bodies):
                redo.add(name)
    if objective & value:
        redo.add("objective")
    return redo - roots


class BudgetLowering:
    """`program` lowered once; `at(budgets)` gives its IR at other budgets.

    `budgets` are the program's budgets by kind ({"peak": bytes, ...}), as `lower_program`
    takes them. `incremental` is False when the program's budget reaches declarations that
    cannot be redone in place, or when `at` is given other budgets than `kinds` moved: `at`
    then lowers the whole program again."""

    def __init__(self, program: Program, budgets: dict[str, int], max_elements: int | None = None,
                 kinds=SWEPT):
        self.program = program
        self.max_elements = max_elements
        self.kinds = tuple(kinds)
        self.roots = {f"budget.{k}" for k in self.kinds}
        self.dependent = budget_dependents(program, self.kinds)
        t0 = time.perf_counter()
        self.low = Lowering(program, program.graph, dict(budgets), max_elements)
        self.ir = self.low.run()
        self.low.finish_blocks()
        self.first_lower_s = time.perf_counter() - t0
        self.budgets = dict(budgets)
        self.incremental, self.reason = self._can_redo()

    def _can_redo(self) -> tuple[bool, str]:
        decls = self.program.decls
        observed = set(self.ir.observed)
        for name in sorted(self.dependent - {"objective"}):
            d = decls.get(name)
            if isinstance(d, ast.SetDecl):
                return False, f"set {name} reads a budget"
            when = getattr(d, "when", None)
            if when is not None and references(when) & (self.dependent | self.roots):
                return False, f"the `when` guard of {name} reads a budget"
            index = getattr(d, "index", None)
            if index is not None and references(index) & (self.dependent | self.roots):
                return False, f"the domain of {name} reads a budget"
            if isinstance(d, ast.ExprDecl) and (name in self.low.recursive or name in observed):
                return False, f"expression {name} reads a budget"
            if isinstance(d, ast.ConstraintDecl) and any(
                    f.name.startswith(f"{name}.") for f in self.ir.variables):
                return False, f"constraint {name} reads a budget and adds columns"
        return True, ""

    def at(self, budgets: dict[str, int]) -> IRModel:
        """The IR at `budgets` (a new `IRModel`; the one from earlier calls is not changed)."""
        budgets = dict(budgets)
        fixed = {k: v for k, v in budgets.items() if k not in self.kinds}
        if not self.incremental or fixed != {k: v for k, v in self.budgets.items()
                                             if k not in self.kinds}:
            return lower_program(self.program, self.program.graph, budgets, self.max_elements)
        low = self.low
        if budgets != self.budgets:
            low.budgets.clear()
            low.budgets.update(budgets)
            self._redo()
            self.budgets = budgets
        return self._snapshot()

    def _redo(self) -> None:
        low, decls = self.low, self.program.decls
        for name in self.dependent:  # evaluated again on first use
            low.params.pop(name, None)
            low.exprs.pop(name, None)
        for name in self.dependent:
            d = decls.get(name)
            if isinstance(d, ast.VarDecl):
                self._new_bounds(d)
        n_cols = low.n_cols
        for name in decls:  # in declaration order, as `Lowering.run` emits them
            d = decls[name]
            if name in self.dependent and isinstance(d, ast.ConstraintDecl):
                self._relower_constraint(d)
        if low.n_cols != n_cols:
            raise AssertionError("a budget-dependent constraint added columns")  # see _can_redo
        if "objective" in self.dependent:
            self.ir.objective = low._objective()
        low.finish_blocks()

    def _new_bounds(self, d: ast.VarDecl) -> None:
        low = self.low
        fam, offset = low.vars[d.name]
        k = next(i for i, f in enumerate(low.var_families) if f.name == d.name)
        lb, ub = low.var_bounds(d, fam)
        low.lb[k] = lb.astype(float)
        low.ub[k] = ub.astype(float)
        vf = copy.copy(low.var_families[k])
        vf.lb, vf.ub = low.lb[k], low.ub[k]
        low.var_families[k] = vf

    def _relower_constraint(self, d: ast.ConstraintDecl) -> None:
        low = self.low
        where = next((i for i, b in enumerate(low.blocks) if b.name == d.name), None)
        kept = [b for b in low.blocks if b.name != d.name]
        low.blocks[:] = kept
        low._constraint(d)
        if where is not None and len(low.blocks) > len(kept):
            low.blocks.insert(where, low.blocks.pop())

    def _snapshot(self) -> IRModel:
        """A new IRModel over the current families and blocks (lists copied, arrays shared:
        `at` replaces arrays, it never writes into them)."""
        ir = IRModel(self.ir.name, list(self.low.var_families), list(self.low.blocks),
                     self.ir.objective)
        ir.observed = self.ir.observed
        return ir


def same_ir(a: IRModel, b: IRModel) -> bool:
    """Same columns, rows, coefficients, bounds and objective (for tests and self-checks)."""
    if [(f.name, f.kind, f.keys) for f in a.variables] != [(f.name, f.kind, f.keys) for f in b.variables]:
        return False
    la, ua = a.column_bounds()
    lb, ub = b.column_bounds()
    if not (np.array_equal(la, lb) and np.array_equal(ua, ub)):
        return False
    if [(c.name, c.keys) for c in a.constraints] != [(c.name, c.keys) for c in b.constraints]:
        return False
    for x, y in zip(a.constraints, b.constraints):
        if (x.A != y.A).nnz or not (np.array_equal(x.lo, y.lo) and np.array_equal(x.hi, y.hi)):
            return False
    oa, ob = a.objective, b.objective
    if oa is None or ob is None:
        return oa is None and ob is None
    return (np.array_equal(oa.c, ob.c) and oa.constant == ob.constant
            and oa.sense == ob.sense)
