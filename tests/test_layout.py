"""The package's shape (issue 27): no import circle, no deferred import of the package's own
modules, no file over 800 lines and no function over 120 (docs/architecture.md, "The layout").

Read from the source with `ast`, so a circle is found whether Python would trip on it or
not: every import counts, at module level and inside functions. Imports under
`if TYPE_CHECKING:` never run and are left out. Imports of optional dependencies (torch,
matplotlib, ortools, ...) inside functions are fine: only `schedlang`'s own modules must be
imported at the top of a module.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import networkx as nx
import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "schedlang"
MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 120
EXCLUDED: tuple[str, ...] = ()  # every module of the package is checked
# needs an optional dependency (torch): the core imports it only inside the functions that use
# it, as it imports torch itself (the CLI's `trace` and `run`)
OPTIONAL = ("schedlang.pytorch",)


@dataclass(frozen=True)
class Import:
    importer: str  # module name
    imported: str  # module name
    line: int
    in_function: bool


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_files() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _under(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def excluded(module: str) -> bool:
    return _under(module, EXCLUDED)


def _type_checking_block(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def imports_of(module: str, path: Path, modules: set[str]) -> list[Import]:
    """Every import of one of `modules` by `module`: `from X import name` imports the
    module X.name when there is one, else X (the packages above are not counted)."""
    is_package = path.name == "__init__.py"
    found: list[Import] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if _type_checking_block(child):
                continue
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                      ast.Lambda))
            for target in _targets(child):
                if target in modules and target != module:
                    found.append(Import(module, target, child.lineno, in_function))
            visit(child, inner)

    def _targets(node: ast.AST) -> list[str]:
        if isinstance(node, ast.Import):
            return [a.name for a in node.names]
        if not isinstance(node, ast.ImportFrom):
            return []
        if node.level:
            base = module.split(".") if is_package else module.split(".")[:-1]
            base = base[: len(base) - node.level + 1]
            source = ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module or ""
        return [f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source
                for a in node.names]

    visit(ast.parse(path.read_text(), str(path)), False)
    return found


def all_imports() -> list[Import]:
    files = package_files()
    modules = set(files)
    return [imp for name, path in files.items() for imp in imports_of(name, path, modules)]


def import_circles(imports: list[Import]) -> list[list[str]]:
    graph = nx.DiGraph()
    graph.add_edges_from((i.importer, i.imported) for i in imports
                         if not excluded(i.importer) and not excluded(i.imported))
    return sorted(sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1)


def test_no_import_circle():
    circles = import_circles(all_imports())
    assert not circles, "import circles (strongly connected modules):\n" + "\n".join(
        " <-> ".join(c) for c in circles)


def test_own_modules_are_imported_at_the_top():
    deferred = [i for i in all_imports() if i.in_function and not excluded(i.importer)
                and (_under(i.importer, OPTIONAL) or not _under(i.imported, OPTIONAL))]
    assert not deferred, "imports of schedlang's own modules inside functions:\n" + "\n".join(
        f"{i.importer}:{i.line} imports {i.imported}" for i in deferred)


def test_no_file_over_the_limit():
    long = [f"{name}: {n} lines" for name, path in package_files().items()
            if not excluded(name) and (n := len(path.read_text().splitlines())) > MAX_FILE_LINES]
    assert not long, f"files over {MAX_FILE_LINES} lines:\n" + "\n".join(long)


def test_no_function_over_the_limit():
    long = []
    for name, path in package_files().items():
        if excluded(name):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long.append(f"{name}.{node.name} (line {node.lineno}): {length} lines")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


# The checks themselves, on small made-up packages: a check that cannot fail is no check.
@pytest.fixture
def tiny_package(tmp_path, monkeypatch):
    root = tmp_path / "schedlang"

    def write(files: dict[str, str]) -> None:
        for rel, text in files.items():
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        monkeypatch.setitem(globals(), "PACKAGE", root)
    return write


def test_a_circle_through_a_function_level_import_is_found(tiny_package):
    tiny_package({"__init__.py": "",
                  "a.py": "from .b import x\n",
                  "sub/__init__.py": "",
                  "b.py": "def f():\n    from . import a\n"})
    imports = all_imports()
    assert import_circles(imports) == [["schedlang.a", "schedlang.b"]]
    assert [(i.importer, i.line) for i in imports if i.in_function] == [("schedlang.b", 2)]


def test_type_checking_imports_and_optional_dependencies_are_not_counted(tiny_package):
    tiny_package({"__init__.py": "",
                  "a.py": "from .b import x\n",
                  "b.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                           "    from .a import y\n"
                           "def f():\n    import torch\n")})
    imports = all_imports()
    assert import_circles(imports) == []
    assert not [i for i in imports if i.in_function]
