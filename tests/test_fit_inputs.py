"""`fit` on models whose `forward` takes structured inputs (issue 26): a dict batch, nested
lists and tuples, a dataclass, `None`s and keyword arguments are planned (gradients equal
eager PyTorch's, the measured peak within the budget), a new shape inside a dict is fitted
again, and what the block wrappers cannot follow is a located error naming the argument —
which `fallback=True` turns into plain PyTorch with a warning."""
from __future__ import annotations

import dataclasses
import logging

import pytest

torch = pytest.importorskip("torch")
torch.set_num_threads(1)

from torch import nn  # noqa: E402

from schedlang.language.errors import SchedError  # noqa: E402
from schedlang.pytorch.fit import FitError, fit  # noqa: E402


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.a = nn.Linear(width, 4 * width)
        self.b = nn.Linear(4 * width, width)

    def forward(self, x, mask=None, scale=1.0):
        if isinstance(mask, Batch):
            mask = mask.mask
        y = self.b(torch.nn.functional.gelu(self.a(x))) * scale
        return x + (y if mask is None else y * mask)


@dataclasses.dataclass
class Batch:
    x: torch.Tensor
    mask: torch.Tensor | None
    note: str = "a dataclass batch"


class DictModel(nn.Module):
    """forward(batch): a dict with a nested list, a tuple, a None and a string."""

    def __init__(self, width: int = 16, depth: int = 4):
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))

    def forward(self, batch):
        x = batch["inputs"][0] + batch["extra"]["shift"][1]
        for block in self.blocks:
            x = block(x, batch["mask"], scale=batch["scale"])
        return {"out": x, "nothing": batch["nothing"]}


class DataclassModel(DictModel):
    def forward(self, batch: Batch, *, bias=None):
        x = batch.x if bias is None else batch.x + bias
        for block in self.blocks:
            x = block(x, batch.mask)
        return x


class HandsOverADataclass(DictModel):
    """Hands each block the dataclass itself: its tensors are out of the wrappers' sight."""

    def forward(self, batch: Batch):
        x = batch.x
        for block in self.blocks:
            x = block(x, mask=batch)
        return x


def _dict_batch(rows: int = 64, width: int = 16):
    g = torch.Generator().manual_seed(0)
    return {"inputs": [torch.randn(rows, width, generator=g)],
            "extra": {"shift": (None, torch.randn(width, generator=g))},
            "mask": (torch.rand(rows, width, generator=g) > 0.2).float(),
            "scale": 0.5, "nothing": None}


def _grads(model, run, *args, **kwargs):
    model.zero_grad(set_to_none=True)
    out = run(*args, **kwargs)
    loss = (out["out"] if isinstance(out, dict) else out).pow(2).mean()
    loss.backward()
    return [p.grad.clone() for p in model.parameters()], loss.detach()


def _assert_fitted_like_eager(model, args, kwargs, budgets):
    ref = _grads(model, model, *args, **kwargs)
    fitted = 0
    for budget in budgets:
        try:
            fm = fit(model, args, budget, sample_kwargs=kwargs or None, progress=False,
                     loss_fn=lambda out: (out["out"] if isinstance(out, dict) else out)
                     .pow(2).mean())
        except FitError as exc:  # a budget no plan meets: it says the smallest one
            assert "smallest feasible budget" in str(exc)
            continue
        got = _grads(model, fm, *args, **kwargs)
        for a, b in zip(ref[0], got[0]):
            torch.testing.assert_close(b, a, rtol=0, atol=0)
        torch.testing.assert_close(got[1], ref[1], rtol=0, atol=0)
        rep = fm.memory_report()
        assert rep.measured_peak_bytes <= rep.budget_bytes, (budget, rep)
        assert fm.frontend == "blocks"
        fitted += 1
        fm.unwrap()
    assert fitted >= 1


def test_a_dict_batch_with_nested_lists_tuples_and_nones_is_planned():
    torch.manual_seed(0)
    model = DictModel()
    _assert_fitted_like_eager(model, (_dict_batch(),), {}, ["100%", "80%"])


def test_a_dataclass_batch_and_keyword_arguments_are_planned():
    torch.manual_seed(0)
    model = DataclassModel()
    g = torch.Generator().manual_seed(1)
    batch = Batch(torch.randn(64, 16, generator=g), None)
    _assert_fitted_like_eager(model, (batch,), {"bias": torch.randn(16, generator=g)},
                              ["100%", "80%"])


def test_a_new_shape_inside_a_dict_batch_is_fitted_again():
    torch.manual_seed(0)
    model = DictModel()
    fm = fit(model, (_dict_batch(64),), "100%", progress=False)
    small = _dict_batch(16)
    ref = _grads(model, model, small)
    got = _grads(model, fm, small)  # fitted again for 16 rows, not run on the 64-row plan
    for a, b in zip(ref[0], got[0]):
        torch.testing.assert_close(b, a, rtol=0, atol=0)
    assert len(fm._guard.plans) == 2


def test_tensors_a_block_cannot_see_are_a_located_error_or_a_fallback(caplog):
    torch.manual_seed(0)
    model = HandsOverADataclass()
    batch = Batch(torch.randn(64, 16), torch.ones(64, 16))
    with pytest.raises(SchedError) as info:
        fit(model, (batch,), "100%", progress=False, frontend="blocks")
    text = str(info.value)
    assert text.startswith("blocks: error: block 'blocks.0' (Block) takes tensors inside "
                           "argument mask (mask.mask)"), text
    assert "Traceback" not in text
    with caplog.at_level(logging.WARNING, logger="schedlang.pytorch"), \
            pytest.warns(RuntimeWarning, match="fallback=True: plain PyTorch"):
        fm = fit(model, (batch,), "100%", progress=False, frontend="blocks", fallback=True)
    assert fm.frontend == "none" and "argument mask" in caplog.text
    ref = _grads(model, model, batch)
    got = _grads(model, fm, batch)
    for a, b in zip(ref[0], got[0]):
        torch.testing.assert_close(b, a, rtol=0, atol=0)


def test_fallback_also_covers_errors_that_are_not_schedlang_errors(monkeypatch):
    """Whatever stops planning (here: a bug in building the graph), fallback=True falls back."""
    import sys

    fit_module = sys.modules["schedlang.pytorch.fit"]  # the package exports the function

    def broken(*args, **kwargs):
        raise KeyError("blocks.0.in0")

    monkeypatch.setattr(fit_module, "prepare", broken)
    model = DictModel()
    with pytest.warns(RuntimeWarning, match="KeyError"):
        fm = fit(model, (_dict_batch(),), "100%", progress=False, fallback=True)
    assert fm.frontend == "none"
    with pytest.raises(KeyError):
        fit(model, (_dict_batch(),), "100%", progress=False)
