"""Layers with no backward (issue 12 item 5): a frozen prefix (frozen layers at the input side
and parameter-free glue whose inputs need no gradient) and the frozen base of LoRA-style
fine-tuning (base weights frozen, small trainable adapters: activations need gradients from
the first trainable layer on).

The profiler gives a layer whose outputs need no gradient only its forward without autograd
(`fast_forward`): the graph data has no backward and no phantom for it, and plans never save
one. End to end in `fit`: gradients equal eager PyTorch and the measured peak (CPU tracker)
stays within the budget.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
torch.set_num_threads(1)

from torch import nn  # noqa: E402

from schedlang.graphs.hgraph import FAST_FORWARD  # noqa: E402
from schedlang.testing.steps import assert_same, eager_grads, fit_step  # noqa: E402


def make_frozen_prefix(batch: int = 256, width: int = 32, hidden: int = 128, seed: int = 0):
    """A frozen stem (two Linear layers and their activations) feeding a trainable MLP; the
    input needs no gradient, so nothing before the first trainable layer has a backward."""
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(),  # frozen
        nn.Linear(hidden, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(),
        nn.Linear(hidden, 4))
    for m in list(model)[:4]:
        for p in m.parameters():
            p.requires_grad_(False)
    x = torch.randn(batch, width)
    return model, (x,), lambda out: out.pow(2).mean()


class LoRALinear(nn.Module):
    """A frozen Linear plus a trainable low-rank update (B A), B initialised non-zero so that
    the gradients of A are not all zero."""

    def __init__(self, dim_in: int, dim_out: int, rank: int = 4):
        super().__init__()
        self.base = nn.Linear(dim_in, dim_out)
        self.base.requires_grad_(False)
        self.a = nn.Parameter(torch.randn(rank, dim_in) / dim_in ** 0.5)
        self.b = nn.Parameter(torch.randn(dim_out, rank) / rank)

    def forward(self, x):
        return self.base(x) + (x @ self.a.t()) @ self.b.t()


def make_lora(batch: int = 256, width: int = 32, hidden: int = 128, blocks: int = 3, seed: int = 0):
    """A frozen embedding stem, then LoRA blocks: every base weight is frozen, the adapters
    train, so the activations after the stem need gradients and the stem has no backward."""
    torch.manual_seed(seed)
    stem = nn.Linear(width, hidden)
    stem.requires_grad_(False)
    mods: list[nn.Module] = [stem, nn.GELU()]
    for _ in range(blocks):
        mods += [LoRALinear(hidden, hidden), nn.GELU()]
    head = nn.Linear(hidden, 4)
    head.requires_grad_(False)
    mods.append(head)
    model = nn.Sequential(*mods)
    x = torch.randn(batch, width)
    return model, (x,), lambda out: out.pow(2).mean()


MODELS = {"frozen_prefix": make_frozen_prefix, "lora": make_lora}


@pytest.mark.parametrize("name", list(MODELS))
def test_layers_without_gradient_have_no_backward(name):
    from schedlang.pytorch.fit import prepare

    model, inputs, loss_fn = MODELS[name]()
    prep = prepare(model, inputs, loss_fn=loss_fn, repeats=1)
    g = prep.graph
    frozen = [lay for lay in g.layers if not lay.options]
    assert frozen, [lay.name for lay in g.layers]
    # the frozen prefix comes first, then every layer has a backward
    assert g.layers[:len(frozen)] == frozen
    for lay in frozen:
        assert lay.fast_forward is not None and not lay.grad_inputs and not lay.grad_outputs
    h = g.hgraph()
    names = [k.name for k in h.compute]
    for lay in frozen:
        assert f"{lay.name}.bwd" not in names
        assert [o.name for o in h.node(f"{lay.name}.fwd").options] == [FAST_FORWARD]
        assert not any(j == lay.name for j, _ in h.phantoms)
    # only trainable parameters get gradient data
    trainable = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    grads = sum(d.size for d in g.data if d.name.endswith(".params.grad"))
    assert grads == trainable


@pytest.mark.parametrize("name,budgets", [("frozen_prefix", [90, 75, 60]), ("lora", [90, 75, 66])])
def test_fit_with_layers_without_backward(name, budgets):
    """Gradients equal eager PyTorch (frozen weights get none), the measured peak is within
    the budget, and the plans never run a frozen layer with autograd."""
    from schedlang.pytorch.fit import FitError, fit, prepare

    model, inputs, loss_fn = MODELS[name]()
    ref = eager_grads(model, inputs, loss_fn)
    prep = prepare(model, inputs, loss_fn=loss_fn, repeats=1)
    frozen = {lay.name for lay in prep.graph.layers if not lay.options}
    solved = 0
    for pct in budgets:
        try:
            fm = fit(model, inputs, f"{pct}%", loss_fn=loss_fn, prepared=prep, calibrate=False)
        except FitError as exc:
            assert "smallest feasible budget" in str(exc)
            continue
        solved += 1
        got = fit_step(fm, model, inputs, loss_fn)
        assert_same(ref, got, exact=False)
        rep = fm.memory_report()
        assert rep.measured_peak_bytes <= rep.budget_bytes, (pct, rep)
        if fm.plan is not None:
            for op in fm.plan.ops:
                if op.op == "compute" and op.node.rpartition(".")[0] in frozen:
                    assert op.node.endswith(".fwd") and op.option == FAST_FORWARD, op
                assert not (op.op == "drop_phantom" and op.layer in frozen), op
    assert solved >= 2
