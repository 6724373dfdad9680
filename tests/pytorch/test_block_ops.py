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

from schedlang.testing.hf_models import HF  # noqa: E402
from schedlang.testing.leaks import host_copy, new_bytes, snapshot  # noqa: E402
from schedlang.testing.profiles import with_pinned_op_times  # noqa: E402

#: the default run's configs: two blocks of width 16, one op-level solve per series (a few
#: seconds each); the fuller ones (width 32, three budgets per series) run with `-m slow`
SMALL = {"batch": 2, "seq": 16, "dim": 16, "layers": 2}
FULL = {"batch": 2, "seq": 32, "dim": 32, "layers": 2}
GENERATE_SMALL = {"fractions": (0.4,), "time_limit": 20}
GENERATE_FULL = {"fractions": (0.7, 0.4, 0.2), "time_limit": 20}
CONFIGS = [pytest.param(name, SMALL, GENERATE_SMALL, id=f"{name}-small")
           for name in ("gpt2", "llama", "bert")] + [
    pytest.param(name, FULL, GENERATE_FULL, id=name, marks=pytest.mark.slow)
    for name in ("gpt2", "llama", "bert")]


def _step(module, model, args, kwargs, loss_fn, seed=7):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    loss = loss_fn(module(*args, **kwargs))
    loss.backward()
    return host_copy(([p.grad for p in model.parameters()], loss.detach(),
                      torch.get_rng_state()))


def _prepared(name, sizes=FULL, generate=GENERATE_FULL):
    from schedlang.pytorch.fit import prepare

    model, args, kwargs, loss_fn = HF[name](**sizes)
    prep = prepare(model, args, loss_fn=loss_fn, sample_kwargs=kwargs, frontend="blocks",
                   repeats=1, block_options=generate)
    return model, args, kwargs, loss_fn, prep


def _draws_random_numbers(model, args, kwargs) -> bool:
    """Whether a training forward of `model` advances the generator (dropout on: modules,
    or functional as Llama's attention dropout)."""
    state = torch.get_rng_state()
    with torch.no_grad():
        model(*args, **kwargs)
    drew = not torch.equal(state, torch.get_rng_state())
    torch.set_rng_state(state)
    return drew


def _generated(prep) -> dict[str, list[str]]:
    from schedlang.pytorch.frontends.blocks.block_ops import is_op_option

    return {lay.name: [o.name for o in lay.options if is_op_option(o.name)]
            for lay in prep.graph.layers}


def _assert_every_option_eager(model, args, kwargs, loss_fn, prep) -> None:
    """Each generated option of `prep`'s blocks, run by every block that has it,
    the others keeping everything: gradients, loss and the RNG stream after the step are eager
    PyTorch's, bit for bit."""
    from schedlang.pytorch.frontends.blocks.hooked import BlockWrappers

    assert _draws_random_numbers(model, args, kwargs), "dropout is off"
    ref = _step(model, model, args, kwargs, loss_fn)
    options = _generated(prep)
    names = sorted({o for opts in options.values() for o in opts})
    assert names, "no generated option on the model's blocks"
    wrappers = BlockWrappers(prep.partitioned.found)
    try:
        for opt in names:
            wrappers.set({b: opt for b, opts in options.items() if opt in opts})
            got = _step(model, model, args, kwargs, loss_fn)
            for a, b in zip(ref[0], got[0]):
                assert (a is None) == (b is None)
                if a is not None:
                    torch.testing.assert_close(b, a, rtol=0, atol=0, msg=opt)
            torch.testing.assert_close(got[1], ref[1], rtol=0, atol=0)
            assert (got[2] == ref[2]).all(), f"{opt}: the RNG stream differs from eager"
    finally:
        wrappers.unwrap()


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
    _assert_every_option_eager(model, args, kwargs, loss_fn, prep)


def test_a_block_make_fx_cannot_record_keeps_its_fixed_options():
    """One-layer GPT-2: the block choice takes the whole `transformer` (its attention-mask
    code branches on tensor values: make_fx cannot record it) and `lm_head`. The one gets no
    generated option, where it once failed the whole preparation; the other gets its own,
    each with eager gradients."""
    model, args, kwargs, loss_fn, prep = _prepared("gpt2", {**SMALL, "layers": 1},
                                                   GENERATE_SMALL)
    options = _generated(prep)
    assert options["transformer"] == []
    assert options["lm_head"]
    _assert_every_option_eager(model, args, kwargs, loss_fn, prep)


def test_generated_block_options_keep_nothing_of_the_model_alive():
    """The options generated for a model's blocks (registered by block, weakly; the process's
    caches of op graphs and solutions) hold none of its tensors: once the model and its
    preparation are dropped, nothing of them is alive (a segmented option's layer once held
    its block, and with it every parameter of the model's blocks)."""
    import weakref

    from schedlang.pytorch.frontends.blocks.block_ops import POLICIES

    before = snapshot()
    model, args, kwargs, loss_fn, prep = _prepared("bert", SMALL, GENERATE_SMALL)
    assert any(_generated(prep).values())
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
    assert any(_generated(prep).values())
    ref = _step(model, model, args, kwargs, loss_fn)
    for pct in (80, 65):
        try:
            fm = fit(model, args, f"{pct}%", loss_fn=loss_fn, sample_kwargs=kwargs,
                     prepared=prep)
        except FitError as exc:
            assert pct != 80, str(exc)
            found = re.search(r"smallest feasible budget found is .*?\((\d+) B\)", str(exc))
            assert found and int(found.group(1)) > pct / 100 * prep.plain_peak, str(exc)
            continue
        got = _step(fm, model, args, kwargs, loss_fn)
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


class _Wrap(torch.nn.Module):
    def __init__(self, lin, fn):
        super().__init__()
        self.lin = lin
        self.__dict__["fn"] = fn

    def forward(self, x):
        return self.fn(x)
