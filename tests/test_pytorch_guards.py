"""The PyTorch side at its edges (issue 11, item 5): `fit` on a module whose forward raises, on
inputs of the wrong dtype or device, with a budget that is not a size, and on a model whose
graph changes: a clear error, or (a new input shape) a new plan kept per shape, never a
silently wrong gradient (`schedlang.pytorch.guards`)."""
from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from schedlang.language.errors import SchedError  # noqa: E402
from schedlang.plans.planners import run_planner  # noqa: E402
from schedlang.pytorch.fit import FitError, fit, prepare  # noqa: E402
from schedlang.pytorch.guards import GraphChanged, InputMismatch  # noqa: E402

from .test_pytorch_runtime import assert_same, eager_grads, fit_step  # noqa: E402
from .torch_models import make_mlp  # noqa: E402

torch.set_num_threads(1)


def blocks(n: int, width: int = 16, middle: nn.Module | None = None) -> nn.Sequential:
    torch.manual_seed(0)
    mods = [nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(n)]
    if middle is not None:
        mods.insert(n // 2, middle)
    return nn.Sequential(*mods)


def sample(batch: int = 32, width: int = 16):
    torch.manual_seed(1)
    return torch.randn(batch, width)


class Raises(nn.Module):
    def forward(self, x):
        raise ValueError("boom in forward")


class Counter(nn.Module):
    """A layer whose output depends on how often it ran, not only on its input."""

    def __init__(self, width: int = 16):
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.lin(x) * (1.0 if self.calls % 2 else 2.0)


class Branches(nn.Module):
    """Data-dependent control flow between layers."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x):
        x = self.a(x)
        return self.b(x) if x.sum() > 0 else x


def loss(out):
    return out.pow(2).mean()


# factories, not models: a parameter's value lives as long as the test process, and a tensor
# alive there is memory every measured step of every later test counts
@pytest.mark.parametrize("make, match", [
    (lambda: (nn.Sequential(nn.Linear(16, 16), Raises()), (sample(),)),
     "ValueError: boom in forward"),
    (lambda: (blocks(4), (sample().double(),)), "must have the same dtype"),
    (lambda: (Branches(), (sample(),)), "control flow"),
], ids=["raises", "dtype", "branches"])
def test_fit_names_what_failed(make, match):
    # the fx front end names the data-dependent branch (the hook front end runs it eagerly)
    model, inputs = make()
    with pytest.raises(SchedError, match=match):
        fit(model, inputs, budget="80%", repeats=1, frontend="fx")
    if match != "control flow":
        with pytest.raises(SchedError, match=match):
            fit(model, inputs, budget="80%", repeats=1)


@pytest.mark.parametrize("budget, match", [("lots", "is not a size"), ("-3", "is not a size"),
                                           (float("nan"), "must be positive"),
                                           ("120%%", "is not a percentage")])
def test_fit_rejects_a_budget_that_is_not_a_size(budget, match):
    with pytest.raises(SchedError, match=match):
        fit(blocks(3), sample(), budget=budget, repeats=1)


def test_inputs_of_another_dtype_or_device_are_an_error():
    fm = fit(blocks(4), sample(), budget="100%", repeats=1)
    with pytest.raises(InputMismatch, match="input 0 is a float64 tensor.*fitted on a float32"):
        fm(sample().double())
    with pytest.raises(InputMismatch, match="on meta; the module was fitted on .* on cpu"):
        fm(sample().to("meta"))
    with pytest.raises(InputMismatch, match="fitted with 1 inputs and is called with 2"):
        fm(sample(), sample())


def test_a_new_batch_shape_gets_its_own_plan_kept_per_shape():
    model, (x,), loss_fn = make_mlp(batch=512, width=64, depth=3)
    fm = fit(model, x, budget="85%", loss_fn=loss_fn, repeats=1)
    first = fm.plan
    assert first is not None
    small = (x[:128].clone(),)
    got = fit_step(fm, model, small, loss_fn)  # re-planned for 128 rows
    assert_same(eager_grads(model, small, loss_fn), got)
    assert fm._guard.plans.keys() == {((512, 64),), ((128, 64),)}
    planned_for_128 = fm.plan
    fit_step(fm, model, (x,), loss_fn)
    assert fm.plan is first  # back to the first plan, no new solve
    fit_step(fm, model, small, loss_fn)
    assert fm.plan is planned_for_128


def test_the_smallest_feasible_budget_named_is_feasible():
    """The bisection named the peak of a plan found at a larger budget, which the save budget
    of the loss phase then made infeasible ('no plan fits 20.25 KiB: the smallest feasible
    budget found is 19.44 KiB')."""
    model, x = blocks(4), sample()
    prep = prepare(model, x, repeats=1)
    # the fixed options alone (generated ones, `op_options`, reach further)
    named = []
    for pct in (95, 90, 85, 80, 75, 70, 60):  # the first budgets no plan fits
        try:
            fit(model, x, budget=f"{pct}%", prepared=prep, op_options=False)
        except FitError as exc:
            found = re.search(r"smallest feasible budget found is [\d.]+ \w+ \((\d+) B\)",
                              str(exc))
            named.append(int(found.group(1)))
            if len(named) == 2:
                break
    assert named, "every budget fitted: the test no longer reaches an infeasible one"
    for smallest in named:
        fm = fit(model, x, budget=smallest, prepared=prep, op_options=False)
        assert fm.plan is not None or fm.plain


def test_a_layer_that_recomputes_differently_is_caught():
    model = blocks(4, middle=Counter())
    x = sample()
    prep = prepare(model, x, repeats=1)
    plan = run_planner("recompute_all", prep.graph)
    fm = fit(model, x, prepared=prep, plan=plan)
    with pytest.raises(GraphChanged, match="gave another result when recomputed"):
        fit_step(fm, model, (x,), loss)
    with pytest.raises(InputMismatch, match="fitted with a given plan"):
        fm(sample(8))


def test_a_layer_that_recomputes_the_same_passes():
    model = blocks(5)
    x = sample()
    prep = prepare(model, x, repeats=1)
    fm = fit(model, x, prepared=prep, plan=run_planner("recompute_all", prep.graph))
    assert_same(eager_grads(model, (x,), loss), fit_step(fm, model, (x,), loss))
