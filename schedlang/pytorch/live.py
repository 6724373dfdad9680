"""Every tensor storage alive in the process on a device: what CUDA's allocator counts, found
on any device without an allocator counter (the CPU).

    from schedlang.pytorch.live import live_storages, live_bytes
    before = live_storages()                 # {data_ptr: storage}
    ...
    leaked = live_bytes(exclude=before)      # bytes of storages alive now that were not then

Python's garbage collector lists every container object it tracks, reachable or not, and
tensors are such objects: `gc.get_objects()` finds each tensor that has a Python object. What
it does not find are tensors that live only in C++, and those are either

* a leaf's gradient (`.grad`, read from every leaf found), or
* what autograd saved for a backward: each graph node reached (the `grad_fn` of every tensor
  found, and the nodes that have Python objects of their own: a custom `Function`'s context,
  a node a hook closes over) holds its saved tensors, read *raw* (`_raw_saved_*.data`: the
  tensor itself, or what a saved-tensor hook packed, which is a Python object the collector
  lists by itself) — never unpacked, so no unpack hook runs (a checkpoint's would recompute).

Storages are deduplicated by data pointer (views and in-place results share their base's), and
empty storages (zero bytes, meta tensors, tensor subclasses without storage) and fake tensors
(the values a traced graph's nodes keep: shapes, no bytes) are skipped. A
`DTensor` counts as its local tensor. The scan costs a pass over every object the collector
tracks (a fraction of a second in a process that imported transformers), so it is for the
edges of a measurement — the entry of a `MemoryTracker`, a test's before and after — not for
every op.
"""
from __future__ import annotations

import gc
import itertools
from collections.abc import Iterable, Mapping

import torch
from torch._subclasses.fake_tensor import is_fake

__all__ = ["live_storages", "live_bytes", "storage_of", "read_before"]

def storage_of(t: torch.Tensor, device_type: str = "cpu"):
    """The storage behind `t` when it holds bytes on `device_type`, else None."""
    local = getattr(t, "_local_tensor", None)  # DTensor: this rank's part
    if isinstance(local, torch.Tensor):
        t = local
    if is_fake(t):  # a traced graph's values (make_fx's node.meta): no bytes, and reading
        return None  # a fake storage's data pointer warns (a later torch raises)
    try:
        if t.device.type != device_type or t.is_meta:
            return None
        s = t.untyped_storage()
        if s.nbytes() == 0 or s.data_ptr() == 0:
            return None
    except (RuntimeError, NotImplementedError, TypeError, AttributeError):
        return None  # sparse, nested, functional or fake tensors: no storage of their own
    return s


_SAVED_ATTRS: dict[type, tuple[str, ...]] = {}
#: graph node types met so far: autograd's C++ node types are no Python subclasses of `Node`
#: (an ABC that recognizes them), so they are learned from the graphs walked
_NODE_TYPES: set[type] = set()


def _subclasses(cls: type) -> set[type]:
    out, todo = {cls}, [cls]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in out:
                out.add(sub)
                todo.append(sub)
    return out


def _candidates() -> list:
    """The objects the collector tracks whose type is a tensor type or a graph node type
    (filtered by type identity in C: the scan's cost is one pass over the objects)."""
    from torch.autograd.function import BackwardCFunction

    kinds = frozenset(_subclasses(torch.Tensor) | _subclasses(BackwardCFunction) | _NODE_TYPES)
    objs = gc.get_objects()
    return list(itertools.compress(objs, map(kinds.__contains__, map(type, objs))))


def _saved_attrs(node) -> tuple[str, ...]:
    """The attributes of a graph node holding its raw saved tensors (per node type)."""
    names = _SAVED_ATTRS.get(type(node))
    if names is None:
        names = _SAVED_ATTRS[type(node)] = tuple(
            n for n in dir(node) if n.startswith("_raw_saved_"))
    return names


def _saved_tensors(node) -> list:
    out = []
    for name in _saved_attrs(node):
        try:
            raw = getattr(node, name)
        except RuntimeError:  # freed by a backward that ran (retain_graph=False)
            continue
        for saved in raw if isinstance(raw, (tuple, list)) else (raw,):
            try:
                data = saved.data
            except (RuntimeError, AttributeError):
                continue
            if isinstance(data, torch.Tensor):
                out.append(data)
            # anything else is what a saved-tensor hook packed: a Python object, and the
            # tensors in it are objects the collector lists
    return out


def live_storages(device="cpu") -> dict[int, torch.UntypedStorage]:
    """{data pointer: storage} of every live tensor storage on `device` (a device or its type;
    see the module docstring for what is found)."""
    device_type = torch.device(device).type
    found: dict[int, torch.UntypedStorage] = {}

    def add(t) -> None:
        s = storage_of(t, device_type)
        if s is not None:
            found.setdefault(s.data_ptr(), s)

    nodes: list = []
    for obj in _candidates():
        if isinstance(obj, torch.Tensor):
            add(obj)
            if obj.is_leaf:
                grad = obj._grad  # (`.grad` warns on non-leaves)
                if grad is not None:
                    add(grad)
            elif obj.grad_fn is not None:
                nodes.append(obj.grad_fn)
        else:
            nodes.append(obj)
    seen: set[int] = set()
    while nodes:
        node = nodes.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        _NODE_TYPES.add(type(node))
        for t in _saved_tensors(node):
            add(t)
        variable = getattr(node, "variable", None)  # AccumulateGrad: the leaf
        if isinstance(variable, torch.Tensor):
            add(variable)
            if variable._grad is not None:
                add(variable._grad)
        for nxt, _ in node.next_functions:
            if nxt is not None and id(nxt) not in seen:
                nodes.append(nxt)
    return found


def live_bytes(device="cpu", exclude: Mapping | Iterable = ()) -> int:
    """Bytes of the live storages on `device` (`live_storages`) other than those in `exclude`
    (data pointers, or the mapping an earlier `live_storages` returned)."""
    skip = set(exclude)
    return sum(s.nbytes() for key, s in live_storages(device).items() if key not in skip)


def read_before(fn, device="cpu"):
    """``(fn(), {data pointer: storage})``: the result of `fn` and the storages on `device` its
    ops read that none of its ops made — what it reads of the memory alive before it ran (a
    loss function's targets)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    device_type = torch.device(device).type
    made: set[int] = set()
    read: dict[int, torch.UntypedStorage] = {}

    class Reads(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            for t in tree_flatten((args, kwargs or {}))[0]:
                s = storage_of(t, device_type) if isinstance(t, torch.Tensor) else None
                if s is not None and s.data_ptr() not in made:
                    read.setdefault(s.data_ptr(), s)
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                s = storage_of(t, device_type) if isinstance(t, torch.Tensor) else None
                if s is not None and s.data_ptr() not in read:
                    made.add(s.data_ptr())
            return out

    with Reads():
        result = fn()
    return result, read
