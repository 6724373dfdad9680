"""The hierarchy: op graphs (schedlang.pytorch.opgraph), `trace --ops`, layer options generated
by solving models/layer_options.sched (schedlang.pytorch.options), and their execution.

Generated options must run with the gradients of eager PyTorch (dropout masks included) and a
measured peak within the budget and the prediction's tolerance; adding them never raises the
smallest feasible budget.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
torch.set_num_threads(1)

from torch import nn  # noqa: E402

import schedlang  # noqa: E402
from schedlang.plans.plan import Op, Plan  # noqa: E402
from schedlang.plans.simulate import simulate  # noqa: E402
from schedlang.testing.profiles import with_pinned_op_times  # noqa: E402
from schedlang.testing.steps import assert_same, eager_grads, fit_step  # noqa: E402
from schedlang.testing.torch_models import ALL  # noqa: E402

TOLERANCE = 0.05  # |measured - predicted| / predicted, as for the fixed options


def _tiny_layer():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 16)), torch.randn(8, 16)


def test_record_ops_of_a_tiny_layer():
    from schedlang.pytorch.opgraph import record_ops

    layer, x = _tiny_layer()
    og = record_ops(layer, (x,), repeats=1)
    ops = [op for u in og.units for op in u.ops]
    assert "addmm" in " ".join(ops) and "relu" in " ".join(ops)
    assert og.n_ops == len(ops) and len(og.units) <= og.n_ops
    # what autograd saves inside (outer hook, storages once, inputs and parameters left
    # out): the ReLU's output, saved by the ReLU and the second Linear: 8 x 64 floats
    skip = {t.untyped_storage().data_ptr() for t in [x] + list(layer.parameters())}
    seen = {}

    def pack(t):
        seen.setdefault(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x)
    assert og.saved_total == sum(b for k, b in seen.items() if k not in skip) == 8 * 64 * 4
    relu = next(u for u in og.units if "relu" in u.ops)
    assert relu.created == 8 * 64 * 4 and relu.has_backward
    # the ReLU's output is saved for its own backward and for the second Linear's
    assert sum(relu.name in u.saved_from for u in og.units) == 2
    assert og.outputs == [og.units[-1].name]
    # the Checkmate view: checked graph data, forward nodes then backward nodes
    g = og.checkmate("tiny", loss=True)
    kinds = [n.kind for n in g.nodes]
    assert kinds == sorted(kinds, key=lambda k: k == "backward")
    schedlang.load(model="checkmate", graph=g).check()


def test_the_whole_model_op_graph_holds_parameter_gradients_to_the_end():
    """`trace --ops`'s graph counts each trainable parameter's gradient once, from the backward
    of its last reader on (the weight through its transposed view) until the step ends; a
    frozen parameter has none."""
    from schedlang.plans.planners.no_recompute import no_recompute_plan
    from schedlang.pytorch.opgraph import PARAM_GRADS_END, record_ops

    layer, x = _tiny_layer()
    layer[0].weight.requires_grad_(False)
    trainable = sum(p.numel() * p.element_size() for p in layer.parameters() if p.requires_grad)
    og = record_ops(layer, (x,), repeats=1)
    with_grads = [u for u in og.units if u.param_grad_bytes]
    assert sum(u.param_grad_bytes for u in og.units) == trainable
    assert [u.param_grad_bytes for u in with_grads] == [4 * 64, 4 * (64 * 16 + 16)]
    assert all("addmm" in u.ops for u in with_grads)
    plain = og.checkmate("mlp", loss=True)
    g = og.checkmate("mlp", loss=True, param_grads=True)
    assert g.nodes[-1].name == PARAM_GRADS_END
    assert {a for a, b in g.edges if b == PARAM_GRADS_END} == {f"pg.{u.name}" for u in with_grads}
    before, after = (simulate(no_recompute_plan(h), h) for h in (plain, g))
    assert before.valid and after.valid
    assert after.peak_bytes >= trainable + before.peak_bytes - max(n.size for n in plain.nodes)
    g.budgets = {"peak": after.peak_bytes}  # the solver's plan holds them too: no recompute
    res = schedlang.load(model="checkmate", graph=g).solve(time_limit=60)
    assert res.status.has_solution and res.simulated.valid
    assert res.simulated.peak_bytes <= after.peak_bytes
    assert res.objective == pytest.approx(after.time, rel=1e-6)


def test_trace_ops_writes_checkmate_data_that_solves_and_replays(tmp_path, capsys):
    from schedlang.pytorch.trace import main

    factory = tmp_path / "factory.py"
    factory.write_text("import torch\nfrom torch import nn\n"
                       "def make():\n    torch.manual_seed(0)\n"
                       "    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64),"
                       " nn.ReLU(), nn.Linear(64, 8)), (torch.randn(256, 32),)\n")
    out = tmp_path / "ops.sched"
    assert main([f"{factory}:make", "--ops", "--repeats", "1", "-o", str(out)]) == 0
    text = out.read_text()
    assert "use checkmate" in text and "schedlang.pytorch resident_bytes" in text
    assert text.count("node pg.") == 3  # the three Linear layers' parameter gradients
    assert "aten ops" in capsys.readouterr().out
    prob = schedlang.load(str(out), budget="90%")
    res = prob.solve(time_limit=60)
    assert res.status.has_solution
    assert res.simulated.valid and res.simulated.peak_bytes <= prob.budgets["peak"]
    replay = simulate(res.plan, prob.graph, budget=prob.budgets["peak"])
    assert replay.valid and abs(replay.time - res.objective) <= 1e-9 + 1e-6 * res.objective


def test_layer_options_formulation_on_a_layer():
    """Above what autograd saves the cut costs nothing (everything kept); below, the solution
    respects the budget on the phantom plus the largest round; far below, no cut fits."""
    from schedlang.plans.decoders.segments import segments_of
    from schedlang.pytorch.opgraph import record_ops

    model, (idx,), _ = ALL["gpt"](batch=2, context=16, layers=1)
    block = model.blocks[0]
    og = record_ops(block, (torch.randn(2, 16, 32),), repeats=1)
    g = og.checkmate("block", loss=False)
    order = [u.name for u in og.units]

    def solve(budget):
        g.budgets = {"peak": budget}
        prob = schedlang.load(model="layer_options", graph=g)
        res = prob.solve(time_limit=60)
        return res, (segments_of(prob.program, prob.ir, res.solution)
                     if res.status.has_solution else None)

    res, spans = solve(og.saved_total + 4096)
    assert res.objective == pytest.approx(0, abs=1e-6) and all(not c for _, _, c in spans)
    for frac in (0.8, 0.7, 0.6):
        res, spans = solve(int(og.saved_total * frac))
        if res.status.has_solution:
            break
    assert res.status.has_solution and any(c for _, _, c in spans)
    covered = sorted(k for a, b, _ in spans for k in range(order.index(a), order.index(b) + 1))
    assert covered == list(range(len(order)))
    assert not solve(1024)[0].status.has_solution


def test_a_round_does_not_rerun_what_it_only_passes_on():
    """Dropping an activation saved only for its reader's backward costs the op that makes it,
    not the ops after it in the segment whose outputs only pass on: torch's checkpoint stops
    recomputing once it has every tensor the segment saved. Linear -> GELU -> Linear with a
    phantom budget for one of the two hidden activations: the cheapest option recomputes one
    op (the first matmul, whose output only the GELU's backward saves, or the GELU), never
    both; nothing cheaper than one of them drops a hidden activation."""
    from schedlang.pytorch.opgraph import record_ops

    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16))
    og = record_ops(mlp, (torch.randn(8, 16),), repeats=2)
    g = og.checkmate("mlp", loss=False)
    time_of = {n.name: n.time for n in g.nodes}
    gelu = next(u for u in og.units if "gelu" in u.ops)
    (first,) = gelu.reads
    t_gelu, t_first = time_of[gelu.name], time_of[first]
    hidden = 8 * 64 * 4
    assert og.saved_total == 2 * hidden
    g.budgets = {"peak": 4 * hidden, "save": hidden + hidden // 2}  # one of the two
    res = schedlang.load(model="layer_options", graph=g).solve(time_limit=60)
    assert res.status.has_solution
    assert res.objective >= min(t_gelu, t_first) * (1 - 1e-6)
    assert res.objective <= max(t_gelu, t_first) * (1 + 1e-6) + 1e-9


def test_option_generation_is_changed_in_sched_text(tmp_path):
    """A user's file over layer_options.sched (no Python) changes the generated cuts, at both
    levels: the segments and the pieces of a checkpointed segment (solved with the same
    model on the segment's units)."""
    from schedlang.pytorch.opgraph import record_ops
    from schedlang.pytorch.options import solve_spans

    mine = tmp_path / "short_rounds.sched"
    mine.write_text("use layer_options\n"
                    "constraint short_rounds[(i, j) in SEG where card({v in F where v >= i and "
                    "v <= j}) > 4]: XC[i, j] == 0\n")
    model, (idx,), _ = ALL["gpt"](batch=2, context=16, layers=1)
    og = record_ops(model.blocks[0], (torch.randn(2, 16, 32),), repeats=1)
    order = [u.name for u in og.units]
    for u in og.units:  # equal times: the cuts depend on the structure, not on timing noise
        u.fwd_time = u.bwd_time = 1e-3
    fractions = (0.9, 0.7)

    def longest_round(spans):
        return max((order.index(s[1]) - order.index(s[0]) + 1 for s in spans if s[2]),
                   default=0)

    shipped = solve_spans(og, fractions=fractions)
    assert any(longest_round(spans) > 4 for spans in shipped)
    assert any(len(s) > 3 for spans in shipped for s in spans)  # pieces
    found = solve_spans(og, model=str(mine), fractions=fractions)
    assert found
    for spans in found:
        assert longest_round(spans) <= 4, spans


def _gpt():
    return ALL["gpt"](batch=4, context=32, dim=32, heads=4, layers=2, vocab=64)


def test_generated_options_fit_within_budget_and_execute_like_eager():
    """One generation of the op-level options (the op-level solves are most of the time;
    the two checks below each took minutes with their own), then:

    - plans that run every block with one generated option (kept and checkpointed
      segments, nested or not, dropout inside): gradients and the RNG stream equal eager
      PyTorch, and the measured peak equals the simulated one within the tolerance;
    - `fit` at budgets down to those only generated options reach: gradients equal eager,
      the measured peak within the budget and the prediction's tolerance."""
    from schedlang.pytorch.fit import prepare

    model, inputs, loss_fn = _gpt()
    ref = eager_grads(model, inputs, loss_fn)
    # two budgets of the series, not the default fourteen: still several options per block
    # (kept and checkpointed segments, nested or not), in 10 s of solves instead of 80
    prep = prepare(model, inputs, loss_fn=loss_fn, repeats=1,
                   op_options={"repeats": 1, "fractions": (0.6, 0.3)})
    _each_generated_option_runs_like_eager(model, inputs, loss_fn, ref, prep)
    _fit_with_generated_options_within_budget(model, inputs, loss_fn, ref, prep)


def _each_generated_option_runs_like_eager(model, inputs, loss_fn, ref, prep):
    from schedlang.pytorch.fit import fit

    gen = {lay.name: [o.name for o in lay.options if o.name.startswith("ops")]
           for lay in prep.graph.layers}
    assert gen["blocks.0"] and gen["blocks.1"], gen
    # which options survive the Pareto filter depends on measured times: nested ones (two
    # levels of recomputation) are checked deterministically in
    # test_a_nested_option_gives_eager_gradients
    for k in range(len(gen["blocks.0"])):
        def pick(name, k=k):
            return gen[name][min(k, len(gen[name]) - 1)] if gen[name] else "autograd"

        ops = [Op("compute", node=f"{lay.name}.fwd", option=pick(lay.name))
               for lay in prep.graph.layers]
        ops.append(Op("compute", node="loss"))
        ops += [Op("compute", node=f"{lay.name}.bwd", option=pick(lay.name))
                for lay in reversed(prep.graph.layers)]
        plan = Plan(prep.graph.name, ops)
        fm = fit(model, inputs, None, loss_fn=loss_fn, prepared=prep, plan=plan,
                 calibrate=False)
        assert_same(ref, fit_step(fm, model, inputs, loss_fn), exact=False)
        rep = fm.memory_report()
        assert abs(rep.measured_peak_bytes - rep.predicted_peak_bytes) <= \
            TOLERANCE * rep.predicted_peak_bytes, (pick("blocks.0"), rep)
        assert fm.plan_executor.last_stats["pinned"] == 0


def _fit_with_generated_options_within_budget(model, inputs, loss_fn, ref, prep):
    from schedlang.pytorch.fit import FitError, fit

    ran = 0
    for pct in (75, 65, 55):
        try:
            fm = fit(model, inputs, f"{pct}%", loss_fn=loss_fn, prepared=prep, calibrate=False)
        except FitError:
            continue
        assert_same(ref, fit_step(fm, model, inputs, loss_fn), exact=False)
        rep = fm.memory_report()
        assert rep.measured_peak_bytes <= rep.budget_bytes
        assert abs(rep.measured_peak_bytes - rep.predicted_peak_bytes) <= \
            TOLERANCE * rep.predicted_peak_bytes
        ran += 1
    assert ran >= 2


def test_identical_layers_are_solved_once(monkeypatch):
    """Equal blocks share one op graph and one series of solves, and a second profile of the
    same model solves nothing (the cache is keyed by the layer's structure)."""
    from schedlang.pytorch import options
    from schedlang.pytorch.frontends.fx.partition import partition
    from schedlang.pytorch.profile import profile

    model, inputs, _ = _gpt()
    calls = []
    real = options.solve_spans
    monkeypatch.setattr(options, "solve_spans", lambda *a, **k: calls.append(1) or real(*a, **k))
    options.CACHE.clear()
    part = partition(model, inputs)
    # two budgets of the series: what is counted is the solves, not the cuts they find
    few = (0.6, 0.3)
    options.add_generated_options(profile(part, repeats=1), repeats=1, fractions=few)
    blocks = [lay.name for lay in part.layers if lay.name.startswith("blocks.")]
    solved = len(calls)
    assert solved < len(part.layers) and solved >= 1
    assert set(part.op_options) >= set(blocks)
    options.add_generated_options(profile(partition(model, inputs), repeats=1), repeats=1,
                                  fractions=few)
    assert len(calls) == solved


@pytest.mark.slow
@pytest.mark.parametrize("name,sizes", [
    ("gpt", dict(batch=4, context=32, dim=32, heads=4, layers=3, vocab=64)),
    ("unet", dict(batch=2, size=32, base=8)),
])
def test_generated_options_never_raise_the_smallest_budget(name, sizes):
    from schedlang.pytorch.fit import prepare
    from schedlang.pytorch.planning import smallest_feasible

    model, inputs, loss_fn = ALL[name](**sizes)
    fixed = prepare(model, inputs, loss_fn=loss_fn, repeats=1)
    gen = prepare(model, inputs, loss_fn=loss_fn, repeats=1, op_options={"repeats": 1})
    # the same profile of the fixed options on both sides: the generated graph minus its
    # generated options (the two profiles' noise would otherwise decide)
    import copy

    base = copy.copy(gen.graph)
    base.layers = []
    for lay in gen.graph.layers:
        lay = copy.copy(lay)
        lay.options = [o for o in lay.options if not o.name.startswith("ops")]
        base.layers.append(lay)
    kw = {"loss_overhead": gen.loss_overhead, "output_bytes": gen.output_bytes}
    high = gen.plain_peak - gen.resident_bytes + gen.output_bytes + 1024
    lo_fixed = smallest_feasible(base, 0, high, "highs", 60, rel=0.01, max_solves=14, **kw)
    lo_gen = smallest_feasible(gen.graph, 0, high, "highs", 60, rel=0.01, max_solves=14, **kw)
    assert fixed is not None and lo_fixed is not None and lo_gen is not None
    assert lo_gen <= lo_fixed * 1.01 + 1024


def _chain():
    torch.manual_seed(0)
    layer = nn.Sequential(*[m for _ in range(6) for m in (nn.Linear(64, 64), nn.Tanh())])
    return layer, torch.randn(128, 64)


def _measure(layer, x, spans, nested=False):
    from schedlang.pytorch.opgraph import record_ops
    from schedlang.pytorch.options import measure
    from schedlang.pytorch.segmented import SegmentedLayer, segments_of

    og = record_ops(layer, (x,), repeats=1)
    names = [u.name for u in og.units]
    spans = [(names[a], names[b], c) for a, b, c in spans(len(names))]
    run = SegmentedLayer(og, layer, segments_of(og, spans), nested)
    params = list(layer.parameters())
    with torch.no_grad():
        out = layer(x)
    return measure(run, [x], [True], [torch.randn_like(out)], params, params, params, repeats=1)


def test_a_generated_option_frees_what_eager_frees():
    """A checkpointed segment's forward and its recomputation hold each aten value only until
    its last reader, as eager PyTorch does: a 12-op chain run in one checkpointed segment
    needs about two activations of transient memory, not all twelve."""
    layer, x = _chain()
    act = 128 * 64 * 4
    m = _measure(layer, x, lambda n: [(0, n - 1, True)])
    assert m.phantom == 0
    assert m.fwd_overhead <= 2 * act, m
    assert m.bwd_overhead <= 6 * act, m  # one round: the chain's saved values, not two copies


def test_a_generated_option_needs_the_inputs_its_backward_reads():
    """The top level may delete a layer input that the option's backward does not read: a
    first segment kept that saves nothing of the input (tanh saves its output) frees it; a
    checkpointed first segment holds it."""
    torch.manual_seed(0)
    layer, x = nn.Sequential(nn.Tanh(), nn.Linear(64, 64), nn.Tanh()), torch.randn(32, 64)
    kept_first = _measure(layer, x, lambda n: [(0, 0, False), (1, n - 1, True)])
    assert kept_first.needs_in == []
    ckpt_first = _measure(layer, x, lambda n: [(0, 0, True), (1, n - 1, False)])
    assert ckpt_first.needs_in == [0]


def test_a_nested_option_gives_eager_gradients():
    """A layer run nested in one more checkpoint, its segments kept and checkpointed (two
    levels of recomputation, dropout inside): the outputs, the input's and the parameters'
    gradients equal eager PyTorch's, the dropout masks of the recomputations included."""
    from schedlang.pytorch.opgraph import record_ops
    from schedlang.pytorch.segmented import SegmentedLayer, segments_of

    torch.manual_seed(0)
    layer = nn.Sequential(nn.Linear(32, 32), nn.Tanh(), nn.Dropout(0.3), nn.Linear(32, 32),
                          nn.Tanh(), nn.Linear(32, 32))
    x = torch.randn(16, 32)
    og = record_ops(layer, (x,), repeats=1)
    names = [u.name for u in og.units]
    half = len(names) // 2
    spans = [(names[0], names[half - 1], True), (names[half], names[-1], False)]
    run = SegmentedLayer(og, layer, segments_of(og, spans), nested=True)

    from .test_option_pieces import _grads

    for want, got in zip(_grads(layer, x, layer, 1), _grads(layer, x, run, 1)):
        torch.testing.assert_close(got, want)


class _Skip(nn.Module):
    """A decoder stage: two inputs concatenated, then two linear + tanh (a U-Net's `dec1` in
    miniature: its backward reads both inputs, once)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(64, 32), nn.Linear(32, 32)

    def forward(self, x, y):
        return torch.tanh(self.b(torch.tanh(self.a(torch.cat([x, y], dim=1))))),


def _skip_layer(spans):
    """`_Skip` on two 128x32 inputs (an output gradient too), run as `SegmentedLayer` with
    the cut `spans(unit names)`: (layer, inputs, gradients, SegmentedLayer)."""
    from schedlang.pytorch.opgraph import record_ops
    from schedlang.pytorch.segmented import SegmentedLayer, segments_of

    torch.manual_seed(0)
    layer = _Skip()
    xs = [torch.randn(128, 32), torch.randn(128, 32)]
    g = [torch.randn(128, 32)]
    og = record_ops(layer, xs, [True, True], repeats=1)
    names = [u.name for u in og.units]
    return layer, xs, g, SegmentedLayer(og, layer, segments_of(og, spans(og, names)))


def test_a_round_frees_the_layer_inputs_inside_the_backward():
    """A generated option whose first segment (the concatenation and the first linear) is
    recomputed in a round: the backward gives eager gradients; its measured steps free the
    outputs and the output gradient first, then both inputs once the round has taken them, and
    the last step's memory (what the plan's deletes right after leave) is below the backward's
    peak without frees (memory before + created + flat overhead)."""
    from schedlang.pytorch.options import measure, measure_steps

    def spans(og, names):
        first = names.index(next(u.name for u in og.units if "addmm" in u.ops))
        return [(names[0], names[first], True), (names[first + 1], names[-1], False)]

    layer, xs, g, run = _skip_layer(spans)
    assert run.release_points() == {0: 0, 1: 0}

    def grads(fn):
        leaves = [x.clone().requires_grad_(True) for x in xs]
        layer.zero_grad()
        torch.autograd.backward(list(fn(*leaves)), g)
        return [x.grad for x in leaves] + [p.grad.clone() for p in layer.parameters()]

    for want, got in zip(grads(layer), grads(run)):
        torch.testing.assert_close(got, want)
    params = list(layer.parameters())
    m = measure(run, xs, [True, True], g, params, params, params, repeats=1)
    steps = measure_steps(run, xs, [True, True], g, params, params)
    assert len(steps) >= 2
    assert ("gout", 0) not in steps[0][1] and ("out", 0) in steps[0][1]
    last_frees, last_creates = steps[-1][1], steps[-1][2]
    assert {("in", 0), ("in", 1), ("gout", 0)} <= set(last_frees)
    assert {("gin", 0), ("gin", 1), ("params",)} <= set(last_creates)
    act = 128 * 32 * 4
    # the last step: before + its overhead + created - freed (both inputs, the output and its
    # gradient: 4 activations) is below before + created + the flat overhead
    assert steps[-1][0] - 4 * act < m.bwd_overhead, (steps, m)


def test_a_round_drops_the_layer_inputs_after_their_last_reader():
    """A round that recomputes the concatenation of a layer's two inputs and what follows
    (all but the last tanh checkpointed): once its owner gives the inputs up at the round's
    start (as the runtime does), they are freed right after the concatenation, not when the
    recomputation ends (its autograd graph holds the round's own input tensors); gradients
    equal eager PyTorch."""
    import weakref

    from torch.utils._python_dispatch import TorchDispatchMode

    from schedlang.pytorch.tensors import placeholder

    layer, xs, g, run = _skip_layer(lambda og, names: [(names[0], names[-2], True),
                                                        (names[-1], names[-1], False)])
    leaves = [x.clone().requires_grad_(True) for x in xs]
    layer.zero_grad()
    outs = list(run(*leaves))
    storages = [weakref.ref(x.untyped_storage()) for x in leaves]
    seen: list = []

    def on_round(s):
        for x in leaves:
            x.data = placeholder(x)

    class AfterCat(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten.addmm.default and not seen:  # the round's first matmul
                seen.append([r() is not None for r in storages])
            return func(*args, **(kwargs or {}))

    run.on_round = on_round
    with AfterCat():
        torch.autograd.backward(outs, g)
    assert seen == [[False, False]], seen
    got = [x.grad for x in leaves] + [p.grad.clone() for p in layer.parameters()]
    refs = [x.clone().requires_grad_(True) for x in xs]
    layer.zero_grad()
    torch.autograd.backward(list(layer(*refs)), g)
    for want, have in zip([x.grad for x in refs] + [p.grad for p in layer.parameters()], got):
        torch.testing.assert_close(have, want)


def test_in_node_frees_run_as_predicted(monkeypatch):
    """fit with generated options (`op_options=True`) on a small U-Net at a budget the fixed
    options cannot meet: the plan runs a generated option whose backward frees inside the
    node (`bwd_steps`), the gradients equal eager, and the CPU tracker's peak is within the
    budget and within 2% of the prediction. The op graphs' times are pinned: which options
    the generator offers, and so the smallest budget they reach, depend on them."""
    from schedlang.pytorch import options
    from schedlang.pytorch.fit import fit

    monkeypatch.setattr(options, "record_ops", with_pinned_op_times(options.record_ops))

    model, inputs, loss_fn = ALL["unet"]()
    ref = eager_grads(model, inputs, loss_fn)
    # the fixed options reach 57% of plain execution's peak on this model, generated ones 50%;
    # two budgets of the series reach there in half the time of the default fourteen
    fm = fit(model, inputs, "53%", loss_fn=loss_fn, op_options={"fractions": (0.5, 0.2)},
             calibrate=False,
             repeats=1)
    budget = fm.memory_report().budget_bytes
    assert fm.memory_report().extra["generated"]["options"] > 0
    stepped = {(lay.name, o.name) for lay in fm._prep.graph.layers for o in lay.options
               if o.bwd_steps}
    used = {(op.node.rpartition(".")[0], op.option) for op in fm.plan.ops
            if op.op == "compute" and op.node.endswith(".bwd")}
    assert used & stepped, used
    assert_same(ref, fit_step(fm, model, inputs, loss_fn), exact=False)
    rep = fm.memory_report()
    assert rep.measured_peak_bytes <= budget
    assert abs(rep.measured_peak_bytes - rep.predicted_peak_bytes) <= \
        0.02 * rep.predicted_peak_bytes, rep


class _SkipNet(nn.Module):
    """A U-Net's last level in miniature: an encoder conv, a middle conv, a decoder block that
    concatenates both (wide) and runs two (narrow) convolutions, a 1x1 head. The decoder's
    backward frees both its inputs inside the node once its round has rebuilt the
    concatenation; the convolution's backward right after that is the node's peak if an input
    stays alive."""

    def __init__(self, c: int = 8):
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(3, c, 3, padding=1), nn.ReLU())
        self.mid = nn.Sequential(nn.Conv2d(c, c, 3, padding=1), nn.ReLU())
        self.dec = nn.Sequential(nn.Conv2d(2 * c, 2, 3, padding=1), nn.ReLU(),
                                 nn.Conv2d(2, 2, 3, padding=1), nn.ReLU())
        self.head = nn.Conv2d(2, 2, 1)

    def forward(self, x):
        a = self.enc(x)
        return self.head(self.dec(torch.cat([self.mid(a), a], dim=1)))


def test_a_stepped_backward_with_parameters_runs_within_its_steps():
    """Each generated option of a conv block with parameters, run by a plan that deletes the
    block's inputs, outputs and output gradient right after its backward (so that the
    runtime frees them inside the node, `bwd_steps`), and recomputes the encoder later: the
    gradients equal eager PyTorch's, and at every op of the step the CPU tracker's peak is at
    most the simulator's (the parameter gradients appear inside the node; no layer input may
    outlive the round that frees it)."""
    from schedlang.pytorch.fit import fit, prepare

    torch.manual_seed(0)
    model, x = _SkipNet(), torch.randn(2, 3, 32, 32)

    def loss_fn(out):
        return out.pow(2).mean()

    prep = prepare(model, (x,), loss_fn=loss_fn, repeats=1, op_options={"repeats": 1})
    dec = next(lay for lay in prep.graph.layers if lay.name == "dec")
    stepped = [o for o in dec.options if o.name.startswith("ops") and
               any(set(st.frees) & set(dec.inputs) for st in o.bwd_steps)]
    assert stepped, [(o.name, o.bwd_steps) for o in dec.options]
    ref = eager_grads(model, (x,), loss_fn)

    def c(node, option=None):
        return Op("compute", node=node, option=option)

    def d(data):
        return Op("delete", data=data)

    for opt in stepped:
        ops = [c("enc.fwd", "fast_forward"), c("mid.fwd", "fast_forward"),
               c("dec.fwd", opt.name), c("head.fwd", "autograd"), c("loss"),
               c("head.bwd", "autograd"), d("head.out.grad"),
               c("dec.bwd", opt.name), d("mid.out"), d("enc.out"), d("dec.out"),
               d("dec.out.grad"),
               c("enc.fwd", "autograd"), c("mid.fwd", "autograd"), c("mid.bwd", "autograd"),
               d("mid.out"), d("mid.out.grad"), c("enc.bwd", "autograd"), d("enc.out"),
               d("enc.out.grad")]
        plan = Plan(prep.graph.name, ops)
        assert simulate(plan, prep.graph).valid
        fm = fit(model, (x,), None, loss_fn=loss_fn, prepared=prep, plan=plan,
                 calibrate=False)
        fm.record_timeline()
        assert_same(ref, fit_step(fm, model, (x,), loss_fn), exact=False)
        tl = fm.timeline()
        over = [(label, p, m) for label, p, m in
                zip(tl.labels, tl.predicted_peak, tl.measured_peak) if m > p]
        assert not over, (opt.name, opt.bwd_steps, over)
        rep = fm.memory_report()
        assert rep.measured_peak_bytes <= rep.predicted_peak_bytes, (opt.name, rep)


@pytest.mark.slow
def test_fit_reaches_generated_options_on_the_unet():
    """`fit` on the bench's U-Net (issue 14): at 40% of plain execution's peak the fixed
    options have no plan, so fit generates layer options and plans again; no plan fits
    either, and the FitError names a smallest feasible budget below 50% (the fixed options:
    54%). At that budget it fits as named: the probe step measures at most the prediction
    (`dec1`'s stepped backward holds no layer input past its round). At 48% it fits, says so
    in memory_report(), with eager gradients and the measured peak within the budget."""
    from schedlang.pytorch.fit import FitError, fit, prepare

    model, inputs, loss_fn = ALL["unet"](batch=4, size=64, base=8)
    prep = prepare(model, inputs, loss_fn=loss_fn, repeats=1)
    with pytest.raises(FitError, match="generated layer options") as info:
        fit(model, inputs, "40%", loss_fn=loss_fn, prepared=prep)
    import re

    smallest = int(re.search(r"smallest feasible budget found is [^(]+\((\d+) B\)",
                             str(info.value)).group(1))
    assert smallest < 0.5 * prep.plain_peak, (smallest, prep.plain_peak)
    low = fit(model, inputs, smallest, loss_fn=loss_fn, prepared=prep)
    assert all(p["measured"] <= p["predicted"] for p in low._probes), low._probes
    ref = eager_grads(model, inputs, loss_fn)
    fm = fit(model, inputs, "48%", loss_fn=loss_fn, prepared=prep, calibrate=False)
    assert "generated from op-level solves" in str(fm.memory_report())
    assert_same(ref, fit_step(fm, model, inputs, loss_fn), exact=False)
    rep = fm.memory_report()
    assert rep.measured_peak_bytes <= rep.budget_bytes


def test_a_stepped_backward_ends_without_what_it_freed():
    """The end state of a node with a sub-step profile: its outputs, minus the inputs a step
    frees that the plan deletes right after, minus the phantom the backward consumed (a
    profile describes the whole node); an input the plan keeps is counted."""
    from schedlang.plans.simulate import replay
    from schedlang.testing.layered_instances import MiB, chain, opt

    g = chain("stepped1", [2, 4], [[opt("keep", 1, 1, 3, ["out"],
                                        bwd_steps=[(1, ["gin", "out"], ["gout"])])]],
              grad_mib=[8, 4])
    fwd = [Op("compute", node="L1.fwd", option="keep"), Op("compute", node="loss"),
           Op("delete", data="loss")]

    def bwd_peak(deletes):
        ops = fwd + [Op("compute", node="L1.bwd", option="keep")] + [
            Op("delete", data=d) for d in deletes]
        r = replay(Plan("stepped1", ops), g, record=True)
        return r.steps[len(fwd)].peak

    # before the backward: x 2, h1 4, h1.grad 4, phantom 3 (MiB) = 13; it creates x.grad 8.
    # The step: 13 + 1 (its overhead) + 8 - 8 (h1, h1.grad deleted right after) = 14; the end:
    # 13 + 8 - 3 (the phantom consumed) - 8 = 10 (without frees it would be 13 + 8 = 21)
    assert bwd_peak(["h1", "h1.grad"]) == 14 * MiB
    # h1 kept (never deleted): counted in the step (13 + 1 + 8 - 4) and at the end (14)
    assert bwd_peak(["h1.grad"]) == 18 * MiB
