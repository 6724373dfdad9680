"""Generated options of the hook front end's blocks (`schedlang.pytorch.frontends.blocks.block_ops`): op-level
solves of each distinct block, run as selective-checkpoint policies on the model's own forward.

What every generated option must give, whichever the solver found: the gradients, the loss
and the RNG stream of eager PyTorch, bit for bit, with dropout on (the policy never keeps an
op that draws random numbers, and the checkpoint restores the generator); a fitted step
measured within its budget; the kept calls are those of the solution's kept segments.
"""
from __future__ import annotations

import re
from collections import Counter

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
torch.set_num_threads(1)

from schedlang.testing.block_options import assert_every_option_eager, generated_options, keyword_step  # noqa: E402
from schedlang.testing.hf_architectures import ARCHITECTURES  # noqa: E402
from schedlang.testing.hf_models import HF  # noqa: E402
from schedlang.testing.leaks import new_bytes, snapshot  # noqa: E402
from schedlang.testing.profiles import with_pinned_op_times  # noqa: E402

#: the default run's configs: two blocks of width 16, one op-level solve per series (a few
#: seconds each); the fuller ones (width 32, three budgets per series) run with `-m slow`
SMALL = {"batch": 2, "seq": 16, "dim": 16, "layers": 2}
FULL = {"batch": 2, "seq": 32, "dim": 32, "layers": 2}
GENERATE_SMALL = {"fractions": (0.4,), "time_limit": 20}
GENERATE_FULL = {"fractions": (0.7, 0.4, 0.2), "time_limit": 20}
#: the models of `hf_models` and `hf_architectures` (the latter: architectures whose blocks
#: once broke the generation — GPT-Neo's and Falcon's attention makes a tensor constant;
#: GPT-J's blocks take two views of one tensor; Bloom's custom GeLU backward:
#: `test_architectures.py`)
MODELS = {**HF, **ARCHITECTURES}
CONFIGS = [pytest.param(name, SMALL, GENERATE_SMALL, id=f"{name}-small")
           for name in ("gpt2", "llama", "bert")] + [
    pytest.param(name, FULL, GENERATE_FULL, id=name, marks=pytest.mark.slow)
    for name in ("gpt2", "llama", "bert")] + [
    pytest.param(name, SMALL, GENERATE_SMALL, id=f"{name}-small", marks=pytest.mark.slow)
    for name in ("gpt_neo", "falcon", "gptj")]


def _prepared(name, sizes=FULL, generate=GENERATE_FULL):
    from schedlang.pytorch.fit import prepare

    model, args, kwargs, loss_fn = MODELS[name](**sizes)
    prep = prepare(model, args, loss_fn=loss_fn, sample_kwargs=kwargs, frontend="blocks",
                   repeats=1, block_options=generate)
    return model, args, kwargs, loss_fn, prep


@pytest.mark.parametrize("name,sizes,generate", CONFIGS)
def test_every_generated_block_option_gives_eager_gradients_with_dropout(name, sizes, generate,
                                                                          monkeypatch):
    """Each generated option of each distinct block (blocks of equal structure share their
    options' names and policies): eager PyTorch's gradients, dropout on. The op graphs' times
    are pinned: the op-level solves then find the same segments on every machine and load
    (measured, a solution equal in memory to ``recompute`` and slower is dominated, and which
    ones the solves found followed the timings)."""
    from schedlang.pytorch.frontends.blocks import block_ops

    monkeypatch.setattr(block_ops, "record_ops", with_pinned_op_times(block_ops.record_ops))
    model, args, kwargs, loss_fn, prep = _prepared(name, sizes, generate)
    assert_every_option_eager(model, args, kwargs, loss_fn, prep)


def test_a_block_make_fx_cannot_record_keeps_its_fixed_options():
    """One-layer GPT-2: the block choice takes the whole `transformer` (its attention-mask
    code branches on tensor values: make_fx cannot record it) and `lm_head`. The one gets no
    generated option, where it once failed the whole preparation; the other is solved (its
    op graph, a transpose and a matmul, has cuts that all tie with keeping it whole: whether
    one of them is returned, and so becomes an option, is the solver's choice among optima),
    and every option either has gives eager gradients."""
    model, args, kwargs, loss_fn, prep = _prepared("gpt2", {**SMALL, "layers": 1},
                                                   GENERATE_SMALL)
    options = generated_options(prep)
    assert options["transformer"] == []
    assert "lm_head" in options
    assert_every_option_eager(model, args, kwargs, loss_fn, prep, some=False)


def test_a_block_whose_generation_fails_keeps_its_fixed_options(monkeypatch, caplog):
    """Whatever breaks while a block's options are generated (an op the recording cannot
    replay, met on a model nobody tried): the block keeps its fixed options, a warning names
    it and why, and the preparation goes on — never a traceback out of `fit`."""
    import logging

    from schedlang.pytorch.frontends.blocks import block_ops

    def broken(*args, **kwargs):
        raise RuntimeError("an op nobody met")

    monkeypatch.setattr(block_ops, "record_ops", broken)
    monkeypatch.setattr(block_ops, "generate_options", broken)
    with caplog.at_level(logging.WARNING, logger="schedlang.pytorch"):
        *_, prep = _prepared("gpt2", SMALL, GENERATE_SMALL)
    assert not any(generated_options(prep).values())
    warned = [r.getMessage() for r in caplog.records if "no generated options" in r.getMessage()]
    assert any("transformer.h.0" in w and "RuntimeError: an op nobody met" in w for w in warned)
    block = next(lay for lay in prep.graph.layers if lay.name == "transformer.h.0")
    assert {o.name for o in block.options} >= {"autograd", "recompute"}


def test_generated_block_options_keep_nothing_of_the_model_alive():
    """The options generated for a model's blocks (registered by block, weakly; the process's
    caches of op graphs and solutions) hold none of its tensors: once the model and its
    preparation are dropped, nothing of them is alive (a segmented option's layer once held
    its block, and with it every parameter of the model's blocks)."""
    import weakref

    from schedlang.pytorch.frontends.blocks.block_ops import POLICIES

    before = snapshot()
    model, args, kwargs, loss_fn, prep = _prepared("bert", SMALL, GENERATE_SMALL)
    assert any(generated_options(prep).values())
    blocks = [weakref.ref(m) for m in model.modules() if m in POLICIES]
    assert blocks
    del model, args, kwargs, loss_fn, prep
    assert new_bytes(before) == 0
    assert all(b() is None for b in blocks)


@pytest.mark.slow  # a fit's solves and probe steps at the fuller config (about a minute)
def test_a_fit_with_generated_block_options_is_measured_within_its_budget():
    """Whatever plan the solver and the probe steps settle on: gradients equal eager, the
    measured peak within the budget; or `FitError` naming a smallest feasible budget above
    the one asked (at 80% of plain execution a plan exists: the fixed options reach it)."""
    from schedlang.pytorch.fit import FitError, fit

    model, args, kwargs, loss_fn, prep = _prepared("gpt2")
    assert any(generated_options(prep).values())
    ref = keyword_step(model, model, args, kwargs, loss_fn)
    for pct in (80, 65):
        try:
            fm = fit(model, args, f"{pct}%", loss_fn=loss_fn, sample_kwargs=kwargs,
                     prepared=prep)
        except FitError as exc:
            assert pct != 80, str(exc)
            found = re.search(r"smallest feasible budget found is .*?\((\d+) B\)", str(exc))
            assert found and int(found.group(1)) > pct / 100 * prep.plain_peak, str(exc)
            continue
        got = keyword_step(fm, model, args, kwargs, loss_fn)
        for a, b in zip(ref[0], got[0]):
            if a is not None:
                torch.testing.assert_close(b, a, rtol=0, atol=0)
        rep = fm.memory_report()
        assert rep.measured_peak_bytes <= rep.budget_bytes, (pct, rep)
        fm.unwrap()


def test_a_policy_keeps_exactly_the_calls_of_the_kept_segments():
    from schedlang.pytorch.frontends.blocks.block_ops import OpPolicy, _calls, saved_calls
    from schedlang.pytorch.opgraph import record_ops

    lin = torch.nn.Linear(8, 8)

    def fn(x):
        return (torch.relu(lin(x)).sin().exp(),)

    x = torch.randn(4, 8)
    og = record_ops(_Wrap(lin, fn), (x,), [True], repeats=1)
    units = [u.name for u in og.units]
    first, last = units[0], units[-1]
    assert saved_calls(og, [(first, last, True)]) == frozenset()
    every = saved_calls(og, [(first, last, False)])
    assert every == {(c, k) for c, n in Counter(_calls(og.gm)).items() for k in range(n)}
    # a policy keeping them all runs the function with the graph's calls, in its counts
    policy = OpPolicy(every, Counter(_calls(og.gm)))
    from schedlang.pytorch.recompute import checkpoint_call

    xs = x.clone().requires_grad_(True)
    out = checkpoint_call(fn, (xs,), {}, policy.context)
    out[0].sum().backward()
    assert policy.matches()


def test_a_policy_keeping_a_dropout_runs_and_replays_eager():
    """CPU dropout writes its noise in place (``empty_like``, ``bernoulli_``, ``div_``). A
    kept segment with a dropout in it keeps no in-place result (a selective checkpoint caches
    it with a stale version and refuses it in the backward as mutated: GPT-J's and CodeGen's
    blocks had no generated option); the step gives eager PyTorch's gradients, dropout on."""
    from schedlang.pytorch.frontends.blocks.block_ops import OpPolicy, _calls, saved_calls
    from schedlang.pytorch.opgraph import record_ops
    from schedlang.pytorch.recompute import checkpoint_call

    lin = torch.nn.Linear(8, 8)

    def fn(x):
        return (torch.nn.functional.dropout(lin(x).sin(), 0.3, True).exp(),)

    x = torch.randn(4, 8)
    og = record_ops(_Wrap(lin, fn), (x,), [True], repeats=1)
    units = [u.name for u in og.units]
    every = saved_calls(og, [(units[0], units[-1], False)])
    assert not any(c.split(".")[1].endswith("_") for c, _ in every)  # no in-place result
    assert any(c == "aten.mul.Tensor" for c, _ in every)  # the dropout's product is kept
    grads = []
    for run in ("eager", "policy"):
        lin.zero_grad()
        xs = x.clone().requires_grad_(True)
        torch.manual_seed(5)
        if run == "eager":
            out = fn(xs)
        else:
            policy = OpPolicy(every, Counter(_calls(og.gm)))
            out = checkpoint_call(fn, (xs,), {}, policy.context)
        out[0].sum().backward()
        grads.append([xs.grad, lin.weight.grad, lin.bias.grad])
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, rtol=0, atol=0)


class _Wrap(torch.nn.Module):
    def __init__(self, lin, fn):
        super().__init__()
        self.lin = lin
        self.__dict__["fn"] = fn

    def forward(self, x):
        return self.fn(x)


class _RotaryBlock(torch.nn.Module):
    """A block that reads two views of one tensor, as GPT-J's blocks read the sine and cosine
    halves of one rotary table."""

    def __init__(self, dim: int):
        super().__init__()
        self.up = torch.nn.Linear(dim, 4 * dim)
        self.down = torch.nn.Linear(4 * dim, dim)
        self.drop = torch.nn.Dropout(0.1)

    def forward(self, x, sin, cos):
        turned = x * cos + x.flip(-1) * sin
        return x + self.drop(self.down(torch.relu(self.up(turned))))


class _Rotary(torch.nn.Module):
    def __init__(self, dim: int = 16, layers: int = 2):
        super().__init__()
        self.inp = torch.nn.Linear(dim, dim)
        self.layers = torch.nn.ModuleList(_RotaryBlock(dim) for _ in range(layers))
        self.head = torch.nn.Linear(dim, dim)

    def forward(self, x):
        seq, dim = x.shape[1], x.shape[2]
        table = (torch.arange(seq * 2 * dim, dtype=x.dtype) * 0.01).reshape(seq, 2 * dim).sin()
        sin, cos = table.chunk(2, dim=-1)
        h = self.inp(x)
        for layer in self.layers:
            h = layer(h, sin, cos)
        return self.head(h)


def test_a_block_given_two_views_of_one_tensor_gets_generated_options():
    """GPT-J's blocks had no generated option: they take two views of one datum (the halves
    of the rotary table), and the op-level options required each datum once. Now such a
    block gets them, each with eager gradients (dropout on)."""
    from schedlang.pytorch.fit import prepare

    torch.manual_seed(0)
    model = _Rotary()
    args = (torch.randn(4, 8, 16),)

    def loss_fn(out):
        return out.pow(2).mean()

    prep = prepare(model, args, loss_fn=loss_fn, frontend="blocks", repeats=1,
                   block_options=GENERATE_SMALL)
    options = generated_options(prep)
    assert options["layers.0"] and options["layers.1"]
    assert_every_option_eager(model, args, {}, loss_fn, prep)
