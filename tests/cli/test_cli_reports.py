"""What the command line reports when things go wrong or look odd (issue 26): one JSON object
on every exit with --json, the install command of a missing solver, tables and plots that say
which file and what happened, the smallest feasible budget at an infeasible one, `--param`,
and the smaller items a new user met."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from schedlang.cli.main import main

from ..paths import EXAMPLES, ROOT

CHAIN = str(EXAMPLES / "chain.sched")


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def _bad_syntax(tmp_path):
    path = tmp_path / "bad.sched"
    path.write_text("set V = {\n")
    return path


def _bad_plan(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text("{not json")
    return path


@pytest.mark.parametrize("argv,code,where", [
    (["solve", CHAIN, "--solver", "nosuch"], 5, "--solver"),
    (["solve", "{bad_syntax}"], 2, "bad.sched:1:10"),
    (["solve", "{tmp}/missing.sched"], 2, "missing.sched"),
    (["solve", CHAIN, "--bogus"], 2, "schedlang"),
    (["solve", CHAIN, "--budget", "0%"], 2, "--budget"),
    (["simulate", "{bad_plan}", "--graph", CHAIN], 2, "plan.json:1"),
    (["sweep", CHAIN, "--budgets", "nonsense"], 2, "--budgets"),
    (["plan", CHAIN, "--planner", "nosuch"], 2, "schedlang plan"),
    (["plan", "--list", "--planner"], 2, "schedlang"),
    (["run", "{tmp}/missing.py:make"], 2, "missing.py:make"),
])
def test_every_exit_prints_one_json_object_with_json(capsys, tmp_path, argv, code, where):
    names = {"bad_syntax": _bad_syntax(tmp_path), "bad_plan": _bad_plan(tmp_path),
             "tmp": tmp_path}
    argv = [a.format(**names) for a in argv]
    got, out, err = run(capsys, *argv, "--json")
    assert got == code, err
    obj = json.loads(out)  # the whole of stdout is one JSON document
    assert obj["status"] == "error" and obj["exit_code"] == code
    assert obj["message"] and where in (obj["location"] or "") + obj["message"]
    assert "Traceback" not in err and err  # the located message is on stderr too


def test_an_infeasible_solve_with_json_is_one_object_that_says_the_smallest_budget(capsys):
    code, out, _ = run(capsys, "solve", CHAIN, "--budget", "40%", "--json")
    assert code == 3
    obj = json.loads(out)
    assert obj["status"] == "infeasible"
    smallest = obj["smallest_feasible_budget"]
    assert obj["budget_bytes"] < smallest["bytes"] < smallest["reference_bytes"]
    # the budget found admits a plan (every plan the solver finds replays within it)
    code, out, _ = run(capsys, "solve", CHAIN, "--budget", str(smallest["bytes"]), "--json")
    assert code == 0 and json.loads(out)["simulated"]["peak_bytes"] <= smallest["bytes"]


def test_infeasible_text_says_the_smallest_budget_and_no_explain_does_not(capsys):
    code, out, _ = run(capsys, "solve", CHAIN, "--budget", "40%")
    assert code == 3 and "smallest  feasible budget found: " in out and "by bisection" in out
    code, out, _ = run(capsys, "solve", CHAIN, "--budget", "40%", "--no-explain")
    assert code == 3 and "smallest" not in out


def test_an_unavailable_solver_names_its_install_command(capsys, monkeypatch):
    import schedlang.solve.solvers as solvers

    monkeypatch.setattr(solvers, "is_available", lambda name, backend: name == "highs")
    for name, command in [("scip", "pip install pyscipopt"), ("cbc", "apt-get install coinor-cbc"),
                          ("glpk", "apt-get install glpk-utils"), ("gurobi", "pip install gurobipy")]:
        code, out, err = run(capsys, "solve", CHAIN, "--solver", name, "--json")
        assert code == 5 and command in err and command in json.loads(out)["message"]
    for adapter in solvers.ADAPTERS:  # every solver says how to get it, for both backends
        assert adapter.install_hint("pyomo") and adapter.install_hint("cvxpy"), adapter.name


def test_compared_sweeps_say_which_file_each_table_is(capsys):
    files = [EXAMPLES / "transformer6_recompute_only.sched",
             EXAMPLES / "transformer6_offload_only.sched"]
    code, out, _ = run(capsys, "sweep", files[0], "--budgets", "100%", "--compare", files[1],
                       "--jobs", "1")
    assert code == 0
    titles = [line for line in out.splitlines() if line.startswith("sweep ")]
    assert len(titles) == 2 and len(set(titles)) == 2
    assert all(str(f) in t for f, t in zip(files, titles))


def test_a_search_highs_finished_is_optimal_without_a_time_limit(capsys):
    """HiGHS said Optimal (its tree exhausted, against the warm start's cutoff) with a stale
    dual bound 0.8% below: reported feasible with that gap before."""
    code, out, _ = run(capsys, "solve", EXAMPLES / "transformer6_recompute_only.sched",
                       "--budget", "70%", "--json")
    obj = json.loads(out)
    assert code == 0 and obj["status"] == "optimal", obj["message"]
    assert obj["gap"] <= 1e-4 and obj["bound"] == pytest.approx(obj["objective"], rel=1e-4)


def test_a_fractional_number_is_no_budget_in_bytes():
    from schedlang import budgets
    from schedlang.language.errors import DataError

    with pytest.raises(DataError, match="not a whole one; for a share of the plain execution "
                                        "peak write '150%'"):
        budgets.parse(1.5, 1000, reference_name="the plain execution peak")
    assert budgets.parse(2048.0, 1000) == 2048 and budgets.parse("150%", 1000) == 1500
    torch = pytest.importorskip("torch")
    from schedlang.language.errors import SchedError
    from schedlang.pytorch import fit

    with pytest.raises(SchedError, match="'150%'"):
        fit(torch.nn.Linear(4, 4), torch.randn(8, 4), 1.5, progress=False)


def test_an_empty_file_is_nothing_to_solve(capsys, tmp_path):
    empty = tmp_path / "empty.sched"
    empty.write_text("")
    code, _, err = run(capsys, "solve", empty)
    assert code == 2 and err.startswith(f"{empty}: error: nothing to solve")
    assert run(capsys, "check", empty)[0] == 0  # an empty file is valid text


def test_simulate_says_first_that_the_plan_is_for_another_graph(capsys, tmp_path):
    plan = tmp_path / "plan.json"
    assert run(capsys, "plan", CHAIN, "--planner", "chen_greedy", "--plan-out", plan)[0] == 0
    code, out, _ = run(capsys, "simulate", plan, "--graph", EXAMPLES / "unet.sched")
    lines = out.splitlines()
    assert code == 3 and lines[1] == "  warning: the plan was made for graph 'chain', not 'unet3'"
    assert len(lines) < 30 and "more errors (--json lists them all)" in lines[-1]


def test_a_sweep_plot_with_nothing_solved_has_a_readable_axis(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    from schedlang.plotting import sweep_figure
    from schedlang.sweep import prepare, sweep_problem

    prob = prepare(CHAIN)
    points = sweep_problem(prob, [1 << 20, 2 << 20], jobs=1)
    assert not any(p.solved for p in points)
    ax = sweep_figure(points).axes[0]
    assert ax.get_ylim() == (0, 100)
    assert any(t.get_text() == "no budget was solved" for t in ax.texts)
    code, _, _ = run(capsys, "sweep", CHAIN, "--budgets", "1MiB,2MiB", "--plot",
                     tmp_path / "p.png", "--jobs", "1")
    assert code == 3 and (tmp_path / "p.png").stat().st_size > 0


def test_param_sets_a_default_from_the_command_line(capsys, tmp_path):
    model = tmp_path / "m.sched"
    model.write_text("set I = 1..3\nparam cap default 3\nvar x[i in I] binary\n"
                     "constraint c: sum(i in I) x[i] <= cap\nmaximize o: sum(i in I) x[i]\n")
    assert json.loads(run(capsys, "solve", model, "--json")[1])["objective"] == 3
    code, out, _ = run(capsys, "solve", model, "--json", "--param", "cap=1")
    assert code == 0 and json.loads(out)["objective"] == 1
    code, _, err = run(capsys, "solve", model, "--param", "cpa=1")
    assert code == 2 and "did you mean 'cap'?" in err
    code, _, err = run(capsys, "solve", model, "--param", "cap")
    assert code == 2 and err.startswith("--param: error:")
    assert run(capsys, "check", model, "--param", "cap=2")[0] == 0


def test_a_closed_pipe_ends_quietly(tmp_path):
    """`schedlang ... | head -1`: the reader leaves early; no BrokenPipeError traceback."""
    plan = tmp_path / "plan.json"
    assert main(["plan", CHAIN, "--planner", "chen_greedy", "--plan-out", str(plan)]) == 0
    proc = subprocess.run(f"{sys.executable} -m schedlang.cli simulate {plan} --graph "
                          f"{EXAMPLES / 'unet.sched'} | head -1", shell=True, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert "Traceback" not in proc.stderr and proc.stdout.startswith("invalid")


def test_sweep_with_gurobi_leaks_no_semaphore():
    pytest.importorskip("gurobipy")
    from schedlang.solve.solvers import is_available

    if not is_available("gurobi", "pyomo"):
        pytest.skip("gurobi is not usable here")
    proc = subprocess.run([sys.executable, "-m", "schedlang.cli", "sweep", CHAIN, "--budgets",
                           "60%..100%/3", "--solver", "gurobi", "--jobs", "2"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "leaked semaphore" not in proc.stderr and "resource_tracker" not in proc.stderr
