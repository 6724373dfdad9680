"""The hook front end's time model (`schedlang/pytorch/frontends/blocks/in_context.py`): medians
that re-time outliers, the times the solver prices taken from whole steps as the wrappers run
them, the thread count stated, and no negative overhead for a plan that recomputes. No
assertion here depends on how fast anything ran: times are injected or pinned, and what is
measured is checked for its shape (every option timed, state left as it was)."""
from __future__ import annotations

import statistics

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from schedlang.plans.planners.no_recompute import no_recompute_plan  # noqa: E402
from schedlang.plans.simulate import simulate  # noqa: E402
from schedlang.pytorch import host_malloc  # noqa: E402
from schedlang.pytorch.fit import fit, prepare  # noqa: E402
from schedlang.pytorch.frontends.blocks import in_context  # noqa: E402
from schedlang.pytorch.frontends.blocks.in_context import (  # noqa: E402
    ContextTimes,
    all_settled,
    configurations,
    glue_times,
    sample_until_settled,
    settled,
)
from schedlang.pytorch.planning import FitError, group_plans_priced, priced  # noqa: E402
from schedlang.testing.hf_models import HF  # noqa: E402


def _rounds_from(series: dict):
    """A `take_round` that appends the next injected timing of each key, and the samples."""
    samples: dict = {k: [] for k in series}
    its = {k: iter(v) for k, v in series.items()}

    def take_round():
        for k, it in its.items():
            samples[k].append(next(it))
    return take_round, samples


def test_an_outlier_is_outvoted_by_the_median():
    take, samples = _rounds_from({"a": [1.0, 1.01, 9.0, 0.99, 1.0, 1.0]})
    n = sample_until_settled(take, samples, min_rounds=5, max_rounds=9)
    assert n == 5  # four of five agree within 5%: settled, no more rounds taken
    assert statistics.median(samples["a"]) == 1.0


def test_a_spread_sample_is_timed_again_until_settled():
    series = [1.0, 2.0, 1.5, 0.5, 3.0] + [1.0] * 10
    take, samples = _rounds_from({"a": series, "b": [2.0] * 15})
    n = sample_until_settled(take, samples, min_rounds=5, max_rounds=15)
    assert 5 < n < 15  # re-timed, and stopped once the new samples settled the median
    assert statistics.median(samples["a"]) == 1.0 and len(samples["b"]) == n


def test_re_timing_stops_at_the_limit_and_keeps_every_sample():
    series = [float(k % 4 + 1) for k in range(20)]  # never settles
    take, samples = _rounds_from({"a": series})
    n = sample_until_settled(take, samples, min_rounds=3, max_rounds=7)
    assert n == 7 and samples["a"] == series[:7]


def test_the_glue_is_judged_against_the_whole_step():
    """The glue's time is a difference of totals, kept as a share of the step: a spread small
    beside the step counts as settled, though large beside the glue itself."""
    glue = (0, "glue", "fwd")
    samples = {glue: [0.02, 0.04, 0.03]}
    assert all_settled(samples, 0.05, of_step={glue})
    assert not all_settled(samples, 0.05)  # judged on its own, the glue is spread


def test_settled_needs_three_samples_and_a_small_deviation():
    assert not settled([1.0, 1.0])
    assert settled([1.0, 1.0, 1.02])
    assert not settled([1.0, 1.2, 0.8, 1.0, 1.3], tol=0.03)


def test_configurations_run_each_blocks_option_k_and_autograd_where_it_has_none():
    got = configurations({"a": ["autograd", "recompute", "selective"],
                          "b": ["autograd", "recompute"], "c": []})
    assert got == [{"a": "autograd", "b": "autograd", "c": "autograd"},
                   {"a": "recompute", "b": "recompute", "c": "autograd"},
                   {"a": "selective", "b": "autograd", "c": "autograd"}]


def test_glue_gets_the_measured_totals_shared_in_proportion():
    times = ContextTimes({}, glue_fwd=0.004, glue_bwd=0.003, threads=1, rounds=5,
                         plain_step=0.05)
    got = glue_times({"g0": (0.001, True), "g1": (0.003, True), "g2": (0.0, False)}, times)
    assert got["g0"] == pytest.approx((0.001, 0.00075))
    assert got["g1"] == pytest.approx((0.003, 0.00225))
    assert got["g2"] == (0.0, 0.0)  # no backward
    assert glue_times({"g0": (0.001, True)}, None) == {"g0": (0.001, 0.002)}  # recorded


# --- the times the solver prices (pinned in-context data) -----------------------------------

#: pinned in-context medians of a block, seconds: recompute and selective *faster* than
#: autograd, as noise on a loaded machine can make them look
PINNED = {"autograd": (0.002, 0.004), "recompute": (0.0015, 0.003), "selective": (0.0018, 0.0035)}


@pytest.fixture
def pinned_times(monkeypatch):
    """`time_in_context` answers PINNED for every block (and a pinned glue), as if measured."""
    def fake(found, wrappers, options, args, kwargs, **_):
        return ContextTimes({b: {o: PINNED[o] for o in opts if o in PINNED}
                             for b, opts in options.items()},
                            glue_fwd=0.001, glue_bwd=0.002, threads=torch.get_num_threads(),
                            rounds=7, plain_step=0.03)
    monkeypatch.setattr(in_context, "time_in_context", fake)


def _llama_prep():
    model, args, kwargs, loss_fn = HF["llama"]()
    return model, args, kwargs, loss_fn, prepare(model, args, loss_fn=loss_fn,
                                                 sample_kwargs=kwargs, frontend="blocks",
                                                 repeats=1)


def test_block_options_are_priced_at_what_was_measured_in_context(pinned_times):
    *_, prep = _llama_prep()
    blocks = {b.name for b in prep.partitioned.found.blocks}
    for lay in prep.graph.layers:
        opts = {o.name: o for o in lay.options}
        if lay.name not in blocks:  # glue: the pinned totals, shared out
            continue
        assert (opts["autograd"].fwd_time, opts["autograd"].bwd_time) == PINNED["autograd"]
        assert lay.fast_forward.fwd_time == PINNED["recompute"][0]
        for name in ("recompute", "selective"):
            if name in opts:  # never below what autograd runs (the measured times are)
                o = opts[name]
                assert o.fwd_time == PINNED[name][0]
                assert o.fwd_time + o.bwd_time >= sum(PINNED["autograd"]) - 1e-12
    glue = [lay for lay in prep.graph.layers if lay.name not in blocks]
    assert sum(lay.options[0].fwd_time for lay in glue) == pytest.approx(0.001, rel=1e-3)
    assert sum(lay.options[0].bwd_time for lay in glue) == pytest.approx(0.002, rel=1e-3)
    assert prep.timing == {"threads": torch.get_num_threads(), "in_context": True, "rounds": 7,
                           "unsettled": 0, "malloc_held": host_malloc.CAN_HOLD}


def test_the_loss_is_priced_at_its_measured_time(pinned_times, monkeypatch):
    """The steps a plan's overhead is a share of run the loss function too: the loss node
    costs what the loss's forward and backward measured (`outputs.measure_loss_time`,
    injected here), not a 1 us placeholder that made every predicted overhead a share of a
    step without it."""
    monkeypatch.setattr("schedlang.pytorch.prepare.measure_loss_time", lambda *a, **k: 0.005)
    *_, prep = _llama_prep()
    assert prep.graph.loss.time == 0.005
    blocks = len(prep.partitioned.found.blocks)
    assert prep.plain_time == pytest.approx(blocks * sum(PINNED["autograd"]) + 0.003 + 0.005,
                                            rel=1e-4)  # (the glue shares, rounded)
    assert simulate(no_recompute_plan(prep.graph), prep.graph).time == \
        pytest.approx(prep.plain_time)


def test_no_plan_that_recomputes_predicts_a_negative_overhead(pinned_times):
    """Every plan fit may take (the solver's at budgets down the range, every group plan)
    costs at least plain execution, with recomputation priced below autograd by the
    measurement."""
    model, args, kwargs, loss_fn, prep = _llama_prep()
    # a plan as fast as plain execution sums its times in another order: equal up to rounding
    plain = simulate(no_recompute_plan(prep.graph), prep.graph).time * (1 - 1e-12)
    for _, plan in group_plans_priced(prep):
        assert plan.predicted_time >= plain
    for share in (0.95, 0.85, 0.75):
        budget = int(prep.resident_bytes + share * (prep.plain_peak - prep.resident_bytes))
        try:
            fm = fit(model, args, budget, loss_fn=loss_fn, prepared=prep, sample_kwargs=kwargs,
                     probe=False)
        except FitError:  # below every plan's need: nothing to price
            continue
        if fm.plan is not None:
            assert priced(fm.plan, prep).predicted_time >= plain
            assert fm.memory_report().plan_time_overhead >= -1e-12
        fm.unwrap()


# --- the measurement itself: every option timed, nothing left behind ------------------------

def test_fit_states_the_thread_count_it_timed_with():
    model, args, kwargs, loss_fn = HF["llama"]()
    fm = fit(model, args, "80%", loss_fn=loss_fn, sample_kwargs=kwargs, frontend="blocks",
             probe=False, repeats=1)
    rep = fm.memory_report()
    assert rep.extra["timing"]["threads"] == torch.get_num_threads()
    assert rep.extra["timing"]["in_context"] is True
    assert f"{torch.get_num_threads()} intra-op thread" in str(rep)
    # the process's malloc is held steady from the profile on, where it can be (glibc)
    assert rep.extra["timing"]["malloc_held"] is host_malloc.held() is host_malloc.CAN_HOLD
    assert ("keeps freed memory" in str(rep)) is host_malloc.held()
    fm.unwrap()


class _Chain(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(16, 32), nn.GELU(),
                                                  nn.Linear(32, 16)) for _ in range(3))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


def test_every_option_of_every_block_is_timed_in_context_and_state_is_restored():
    """A chain whose first block takes the raw input (no gradient: the full backward hook
    cannot see its end; its parameters' last gradient does), an input that requires a
    gradient elsewhere left untouched: every block gets a forward and a backward time per
    option, and the parameters' and inputs' gradients are what they were."""
    torch.manual_seed(0)
    model = _Chain()
    x = torch.randn(8, 16)
    sentinel = torch.zeros(32, 16)
    model.blocks[0][0].weight.grad = sentinel
    tr_prep = prepare(model, (x,), frontend="blocks", repeats=1,
                      layers=[f"blocks.{k}" for k in range(3)])
    assert tr_prep.timing["in_context"] is True
    assert model.blocks[0][0].weight.grad is sentinel
    assert x.grad is None
    for lay in tr_prep.graph.layers:
        if lay.name.startswith("blocks."):
            assert all(o.fwd_time > 0 and o.bwd_time > 0 for o in lay.options), lay.name


def test_an_input_that_requires_grad_gets_no_gradient_from_the_timing():
    """(A gradient left on it made the next measured step accumulate into it: +32 KiB.)"""
    torch.manual_seed(0)
    model = _Chain()
    x = torch.randn(8, 16, requires_grad=True)
    prepare(model, (x,), frontend="blocks", repeats=1, layers=[f"blocks.{k}" for k in range(3)])
    assert x.grad is None
