"""Recomputations replay the RNG of their first run, on every device their inputs live on
(`schedlang.pytorch.recompute`): with dropout on, gradients equal eager PyTorch's bit for bit
for every choice a block can run (keep, recompute, selective, offload, rerun) and every
checkpointed group, including blocks called with keyword tensors only — pinned choices, no plan
picked by a profile. The CUDA generator's part: which tensors torch's checkpoint is given to take device
states from (checked here by intercepting it), and the `gpu` tests at the end."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from schedlang.pytorch.frontends.blocks.find import find_blocks  # noqa: E402
from schedlang.pytorch.frontends.blocks.hooked import BlockWrappers  # noqa: E402
from schedlang.pytorch.frontends.blocks.plan_reading import GROUP  # noqa: E402
from schedlang.testing.torch_models import make_gpt, make_keyword_blocks  # noqa: E402

OPTIONS = ["autograd", "recompute", "selective", "autograd+offload", "rerun"]


def _step(module, model, args, kwargs, loss_fn, seed=123):
    """Gradients, loss and the RNG state after one seeded step (CPU and, on CUDA, the
    device's generator)."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    loss = loss_fn(module(*args, **kwargs))
    loss.backward()
    dev = next(model.parameters()).device
    rng = [torch.get_rng_state()] + ([torch.cuda.get_rng_state(dev)] if dev.type == "cuda"
                                     else [])
    return [p.grad.clone() for p in model.parameters()], loss.detach(), rng


def _assert_equal(ref, got):
    for a, b in zip(ref[0], got[0]):
        torch.testing.assert_close(b, a, rtol=0, atol=0)
    torch.testing.assert_close(got[1], ref[1], rtol=0, atol=0)
    assert all(torch.equal(a, b) for a, b in zip(ref[2], got[2])), \
        "the RNG streams differ from eager PyTorch's"


def _with_choices(model, args, kwargs, loss_fn, choices_of):
    """One step with the blocks wrapped, `choices_of(blocks)` -> {block: choice}."""
    found = find_blocks(model, args, kwargs)
    blocks = [b.name for b in found.blocks if b.name.startswith(_stack(found))]
    wrappers = BlockWrappers(found)
    try:
        wrappers.set(choices_of(blocks))
        return _step(model, model, args, kwargs, loss_fn)
    finally:
        wrappers.unwrap()


def _stack(found) -> str:
    """The prefix of the repeated blocks' names (`blocks.`, `transformer.h.`)."""
    names = [b.name for b in found.blocks]
    return max((n.rpartition(".")[0] + "." for n in names),
               key=lambda p: sum(n.startswith(p) for n in names))


def _uniform(choice):
    return lambda blocks: {b: choice for b in blocks}


def _mixed(blocks):
    return {b: OPTIONS[k % len(OPTIONS)] for k, b in enumerate(blocks)}


def _groups(sizes):
    """Consecutive groups of the given sizes from the first block, the rest plain."""
    def choices(blocks):
        out, at = {}, 0
        for size in sizes:
            members = blocks[at:at + size]
            out.update((b, GROUP + "|".join(members)) for b in members)
            at += size
        return out
    return choices


PLANS = {**{c: _uniform(c) for c in OPTIONS}, "mixed": _mixed,
         "group of 2": _groups([2]), "groups of 2, 2": _groups([2, 2]),
         "group of all": _groups([4])}


def _keyword_model():
    model, args, loss_fn = make_keyword_blocks(layers=4, dropout=0.3)
    return model, args, {}, loss_fn


def _gpt():
    model, args, loss_fn = make_gpt(batch=2, context=16, layers=4, dropout=0.3)
    return model, args, {}, loss_fn


MODELS = {"keyword blocks": _keyword_model, "gpt": _gpt}


@pytest.mark.parametrize("model_name", list(MODELS))
@pytest.mark.parametrize("plan", list(PLANS))
def test_hook_front_end_choices_give_eager_gradients_with_dropout(model_name, plan):
    """Every block choice and group on blocks with dropout (the keyword model's blocks take
    keyword tensors only): gradients, loss and RNG stream bit for bit eager PyTorch's."""
    model, args, kwargs, loss_fn = MODELS[model_name]()
    ref = _step(model, model, args, kwargs, loss_fn)
    got = _with_choices(model, args, kwargs, loss_fn, PLANS[plan])
    _assert_equal(ref, got)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
@pytest.mark.parametrize("plan", ["recompute", "selective", "rerun", "mixed", "group of 2"])
def test_transformers_blocks_give_eager_gradients_with_dropout(name, plan):
    """The same on `transformers` models (GPT-2's three dropouts; Llama's attention dropout,
    its blocks handed position embeddings and masks as keywords)."""
    from schedlang.testing.hf_models import HF

    model, args, kwargs, loss_fn = HF[name](batch=2, seq=16, layers=4, dropout=0.3)
    ref = _step(model, model, args, kwargs, loss_fn)
    got = _with_choices(model, args, kwargs, loss_fn, PLANS[plan])
    _assert_equal(ref, got)


def test_checkpoint_call_gives_torch_every_keyword_tensor_for_its_device_states(monkeypatch):
    """torch's non-reentrant checkpoint takes device RNG states from its positional tensors
    only: `checkpoint_call` hands it the keyword tensors too. Checked without a GPU by
    intercepting the states it collects (with the device module taken as initialized, as it
    is once CUDA ran)."""
    import torch.utils.checkpoint as ck

    from schedlang.pytorch.recompute import checkpoint_call

    seen = []

    def device_states(*args):
        seen.append([id(t) for t in args if isinstance(t, torch.Tensor)])
        return [], []

    monkeypatch.setattr(ck, "get_device_states", device_states)
    monkeypatch.setattr(ck._get_device_module(ck._infer_device_type()), "_initialized", True,
                        raising=False)
    x = torch.randn(3, requires_grad=True)
    pair = (torch.randn(3), torch.randn(3))

    def fn(*, hidden_states, position_embeddings, scale=2):
        return hidden_states * position_embeddings[0] * scale

    out = checkpoint_call(fn, (), {"hidden_states": x, "position_embeddings": pair})
    assert seen == [[id(x), id(pair[0]), id(pair[1])]]
    out.sum().backward()  # the recomputation runs with the tensors back in place
    torch.testing.assert_close(x.grad, pair[0] * 2)
    # torch's own checkpoint, called with keywords, would have given it none of them
    seen.clear()
    ck.checkpoint(fn, use_reentrant=False, hidden_states=x, position_embeddings=pair)
    assert seen == [[]]


def test_rng_devices_of_the_fx_runtime_cover_inputs_and_parameters():
    """The plan executor's rule: the devices of a layer's inputs and of the parameters,
    never the CPU (always restored) nor meta, each once in first-seen order."""
    from schedlang.pytorch.recompute import rng_devices

    cuda0, cuda1 = torch.device("cuda", 0), torch.device("cuda", 1)
    assert rng_devices([torch.device("cpu"), cuda1], cuda0, [cuda1]) == [cuda1, cuda0]
    assert rng_devices([torch.zeros(1), torch.zeros(1, device="meta")], {"k": 3}) == []


def test_open_checkpoint_binds_torchs_private_parameters_by_name(monkeypatch):
    """A group's checkpoint is torch's private generator: its parameters before the tensors
    are bound by name, so another release's parameter list cannot turn a flag into the
    group's first input."""
    import torch.utils.checkpoint as ck

    from schedlang.pytorch.recompute import open_checkpoint

    calls = []

    def generator(fn, preserve_rng_state=True, context_fn=None, determinism_check="x",
                  new_flag=7, debug=False, *args, **kwargs):
        calls.append((preserve_rng_state, determinism_check, new_flag, debug, args))
        yield

    monkeypatch.setattr(ck, "_checkpoint_without_reentrant_generator", generator)
    a, b = torch.zeros(1), torch.ones(1)
    gen = open_checkpoint(lambda *t: None, [a, b])
    (preserve, check, flag, debug, args), = calls
    assert (preserve, check, flag, debug) == (True, "default", 7, False)
    assert args == (a, b)
    with pytest.raises(StopIteration):
        next(gen)


def test_selective_recomputes_a_kept_op_that_draws_random_numbers():
    """The selective policy keeps attention and matmul outputs, but a kept op is not run again
    in the recomputation: one that draws random numbers (CUDA's attention kernels with
    dropout) would leave the generator short of where the first run left it, and the block's
    later dropouts would draw other masks. Such calls are recomputed."""
    from torch.utils.checkpoint import CheckpointPolicy

    from schedlang.pytorch.profile import draws_random_numbers, selective_policy

    aten = torch.ops.aten
    q = torch.zeros(1, 1, 2, 2)
    eff = aten._scaled_dot_product_efficient_attention.default
    flash = aten._scaled_dot_product_flash_attention.default
    assert selective_policy(None, eff, q, q, q, None, True, 0.1) is \
        CheckpointPolicy.PREFER_RECOMPUTE
    assert selective_policy(None, flash, q, q, q, dropout_p=0.1) is \
        CheckpointPolicy.PREFER_RECOMPUTE
    for args, kwargs in [((q, q, q, None, True, 0.0), {}), ((q, q, q, None, True), {})]:
        assert selective_policy(None, eff, *args, **kwargs) is CheckpointPolicy.MUST_SAVE
    assert selective_policy(None, aten.mm.default, q, q) is CheckpointPolicy.MUST_SAVE
    assert draws_random_numbers(aten.native_dropout.default, (q, 0.1, True), {})
    assert not draws_random_numbers(aten.mm.default, (q, q), {})


# --- on CUDA ---------------------------------------------------------------------------------
@pytest.mark.gpu  # skipped without CUDA (conftest.py)
@pytest.mark.parametrize("model_name", list(MODELS))
@pytest.mark.parametrize("plan", list(PLANS))
def test_cuda_choices_replay_the_cuda_generator(model_name, plan):
    """On CUDA, where dropout draws from the device's generator: every choice and group gives
    eager PyTorch's gradients and leaves both generators as eager does (the keyword model's
    blocks take their CUDA tensors as keywords only)."""
    factory = {"keyword blocks": make_keyword_blocks, "gpt": make_gpt}[model_name]
    model, args, loss_fn = factory(layers=4, dropout=0.3, device="cuda")
    ref = _step(model, model, args, {}, loss_fn)
    got = _with_choices(model, args, {}, loss_fn, PLANS[plan])
    _assert_equal(ref, got)


@pytest.mark.gpu
def test_cuda_selective_with_attention_dropout_gives_eager_gradients():
    """transformers' GPT-2 on CUDA: SDPA attention with dropout runs the memory-efficient
    kernel (fp32), which draws from the CUDA generator; selective blocks recompute it rather
    than keep it, and the gradients are eager's."""
    from schedlang.testing.hf_models import HF

    model, args, kwargs, loss_fn = HF["gpt2"](batch=2, seq=64, layers=4, dropout=0.3,
                                              device="cuda")
    ref = _step(model, model, args, kwargs, loss_fn)
    got = _with_choices(model, args, kwargs, loss_fn, PLANS["selective"])
    _assert_equal(ref, got)
