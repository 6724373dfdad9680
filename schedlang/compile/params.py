"""Parameters: graph-data tables and literal tables looked up by key. A mixin of
`lower.Lowering`."""
from __future__ import annotations

import numpy as np

from ..language import ast
from ..language.errors import CheckError, DataError, Loc, did_you_mean
from .lowering_state import LoweringState
from .relational import Const, Family, KeyIndex, SetRel, Table
from .walk import index_names, lowering, pattern, references


class Params(LoweringState):
    def _check_literals(self, d, e: ast.Subscript) -> None:
        """An element written as text (`R[t, "f3"]`) must be an element of the set its
        position ranges over: a reference outside the domain is 0 by design (`S[t-1, v]`,
        `POfl["L1.bwd", ...]` where a filter leaves that phase out), but a misspelt name
        would make a term vanish silently."""
        lits = [(i, a) for i, a in enumerate(e.args) if isinstance(a, ast.Str)]
        if not lits or d.index is None or len(index_names(d.index)) != len(e.args):
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
        names = index_names(index)
        for item in index.items:
            element = pattern(item.element)
            if names[i] in element:
                if references(item.set) & bound:
                    return None
                sv = self.set_value(item.set, Table.unit())
                if isinstance(sv, SetRel):
                    return None
                return sv.cols[:, element.index(names[i])]
            bound |= set(element)
        return None

    # --- params
    @lowering
    def _param(self, d: ast.ParamDecl):
        if d.name in self.params:
            return self.params[d.name]
        if isinstance(d.value, ast.Table):
            entry = self._table_param(d, d.value)
        elif d.index is None:
            entry = (None, self._num_or_bool(d.value, Table.unit()), None)
        else:
            fam = self.family(d.index)
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
        data = table.value
        if not isinstance(data, ast.Table):  # not reached: program merging keeps only tables
            raise CheckError(f"the data for param '{d.name}' is not a table", table.loc)
        for key_expr, value_expr in data.pairs:
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

    def _table_param(self, d: ast.ParamDecl, table: ast.Table):
        """`param w = {a: 1, b: 2}` (a value per key; `table` is d's value), optionally over a
        declared domain."""
        keys, vals = [], []
        one = Table.unit()
        for k, v in table.pairs:
            keys.append(self._key_codes(k))
            vals.append(self._num(v, one)[0])
        arity = {len(k) for k in keys}
        if len(arity) > 1:
            raise CheckError(f"the keys of param '{d.name}' have different lengths", table.loc)
        keys_arr = np.array(keys, dtype=np.int64).reshape(len(keys), -1)
        for k in range(len(keys_arr)):
            for j in range(k):
                if np.array_equal(keys_arr[k], keys_arr[j]):
                    raise DataError(f"param '{d.name}' gives a value twice for "
                                    f"{self._fmt_key(keys_arr[k])}", table.pairs[k][0].loc)
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
                            f"{d.when.loc if d.when is not None else d.loc}) is false", loc)
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

