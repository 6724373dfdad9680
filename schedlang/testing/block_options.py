"""The check every generated option of the hook front end's blocks must pass, shared by the
tests of `block_ops` and of the architectures (`hf_architectures`): run by every block that
has it, the gradients, the loss and the RNG stream of a training step are eager PyTorch's,
bit for bit, with dropout on."""
from __future__ import annotations

import numpy
import torch

from schedlang.pytorch.frontends.blocks.block_ops import is_op_option
from schedlang.pytorch.frontends.blocks.hooked import BlockWrappers

from .leaks import host_copy

__all__ = ["keyword_step", "draws_random_numbers", "generated_options",
           "assert_every_option_eager"]


def keyword_step(module, model, args, kwargs, loss_fn, seed=7):
    """Parameter gradients, loss and RNG state after one step of `module(*args, **kwargs)`,
    as host copies (`leaks.host_copy`); NumPy's generator seeded too (Wav2Vec2's SpecAugment
    draws from it in the model's own code)."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    numpy.random.seed(seed)
    loss = loss_fn(module(*args, **kwargs))
    loss.backward()
    return host_copy(([p.grad for p in model.parameters()], loss.detach(),
                      torch.get_rng_state()))


def assert_same_step(got, ref, what: str = "") -> None:
    """Two `keyword_step` results: gradients, loss and RNG stream equal, bit for bit."""
    for a, b in zip(ref[0], got[0]):
        assert (a is None) == (b is None), what
        if a is not None:
            torch.testing.assert_close(b, a, rtol=0, atol=0, msg=what or None)
    torch.testing.assert_close(got[1], ref[1], rtol=0, atol=0)
    assert (got[2] == ref[2]).all(), f"{what}: the RNG stream differs from eager"


def draws_random_numbers(model, args, kwargs) -> bool:
    """Whether a training forward of `model` advances the generator (dropout on: modules,
    or functional as Llama's attention dropout)."""
    state = torch.get_rng_state()
    with torch.no_grad():
        model(*args, **kwargs)
    drew = not torch.equal(state, torch.get_rng_state())
    torch.set_rng_state(state)
    return drew


def generated_options(prep) -> dict[str, list[str]]:
    """layer -> the names of its generated options in a preparation's graph."""
    return {lay.name: [o.name for o in lay.options if is_op_option(o.name)]
            for lay in prep.graph.layers}


def assert_every_option_eager(model, args, kwargs, loss_fn, prep, some=True) -> None:
    """Each generated option of `prep`'s blocks (`some`: there is one at least), run by every
    block that has it, the others keeping everything: gradients, loss and the RNG stream after
    the step are eager PyTorch's, bit for bit."""
    assert draws_random_numbers(model, args, kwargs), "dropout is off"
    ref = keyword_step(model, model, args, kwargs, loss_fn)
    options = generated_options(prep)
    names = sorted({o for opts in options.values() for o in opts})
    assert names or not some, "no generated option on the model's blocks"
    wrappers = BlockWrappers(prep.partitioned.found)
    try:
        for opt in names:
            wrappers.set({b: opt for b, opts in options.items() if opt in opts})
            assert_same_step(keyword_step(model, model, args, kwargs, loss_fn), ref, opt)
    finally:
        wrappers.unwrap()
