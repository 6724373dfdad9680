"""Where the hook front end offers the block option ``rerun`` (`recompute.rerun_call`), and
which of a block's arguments it hands gradients on for one use at a time.

A ``rerun`` block runs its forward without autograd, and in its backward the forward again
with autograd and its backward, nested; its parameters' gradients are accumulated there.
Eager PyTorch sums every contribution to a tensor's gradient in one buffer, in the order they
arrive. An argument the block alone reads gets its gradient summed inside the block in that
order and handed on whole: the same sums, the same bits. An argument other code reads too
(BART's, T5's and Whisper's encoder output, read by every decoder block's cross-attention,
keys and values; T5's position bias) would be summed as (a + b) + (c + d) instead of
((a + b) + c) + d, a few ulps off eager's, so the block hands on each use's gradient by itself
(`shared_arguments`: positions among its call's tensors; `recompute.USE_SLOTS`), which costs
holding them until its backward ends, hence only there. A block that shares a parameter
with other code (its gradient accumulated in two places) does not get the option; nor does a
block none of whose tensor arguments needs a gradient (a first block on the raw input): the
node's only inputs are those arguments, so its backward, where its parameters get their
gradients, would never run. Nor any block while a torch.distributed process group is up (DDP,
FSDP: see `recompute.nested_backward_allowed`)."""
from __future__ import annotations

from collections import Counter

from ...recompute import nested_backward_allowed
from .find import FoundBlocks

__all__ = ["RERUN", "rerun_blocks", "drop_inexact_reruns", "shared_arguments"]

#: the option's name
RERUN = "rerun"


def shared_arguments(found: FoundBlocks) -> dict[str, list[str]]:
    """block -> the data it reads that need a gradient and that other code reads too (another
    block, glue, the model's outputs): those `recompute.rerun_call` hands on use by use."""
    readers = Counter(d for b in found.blocks for d in b.inputs)
    readers.update(d for s in found.segments for d in s.reads)
    readers.update(found.outputs)
    return {b.name: [d for d in b.inputs if readers[d] > 1 and d in found.data
                     and found.data[d].requires_grad] for b in found.blocks}


def rerun_blocks(found: FoundBlocks) -> set[str]:
    """The blocks whose gradients ``rerun`` leaves bit for bit eager PyTorch's (see the module
    docstring)."""
    users = Counter(p for b in found.blocks for p in dict.fromkeys(b.params))
    users.update(p for s in found.segments for p in dict.fromkeys(s.params))
    out = set()
    for b in found.blocks:
        grads = [d for d in b.inputs if d in found.data and found.data[d].requires_grad]
        if grads and all(users[p] == 1 for p in b.params):
            out.add(b.name)
    return out


def drop_inexact_reruns(found: FoundBlocks, profiled) -> None:
    """Remove the option ``rerun`` from the profiled blocks (`profile.ProfiledGraph`) that
    `rerun_blocks` leaves out, and from every block under torch.distributed
    (`recompute.nested_backward_allowed`)."""
    exact = rerun_blocks(found) if nested_backward_allowed() else set()
    for lp in profiled.layers:
        if lp.name not in exact:
            lp.options = [o for o in lp.options if o.name != RERUN]
