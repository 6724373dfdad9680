"""Budgets exact to the byte (issue 14): a plan whose peak is the budget, byte for byte, is a
plan within it, and a plan a solver's tolerance lets over the budget is never returned.

The models (models/rockmate.sched, checkmate.sched) compare memory with the budget exactly
(`units.budget_value`: to the byte up to 8 GiB); before, they rounded it down to whole KiB and
refused such a plan whenever the budget was not a whole KiB. `Problem.solve` replays every
decoded plan against the exact budgets and, when the solver's tolerances let one over,
solves again below the budget (`budget_excess`, `MAX_RESOLVES`): checked here with a solver
forced to overshoot.
"""
from __future__ import annotations

import functools
import logging

import pytest

import schedlang
import schedlang.solve.backends
from schedlang import problem as problem_mod
from schedlang.compile.lower import lower_program
from schedlang.graphs.graph import Graph
from schedlang.graphs.writer import write_graph
from schedlang.language.units import budget_value
from schedlang.plans.planners.no_recompute import no_recompute_peak
from schedlang.solve.solution import Status
from schedlang.testing.bruteforce import best_checkmate_schedule
from schedlang.testing.checkmate_instances import graph_of
from schedlang.testing.layered_instances import chain, opt

from ..bruteforce_rockmate import best_rockmate_plan
from ..fuzzing import run_cli

MiB = 2**20


def odd_chain() -> Graph:
    """Two layers (keep everything, or recompute from the input), sizes a few bytes off whole
    MiB: no peak of any plan is a whole KiB."""
    two = [opt("keep", 2, 3, 4.0001), opt("recomp", 2, 5, 0, ["in"])]
    return chain("odd", [2.0000123, 3.0000456, 2.0000789], [two, two])


def odd_checkmate() -> Graph:
    M = MiB
    return graph_of("odd_train", [("f1", 2, 8 * M + 13), ("f2", 3, 8 * M + 501),
                                  ("f3", 1, 8 * M + 77), ("g3", 1, 8 * M + 3),
                                  ("g2", 1, 8 * M + 1001), ("g1", 1, 8 * M + 9)],
                    [("f1", "f2"), ("f2", "f3"), ("f3", "g3"), ("f2", "g3"), ("g3", "g2"),
                     ("f1", "g2"), ("g2", "g1")])


@functools.cache
def rockmate_brute(peak: int):
    return best_rockmate_plan(odd_chain(), peak)[0]


def least_feasible(feasible, top: int) -> int:
    """The least budget in bytes at which `feasible(budget)` holds (it holds at `top`)."""
    lo, hi = 0, top
    assert feasible(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if feasible(mid) else (mid, hi)
    return hi


def problem_at(model: str, graph: Graph, peak: int):
    """`model` (a shipped model's name) on `graph` at peak budget `peak` (bytes)."""
    graph.budgets = {"peak": peak}
    try:
        return schedlang.load(text=f"use {model}\n" + write_graph(graph))
    finally:
        graph.budgets = {}


rockmate_at = functools.partial(problem_at, "rockmate")
checkmate_at = functools.partial(problem_at, "checkmate")


# ------------------------------------------------------------------ a plan at the budget exactly

@pytest.mark.parametrize("backend", ["pyomo", "cvxpy"])
def test_the_only_plans_at_the_least_budget_peak_at_it_to_the_byte(backend):
    """At the least budget with a plan (found by exhaustive search, to the byte), every plan
    that fits peaks at the budget itself, which is not a whole KiB: the solve finds the
    exhaustive optimum there, and one byte lower proves the model infeasible, as the search."""
    graph = odd_chain()
    tightest = least_feasible(lambda b: rockmate_brute(b) is not None, no_recompute_peak(graph))
    assert tightest % 1024 and rockmate_brute(tightest - 1) is None
    res = rockmate_at(graph, tightest).solve(backend=backend)
    assert res.status == Status.OPTIMAL, res.message
    assert res.objective == pytest.approx(rockmate_brute(tightest), rel=1e-9)
    assert res.simulated.valid and res.simulated.peak_bytes == tightest
    res = rockmate_at(graph, tightest - 1).solve(backend=backend)
    assert res.status == Status.INFEASIBLE and res.plan is None


def test_every_budget_up_to_plain_execution_gives_the_exhaustive_optimum():
    """Budgets at each distinct optimum's boundary, to the byte: the least feasible, the
    no-recomputation peak (the fastest plan's peak, not a whole KiB) and one byte under it."""
    graph = odd_chain()
    top = no_recompute_peak(graph)
    assert top % 1024
    for budget in (top, top - 1):
        res = rockmate_at(graph, budget).solve()
        assert res.status == Status.OPTIMAL, res.message
        assert res.objective == pytest.approx(rockmate_brute(budget), rel=1e-9)
        assert res.simulated.valid and res.simulated.peak_bytes <= budget
    assert rockmate_brute(top) < rockmate_brute(top - 1)  # the plain plan needs every byte


def test_checkmate_reaches_a_plan_peaking_at_the_budget():
    graph = odd_checkmate()
    top = no_recompute_peak(graph)
    best = functools.lru_cache(maxsize=None)(lambda b: best_checkmate_schedule(graph, b)[0])
    tightest = least_feasible(lambda b: best(b) is not None, top)
    for budget in (tightest, top, top - 1):
        assert budget % 1024
        res = checkmate_at(graph, budget).solve()
        assert res.status == Status.OPTIMAL, (budget, res.message)
        assert res.objective == pytest.approx(best(budget), rel=1e-9)
        assert res.simulated.valid and res.simulated.peak_bytes <= budget
    assert checkmate_at(graph, tightest - 1).solve().status == Status.INFEASIBLE


def test_the_cli_solves_at_a_byte_count_budget(tmp_path):
    graph = odd_chain()
    path = tmp_path / "odd.sched"
    path.write_text("use rockmate\n" + write_graph(graph))
    top = no_recompute_peak(graph)
    run = run_cli(["solve", str(path), f"--budget={top}"])
    assert run.code == 0 and "status    optimal" in run.out, run.describe()
    assert f"({top} B)" in run.out and f"objective {rockmate_brute(top):.6g} " in run.out


def test_budgets_enter_a_model_exact_up_to_8_gib_and_never_above():
    assert budget_value(36 * MiB + 1) == 36 * MiB + 1
    assert budget_value(2**33 - 1) == 2**33 - 1
    for n in (2**33 + 5, 2**40 + 2**20 - 1, 2**62 + 12345):
        v = budget_value(n)
        assert v <= n and n - v < n * 2.0**-32


# ------------------------------------------------------------------ a tolerance overshoot

def overshooting(monkeypatch, prob, budget: int, extra: int | None, always: bool = False):
    """`solve_ir` as a solver whose tolerances let its plan over the budget: the first call
    (every call with `always`) is answered with `prob`'s model solved at `budget` plus `extra`
    bytes (`extra` None: at the no-recomputation peak). Returns the list of models it got."""
    real = schedlang.solve.backends.solve_ir
    over = no_recompute_peak(prob.graph) if extra is None else budget + extra
    calls = []

    def solve_ir(ir, **kw):
        calls.append(ir)
        if len(calls) == 1 or always:
            ir = lower_program(prob.program, prob.graph, {"peak": over})
        return real(ir, **kw)

    monkeypatch.setattr(schedlang.solve.backends, "solve_ir", solve_ir)
    return calls


def test_a_plan_over_the_budget_is_solved_again_below_it(monkeypatch, caplog):
    """The solver's plan replays one byte over the budget (it solved one byte above it, where
    the only plans as fast as plain execution peak at plain execution's peak): the plan is
    refused, the model solved again one byte lower, and the plan returned fits. Its objective
    is the exhaustive optimum there; the first solve's bound still bounds the optimum at the
    budget, which the new plan does not reach: reported as feasible."""
    graph = odd_chain()
    budget = no_recompute_peak(graph) - 1  # the plain plan is one byte over it
    prob = rockmate_at(graph, budget)
    calls = overshooting(monkeypatch, prob, budget, extra=1)
    with caplog.at_level(logging.INFO, logger="schedlang"):
        res = prob.solve()
    assert len(calls) == 2
    assert "replays peak 1 B over its budget" in res.message and "solved again" in res.message
    assert any("solved again" in r.getMessage() for r in caplog.records)
    assert res.simulated.valid and res.simulated.peak_bytes <= budget
    assert res.objective == pytest.approx(rockmate_brute(budget - 1), rel=1e-9)
    assert res.objective >= rockmate_brute(budget) - 1e-9
    assert res.bound == pytest.approx(rockmate_brute(budget + 1), rel=1e-9)  # the first solve's
    assert res.status == Status.FEASIBLE and res.gap > 0
    assert res.budget_bytes == budget and res.plan.budget_peak == budget


def test_solves_below_the_budget_are_bounded(monkeypatch):
    """A solver that always answers with the plain plan, 1000 B over the budget: after
    `MAX_RESOLVES` solves below it, no solution (the plan kept, its replay says why), and the
    CLI's exit code for no solution."""
    graph = odd_chain()
    budget = no_recompute_peak(graph) - 1000
    prob = rockmate_at(graph, budget)
    calls = overshooting(monkeypatch, prob, budget, extra=None, always=True)
    res = prob.solve()
    assert len(calls) == 1 + problem_mod.MAX_RESOLVES
    assert res.status == Status.NO_SOLUTION and "no plan within the budgets" in res.message
    assert res.simulated is not None and not res.simulated.valid
    assert res.simulated.peak_bytes == budget + 1000


def test_a_model_that_counts_less_than_the_replay_is_not_solved_again(monkeypatch):
    """Far over the budget (more than tolerances explain): the model's error, reported by the
    replay, not hidden by solving lower."""
    graph = odd_chain()
    budget = no_recompute_peak(graph) - MiB
    prob = rockmate_at(graph, budget)
    calls = overshooting(monkeypatch, prob, budget, extra=None)
    res = prob.solve()
    assert len(calls) == 1
    assert not res.simulated.valid and "exceeds the peak budget" in res.simulated.errors[0]
