"""One walk over a plan's ops, shared by everything that runs a plan.

The simulator, the allocator's liveness analysis, the PyTorch plan executor and the hook
front end's block wrappers all read the same op list (`schedlang.plans.plan.Op`); each subclasses
`PlanInterpreter` and gives a meaning to the op kinds it cares about, one method per kind
(`OP_METHODS`). The walk itself — order, the op's index for messages, the hooks around each
op — lives here only, so a new op kind is added in one place (`plan.OP_FIELDS` and a method
here) and every interpreter that ignores it keeps working.
"""
from __future__ import annotations

from collections.abc import Iterable

from .plan import OP_KINDS, Op

#: op kind -> the `PlanInterpreter` method that runs it
OP_METHODS: dict[str, str] = {kind: f"on_{kind}" for kind in OP_KINDS}


class PlanInterpreter:
    """Runs plan ops in order: `before_op`, the op's own method, `after_op`.

    Every op method does nothing by default: an interpreter overrides the kinds that mean
    something to it (the allocator has no use for a `wait`). `index` is the position of the
    op being run, 0-based as in the plan file's ``ops`` array and in every message."""

    index: int = -1

    def run(self, ops: Iterable[Op]) -> None:
        for index, op in enumerate(ops):
            self.index = index
            self.before_op(op)
            self.dispatch(op)
            self.after_op(op)

    def dispatch(self, op: Op) -> None:
        method = OP_METHODS.get(op.op)
        if method is None:
            self.on_unknown(op)
        else:
            getattr(self, method)(op)

    def on_unknown(self, op: Op) -> None:
        """An op of a kind no method runs (`OP_KINDS` lists the known ones)."""
        raise ValueError(f"op {self.index}: unknown op kind {op.op!r}")

    def before_op(self, op: Op) -> None:
        """Called before each op (a timeline's mark, a step counter)."""

    def after_op(self, op: Op) -> None:
        """Called after each op (memory accounting, recording)."""

    def on_compute(self, op: Op) -> None:
        """Run `op.node` (with `op.option`, a layer's option, where the graph has options)."""

    def on_delete(self, op: Op) -> None:
        """Free datum `op.data`."""

    def on_drop_phantom(self, op: Op) -> None:
        """Free what layer `op.layer`'s forward saved for its backward."""

    def on_offload(self, op: Op) -> None:
        """Start copying `op.data` (or layer `op.layer`'s phantom; `op.fraction` of it) to
        host memory."""

    def on_prefetch(self, op: Op) -> None:
        """Start copying `op.data` (or a phantom) back from host memory."""

    def on_wait(self, op: Op) -> None:
        """Wait for the transfers on `op.channel` (those of `op.data` or `op.layer`)."""
