"""What the mixins of `lower.Lowering` share: its state, and the methods one mixin calls on
another (`Domains`, `Params`, `Variables`, `Expressions`, `Emission`).

Each mixin subclasses `LoweringState`, so the type checker sees the attributes `Lowering`
sets in its constructor and the methods the other mixins define. Nothing here runs: the
attributes are annotations, and the method signatures are declared for the type checker
only (the mixins' own definitions come first in `Lowering`'s method order).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the lowering's modules import this one
    import numpy as np

    from ..graphs.graph import Graph
    from ..language import ast
    from ..language.builtins import GraphData
    from ..language.program import Program
    from .ir import ConstraintBlock, VarFamily
    from .logic import Formulas
    from .relational import Const, Family, Lin, SetRel, SetVal, Table, Universe


class LoweringState:
    """The state of one lowering (set by `lower.Lowering.__init__`)."""

    p: Program
    g: Graph | None
    budgets: dict[str, int]
    max_elements: int
    u: Universe  # every element the program names, coded
    sets: dict[str, SetVal]
    indexed_sets: dict[str, tuple[Family, SetRel]]
    params: dict[str, tuple[Family | None, np.ndarray, np.ndarray | None]]
    vars: dict[str, tuple[Family, int]]  # name -> (family, first column)
    var_families: list[VarFamily]
    exprs: dict[str, tuple[Family, Const | Lin]]  # name -> (family, value on its rows)
    recursive: set[str]  # expressions defined through themselves (auxiliary columns)
    blocks: list[ConstraintBlock]
    lb: list[np.ndarray]
    ub: list[np.ndarray]
    int_cols: list[np.ndarray]
    n_cols: int
    _const_sets: dict[int, tuple]  # id(ast node) -> (node, SetVal)
    _active: dict[int, bool]  # id(declaration) -> its `when` condition's value
    logic: Formulas
    data: GraphData

    if TYPE_CHECKING:
        # lower.Lowering
        def guard(self, count: int) -> None: ...
        def building(self, d): ...

        # expressions.Expressions
        def value(self, e, t: Table): ...
        def _num(self, e, t: Table) -> np.ndarray: ...
        def _bool(self, e, t: Table) -> np.ndarray: ...
        def _lin(self, e, t: Table) -> Lin: ...
        def _lin_of(self, v, t) -> Lin: ...

        # domains.Domains
        def domain(self, index: ast.Index | None, outer: Table | None = None) -> Table: ...
        def is_active(self, d) -> bool: ...
        def family(self, index: ast.Index | None) -> Family: ...
        def decl_family(self, d) -> Family: ...
        def set_value(self, e, t: Table): ...
        def _elem_codes(self, e, t: Table) -> np.ndarray: ...
        def _global_names(self) -> set: ...

        # params.Params
        def _fmt_key(self, codes) -> str: ...

        # variables.Variables
        def _added_term(self, ext, fam: Family): ...

        # emit.Emission
        def _emit(self, name, fam: Family, lin: Lin, op: str, loc): ...
