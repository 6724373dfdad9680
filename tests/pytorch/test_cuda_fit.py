"""`fit` on CUDA (issue 25): every test takes the device as a parameter; the ``cuda`` variants
are marked `gpu` (skipped without CUDA, `conftest.py`) and the ``cpu`` variants run the same
body on the CPU, so that their logic runs in every test run (the long ones are marked slow).

Each asserts what a GPU user relies on: gradients against eager PyTorch's (the largest
difference over the largest gradient, per parameter: `grad_rel_diff`, gpu-check's measure),
the measured peak of the fitted step within the budget (CUDA: `max_memory_allocated`, every
tensor on the device; CPU: the tracker of every live storage), and the prediction against the
measurement. CUDA semantics these rely on: `torch.manual_seed` seeds every device's generator;
the caching allocator counts its cuBLAS workspaces (allocated at the first matmul, kept), so
fx plans are fitted with ``probe=True`` (the probe's margin carries that into the prediction);
reference values are kept as host copies (`leaks.host_copy`), never on the device while a
step is measured; transfers run on the runtime's side streams, timed by CUDA events.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from schedlang.testing.hf_models import HF  # noqa: E402
from schedlang.testing.leaks import host_copy  # noqa: E402
from schedlang.testing.torch_models import make_gpt  # noqa: E402

CUDA = pytest.param("cuda", marks=pytest.mark.gpu)
CPU = "cpu"
CPU_SLOW = pytest.param("cpu", marks=pytest.mark.slow)
#: |measured - predicted| / predicted
PREDICTION = 0.05
#: the largest gradient difference over the largest gradient, per parameter
GRAD_REL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}


def _autocast(device: str):
    """bfloat16 autocast without its weight cache: the cache lives as long as the outermost
    autocast context, one around `fit` (its probe steps) but one per training step, so the
    bf16 copies of the weights would be alive through the probe's backward and not through a
    step's (cached or not, each step makes them)."""
    return torch.autocast(device, dtype=torch.bfloat16, cache_enabled=False)


def _step(module, model, args, kwargs, loss_fn, autocast=None, seed=123):
    """One training step holding the output through the backward (the loop fit's prediction
    is for); gradients and loss as host copies. `autocast`: the forward and the loss run
    under `_autocast`, the backward outside it, as AMP loops do."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)  # every device's generator
    dev = next(model.parameters()).device.type
    with (_autocast(dev) if autocast else _nothing()):
        out = module(*args, **kwargs)
        loss = loss_fn(out)
    loss.backward()
    del out
    return host_copy(([p.grad for p in model.parameters()], loss.detach()))


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _assert_grads(ref, got, dtype):
    for a, b in zip(ref[0], got[0]):
        scale = float(abs(a).max()) or 1.0
        assert float(abs(a - b).max()) / scale <= GRAD_REL[dtype]
    assert abs(float(ref[1]) - float(got[1])) <= GRAD_REL[dtype] * max(1.0, abs(float(ref[1])))


def _assert_within(fm, pct=None):
    rep = fm.memory_report()
    assert rep.measured_peak_bytes is not None
    assert rep.measured_peak_bytes <= rep.budget_bytes, (pct, rep)
    assert abs(rep.measured_peak_bytes - rep.predicted_peak_bytes) \
        <= PREDICTION * rep.predicted_peak_bytes, (pct, rep)
    return rep


# --- the hook front end on a transformers model, dropout on -------------------------------------
HOOK_SIZES = {"cuda": dict(batch=8, seq=512, layers=6, dim=256),
              "cpu": dict(batch=4, seq=64, layers=4, dim=32)}


@pytest.mark.parametrize("device", [CUDA, CPU_SLOW])
def test_hook_front_end_on_gpt2_with_dropout_at_80_60_40_percent(device):
    """GPT2LMHeadModel (dropout 0.1 everywhere, SDPA attention: on CUDA its kernels draw from
    the device's generator) through the hook front end at 80, 60 and 40% of plain execution's
    peak: eager's gradients, measured within the budget and the prediction; a budget no plan
    meets names a smallest feasible one under half of plain execution's peak."""
    import re

    from schedlang.pytorch.fit import FitError, fit, prepare

    model, args, kwargs, loss_fn = HF["gpt2"](**HOOK_SIZES[device], device=device)
    ref = _step(model, model, args, kwargs, loss_fn)
    prep = prepare(model, args, loss_fn=loss_fn, sample_kwargs=kwargs, frontend="blocks",
                   repeats=2)
    fitted = 0
    for pct in (80, 60, 40):
        try:
            fm = fit(model, args, f"{pct}%", loss_fn=loss_fn, prepared=prep,
                     sample_kwargs=kwargs)
        except FitError as exc:
            smallest = re.search(r"smallest feasible budget found is .*?\((\d+) B\)", str(exc))
            assert pct == 40 and smallest, str(exc)
            assert int(smallest.group(1)) < 0.5 * prep.plain_peak
            continue
        _assert_grads(ref, _step(fm, model, args, kwargs, loss_fn), torch.float32)
        _assert_within(fm, pct)
        fm.unwrap()
        fitted += 1
    assert fitted >= 2


# --- offload: transfers on their own streams ---------------------------------------------------
OFFLOAD_SIZES = {"cuda": dict(batch=16, context=512, dim=512, heads=8, layers=4, vocab=4096),
                 "cpu": dict(batch=4, context=32, dim=32, heads=4, layers=4, vocab=128)}


@pytest.mark.parametrize("device", [CUDA, CPU_SLOW])
def test_offload_transfers_run_on_their_own_streams_beside_compute(device):
    """An offload plan (fx, 16 GB/s): eager's gradients, the step within its budget and its
    prediction, and in the timeline the offloads and prefetches on their channels' tracks; on
    CUDA, where they run on side streams timed by CUDA events, at least one transfer overlaps
    a compute op in time."""
    from schedlang.pytorch.fit import fit

    model, inputs, loss_fn = make_gpt(**OFFLOAD_SIZES[device], dropout=0.1, device=device)
    ref = _step(model, model, inputs, {}, loss_fn)
    fm = fit(model, inputs, "50%", loss_fn=loss_fn, bandwidth="16GB/s", probe=True,
             op_options=False, repeats=2)
    transfers = [op for op in fm.plan.ops if op.op in ("offload", "prefetch")]
    assert transfers, "the plan moves nothing: no transfer to see"
    fm.record_timeline()
    _assert_grads(ref, _step(fm, model, inputs, {}, loss_fn), torch.float32)
    _assert_within(fm)
    tl = fm.timeline()
    events = tl.chrome_trace()["traceEvents"]
    done = [e for e in events if e["ph"] == "X" and e["pid"] == 1]
    compute = [e for e in done if e["tid"] == 1]
    moved = [e for e in done if e["tid"] in (2, 3)]
    assert len(moved) == len(transfers) and compute
    if device == "cuda":
        assert any(max(c["ts"], m["ts"]) < min(c["ts"] + c["dur"], m["ts"] + m["dur"])
                   for m in moved for c in compute), "no transfer overlaps the compute"


# --- bf16 parameters, and autocast --------------------------------------------------------------
@pytest.mark.parametrize("device", [CUDA, CPU])
@pytest.mark.parametrize("frontend", ["fx", "blocks"])
def test_bf16_parameters(device, frontend):
    """A model in bfloat16 (parameters, activations, gradients): fitted at 60%, eager's
    gradients (to bf16's precision: recomputations run the same kernels), the step within
    the budget and the prediction."""
    from schedlang.pytorch.fit import fit

    sizes = (dict(batch=16, context=256, dim=256, heads=8, layers=4, vocab=4096)
             if device == "cuda" else dict(batch=4, context=32, dim=32, heads=4, layers=4,
                                           vocab=128))
    model, inputs, loss_fn = make_gpt(**sizes, dropout=0.1, device=device,
                                      dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    ref = _step(model, model, inputs, {}, loss_fn)
    fm = fit(model, inputs, "60%", loss_fn=loss_fn, frontend=frontend, probe=True,
             op_options=False, repeats=2)
    assert fm.plan is not None
    _assert_grads(ref, _step(fm, model, inputs, {}, loss_fn), torch.bfloat16)
    _assert_within(fm)


@pytest.mark.parametrize("device", [CUDA, CPU])
@pytest.mark.parametrize("frontend", ["fx", "blocks"])
def test_autocast(device, frontend):
    """float32 parameters, the forward under ``torch.autocast(bfloat16)`` and the backward
    outside it: `fit` called under the same autocast (its profile sees bf16 activations);
    every recomputation in the backward runs under the autocast state of its first run (torch's
    checkpoint restores it for the hook front end; the plan executor's `FirstRun` for fx), so
    the gradients are eager's; the step within the budget and the prediction."""
    from schedlang.pytorch.fit import fit

    sizes = (dict(batch=16, context=256, dim=256, heads=8, layers=4, vocab=4096)
             if device == "cuda" else dict(batch=4, context=32, dim=32, heads=4, layers=4,
                                           vocab=128))
    model, inputs, loss_fn = make_gpt(**sizes, dropout=0.1, device=device)
    ref = _step(model, model, inputs, {}, loss_fn, autocast=True)
    with _autocast(device):
        fm = fit(model, inputs, "60%", loss_fn=loss_fn, frontend=frontend, probe=True,
                 op_options=False, repeats=2)
    assert fm.plan is not None
    forwards = [(op.node, op.option) for op in fm.plan.ops
                if op.op == "compute" and op.node.endswith(".fwd")]
    # a plan recomputes with an option that saves less (recompute, selective, fast_forward) or
    # by running a forward again; which of the two the optimum takes follows the profile
    assert (any(option != "autograd" for _, option in forwards)
            or len({node for node, _ in forwards}) < len(forwards)), \
        f"nothing is recomputed at 60%: {forwards}"
    _assert_grads(ref, _step(fm, model, inputs, {}, loss_fn, autocast=True), torch.bfloat16)
    _assert_within(fm)
