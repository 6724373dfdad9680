"""What a fitted module checks at run time, so that a wrong input or a model whose graph
changes gives a clear error, or a new plan, and never a silently wrong gradient (issue 11).

* **Inputs** (`check_call`, at each call of a `FitModule`): the tensors' dtypes and devices must
  be those of the sample the module was fitted on (the profile, the plan and the parameters
  are for them): else `InputMismatch`. A different *shape* (another batch size, a sequence
  length) is a new problem: the module is fitted again for it, at the same budget in bytes,
  and the plan is kept per shape (`shape_key`), so a last, smaller batch of an epoch costs one
  solve the first time only. A module given a ready `graph` or `plan` cannot be fitted again:
  a new shape is then an `InputMismatch` too.
* **The graph** (`check_layer_outputs`, called by the runtime after each forward of a layer):
  the first forward of a layer the plan computes more than once in a step records its outputs'
  shapes, dtypes and a checksum (a sum, accumulated in float32: one reduction, no copy); a
  recomputation of the layer in the same step
  (from the same inputs and RNG state) must give the same. A layer whose forward depends on
  anything else (a counter, global state, a data-dependent branch on state outside its
  inputs) gives other values when recomputed, and the gradients computed from them would be
  wrong: `GraphChanged` names the layer. Data-dependent control flow *between* layers is
  caught earlier: torch.fx cannot trace it, and `fit` says so.

`guarded_fit` wraps `fit` to remember how to fit again (its arguments) on the module.
"""
from __future__ import annotations

import functools
import math
import weakref

import torch

from ..language.errors import SchedError

#: relative tolerance of the recomputation checksum (kernels may sum in another order)
CHECKSUM_RTOL = 1e-5


class InputMismatch(SchedError):
    """A fitted module was called with inputs it was not fitted for."""


class GraphChanged(SchedError):
    """A layer gave other results when recomputed: the model's graph changed within a step."""


def signature(args, kwargs=None) -> tuple:
    """Per positional argument, then per keyword argument in name order: (shape, dtype,
    device) of a tensor; the type name otherwise, followed by those of the tensors it holds
    (a dict batch, a dataclass: `inputs.tensor_leaves`)."""
    from .inputs import tensor_leaves

    values = list(args) + [kwargs[k] for k in sorted(kwargs or {})]
    out: list = []
    for a in values:
        if isinstance(a, torch.Tensor):
            out.append((tuple(a.shape), a.dtype, a.device))
            continue
        out.append(type(a).__name__)
        out += [(tuple(t.shape), t.dtype, t.device) for _, t in tensor_leaves((a,))]
    return tuple(out)


def shape_key(sig: tuple) -> tuple:
    return tuple(s[0] if isinstance(s, tuple) else s for s in sig)


def _describe(s) -> str:
    if isinstance(s, tuple):
        return f"a {str(s[1]).replace('torch.', '')} tensor of shape {list(s[0])} on {s[2]}"
    return f"a {s}"


def guarded_fit(fit):
    """`fit`, remembering on the returned module how to fit it again for another shape."""
    @functools.wraps(fit)
    def wrapper(model, sample_inputs, budget="100%", **kwargs):
        from .fit import split_inputs

        fm = fit(model, sample_inputs, budget, **kwargs)
        inputs, kw = split_inputs(sample_inputs, kwargs.get("sample_kwargs"))
        sig = signature(inputs, kw)
        fixed = [k for k in ("graph", "plan", "prepared") if kwargs.get(k) is not None]
        refit_kwargs = {k: v for k, v in kwargs.items()
                        if k not in ("graph", "plan", "prepared", "sample_kwargs")}

        # the budget in bytes, not the module: a closure the module holds that held the module
        # would keep it, and its model, alive after `del` until a garbage collection
        again_at = fm._budget if fm._budget is not None else budget

        def refit(new_inputs, new_kwargs=None):
            if fixed:
                raise InputMismatch(
                    f"this module was fitted with a given {', '.join(fixed)} for inputs "
                    f"{_shape_list(sig)}, and is called with "
                    f"{_shape_list(signature(new_inputs, new_kwargs))}: "
                    f"fit it again with a sample of the new shape")
            again = fit(model, new_inputs, again_at, sample_kwargs=new_kwargs or None,
                        **refit_kwargs)
            return again._prep, again._plan

        fm._guard = _Shapes(sig, refit, (fm._prep, fm._plan))
        fm._guard.keys = sorted(kw)
        return fm
    return wrapper


def _shape_list(sig) -> str:
    return ", ".join(str(list(s[0])) if isinstance(s, tuple) else s for s in sig)


class _Shapes:
    """The fitted signature, and the (prepared, plan) of each input shape seen so far."""

    def __init__(self, sig: tuple, refit, first):
        self.sig = sig
        self.refit = refit
        self.plans = {shape_key(sig): first}
        self.current = shape_key(sig)
        self.keys: list[str] = []  # the keyword inputs' names


def check_call(fm, args, kwargs=None) -> None:
    """Before a call of `fm` (a FitModule): raise `InputMismatch` for inputs of another dtype or
    device (or another number of them, or other keyword names) than the sample; switch to the
    plan of a new shape, fitting it first when it is new."""
    guard = getattr(fm, "_guard", None)
    if guard is None:
        return
    kwargs = kwargs or {}
    if sorted(kwargs) != guard.keys:
        raise InputMismatch(f"the module was fitted with keyword inputs "
                            f"{', '.join(guard.keys) or '(none)'} and is called with "
                            f"{', '.join(sorted(kwargs)) or '(none)'}")
    sig = signature(args, kwargs)
    if len(sig) != len(guard.sig):
        raise InputMismatch(f"the module was fitted with {len(guard.sig)} inputs and is called "
                            f"with {len(sig)}")
    for k, (got, want) in enumerate(zip(sig, guard.sig)):
        if isinstance(got, tuple) != isinstance(want, tuple) or (
                isinstance(got, tuple) and got[1:] != want[1:]):
            raise InputMismatch(
                f"input {k} is {_describe(got)}; the module was fitted on {_describe(want)}: its "
                "profile, plan and parameters are for that dtype and device (move or cast the "
                "input, or fit the module again with a sample like it)")
    key = shape_key(sig)
    if key == guard.current:
        return
    if key not in guard.plans:
        guard.plans[key] = guard.refit(tuple(args), dict(kwargs))
    prep, plan = guard.plans[key]
    fm._prep = prep
    fm._pending = None
    fm._set_plan(plan)
    guard.current = key


#: weak: the plan executors hold theirs, so that nothing of a fitted module outlives it
_SUMS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def checksum_buffer(device) -> torch.Tensor:
    """The float32 scalar a checksum is summed into on `device`, made once while held: a
    step's checksums allocate nothing (4 B each would sit above the prediction during the
    op). The plan executor makes it, and holds it, before its first step."""
    key = str(device)
    buf = _SUMS.get(key)
    if buf is None:
        buf = _SUMS[key] = torch.zeros((), dtype=torch.float32, device=device)
    return buf


def _checksum(t: torch.Tensor) -> torch.Tensor:
    """The sum of `t`: accumulated in float32 for floating-point tensors of up to 32 bits
    (no float64 copy of a large output: one pass; into `checksum_buffer`), in their own type
    otherwise."""
    t = t.detach()
    if t.is_floating_point() and t.element_size() <= 4:
        buf = checksum_buffer(t.device)
        if t.dim() == 0:
            return buf.copy_(t)
        return torch.sum(t, dim=list(range(t.dim())), dtype=torch.float32, out=buf)
    return t.sum()


def _off_device(total: torch.Tensor):
    """The recorded checksum kept off the budget's device until the recomputation compares it:
    a float on the CPU (a 4-byte tensor per recomputed layer would sit on the CPU tracker, above
    the prediction), a pinned host copy made without waiting on a GPU (the comparison
    synchronizes anyway)."""
    if total.device.type == "cpu":
        return float(total)
    host = torch.empty((), dtype=total.dtype, pin_memory=True)
    return host.copy_(total, non_blocking=True)


def _close(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= 1e-8 + CHECKSUM_RTOL * abs(b)


def check_layer_outputs(run, layer: str, outs) -> None:
    """After a forward of `layer` in the step `run`: record its outputs the first time, and
    compare a recomputation with the record (`GraphChanged` when it differs)."""
    seen = run.__dict__.setdefault("_guard_outputs", {})
    # each sum taken off the device before the next is summed into the same buffer
    now = [(tuple(t.shape), t.dtype, _off_device(_checksum(t)))
           if isinstance(t, torch.Tensor) else (None, type(t).__name__, None) for t in outs]
    first = seen.get(layer)
    if first is None:
        seen[layer] = now
        return
    cuda = [t.device for t in outs if isinstance(t, torch.Tensor) and t.is_cuda]
    if cuda:  # the pinned copies are made without waiting: wait for them now
        torch.cuda.synchronize(cuda[0])
    for k, ((shape, dtype, total), (shape0, dtype0, total0)) in enumerate(zip(now, first)):
        same = shape == shape0 and dtype == dtype0 and (total is None or _close(
            float(total), float(total0)))
        if not same:
            raise GraphChanged(
                f"layer '{layer}' gave another result when recomputed (output {k}: "
                + (f"shape {list(shape)} {dtype}, first {list(shape0)} {dtype0}"
                   if (shape, dtype) != (shape0, dtype0) else
                   f"sum {float(total):.6g}, first {float(total0):.6g}")
                + "): its forward depends on more than its inputs (a counter, global state, a "
                "branch on such state), so gradients through a recomputation would be wrong; "
                "make the layer a function of its inputs, or fit with a budget that keeps it")
    if len(now) != len(first):
        raise GraphChanged(f"layer '{layer}' returned {len(now)} outputs when recomputed, "
                           f"{len(first)} the first time")
