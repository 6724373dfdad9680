"""What the PyTorch wing adds to the package's shape (`tests/test_layout.py` checks circles,
deferred imports and sizes over the whole package): no private name imported from another of
its modules, and the CLI's parser is built without torch.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = "schedlang.pytorch"
ROOT = Path(__file__).resolve().parents[2] / "schedlang" / "pytorch"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, tuple[Path, ast.Module]]:
    return {_module_name(p): (p, ast.parse(p.read_text(), str(p)))
            for p in sorted(ROOT.rglob("*.py"))}


MODULES = _modules()


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[:len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _own(name: str) -> str | None:
    """The package module `name` is, or the one it is inside (``a.b.func`` -> ``a.b``)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(module: str):
    """(imported package module, the names imported from it, the import node, whether it is
    inside a function) for every import of a package module in `module`."""
    path, tree = MODULES[module]
    functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef,
                                                             ast.AsyncFunctionDef))]
    inside = {id(n) for f in functions for n in ast.walk(f)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _own(alias.name)
                if target:
                    yield target, [], node, id(node) in inside
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, path, node)
            for alias in node.names:
                sub = _own(f"{base}.{alias.name}")
                if sub and sub != _own(base):  # a submodule: ``from . import fit``
                    yield sub, [], node, id(node) in inside
                elif _own(base):
                    yield _own(base), [alias.name], node, id(node) in inside


def test_the_cli_parses_without_torch():
    """`schedlang --help`, `check` and `solve` build the parser with the trace and run
    commands' arguments: that imports no torch."""
    code = "import sys, schedlang.cli.main; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_no_private_name_imported_from_another_module():
    private = [f"{MODULES[m][0].name}:{node.lineno} imports {target}.{name}"
               for m in MODULES for target, names, node, _ in _imports(m)
               for name in names if name.startswith("_") and not name.startswith("__")]
    assert not private, private
