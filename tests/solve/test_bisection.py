"""The smallest feasible budget by bisection under one deadline (issue 29): the probes get the
time the command has left, a probe that ran out of time is no proof of infeasibility, and the
answer says when the bisection stopped early. The clock is faked: nothing here depends on how
fast the machine is."""
from __future__ import annotations

import json

import pytest

import schedlang
from schedlang import sweep
from schedlang.cli import main as cli
from schedlang.solve import bisection
from schedlang.solve.bisection import bisect_budget, explain_infeasible
from schedlang.solve.solution import Status

from ..paths import EXAMPLES

CHAIN = str(EXAMPLES / "chain.sched")


class FakeClock:
    """`time.monotonic` for the bisection module: moves only when a probe spends time."""

    def __init__(self, now: float = 1000.0):
        self.now = now

    def monotonic(self) -> float:
        return self.now


def test_a_probe_without_an_answer_stops_the_bisection_and_proves_nothing():
    answers = {1000: True, 500: None}
    asked = []

    def feasible(b):
        asked.append(b)
        return answers.get(b, False)

    found = bisect_budget(feasible, 0, 1000, rel=0.01, min_step=1)
    assert asked == [1000, 500]
    assert found.best == 1000 and found.infeasible == 0  # 500 is neither side
    assert found.stopped and "ran out of time" in found.stopped


def test_a_first_probe_without_an_answer_is_not_another_binding_constraint():
    found = bisect_budget(lambda b: None, 0, 1000)
    assert found.best is None and found.stopped
    found = bisect_budget(lambda b: False, 0, 1000)
    assert found.best is None and found.stopped is None  # a proof: none fits even there


def test_no_probe_starts_after_the_deadline(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(bisection, "time", clock)
    asked = []

    def feasible(b):
        asked.append(b)
        clock.now += 4.0  # each probe takes 4 s
        return b >= 300

    found = bisect_budget(feasible, 0, 1000, rel=0.001, min_step=1, max_steps=20,
                          deadline=clock.now + 10.0)
    assert len(asked) == 3  # at 0, 4 and 8 s; at 12 s the deadline has passed
    assert found.best is not None and found.best >= 300 and found.stopped == "the time limit"
    found = bisect_budget(feasible, 0, 1000, deadline=clock.now - 1.0)
    assert found.best is None and found.stopped and len(asked) == 3


def _fake_solve_at(clock: FakeClock, limits: list, statuses: dict, spend: float):
    """`sweep.solve_at` that records each probe's time limit, spends `spend` s of the fake
    clock (or the whole limit when the status is NO_SOLUTION: a probe that timed out) and
    ends with `statuses(budget)`."""

    def solve_at(program, budget, **kw):
        limits.append((clock.now, kw["time_limit"]))
        status = statuses(budget)
        clock.now += kw["time_limit"] if status == Status.NO_SOLUTION else spend
        result = schedlang.results.Result(status, None, None, None, "pyomo", "highs", {}, {},
                                          None, None, None, "", budget)
        return sweep.SweepPoint(budget, None, result, None)

    return solve_at


def _chain_on_a_fake_clock(monkeypatch, feasible_from: float, below: Status, spend: float):
    """The chain at 40%, lowered, its probes faked on a fake clock: feasible from
    `feasible_from` x the reference peak up, `below` under it, each `spend` seconds. Returns
    (problem, reference peak, clock, [(start, time limit)] of the probes)."""
    prob = schedlang.load(CHAIN, budget="40%")
    prob.check()
    prob.lower()
    ref, _ = sweep.reference(prob.graph)
    clock = FakeClock()
    monkeypatch.setattr(bisection, "time", clock)
    limits: list = []
    monkeypatch.setattr(sweep, "solve_at", _fake_solve_at(
        clock, limits, lambda b: Status.FEASIBLE if b >= feasible_from * ref else below, spend))
    return prob, ref, clock, limits


def test_the_probes_get_the_time_left_before_the_deadline(monkeypatch):
    prob, ref, clock, limits = _chain_on_a_fake_clock(monkeypatch, 0.6, Status.INFEASIBLE, 3.0)
    deadline = clock.now + 10.0
    found, peak = explain_infeasible(prob, int(0.4 * ref), time_limit=10.0, deadline=deadline)
    assert peak == ref and limits
    for started, limit in limits:  # each probe: no more than what was left when it started
        assert limit <= deadline - started + 1e-9
    assert clock.now <= deadline + 3.0  # the last probe started before the deadline
    assert found.stopped == "the time limit" and found.best >= 0.6 * ref


def test_a_timed_out_probe_is_not_read_as_infeasible(monkeypatch):
    # below 0.8 of the peak every probe runs out of time: nothing is proven there
    prob, ref, clock, _ = _chain_on_a_fake_clock(monkeypatch, 0.8, Status.NO_SOLUTION, 1.0)
    found, _ = explain_infeasible(prob, int(0.4 * ref), deadline=clock.now + 100.0)
    assert found.infeasible == int(0.4 * ref)  # only the solve's own proof
    assert found.best >= 0.8 * ref and "ran out of time" in found.stopped


def test_solve_gives_the_explanation_the_commands_deadline(capsys, monkeypatch):
    seen = {}
    real = cli.explain_infeasible

    def spy(*args, **kw):
        seen.update(kw)
        found, ref = real(*args, **kw)
        found.stopped = "the time limit"  # as if it had run out: the report says so
        return found, ref

    monkeypatch.setattr(cli, "explain_infeasible", spy)
    limit = 40.0
    code = cli.main(["solve", CHAIN, "--budget", "40%", "--time-limit", str(limit), "--json"])
    smallest = json.loads(capsys.readouterr().out)["smallest_feasible_budget"]
    assert code == 3
    deadline = seen["deadline"]
    assert deadline is not None and deadline - bisection.time.monotonic() <= limit
    assert smallest["stopped_early"] == "the time limit" and smallest["bytes"]


@pytest.mark.parametrize("best,says", [
    (1000, "stopped early (the time limit): a smaller budget may have a plan"),
    (None, "not found: the bisection stopped early (the time limit)"),
])
def test_the_text_report_says_when_the_bisection_stopped_early(capsys, best, says):
    cli._print_smallest({"bytes": best, "reference_bytes": 2000, "percent": 50.0,
                         "stopped_early": "the time limit"})
    out = capsys.readouterr().out
    assert says in out and "another constraint" not in out
