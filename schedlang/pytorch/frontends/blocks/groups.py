"""Checkpointed groups of blocks (`Group`): consecutive blocks that run as one
`checkpoint_sequential` segment, though the model's own code calls each block.

The first block's call opens the group (its inputs are what the group keeps), the last one's
return closes it, and nothing the blocks between save is kept. Each later block's call is
recorded with the tensors that come from the block before as references to its outputs, so
the backward replays the blocks in order from the group's input, RNG state restored (the glue
between them runs no op: `plan_reading.block_chains`). BatchNorm running statistics are left
as the first forward left them. A group runs one of two ways, with the same memory and the
same gradients, eager PyTorch's bit for bit:

* the ``rerun`` way, where every member offers ``rerun`` (`rerun.rerun_blocks`: exact, no
  torch.distributed) and the group's input needs a gradient: the members run without
  autograd, and the last one's call is a `recompute.rerun_group_call` node whose backward
  runs every member again with autograd, then their backwards, nested. No graph is built and
  no saved tensor goes through Python hooks in the forward, as for a ``rerun`` block. The
  members' outputs reach the model's code as views whose backward is a located error
  (`_ReadOutside`): read by anything but the next member, they would give no gradient;
* else torch's own non-reentrant checkpoint, opened by the first block's call and closed by
  the last one's (`recompute.open_checkpoint`).
"""
from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from ...model_state import running_stats_kept
from ...recompute import FirstRun, nested_backward_allowed, open_checkpoint, rerun_group_call, rng_devices
from .find import WHERE, BlockError

__all__ = ["Group"]


#: what `_ReadOutside` nodes take as their input that needs a gradient (no bytes)
_ANCHOR = torch.empty(0, requires_grad=True)


class _ReadOutside(torch.autograd.Function):
    """An output of a group's member (not its last) run the ``rerun`` way, as the model's code
    gets it: the tensor itself (a view), whose backward is an error. The member ran without
    autograd, so no gradient reaches its inputs from this tensor; the next member alone may
    read it (`plan_reading.block_chains`), and it does so in the group's node. Code that reads
    it besides (a path the recorded run did not take: the hidden states of every layer asked
    for) gets a clear error in the backward, not gradients that miss its part."""

    @staticmethod
    def forward(ctx, anchor, x, block: str):
        ctx.block = block
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        raise BlockError(f"an output of block '{ctx.block}' was read outside its checkpointed "
                         "group, which runs it without autograd: the model took another path "
                         "than the recorded run (e.g. every layer's hidden states asked for); "
                         "fit it again on inputs that take this path", WHERE)


def _guarded(out, block: str):
    """`out` with each floating-point tensor as a `_ReadOutside` view (autograd on)."""
    flat, spec = tree_flatten(out)
    with torch.enable_grad():
        flat = [_ReadOutside.apply(_ANCHOR, x, block)
                if isinstance(x, torch.Tensor) and (x.is_floating_point() or x.is_complex())
                else x for x in flat]
    return tree_unflatten(flat, spec)


class _Chained:
    """In a group's recorded call of a block: "output `index` of the block before"."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index


class _Given:
    """In a group's recorded call of a block: "tensor `index` of those the group reads from
    outside it" (the checkpoint's inputs, or the ``rerun`` node's)."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index


def _tensor_leaves(out) -> list:
    return [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]


@dataclass
class _OpenGroup:
    """A group between its first block's call and its last block's return."""

    calls: list  # per block called so far: (forward, argument spec, leaves)
    # the ``rerun`` way: the tensors read from outside (by identity -> index), where a
    # gradient goes one use at a time (`recompute.USE_SLOTS`), and the state the first member
    # started from; else torch's checkpoint generator, suspended inside its saved-tensor hooks
    given: list = field(default_factory=list)
    given_at: dict = field(default_factory=dict)
    apart: list = field(default_factory=list)  # (once per member that reads it)
    first: FirstRun | None = None
    checkpoint: object = None
    last_outputs: list = field(default_factory=list)  # the tensors the last block returned


class Group:
    """Consecutive blocks run as one checkpointed segment (the module docstring).
    `rerun`: run it the ``rerun`` way where it can; `apart`: per member, the positions among
    its call's tensors of those other code reads too (`rerun.shared_arguments`)."""

    def __init__(self, names: list[str], modules: list[nn.Module], rerun: bool = False,
                 apart: list[tuple[int, ...]] | None = None):
        self.names = names
        self.position = {id(m): k for k, m in enumerate(modules)}
        # weak: each block holds its group (its choice), and a group holding its blocks would
        # make the model a reference cycle, kept after `del` until a garbage collection
        self.modules = [weakref.ref(m) for m in modules]
        self.rerun = rerun
        self.apart = apart or [() for _ in modules]
        self._open: _OpenGroup | None = None

    @property
    def called(self) -> int:
        """How many of its blocks an open group has called (0: closed)."""
        return 0 if self._open is None else len(self._open.calls)

    def close(self) -> None:
        """End a group a failed forward left open (a checkpoint's hooks off the stack)."""
        if self._open is not None:
            gen, self._open = self._open.checkpoint, None
            if gen is not None:
                gen.close()

    def forward(self, module: nn.Module, fwd, args: tuple, kwargs: dict):
        k = self.position[id(module)]
        if k == 0:
            self._opened(fwd, args, kwargs)
        else:
            self._called(k, fwd, args, kwargs)
        group = self._open
        last = k == len(self.modules) - 1
        try:
            if group.checkpoint is not None:
                out = fwd(*args, **kwargs)
            elif not last:
                with torch.no_grad():
                    out = _guarded(fwd(*args, **kwargs), self.names[k])
            else:
                self._open = None
                return rerun_group_call(self._replay(group.calls), group.given,
                                        lambda: fwd(*args, **kwargs), group.first,
                                        group.apart)
        except BaseException:
            self.close()
            raise
        if not last:
            group.last_outputs = _tensor_leaves(out)  # until the next block takes them
            return out
        gen, self._open = group.checkpoint, None
        try:
            next(gen)
        except StopIteration:
            return out
        raise RuntimeError("torch.utils.checkpoint's generator did not end")  # pragma: no cover

    def _opened(self, fwd, args: tuple, kwargs: dict) -> None:
        self.close()
        # the group's input: the first call's tensors (keyword ones too), the checkpoint's
        # positional inputs (it saves those, and their devices' RNG) or the rerun node's
        flat, spec = tree_flatten((args, kwargs))
        group = _OpenGroup(calls=[])
        self._open = group
        leaves = self._leaves(0, flat, {})
        group.calls.append((fwd, spec, leaves))
        if self.rerun and nested_backward_allowed() and \
                any(t.requires_grad for t in group.given):
            group.first = FirstRun(rng_devices(group.given))
        else:
            # torch's own non-reentrant checkpoint, opened here and closed by the last block
            # (`checkpoint` itself runs one function between the two)
            group.checkpoint = open_checkpoint(self._replay(group.calls), group.given)

    def _called(self, k: int, fwd, args: tuple, kwargs: dict) -> None:
        group = self._open
        if group is None or len(group.calls) != k:
            self.close()
            raise BlockError(f"block '{self.names[k]}' ran without the blocks before it in "
                             f"its checkpointed group ({', '.join(self.names)}): the model "
                             "called its blocks in another order than the recorded run", WHERE)
        before = {id(t): i for i, t in enumerate(group.last_outputs)}
        flat, spec = tree_flatten((args, kwargs))
        leaves = self._leaves(k, flat, before)
        if not any(isinstance(x, _Chained) for x in leaves):
            self.close()
            raise BlockError(f"block '{self.names[k]}' does not take the outputs of "
                             f"'{self.names[k - 1]}': they cannot run as a group", WHERE)
        group.calls.append((fwd, spec, leaves))

    def _leaves(self, k: int, flat: list, before: dict) -> list:
        """Member `k`'s call as replayed: an output of the member before as `_Chained`; any
        other tensor as `_Given` (the first member's, and the ``rerun`` way's, are the group's
        inputs) or, under a checkpoint, as itself (its original graph gives it gradients)."""
        group = self._open
        out, position, apart = [], 0, set()
        for x in flat:
            if not isinstance(x, torch.Tensor):
                out.append(x)
                continue
            if id(x) in before:
                out.append(_Chained(before[id(x)]))
            elif k == 0 or group.checkpoint is None:
                at = group.given_at.get(id(x))
                if at is None:
                    at = group.given_at[id(x)] = len(group.given)
                    group.given.append(x)
                if position in self.apart[k]:
                    apart.add(at)
                out.append(_Given(at))
            else:
                out.append(x)
            position += 1
        group.apart += sorted(apart)
        return out

    def _replay(self, calls: list):
        modules = self.modules

        def replay(*given):
            with contextlib.ExitStack() as stack:
                for ref in modules:
                    stack.enter_context(running_stats_kept(ref()))
                prev: list = []
                out = None
                for fwd, spec, leaves in calls:
                    a, kw = tree_unflatten([prev[x.index] if isinstance(x, _Chained)
                                            else given[x.index] if isinstance(x, _Given)
                                            else x for x in leaves], spec)
                    out = fwd(*a, **kw)
                    prev = _tensor_leaves(out)
                return out

        return replay
