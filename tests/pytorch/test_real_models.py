"""`fit` on the models people train, with no whole-model trace (the hook front end).

Randomly initialised `transformers` models from tiny configs (no download; ConvNeXt with
stochastic depth, whose blocks differ in their drop rate and draw from the RNG), `nn.Sequential`,
a U-Net-like skip model, dropout and BatchNorm models: the gradients of a fitted step equal
eager PyTorch's bit for bit (the wrappers only recompute, from the restored RNG state), the
measured peak (CPU tracker: forward, loss, backward) is within the budget, or `FitError` names
the smallest feasible budget, and the model keeps its own forward, outputs, parameter names
and train()/eval() behaviour.
"""
from __future__ import annotations

import logging
import re
import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
torch.set_num_threads(1)

from torch import nn  # noqa: E402

from schedlang.testing.hf_models import HF  # noqa: E402
from schedlang.testing.leaks import host_copy, new_bytes, snapshot  # noqa: E402
from schedlang.testing.torch_models import ALL  # noqa: E402

#: sizes where activations outweigh parameters (else no budget below plain execution fits)
HF_SIZES = {"llama": dict(batch=4, seq=64), "gpt2": dict(batch=4, seq=64),
            "bert": dict(batch=4, seq=64), "bart": dict(batch=2, seq=64),
            "vit": dict(batch=4, size=64), "resnet": dict(batch=4, size=64),
            "convnext": dict(batch=4, size=64)}
#: models whose smallest feasible budget must be under half of plain execution's peak
TRANSFORMERS = {"llama", "gpt2", "bert", "bart", "vit"}
SMALLEST = re.compile(r"smallest feasible budget found is .*?\((\d+) B\)")


def _step(module, model, args, kwargs, loss_fn, seed=123):
    """Gradients, loss, RNG state, buffers and the output's type after one step, as host
    copies (`leaks.host_copy`: nothing a later measured step would count)."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    out = module(*args, **kwargs)
    loss = loss_fn(out)
    loss.backward()
    got = (*host_copy(([p.grad for p in model.parameters()], loss.detach(),
                       torch.get_rng_state(), list(model.buffers()))), type(out))
    # the samples' gradients (inputs that require one) are dropped as the parameters' are: a
    # gradient left on a sample is memory a later measured step counts (as on CUDA)
    for t in (*args, *kwargs.values()):
        if isinstance(t, torch.Tensor):
            t.grad = None
    return got


def _assert_same(ref, got, exact=True):
    """Bit for bit where the plan only recomputes (RNG restored); close otherwise (an fx plan
    that offloads runs its layers on copies)."""
    assert got[4] is ref[4], "the output type changed"
    kw = {"rtol": 0, "atol": 0} if exact else {}
    for a, b in zip(ref[0], got[0]):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(b, a, **kw)
    torch.testing.assert_close(got[1], ref[1], **kw)
    assert (ref[2] == got[2]).all(), "the global RNG stream differs from eager PyTorch"
    for a, b in zip(ref[3], got[3]):  # BatchNorm running statistics: updated once
        assert (a == b).all()


def _fit_at(make, sizes, budgets, with_loss_fn=True, frontend="auto", bound=None,
            bandwidth=None, exact=True, probe=None):
    """Fit at each budget (percent); returns [(pct, report or smallest feasible bytes)].
    What the preparation and the first fit keep alive, beyond the model, its inputs and the
    test's own copies, is at most 1% of plain execution's peak (issue 25)."""
    from schedlang.pytorch.fit import FitError, fit, prepare

    model, args, kwargs, loss_fn = make(**sizes)
    keys = list(model.state_dict())
    state = host_copy(dict(model.state_dict()))
    ref = _step(model, model, args, kwargs, loss_fn)
    made = snapshot()
    given = loss_fn if with_loss_fn else None
    # a host link later (fit(bandwidth=...)): the blocks' option offload is measured with
    # the profile, while the sample values are at hand
    prep = prepare(model, args, loss_fn=given, sample_kwargs=kwargs, frontend=frontend,
                   offload=bandwidth is not None,
                   repeats=1)
    rows = []
    for pct in budgets:
        model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
        try:
            fm = fit(model, args, f"{pct}%", loss_fn=given, prepared=prep, sample_kwargs=kwargs,
                     bandwidth=bandwidth, probe=probe)
            if made is not None:
                kept = new_bytes(made)
                assert kept <= 0.01 * prep.plain_peak, (pct, kept, prep.plain_peak)
        except FitError as exc:
            made = None
            found = SMALLEST.search(str(exc))
            assert found, str(exc)
            smallest = int(found.group(1))
            if bound is not None:
                assert smallest < bound * prep.plain_peak, (pct, smallest, prep.plain_peak)
            rows.append((pct, smallest))
            continue
        got = _step(fm, model, args, kwargs, loss_fn)
        _assert_same(ref, got, exact)
        rep = fm.memory_report()
        assert rep.measured_peak_bytes <= rep.budget_bytes, (pct, rep.measured_peak_bytes,
                                                            rep.budget_bytes)
        assert rep.predicted_peak_bytes <= rep.budget_bytes
        assert rep.loss_assumed == (not with_loss_fn)
        rows.append((pct, rep))
        fm.unwrap()
        made = None  # the check is for the first fit: the steps since made gradients
    assert list(model.state_dict()) == keys, "fit changed the parameter names"
    return prep, rows


def _hf(name):
    def make(**sizes):
        return HF[name](**sizes)
    return make


def _plain(name):
    def make(**sizes):
        model, args, loss_fn = ALL[name](**sizes)
        return model, args, {}, loss_fn
    return make


#: the budget each model is fitted at in the default run (one solve each)
DEFAULT_BUDGET = {"llama": 50, "gpt2": 40, "bert": 50, "bart": 50, "vit": 50, "resnet": 80,
                  "convnext": 60}


#: every transformers model: GPT-2 in the default run, the others marked slow
GPT2_ALWAYS_OTHERS_SLOW = ["gpt2", *[pytest.param(n, marks=pytest.mark.slow)
                                     for n in HF if n != "gpt2"]]


@pytest.mark.parametrize("name", list(HF))
def test_transformers_models_fit_with_equal_gradients(name):
    """... and once the fitted module, the model and the inputs are gone, nothing of them is
    alive (`_fit_at` checks what the fit kept while they were)."""
    before = snapshot()
    prep, rows = _fit_at(_hf(name), HF_SIZES[name], [DEFAULT_BUDGET[name]])
    assert prep.frontend == "blocks"  # fx cannot trace them, or they take keyword inputs
    (_, rep), = rows
    assert not isinstance(rep, int) and not rep.plain, rows
    del prep, rows, rep
    assert new_bytes(before) == 0


@pytest.mark.slow
@pytest.mark.parametrize("name", list(HF))
def test_transformers_models_at_100_60_40_percent(name):
    """Fitted, or FitError naming a smallest feasible budget under half of plain execution's
    peak (transformers)."""
    prep, rows = _fit_at(_hf(name), HF_SIZES[name], [100, 60, 40],
                         bound=0.5 if name in TRANSFORMERS else None)
    assert rows[0][1].plain or rows[0][1].extra["probes"]


@pytest.mark.parametrize("name", GPT2_ALWAYS_OTHERS_SLOW)
def test_transformers_models_fit_without_loss_fn(name):
    """No loss_fn: the reserve keeps room for the cross-entropy the step applies."""
    _, rows = _fit_at(_hf(name), HF_SIZES[name], [60, 40] if name == "gpt2" else [100, 60, 40],
                      with_loss_fn=False, bound=0.5 if name in TRANSFORMERS else None)
    assert any(not isinstance(r, int) and "reserved (no loss_fn given" in str(r)
               for _, r in rows)


#: six budgets above each model's smallest feasible one (percent of plain execution's peak)
FALLING = {"bart": [100, 90, 80, 70, 60, 50], "vit": [100, 90, 80, 70, 60, 50],
           "resnet": [100, 95, 90, 85, 80, 75], "convnext": [100, 85, 70, 55, 45, 40]}



@pytest.mark.parametrize("name", ["gpt2", pytest.param("llama", marks=pytest.mark.slow),
                                  pytest.param("bart", marks=pytest.mark.slow)])
def test_transformers_models_with_their_key_value_cache_on(name, caplog):
    """`use_cache=True`, the configs' default: each block is handed a cache it writes into.
    Fitted, the blocks run without it in training (as transformers' own checkpointing does)
    and fit says so; gradients equal eager's (which built the cache) and the budget holds.
    Equal to rounding, not bit for bit: a block the plan wraps runs without the cache, eager
    with it (attention on the cache's concatenated keys sums in another order: 2.8e-9 apart
    on GPT-2), and which blocks a plan wraps depends on the timing profile."""
    sizes = dict(HF_SIZES[name], use_cache=True)
    with caplog.at_level(logging.WARNING, logger="schedlang.pytorch"):
        # no probe step: the prediction itself must hold (the profile ran without the cache,
        # so must every planned step, plain execution's included)
        _, rows = _fit_at(_hf(name), sizes, [100, DEFAULT_BUDGET[name]], probe=False,
                          exact=False)
    assert "key/value cache" in caplog.text and "use_cache=False" in caplog.text
    assert [pct for pct, rep in rows if isinstance(rep, int)] == [], rows
    for pct, rep in rows:
        assert rep.measured_peak_bytes <= rep.predicted_peak_bytes, (pct, rep)


def test_a_model_with_its_own_gradient_checkpointing_on(caplog):
    """transformers' `gradient_checkpointing_enable()` called before fit: the plan takes over recomputation
    (the profile must see what autograd saves in each block), fit says so, the budget is a
    share of the unchecked peak and holds, gradients equal eager's, and `unwrap()` gives the
    model its own checkpointing back."""
    from schedlang.pytorch.fit import fit

    model, args, kwargs, loss_fn = HF["gpt2"](**HF_SIZES["gpt2"])
    # transformers' own checkpointing (renamed `activation_checkpointing_enable` in 5.x)
    enable = getattr(model, "activation_checkpointing_enable", None) \
        or model.gradient_checkpointing_enable
    enable({"use_reentrant": False})
    from schedlang.pytorch.memory import MemoryTracker
    from schedlang.pytorch.model_state import own_checkpointing

    with MemoryTracker(resident=[model, *kwargs.values()]) as checked:
        ref = _step(model, model, args, kwargs, loss_fn)
    with caplog.at_level(logging.WARNING, logger="schedlang.pytorch"):
        fm = fit(model, args, "50%", loss_fn=loss_fn, sample_kwargs=kwargs)
    assert "own gradient checkpointing is on" in caplog.text
    assert not own_checkpointing(model)
    _assert_same(ref, _step(fm, model, args, kwargs, loss_fn))
    rep = fm.memory_report()
    assert rep.measured_peak_bytes <= rep.budget_bytes
    # "50%" is of the peak without the model's checkpointing, above the checkpointed step's
    assert rep.plain_peak_bytes > 1.5 * checked.peak, (rep.plain_peak_bytes, checked.peak)
    fm.unwrap()
    assert own_checkpointing(model)

@pytest.mark.parametrize("name,with_loss_fn", [
    ("gpt2", False), pytest.param("llama", True, marks=pytest.mark.slow),
    *[pytest.param(n, True, marks=pytest.mark.slow)
      for n in ("gpt2", "bert", "bart", "vit", "resnet", "convnext")]])
def test_measured_peak_falls_with_the_budget(name, with_loss_fn):
    """Measured peak is monotone non-increasing over six falling budgets, for every model."""
    _, rows = _fit_at(_hf(name), HF_SIZES[name],
                      FALLING.get(name, [100, 85, 70, 55, 45, 35]),
                      with_loss_fn=with_loss_fn, bound=0.5 if name in TRANSFORMERS else None)
    measured = [r.measured_peak_bytes for _, r in rows if not isinstance(r, int)]
    assert len(measured) >= 6, rows
    assert all(lo <= hi for hi, lo in zip(measured, measured[1:])), measured


@pytest.mark.slow
@pytest.mark.parametrize("name,sizes,budgets", [
    ("unet", dict(batch=2, size=32, base=8), [100, 95, 90, 80, 70, 62]),
    ("dropout_mlp", {}, [100, 95, 90, 85, 80, 75])])
def test_measured_peak_falls_with_the_budget_plain_models(name, sizes, budgets):
    """The same for plain PyTorch models (fx front end: the U-Net's skip connections)."""
    _, rows = _fit_at(_plain(name), sizes, budgets, probe=True)
    measured = [r.measured_peak_bytes for _, r in rows if not isinstance(r, int)]
    assert len(measured) >= 6, rows
    assert all(lo <= hi for hi, lo in zip(measured, measured[1:])), measured


@pytest.mark.parametrize("name", GPT2_ALWAYS_OTHERS_SLOW)
def test_transformers_models_with_offload(name):
    """With a host link, a block's wrapper may move what the block saves to host memory: the
    gradients stay bit for bit (the copies are exact) and the step stays within the budget."""
    # ResNet's per-block plans reach ~70% at the smallest (its stem and stages' boundaries
    # stay resident, offload or not): its offload plans are checked above that
    budgets = [85, 75] if name == "resnet" else [60, 40]
    _, rows = _fit_at(_hf(name), HF_SIZES[name], budgets, bandwidth="16GB/s",
                      bound=0.5 if name in TRANSFORMERS else None)
    assert any(not isinstance(r, int) and not r.plain for _, r in rows), rows


def test_the_model_keeps_its_forward_outputs_and_modes():
    """The blocks are wrapped in place: keyword inputs, ModelOutput, eval() without grad, and
    unwrap() gives the original classes back."""
    from schedlang.pytorch.fit import fit

    model, args, kwargs, loss_fn = HF["llama"](**HF_SIZES["llama"])
    classes = {n: type(m) for n, m in model.named_modules()}
    fm = fit(model, args, "50%", loss_fn=loss_fn, sample_kwargs=kwargs)
    assert fm.frontend == "blocks" and not fm.plain
    assert any(type(m) is not classes[n] for n, m in model.named_modules())
    fm.eval()
    assert not model.training
    with torch.no_grad():
        got = fm(**kwargs).logits
    fm.unwrap()
    assert all(type(m) is classes[n] for n, m in model.named_modules())
    with torch.no_grad():
        want = model(**kwargs).logits
    assert torch.equal(got, want)
    model.train()


# --- plain PyTorch models through the hook front end ---------------------------------------------
def make_bn_cnn(batch=8, size=32, ch=16, depth=4, seed=0):
    """Repeated conv-BatchNorm-ReLU blocks (training mode: running statistics update)."""
    torch.manual_seed(seed)

    def block(c):
        return nn.Sequential(nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(),
                             nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU())

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, ch, 3, padding=1)
            self.blocks = nn.ModuleList(block(ch) for _ in range(depth))
            self.head = nn.Linear(ch, 5)

        def forward(self, x):
            x = self.stem(x)
            for b in self.blocks:
                x = b(x)
            return self.head(x.mean((2, 3)))

    model = Net().train()
    x = torch.randn(batch, 3, size, size)
    return model, (x,), {}, lambda out: out.pow(2).mean()


@pytest.mark.parametrize("frontend", ["blocks", pytest.param("fx", marks=pytest.mark.slow)])
def test_batchnorm_running_statistics_end_the_step_as_in_eager(frontend):
    _, rows = _fit_at(make_bn_cnn, {}, [60], frontend=frontend)
    assert any(not isinstance(r, int) and not r.plain for _, r in rows), rows


@pytest.mark.parametrize("name,sizes,budgets", [
    ("dropout_mlp", {}, [100]),
    pytest.param("dropout_mlp", {}, [100, 60, 40], marks=pytest.mark.slow),
    pytest.param("mlp", {}, [100, 60, 40], marks=pytest.mark.slow),
    pytest.param("unet", dict(batch=2, size=32, base=8), [100, 60, 40],
                 marks=pytest.mark.slow)])
def test_plain_models_through_the_hook_front_end(name, sizes, budgets):
    """Single-op blocks (Linear, GELU, Dropout) save no more than their inputs: per-block
    plans cannot go far below plain execution there (FitError names how far)."""
    _fit_at(_plain(name), sizes, budgets, frontend="blocks")


@pytest.mark.parametrize("frontend,bandwidth", [
    ("auto", None), pytest.param("auto", "16GB/s", marks=pytest.mark.slow),
    pytest.param("blocks", "16GB/s", marks=pytest.mark.slow)])
def test_unet_skip_model_within_budget(frontend, bandwidth):
    """The U-Net-like model traces with fx: `auto` takes fx's layers (the glue — pooling,
    concatenations — joins them and can be recomputed). Skip tensors stay alive across the
    network, so its smallest feasible budget is higher than a transformer's (README)."""
    # the hook front end keeps every block boundary and skip tensor: its smallest feasible
    # budget is ~88% here (not met: issue 14), so its plans are checked at 92%
    budgets = [70] if frontend == "auto" and bandwidth is None else \
        [100, 92, 70] if frontend == "blocks" else [100, 70, 60]
    # probe=True: the fx plan's first step measures a little over its prediction here; the
    # probe step re-plans before fit returns (README)
    prep, rows = _fit_at(_plain("unet"), dict(batch=2, size=32, base=8), budgets,
                         with_loss_fn=True, frontend=frontend, bandwidth=bandwidth,
                         exact=bandwidth is None, probe=True)
    assert prep.frontend == ("fx" if frontend == "auto" else "blocks")
    assert any(not isinstance(r, int) and not r.plain for _, r in rows), rows


# --- what cannot be planned ----------------------------------------------------------------------
class _Twice(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(3))

    def forward(self, x):
        x = self.layers[0](x)
        for layer in self.layers:  # the first block runs twice: shared weights
            x = layer(x)
        return x


def test_two_fits_of_one_model_each_run_their_own_plan():
    """Both wrap the model's blocks in place: the one called runs its own plan, whichever fit
    came last (the other's wrappers once set every block, and a fit at 40% ran plain)."""
    from schedlang.pytorch.fit import fit, prepare

    model, args, kwargs, loss_fn = _hf("gpt2")(**HF_SIZES["gpt2"])
    ref = _step(model, model, args, kwargs, loss_fn)
    prep = prepare(model, args, loss_fn=loss_fn, sample_kwargs=kwargs, repeats=1)
    low = fit(model, args, "40%", loss_fn=loss_fn, prepared=prep, sample_kwargs=kwargs)
    high = fit(model, args, "100%", loss_fn=loss_fn, prepared=prep, sample_kwargs=kwargs)
    assert not low.plain and high.plain
    for fm in (low, high, low):
        _assert_same(ref, _step(fm, model, args, kwargs, loss_fn))
        rep = fm.memory_report()
        assert rep.measured_peak_bytes <= rep.budget_bytes, (rep.measured_peak_bytes,
                                                            rep.budget_bytes)
    assert low.memory_report().measured_peak_bytes < 0.6 * \
        high.memory_report().measured_peak_bytes
    # a fit without `prepared` while `low` is held: plain execution is measured as plain (once
    # it ran through `low`'s wrappers, measured 40%, and fit chose plain execution at 80%)
    mid = fit(model, args, "80%", loss_fn=loss_fn, sample_kwargs=kwargs)
    assert not mid.plain
    _step(mid, model, args, kwargs, loss_fn)
    assert mid.memory_report().measured_peak_bytes <= mid.memory_report().budget_bytes
    mid.unwrap()
    high.unwrap()  # the other's blocks stay planned: it wraps them again when called
    _step(low, model, args, kwargs, loss_fn)
    assert low.memory_report().measured_peak_bytes <= low.memory_report().budget_bytes
    low.unwrap()
    assert not any(type(m).__name__.startswith("Planned") for m in model.modules())


def test_a_block_called_twice_is_named():
    from schedlang.pytorch.fit import fit
    from schedlang.pytorch.frontends.blocks.find import BlockError

    x = torch.randn(4, 8)
    with pytest.raises(BlockError, match=r"block 'layers\.0' .*called more than once"):
        fit(_Twice(), (x,), "50%", frontend="blocks")


def test_fallback_only_when_asked():
    from schedlang.pytorch.fit import fit
    from schedlang.pytorch.frontends.blocks.find import BlockError

    model = nn.Linear(8, 8)  # no submodule to wrap
    x = torch.randn(4, 8)
    with pytest.raises(BlockError, match="Linear: no block found"):
        fit(model, (x,), "50%", frontend="blocks")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fm = fit(model, (x,), "50%", frontend="blocks", fallback=True)
    assert any("cannot be planned" in str(w.message) for w in caught)
    assert fm.plain and "no block found" in fm.memory_report().extra["fallback"]
    torch.testing.assert_close(fm(x), model(x))


def test_find_blocks_records_keyword_inputs_and_glue():
    from schedlang.pytorch.frontends.blocks.find import find_blocks

    model, args, kwargs, _ = HF["llama"](batch=2, seq=8, layers=3)
    found = find_blocks(model, args, kwargs)
    stack = [b.name for b in found.blocks if b.name.startswith("model.layers.")]
    assert stack == ["model.layers.0", "model.layers.1", "model.layers.2"]
    first = found.block("model.layers.0")
    # hidden states, and the glue's mask / position embeddings passed as keywords
    assert len(first.inputs) >= 3 and set(first.inputs) <= set(found.data)
    assert found.inputs == ["input_ids", "attention_mask"]
    shared = set(first.inputs) & set(found.block("model.layers.2").inputs)
    assert shared and all(found.producers().get(d, "").startswith("glue") for d in shared)


def test_the_readme_transformers_example_runs():
    """README's PyTorch section opens with a `transformers` model fitted end to end: the code
    block runs as written, and its steps stay within the budget."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    after = text.split("A `transformers` model, end to end", 1)[1]
    code = after.split("```python\n", 1)[1].split("```", 1)[0]
    assert "transformers." in code and "sp.fit(" in code
    env: dict = {}
    exec(compile(code, "README.md", "exec"), env)  # noqa: S102 - the project's own README
    rep = env["wrapped"].memory_report()
    assert rep.measured_peak_bytes is not None and rep.budget_bytes is not None
    assert rep.measured_peak_bytes <= rep.budget_bytes
    assert not rep.plain

