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

from ..graphs.graph import Graph
from ..language import ast
from ..language.builtins import GraphData
from ..language.parser import name_loc
from ..language.program import Program
from .domains import Domains
from .emit import Emission
from .expressions import Expressions
from .ir import ConstraintBlock, IRModel, Observed, VarFamily
from .logic import Formulas
from .params import Params
from .relational import Const, Family, Lin, SetRel, SetVal, Universe
from .sizes import DEFAULT_MAX_ELEMENTS, SizeError, size_message
from .variables import Variables
from .walk import index_names, references


class Lowering(Domains, Params, Variables, Expressions, Emission):
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
        self.exprs: dict[str, tuple[Family, Const | Lin]] = {}
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
            fam = self.decl_family(d)
            names = index_names(d.index)
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
            for ref in set().union(*map(references, terms)):
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



def lower_program(program: Program, graph: Graph | None, budgets: dict[str, int],
                  max_elements: int | None = None) -> IRModel:
    """The IR of `program` on `graph`; `max_elements`: the size guard's limit (sizes.py)."""
    low = Lowering(program, graph, budgets, max_elements)
    ir = low.run()
    low.finish_blocks()
    return ir
