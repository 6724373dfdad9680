"""The hook front end's offload: what a block saves kept in host memory until its backward.

A per-block wrapper (`schedlang.pytorch.frontends.blocks.hooked`) with the choice
``autograd+offload`` runs its
block's forward under saved-tensor hooks (`offloading`): each tensor autograd saves (not a
parameter or buffer, and on the compute device) is copied to host memory as it is saved, and
copied back when the backward reads it, one tensor at a time. The device copy is freed as
soon as the forward no longer uses it; nothing the block saved stays on the device between
its forward and its backward. The copies run on the compute stream (CUDA: asynchronous to the
host, not to the kernels around them): they do not overlap the block's compute.

That is a layer *option*, priced as the runtime runs it, not a schedule of transfers: the
plan gives the block the option ``offload`` (`with_offload_options`), and the solver weighs it
against ``autograd``, ``recompute`` and ``selective`` like any other option —

* memory as the profiler measures it (`profile`'s option ``offload``, once per distinct block,
  `offload_profiles`): the phantom is what the forward leaves on the device beyond its outputs,
  the overheads the peaks of its forward and of its backward (which brings the saved tensors
  back one by one);
* time: ``autograd``'s, plus the bytes the hooks copy over the link, device -> host in the
  forward and host -> device in the backward (`hostlink.HostLink`);
* needs: no datum (the saved inputs and outputs are in the host copy).

A plan's own transfer ops (offload.sched) have no runtime here: the wrappers cannot time a
copy inside the model's forward. The fx front end runs those (`runtime.PlanExecutor`).
"""
from __future__ import annotations

import contextlib
import copy

import torch

from ....graphs.elements import Option
from ....graphs.graph import Graph
from ...hostlink import HostLink, host_buffer

__all__ = ["offloading", "module_storages", "with_offload_options",
           "OFFLOAD"]

#: the option name of a block whose saved tensors wait in host memory
OFFLOAD = "offload"


def module_storages(module) -> set[int]:
    """The storages of a module's parameters and buffers (they stay on the device)."""
    return {t.untyped_storage().data_ptr()
            for t in list(module.parameters()) + list(module.buffers())}


@contextlib.contextmanager
def offloading(keep: set[int], copied: list | None = None):
    """Saved tensors of the forward run inside go to host memory and come back, one by one,
    when the backward reads them; tensors whose storage is in `keep` (parameters, buffers)
    stay. `copied[0]` grows by the bytes copied to the host."""

    def pack(t):
        try:
            key = t.untyped_storage().data_ptr()
        except (RuntimeError, NotImplementedError):
            return t
        if key in keep:
            return t
        # the host copy keeps the tensor's strides when it fills its storage (a permuted,
        # channels-last tensor): the backward then reads the same layout, and computes the
        # same bits, as from the tensor itself
        whole = t.storage_offset() == 0 and \
            t.untyped_storage().nbytes() == t.numel() * t.element_size()
        stride = t.stride() if whole else None
        host = host_buffer(t.shape, t.dtype, t.device, stride)
        from torch.utils._python_dispatch import _disable_current_modes

        with _disable_current_modes():
            host.copy_(t, non_blocking=t.device.type == "cuda")
        if copied is not None:
            copied[0] += t.numel() * t.element_size()
        return (t.device, host)

    def unpack(x):
        if isinstance(x, torch.Tensor):
            return x
        device, host = x
        return host.to(device, non_blocking=True) if device.type == "cuda" else host.clone()

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        yield


def with_offload_options(graph: Graph, profiles: dict, link: HostLink) -> Graph:
    """`graph` with the option ``offload`` on every block of `profiles` that has
    ``autograd``: memory as measured, time ``autograd``'s plus the copies over `link`."""
    g = copy.copy(graph)
    layers = []
    for lay in graph.layers:
        prof = profiles.get(lay.name)
        auto = next((o for o in lay.options if o.name == "autograd"), None)
        if prof is not None and auto is not None and \
                all(o.name != OFFLOAD for o in lay.options):
            out = _seconds(prof.host_bytes, link.offload)
            back = _seconds(prof.host_bytes, link.prefetch)
            lay = copy.copy(lay)
            lay.options = list(lay.options) + [Option(
                OFFLOAD, auto.fwd_time + out, int(prof.fwd_overhead), auto.bwd_time + back,
                int(prof.bwd_overhead), int(prof.phantom), [])]
        layers.append(lay)
    g.layers = layers
    return g


def _seconds(nbytes: int, rate: float) -> float:
    if rate == float("inf"):
        return 0.0
    return float(f"{nbytes / rate:.4g}")
