"""Files -> one Program: `use` resolution, and the rules for extending a used model.

A file may `use` a shipped model (by name, `models/NAME.sched`) or another file (by quoted
path). Declarations of the used files come first. A later file may:
  * add sets, params, variables, expressions, constraints;
  * redefine a declaration of a used file by declaring the same name again (it replaces it);
  * give a value to a param declared with `default`;
  * `drop NAME` a constraint;
  * add a term to a declared expression (`expr NAME[...] += ...`) or to one side of a declared
    constraint (`constraint NAME[...]: lhs += ...`, `rhs += ...`), on the rows of the domain
    written there; a later redefinition or `drop` of NAME discards the terms added before;
  * guard any declaration or extension with `when COND` (a constant condition): it exists only
    when COND holds (docs/language.md, "Extending a model").
  * replace the objective (`minimize NAME: ...`) or add terms to it (`minimize NAME += ...`).
Declaring one name twice in the same file is an error.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..graphs.graph import Graph
from ..graphs.graphdata import bandwidth_value, budget_value, build_graph
from . import ast
from .errors import CheckError, DataError, Loc, did_you_mean
from .parser import name_loc, parse_file, parse_text
from .paths import exists, readable_file
from .resources import models_dir, shipped_models

DECL_TYPES = (ast.SetDecl, ast.ParamDecl, ast.VarDecl, ast.ExprDecl, ast.ConstraintDecl)
Decl = ast.SetDecl | ast.ParamDecl | ast.VarDecl | ast.ExprDecl | ast.ConstraintDecl  # DECL_TYPES
KIND_WORD = {ast.SetDecl: "set", ast.ParamDecl: "param", ast.VarDecl: "var",
             ast.ExprDecl: "expr", ast.ConstraintDecl: "constraint"}


@dataclass
class Program:
    model: ast.ModelDecl | None = None
    decls: dict[str, Decl] = field(default_factory=dict)  # name -> declaration, in order
    objective: ast.ObjectiveDecl | None = None
    objective_terms: list[ast.ObjectiveDecl] = field(default_factory=list)  # `+=` extensions
    # `param w = {key: value, ...}` given for an indexed param declared elsewhere: the values
    # replace the declared ones key by key (the declaration's domain and value stay in force)
    param_tables: dict[str, ast.ParamDecl] = field(default_factory=dict)
    # `expr NAME[...] += ...` / `constraint NAME[...]: lhs += ...`: name -> the terms added, in order
    extensions: dict[str, list] = field(default_factory=dict)
    warnings: list = field(default_factory=list)  # lint findings of the checker (LintWarning)
    decode: ast.DecodeDecl | None = None
    graph: Graph | None = None
    budgets: dict[str, int] = field(default_factory=dict)
    budget_locs: dict[str, Loc] = field(default_factory=dict)
    bandwidths: dict[str, float] = field(default_factory=dict)  # "offload"/"prefetch" -> B/s
    files: list[str] = field(default_factory=list)
    modules: list[ast.Module] = field(default_factory=list)
    uses: dict[str, list[str]] = field(default_factory=dict)  # file -> the files it uses

    def sees(self, file: str, other: str) -> bool:
        """Whether the author of `file` saw what `other` declares: the same file, or one it
        uses (directly or not). A shipped model does not see the user's file that uses it."""
        todo, seen = [file], set()
        while todo:
            f = todo.pop()
            if f == other:
                return True
            if f not in seen:
                seen.add(f)
                todo += self.uses.get(f, [])
        return False

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
        if not p.is_absolute() and relative_to is not None and not exists(p):
            p = relative_to / p
        if not exists(p):
            if len(target) > 200 or any(len(part) > 255 for part in Path(target).parts):
                readable_file(p, loc, "model file")  # says why: the name is too long
            raise CheckError(f"model file '{target}' not found", loc)
        return p
    if relative_to is not None and exists(relative_to / f"{target}.sched"):
        return relative_to / f"{target}.sched"
    shipped = models_dir() / f"{target}.sched"
    if shipped.exists():
        return shipped
    names = shipped_models()
    raise CheckError(f"unknown model '{target}'{did_you_mean(target, names)}; shipped models: "
                     f"{', '.join(names)}", loc)


class _Merger:
    def __init__(self) -> None:
        self.program = Program()
        self.loaded: set[Path] = set()
        self.stack: list[Path] = []

    def add_path(self, path: Path, loc: Loc | None = None):
        try:
            real = path.resolve()
        except (OSError, RuntimeError, ValueError):  # a name too long, a symlink loop
            real = path.absolute()
        if real in self.stack:
            raise CheckError(f"'use' cycle: {' -> '.join(p.name for p in self.stack + [real])}", loc)
        if real in self.loaded:
            return
        self.loaded.add(real)
        self.stack.append(real)
        self.add_module(parse_file(path, loc), path.parent)
        self.stack.pop()

    def add_module(self, module: ast.Module, base: Path | None):
        p = self.program
        p.files.append(module.path)
        p.modules.append(module)
        used = p.uses.setdefault(module.path, [])
        for item in module.items:  # uses first, wherever they are written
            if isinstance(item, ast.UseDecl):
                loc = name_loc(item.target, item.loc)
                target = resolve_model(item.target, base, loc, item.is_path)
                used.append(str(target))
                self.add_path(target, loc)
        local: dict = {}  # name (or ("budget", kind), ("objective",)) -> where it is declared
        for item in module.items:
            if isinstance(item, ast.UseDecl):
                continue
            if isinstance(item, ast.ModelDecl):
                p.model = item
            elif isinstance(item, DECL_TYPES):
                self._declare(item, local)
            elif isinstance(item, ast.Extension):
                self._extend(item)
            elif isinstance(item, ast.DropDecl):
                loc = name_loc(item.name, item.loc)
                if item.name not in p.decls:
                    constraints = [n for n, d in p.decls.items() if isinstance(d, ast.ConstraintDecl)]
                    raise CheckError(f"cannot drop '{item.name}': there is no constraint '{item.name}'"
                                     f"{did_you_mean(item.name, constraints)}", loc)
                if not isinstance(p.decls[item.name], ast.ConstraintDecl):
                    raise CheckError(f"cannot drop '{item.name}': it is a "
                                     f"{KIND_WORD[type(p.decls[item.name])]}, and only constraints can be "
                                     "dropped (declare it again to redefine it)", loc)
                del p.decls[item.name]
                p.extensions.pop(item.name, None)
            elif isinstance(item, ast.ObjectiveDecl):
                self._objective(item, local)
            elif isinstance(item, ast.DecodeDecl):
                p.decode = self._decode_roles(item) if item.extend else item
            elif isinstance(item, ast.GraphDecl):
                if p.graph is not None:
                    raise DataError(f"a second graph '{item.name}' (the first is '{p.graph.name}' at "
                                    f"{p.graph.loc}); give one graph per problem", item.loc)
                p.graph = build_graph(item)
            elif isinstance(item, ast.BudgetDecl):
                key = ("budget", str(item.kind))  # not a declaration name: `param peak` may coexist
                if key in local:
                    raise DataError(f"budget {item.kind} is given twice (first at {local[key]})",
                                    name_loc(item.kind, item.loc))
                local[key] = name_loc(item.kind, item.loc)
                p.budgets[item.kind] = budget_value(item)
                p.budget_locs[item.kind] = item.loc
            elif isinstance(item, ast.BandwidthDecl):
                key = ("bandwidth", str(item.kind))
                if key in local:
                    raise DataError(f"bandwidth {item.kind} is given twice (first at {local[key]})",
                                    name_loc(item.kind, item.loc))
                local[key] = name_loc(item.kind, item.loc)
                p.bandwidths[item.kind] = bandwidth_value(item)

    def _declare(self, item, local: dict):
        p = self.program
        loc = name_loc(item.name, item.loc)
        old = p.decls.get(item.name)
        if (isinstance(old, ast.ParamDecl) and isinstance(item, ast.ParamDecl) and old.index is not None
                and item.index is None and isinstance(item.value, ast.Table)):
            if item.name in p.param_tables and f"{item.name}/data" in local:
                raise CheckError(f"data for param '{item.name}' is given twice in this file (first at "
                                 f"{local[item.name + '/data']})", loc)
            local[f"{item.name}/data"] = loc
            p.param_tables[item.name] = item  # data for the declared domain
            return
        if item.name in local:
            raise CheckError(f"'{item.name}' is declared twice in this file (first at {local[item.name]}); "
                             "rename one of them", loc)
        local[item.name] = loc
        if old is not None and type(old) is not type(item):
            old_kind, new_kind = KIND_WORD[type(old)], KIND_WORD[type(item)]
            raise CheckError(f"'{item.name}' is a {old_kind} (at {name_loc(old.name, old.loc)}) and cannot be "
                             f"redefined as a {new_kind}: a redefinition keeps the kind; pick another "
                             "name", loc)
        p.decls[item.name] = item  # replaces a used file's declaration in place
        p.extensions.pop(item.name, None)  # ... and the terms added to it

    def _extend(self, item):
        """`expr NAME += ...` or `constraint NAME: lhs/rhs += ...`: a term for a declared NAME."""
        p = self.program
        loc = name_loc(item.name, item.loc)
        want = item.extends
        word = KIND_WORD[want]
        old = p.decls.get(item.name)
        if old is None:
            same = [n for n, d in p.decls.items() if isinstance(d, want)]
            raise CheckError(f"cannot add to '{item.name}': there is no {word} '{item.name}'"
                             f"{did_you_mean(item.name, same)}; '+=' extends a declared {word}", loc)
        if not isinstance(old, want):
            kind = KIND_WORD[type(old)]
            fix = {"expr": f"`expr {item.name}[...] += ...`",
                   "constraint": f"`constraint {item.name}[...]: lhs += ...` (or rhs)"}.get(kind)
            raise CheckError(f"cannot add to '{item.name}': it is a {kind} (at {name_loc(old.name, old.loc)}); "
                             + (f"write {fix}" if fix else "'+=' adds terms to an expr or to a side of a "
                                "constraint only"), loc)
        p.extensions.setdefault(item.name, []).append(item)

    def _decode_roles(self, item: ast.DecodeDecl) -> ast.DecodeDecl:
        """`decode NAME += (role = X, ...)`: the roles added to the decode declared before."""
        old = self.program.decode
        loc = name_loc(item.decoder, item.loc)
        if old is None or old.decoder != item.decoder:
            have = f"the decoder is '{old.decoder}'" if old is not None else "there is no decode yet"
            raise CheckError(f"'+=' adds roles to the decode of a used file, and {have}: write "
                             f"`decode {item.decoder}(...)` to declare one", loc)
        for role in item.roles:
            if role in old.roles:
                raise CheckError(f"decode role '{role}' is already given (at "
                                 f"{old.role_locs.get(role, old.loc)}); '+=' adds roles: declare the "
                                 "decode again to change one", item.role_locs.get(role, loc))
        return ast.DecodeDecl(old.loc, old.decoder, {**old.roles, **item.roles},
                              {**old.role_locs, **item.role_locs})

    def _objective(self, item: ast.ObjectiveDecl, local: dict):
        p = self.program
        loc = name_loc(item.name, item.loc)
        if item.extend:
            if p.objective is None or p.objective.name != item.name:
                have = (did_you_mean(item.name, [p.objective.name]) or f"; the objective is '{p.objective.name}'"
                        if p.objective else "; there is no objective yet")
                raise CheckError(f"'+=' adds terms to an existing objective, and there is no objective "
                                 f"'{item.name}'{have}", loc)
            if p.objective.sense != item.sense:
                word = "minimize" if p.objective.sense == "min" else "maximize"
                raise CheckError(f"objective '{item.name}' is a {word[:-1]}ation: "
                                 f"write `{word} {item.name} += ...`", loc)
            p.objective_terms.append(item)
            return
        key = ("objective",)  # not a declaration name
        if key in local:
            raise CheckError(f"a second objective '{item.name}' in this file (the first is at "
                             f"{local[key]}); a formulation has one objective: add terms to it "
                             "with `+=`", loc)
        local[key] = loc
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
    program = merger.program
    if program.graph is not None:
        _share_machine_data(program, program.graph)
    return program


def attach_graph(program: Program, graph: Graph) -> Program:
    """`program` with `graph` as its graph data, as if the graph had been written in one of
    its files: the graph's budgets and bandwidths are the data's, and declarations in the
    files win over them. `graph` itself is not modified (the program holds a copy)."""
    import copy

    if program.graph is not None:
        raise DataError(f"a graph is given and the files have graph '{program.graph.name}' (at "
                        f"{program.graph.loc}); give one graph per problem", program.graph.loc)
    g = copy.copy(graph)
    g.budgets = dict(graph.budgets)
    g.bandwidths = dict(graph.bandwidths)
    program.graph = g
    program.budgets = {**graph.budgets, **program.budgets}
    program.bandwidths = {**graph.bandwidths, **program.bandwidths}
    _share_machine_data(program, g)
    return program


def _share_machine_data(program: Program, graph: Graph) -> None:
    """Machine data the simulator and planners read off the program's graph."""
    graph.bandwidths.update(program.bandwidths)
    if "host" in program.budgets:
        graph.budgets["host"] = program.budgets["host"]


def set_params(program: Program, values: dict, loc: Loc = Loc("params (--param)")) -> None:
    """Give values to scalar params declared with `default` (as a later file's
    ``param NAME = value`` would)."""
    import dataclasses

    for name, value in values.items():
        d = program.decls.get(name)
        if not isinstance(d, ast.ParamDecl) or d.index is not None or not d.is_default:
            defaults = [n for n, x in program.decls.items()
                        if isinstance(x, ast.ParamDecl) and x.index is None and x.is_default]
            raise CheckError(f"'{name}' is not a scalar param declared with `default`"
                             f"{did_you_mean(name, defaults)}; such params: "
                             f"{', '.join(defaults) or 'none'}", loc)
        program.decls[name] = dataclasses.replace(
            d, value=ast.Num(loc, float(value), "", repr(float(value))), is_default=False)
