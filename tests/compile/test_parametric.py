"""`schedlang.compile.parametric`: a program lowered once and moved to other budgets gives the IR of a
fresh lowering at each budget, entry for entry; a sweep that uses it (and starts each budget
from its neighbour's solution) gives the statuses and optima of per-budget solves."""
from __future__ import annotations

import pytest

from schedlang import budgets
from schedlang.compile.lower import lower_program
from schedlang.compile.parametric import BudgetLowering, budget_dependents, same_ir
from schedlang.problem import load
from schedlang.sweep import prepare, sweep_problem

from ..paths import ROOT

EXAMPLES = ["chain", "keep_f3", "transformer12", "unet", "profiled", "no_profiles",
            "transformer6_offload", "transformer6_recompute_only"]


def _program(name):
    prob = load(str(ROOT / "examples" / f"{name}.sched"))
    prob.check()
    return prob.program


@pytest.mark.parametrize("name", EXAMPLES)
def test_moved_lowering_equals_a_fresh_one(name):
    prog = _program(name)
    values = budgets.parse_list("30%..110%/3", prog.graph)
    # lowered at the largest budget, moved down and up again
    low = BudgetLowering(prog, {**prog.budgets, "peak": values[-1]})
    assert low.incremental, low.reason
    for b in values[::-1] + values[1:]:
        at = {**prog.budgets, "peak": b}
        assert same_ir(low.at(at), lower_program(prog, prog.graph, at)), b


def test_only_what_reads_the_budget_is_redone():
    dep = budget_dependents(_program("transformer12"))
    # the budget params, the bounded variable, the rows with B, the big-M rows over U
    assert {"B", "Bsave", "U", "peak", "save_budget", "step_peak", "stepped_end"} == dep
    assert budget_dependents(_program("chain")) == {"B", "U"}


def test_a_budget_in_a_when_guard_lowers_again(tmp_path):
    src = tmp_path / "guarded.sched"
    src.write_text((ROOT / "examples" / "chain.sched").read_text() + "\n"
                   "when budget.peak < 100MiB\n"
                   "constraint tight[t in V where t == \"f1\"]: R[t, \"f1\"] == 1\n")
    prob = load(str(src))
    prob.check()
    prog = prob.program
    low = BudgetLowering(prog, {**prog.budgets, "peak": 200 * 2**20})
    assert not low.incremental and "when" in low.reason
    for mib in (90, 150, 200):
        at = {**prog.budgets, "peak": mib * 2**20}
        assert same_ir(low.at(at), lower_program(prog, prog.graph, at))


@pytest.mark.parametrize("name", ["chain", "profiled"])
def test_parametric_sweep_gives_the_per_budget_results(name):
    path = str(ROOT / "examples" / f"{name}.sched")
    spec = "40%..100%/4"
    fresh = sweep_problem(prepare(path), spec, parametric=False)
    moved = sweep_problem(prepare(path), spec)
    started = sweep_problem(prepare(path), spec, neighbour=True)
    # the same model: the same answers, plan for plan
    assert [(p.budget_bytes, p.status, p.objective) for p in moved] == \
        [(p.budget_bytes, p.status, p.objective) for p in fresh]
    assert [p.result.plan.to_json() if p.result.plan else None for p in moved] == \
        [p.result.plan.to_json() if p.result.plan else None for p in fresh]
    # warm-started from the budget below: the same optima (these small instances solve to
    # optimality), every plan replays within its budget
    assert [p.status for p in started] == [p.status for p in fresh]
    for a, b in zip(started, fresh):
        if b.solved:
            assert a.objective == pytest.approx(b.objective, rel=1e-6)
            assert a.simulated_valid and a.simulated_peak <= a.budget_bytes
