"""Generated options whose checkpointed segments are cut into pieces (nested checkpoints,
`schedlang.pytorch.options.SegmentedLayer`): they run with eager PyTorch's gradients (dropout
masks of every recomputation included), hold less in their backward than the same segment
recomputed whole, and a plan using them is measured as it is predicted."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
torch.set_num_threads(1)

from schedlang.plans.plan import Op, Plan  # noqa: E402
from schedlang.testing.profiles import pin_op_times  # noqa: E402
from schedlang.testing.steps import assert_same, eager_grads, fit_step  # noqa: E402
from schedlang.testing.torch_models import ALL  # noqa: E402

TOLERANCE = 0.05  # |measured - predicted| / predicted, as for the fixed options


def _unit(og, op: str, after: int = 0) -> int:
    """Index of the first unit from `after` on whose first aten op is `op`."""
    return next(k for k, u in enumerate(og.units) if k >= after and u.ops[0] == op)


def _attention_pieces(og, whole: bool = False) -> list[tuple]:
    """A GPT block cut as: the attention up to bmm_1 checkpointed, itself cut into a
    checkpointed piece up to the softmax and a kept piece (dropout mask, att @ v); the rest
    kept. `whole`: the same segment without pieces."""
    names = [u.name for u in og.units]
    soft = _unit(og, "_softmax")
    att_v = _unit(og, "bmm", soft)
    spans = [(names[0], names[att_v], True), (names[att_v + 1], names[-1], False)]
    if not whole:
        spans += [(names[0], names[soft], True, 1), (names[soft + 1], names[att_v], False, 1)]
    return spans


def _block(**sizes):
    from schedlang.pytorch.opgraph import record_ops

    model, _, _ = ALL["gpt"](**sizes)
    block = model.blocks[0]
    x = torch.randn(sizes["batch"], sizes["context"], sizes["dim"])
    return model, block, x, record_ops(block, (x,), repeats=1)


def _grads(block, x, fn, seed: int) -> list:
    """Output, input gradient and parameter gradients of `fn` (the block or a cut of it) on
    `x`, the RNG (dropout) seeded with `seed`."""
    torch.manual_seed(seed)
    xi = x.clone().requires_grad_(True)
    block.zero_grad()
    out = fn(xi)
    out = out[0] if isinstance(out, (tuple, list)) else out
    out.pow(2).sum().backward()
    return [out.detach(), xi.grad] + [p.grad.clone() for p in block.parameters()]


@pytest.mark.parametrize("nested", [False, True])
def test_pieces_give_eager_gradients_with_dropout(nested):
    """Three levels of recomputation at most (the layer, the segment, the piece), dropout in
    every one: outputs, input and parameter gradients equal eager PyTorch's exactly."""
    from schedlang.pytorch.segmented import SegmentedLayer, segments_of

    _, block, x, og = _block(batch=2, context=16, dim=32, heads=4, layers=1, vocab=32)
    names = [u.name for u in og.units]
    mlp = _unit(og, "native_layer_norm", 1)  # the second layer norm: the MLP's start
    spans = _attention_pieces(og)[:1] + [
        (names[_unit(og, "bmm", _unit(og, "_softmax")) + 1], names[mlp - 1], False),
        (names[mlp], names[-1], True),
        (names[mlp], names[mlp + 1], True, 1), (names[mlp + 2], names[-1], True, 1)]
    spans += _attention_pieces(og)[2:]
    run = SegmentedLayer(og, block, segments_of(og, spans), nested)
    assert sorted(s[2:] for s in run.spans()) == sorted(s[2:] for s in spans)  # the levels

    for want, got in zip(_grads(block, x, block, 3), _grads(block, x, run, 3)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_pieces_lower_the_backward_peak():
    """The attention's round recomputed in two pieces (the softmax's inputs and internals
    dropped before the dropout mask and att @ v are recomputed) holds less, phantom plus
    backward overhead, than the same segment recomputed whole."""
    from schedlang.pytorch.options import measure
    from schedlang.pytorch.segmented import SegmentedLayer, segments_of

    model, block, x, og = _block(batch=4, context=64, dim=64, heads=4, layers=1, vocab=128)
    params = list(block.parameters())
    with torch.no_grad():
        out = block(x)
    g = [torch.randn_like(out)]
    held = {}
    for whole in (True, False):
        run = SegmentedLayer(og, block, segments_of(og, _attention_pieces(og, whole)))
        m = measure(run, [x], [True], g, params, params, list(model.parameters()), repeats=1)
        held[whole] = m.phantom + m.bwd_overhead
    att = 4 * 4 * 64 * 64 * 4  # one attention matrix
    assert held[False] <= held[True] - att / 2, held


def test_a_plan_with_pieced_options_runs_as_predicted(monkeypatch):
    """Options with pieces (pinned as data instead of solved) are measured, registered and
    run by a plan: gradients equal eager, the measured peak equals the simulated one within
    the tolerance."""
    from schedlang.pytorch import options
    from schedlang.pytorch.fit import fit, prepare

    def pinned(og, *a, **k):  # the blocks get the pieced cut; the other layers nothing
        return [_attention_pieces(og)] if any(u.ops[0] == "_softmax" for u in og.units) else []

    monkeypatch.setattr(options, "solve_spans", pinned)
    options.CACHE.clear()
    model, inputs, loss_fn = ALL["gpt"](batch=4, context=32, dim=32, heads=4, layers=2,
                                        vocab=64)
    ref = eager_grads(model, inputs, loss_fn)
    try:
        prep = prepare(model, inputs, loss_fn=loss_fn, repeats=1, op_options={"repeats": 1})
    finally:
        options.CACHE.clear()
    pieced = {lay: [name for name, run in opts.items() if any(len(s) > 3 for s in run.spans())]
              for lay, opts in prep.partitioned.op_options.items()}
    assert pieced.get("blocks.0") and pieced.get("blocks.1"), pieced
    for k in range(max(len(v) for v in pieced.values())):
        def pick(name, k=k):
            return pieced[name][min(k, len(pieced[name]) - 1)] if pieced.get(name) \
                else "autograd"

        ops = [Op("compute", node=f"{lay.name}.fwd", option=pick(lay.name))
               for lay in prep.graph.layers]
        ops.append(Op("compute", node="loss"))
        ops += [Op("compute", node=f"{lay.name}.bwd", option=pick(lay.name))
                for lay in reversed(prep.graph.layers)]
        fm = fit(model, inputs, None, loss_fn=loss_fn, prepared=prep,
                 plan=Plan(prep.graph.name, ops), calibrate=False)
        assert_same(ref, fit_step(fm, model, inputs, loss_fn), exact=False)
        rep = fm.memory_report()
        assert abs(rep.measured_peak_bytes - rep.predicted_peak_bytes) <= \
            TOLERANCE * rep.predicted_peak_bytes, (pick("blocks.0"), rep)


class _Mix(torch.nn.Module):
    """Readers that save what they read (linear, tanh, relu) and readers that do not (a
    scalar product, an addition): both kinds of boundary of layer_options.sched."""

    def __init__(self):
        super().__init__()
        self.lin1, self.lin2 = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

    def forward(self, x):
        a = torch.tanh(self.lin1(x))
        c = self.lin2(a * 2.0)
        return torch.relu(c + a)


def _segmentations(n: int):
    """Every cover of units 0..n-1 by consecutive segments, each kept or checkpointed."""
    for mask in range(1 << (n - 1)):
        cuts = [0] + [k + 1 for k in range(n - 1) if mask >> k & 1] + [n]
        segs = list(zip(cuts[:-1], [c - 1 for c in cuts[1:]]))
        for kinds in range(1 << len(segs)):
            yield [(a, b, bool(kinds >> k & 1)) for k, (a, b) in enumerate(segs)]


def test_layer_options_matches_brute_force_on_a_tiny_op_graph():
    """At a series of budgets, the solved option's recomputation time is the least over every
    segmentation of a tiny op graph whose peak (as layer_options.sched counts it: the
    phantom, and per checkpointed segment what was saved before it plus its internals; a
    value crossing a cut is held when its reader saves it or is checkpointed) fits; a round
    costs its segment's units up to the last that owns a saved tensor read inside it."""
    import schedlang
    from schedlang.plans.decoders.segments import segments_of
    from schedlang.pytorch.opgraph import record_ops

    torch.manual_seed(0)
    og = record_ops(_Mix(), (torch.randn(32, 16),), repeats=1)
    for k, u in enumerate(og.units):  # distinct times: one least time per budget
        u.fwd_time = u.bwd_time = (k + 1) * 1e-3
    g = og.checkmate("mix", loss=False)
    names = [u.name for u in og.units]
    n = len(names)
    mib = 1 << 20
    size = {u.name: u.created / mib for u in og.units}
    succ: dict = {}
    for a, b in g.edges:
        succ.setdefault(a, []).append(b)
    fe = [(a, b) for a, b in g.edges if not b.startswith("g.")]
    hold = {(a, b) for a, b in fe if "g." + b in succ.get(a, ())}  # b's backward reads a
    saved = {v for v in names if any(w.startswith("g.") for w in succ.get(v, ()))}
    out = {v for v in names if all(w.startswith("g.") for w in succ.get(v, ()))}
    pos = {v: k for k, v in enumerate(names)}

    def internal(a, b):
        return sum(size[names[k]] for k in range(a, b + 1)
                   if names[k] in saved and names[k] not in out)

    def peak_time(segs):
        seg_of = {k: s for s in segs for k in range(s[0], s[1] + 1)}
        keep = set()
        for u, w in fe:
            iu, iw = pos[u], pos[w]
            s = seg_of[iw]
            if (u, w) in hold and any(a > iu and a <= iw for a, _, _ in segs):
                keep.add(u)
            elif (u, w) not in hold and s[2] and s[0] > iu:
                keep.add(u)
        kept = [u for u in keep if u not in out]
        ph = sum(size[u] for u in kept) + sum(internal(a, b) for a, b, c in segs if not c)
        peak = ph
        for a, b, c in segs:
            if c:
                before = sum(size[u] for u in kept if pos[u] < a) + sum(
                    internal(x, y) for x, y, z in segs if not z and y < a)
                peak = max(peak, before + internal(a, b))
        # a round reruns its segment's units up to the last owner of a saved tensor that a
        # forward unit of the segment reads (torch's checkpoint stops there)
        rtime = 0.0
        for a, b, c in segs:
            if not c:
                continue
            ends = [pos[v] for v in names if v in saved and pos[v] <= b
                    and any(not w.startswith("g.") and pos[w] <= b for w in succ.get(v, ()))]
            last = max((e for e in ends if e >= a), default=a - 1)
            rtime += sum(og.units[k].fwd_time for k in range(a, last + 1))
        return peak, rtime

    table = [peak_time(segs) for segs in _segmentations(n)]
    total = og.saved_total
    for frac in (1.2, 0.8, 0.6, 0.45, 0.3):
        g.budgets = {"peak": int(total * frac)}
        limit = (g.budgets["peak"] // 1024) / 1024
        fits = [t for p, t in table if p <= limit + 1e-9]
        prob = schedlang.load(model="layer_options", graph=g)
        res = prob.solve(time_limit=60)
        if not fits:
            assert not res.status.has_solution, frac
            continue
        assert res.status.has_solution, frac
        spans = segments_of(prob.program, prob.ir, res.solution)
        segs = [(pos[a], pos[b], c) for a, b, c in spans]
        p, t = peak_time(segs)
        assert p <= limit + 1e-9 and t == pytest.approx(min(fits), rel=1e-6), (frac, spans)


def _attention_two_levels(og, depth: int = 2) -> list[tuple]:
    """A GPT block cut as: the attention from its layer norm to att @ v checkpointed, in a
    checkpointed piece up to the softmax and a kept piece (dropout mask, att @ v); with
    `depth` 2, the first piece cut again: the layer norm and the qkv projection checkpointed,
    the copies of q, k, v and the scores up to the softmax kept; the rest kept."""
    names = [u.name for u in og.units]
    soft = _unit(og, "_softmax")
    att_v = _unit(og, "bmm", soft)
    qkv = _unit(og, "addmm")
    inner = [(names[0], names[qkv], True, 2), (names[qkv + 1], names[soft], False, 2)]
    return [(names[0], names[att_v], True), (names[att_v + 1], names[-1], False),
            (names[0], names[soft], True, 1)] + (inner if depth == 2 else []) + [
            (names[soft + 1], names[att_v], False, 1)]


def test_normal_spans_keeps_every_level():
    """Pieces at any depth are normalized as the first level is: adjacent kept pieces
    merged, a lone kept piece dropped, pieces of kept ranges dropped; the result runs."""
    from schedlang.pytorch.options import normal_spans
    from schedlang.pytorch.segmented import segments_of

    _, _, _, og = _block(batch=2, context=16, dim=32, heads=4, layers=1, vocab=32)
    names = [u.name for u in og.units]
    spans = _attention_two_levels(og)
    assert normal_spans(og, spans) == spans
    qkv, soft = _unit(og, "addmm"), _unit(og, "_softmax")
    split = [s for s in spans if s[1:] != (names[soft], False, 2)] + [
        (names[qkv + 1], names[qkv + 2], False, 2), (names[qkv + 3], names[soft], False, 2)]
    assert normal_spans(og, split) == spans  # two adjacent kept pieces: one
    alone = [s for s in spans if len(s) < 4 or s[3] < 2] + [(names[0], names[soft], False, 2)]
    assert normal_spans(og, alone) == _attention_two_levels(og, depth=1)  # a lone kept piece
    under_kept = [(s[0], s[1], False, 1) if s[:2] == spans[2][:2] else s for s in spans]
    # a kept piece: its own pieces go (then the first level merges as before)
    assert all(len(s) < 4 or s[3] < 2 for s in normal_spans(og, under_kept))
    assert len(segments_of(og, normal_spans(og, split))) == 2


@pytest.mark.parametrize("nested", [False, True])
def test_two_levels_of_pieces_give_eager_gradients_and_hold_less(nested):
    """The attention's first piece cut once more (the layer norm's output and the qkv
    projection recomputed in a round of their own, after the scores are gone): outputs and
    gradients equal eager PyTorch's exactly, dropout included, and the layer holds less,
    phantom plus backward overhead, than with one level of pieces (the layer norm's output,
    held through the attention's backward with one level, is not)."""
    from schedlang.pytorch.options import measure
    from schedlang.pytorch.segmented import SegmentedLayer, segments_of

    model, block, x, og = _block(batch=4, context=64, dim=64, heads=4, layers=1, vocab=128)
    params = list(block.parameters())

    block.train()
    held = {}
    for depth in (1, 2):
        run = SegmentedLayer(og, block, segments_of(og, _attention_two_levels(og, depth)), nested)
        if depth == 2:
            for want, got in zip(_grads(block, x, block, 5), _grads(block, x, run, 5)):
                torch.testing.assert_close(got, want, rtol=0, atol=0)
        with torch.no_grad():
            out = block(x)
        g = [torch.randn_like(out)]
        m = measure(run, [x], [True], g, params, params, list(model.parameters()), repeats=1)
        held[depth] = m.phantom + m.bwd_overhead
    ln_out = 4 * 64 * 64 * 4  # the layer norm's output
    assert held[2] <= held[1] - ln_out / 2, held


def test_generator_merges_rounds_and_cuts_pieces_twice(monkeypatch):
    """From a solution that recomputes the attention in two rounds (its layer norm alone,
    then the qkv projection up to att @ v: the layer norm's output is a boundary, held from
    the forward through both rounds), the generator also offers the two rounds merged into
    one segment cut into pieces, and those pieces cut again: that option holds less, phantom
    plus backward overhead, than every option built on the solution's own segments with one
    level of pieces, and runs with eager PyTorch's gradients."""
    from schedlang.pytorch import options, segmented

    model, block, x, og = _block(batch=4, context=64, dim=64, heads=4, layers=1, vocab=128)
    pin_op_times(og)  # the piece solves pick the same cuts on every machine, under any load
    names = [u.name for u in og.units]
    att_v = _unit(og, "bmm", _unit(og, "_softmax"))
    top = [(names[0], names[0], True), (names[1], names[att_v], True),
           (names[att_v + 1], names[-1], False)]
    real = options.solve_series
    pinned_calls = []

    def pinned(g, series, *a, **k):  # the layer's own solve gives `top`; pieces are solved
        if len(series) == 2:
            pinned_calls.append(series)
            return [top]
        return real(g, series, *a, **k)

    # the name the generator calls (imported into `options`, not looked up in layer_solves)
    monkeypatch.setattr(options, "solve_series", pinned)
    found = options.solve_spans(og, jobs=1)
    assert pinned_calls, "the layer's own solve was not the pinned one"
    params = list(block.parameters())
    with torch.no_grad():
        g = [torch.randn_like(block(x))]

    def held(spans):
        run = segmented.SegmentedLayer(og, block, segmented.segments_of(og, spans))
        m = options.measure(run, [x], [True], g, params, params, list(model.parameters()),
                            repeats=1)
        return m.phantom + m.bwd_overhead

    own = [s for s in found if [t for t in s if len(t) == 3] == top
           and all(len(t) < 4 or t[3] < 2 for t in s)]
    assert own, found
    best = min(found, key=held)
    assert any(len(t) == 4 and t[3] == 2 for t in best), best
    ln_out = 4 * 64 * 64 * 4  # the layer norm's output
    assert held(best) <= min(held(s) for s in own) - ln_out / 2

    run = segmented.SegmentedLayer(og, block, segmented.segments_of(og, best))
    for want, got in zip(_grads(block, x, block, 7), _grads(block, x, run, 7)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
