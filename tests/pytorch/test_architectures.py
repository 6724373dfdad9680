"""`fit` on `transformers` architectures beyond the five the project was built on
(`schedlang.testing.hf_architectures`: OPT, GPT-Neo, GPTBigCode, Falcon, Bloom, Mistral, Qwen2,
Phi, Gemma, T5, Whisper, RoBERTa, DistilBERT, ALBERT, ELECTRA, DeBERTa-v2, Swin, DeiT, CLIP's
and SigLIP's vision towers), as a new user calls it: tiny random configs, dropout on.

What holds for every plan the solver may pick: gradients, loss and RNG stream equal eager
PyTorch's bit for bit; the measured peak within the budget, or `FitError` naming a smallest
feasible budget; that smallest budget at most what the model's own per-block checkpointing
(`gradient_checkpointing_enable()`) measures; nothing of the model alive once it is dropped.
The block choice itself is checked without a run where a model once fell to coarser blocks
(Swin's first block has no drop path; a two-layer T5 has no two equal blocks).
"""
from __future__ import annotations

import copy
import re

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
torch.set_num_threads(1)

from schedlang.testing.block_options import assert_every_option_eager, assert_same_step, keyword_step  # noqa: E402
from schedlang.testing.hf_architectures import ARCHITECTURES  # noqa: E402
from schedlang.testing.leaks import new_bytes, snapshot  # noqa: E402

SMALLEST = re.compile(r"smallest feasible budget found is .*?\((\d+) B\)")

#: the default run's size (a few seconds a fit); the others run with `-m slow`
TINY = {"batch": 2, "seq": 32, "layers": 2, "dim": 16}
#: a size where activations outweigh parameters: budgets well below plain execution exist
SMALL = {"batch": 4, "seq": 64, "layers": 4, "dim": 32}
DEFAULT = ("swin",)
#: targets not met yet, each with its figure (the test flips when they are: strict). Empty:
#: Wav2Vec2's smallest budget with the fixed options was above per-block checkpointing's
#: peak (5.58 against 5.49 MiB) until its feature encoder became an optional block of its
#: own (`find.OPTIONAL_SHARE` 5%: it saves 14% of a layer)
NOT_MET: dict[str, str] = {}
NAMES = [n if n in DEFAULT else pytest.param(n, marks=[pytest.mark.slow] + (
    [pytest.mark.xfail(strict=True, reason=NOT_MET[n])] if n in NOT_MET else []))
    for n in ARCHITECTURES]


def test_a_stack_whose_blocks_differ_in_parameter_free_submodules_is_found():
    """Swin's first block of each stage has `nn.Identity` where the others have a drop path:
    still one stack, each SwinLayer a block (the first stage was once one block whole)."""
    from schedlang.pytorch.frontends.blocks.find import candidate_blocks

    model, *_ = ARCHITECTURES["swin"](**TINY)
    mode, blocks, _ = candidate_blocks(model)
    assert mode == "blocks"
    assert blocks == [f"swin.encoder.layers.{s}.blocks.{b}" for s in (0, 1) for b in (0, 1)]


def test_a_stack_of_one_class_is_found_where_no_two_blocks_are_equal():
    """A two-layer T5: the first block of each stack alone has the relative position bias,
    so no two blocks are equal; the blocks of one class are the stack (once: the model's
    three children, encoder and decoder whole)."""
    from schedlang.pytorch.frontends.blocks.find import candidate_blocks

    model, *_ = ARCHITECTURES["t5"](**TINY)
    mode, blocks, _ = candidate_blocks(model)
    assert mode == "blocks"
    assert blocks == [f"{s}.block.{b}" for s in ("encoder", "decoder") for b in (0, 1)]


def test_a_layer_shared_by_every_layer_is_named():
    """ALBERT runs one layer module for each of its layers: no module is called once per
    layer, so the blocks are the model's children, and the shared module is named with its
    calls (fit logs it: why the plan's savings are coarse)."""
    from schedlang.pytorch.frontends.blocks.find import find_blocks

    model, args, kwargs, _ = ARCHITECTURES["albert"](**{**TINY, "layers": 3})
    found = find_blocks(model, args, kwargs)
    assert found.mode == "children"
    assert found.shared == [("albert.encoder.albert_layer_groups.0", 3)]


def test_blocks_that_return_model_outputs_are_profiled_without_torchs_hook_warnings():
    """ALBERT's blocks are its children, whose outputs are `ModelOutput`s: the profiling
    runs' backward hooks cannot fire on them, which the timing and the glue's memory handle
    (those steps are not recorded). torch's warning about it is for the developer of the
    hooks, not the user, who once saw it six times in one `prepare`."""
    import warnings

    from schedlang.pytorch.fit import prepare

    model, args, kwargs, loss_fn = ARCHITECTURES["albert"](**TINY)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prepare(model, args, loss_fn=loss_fn, sample_kwargs=kwargs, frontend="blocks",
                repeats=1, block_options=False)
    assert not [w for w in caught if "backward hooks" in str(w.message)]


def test_runs_that_leave_no_trace_leave_the_host_generators_too():
    """`preserved` (profiling, probe steps): Python's and NumPy's global generators, which a
    model's own code may draw from, are as they were after it, as torch's is."""
    import random

    import numpy

    from schedlang.pytorch.model_state import preserved

    numpy.random.seed(3)
    random.seed(3)
    with preserved(torch.nn.Linear(2, 2)):
        numpy.random.rand(5)
        random.random()
    assert numpy.random.randint(1 << 30) == numpy.random.RandomState(3).randint(1 << 30)
    assert random.random() == random.Random(3).random()


@pytest.mark.slow
def test_fit_leaves_the_host_generators_as_they_were():
    """Wav2Vec2 as configured by default draws its SpecAugment masks from NumPy's generator in
    its own forward: fit's runs (recording, profile, probe steps) leave NumPy's and Python's
    generators as they found them, as they leave torch's, and a fitted step's gradients are
    eager PyTorch's for the same seeds."""
    import random

    import numpy

    from schedlang.pytorch.fit import fit

    model, args, kwargs, loss_fn = ARCHITECTURES["wav2vec2"](**TINY)
    ref = keyword_step(model, model, args, kwargs, loss_fn)
    numpy.random.seed(11)
    random.seed(11)
    fm = fit(model, args, "80%", loss_fn=loss_fn, sample_kwargs=kwargs, op_options=False)
    assert numpy.random.randint(1 << 30) == numpy.random.RandomState(11).randint(1 << 30)
    assert random.random() == random.Random(11).random()
    got = keyword_step(fm, model, args, kwargs, loss_fn)
    for a, b in zip(ref[0], got[0]):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(b, a, rtol=0, atol=0)
    fm.unwrap()


class _LayerDrop(torch.nn.Module):
    """A stack whose forward skips a layer in training, as LayerDrop does at random
    (Wav2Vec2's default: 0.1): here always the second."""

    def __init__(self, layers: int = 3):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(layers))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            if not (self.training and i == 1):
                x = torch.relu(layer(x))
        return x


@pytest.mark.parametrize("layers,called", [(3, ["layers.0", "layers.2"]), (2, ["layers.0"])])
def test_a_stack_block_the_recorded_forward_skips_is_named(layers, called):
    """The plan covers the blocks the recorded forward ran; one it skipped is named (fit warns
    that a step running it measures beyond the prediction). A stack of two with one skipped
    is still run block by block: it once fell back to the model's children, the whole stack
    one block with LayerDrop inside it (Wav2Vec2 at width 32, two layers, failed to fit)."""
    from schedlang.pytorch.frontends.blocks.find import find_blocks

    found = find_blocks(_LayerDrop(layers).train(), (torch.randn(4, 8),))
    assert found.mode == "blocks"
    assert [b.name for b in found.blocks] == called
    assert found.not_called == ["layers.1"]


class _ReturnsMoreLater(torch.nn.Module):
    """A child that returns one tensor at its first call and two after: what randomness
    inside a block (LayerDrop in a whole encoder) can do to its outputs."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        h = torch.relu(self.lin(x))
        return (h,) if self.calls == 1 else (h, h * 2)


class _TwoChildren(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = _ReturnsMoreLater()
        self.head = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.head(self.body(x)[0])


def test_a_block_that_returns_other_tensors_than_recorded_is_a_located_error():
    """Profiling runs a block again on its recorded inputs; when it returns other tensors than
    the recorded call did, fit stops with an error that names the block and the likely cause,
    not a KeyError of the profiler's."""
    from schedlang.pytorch.fit import FitError, fit
    from schedlang.pytorch.frontends.blocks.find import BlockError

    with pytest.raises((BlockError, FitError)) as caught:
        fit(_TwoChildren(), (torch.randn(4, 8),), "80%", frontend="blocks",
            loss_fn=lambda out: out.sum(), op_options=False)
    assert "block 'body'" in str(caught.value) and "LayerDrop" in str(caught.value)


class _MaskedByConstant(torch.nn.Module):
    """A tensor made in the forward from a Python value (GPT-Neo's and Falcon's attention
    mask value, ``torch.tensor(torch.finfo(dtype).min)``): make_fx keeps it as a constant of
    the graph module (a ``get_attr`` node), which every segment reading it must find."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = torch.nn.functional.dropout(torch.relu(self.lin(x)), 0.1, True)
        return torch.where(h > 0.1, h, torch.tensor(-1.0)).sin().exp()


@pytest.mark.parametrize("cut", [1, 2, 3])
@pytest.mark.parametrize("small", [True, False])
def test_a_graph_constant_is_read_by_the_segments_that_use_it(cut, small, monkeypatch):
    """The op graph of a forward that makes a tensor constant is recorded and runs in
    segments (checkpointed, then kept) with eager gradients, dropout on; a small constant is
    rebuilt where it is read (the graph, cached per layer structure, holds no tensor), a
    larger one stays the graph module's."""
    from schedlang.pytorch import opgraph
    from schedlang.pytorch.segmented import SegmentedLayer, segments_of

    if not small:
        monkeypatch.setattr(opgraph, "CONSTANT_NUMEL", 0)
    block = _MaskedByConstant()
    x = torch.randn(4, 8)
    og = opgraph.record_ops(block, (x,), [True], repeats=1)
    kept = [n for n in og.gm.graph.nodes if n.op == "get_attr"]
    made = [n for n in og.gm.graph.nodes if n.target is opgraph.constant_tensor]
    assert (len(made), len(kept)) == ((1, 0) if small else (0, 1))
    names = [u.name for u in og.units]
    cut = min(cut, len(names) - 1)
    run = SegmentedLayer(og, block, segments_of(og, [(names[0], names[cut - 1], True),
                                                    (names[cut], names[-1], False)]))

    def grads(fn):
        torch.manual_seed(5)
        xi = x.clone().requires_grad_(True)
        block.zero_grad()
        out = fn(xi)
        out = out[0] if isinstance(out, (tuple, list)) else out
        out.pow(2).sum().backward()
        return [out.detach(), xi.grad, *(p.grad.clone() for p in block.parameters())]

    for want, got in zip(grads(block), grads(run)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


class _RoundedStraightThrough(torch.autograd.Function):
    """Rounding with a straight-through gradient (quantization-aware training): the backward
    is the Function's own, not the derivative of its forward's ops (zero)."""

    @staticmethod
    def forward(ctx, x):
        return torch.round(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


class _Quantized(torch.nn.Module):
    def __init__(self, custom: bool):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.custom = custom

    def forward(self, x):
        h = self.lin(x) * 4
        h = _RoundedStraightThrough.apply(h) if self.custom else torch.relu(h)
        return (torch.tanh(h).exp(),)


@pytest.mark.parametrize("custom", [False, True])
def test_an_op_graph_that_loses_a_custom_backward_is_not_replayed(custom):
    """A layer whose forward runs a custom `autograd.Function` records the Function's forward
    ops, whose derivatives are not its backward: its op graph does not replay its gradients,
    and it gets no generated options (which would train it with other gradients); without
    the Function, the graph replays them bit for bit."""
    from schedlang.pytorch.opgraph import record_ops
    from schedlang.pytorch.options import generate_options, replays_exactly

    layer = _Quantized(custom)
    x = torch.randn(4, 8)
    g = [torch.randn(4, 8)]
    og = record_ops(layer, (x,), [True], repeats=1)
    assert replays_exactly(og, layer, [x], [True], g) is not custom
    if custom:
        assert generate_options(layer, [x], [True], g, fractions=(0.5,), repeats=1) == []


@pytest.mark.slow
def test_bloom_blocks_get_only_options_with_eager_gradients(caplog):
    """Bloom's blocks run a custom GeLU backward: its op graph does not replay its gradients,
    so it gets no segment options (they once trained it with gradients 1e-9 off eager's),
    says so in the log, and whatever options it gets give eager gradients, dropout on."""
    import logging

    from schedlang.pytorch.fit import prepare

    model, args, kwargs, loss_fn = ARCHITECTURES["bloom"](batch=2, seq=16, layers=2, dim=16)
    with caplog.at_level(logging.INFO, logger="schedlang.pytorch"):
        prep = prepare(model, args, loss_fn=loss_fn, sample_kwargs=kwargs, frontend="blocks",
                       repeats=1, block_options={"fractions": (0.4,), "time_limit": 20})
    assert any("does not give its own gradients" in r.getMessage() for r in caplog.records)
    assert_every_option_eager(model, args, kwargs, loss_fn, prep, some=False)


@pytest.mark.parametrize("name,sizes", [
    ("wav2vec2", TINY),
    ("gemma2", {"batch": 8, "seq": 64, "layers": 2, "dim": 64})])
def test_plain_execution_is_predicted_with_the_glue_backward_measured(name, sizes):
    """The glue's backward memory is measured in a step (`frontends/blocks/glue_memory.py`),
    not guessed from its forward (its transient peak plus what autograd saved): plain
    execution's predicted peak is the measured one, never below it, within 1 KiB. The guess was 85,888 B under it
    on Wav2Vec2 (its feature projection's and positional convolution's backward), and 178,688 B
    over it on Gemma 2 (the head's soft-cap), where fit then missed plans that fit."""
    from schedlang.pytorch.fit import prepare
    from schedlang.pytorch.inputs import tensor_leaves
    from schedlang.pytorch.memory import MemoryTracker

    model, args, kwargs, loss_fn = ARCHITECTURES[name](**sizes)
    # the same step for the recording run and this one: no layer skipped at random
    # (LayerDrop), no masks drawn (SpecAugment); dropout stays on
    model.config.layerdrop = 0.0
    model.config.apply_spec_augment = False
    inputs = [t for _, t in tensor_leaves(args, kwargs)]
    with MemoryTracker(resident=[model, *inputs], existing=False) as mt:
        out = model(*args, **kwargs)  # held through the backward, as fit plans by default
        loss_fn(out).backward()
        del out
    model.zero_grad(set_to_none=True)
    prep = prepare(model, args, loss_fn=loss_fn, sample_kwargs=kwargs, repeats=1,
                   in_context=False)
    assert prep.frontend == "blocks"
    # (Wav2Vec2 predicts 16 B over: not chased)
    assert mt.peak <= prep.plain_peak <= mt.peak + 1024


def _hf_checkpointing_peak(model, args, kwargs, loss_fn) -> int:
    """The measured peak of one step (output held) with the model's own per-block
    checkpointing on a copy of it, parameters and inputs resident."""
    from schedlang.pytorch.inputs import tensor_leaves
    from schedlang.pytorch.memory import MemoryTracker

    twin = copy.deepcopy(model)
    enable = getattr(twin, "activation_checkpointing_enable", None) or \
        twin.gradient_checkpointing_enable
    enable({"use_reentrant": False})
    inputs = [t for _, t in tensor_leaves(args, kwargs)]
    with MemoryTracker(resident=[twin, *inputs]) as mt:
        out = twin(*args, **kwargs)
        loss_fn(out).backward()
        del out
    return mt.peak


@pytest.mark.parametrize("name", NAMES)
def test_architectures_fit_with_eager_gradients_within_the_budget(name):
    """At the peak the model's own per-block checkpointing measures and (`slow`) at 60% and
    40% of plain execution's peak: fitted with eager gradients (dropout on) and measured within the
    budget, or (60%, 40%) FitError naming a smallest feasible budget; once the model is
    dropped, nothing of it is alive."""
    from schedlang.pytorch.fit import FitError, fit, prepare

    before = snapshot()
    model, args, kwargs, loss_fn = ARCHITECTURES[name](**(TINY if name in DEFAULT else SMALL))
    checkpointed = _hf_checkpointing_peak(model, args, kwargs, loss_fn) \
        if getattr(model, "supports_gradient_checkpointing", False) else None
    ref = keyword_step(model, model, args, kwargs, loss_fn)
    # the times do not matter here (every plan must pass): the profile's, not whole steps'
    prep = prepare(model, args, loss_fn=loss_fn, sample_kwargs=kwargs, repeats=1,
                   in_context=False)
    assert prep.frontend == "blocks"
    fm = None
    # the default run's model at per-block checkpointing's peak alone (one solve; below it,
    # at its tiny size, FitError's bisection takes many)
    budgets = ("60%", "40%", checkpointed) if name not in DEFAULT else (checkpointed,)
    for budget in budgets:
        if budget is None:
            continue
        try:
            fm = fit(model, args, budget, loss_fn=loss_fn, prepared=prep, sample_kwargs=kwargs)
        except FitError as exc:
            assert budget != checkpointed, f"per-block checkpointing measures less: {exc}"
            assert SMALLEST.search(str(exc)), str(exc)
            continue
        assert_same_step(keyword_step(fm, model, args, kwargs, loss_fn), ref, str(budget))
        rep = fm.memory_report()
        assert rep.measured_peak_bytes <= rep.budget_bytes, (budget, rep)
        fm.unwrap()
    del model, args, kwargs, loss_fn, prep, fm
    assert new_bytes(before) == 0
