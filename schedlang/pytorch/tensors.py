"""Tensor and autograd helpers shared by the front ends, the plan executor and the options:
zero-byte placeholders, the executor's constant scalars, freeing a gradient the autograd
engine handed over, the tensor leaves of a nested value, a step's fresh input leaves and its
backward without a loss, the device a model's parameters are on."""
from __future__ import annotations

import weakref

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_map

__all__ = ["placeholder", "constant_bytes", "constant_dtypes", "scalar",
           "release_engine_grad", "flat", "fresh_leaves", "backward_with_ones", "model_device"]


def model_device(model: nn.Module) -> torch.device:
    """The device of `model`'s first parameter (the CPU for a model without parameters)."""
    return next((p.device for p in model.parameters()), torch.device("cpu"))


#: weak: the executors that made them hold them (`PlanExecutor.constants`), so that nothing of
#: a fitted module outlives it
_SCALARS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def scalar(dtype, device) -> torch.Tensor:
    """One zero scalar per dtype and device, made once while an executor holds it (a step
    allocates nothing for it)."""
    key = (dtype, str(device))
    z = _SCALARS.get(key)
    if z is None:
        z = _SCALARS[key] = torch.zeros((), dtype=dtype, device=device)
    return z


def constant_dtypes(root: nn.Module) -> list:
    """The dtypes of the executor's zero scalars: the floating types a placeholder may take
    (float32, the half types autocast gives, the parameters')."""
    return sorted({torch.float32, torch.float16, torch.bfloat16,
                   *(p.dtype for p in root.parameters())}, key=str)


def constant_bytes(root: nn.Module) -> int:
    """Bytes of a plan executor's constants (`PlanExecutor.constants`), alive from its making
    through every step: memory `fit` counts as resident (fx front end)."""
    sizes = [torch.empty((), dtype=dt, device="meta").element_size()
             for dt in constant_dtypes(root)]
    return sum(sizes) + torch.empty((), dtype=torch.float32, device="meta").element_size()


def placeholder(t: torch.Tensor) -> torch.Tensor:
    """A tensor with `t`'s sizes, dtype and device and no memory of its own."""
    return scalar(t.dtype, t.device).expand(t.shape)


def release_engine_grad(t: torch.Tensor) -> None:
    """Free the storage of a gradient the autograd engine handed to the plan's backward: the
    engine keeps a reference until the backward returns but never reads it again. Only a
    gradient that fills its whole storage is freed (not a slice of a larger gradient, nor a
    broadcast value). A user hook that kept this very tensor (``retain_grad`` on the model's
    output) would see it emptied."""
    if not isinstance(t, torch.Tensor) or t.numel() == 0 or not t.is_contiguous():
        return
    storage = t.untyped_storage()
    if storage.nbytes() == t.numel() * t.element_size():
        storage.resize_(0)


def flat(value) -> list:
    """The leaves of a nested value (tuples, lists, dicts, `ModelOutput`s)."""
    return tree_flatten(value)[0]


def fresh_leaves(value):
    """`value` with each tensor detached into a new leaf that requires a gradient where the
    tensor did: a measured or timed step's inputs, so that the samples' own `.grad` stays."""
    return tree_map(lambda t: t.detach().requires_grad_(t.requires_grad)
                    if isinstance(t, torch.Tensor) else t, value)


def backward_with_ones(out) -> None:
    """The backward of a step without a loss function: a gradient of ones for each floating
    output that requires one."""
    leaves = [t for t in flat(out) if isinstance(t, torch.Tensor)
              and t.requires_grad and t.is_floating_point()]
    torch.autograd.backward(leaves, [torch.ones_like(t) for t in leaves])
