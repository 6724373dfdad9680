"""Where the hook front end offers the block option ``rerun`` (`recompute.rerun_call`).

A ``rerun`` block runs its forward without autograd, and in its backward the forward again
with autograd and its backward, nested: the gradient of each of its tensor arguments is summed
inside the block and handed on whole, and its parameters' gradients are accumulated there.
Eager PyTorch sums every contribution to a tensor's gradient in one buffer, in the order they
arrive: the same sums, so the same bits, where the block is the only reader of each argument
that needs a gradient (not returned by the model either) and owns its parameters. A tensor two
blocks read (BART's encoder output, read by every decoder block's cross-attention) would be
summed as (a + b) + (c + d) instead of ((a + b) + c) + d: gradients a few ulps off eager's,
so those blocks do not get the option (`recompute`, torch's non-reentrant checkpoint, runs
in the original graph and keeps eager's order). Nor does a block none of whose tensor
arguments needs a gradient (a first block on the raw input): the node's only inputs are those
arguments, so its backward, where its parameters get their gradients, would never run. Nor
any block while a torch.distributed process group is up (DDP, FSDP: see
`recompute.nested_backward_allowed`)."""
from __future__ import annotations

from collections import Counter

from ...recompute import nested_backward_allowed
from .find import FoundBlocks

__all__ = ["RERUN", "rerun_blocks", "drop_inexact_reruns"]

#: the option's name
RERUN = "rerun"


def rerun_blocks(found: FoundBlocks) -> set[str]:
    """The blocks whose gradients ``rerun`` leaves bit for bit eager PyTorch's (see the module
    docstring)."""
    readers = Counter(d for b in found.blocks for d in b.inputs)
    readers.update(d for s in found.segments for d in s.reads)
    readers.update(found.outputs)
    users = Counter(p for b in found.blocks for p in dict.fromkeys(b.params))
    users.update(p for s in found.segments for p in dict.fromkeys(s.params))
    out = set()
    for b in found.blocks:
        grads = [d for d in b.inputs if d in found.data and found.data[d].requires_grad]
        if grads and all(readers[d] == 1 for d in grads) and \
                all(users[p] == 1 for p in b.params):
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
