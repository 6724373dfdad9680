"""``MODULE:FACTORY`` of `schedlang run` and `schedlang trace`: the callable it names.

MODULE is a path to a ``.py`` file (``examples/mymodels.py``) or a dotted module name
importable from the current folder (``mymodels``); FACTORY a name in it, or a dotted path to
an attribute (``Models.small``). Every problem — no such file, a module that fails to import,
a missing or non-callable name — is a `SchedError` located at the argument.
"""
from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from pathlib import Path

from ..language.errors import Loc, SchedError, did_you_mean
from ..language.paths import exists, readable_file

__all__ = ["load_factory"]


def _module_name(stem: str) -> str:
    return re.sub(r"\W", "_", stem) or "factory_module"


def _import(module_name: str, where: Loc):

    if module_name.endswith(".py") or "/" in module_name or exists(module_name):
        path = readable_file(module_name, where, "module")
        spec = importlib.util.spec_from_file_location(_module_name(path.stem), path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # classes defined there pickle and print by name
        spec.loader.exec_module(module)
        return module
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    return importlib.import_module(module_name)


def load_factory(spec: str, error=SchedError):
    """The callable `spec` (``MODULE:FACTORY``) names; problems raise `error` (a `SchedError`
    class) located at the argument."""
    where = Loc(spec if len(spec) <= 120 else spec[:117] + "...")
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise error(f"expected MODULE:FACTORY (e.g. examples/mymodels.py:make_gpt), got "
                    f"'{spec}'", where)
    try:
        module = _import(module_name, where)
    except SchedError:
        raise
    except ImportError as exc:
        raise error(f"cannot import '{module_name}': {exc}", where) from None
    except Exception as exc:  # the user's module failed while loading
        raise error(f"importing '{module_name}' failed: {type(exc).__name__}: {exc}",
                    where) from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(obj) if not n.startswith("_")]
            raise error(f"'{module_name}' has no attribute '{attr}'{did_you_mean(part, names)}",
                        where)
        obj = getattr(obj, part)
    if not callable(obj):
        raise error(f"'{spec}' is not callable", where)
    return obj
