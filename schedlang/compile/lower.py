"""Instantiate a checked Program on its graph data and lower it to the IR.

Evaluation is column-wise over binding tables (`relational.Table`): every declaration's index
domain is generated once by joins, and each expression evaluates to a whole column for all the
rows at once. Rules that users rely on (docs/language.md):

* A variable or expression referenced outside its declared domain is 0 (S[t-1, v] at the first
  t, R[t, v] with v after t); a param referenced outside its domain is an error.
* A recursive expression (U[t, k] defined from U[t, prev(k)]) becomes an auxiliary continuous
  variable per element with a defining equality, so the model stays linear in size.
* Constraint bodies (comparisons, and logic over binary literals) become rows in logic.py;
  built-in sets, scalars and functions are evaluated by their entries in builtins.py. This
  module is about domains and expressions.
"""
from __future__ import annotations

import networkx as nx
import numpy as np
import scipy.sparse as sp

from ..language import ast
from ..language.builtins import (
    BUILTIN_SCALARS,
    BUILTIN_SETS,
    CHECKMATE_VIEW,
    FUNCTIONS,
    SCALARS,
    GraphData,
)
from ..language.errors import CheckError, DataError, Loc, did_you_mean
from ..graphs.graph import Graph
from .ir import ConstraintBlock, IRModel, Objective, Observed, VarFamily
from .logic import TOL, Formulas, NeedsLowering, Rows, flatten
from ..language.parser import name_loc
from ..language.program import Program
from .relational import (
    INVALID,
    Const,
    Elem,
    Family,
    KeyIndex,
    Lin,
    SetRel,
    SetVal,
    Table,
    Universe,
    cross_rows,
    expand_ranges,
    unique_rows,
    with_row_id,
)
from .sizes import DEFAULT_MAX_ELEMENTS, SizeError, size_message
from ..language.units import UNITS, dimension


def _lowering(fn):
    """Run a Lowering method while its declaration (first argument) is the one being built."""
    import functools

    @functools.wraps(fn)
    def wrapper(self, d, *args, **kwargs):
        decl = self.p.decls.get(d.name, d) if isinstance(d, ast.Subscript) else d
        with self.building(decl):
            return fn(self, d, *args, **kwargs)
    return wrapper


class Lowering:
    """One program on one graph -> IR: domains, columns and expression values."""

    def __init__(self, program: Program, graph: Graph | None, budgets: dict[str, int],
                 max_elements: int | None = None):
        self.p = program
        self.max_elements = DEFAULT_MAX_ELEMENTS if max_elements is None else int(max_elements)
        self._building: list = []  # the declarations being lowered, innermost last (sizes.py)
        self.g = graph
        self.budgets = budgets
        self.u = Universe()
        self.sets: dict[str, SetVal] = {}
        self.indexed_sets: dict[str, tuple[Family, SetRel]] = {}
        self.params: dict[str, tuple[Family | None, np.ndarray, np.ndarray | None]] = {}
        self.vars: dict[str, tuple[Family, int]] = {}  # name -> (family, first column)
        self.var_families: list[VarFamily] = []
        self.exprs: dict[str, tuple[Family, object]] = {}
        self.recursive: set[str] = set()
        self.blocks: list[ConstraintBlock] = []
        self.lb: list[np.ndarray] = []
        self.ub: list[np.ndarray] = []
        self.int_cols: list[np.ndarray] = []
        self.n_cols = 0
        self._const_sets: dict[int, tuple] = {}  # id(ast node) -> (node, SetVal); node kept alive
        self._active: dict[int, bool] = {}  # id(declaration) -> its `when` condition's value
        self.logic = Formulas(self)  # constraint bodies -> rows (logic.py)
        self.data = GraphData(graph, self.u)  # the built-in sets and what functions read
        self.sets.update(self.data.sets)

    # ================================================================== entry point
    def run(self) -> IRModel:
        self._find_recursive_exprs()
        for d in self.p.decls.values():
            if isinstance(d, ast.VarDecl):
                self._declare_var(d)
        for name in sorted(self.recursive, key=list(self.p.decls).index):
            self._declare_aux(self.p.decls[name])
        for name in sorted(self.recursive, key=list(self.p.decls).index):
            self._define_aux(self.p.decls[name])
        for d in self.p.decls.values():
            if isinstance(d, ast.ConstraintDecl):
                self._constraint(d)
        ir = IRModel(self.p.name, self.var_families, self.blocks, self._objective())
        ir.observed = self._observed()
        return ir

    def _observed(self) -> dict:
        """Expressions named by the model's `decode` roles, kept for the decoder."""
        out = {}
        decl = self.p.decode
        for target in (decl.roles.values() if decl else []):
            d = self.p.decls.get(target) if isinstance(target, str) else None
            if not isinstance(d, ast.ExprDecl) or d.name in self.recursive:
                continue
            fam = self._decl_family(d)
            names = _index_names(d.index)
            args = [fam.table.cols[n] for n in names]
            lin = self._lin_of(self._expr_lookup(d, args, fam.table), fam.table)
            E = sp.csr_matrix((lin.coefs, (lin.rows, lin.cols)), shape=(lin.m, self.n_cols))
            keys = [tuple(self.u.value(int(c)) for c in row) for row in fam.keys]
            out[d.name] = Observed(d.name, keys, E, lin.const.copy())
        return out

    def _find_recursive_exprs(self):
        graph = nx.DiGraph()
        exprs = {d.name for d in self.p.by_kind(ast.ExprDecl)}
        for d in self.p.by_kind(ast.ExprDecl):
            graph.add_node(d.name)
            terms = [d.value] + [x.value for x in self.p.extensions.get(d.name, [])]
            for ref in set().union(*map(_references, terms)):
                if ref in exprs:
                    graph.add_edge(d.name, ref)
        for comp in nx.strongly_connected_components(graph):
            if len(comp) > 1 or any(graph.has_edge(n, n) for n in comp):
                self.recursive |= comp

    # ================================================================== size guard
    def guard(self, count: int) -> None:
        """Stop before materializing `count` rows when that is over the limit (sizes.py)."""
        if count > self.max_elements:
            d = self._building[-1] if self._building else None
            raise SizeError(size_message(d.name if d is not None else None, int(count),
                                         self.max_elements),
                            name_loc(d.name, d.loc) if d is not None else None)

    def building(self, d):
        """Context: lowering declaration `d` (named by a size error)."""
        import contextlib

        @contextlib.contextmanager
        def ctx():
            self._building.append(d)
            try:
                yield
            finally:
                self._building.pop()
        return ctx()

    # ================================================================== domains
    def domain(self, index: ast.Index | None, outer: Table | None = None) -> Table:
        """The binding table of an index domain, grown from `outer` (default: one empty row)."""
        t = outer if outer is not None else Table.unit()
        if index is None:
            return t
        conjuncts = _conjuncts(index.where) if index.where is not None else []
        for item in index.items:
            names = _pattern(item.element)
            t = self._bind(t, names, item.set, conjuncts)
            t = self._filter_ready(t, conjuncts)
        for c in conjuncts:  # anything left (e.g. no-variable conditions)
            t = t.take(np.flatnonzero(self._bool(c, t)))
        conjuncts.clear()
        return t

    def _filter_ready(self, t: Table, conjuncts: list) -> Table:
        """Apply each `where` conjunct as soon as all the names it uses are bound."""
        for c in list(conjuncts):
            if _free_names(c) <= set(t.cols) | self._global_names():
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
                        and _free_names(other) <= set(t.cols) | self._global_names()):
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
        if t.m != 1 and not isinstance(e, ast.Name) and not (_free_names(e) & set(t.cols)):
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
        if isinstance(e, ast.Call) and e.func in FUNCTIONS and FUNCTIONS[e.func].set_value is not None:
            return FUNCTIONS[e.func].set_value(self, e, t)
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
            if e.items and (e.where is not None or all(isinstance(x, ast.Member) and _is_pattern(x.element) for x in e.items)):
                inner = self.domain(ast.Index(e.loc, e.items, e.where), with_row_id(t))
                names = [n for x in e.items for n in _pattern(x.element) if n != "_"]
                names = list(dict.fromkeys(names))
                cols = np.stack([inner.cols[n] for n in names], axis=1) if names else np.zeros((inner.m, 0), np.int64)
                return self._maybe_const(SetRel(inner.cols["__row"], cols), t)
            cols = [self._tuple_codes(x, t) for x in e.items]
            if not cols:
                return SetVal(np.zeros((0, 1), dtype=np.int64))
            width = {c.shape[1] for c in cols}
            if len(width) > 1:
                raise CheckError("a set literal mixes tuples of different lengths", e.loc)
            rows = np.concatenate([np.arange(t.m, dtype=np.int64)] * len(cols))
            data = np.concatenate(cols)
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

    @_lowering
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

    @_lowering
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
        fam = self._family(d.index)
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

    def _decl_family(self, d) -> Family:
        """A declaration's domain; empty when its `when` condition is false (nothing evaluated)."""
        return self._family(d.index) if self.is_active(d) else self._empty_family(d.index)

    def _empty_family(self, index: ast.Index | None) -> Family:
        names = _index_names(index)
        keys = np.zeros((0, len(names)), np.int64)
        table = Table(0, {n: np.zeros(0, np.int64) for n in names})
        return Family(keys, KeyIndex(keys, len(self.u) + 1), table)

    def _set_arity(self, d: ast.SetDecl) -> int:
        """The tuple length of a declared set, told from its text (for a set that is not built)."""
        from ..language.check import Checker

        return Checker(self.p).set_arity(d) or 1

    def _family(self, index: ast.Index | None) -> Family:
        table = self.domain(index)
        names = _index_names(index)
        keys = np.stack([table.cols[n] for n in names], axis=1) if names else np.zeros((table.m, 0), np.int64)
        if names and len(unique_rows(keys)) != len(keys):
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

    def _check_literals(self, d, e: ast.Subscript) -> None:
        """An element written as text (`R[t, "f3"]`) must be an element of the set its
        position ranges over: a reference outside the domain is 0 by design (`S[t-1, v]`,
        `POfl["L1.bwd", ...]` where a filter leaves that phase out), but a misspelt name
        would make a term vanish silently."""
        lits = [(i, a) for i, a in enumerate(e.args) if isinstance(a, ast.Str)]
        if not lits or d.index is None or len(_index_names(d.index)) != len(e.args):
            return
        for i, a in lits:
            column = self._position_set(d.index, i)
            if column is None or len(column) == 0 \
                    or np.any(column == self.u.code(a.value)):
                continue
            names = [str(self.u.value(c)) for c in dict.fromkeys(column.tolist())]
            shown = ", ".join(f"'{n}'" for n in names[:6]) + (", ..." if len(names) > 6 else "")
            raise DataError(f"'{a.value}' is not an element of {d.name}'s index {i + 1} "
                            f"(its elements: {shown}){did_you_mean(a.value, names)}; "
                            f"{d.name}[...] with it would be 0 everywhere", a.loc)

    def _position_set(self, index: ast.Index, i: int) -> np.ndarray | None:
        """The element codes the `i`-th name of `index` ranges over (its binding's set,
        without the `where` filter), or None when that set depends on names bound before."""
        bound: set[str] = set()
        names = _index_names(index)
        for item in index.items:
            pattern = _pattern(item.element)
            if names[i] in pattern:
                if _free_names(item.set) & bound:
                    return None
                sv = self.set_value(item.set, Table.unit())
                if isinstance(sv, SetRel):
                    return None
                return sv.cols[:, pattern.index(names[i])]
            bound |= set(pattern)
        return None

    # --- params
    @_lowering
    def _param(self, d: ast.ParamDecl):
        if d.name in self.params:
            return self.params[d.name]
        if isinstance(d.value, ast.Table):
            entry = self._table_param(d)
        elif d.index is None:
            entry = (None, self._num_or_bool(d.value, Table.unit()), None)
        else:
            fam = self._family(d.index)
            values = self._num_or_bool(d.value, fam.table)
            values = values if values.dtype == bool else values.astype(float)
            table = self.p.param_tables.get(d.name)
            if table is not None:
                self._apply_table(d, table, fam, values)
            entry = (fam, values, None)
        self.params[d.name] = entry
        return entry

    def _apply_table(self, d: ast.ParamDecl, table: ast.ParamDecl, fam: Family, values: np.ndarray):
        """Values given as data replace the declared ones; a key outside the domain is an error."""
        one = Table.unit()
        for key_expr, value_expr in table.value.pairs:
            key = self._key_codes(key_expr)
            if len(key) != fam.keys.shape[1]:
                raise DataError(f"param '{d.name}' takes {fam.keys.shape[1]} indices, this key has "
                                f"{len(key)}", key_expr.loc)
            row = fam.index.lookup([np.array([c]) for c in key])[0]
            if row < 0:
                raise DataError(f"param '{d.name}': {self._fmt_key(key)} is outside its declared "
                                f"domain (declared at {d.loc})", key_expr.loc)
            values[row] = self._num(value_expr, one)[0]

    def _num_or_bool(self, e, t):
        v = self.value(e, t)
        if isinstance(v, Const):
            return np.broadcast_to(v.v, (t.m,)).copy()
        raise CheckError("a param must be a constant number", e.loc)

    def _table_param(self, d: ast.ParamDecl):
        """`param w = {a: 1, b: 2}` (a value per key), optionally over a declared domain."""
        keys, vals = [], []
        one = Table.unit()
        for k, v in d.value.pairs:
            keys.append(self._key_codes(k))
            vals.append(self._num(v, one)[0])
        arity = {len(k) for k in keys}
        if len(arity) > 1:
            raise CheckError(f"the keys of param '{d.name}' have different lengths", d.value.loc)
        keys_arr = np.array(keys, dtype=np.int64).reshape(len(keys), -1)
        for k in range(len(keys_arr)):
            for j in range(k):
                if np.array_equal(keys_arr[k], keys_arr[j]):
                    raise DataError(f"param '{d.name}' gives a value twice for "
                                    f"{self._fmt_key(keys_arr[k])}", d.value.pairs[k][0].loc)
        return (Family(keys_arr, KeyIndex(keys_arr, len(self.u) + 1), Table(len(keys))), np.array(vals), None)

    def _key_codes(self, e) -> np.ndarray:
        """A table key: element names may be written bare ({a: 1}) or quoted ({"a": 1})."""
        items = e.items if isinstance(e, ast.Tuple) else [e]
        out = []
        for x in items:
            if isinstance(x, ast.Name) and x.id not in self.p.decls and x.id not in self._global_names():
                out.append(self.u.code(x.id))
            else:
                out.append(int(self._elem_codes(x, Table.unit())[0]))
        return np.array(out, dtype=np.int64)

    def _param_lookup(self, d: ast.ParamDecl, args, t: Table, loc: Loc):
        if not self.is_active(d):
            raise DataError(f"param '{d.name}' does not exist here: the 'when' condition before it (at "
                            f"{d.when.loc}) is false", loc)
        fam, values, _ = self._param(d)
        if fam is None:
            if args:
                raise CheckError(f"param '{d.name}' is not indexed", loc)
            v = np.broadcast_to(values, (t.m,)) if values.shape == (1,) else values
            return Const(np.broadcast_to(v, (t.m,)).copy())
        if len(args) != fam.keys.shape[1]:
            raise CheckError(f"'{d.name}' takes {fam.keys.shape[1]} indices, got {len(args)}", loc)
        rows = fam.index.lookup(args, t.m)
        missing = rows < 0
        if missing.any():
            i = int(np.flatnonzero(missing)[0])
            key = self._fmt_key(np.array([a[i] for a in args]))
            raise DataError(f"param '{d.name}' has no value for {key} (outside its declared domain)", loc)
        return Const(values[rows])

    def _fmt_key(self, codes) -> str:
        vals = ["(no element)" if int(c) < 0 else str(self.u.value(int(c))) for c in codes]
        return "[" + ", ".join(vals) + "]"

    # --- variables
    @_lowering
    def _declare_var(self, d: ast.VarDecl):
        fam = self._decl_family(d)
        lb, ub = self.var_bounds(d, fam)
        self._add_family(d.name, fam, d.kind, lb, ub, d.loc, d.doc)

    @_lowering
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
    @_lowering
    def _declare_aux(self, d: ast.ExprDecl):
        fam = self._decl_family(d)
        n = len(fam.keys)
        self._add_family(d.name, fam, "continuous", np.full(n, -np.inf), np.full(n, np.inf), d.loc,
                         "auxiliary variable of the recursive expression")

    @_lowering
    def _define_aux(self, d: ast.ExprDecl):
        fam, offset = self.vars[d.name]
        body = self._lin_of(self._expr_body(d, fam), fam.table)
        m = fam.table.m
        aux = Lin(m, np.arange(m), offset + np.arange(m), np.ones(m), np.zeros(m))
        self._emit(f"{d.name}.definition", fam, aux + body.scale(-np.ones(m)), "==", d.loc)

    @_lowering
    def _expr_lookup(self, d: ast.ExprDecl, args, t: Table):
        if d.name in self.recursive:
            return self._var_lookup(d.name, args, t)
        if d.name not in self.exprs:
            fam = self._decl_family(d)
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

    def _expr_body(self, d: ast.ExprDecl, fam: Family):
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
        own = self._family(ext.index)
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
            la, lb = self._lin(e.left, t) if not isinstance(a, Lin) else a, self._lin(e.right, t) if not isinstance(b, Lin) else b
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
                return Const(np.bincount(group, np.broadcast_to(v.v.astype(float), (inner.m,)), minlength=t.m)[: t.m], v.dim)
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

    # ================================================================== constraints (rows: logic.py)
    @_lowering
    def _constraint(self, d: ast.ConstraintDecl):
        if not self.is_active(d):
            return
        fam = self._family(d.index)
        rows = Rows(fam.table.m)
        origin = np.arange(fam.table.m)
        added = [(x.side, self._added_term(x, fam)) for x in self.p.extensions.get(d.name, [])]
        added = [(side, term) for side, term in added if term is not None]
        if added:  # `lhs += ...` / `rhs += ...`: the body is a comparison (check.py)
            t = fam.table
            sides = {"lhs": self._lin(d.body.left, t), "rhs": self._lin(d.body.right, t)}
            for side, term in added:
                sides[side] = sides[side] + self._lin_of(term, t)
            self.logic.compare(d.body, sides["lhs"], sides["rhs"], t, origin, [], rows)
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
        origin = np.concatenate(origin)
        keys = [tuple(self.u.value(int(c)) for c in fam.keys[i]) for i in origin]
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


_COMPARE = {"<=": np.less_equal, ">=": np.greater_equal, "==": np.equal, "!=": np.not_equal,
            "<": np.less, ">": np.greater}


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


def _pattern(el) -> list[str]:
    if isinstance(el, ast.Name):
        return [el.id]
    return [x.id for x in el.items]


def _is_pattern(el) -> bool:
    return isinstance(el, ast.Name) or (isinstance(el, ast.Tuple) and all(isinstance(x, ast.Name) for x in el.items))


def _index_names(index: ast.Index | None) -> list[str]:
    if index is None:
        return []
    out = []
    for item in index.items:
        for n in _pattern(item.element):
            if n != "_" and n not in out:
                out.append(n)
    return out


def _conjuncts(e) -> list:
    return flatten(e, "and")


def _references(e) -> set[str]:
    out = set()
    for x in ast_nodes(e):
        if isinstance(x, ast.Name):
            out.add(x.id)
        elif isinstance(x, ast.Subscript):
            out.add(x.name)
    return out


def ast_nodes(e):
    """Every AST node under `e` (itself included), depth first."""
    stack = [e]
    while stack:
        x = stack.pop()
        yield x
        if isinstance(x, ast.Node):
            for v in vars(x).values():
                if isinstance(v, ast.Node):
                    stack.append(v)
                elif isinstance(v, list):
                    stack.extend(i for i in v if isinstance(i, ast.Node))
                    stack.extend(j for i in v if isinstance(i, tuple) for j in i if isinstance(j, ast.Node))


def _free_names(e) -> set[str]:
    return _references(e)


def lower_program(program: Program, graph: Graph | None, budgets: dict[str, int],
                  max_elements: int | None = None) -> IRModel:
    """The IR of `program` on `graph`; `max_elements`: the size guard's limit (sizes.py)."""
    low = Lowering(program, graph, budgets, max_elements)
    ir = low.run()
    low.finish_blocks()
    return ir
