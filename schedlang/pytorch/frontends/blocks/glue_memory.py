"""The glue's backward memory, measured in one training step of the model as it is.

The recording run (`find.find_blocks`) runs the forward only, so a glue segment's backward
memory was a guess: its forward's transient peak plus what autograd saved for it. That guess
is off either way where the glue's backward differs from its forward; Gemma-2's head divides,
squashes and rescales the logits (its final soft-cap), and the guess put the plain step's
predicted peak 178,688 B above the measured one, so `fit` did not take plans that fit.

Here one step of the model, every block plain, runs under `MemoryTracker`, and each block's
full backward hooks mark the tracker. In the backward, glue K (which runs before block K in
the forward) has the window between block K's backward end and block K-1's backward start;
the last glue's window opens when the backward starts, glue0's closes when it ends. The
outputs' gradients are given up as a loss's backward gives them up, once the node that
reads them has run (`options.release_when_consumed`). Per glue segment the result is the
window's peak above the memory at its start; the graph takes it as the glue's backward
peak (`hooked._to_graph`: its overhead is that, less the gradients the glue's backward
creates, which the graph adds itself).

No figure (the guess stands) where the windows are not what they seem: a block module called
more than once in the step (ALBERT's one layer for every layer), a block whose backward
hooks do not fire once each in the reverse of the call order (the first block fed the
model's input has no backward end to mark), or a step that fails.
"""
from __future__ import annotations

import logging
import warnings

import torch

from ...inputs import tensor_leaves
from ...memory import MemoryTracker
from ...model_state import gradients_set_aside, preserved
from ...options import release_when_consumed
from ...tensors import flat
from .find import FoundBlocks
from .in_context import BACKWARD_HOOK_OUTPUT

__all__ = ["glue_backward_peaks"]

log = logging.getLogger("schedlang.pytorch")


def glue_backward_peaks(found: FoundBlocks, args: tuple, kwargs: dict) -> dict[str, int]:
    """glue segment name -> its backward's peak above the memory at its window's start (see
    the module docstring); empty where the step's windows are not clean."""
    model = found.model
    blocks = [b.module for b in found.blocks]
    if not blocks or len({id(m) for m in blocks}) != len(blocks):
        return {}
    events: list[tuple[str, int, int, int]] = []  # (pre/post, block index, window peak, now)
    tracker: list[MemoryTracker] = []

    def marker(kind: str, k: int):
        def hook(*_):
            if tracker:
                events.append((kind, k, *tracker[0].mark()))
        return hook

    handles = []
    for k, m in enumerate(blocks):
        handles.append(m.register_full_backward_pre_hook(marker("pre", k)))
        handles.append(m.register_full_backward_hook(marker("post", k)))
    try:
        with gradients_set_aside(model, args, kwargs), preserved(model), \
                torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            # (a block returning a `ModelOutput`: its hooks do not fire, the windows are not
            # clean and the estimate stands, `_windows`)
            warnings.filterwarnings("ignore", message=BACKWARD_HOOK_OUTPUT)
            resident = [model, *(t for _, t in tensor_leaves(args, kwargs))]
            with MemoryTracker(resident=resident, existing=False) as mt:
                out = model(*args, **kwargs)
                outs = [t for t in flat(out) if isinstance(t, torch.Tensor) and t.requires_grad]
                grads = [torch.ones_like(t) for t in outs]
                del out
                handles += release_when_consumed(outs, grads)
                mt.mark()
                start = mt.current
                tracker.append(mt)
                torch.autograd.backward(outs, grads)
                tracker.clear()
                end_peak, _ = mt.mark()
    except (RuntimeError, TypeError, ValueError) as exc:
        log.info("schedlang fit: the glue's backward memory could not be measured (%s); its "
                 "estimate stands", (str(exc).strip().splitlines() or [type(exc).__name__])[0])
        return {}
    finally:
        for h in handles:
            h.remove()
    return _windows(found, events, start, end_peak)


def _windows(found: FoundBlocks, events, start: int, end_peak: int) -> dict[str, int]:
    """glue name -> window peak above its start, from the hooks' `events` in the backward
    (`start`: the memory when it began; `end_peak`: the peak after the last event)."""
    n = len(found.blocks)
    expected = [(kind, k) for k in reversed(range(n)) for kind in ("pre", "post")]
    if [(kind, k) for kind, k, _, _ in events] != expected:
        return {}
    by_index = {seg.index: seg.name for seg in found.segments}
    out: dict[str, int] = {}
    opened = start  # the memory when the current glue window opened
    for kind, k, peak, now in events:
        if kind == "pre":  # glue k + 1's window closes (the last glue's: k = n - 1)
            if k + 1 in by_index:
                out[by_index[k + 1]] = max(0, peak - opened)
        else:
            opened = now
    if 0 in by_index:
        out[by_index[0]] = max(0, end_peak - opened)
    return out
