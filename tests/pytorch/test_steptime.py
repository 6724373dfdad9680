"""`fit` times its plan against plain execution before returning (`schedlang/pytorch/steptime.py`)
and `memory_report()` states that measured overhead. No assertion here depends on how fast
anything ran: the stopping rule and the choice of figure run on injected numbers; what is
measured is checked for its shape (a figure per plan, the rounds within their bounds, state
left as it was, the report saying where its figure comes from)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from schedlang.language.errors import SchedError  # noqa: E402
from schedlang.plans.plan import Plan  # noqa: E402
from schedlang.pytorch import steptime  # noqa: E402
from schedlang.pytorch.fit import fit  # noqa: E402
from schedlang.pytorch.report import MemoryReport  # noqa: E402
from schedlang.pytorch.steptime import TimedOverhead, median_error, overhead_of, time_overhead, time_until_precise  # noqa: E402


def _taking(values):
    """A `take_round` appending the next of `values` to the samples it returns."""
    samples: list[float] = []
    it = iter(values)
    return (lambda: samples.append(next(it))), samples


def test_rounds_stop_once_the_median_is_precise():
    take, samples = _taking([1.25] * 100)
    time_until_precise(take, samples, min_rounds=7, max_rounds=41, precision=0.005)
    assert len(samples) == 7  # no spread: the fewest rounds


def test_a_spread_measurement_is_timed_again_up_to_the_cap():
    spread = [1.0 + 0.1 * (k % 5) for k in range(100)]  # a MAD of 0.1: an error above 0.5%
    take, samples = _taking(spread)
    time_until_precise(take, samples, min_rounds=7, max_rounds=41, precision=0.005)
    assert len(samples) == 41
    take, samples = _taking([1.25 + 0.01 * (k % 3 - 1) for k in range(100)])
    time_until_precise(take, samples, min_rounds=7, max_rounds=41, precision=0.005)
    assert 7 < len(samples) < 41  # a small spread: a few more rounds, then precise


def test_past_the_deadline_the_rounds_stop_at_the_fewest():
    take, samples = _taking([1.0 + 0.1 * (k % 5) for k in range(100)])
    time_until_precise(take, samples, min_rounds=7, max_rounds=41, precision=0.005,
                       deadline=0.0)  # long past: a large model's steps took the time
    assert len(samples) == 7


def test_the_median_error_is_robust_to_an_outlier():
    assert median_error([1.0, 1.0]) == float("inf")
    assert median_error([1.0] * 9) == 0.0
    assert median_error([1.0] * 8 + [50.0]) == 0.0  # one step the load slowed moves nothing
    # normal-looking samples: 1.2533 * 1.4826 * MAD / sqrt(n)
    assert median_error([0.9, 1.0, 1.1, 1.0]) == pytest.approx(1.2533 * 1.4826 * 0.05 / 2)


def _plan() -> Plan:
    return Plan(graph="g", ops=[])


def test_the_overhead_stated_is_the_timed_one_for_the_timed_plan():
    plan, later = _plan(), _plan()
    timed = TimedOverhead(plan, measured=0.24, modelled=0.30, rounds=9, error=0.001)
    assert overhead_of(plan, 0.30, timed) == (0.24, "timed")
    assert overhead_of(later, 0.40, timed) == (0.40, "modelled")  # says nothing of another
    assert overhead_of(later, 0.40, None) == (0.40, "modelled")
    assert overhead_of(None, 0.0, timed) == (0.0, "modelled")  # plain execution


def test_noise_never_makes_a_recomputing_plan_faster_than_plain_execution():
    plan = _plan()
    noise = TimedOverhead(plan, measured=-0.01, modelled=0.05, rounds=41, error=0.01)
    assert overhead_of(plan, 0.05, noise) == (0.05, "modelled")
    no_recompute = TimedOverhead(plan, measured=-0.01, modelled=0.0, rounds=41, error=0.01)
    assert overhead_of(plan, 0.0, no_recompute) == (-0.01, "timed")  # offloading only, say


def _report(source, timed) -> str:
    return str(MemoryReport(100, 90, 95, 200, 10, 0.25, False, overhead_source=source,
                            modelled_time_overhead=0.3, timed=timed))


def test_the_report_says_where_its_overhead_comes_from():
    t = {"measured": 0.25, "modelled": 0.3, "rounds": 11, "error": 0.004, "settled": True}
    assert "timed by fit: median of 11 steps" in _report("timed", {**t, "this_plan": True})
    assert "+30.0%" in _report("timed", {**t, "this_plan": True})  # the model's, beside it
    assert "fit timed an earlier plan at +25.0%" in _report("modelled", {**t, "this_plan": False})
    assert "predicted by the time model" in _report("modelled", None)


class _Chain(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(32, 256), nn.GELU(),
                                                  nn.Dropout(0.1), nn.Linear(256, 32))
                                    for _ in range(4))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


def _fitted(frontend="blocks", **kw):
    torch.manual_seed(0)
    model = _Chain()
    x = torch.randn(64, 32, requires_grad=True)
    if frontend == "blocks":
        kw["layers"] = [f"blocks.{k}" for k in range(4)]
    fm = fit(model, x, "75%", frontend=frontend, repeats=1, probe=False, **kw)
    return model, x, fm


@pytest.mark.parametrize("frontend", ["blocks", "fx"])
def test_fit_times_its_plan_and_the_report_states_it(frontend):
    model, x, fm = _fitted(frontend, time_plan=True)
    assert fm.plan is not None and fm.frontend == frontend, "the budget should need a plan"
    rep = fm.memory_report()
    assert rep.overhead_source in ("timed", "modelled")  # modelled: noise hid the overhead
    assert steptime.MIN_ROUNDS <= rep.timed["rounds"] <= steptime.MAX_ROUNDS
    assert rep.timed["this_plan"] and rep.modelled_time_overhead == fm.modelled_overhead()
    if rep.overhead_source == "timed":
        assert rep.plan_time_overhead == rep.timed["measured"]
        assert "timed by fit" in str(rep)
    # never faster than plain execution for a plan the model says recomputes
    assert rep.plan_time_overhead >= 0 or rep.modelled_time_overhead <= 0
    assert x.grad is None and all(p.grad is None for p in model.parameters())
    fm.unwrap()


def test_timing_leaves_gradients_and_the_generator_as_they_were():
    model, x, fm = _fitted(time_plan=False)
    assert fm.memory_report().overhead_source == "modelled"
    assert fm.memory_report().timed is None
    sentinel = torch.ones_like(model.blocks[0][0].weight)
    model.blocks[0][0].weight.grad = sentinel
    rng = torch.get_rng_state()
    timed = time_overhead(fm, (x,), {}, None, fm.modelled_overhead(), min_rounds=3,
                          max_rounds=3)
    assert timed is not None and timed.rounds == 3 and timed.plan is fm.plan
    assert model.blocks[0][0].weight.grad is sentinel
    assert all(p.grad is None for p in model.parameters() if p is not model.blocks[0][0].weight)
    assert torch.equal(torch.get_rng_state(), rng) and x.grad is None
    fm.unwrap()


def test_the_environment_turns_the_timing_off(monkeypatch):
    monkeypatch.setenv("SCHEDLANG_TIME_PLAN", "off")
    _, _, fm = _fitted()
    assert fm.memory_report().timed is None
    fm.unwrap()


def test_a_bad_time_plan_is_a_clear_error():
    with pytest.raises(SchedError, match="time_plan must be 'auto', True or False"):
        _fitted(time_plan="sometimes")


def test_a_re_plan_is_timed_when_it_is_made(monkeypatch):
    """The plan `fit` timed is replaced after a step measured over its prediction (here a
    pending excess of 1 KiB, as the optimizer's state makes): the new plan is timed on the
    inputs of the step that made it, before that step runs, and the report states its figure."""
    model, x, fm = _fitted(time_plan=True)
    calls = []

    def recorded(fm_, args, kwargs, *rest, **kw):
        calls.append((fm_.plan, args))
        return time_overhead(fm_, args, kwargs, *rest, **kw)

    monkeypatch.setattr("schedlang.pytorch.fitmodule.time_overhead", recorded)
    predicted = fm.predicted_peak()
    fm._pending = (predicted + 1024, predicted)
    fm(x).sum().backward()
    rep = fm.memory_report()
    assert rep.calibrated["replanned"]
    assert len(calls) == 1 and calls[0][0] is fm.plan and calls[0][1][0] is x
    assert rep.timed["this_plan"], "the re-plan's figure is not the one stated"
    assert steptime.MIN_ROUNDS <= rep.timed["rounds"] <= steptime.MAX_ROUNDS
    fm.unwrap()


def test_plain_execution_out_of_device_memory_leaves_the_model_figure(monkeypatch):
    """Plain execution is what may not fit the device (the reason for the plan): its step
    running out of memory ends the timing, and the report keeps the time model's figure."""
    model, x, fm = _fitted(time_plan=False)

    class OutOfMemory:
        @staticmethod
        def plain(m):
            raise torch.OutOfMemoryError("CUDA out of memory (a test's)")

    monkeypatch.setattr("schedlang.pytorch.steptime.BlockWrappers", OutOfMemory)
    assert time_overhead(fm, (x,), {}, None, fm.modelled_overhead()) is None
    assert all(p.grad is None for p in model.parameters()) and x.grad is None
    fm.time_plan((x,), {}, None)
    assert fm.memory_report().overhead_source == "modelled"
    fm.unwrap()
