"""The hook front end's block option ``rerun`` (`recompute.rerun_call`: the forward without
autograd, run again with it in the block's backward, then that backward, nested): gradients
bit for bit eager PyTorch's with dropout on, the measured peak its prediction, offered only
where the gradients stay eager's (`frontends.blocks.rerun`), and taken by the solver where the
profile makes it the fastest choice. Plans are pinned or their times are data
(`profiles.pin_block_times`); nothing is timed."""
from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
torch.set_num_threads(1)

from schedlang.plans.planners.baselines import plan_checkpoint_groups  # noqa: E402
from schedlang.pytorch.fit import fit, prepare  # noqa: E402
from schedlang.pytorch.frontends.blocks.find import find_blocks  # noqa: E402
from schedlang.pytorch.frontends.blocks.plan_reading import plan_choices  # noqa: E402
from schedlang.pytorch.frontends.blocks.rerun import RERUN, rerun_blocks  # noqa: E402
from schedlang.pytorch.recompute import rerun_call  # noqa: E402
from schedlang.testing.hf_models import HF  # noqa: E402
from schedlang.testing.profiles import PINNED_BLOCK_BWD, pin_block_times  # noqa: E402

from .test_checkpoint_peaks import SIZES  # noqa: E402
from .test_real_models import _assert_same, _step  # noqa: E402


def _rerun_layers(prep) -> list[str]:
    return [lay.name for lay in prep.graph.layers if any(o.name == RERUN for o in lay.options)]


@pytest.mark.parametrize("name", list(SIZES))
def test_every_block_rerun_gives_eager_gradients_and_its_predicted_peak(name):
    model, args, kwargs, loss_fn = HF[name](**SIZES[name])
    ref = _step(model, model, args, kwargs, loss_fn)
    prep = prepare(model, args, loss_fn=loss_fn, sample_kwargs=kwargs, frontend="blocks",
                   repeats=1)
    reruns = _rerun_layers(prep)
    assert reruns
    # (BART's decoder blocks, which cannot rerun, recompute)
    choices = {lay.name: RERUN if lay.name in reruns else "recompute"
               for lay in prep.graph.layers if any(o.name == "recompute" for o in lay.options)}
    plan = plan_checkpoint_groups(prep.graph, [], choices)
    pinned = fit(model, args, prep.plain_peak, loss_fn=loss_fn, sample_kwargs=kwargs,
                 prepared=prep, plan=plan)
    assert {plan_choices(pinned.plan, prep.graph, list(choices))[b] for b in reruns} == {RERUN}
    _assert_same(ref, _step(pinned, model, args, kwargs, loss_fn))
    rep = pinned.memory_report()
    assert rep.measured_peak_bytes == rep.predicted_peak_bytes, rep


def test_a_rerun_block_lets_go_of_its_gradient_as_torchs_checkpoint_does():
    """The gradient a ``rerun`` node is given is freed once its nested backward's first node
    has read it, as under torch's checkpoint (a pre-hook on the node takes it from the
    engine). Held through the nested backward, it was one output more at a peak late in that
    backward (here: 20 outputs' worth against the checkpoint's 19; BERT's blocks: 29,440 B
    more in each backward)."""
    from schedlang.pytorch.memory import MemoryTracker
    from schedlang.pytorch.recompute import checkpoint_call

    n = 1 << 14
    wide = torch.randn(1, 8)

    def block(t):  # its backward's peak is in its last node, long after the gradient's reader
        return (t.unsqueeze(1) * wide).exp().sum(1)

    peaks = {}
    for name, call in (("checkpoint", checkpoint_call), ("rerun", rerun_call)):
        x, w = torch.randn(n, requires_grad=True), torch.randn(n)
        with MemoryTracker(resident=[x, w, wide], existing=False) as mt:
            y = call(block, (x * 1.0,), {})
            (y * w).sum().backward()  # y's gradient is made by the engine, held by no one else
        peaks[name] = mt.peak - mt.baseline
    assert peaks["rerun"] <= peaks["checkpoint"], peaks


def test_rerun_hands_on_gradients_in_the_layout_eager_does():
    """ConvNeXt (stochastic depth, layer scale): a gradient a rerun block hands on, taken from
    its argument's leaf after accumulation, had the argument's strides, not those its ops made
    as in eager: the block before reduced its layer-scale gradient over another layout, 1 ulp
    off eager's (the default run's gradient test failed where the profile picked rerun)."""
    from .test_real_models import HF_SIZES

    model, args, kwargs, loss_fn = HF["convnext"](**HF_SIZES["convnext"])
    ref = _step(model, model, args, kwargs, loss_fn)
    prep = prepare(model, args, loss_fn=loss_fn, sample_kwargs=kwargs, frontend="blocks",
                   repeats=1)
    reruns = _rerun_layers(prep)
    assert len(reruns) >= 2
    plan = plan_checkpoint_groups(prep.graph, [], dict.fromkeys(reruns, RERUN))
    pinned = fit(model, args, prep.plain_peak, loss_fn=loss_fn, sample_kwargs=kwargs,
                 prepared=prep, plan=plan)
    _assert_same(ref, _step(pinned, model, args, kwargs, loss_fn))
    rep = pinned.memory_report()
    assert rep.measured_peak_bytes <= rep.predicted_peak_bytes, rep
    pinned.unwrap()


def test_blocks_that_share_an_input_needing_a_gradient_rerun_too():
    """BART's decoder blocks all read the encoder's output (cross-attention, keys and values):
    each use's gradient leaves a rerun block apart, in the order eager adds them, so they
    rerun as the encoder blocks do (`test_every_block_rerun_gives_eager_gradients...[bart]`
    checks the bits)."""
    model, args, kwargs, _ = HF["bart"](**SIZES["bart"])
    found = find_blocks(model, args, kwargs)
    names = [b.name for b in found.blocks]
    decoder = [n for n in names if ".decoder.layers." in n]
    encoder = [n for n in names if ".encoder.layers." in n]
    assert decoder and encoder
    assert rerun_blocks(found) >= set(encoder) | set(decoder)


def test_a_shared_input_read_twice_in_each_rerun_block_gets_eager_gradients():
    """Two blocks each read `shared` twice (as cross-attention reads the encoder's output):
    eager adds the four gradients one by one, ((a2 + a1) + b2) + b1; a rerun block that
    summed its own two first would give (a2 + a1) + (b2 + b1), some ulps off (without
    `apart`, the test fails)."""
    torch.manual_seed(0)
    enc = torch.nn.Linear(64, 64)
    weights = [torch.nn.Linear(64, 64) for _ in range(4)]

    def block(h, shared, first, second):
        return torch.tanh(h + first(shared) * second(shared))

    x, h0 = torch.randn(32, 64), torch.randn(32, 64)
    grads = []
    for rerun in (False, True):
        for m in (enc, *weights):
            m.zero_grad(set_to_none=True)
        shared = enc(x)
        h = h0
        for i in range(2):
            f = lambda a, s, i=i: block(a, s, weights[2 * i], weights[2 * i + 1])  # noqa: E731
            h = rerun_call(f, (h, shared), {}, apart=(1,)) if rerun else f(h, shared)
        h.sum().backward()
        grads.append([p.grad.clone() for p in enc.parameters()])
    for got, want in zip(grads[1], grads[0]):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["t5", "whisper"])
def test_encoder_decoder_blocks_rerun_with_eager_gradients(name):
    """T5 and Whisper: every block that has ``rerun`` (their decoder blocks read the
    encoder's output twice; T5's blocks share the first one's position bias) runs it, dropout
    on: the gradients are eager's bit for bit."""
    from schedlang.testing.block_options import assert_same_step, keyword_step
    from schedlang.testing.hf_architectures import ARCHITECTURES

    model, args, kwargs, loss_fn = ARCHITECTURES[name](batch=2, seq=32, layers=2, dim=32)
    ref = keyword_step(model, model, args, kwargs, loss_fn)
    prep = prepare(model, args, loss_fn=loss_fn, sample_kwargs=kwargs, frontend="blocks",
                   repeats=1)
    reruns = _rerun_layers(prep)
    assert any("decoder" in n for n in reruns), reruns
    plan = plan_checkpoint_groups(prep.graph, [], dict.fromkeys(reruns, RERUN))
    pinned = fit(model, args, prep.plain_peak, loss_fn=loss_fn, sample_kwargs=kwargs,
                 prepared=prep, plan=plan)
    assert_same_step(keyword_step(pinned, model, args, kwargs, loss_fn), ref, name)
    pinned.unwrap()


def _pinned_rerun_cheaper(model, args, kwargs, loss_fn):
    """(GPT-2's prepared profile with its blocks' times pinned as data, ``rerun`` 10% cheaper
    than ``recompute`` in the backward; the blocks that have ``rerun``)."""
    prep = prepare(model, args, loss_fn=loss_fn, sample_kwargs=kwargs, frontend="blocks",
                   repeats=1)
    blocks = _rerun_layers(prep)
    cheaper = dict(PINNED_BLOCK_BWD, rerun=PINNED_BLOCK_BWD["recompute"] * 0.9)
    graph = pin_block_times(prep.graph, blocks, bwd=cheaper)
    return dataclasses.replace(prep, graph=graph, solved=[], grouped=None), blocks


def test_the_solver_takes_rerun_where_it_is_the_fastest_choice():
    """GPT-2 with its blocks' times as data: ``rerun`` costs less than ``recompute`` in the
    backward (what the CPU measures: no graph built and no saved-tensor hooks in the first
    forward). At the peak of the plan that reruns every block, the solver's plan recomputes no
    block with ``recompute`` (each rerun instead, or kept where memory allows: GPT-2's last
    block, whose activations fit beside the loss), is at least as fast as that plan, and runs
    with eager PyTorch's gradients within its budget."""
    model, args, kwargs, loss_fn = HF["gpt2"](**SIZES["gpt2"])
    ref = _step(model, model, args, kwargs, loss_fn)
    prep, blocks = _pinned_rerun_cheaper(model, args, kwargs, loss_fn)
    graph = prep.graph
    every = plan_checkpoint_groups(graph, [], dict.fromkeys(blocks, RERUN))
    pinned = fit(model, args, prep.plain_peak, loss_fn=loss_fn, sample_kwargs=kwargs,
                 prepared=prep, plan=every, measure=False)
    budget = pinned.memory_report().predicted_peak_bytes
    every_time = pinned.plan.predicted_time
    del pinned
    solved = fit(model, args, budget, loss_fn=loss_fn, sample_kwargs=kwargs, prepared=prep)
    choices = plan_choices(solved.plan, graph, blocks)
    assert RERUN in choices.values() and "recompute" not in choices.values(), choices
    assert solved.plan.predicted_time <= every_time * (1 + 1e-6)
    _assert_same(ref, _step(solved, model, args, kwargs, loss_fn))
    rep = solved.memory_report()
    assert rep.measured_peak_bytes is not None and rep.measured_peak_bytes <= budget, rep


def test_a_mip_start_highs_returns_as_its_optimum_is_solved_again():
    """The same pinned GPT-2 from every block recomputed as HiGHS's MIP start: HiGHS 1.16
    reports the optimum of its presolved model but hands back the start's point (0.0173
    against 0.0154 reported). The adapter sees the point's objective differ from the reported
    one and solves again without the start: the warm solve's plan is the cold solve's
    optimum, proven."""
    from schedlang.pytorch import planning

    model, args, kwargs, loss_fn = HF["gpt2"](**SIZES["gpt2"])
    prep, blocks = _pinned_rerun_cheaper(model, args, kwargs, loss_fn)
    graph = prep.graph
    budget = planning.priced(plan_checkpoint_groups(graph, [], dict.fromkeys(blocks, RERUN)),
                             prep).predicted_peak
    start = plan_checkpoint_groups(graph, [], dict.fromkeys(blocks, "recompute"))
    extra = planning.solve_extra(prep)
    cold = planning.priced_solve(prep, budget, "highs", 30, "pyomo", extra, None, None)
    warm = planning.priced_solve(prep, budget, "highs", 30, "pyomo", extra, start, None)
    assert cold.meta["status"] == warm.meta["status"] == "optimal"
    assert warm.predicted_time == pytest.approx(cold.predicted_time, rel=1e-9)


def test_rerun_call_replays_the_rng_and_returns_every_argument_gradient():
    """A function of a positional and a keyword tensor, with dropout, returning a dict with a
    non-tensor: the same outputs, gradients and RNG stream as eager (its second run draws
    the numbers its first run drew, and the global stream advances once)."""
    def fn(x, *, w, scale):
        h = torch.nn.functional.dropout(x @ w, 0.5, training=True)
        return {"out": (h * scale).tanh(), "note": "kept"}

    def run(call):
        torch.manual_seed(7)
        x = torch.randn(4, 5, requires_grad=True)
        w = torch.randn(5, 3, requires_grad=True)
        out = call(x, w)
        out["out"].sum().backward()
        return out["out"].detach(), out["note"], x.grad, w.grad, torch.get_rng_state()

    eager = run(lambda x, w: fn(x, w=w, scale=2.0))
    got = run(lambda x, w: rerun_call(fn, (x,), {"w": w, "scale": 2.0}))
    assert got[1] == "kept"
    for a, b in zip(eager[:1] + eager[2:], got[:1] + got[2:]):
        assert torch.equal(a, b)


def test_a_block_on_inputs_that_need_no_gradient_gets_no_rerun_and_its_parameters_train():
    """The node `rerun_call` makes has the block's tensor arguments as its inputs: none needs a
    gradient (a first block on the raw input), so autograd would never run its backward, where
    the block's parameters get theirs. Such a block is not offered the option, and
    `rerun_call` asked anyway runs torch's checkpoint: the parameters get eager's gradients."""
    torch.manual_seed(0)
    chain = torch.nn.Sequential(*(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())
                                  for _ in range(3)))
    x = torch.randn(2, 4)
    assert rerun_blocks(find_blocks(chain, (x,))) == {"1", "2"}
    layer = chain[0][0]
    layer(x).square().sum().backward()
    want = layer.weight.grad.clone()
    layer.weight.grad = None
    rerun_call(layer, (x,), {}).square().sum().backward()
    assert torch.equal(layer.weight.grad, want)


def test_under_ddp_no_block_reruns_nested(tmp_path):
    """DDP with ``find_unused_parameters=True`` (what transformers' Trainer often sets) fails
    on a nested backward ("marked as ready twice"): under a process group, `prepare` offers no
    ``rerun``, and a plan fitted before the group came up runs torch's checkpoint instead, with
    eager's gradients."""
    import copy
    import socket

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    model, args, kwargs, loss_fn = HF["gpt2"](**SIZES["gpt2"])
    eager = copy.deepcopy(model)
    prep = prepare(model, args, loss_fn=loss_fn, sample_kwargs=kwargs, frontend="blocks",
                   repeats=1)
    reruns = _rerun_layers(prep)
    assert reruns
    plan = plan_checkpoint_groups(prep.graph, [], dict.fromkeys(reruns, RERUN))
    fitted = fit(model, args, prep.plain_peak, loss_fn=loss_fn, sample_kwargs=kwargs,
                 prepared=prep, plan=plan)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1)
    try:
        assert not _rerun_layers(prepare(eager, args, loss_fn=loss_fn, sample_kwargs=kwargs,
                                         frontend="blocks", repeats=1))
        for m in (eager, fitted):
            wrapped = DDP(m, find_unused_parameters=True)  # (alive through the backward)
            torch.manual_seed(7)
            loss_fn(wrapped(*args, **kwargs)).backward()
        for a, b in zip(eager.parameters(), model.parameters()):
            torch.testing.assert_close(b.grad, a.grad, rtol=0, atol=0)
    finally:
        dist.destroy_process_group()
        fitted.unwrap()
