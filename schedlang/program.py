"""Files -> one Program: `use` resolution, and the rules for extending a used model.

A file may `use` a shipped model (by name, `models/NAME.sched`) or another file (by quoted
path). Declarations of the used files come first. A later file may:
  * add sets, params, variables, expressions, constraints;
  * redefine a declaration of a used file by declaring the same name again (it replaces it);
  * give a value to a param declared with `default`;
  * `drop NAME` a constraint;
  * replace the objective (`minimize NAME: ...`) or add terms to it (`minimize NAME += ...`).
Declaring one name twice in the same file is an error.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from . import ast
from .errors import CheckError, DataError, Loc, did_you_mean
from .graph import Graph
from .graphdata import budget_value, build_graph
from .parser import parse_file, parse_text
from .resources import models_dir, shipped_models

DECL_TYPES = (ast.SetDecl, ast.ParamDecl, ast.VarDecl, ast.ExprDecl, ast.ConstraintDecl)
KIND_WORD = {ast.SetDecl: "set", ast.ParamDecl: "param", ast.VarDecl: "var",
             ast.ExprDecl: "expr", ast.ConstraintDecl: "constraint"}


@dataclass
class Program:
    model: ast.ModelDecl | None = None
    decls: dict[str, object] = field(default_factory=dict)  # name -> declaration, in order
    objective: ast.ObjectiveDecl | None = None
    objective_terms: list[ast.ObjectiveDecl] = field(default_factory=list)  # `+=` extensions
    decode: ast.DecodeDecl | None = None
    graph: Graph | None = None
    budgets: dict[str, int] = field(default_factory=dict)
    budget_locs: dict[str, Loc] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    modules: list[ast.Module] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.model.name if self.model else (self.graph.name if self.graph else "model")

    def by_kind(self, kind) -> list:
        return [d for d in self.decls.values() if isinstance(d, kind)]

    @property
    def has_formulation(self) -> bool:
        return self.objective is not None or any(isinstance(d, ast.VarDecl) for d in self.decls.values())


def resolve_model(target: str, relative_to: Path | None, loc: Loc, is_path: bool = False) -> Path:
    """A model name (shipped) or a path -> the file to read."""
    if is_path or target.endswith(".sched") or "/" in target:
        p = Path(target)
        if not p.is_absolute() and relative_to is not None and not p.exists():
            p = relative_to / p
        if not p.exists():
            raise CheckError(f"model file '{target}' not found", loc)
        return p
    if relative_to is not None and (relative_to / f"{target}.sched").exists():
        return relative_to / f"{target}.sched"
    shipped = models_dir() / f"{target}.sched"
    if shipped.exists():
        return shipped
    names = shipped_models()
    raise CheckError(f"unknown model '{target}'{did_you_mean(target, names)}; shipped models: "
                     f"{', '.join(names)}", loc)


class _Merger:
    def __init__(self):
        self.program = Program()
        self.loaded: set[Path] = set()
        self.stack: list[Path] = []

    def add_path(self, path: Path, loc: Loc | None = None):
        real = path.resolve()
        if real in self.stack:
            raise CheckError(f"'use' cycle: {' -> '.join(p.name for p in self.stack + [real])}", loc)
        if real in self.loaded:
            return
        self.loaded.add(real)
        self.stack.append(real)
        self.add_module(parse_file(path), path.parent)
        self.stack.pop()

    def add_module(self, module: ast.Module, base: Path | None):
        p = self.program
        p.files.append(module.path)
        p.modules.append(module)
        for item in module.items:  # uses first, wherever they are written
            if isinstance(item, ast.UseDecl):
                self.add_path(resolve_model(item.target, base, item.loc, item.is_path), item.loc)
        local: dict[str, Loc] = {}
        for item in module.items:
            if isinstance(item, ast.UseDecl):
                continue
            if isinstance(item, ast.ModelDecl):
                p.model = item
            elif isinstance(item, DECL_TYPES):
                self._declare(item, local)
            elif isinstance(item, ast.DropDecl):
                if item.name not in p.decls:
                    raise CheckError(f"cannot drop '{item.name}': no such declaration"
                                     f"{did_you_mean(item.name, p.decls)}", item.loc)
                if not isinstance(p.decls[item.name], ast.ConstraintDecl):
                    raise CheckError(f"only constraints can be dropped; '{item.name}' is a "
                                     f"{KIND_WORD[type(p.decls[item.name])]}", item.loc)
                del p.decls[item.name]
            elif isinstance(item, ast.ObjectiveDecl):
                self._objective(item, local)
            elif isinstance(item, ast.DecodeDecl):
                p.decode = item
            elif isinstance(item, ast.GraphDecl):
                if p.graph is not None:
                    raise DataError(f"a second graph '{item.name}' (the first is '{p.graph.name}' at "
                                    f"{p.graph.loc}); give one graph per problem", item.loc)
                p.graph = build_graph(item)
            elif isinstance(item, ast.BudgetDecl):
                if item.kind in local:
                    raise DataError(f"budget {item.kind} is given twice (first at {local[item.kind]})", item.loc)
                local[item.kind] = item.loc
                p.budgets[item.kind] = budget_value(item)
                p.budget_locs[item.kind] = item.loc

    def _declare(self, item, local: dict[str, Loc]):
        p = self.program
        if item.name in local:
            raise CheckError(f"'{item.name}' is declared twice in this file (first at {local[item.name]})", item.loc)
        local[item.name] = item.loc
        old = p.decls.get(item.name)
        if old is not None and type(old) is not type(item):
            raise CheckError(f"'{item.name}' redefines a {KIND_WORD[type(old)]} (at {old.loc}) as a "
                             f"{KIND_WORD[type(item)]}", item.loc)
        p.decls[item.name] = item  # replaces a used file's declaration in place

    def _objective(self, item: ast.ObjectiveDecl, local: dict[str, Loc]):
        p = self.program
        if item.extend:
            if p.objective is None or p.objective.name != item.name:
                have = f"; the objective is '{p.objective.name}'" if p.objective else ""
                raise CheckError(f"'+=' adds to an existing objective, and there is no objective "
                                 f"'{item.name}'{have}", item.loc)
            if p.objective.sense != item.sense:
                raise CheckError(f"objective '{item.name}' is a {'minimization' if p.objective.sense == 'min' else 'maximization'}", item.loc)
            p.objective_terms.append(item)
            return
        if "objective" in local:
            raise CheckError(f"a second objective in this file (first at {local['objective']})", item.loc)
        local["objective"] = item.loc
        p.objective, p.objective_terms = item, []


def load_program(paths: list, extra_models: list[str] | None = None, text: str | None = None,
                 text_path: str = "<input>") -> Program:
    """Parse and merge: `extra_models` (e.g. --model) first, then the files in order."""
    merger = _Merger()
    for m in extra_models or []:
        merger.add_path(resolve_model(m, Path.cwd(), Loc("--model")), Loc("--model"))
    for path in paths:
        merger.add_path(Path(path))
    if text is not None:
        merger.add_module(parse_text(text, text_path), Path.cwd())
    return merger.program
