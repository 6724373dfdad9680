"""What the lowering's pieces share: walks over a declaration's AST (its nodes, the names it
references, the conjuncts of a condition, the names an index binds, patterns) and the
decorator that marks the declaration being built (for the size guard's messages)."""
from __future__ import annotations

import functools

from ..language import ast
from .logic import flatten


def lowering(fn):
    """Run a Lowering method while its declaration (first argument) is the one being built."""
    @functools.wraps(fn)
    def wrapper(self, d, *args, **kwargs):
        decl = self.p.decls.get(d.name, d) if isinstance(d, ast.Subscript) else d
        with self.building(decl):
            return fn(self, d, *args, **kwargs)
    return wrapper



def pattern(el) -> list[str]:
    if isinstance(el, ast.Name):
        return [el.id]
    return [x.id for x in el.items]



def is_pattern(el) -> bool:
    return isinstance(el, ast.Name) or (isinstance(el, ast.Tuple) and all(isinstance(x, ast.Name) for x in el.items))



def index_names(index: ast.Index | None) -> list[str]:
    if index is None:
        return []
    out = []
    for item in index.items:
        for n in pattern(item.element):
            if n != "_" and n not in out:
                out.append(n)
    return out



def conjuncts(e) -> list:
    return flatten(e, "and")



def references(e) -> set[str]:
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
