"""Reference training steps for comparing a fitted model with eager PyTorch: gradients, loss
and RNG state after one step, kept as host copies (`leaks.host_copy`: nothing a later
measured step would count)."""
from __future__ import annotations

import torch

from .leaks import host_copy

__all__ = ["eager_grads", "module_grads", "assert_same", "fit_step"]


def eager_grads(model, inputs, loss_fn, seed=123):
    """Parameter and input gradients, loss and RNG state after one eager step, as host copies
    (`leaks.host_copy`: no tensor memory a later measured step would count)."""
    return module_grads(model, model, inputs, loss_fn, seed)


def module_grads(module, model, inputs, loss_fn, seed=123):
    model.zero_grad(set_to_none=True)
    ins = [x.detach().requires_grad_(x.requires_grad) for x in inputs]
    torch.manual_seed(seed)
    loss = loss_fn(module(*ins))
    loss.backward()
    after = torch.get_rng_state()
    return host_copy(([p.grad for p in model.parameters()], [x.grad for x in ins],
                      loss.detach(), after))


def assert_same(ref, got, exact=True):
    """`got` as `ref` (both from `eager_grads` / `module_grads` / `fit_step`: host copies)."""
    kw = {"rtol": 0, "atol": 0} if exact else {}
    assert len(got[0]) == len(ref[0]) and len(got[1]) == len(ref[1])
    for a, b in zip(ref[0], got[0]):
        if a is None:
            assert b is None
        else:
            torch.testing.assert_close(b, a, **kw)
    for a, b in zip(ref[1], got[1]):
        if a is None:
            assert b is None
        else:
            torch.testing.assert_close(b, a, **kw)
    torch.testing.assert_close(got[2], ref[2], **kw)
    assert (ref[3] == got[3]).all(), "the global RNG stream differs from eager PyTorch"


def fit_step(fm, model, inputs, loss_fn, seed=123, hold_output=True):
    """One training step through `fm`; the output held through the backward (`out = fm(x);
    loss_fn(out).backward()`, the loop fit's prediction is for) unless `hold_output` is False
    (`loss_fn(fm(x)).backward()`: the output freed once the loss has what it needs)."""
    model.zero_grad(set_to_none=True)
    ins = [x.detach().requires_grad_(x.requires_grad) for x in inputs]
    torch.manual_seed(seed)
    out = fm(*ins)
    loss = loss_fn(out)
    if not hold_output:
        del out
    loss.backward()
    return host_copy(([p.grad for p in model.parameters()], [x.grad for x in ins],
                      loss.detach(), torch.get_rng_state()))


def measured_step(fm, model, args, kwargs, loss_fn, held: bool = True):
    """One training step in the loop `fit` planned for — the output held through the
    backward, or released once the loss is computed — and the module's memory report (its
    first measured step: the prediction against the measurement)."""
    model.zero_grad(set_to_none=True)
    if held:
        out = fm(*args, **kwargs)
        loss_fn(out).backward()
        del out
    else:
        loss_fn(fm(*args, **kwargs)).backward()
    return fm.memory_report()
