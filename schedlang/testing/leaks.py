"""What a test's code leaves alive: every live CPU tensor storage, against snapshots.

    before = snapshot()                    # nothing of the test yet
    model, inputs, loss_fn = make()
    made = snapshot()                      # + the model, its inputs, the test's own copies
    fm = fit(model, inputs, ...)
    assert new_bytes(made) <= 0.01 * plain_peak      # what fit keeps
    del fm, model, inputs, made
    assert new_bytes(before) == 0                    # nothing at all

`host_copy(x)` keeps values to compare with later as NumPy copies (no tensor storage).
`snapshot()` holds the storages it found (so that no storage made later reuses one's address
and hides in it): drop a snapshot that holds the model before counting what its deletion left.
Storages are found by `schedlang.pytorch.live.live_storages` (the collector's tensors, their
gradients, what their autograd graphs saved), after a garbage collection.
"""
from __future__ import annotations

import gc

import torch
from torch.utils._pytree import tree_map

from schedlang.pytorch.live import live_storages


def snapshot() -> dict:
    """{data pointer: storage} of every live CPU storage now."""
    gc.collect()
    return live_storages()


def new_bytes(*snapshots) -> int:
    """Bytes of the live CPU storages in none of `snapshots`."""
    gc.collect()
    skip = set().union(*snapshots)
    return sum(s.nbytes() for key, s in live_storages().items() if key not in skip)


def host_copy(tree):
    """`tree` with every tensor replaced by a NumPy copy of its values (bfloat16 as float32,
    which is exact). What a test keeps to compare with later must not be tensor memory while
    it measures a step: the CPU tracker counts every live storage, as CUDA's allocator counts
    every tensor on the device (a test on CUDA keeps `.cpu()` copies for the same reason)."""
    def copy(x):
        if not isinstance(x, torch.Tensor):
            return x
        x = x.detach().cpu()
        if x.dtype in (torch.bfloat16, torch.float16):
            x = x.float()
        return x.numpy().copy()

    return tree_map(copy, tree)
