"""The Python API the CLI is a layer over: budgets, load(graph=...), Problem.plan, the solver
adapters and their per-process state."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import schedlang
from schedlang import budgets
from schedlang.cli.main import main
from schedlang.language.errors import CheckError, DataError
from schedlang.plans.planners.no_recompute import no_recompute_peak
from schedlang.solve.backends import solve_ir
from schedlang.solve.solution import Status
from schedlang.solve.solvers import ADAPTERS, BACKEND_NAMES, SOLVER_NAMES, SOLVERS, is_available, native_options
from schedlang.testing.irmodels import make_ir

ROOT = Path(__file__).resolve().parent.parent
# max x0 + 2 x1 + 3 x2 with at most two of three: 5
SMALL = make_ir([("x", "binary", [0, 0, 0], [1, 1, 1])], [("cap", [[1, 1, 1]], [-np.inf], [2])],
                [1, 2, 3], sense="max")
CHAIN = str(ROOT / "examples" / "chain.sched")
TINY = str(ROOT / "examples" / "tiny_transformer.sched")


# --------------------------------------------------------------------------- budgets

def test_percent_rule_rounds_up_to_a_whole_byte():
    assert budgets.percent_of(1000, 100) == 1000
    assert budgets.percent_of(1001, 60) == 601  # 600.6 -> 601
    assert budgets.percent_of(3, 50) == 2  # 1.5 -> 2
    # read to 1/1000 of a percent: 33.33333% is 33.333%
    assert budgets.percent_of(10**9, 33.33333) == budgets.percent_of(10**9, 33.333) == 333330000


def test_every_percent_parser_uses_the_same_rule():
    from schedlang.problem import resolve_budget
    from schedlang.sweep import parse_budgets

    prob = schedlang.load(CHAIN)
    peak = no_recompute_peak(prob.graph)
    for pct in ("33.3%", "60%", "90%", "12.3456%"):
        want = budgets.percent_of(peak, float(pct[:-1]))
        assert resolve_budget(pct, prob.graph) == want
        assert parse_budgets(pct, prob.graph) == [want]
        assert schedlang.load(CHAIN, budget=pct).budgets["peak"] == want
    pytest.importorskip("torch")
    from schedlang.pytorch.fit import resolve_fit_budget

    assert resolve_fit_budget("60%", 1001) == 601  # was floored to 600 before
    assert resolve_fit_budget("2KiB", 1001) == 2048 and resolve_fit_budget(3e3, 1) == 3000


@pytest.mark.parametrize("value, words", [
    (True, "not a size or a percentage"), (0, "must be positive"), (-3, "must be positive"),
    ("0%", "must be positive"), ("nan%", "not a percentage"), ("x%", "not a percentage"),
    ("3ms", "is a time"), ("0B", "must be positive"),
])
def test_bad_budgets_are_located_errors(value, words):
    with pytest.raises(DataError) as info:
        budgets.parse(value, 1000, budgets.Loc("budget"))
    assert words in info.value.message and str(info.value).startswith("budget: error: ")


def test_percent_needs_a_reference():
    with pytest.raises(DataError, match="no graph data"):
        budgets.parse("50%", None)
    assert budgets.parse("1KiB", None) == 1024


def test_budget_precedence():
    prob = schedlang.load(CHAIN)
    g, data = prob.graph, prob.budgets
    assert budgets.peak_budget("100MiB", g, data) == 100 * 2**20  # given wins
    assert budgets.peak_budget(None, g, data) == data["peak"]  # then the data's
    plan = type("P", (), {"budget_peak": 7})()
    assert budgets.peak_budget(None, g, {}, plan) == 7  # then the plan's
    assert budgets.peak_budget(None, g, {}) is None


# --------------------------------------------------------------------------- load(graph=...)

def test_load_graph_object_solves_like_the_file():
    from_file = schedlang.load(CHAIN).solve()
    graph = schedlang.load(CHAIN).graph
    graph.budgets = {"peak": schedlang.load(CHAIN).budgets["peak"]}
    before = dict(graph.budgets)
    prob = schedlang.load(graph=graph)  # node/edge data alone: checkmate
    assert prob.program.model.name == "checkmate"
    res = prob.solve()
    assert res.status == from_file.status == Status.OPTIMAL
    assert res.objective == pytest.approx(from_file.objective)
    assert res.simulated.valid
    assert graph.budgets == before  # the caller's graph is not modified
    with pytest.raises(DataError, match="one graph per problem"):
        schedlang.load(CHAIN, graph=graph)


def test_params_give_values_to_default_params():
    text = "param cap default 1\nvar x in [0, 10]\nconstraint c: x <= cap\nmaximize obj: x\n"
    assert schedlang.load(text=text).solve().objective == pytest.approx(1)
    assert schedlang.load(text=text, params={"cap": 4.5}).solve().objective == pytest.approx(4.5)
    with pytest.raises(CheckError, match="declared with `default`.*did you mean 'cap'"):
        schedlang.load(text=text, params={"capp": 2})


def test_layered_data_without_formulation_plans_but_does_not_solve(tmp_path):
    prob = schedlang.load(TINY)
    data = tmp_path / "data.sched"
    data.write_text("\n".join(line for line in Path(TINY).read_text().splitlines()
                              if not line.startswith("use ")))
    bare = schedlang.load(str(data))
    assert bare.plan("checkpoint_all").simulated.valid
    with pytest.raises(CheckError, match="layered data and no formulation"):
        bare.solve()
    assert prob.graph is not None


# --------------------------------------------------------------------------- Problem.plan

def test_problem_plan_is_what_schedlang_plan_prints(capsys):
    report = schedlang.load(CHAIN).plan("checkpoint_all", budget="100%")
    assert report.fits and report.status == "feasible" and report.exit_code == 0
    assert report.simulated.valid and report.budget_bytes == no_recompute_peak(report.graph)
    code = main(["plan", CHAIN, "--planner", "checkpoint_all", "--budget", "100%", "--json"])
    printed = json.loads(capsys.readouterr().out)
    assert code == 0
    mine = report.to_json()
    for key in ("status", "objective", "planner", "view", "budget_bytes", "fits_budget",
                "overhead", "reference", "predicted", "simulated", "plan"):
        assert printed[key] == mine[key], key
    tight = schedlang.load(CHAIN).plan("checkpoint_all", budget="10%")
    assert not tight.fits and tight.exit_code == 3 and tight.problems


# --------------------------------------------------------------------------- solver adapters

def test_registry_is_built_from_the_adapters():
    assert SOLVER_NAMES == tuple(a.name for a in ADAPTERS)
    assert all(SOLVERS[a.name] is a for a in ADAPTERS)
    for adapter in ADAPTERS:
        for backend in BACKEND_NAMES:
            opts = native_options(adapter.name, backend, time_limit=5, gap=0.01, threads=1)
            assert opts.options, (adapter.name, backend)


def test_highs_thread_counts_change_between_solves():
    """HiGHS fails a run whose thread count differs from its scheduler's (kNotset); the
    adapter's session resets the scheduler around runs that set threads."""
    for threads in (2, 1, None, 3, None):
        for backend in BACKEND_NAMES:
            sol = solve_ir(SMALL, backend=backend, threads=threads, presolve=False)
            assert sol.status == Status.OPTIMAL, (threads, backend, sol.message)
            assert sol.objective == pytest.approx(5)


def test_no_solver_banner_unless_verbose():
    def solve(*extra):
        return subprocess.run([sys.executable, "-m", "schedlang.cli", "solve", CHAIN, *extra],
                              capture_output=True, text=True, cwd=ROOT)

    quiet = solve()
    assert quiet.returncode == 0
    assert "HiGHS" not in quiet.stdout + quiet.stderr
    loud = solve("--verbose")
    assert loud.returncode == 0 and "HiGHS" in loud.stderr and "HiGHS" not in loud.stdout


def test_warm_start_ignored_is_a_field():
    ir = SMALL
    start = np.array([1.0, 1.0, 0.0])
    used = solve_ir(ir, solver="highs", warm_start=start, presolve=False)
    assert used.status == Status.OPTIMAL and not used.warm_start_ignored
    assert not solve_ir(ir, solver="highs").warm_start_ignored  # no start given
    cold = [a.name for a in ADAPTERS if "cvxpy" not in a.warm_start
            and is_available(a.name, "cvxpy")]
    if not cold:
        pytest.skip("every solver installed for cvxpy takes a MIP start")
    sol = solve_ir(ir, backend="cvxpy", solver=cold[0], warm_start=start, presolve=False)
    assert sol.warm_start_ignored and "warm start ignored" in sol.message
    assert used.objective == pytest.approx(5)


def test_termination_tables_name_real_native_statuses():
    """Every native name in a termination table exists in the library it comes from (a
    misspelt name would silently read as 'unknown')."""
    import cvxpy.settings as cs
    import highspy
    from pyomo.contrib.appsi.base import TerminationCondition as Appsi
    from pyomo.contrib.solver.common.results import TerminationCondition as Contrib
    from pyomo.opt import TerminationCondition as Classic

    from schedlang.solve import status
    from schedlang.solve.solvers import highs

    def names(enum):
        return {m.name for m in enum}

    assert set(status.PYOMO_CLASSIC) <= names(Classic)
    assert set(status.PYOMO_CONTRIB) <= names(Contrib)
    assert set(status.PYOMO_APPSI) <= names(Appsi)
    assert set(status.CVXPY) <= {v for k, v in vars(cs).items() if k.isupper()
                                 and isinstance(v, str)}
    assert set(highs.TERMINATION) <= set(highspy.HighsModelStatus.__members__)
    gp = pytest.importorskip("gurobipy")
    from schedlang.solve.solvers import gurobi

    assert all(hasattr(gp.GRB, name) for name in gurobi.TERMINATION)


def test_progress_is_reported_while_highs_runs():
    import io

    from schedlang import progress

    rng = np.random.default_rng(3)  # a multi-dimensional knapsack HiGHS needs seconds for
    n, m = 120, 8
    w = rng.uniform(1, 100, size=(m, n)).round(2)
    ir = make_ir([("take", "binary", np.zeros(n), np.ones(n))],
                 [("cap", w, np.full(m, -np.inf), w.sum(1) / 2)],
                 w.mean(0) + rng.uniform(0, 20, size=n), sense="max")
    seen = []
    sol = solve_ir(ir, time_limit=1.0, progress=seen.append)
    assert sol.status == Status.FEASIBLE and seen
    assert any(p.incumbent is not None for p in seen)
    # in a progress session, a solve's reports are the "solving" phase's line
    ticks = iter(range(10**6))
    s = progress.Session("lines", stream=io.StringIO(), clock=lambda: float(next(ticks)),
                         thread=False)
    with s, progress.phase("solving"):
        report = progress.solver_callback()
        for p in seen[-3:]:
            report(p)
    assert any("incumbent" in line and "gap" in line for _, line in s.lines)


def test_solve_json_quiet_is_one_object(capsys):
    code = main(["solve", CHAIN, "--quiet", "--json"])
    assert code == 0
    json.loads(capsys.readouterr().out)


def test_classic_plugin_quirks():
    """What the glpk and cbc adapters make of Pyomo's classic plugins (their binaries may
    not be installed, so the log readings are checked on their own)."""
    from schedlang.solve.solvers import cbc, glpk
    from schedlang.solve.status import INF_OR_UNBD, INFEASIBLE, LIMIT, OPTIMAL, UNBOUNDED, UNKNOWN, RawResult

    def glpk_says(term, log, is_mip=True, x=None):
        return glpk.ADAPTER.adjust_classic(RawResult(term, x=x), log, is_mip, True).termination

    assert glpk_says(UNKNOWN, "PROBLEM HAS NO PRIMAL FEASIBLE SOLUTION") == INFEASIBLE
    assert glpk_says(UNKNOWN, "LP HAS UNBOUNDED PRIMAL SOLUTION") == INF_OR_UNBD
    assert glpk_says(UNKNOWN, "LP HAS UNBOUNDED PRIMAL SOLUTION", is_mip=False) == UNBOUNDED
    assert glpk_says(LIMIT, "INTEGER OPTIMAL SOLUTION FOUND; MIP GAP TOLERANCE REACHED") == OPTIMAL
    assert glpk_says(LIMIT, "TIME LIMIT EXCEEDED") == LIMIT
    assert glpk_says(UNKNOWN, "", x=np.zeros(1)) == UNKNOWN

    def cbc_bound(bound, incumbent, sense_min):
        raw = RawResult(OPTIMAL, objective=incumbent, bound=bound)
        return cbc.ADAPTER.adjust_classic(raw, "", True, sense_min).bound

    assert cbc_bound(4.0, 5.0, True) == 4.0
    assert cbc_bound(-12.0, 10.0, False) == 12.0  # printed in CBC's minimisation sense
    assert cbc_bound(3.0, 10.0, False) is None  # neither sign is a bound of a max at 10
    assert cbc_bound(None, 10.0, True) is None
