"""The structure of a model's inputs: which tensors a call hands it, and where each sits.

A `forward` may take tensors nested in dicts, lists, tuples, named tuples and dataclasses
(a `transformers` batch, ``forward(self, batch)`` with ``batch["mask"]``), beside `None`s,
numbers and strings. `tensor_leaves` finds every tensor of such a structure with its path
(``batch.mask``, ``input0[1]``), the name its datum gets in the graph, so that a glue op or
a block that reads it is tied to it; `signature` describes the whole structure (the guard
that fits a module again for a new shape). A tensor inside an object these do not look into
(a custom class holding tensors in its attributes) cannot be followed: `unsupported` names
the argument, for a located error instead of a plan that does not know what it reads.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch

__all__ = ["arguments", "signature", "tensor_leaves", "unsupported"]


def _children(x):
    """(key, child) pairs of a container these functions look into, else None."""
    if isinstance(x, Mapping):
        return [(f".{k}" if isinstance(k, str) and k.isidentifier() else f"[{k!r}]", v)
                for k, v in x.items()]
    if isinstance(x, tuple) and hasattr(x, "_fields"):  # a named tuple
        return [(f".{k}", getattr(x, k)) for k in x._fields]
    if isinstance(x, (list, tuple)):
        return [(f"[{i}]", v) for i, v in enumerate(x)]
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return [(f".{f.name}", getattr(x, f.name)) for f in dataclasses.fields(x)]
    return None


def _walk(x, path: str, out: list, seen: set) -> None:
    if isinstance(x, torch.Tensor):
        out.append((path, x))
        return
    kids = _children(x)
    if kids is None or id(x) in seen:
        return
    seen.add(id(x))
    for key, v in kids:
        _walk(v, path + key, out, seen)


def arguments(args: tuple, kwargs: dict | None = None) -> list[tuple[str, object]]:
    """(name, value) of each argument of a call: ``input0``, ``input1``, ... for positional
    ones, the keyword for the others."""
    return [(f"input{i}", a) for i, a in enumerate(args)] + list((kwargs or {}).items())


def tensor_leaves(args: tuple, kwargs: dict | None = None) -> list[tuple[str, torch.Tensor]]:
    """Every tensor of a call's arguments with its path (``input0.mask``, ``labels``), in
    argument order, depth first; a container met twice is walked once."""
    out: list = []
    seen: set = set()
    for name, value in arguments(args, kwargs):
        _walk(value, name, out, seen)
    return out


def signature(args: tuple, kwargs: dict | None = None) -> tuple:
    """Per tensor (path, shape, dtype, device), then the structure's type names and other
    values: two calls with equal signatures hand the model the same kind of data."""
    leaves = tuple((p, tuple(t.shape), t.dtype, t.device) for p, t in tensor_leaves(args, kwargs))

    def shape_of(x):
        if isinstance(x, torch.Tensor):
            return "tensor"
        kids = _children(x)
        if kids is None:
            return type(x).__name__
        return (type(x).__name__, tuple((k, shape_of(v)) for k, v in kids))
    return leaves, tuple((n, shape_of(v)) for n, v in arguments(args, kwargs))


def unsupported(args: tuple, kwargs: dict | None = None) -> str | None:
    """The path of the first argument part that holds tensors where `tensor_leaves` cannot
    see them (attributes of a custom object, a set), or None."""
    for name, value in arguments(args, kwargs):
        found = _hidden(value, name, set())
        if found:
            return found
    return None


def _hidden(x, path: str, seen: set) -> str | None:
    if isinstance(x, (torch.Tensor, str, bytes, int, float, bool, complex, type(None))):
        return None
    kids = _children(x)
    if kids is not None:
        if id(x) in seen:
            return None
        seen.add(id(x))
        for key, v in kids:
            found = _hidden(v, path + key, seen)
            if found:
                return found
        return None
    if isinstance(x, (set, frozenset)):
        return path if any(isinstance(v, torch.Tensor) for v in x) else None
    attrs = getattr(x, "__dict__", None)
    if isinstance(attrs, dict) and not isinstance(x, torch.nn.Module) \
            and any(isinstance(v, torch.Tensor) for v in attrs.values()):
        return path
    return None


def split_inputs(sample_inputs, sample_kwargs=None) -> tuple[tuple, dict]:
    """(positional, keyword) sample inputs: a tensor, a tuple of positional inputs, or a dict
    of keyword inputs (``fit(model, {"input_ids": ids, "attention_mask": mask})``)."""
    if isinstance(sample_inputs, torch.Tensor):
        return (sample_inputs,), dict(sample_kwargs or {})
    if isinstance(sample_inputs, dict):
        return (), {**sample_inputs, **(sample_kwargs or {})}
    return tuple(sample_inputs), dict(sample_kwargs or {})
