"""`schedlang check --stats`: each declaration's element count, and the rows and nonzeros it
makes, read from a lowering (the guard itself, its limit and its error, is `sizes.py`)."""
from __future__ import annotations

from dataclasses import dataclass

from ..language.builtins import BUILTIN_SCALARS, BUILTIN_SETS
from ..language.errors import SchedError
from .lower import Lowering
from .sizes import SizeError
from .walk import references


@dataclass
class DeclSize:
    """One declaration's size for `schedlang check --stats` (None: not known without data)."""

    kind: str  # set, param, var, expr, constraint
    name: str
    elements: int | None
    rows: int | None = None  # constraint rows it makes (exact after lowering)
    nonzeros: int | None = None
    note: str = ""

    def to_json(self) -> dict:
        return {"kind": self.kind, "name": self.name, "elements": self.elements,
                "rows": self.rows, "nonzeros": self.nonzeros, "note": self.note}



_KINDS = (("SetDecl", "set"), ("ParamDecl", "param"), ("VarDecl", "var"),
          ("ExprDecl", "expr"), ("ConstraintDecl", "constraint"))



def declaration_sizes(program, max_elements: int | None = None) -> tuple[list[DeclSize], object]:
    """Per indexed declaration of `program` (on its graph data, when it has some): its element
    count and the constraint rows and nonzeros it makes; and the IR (None when the program
    cannot be lowered without graph data).

    With graph data the model is lowered as `solve` lowers it (same errors); without it, only
    the domains that need no graph data are built, each under the size guard, so that a model
    whose own sets explode is stopped here too. A `SizeError` always propagates."""

    low = Lowering(program, program.graph, program.budgets, max_elements)
    try:
        ir = low.run()
        low.finish_blocks()
    except SizeError:
        raise
    except SchedError:
        if program.graph is not None:
            raise
        return _domains_only(program, max_elements), None
    rows: dict[str, list[int]] = {}
    for b in ir.constraints:
        counts = rows.setdefault(b.name.split(".")[0], [0, 0])
        counts[0] += b.A.shape[0]
        counts[1] += b.A.nnz
    out = []
    for d in program.decls.values():
        kind = dict(_KINDS).get(type(d).__name__)
        if kind is None or getattr(d, "index", None) is None and kind != "var":
            continue
        n = _elements(low, d)
        r = rows.get(d.name)
        out.append(DeclSize(kind, d.name, n, r[0] if r else (0 if kind == "constraint" else None),
                            r[1] if r else (0 if kind == "constraint" else None)))
    return out, ir



def _elements(low, d) -> int | None:
    name = d.name
    if name in low.vars:
        return len(low.vars[name][0].keys)
    if name in low.exprs:
        return len(low.exprs[name][0].keys)
    if name in low.params and low.params[name][0] is not None:
        return len(low.params[name][0].keys)
    if name in low.indexed_sets:
        return len(low.indexed_sets[name][1].rows)
    if name in low.sets:
        return len(low.sets[name])
    if type(d).__name__ == "ConstraintDecl" and low.is_active(d):
        with low.building(d):
            return len(low.family(d.index).keys)
    return None



def _domains_only(program, max_elements: int | None) -> list[DeclSize]:
    """Without graph data: each indexed declaration's domain, where it needs no graph data."""

    low = Lowering(program, None, program.budgets, max_elements)
    builtin = set(BUILTIN_SETS) | set(BUILTIN_SCALARS)
    out = []
    for d in program.decls.values():
        kind = dict(_KINDS).get(type(d).__name__)
        if kind is None or getattr(d, "index", None) is None:
            continue
        if _uses_graph(d.index, program, builtin, references):
            out.append(DeclSize(kind, d.name, None, note="needs graph data"))
            continue
        try:
            with low.building(d):
                n = len(low.decl_family(d).keys)
            out.append(DeclSize(kind, d.name, n, note="domain only (no graph data)"))
        except SizeError:
            raise
        except SchedError as e:
            out.append(DeclSize(kind, d.name, None, note=f"not known without graph data ({e.message})"))
    return out



def _uses_graph(node, program, builtin: set, references, seen=None) -> bool:
    """Whether an index domain reads graph data (a built-in set or scalar), directly or through
    the declarations it names."""
    seen = set() if seen is None else seen
    for name in references(node):
        if name in builtin and name not in program.decls:
            return True
        d = program.decls.get(name)
        if d is not None and name not in seen:
            seen.add(name)
            parts = [getattr(d, "index", None), getattr(d, "value", None)]
            if any(p is not None and _uses_graph(p, program, builtin, references, seen) for p in parts):
                return True
    return False



def format_sizes(sizes: list[DeclSize], ir=None) -> str:
    """The table `schedlang check --stats` prints."""
    def num(v):
        return "-" if v is None else f"{v:,}"

    header = ["declaration", "kind", "elements", "rows", "nonzeros"]
    table = [[s.name, s.kind, num(s.elements), num(s.rows), num(s.nonzeros)] for s in sizes]
    widths = [max(len(r[i]) for r in table + [header]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
             for r in [header] + table]
    if ir is not None:
        n_vars = sum(f.size for f in ir.variables)
        n_rows = sum(b.A.shape[0] for b in ir.constraints)
        nnz = sum(b.A.nnz for b in ir.constraints)
        lines.append(f"total: {n_vars:,} variables, {n_rows:,} rows, {nnz:,} nonzeros (before presolve)")
    else:
        lines.append("total: rows and nonzeros need graph data (only domains were built)")
    return "\n".join(lines)
