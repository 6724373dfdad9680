"""A model's training state kept or restored around runs that must leave no trace: parameter
gradients, buffers (BatchNorm running statistics) and RNG states (`preserved`, for profiling
and probe steps), BatchNorm statistics through a recomputed forward (`running_stats_kept`,
`once_stats`), and the model's own gradient checkpointing (`own_checkpointing`)."""
from __future__ import annotations

import contextlib
import random

import numpy as np
import torch
from torch import nn
from torch.utils._python_dispatch import _disable_current_modes

from .recompute import rng_devices

__all__ = ["preserved", "Preserved", "own_checkpointing", "running_stats_kept", "once_stats",
           "gradients_set_aside"]


@contextlib.contextmanager
def gradients_set_aside(model: nn.Module, args=(), kwargs=None):
    """Within: the gradients of `model`'s parameters and of the leaf tensors of (`args`,
    `kwargs`) that need one are None (as `zero_grad` leaves them), and those tensors are
    yielded, for steps run inside to clear again; on exit each gets back the gradient it had.
    (A gradient a measuring step left on an input would be memory the plan does not count,
    and the next step would accumulate into it.)"""
    from torch.utils._pytree import tree_flatten

    leaves = [x for x in tree_flatten((args, kwargs or {}))[0]
              if isinstance(x, torch.Tensor) and x.is_leaf and x.requires_grad]
    tensors = [p for p in model.parameters() if p.requires_grad] + leaves
    held = [(t, t.grad) for t in tensors]
    for t in tensors:
        t.grad = None
    try:
        yield tensors
    finally:
        for t, g in held:
            t.grad = g


def own_checkpointing(model: nn.Module) -> list[nn.Module]:
    """The submodules whose own gradient checkpointing is on (see the module docstring)."""
    return [m for m in model.modules() if getattr(m, "gradient_checkpointing", None) is True]


class Preserved:
    """Parameters' gradients, buffers (BatchNorm running statistics) and the RNG state (the
    CPU's and that of every device of the parameters and buffers; Python's and NumPy's global
    generators) as they were on entry,
    restored on exit; the model's own checkpointing off inside. `held()`: the tensors it keeps
    to restore, which a measurement inside it does not count (`MemoryTracker(ignore=...)`)."""

    def __init__(self, model: nn.Module):
        self.model = model

    def __enter__(self):
        self.checkpointing = own_checkpointing(self.model)
        for m in self.checkpointing:
            m.gradient_checkpointing = False

        with _disable_current_modes(), torch.no_grad():
            self.grads = [(p, p.grad) for p in self.model.parameters()]
            self.buffers = [(b, b.detach().clone()) for b in self.model.buffers()]
            self.devices = rng_devices(list(self.model.parameters()),
                                       list(self.model.buffers()))
            self.rng = [torch.get_rng_state()] + [
                getattr(torch, d.type).get_rng_state(d) for d in self.devices]
        # Python's and NumPy's global generators too: a model's own code may draw from them
        # (Wav2Vec2's SpecAugment masks: NumPy), and runs that leave no trace leave them as well
        self.host_rng = (random.getstate(), np.random.get_state())
        return self

    def held(self) -> list:
        """The copies and set-aside gradients this context keeps until it restores them."""
        return [g for _, g in self.grads if g is not None] + [v for _, v in self.buffers] \
            + self.rng

    def __exit__(self, *exc):
        random.setstate(self.host_rng[0])
        np.random.set_state(self.host_rng[1])
        torch.set_rng_state(self.rng[0])
        for d, state in zip(self.devices, self.rng[1:]):
            getattr(torch, d.type).set_rng_state(state, d)
        with torch.no_grad():
            for b, v in self.buffers:
                b.copy_(v)
        for p, g in self.grads:
            p.grad = g
        for m in self.checkpointing:
            m.gradient_checkpointing = True
        return False


def preserved(model: nn.Module):
    """Context manager: `model`'s parameter gradients, buffers and the RNG state are restored
    on exit (profiling and probe steps leave no trace)."""
    return Preserved(model)


def _bn_modules(module: nn.Module) -> list:
    return [m for m in module.modules()
            if isinstance(m, nn.modules.batchnorm._NormBase) and m.track_running_stats]


@contextlib.contextmanager
def running_stats_kept(module: nn.Module):
    """Within the context, forwards of `module` leave BatchNorm running statistics (and their
    step counters) as they were: a recomputed forward must not update them a second time."""
    bns = _bn_modules(module)
    if not bns:
        yield
        return
    with _disable_current_modes(), torch.no_grad():
        saved = [[b.detach().clone() for b in m.buffers()] for m in bns]
    try:
        yield
    finally:
        with _disable_current_modes(), torch.no_grad():
            for m, vals in zip(bns, saved):
                for b, v in zip(m.buffers(), vals):
                    # through `.data`: the recomputed BatchNorm's backward saved the buffers
                    # at their current version, which a tracked copy_ would bump
                    b.data.copy_(v)


def once_stats(module: nn.Module, fwd):
    """`fwd` for a checkpoint: its second run (the recomputation) leaves the BatchNorm running
    statistics as the first run left them (eager PyTorch updates them once per step)."""
    runs = [0]

    def run(*args, **kwargs):
        runs[0] += 1
        if runs[0] == 1:
            return fwd(*args, **kwargs)
        with running_stats_kept(module):
            return fwd(*args, **kwargs)

    return run
