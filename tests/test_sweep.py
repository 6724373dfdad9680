"""`schedlang sweep` and schedlang.sweep: budget specs, per-budget solves, JSON, plot, exit codes."""
from __future__ import annotations

import json

import pytest

import schedlang
from schedlang.cli.main import main
from schedlang.language.errors import DataError
from schedlang.plans.planners.no_recompute import no_recompute_peak
from schedlang.problem import resolve_budget
from schedlang.results import Result
from schedlang.solve.solution import Status
from schedlang.sweep import SweepPoint, exit_code, parse_budgets, prepare, sweep

from .paths import ROOT

CHAIN = str(ROOT / "examples" / "chain.sched")
MiB = 2**20
GiB = 2**30
PEAK = 168 * MiB  # no-recomputation peak of examples/chain.sched


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def graph():
    return prepare(CHAIN).graph


# ---------------------------------------------------------------------------- parse_budgets

def test_reference_peak(graph):
    assert no_recompute_peak(graph) == PEAK


def test_percent_range_matches_solve_budget(graph):
    got = parse_budgets("30%..100%/8", graph)
    assert len(got) == 8
    assert got == [resolve_budget(f"{p}%", graph) for p in (30, 40, 50, 60, 70, 80, 90, 100)]
    assert got[-1] == PEAK


def test_size_range_and_list(graph):
    assert parse_budgets("1GiB..4GiB/4", graph) == [GiB, 2 * GiB, 3 * GiB, 4 * GiB]
    assert parse_budgets("1.5GiB..3GiB/2", graph) == [GiB + GiB // 2, 3 * GiB]
    # sorted ascending, deduplicated; percents and sizes mixed
    assert parse_budgets("2GiB, 1GiB,75%,1GiB", graph) == [126 * MiB, GiB, 2 * GiB]
    assert parse_budgets("100%,168MiB", graph) == [PEAK]
    assert parse_budgets("50%..50%/1", graph) == [PEAK // 2]
    assert parse_budgets("100MiB..100%/3", graph) == [100 * MiB, 134 * MiB, PEAK]
    assert parse_budgets([GiB, "50%"], graph) == [PEAK // 2, GiB]


@pytest.mark.parametrize("spec, words", [
    ("", "no budgets"),
    ("30%..100%", "no count"),
    ("30%..100%/x", "not a whole number"),
    ("30%..100%/1", "at least 2"),
    ("30%..100%/0", "at least 2"),
    ("100%..30%/4", "goes down"),
    ("1GiB,,2GiB", "empty item"),
    ("1..2..3/4", "not a budget range"),
    ("..3GiB/4", "not a budget range"),
    ("12parsecs", "not a size"),
    ("2s", "is a time"),
    ("abc%", "not a percentage"),
    ("0%..100%/3", "must be positive"),
    ("0", "must be positive"),
    ("nan%", "not a percentage"),
    ("10%..inf%/3", "not a percentage"),
    ("1MiB..2MiB/100000", "at most 1000"),
])
def test_bad_specs_are_located_at_the_flag(graph, spec, words):
    with pytest.raises(DataError) as info:
        parse_budgets(spec, graph)
    assert str(info.value).startswith("--budgets: error: ")
    assert words in info.value.message


def test_percent_without_graph_data():
    with pytest.raises(DataError, match="no graph data"):
        parse_budgets("50%", None)
    assert parse_budgets("1GiB", None) == [GiB]


def test_bad_spec_on_the_command_line_exits_2(capsys):
    code, out, err = run(capsys, "sweep", CHAIN, "--budgets", "30%..100%")
    assert code == 2 and out == ""
    assert err.startswith("--budgets: error: ") and "Traceback" not in err


# ---------------------------------------------------------------------------- the sweep

@pytest.fixture(scope="module", params=["pyomo", "cvxpy"])
def chain_sweep(request):
    events = []
    points = sweep(CHAIN, "60%..100%/5", backend=request.param,
                   progress=lambda k, n, b, p: events.append((k, n, b, p is not None)))
    return request.param, points, events


def test_sweep_solves_every_budget(chain_sweep):
    backend, points, events = chain_sweep
    assert [round(p.budget_percent) for p in points] == [60, 70, 80, 90, 100]
    assert all(p.status is Status.OPTIMAL for p in points)
    assert all(p.result.backend == backend for p in points)
    # the known optima of examples/chain.sched
    assert [p.objective for p in points] == pytest.approx([62, 56, 50, 48, 45])
    # progress: before and after each solve
    assert [(k, n, done) for k, n, _, done in events] == [
        (k, 5, done) for k in range(1, 6) for done in (False, True)]


def test_sweep_tradeoff_is_consistent(chain_sweep):
    _, points, _ = chain_sweep
    objectives = [p.objective for p in points]
    assert all(a >= b - 1e-9 for a, b in zip(objectives, objectives[1:]))
    assert points[-1].overhead == pytest.approx(0.0, abs=1e-9)
    for p in points:
        assert p.simulated_valid
        assert p.simulated_peak <= p.budget_bytes
        assert p.predicted_peak == p.simulated_peak
        assert p.simulated_time == pytest.approx(p.objective)
        assert p.overhead == pytest.approx(p.objective / 45 - 1)
        assert p.result.budget_bytes == p.budget_bytes


def test_sweep_point_equals_a_plain_solve(chain_sweep):
    backend, points, _ = chain_sweep
    prob = schedlang.load(CHAIN, budget="90%")
    alone = prob.solve(backend=backend)
    assert alone.budget_bytes == points[3].budget_bytes
    assert alone.objective == pytest.approx(points[3].objective)


def test_sweep_leaves_the_program_alone():
    prob = prepare(CHAIN)
    before = dict(prob.program.budgets)
    from schedlang.sweep import sweep_problem

    sweep_problem(prob, "100%")
    assert prob.program.budgets == before == {"peak": 120 * MiB}


@pytest.mark.parametrize("backend", ["pyomo", "cvxpy"])
def test_infeasible_budgets_are_reported_not_errors(backend):
    points = sweep(CHAIN, "20MiB,40%,100%", backend=backend)
    assert [p.status for p in points] == [Status.INFEASIBLE, Status.INFEASIBLE, Status.OPTIMAL]
    assert [p.overhead for p in points[:2]] == [None, None]
    assert points[0].simulated_peak is None and points[0].predicted_peak is None
    assert exit_code(points) == 0


def _point(status: Status) -> SweepPoint:
    result = Result(status, None, None, None, "pyomo", "highs", {}, {})
    return SweepPoint(MiB, None, result, None)


@pytest.mark.parametrize("statuses, code", [
    ([Status.INFEASIBLE, Status.OPTIMAL], 0),
    ([Status.NO_SOLUTION, Status.FEASIBLE], 0),
    ([Status.INFEASIBLE, Status.INFEASIBLE], 3),
    ([Status.INFEASIBLE, Status.NO_SOLUTION], 4),
    ([Status.NO_SOLUTION, Status.ERROR, Status.INFEASIBLE], 5),
])
def test_exit_code_rules(statuses, code):
    assert exit_code([_point(s) for s in statuses]) == code


# ---------------------------------------------------------------------------- the command

def test_cli_table_and_progress(capsys):
    code, out, err = run(capsys, "sweep", CHAIN, "--budgets", "20MiB,90%,100%")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("sweep") and "chain" in lines[0]
    assert "168.00 MiB" in lines[1]
    header = next(line for line in lines if line.split()[:2] == ["budget", "%"])
    assert "status" in header and "overhead" in header and "solve s" in header
    assert any("infeasible" in line and "20.00 MiB" in line for line in lines)
    assert any("90%" in line and "optimal" in line and "+6.67%" in line for line in lines)
    assert "\x1b[" not in out and "\x1b[" not in err  # no colours or cursor moves when piped
    assert lines[-1].startswith("total") and "2 solved, 1 infeasible" in lines[-1]
    assert len([line for line in err.splitlines() if line.startswith("sweep [")]) == 3


def test_cli_json(capsys):
    code, out, _ = run(capsys, "sweep", CHAIN, "--budgets", "20MiB,100%", "--json",
                       "--backend", "cvxpy")
    assert code == 0
    rows = json.loads(out)
    assert isinstance(rows, list) and len(rows) == 2
    for row in rows:
        for key in ("status", "objective", "bound", "gap", "backend", "solver", "model_size",
                    "timings", "predicted", "simulated", "plan", "budget_bytes",
                    "budget_percent", "overhead"):
            assert key in row
    assert rows[0]["status"] == "infeasible" and rows[0]["budget_bytes"] == 20 * MiB
    assert rows[0]["overhead"] is None and rows[0]["simulated"] is None
    assert rows[1]["status"] == "optimal" and rows[1]["budget_bytes"] == PEAK
    assert rows[1]["budget_percent"] == pytest.approx(100) and rows[1]["overhead"] == 0
    assert rows[1]["simulated"]["valid"] and rows[1]["backend"] == "cvxpy"
    assert isinstance(rows[1]["plan"], list) and rows[1]["plan"][0]["op"] == "compute"


def test_cli_all_infeasible_exits_3(capsys):
    code, out, _ = run(capsys, "sweep", CHAIN, "--budgets", "10MiB..30MiB/3", "--json")
    assert code == 3
    assert [r["status"] for r in json.loads(out)] == ["infeasible"] * 3


def test_cli_unknown_solver_exits_5(capsys):
    code, _, err = run(capsys, "sweep", CHAIN, "--budgets", "100%", "--solver", "hihgs")
    assert code == 5 and "highs" in err and "Traceback" not in err


def test_cli_plot(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    out_png = tmp_path / "pareto.png"
    code, out, _ = run(capsys, "sweep", CHAIN, "--budgets", "20MiB,90%,100%",
                       "--plot", str(out_png))
    assert code == 0 and f"plot written to {out_png}" in out
    data = out_png.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000


def test_cli_plot_without_matplotlib_fails_before_solving(capsys, tmp_path, monkeypatch):
    import sys

    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    code, out, err = run(capsys, "sweep", CHAIN, "--budgets", "100%",
                         "--plot", str(tmp_path / "p.png"))
    assert code == 2 and out == ""
    assert "pip install matplotlib" in err and "--plot" in err
    assert "sweep [" not in err  # nothing was solved


def test_cli_plot_into_a_missing_folder_exits_2(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    code, _, err = run(capsys, "sweep", CHAIN, "--budgets", "100%",
                       "--plot", str(tmp_path / "no" / "p.png"))
    assert code == 2 and "does not exist" in err and "sweep [" not in err


def test_sweep_on_layered_data_with_percent_budgets():
    from schedlang.sweep import sweep

    points = sweep(str(ROOT / "examples" / "tiny_transformer.sched"), "80MiB,50%..100%/3")
    assert [p.result.status.value for p in points][-3:] == ["optimal"] * 3
    assert points[-1].budget_percent == pytest.approx(100)
    solved = [p for p in points if p.result.status.value == "optimal"]
    assert all(p.result.simulated.valid for p in solved)
    objectives = [p.result.objective for p in solved]
    assert objectives == sorted(objectives, reverse=True)


def test_cli_compare_sweeps_several_files_at_the_same_budgets(capsys, tmp_path):
    """--compare: one curve per file (here recompute + offload vs recompute only), the same
    budgets for each; JSON lists the curves; the plot has them all."""
    pytest.importorskip("matplotlib")
    tiny = ROOT / "examples" / "tiny_transformer.sched"
    both = tmp_path / "both.sched"
    both.write_text(f'use offload\nuse "{tiny}"\nbandwidth offload inf\nbandwidth prefetch inf\n')
    only = tmp_path / "recompute_only.sched"
    only.write_text('use "both.sched"\nparam allow_offload = 0\n')
    out_png = tmp_path / "curves.png"
    code, out, _ = run(capsys, "sweep", str(both), "--compare", str(only), "--budgets", "60%,100%",
                       "--json", "--plot", str(out_png))
    assert code == 0
    curves = json.loads(out)["curves"]
    assert [c["file"] for c in curves] == [str(both), str(only)]
    assert [p["budget_bytes"] for p in curves[0]["points"]] == [p["budget_bytes"] for p in curves[1]["points"]]
    for with_offload, without in zip(curves[0]["points"], curves[1]["points"]):
        assert with_offload["simulated"]["valid"] and without["simulated"]["valid"]
        assert with_offload["objective"] <= without["objective"] + 1e-9
    # at the file's save budget, offloading the phantoms saves time here
    assert curves[0]["points"][1]["objective"] < curves[1]["points"][1]["objective"]
    assert out_png.read_bytes().startswith(b"\x89PNG")
