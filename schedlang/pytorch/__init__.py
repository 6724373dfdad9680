"""PyTorch front end: cut a module into layers, profile them, write layered graph data.

Needs torch (an optional dependency); nothing is imported until a name is used:

* `partition(model, sample_inputs, layers=None)` -> `Partitioned`
(schedlang.pytorch.frontends.fx.partition)
* `profile(partitioned, repeats=5, ...)` -> `ProfiledGraph` (schedlang.pytorch.profile)
* `trace(model, sample_inputs, ...)` -> `Graph` (schedlang.pytorch.trace), `to_graph(profiled)`
* `find_blocks(model, args, kwargs)` -> `FoundBlocks` (schedlang.pytorch.frontends.blocks.find):
blocks and glue
  from the module tree and one hooked run (no trace)
* `fit(...)` (schedlang.pytorch.fit): train within a memory budget with a solved plan
* `MemoryTracker` (schedlang.pytorch.memory)
"""
from __future__ import annotations

import importlib
import sys
import types

_EXPORTS = {
    "partition": "frontends.fx.partition",
    "Partitioned": "frontends.fx.partition",
    "LayerPart": "frontends.fx.partition",
    "TensorMeta": "frontends.fx.partition",
    "profile": "profile",
    "ProfiledGraph": "profile",
    "trace": "trace",
    "to_graph": "trace",
    "TraceInfo": "trace",
    "fit": "fit",
    "find_blocks": "frontends.blocks.find",
    "FoundBlocks": "frontends.blocks.find",
    "MemoryTracker": "memory",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'schedlang.pytorch' has no attribute '{name}'")
    try:
        mod = importlib.import_module(f".{module}", __name__)
    except ImportError as exc:
        if getattr(exc, "name", None) == "torch" or "torch" in str(exc).split("'")[1:2]:
            raise ImportError("schedlang.pytorch needs torch: "
                              "pip install 'schedlang[torch]'") from exc
        raise
    value = getattr(mod, name)
    globals()[name] = value
    return value


class _Package(types.ModuleType):
    """Keeps `partition`, `profile`, `trace`, `fit` the functions: importing the submodules of
    the same names (``from schedlang.pytorch.frontends.fx.partition import ...``) would otherwise
    replace
    the package attribute with the submodule (they stay reachable through sys.modules)."""

    def __setattr__(self, name, value):
        if name in _EXPORTS and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
