"""Checkpointed groups of blocks on the hook front end: checkpoint_sequential's schedule run
over a model's own blocks, called by the model's own code (`groups.Group`), planned as
`planners.baselines.plan_checkpoint_groups` and chosen by `fit` where faster than every
per-block plan."""
from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from schedlang.plans.planners.baselines import plan_checkpoint_groups  # noqa: E402
from schedlang.plans.simulate import simulate  # noqa: E402
from schedlang.pytorch.fit import fit, prepare  # noqa: E402
from schedlang.pytorch.frontends.blocks.families import group_plans, least_memory_plans  # noqa: E402
from schedlang.pytorch.frontends.blocks.find import BlockError  # noqa: E402
from schedlang.pytorch.frontends.blocks.hooked import PER_BLOCK  # noqa: E402
from schedlang.pytorch.frontends.blocks.plan_reading import GROUP, block_chains, plan_choices, rerun_correction  # noqa: E402
from schedlang.pytorch.planning import frontend_extensions, group_plans_priced, solve_plan  # noqa: E402
from schedlang.solve.solvers import requested_gap  # noqa: E402
from schedlang.testing.hf_models import HF  # noqa: E402
from schedlang.testing.leaks import host_copy  # noqa: E402
from schedlang.testing.profiles import pin_block_times  # noqa: E402

from .test_real_models import _assert_same, _step, make_bn_cnn  # noqa: E402


def _prepared(model, args, kwargs, loss_fn):
    return prepare(model, args, loss_fn=loss_fn, sample_kwargs=kwargs, frontend="blocks",
                   repeats=1)


def _blocks(prep) -> list[str]:
    return [b.name for b in prep.partitioned.found.blocks]


def _run_plan(model, args, kwargs, loss_fn, prep, plan):
    """One step of `plan` through fit's wrappers, and its memory report."""
    fm = fit(model, args, None, loss_fn=loss_fn, prepared=prep, sample_kwargs=kwargs, plan=plan)
    got = _step(fm, model, args, kwargs, loss_fn)
    rep = fm.memory_report()
    fm.unwrap()
    return got, rep


def _saved_state(model) -> dict:
    """The model's parameters and buffers as host copies, to restore after the eager step: a
    copy kept as tensors would be counted by the measured step (every live storage, as on
    CUDA), above the plan's prediction by exactly its bytes."""
    return host_copy(model.state_dict())


def _restore(model, state: dict) -> None:
    model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})


def _within_prediction(rep) -> None:
    """A group plan's measured peak is within its prediction, and not far below it (BART's
    lowest group plan measures 3.8% below: the prediction may be cautious, not wrong)."""
    assert rep.measured_peak_bytes <= rep.predicted_peak_bytes, rep
    assert rep.measured_peak_bytes >= 0.95 * rep.predicted_peak_bytes, rep


def _ran_without_autograd(model, block: str) -> list[bool]:
    """Per forward of `block` from now on, whether it ran without autograd: a group run the
    ``rerun`` way runs its members so (but its last), and hands their outputs on as views
    whose backward is an error (`groups._ReadOutside`); torch's checkpoint runs them with
    autograd."""
    seen: list[bool] = []
    module = model.get_submodule(block)

    def record(m, a, out):
        first = next(t for t in (out if isinstance(out, tuple) else (out,))
                     if isinstance(t, torch.Tensor))
        seen.append(type(first.grad_fn).__name__.startswith("_ReadOutside"))

    module.register_forward_hook(record)
    return seen


@pytest.mark.parametrize("way", ["rerun", "checkpoint"])
def test_a_group_of_gpt2_blocks_runs_checkpoint_sequentials_schedule(way, monkeypatch):
    """The first half of GPT2LMHeadModel's blocks as one group (checkpoint_sequential(2)), run
    the ``rerun`` way (every member offers ``rerun``) or, where a member does not, by torch's
    checkpoint: the gradients and the RNG stream are eager PyTorch's bit for bit (dropout on),
    and the measured peak is the plan's prediction."""
    from schedlang.pytorch.frontends.blocks import hooked

    if way == "checkpoint":
        monkeypatch.setattr(hooked, "rerun_blocks", lambda found: set())
    model, args, kwargs, loss_fn = HF["gpt2"](batch=4, seq=64)
    ref = _step(model, model, args, kwargs, loss_fn)
    prep = _prepared(model, args, kwargs, loss_fn)
    blocks = _blocks(prep)
    assert block_chains(prep.graph, blocks) == [blocks]
    plan = plan_checkpoint_groups(prep.graph, [blocks[:len(blocks) // 2]])
    choices = plan_choices(plan, prep.graph, blocks)
    half = GROUP + "|".join(blocks[:len(blocks) // 2])
    assert [choices[b] for b in blocks] == [half] * (len(blocks) // 2) + \
        ["autograd"] * (len(blocks) - len(blocks) // 2)
    seen = _ran_without_autograd(model, blocks[0])
    got, rep = _run_plan(model, args, kwargs, loss_fn, prep, plan)
    assert seen[-1] is (way == "rerun")
    _assert_same(ref, got)
    assert rep.measured_peak_bytes <= rep.predicted_peak_bytes
    assert rep.measured_peak_bytes >= 0.98 * rep.predicted_peak_bytes
    # and the group keeps less than plain execution
    assert rep.measured_peak_bytes < prep.plain_peak


@pytest.mark.parametrize("name", ["vit", pytest.param("bart", marks=pytest.mark.slow)])
def test_a_group_run_the_rerun_way_measures_torchs_checkpoint_peak(name, monkeypatch):
    """checkpoint_sequential(2)'s schedule run the ``rerun`` way and by torch's checkpoint:
    the same measured peak to the byte, the same gradients. (A saved tensor of the rerun's
    graph is let go of once its node has unpacked it, as the checkpoint does: ViT's group
    measured 256 B more without it, and `fit` at `checkpoint_sequential(2)`'s own peak could
    not take its schedule.)"""
    from schedlang.pytorch.frontends.blocks import hooked

    from .test_checkpoint_peaks import SIZES

    model, args, kwargs, loss_fn = HF[name](**SIZES[name])
    ref = _step(model, model, args, kwargs, loss_fn)
    prep = _prepared(model, args, kwargs, loss_fn)
    reruns = {lay.name for lay in prep.graph.layers if "rerun" in [o.name for o in lay.options]}
    # (ViT's embeddings chain into its first layer; their input needs no gradient: no rerun)
    chain = [b for b in max(block_chains(prep.graph, _blocks(prep)), key=len) if b in reruns]
    plan = plan_checkpoint_groups(prep.graph, [chain[:max(2, len(chain) // 2)]])
    peaks = {}
    for way in ("rerun", "checkpoint"):
        if way == "checkpoint":
            monkeypatch.setattr(hooked, "rerun_blocks", lambda found: set())
        seen = _ran_without_autograd(model, chain[0])
        got, rep = _run_plan(model, args, kwargs, loss_fn, prep, plan)
        assert seen[-1] is (way == "rerun")
        _assert_same(ref, got)
        peaks[way] = rep.measured_peak_bytes
    assert peaks["rerun"] == peaks["checkpoint"], peaks


def test_fit_is_as_fast_as_checkpoint_sequential_at_its_peak():
    """At the budget checkpoint_sequential's schedule needs, fit's plan is predicted at least
    as fast (the group plans are candidates beside the solver's per-block plans), and the step
    measures within the budget with eager PyTorch's gradients."""
    model, args, kwargs, loss_fn = HF["gpt2"](batch=4, seq=64)
    ref = _step(model, model, args, kwargs, loss_fn)
    prep = _prepared(model, args, kwargs, loss_fn)
    blocks = _blocks(prep)
    half = [blocks[:len(blocks) // 2]]
    # checkpoint_sequential(2) itself: that group, every other block plain
    need, seq = next((need, p) for need, p in group_plans_priced(prep)
                     if p.meta["groups"] == half and "then" not in p.meta["planner"])
    budget = need + prep.resident_bytes
    fm = fit(model, args, budget, loss_fn=loss_fn, prepared=prep, sample_kwargs=kwargs)
    assert fm.plan.predicted_time <= seq.predicted_time * (1 + 1e-9)
    got = _step(fm, model, args, kwargs, loss_fn)
    _assert_same(ref, got)
    rep = fm.memory_report()
    assert rep.measured_peak_bytes <= rep.budget_bytes == budget
    fm.unwrap()


def test_groups_reach_below_every_per_block_plan_on_a_chain_of_small_blocks():
    """Single-op blocks save no more than their inputs, so a per-block plan keeps every block's
    input; a group keeps only its first block's: fit's smallest feasible budget falls below the
    per-block plans' (the group plans' least need), the solver reaches it
    (models/extensions/block_groups.sched), and a fit there runs a group."""
    from .test_real_models import _plain

    model, args, kwargs, loss_fn = _plain("dropout_mlp")()
    ref = _step(model, model, args, kwargs, loss_fn)
    prep = _prepared(model, args, kwargs, loss_fn)
    need = min(need for need, _ in group_plans_priced(prep))
    kw = {"loss_overhead": prep.loss_overhead, "output_bytes": prep.output_bytes}
    assert solve_plan(prep.graph, need, extensions=(PER_BLOCK,), **kw) is None
    solved = solve_plan(prep.graph, need, extensions=frontend_extensions(prep), **kw)
    assert solved is not None
    assert any(c.startswith(GROUP) for c in plan_choices(solved, prep.graph,
                                                         _blocks(prep)).values())
    budget = need + prep.resident_bytes
    fm = fit(model, args, budget, loss_fn=loss_fn, prepared=prep, sample_kwargs=kwargs)
    assert any(c.startswith(GROUP) for c in plan_choices(fm.plan, prep.graph,
                                                         _blocks(prep)).values()), fm.plan
    got = _step(fm, model, args, kwargs, loss_fn)
    _assert_same(ref, got)
    assert fm.memory_report().measured_peak_bytes <= budget
    fm.unwrap()


def test_batchnorm_statistics_are_updated_once_in_a_group():
    """A group's recomputation replays BatchNorm forwards: the running statistics end the step
    as in eager PyTorch (updated once), the gradients equal."""
    model, args, kwargs, loss_fn = make_bn_cnn()
    state = _saved_state(model)
    ref = _step(model, model, args, kwargs, loss_fn)
    prep = _prepared(model, args, kwargs, loss_fn)
    blocks = _blocks(prep)
    _restore(model, state)
    plan = plan_checkpoint_groups(prep.graph, [blocks[:2], blocks[2:]])
    assert simulate(plan, prep.graph).valid
    got, rep = _run_plan(model, args, kwargs, loss_fn, prep, plan)
    _assert_same(ref, got)
    _within_prediction(rep)


class _Collecting(nn.Module):
    """Blocks whose outputs the model's own code also keeps (summed at the end)."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), nn.Tanh())
                                    for _ in range(4))

    def forward(self, x):
        outs = []
        for layer in self.layers:
            x = layer(x)
            outs.append(x)
        return torch.stack(outs).sum(0)


def test_blocks_whose_outputs_are_read_elsewhere_form_no_group():
    """A group drops its inner outputs; outputs the model's own code also reads cannot be
    dropped: no chain, no group plan, and a plan that groups them is refused by name."""
    torch.manual_seed(0)
    model = _Collecting()
    x = torch.randn(32, 16)

    def loss_fn(out):
        return out.pow(2).mean()

    prep = _prepared(model, (x,), {}, loss_fn)
    blocks = _blocks(prep)
    assert all(len(c) == 1 for c in block_chains(prep.graph, blocks))
    assert list(group_plans(prep.graph, blocks)) == []
    plan = plan_checkpoint_groups(prep.graph, [blocks[:2]])
    with pytest.raises(BlockError, match="consecutive blocks, each feeding the next alone"):
        plan_choices(plan, prep.graph, blocks)


def test_group_layers_must_be_consecutive():
    model, args, kwargs, loss_fn = make_bn_cnn(depth=3)
    prep = _prepared(model, args, kwargs, loss_fn)
    blocks = _blocks(prep)
    with pytest.raises(ValueError, match="not consecutive"):
        plan_checkpoint_groups(prep.graph, [[blocks[0], blocks[2]]])


def test_a_groups_last_block_is_priced_as_the_checkpoints_early_stop_leaves_it():
    """torch's checkpoint stops recomputing a group once every tensor the backward saved is
    back, so the group's last block holds less in its backward than its option autograd
    measured alone (ViT's layers: 128 B here, 256 B at the bench's size, where fit at
    checkpoint_sequential(2)'s measured peak could not take that schedule and ran one 5%
    slower). Group plans are predicted to the byte of their measured peak, and fit at
    checkpoint_sequential(2)'s measured peak is predicted at least as fast as it."""
    model, args, kwargs, loss_fn = HF["vit"](batch=4, size=64)
    state = _saved_state(model)
    prep = _prepared(model, args, kwargs, loss_fn)
    layers = [b for b in _blocks(prep) if ".layers." in b]
    half = [layers[:len(layers) // 2]]
    for groups in ([layers], half):
        _restore(model, state)
        _, rep = _run_plan(model, args, kwargs, loss_fn, prep,
                           plan_checkpoint_groups(prep.graph, groups))
        assert rep.measured_peak_bytes == rep.predicted_peak_bytes, (groups, rep)
    seq = next(p for _, p in group_plans_priced(prep)
               if p.meta["groups"] == half and "then" not in p.meta["planner"])
    budget = rep.measured_peak_bytes
    _restore(model, state)
    fm = fit(model, args, budget, loss_fn=loss_fn, prepared=prep, sample_kwargs=kwargs)
    assert fm.plan.predicted_time <= seq.predicted_time * (1 + 1e-9)
    _step(fm, model, args, kwargs, loss_fn)
    assert fm.memory_report().measured_peak_bytes <= budget
    fm.unwrap()


@pytest.mark.parametrize("name", ["gpt2", *[pytest.param(n, marks=pytest.mark.slow)
                                            for n in HF if n != "gpt2"]])
def test_every_transformers_model_runs_its_lowest_group_plan(name):
    """The group plan that needs the least memory, on each `transformers` model (keyword
    arguments, rotary embeddings, cross-attention, stages): eager PyTorch's gradients and RNG
    stream bit for bit, measured peak within the prediction."""
    from .test_real_models import HF_SIZES

    model, args, kwargs, loss_fn = HF[name](**HF_SIZES[name])
    state = _saved_state(model)
    ref = _step(model, model, args, kwargs, loss_fn)
    prep = _prepared(model, args, kwargs, loss_fn)
    plans = list(group_plans(prep.graph, _blocks(prep)))
    assert plans, block_chains(prep.graph, _blocks(prep))
    for p in plans:  # fit skips a plan that does not replay: none may be skipped
        assert simulate(p, prep.graph).valid, (p.meta, simulate(p, prep.graph).errors[0])
    plan = min(plans, key=lambda p: simulate(p, prep.graph).peak_bytes)
    _restore(model, state)
    got, rep = _run_plan(model, args, kwargs, loss_fn, prep, plan)
    _assert_same(ref, got)
    _within_prediction(rep)


def test_the_solver_groups_gpt2_blocks_where_only_groups_fit():
    """GPT-2's blocks with their profile pinned as data (`profiles.pin_block_times`: a rerun
    costs one forward; what autograd saves a quarter of a hidden state, so keeping each
    block's input costs more than a group's reruns hold). At the least memory of the group
    family no per-block plan fits (per_block.sched is infeasible); the solve of
    models/extensions/block_groups.sched finds a plan with a group there, as fast as every
    plan of the family that fits or faster (its objective the predicted time), and the plan
    runs under the wrappers with eager PyTorch's gradients and RNG stream (dropout on)."""
    from .test_real_models import HF_SIZES

    model, args, kwargs, loss_fn = HF["gpt2"](**HF_SIZES["gpt2"])
    state = _saved_state(model)
    ref = _step(model, model, args, kwargs, loss_fn)
    prep = _prepared(model, args, kwargs, loss_fn)
    blocks = _blocks(prep)
    size = {d.name: d.size for d in prep.graph.data}
    hidden = max(size[d] for lay in prep.graph.layers if lay.name == blocks[0]
                 for d in lay.inputs)
    pinned = pin_block_times(prep.graph, blocks, overhead=hidden // 4, phantom={
        "autograd": hidden // 4, "selective": hidden // 8, "recompute": 0})
    prep = dataclasses.replace(prep, graph=pinned, solved=[], grouped=None)
    family = group_plans_priced(prep)
    budget = min(need for need, _ in family)
    kw = {"loss_overhead": prep.loss_overhead, "output_bytes": prep.output_bytes}
    assert solve_plan(prep.graph, budget, extensions=(PER_BLOCK,), **kw) is None
    plan = solve_plan(prep.graph, budget, extensions=frontend_extensions(prep), **kw)
    assert any(c.startswith(GROUP) for c in plan_choices(plan, prep.graph, blocks).values())
    predicted = plan.predicted_time + rerun_correction(plan, prep.graph)
    gap = 1 + requested_gap("highs", None)
    assert all(predicted <= p.predicted_time * gap for need, p in family if need <= budget)
    _restore(model, state)
    got, _ = _run_plan(model, args, kwargs, loss_fn, prep, plan)
    _assert_same(ref, got)


@pytest.mark.parametrize("drop_rerun", [False, True])
def test_a_group_of_one_block_is_priced_as_the_option_it_runs_as(drop_rerun):
    """A group's rerun of a block in the backward is what a ``rerun`` block runs inside its
    backward (a group of blocks with that option runs that way), else the recomputation a
    ``recompute`` block runs there: priced alike (`rerun_correction`), the two plans differ
    only by the forwards that keep nothing (`fast_forward` against that option's forward)."""
    model, args, kwargs, loss_fn = HF["gpt2"](batch=4, seq=64)
    prep = _prepared(model, args, kwargs, loss_fn)
    block = _blocks(prep)[1]
    graph = prep.graph
    if drop_rerun:
        graph = dataclasses.replace(graph, layers=[
            dataclasses.replace(lay, options=[o for o in lay.options if o.name != "rerun"])
            for lay in graph.layers])
    layer = next(lay for lay in graph.layers if lay.name == block)
    option = "recompute" if drop_rerun else "rerun"
    assert option in [o.name for o in layer.options]
    group = plan_checkpoint_groups(graph, [[block]])
    alone = plan_checkpoint_groups(graph, [], options={block: option})
    t_group = simulate(group, graph).time + rerun_correction(group, graph)
    t_alone = simulate(alone, graph).time + rerun_correction(alone, graph)
    opt = next(o for o in layer.options if o.name == option)
    assert t_group - t_alone == pytest.approx(layer.fast_forward.fwd_time - opt.fwd_time,
                                              abs=1e-12)


class _Shortcut(nn.Module):
    """A stack whose forward may stop early (`depth`): another path than the recorded run."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(32, 32), nn.Tanh(),
                                                  nn.Linear(32, 32), nn.Tanh())
                                    for _ in range(4))
        self.depth = None

    def forward(self, x):
        for layer in self.layers[:self.depth]:
            x = layer(x)
        return x


def test_a_forward_that_skips_part_of_a_group_is_an_error_and_leaves_autograd_clean():
    torch.manual_seed(0)
    model = _Shortcut()
    x = torch.randn(64, 32)

    def loss_fn(out):
        return out.pow(2).mean()

    ref = _step(model, model, (x,), {}, loss_fn)
    prep = _prepared(model, (x,), {}, loss_fn)
    blocks = _blocks(prep)
    plan = plan_checkpoint_groups(prep.graph, [blocks[:3]])
    fm = fit(model, (x,), None, loss_fn=loss_fn, prepared=prep, plan=plan)
    model.depth = 2
    with pytest.raises(BlockError, match=f"without calling block '{blocks[2]}'"):
        fm(x)
    # the group's checkpoint is closed: no saved-tensor hooks left on autograd's stack, and
    # the next fitted step is eager PyTorch's
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None
    model.depth = None
    _assert_same(ref, _step(fm, model, (x,), {}, loss_fn))
    fm.unwrap()
    _assert_same(ref, _step(model, model, (x,), {}, loss_fn))


def test_t5s_two_chains_get_per_block_plans_in_the_family():
    """T5's encoder and decoder are two chains: a group plan groups one of them and leaves
    the other plain, so the family's least memory is far above per-block checkpointing's. The
    family's low end (`least_memory_plans`) has every block recomputed and every block at its
    least-memory option; both replay, and the least need of the family is per-block
    checkpointing's or lower."""
    from schedlang.testing.hf_architectures import ARCHITECTURES

    model, args, kwargs, loss_fn = ARCHITECTURES["t5"](batch=2, seq=16, layers=2, dim=32)
    prep = _prepared(model, args, kwargs, loss_fn)
    blocks = _blocks(prep)
    assert len(block_chains(prep.graph, blocks)) == 2
    low = list(least_memory_plans(prep.graph, blocks))
    assert low and low[0].meta["planner"] == "every block recomputed"
    assert all(simulate(p, prep.graph).valid for p in low)
    priced = group_plans_priced(prep)
    every = dict(priced[0][1].meta)  # the family starts with its low end
    assert every["planner"] == "every block recomputed" and every["groups"] == []
    groups_only = [need for need, p in priced if p.meta["groups"]]
    assert min(need for need, _ in priced) <= priced[0][0] < min(groups_only)


def test_fit_names_the_least_budget_of_its_heuristic_plans_when_the_solver_finds_none(
        monkeypatch):
    """A solve may find no plan near the least budget in its time (T5 with generated options:
    none in 10 s at per-block checkpointing's peak, cold). Whatever the solver answers, the
    smallest feasible budget `fit` names is at most the least its heuristic plans need, and
    `fit` at that budget runs a plan within it."""
    import re

    from schedlang.pytorch import planning
    from schedlang.pytorch.fit import FitError

    model, args, kwargs, loss_fn = HF["gpt2"](batch=4, seq=32)
    prep = _prepared(model, args, kwargs, loss_fn)
    least = min(need for need, _ in group_plans_priced(prep))
    monkeypatch.setattr(planning, "solve_plan", lambda *a, **k: None)  # a solver that finds none
    with pytest.raises(FitError, match=r"smallest feasible budget found is [^(]*\((\d+) B\) "
                                       r"\(the plan 'every block") as err:
        fit(model, args, prep.resident_bytes + 1, loss_fn=loss_fn, sample_kwargs=kwargs,
            prepared=prep, measure=False, calibrate=False)
    named = int(re.search(r"found is [^(]*\((\d+) B\)", str(err.value)).group(1))
    assert named <= prep.resident_bytes + least
    fm = fit(model, args, named, loss_fn=loss_fn, sample_kwargs=kwargs, prepared=prep,
             measure=False, calibrate=False)
    assert fm.memory_report().predicted_peak_bytes <= named
    fm.unwrap()


def test_the_least_memory_descent_moves_a_chain_together():
    """`least_memory_plans` against brute force on three blocks whose backwards peak level
    (tests/data/level_blocks.sched): no single block's option lowers the peak of every block
    recomputed, all three together do; the family's least peak is the least over all eight
    assignments."""
    import itertools

    import schedlang
    from tests.paths import ROOT

    graph = schedlang.load(ROOT / "tests" / "data" / "level_blocks.sched").graph
    blocks = ["b1", "b2", "b3"]

    def peak(choice):
        sim = simulate(plan_checkpoint_groups(graph, [], choice), graph)
        assert sim.valid, sim.errors
        return sim.peak_bytes

    every = dict.fromkeys(blocks, "recompute")
    assert all(peak({**every, b: "lean"}) >= peak(every) for b in blocks)
    least = min(peak(dict(zip(blocks, c)))
                for c in itertools.product(["recompute", "lean"], repeat=3))
    plans = list(least_memory_plans(graph, blocks))
    assert plans[0].meta["planner"] == "every block recomputed"
    assert min(simulate(p, graph).peak_bytes for p in plans) == least < peak(every)


class _ThriceReader(nn.Module):
    """A block that reads `shared` three times (as cross-attention reads the encoder's
    output for keys and values)."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = (nn.Linear(32, 32) for _ in range(3))

    def forward(self, h, shared):
        return torch.tanh(h + self.a(shared) * self.b(shared) - self.c(shared))


@pytest.mark.parametrize("rerun", [True, False])
def test_a_group_hands_on_each_use_of_a_shared_input_as_eager_adds_them(rerun):
    """Four blocks in one group each read `shared` three times, and other code reads it too:
    twelve uses, whose gradients eager adds to `shared`'s one by one. A group run the
    ``rerun`` way hands each use on by itself (`recompute.USE_SLOTS` per member that reads
    it), so `shared`'s producer gets eager's bits; by torch's checkpoint, the original graph
    does. Dropout-free, so any difference is the order of the sums."""
    from schedlang.pytorch.frontends.blocks.groups import Group

    torch.manual_seed(0)
    enc = nn.Linear(32, 32)
    blocks = [_ThriceReader() for _ in range(4)]
    x, h0 = torch.randn(16, 32), torch.randn(16, 32, requires_grad=True)
    grads = []
    for grouped in (False, True):
        for m in (enc, *blocks):
            m.zero_grad(set_to_none=True)
        group = Group([str(k) for k in range(4)], blocks, rerun=rerun, apart=[(1,)] * 4)
        shared = enc(x)
        h = h0 * 1.0
        for m in blocks:
            h = group.forward(m, m.forward, (h, shared), {}) if grouped else m(h, shared)
        (h.sum() + shared.square().sum()).backward()
        grads.append([p.grad.clone() for m in (enc, *blocks) for p in m.parameters()])
    for got, want in zip(grads[1], grads[0]):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_member_output_read_outside_a_rerun_way_group_is_an_error_in_the_backward():
    """A group run the ``rerun`` way runs its members (but its last) without autograd: code
    that reads a member's output besides the next member (a path the recorded run did not
    take) gets a located error in the backward, not gradients that miss its part; by torch's
    checkpoint, the same step gives eager's gradients."""
    from schedlang.pytorch.frontends.blocks.groups import Group

    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(16, 16), nn.Tanh()) for _ in range(3)]
    h0 = torch.randn(4, 16, requires_grad=True)

    def step(group):
        h, seen = h0 * 1.0, []
        for m in blocks:
            h = group.forward(m, m.forward, (h,), {}) if group else m(h)
            seen.append(h)
        (h.sum() + seen[0].square().sum()).backward()  # reads the first member's output too
        return [p.grad.clone() for m in blocks for p in m.parameters()]

    want = step(None)
    for m in blocks:
        m.zero_grad(set_to_none=True)
    got = step(Group(["0", "1", "2"], blocks, rerun=False))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    with pytest.raises(BlockError, match="block '0' was read outside its checkpointed group"):
        step(Group(["0", "1", "2"], blocks, rerun=True))


def test_a_parameter_every_layer_reads_as_an_argument_keeps_eagers_bits_in_a_group():
    """DeBERTa-v2 hands its relative embeddings (a parameter, not data the recorded run made)
    to every layer as an argument: a group of two layers run the ``rerun`` way hands each
    layer's gradient of it on by itself, as eager adds them (summed inside the group, the
    parameter's gradient was 1 ulp off)."""
    from schedlang.pytorch.fit import prepare
    from schedlang.testing.block_options import assert_same_step, keyword_step
    from schedlang.testing.hf_architectures import ARCHITECTURES

    from .test_architectures import SMALL

    model, args, kwargs, loss_fn = ARCHITECTURES["deberta_v2"](**SMALL)
    ref = keyword_step(model, model, args, kwargs, loss_fn)
    prep = prepare(model, args, loss_fn=loss_fn, sample_kwargs=kwargs, repeats=1,
                   in_context=False)
    blocks = _blocks(prep)
    fm = fit(model, args, None, loss_fn=loss_fn, prepared=prep, sample_kwargs=kwargs,
             plan=plan_checkpoint_groups(prep.graph, [blocks[:2]]))
    seen = _ran_without_autograd(model, blocks[0])
    assert_same_step(keyword_step(fm, model, args, kwargs, loss_fn), ref)
    assert seen[-1]
    fm.unwrap()
