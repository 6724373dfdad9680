"""The partitioned module run by a plan: its forward runs the plan's forward part and
returns the model outputs through a ``torch.autograd.Function`` whose backward runs the
backward part (`runtime.PlanExecutor.module()`)."""
from __future__ import annotations

import torch
from torch import nn

from .state import PlanError

__all__ = ["PlanModule"]


class PlanFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, executor, run, dummy, *inputs):
        outs = executor.forward(run, list(inputs))
        ctx.executor = executor
        ctx.run = run
        ctx.n_inputs = len(inputs)
        result = []
        for t in outs:
            r = t.detach()
            if not r.is_floating_point():
                ctx.mark_non_differentiable(r)
            result.append(r)
        return tuple(result)

    @staticmethod
    def backward(ctx, *grads):
        run = ctx.run
        ctx.run = None
        if run is None:
            raise RuntimeError("the plan's backward ran twice for one forward (retain_graph "
                               "is not supported by schedlang's runtime)")
        try:
            in_grads = ctx.executor.backward(run, list(grads))
        except BaseException:
            if ctx.executor.on_error is not None:
                ctx.executor.on_error()
            raise
        return (None, None, None, *in_grads)


class PlanModule(nn.Module):
    """The partitioned module run by a plan. Its parameters are the original module's."""

    def __init__(self, executor):  # a `runtime.PlanExecutor`
        super().__init__()
        self.inner = executor.part.root
        self._executor = [executor]  # not a submodule, not a parameter holder

    @property
    def executor(self):
        return self._executor[0]

    def forward(self, *args, **kwargs):
        ex = self.executor
        part = ex.part
        if not torch.is_grad_enabled():
            return part.run_eager(*args, **kwargs) if kwargs else part.run_eager(*args)
        tensors = flatten_inputs(part, args, kwargs)
        run = ex.new_run()
        dummy = torch.empty(0, device=ex.device, requires_grad=True)
        outs = PlanFunction.apply(ex, run, dummy, *tensors)
        return part.unflatten(list(outs))


def flatten_inputs(part, args, kwargs) -> list:
    fl = getattr(part, "flatten_inputs", None)
    if fl is not None:
        return list(fl(*args, **kwargs))
    if kwargs:
        raise PlanError("keyword arguments are not supported by this partitioned module")
    return [a for a in args if isinstance(a, torch.Tensor)]
