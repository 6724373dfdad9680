"""The command-line contract of architecture.md: outputs, JSON fields and exit codes."""
from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import schedlang
from schedlang.cli.main import main
from schedlang.language.errors import SchedError
from schedlang.plans.plan import Plan

from ..paths import GRAPHS, ROOT

CHAIN = str(ROOT / "examples" / "chain.sched")


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_check_ok(capsys):
    code, out, err = run(capsys, "check", CHAIN, str(ROOT / "models" / "checkmate.sched"))
    assert code == 0 and "ok" in out and err == ""


def test_solve_json_has_the_contract_fields(capsys, tmp_path):
    plan_path = tmp_path / "plan.json"
    code, out, _ = run(capsys, "solve", CHAIN, "--json", "--plan-out", str(plan_path))
    assert code == 0
    res = json.loads(out)
    for key in ("status", "objective", "bound", "gap", "backend", "solver", "model_size", "timings",
                "predicted", "simulated", "plan"):
        assert key in res
    assert res["status"] == "optimal" and res["objective"] == pytest.approx(50)
    assert set(res["model_size"]) == {"variables", "constraints", "nonzeros"}
    for stage in ("parse", "check", "lower", "build", "solve", "decode", "simulate"):
        assert stage in res["timings"]
    assert res["simulated"]["valid"] and res["simulated"]["time"] == pytest.approx(res["objective"])
    assert res["predicted"]["peak_bytes"] == res["simulated"]["peak_bytes"]
    assert res["plan"] == str(plan_path)
    written = json.loads(plan_path.read_text())
    assert written["schema"] == "schedlang.plan/1" and written["graph"] == "chain"
    assert written["budget"]["peak_bytes"] == 120 * 2**20


@pytest.mark.parametrize("backend", ["pyomo", "cvxpy"])
def test_infeasible_budget_exits_3(capsys, backend):
    code, out, _ = run(capsys, "solve", CHAIN, "--budget", "20MiB", "--backend", backend, "--json")
    assert code == 3 and json.loads(out)["status"] == "infeasible"


def test_unknown_solver_exits_5_and_lists_installed(capsys):
    code, _, err = run(capsys, "solve", CHAIN, "--solver", "hihgs")
    assert code == 5
    assert "highs" in err and "available" in err and "Traceback" not in err


def test_bad_budget_exits_2(capsys):
    code, _, err = run(capsys, "solve", CHAIN, "--budget", "3ms")
    assert code == 2 and "--budget: error:" in err and "time" in err


def test_simulate_valid_then_mutated_plan(capsys, tmp_path):
    plan_path = tmp_path / "plan.json"
    assert run(capsys, "solve", CHAIN, "--plan-out", str(plan_path))[0] == 0
    code, out, _ = run(capsys, "simulate", str(plan_path), "--graph", CHAIN)
    assert code == 0 and out.startswith("valid")
    plan = Plan.load(plan_path)
    first_delete = next(i for i, op in enumerate(plan.ops) if op.op == "delete")
    plan.ops.insert(first_delete + 1, plan.ops[first_delete])  # delete the same data twice
    plan.save(plan_path)
    code, out, _ = run(capsys, "simulate", str(plan_path), "--graph", CHAIN)
    assert code == 3 and out.startswith("invalid")


def test_simulate_budget_too_small_is_invalid(capsys, tmp_path):
    plan_path = tmp_path / "plan.json"
    run(capsys, "solve", CHAIN, "--plan-out", str(plan_path))
    code, out, _ = run(capsys, "simulate", str(plan_path), "--graph", CHAIN, "--budget", "100MiB")
    assert code == 3


@pytest.mark.skipif(not (GRAPHS / "vgg16_train.json").exists(), reason="shared graphs not present")
def test_import_then_solve_matches_the_json_graph(capsys, tmp_path):
    # vgg16_test is a forward chain: below 100% no schedule exists (a node needs its input and output)
    out_path = tmp_path / "vgg16.sched"
    code, out, _ = run(capsys, "import", str(GRAPHS / "vgg16_test.json"), "--format", "checkmate-nx",
                       "-o", str(out_path), "--budget", "100%")
    assert code == 0 and out_path.exists()
    assert run(capsys, "check", str(out_path), "--model", "checkmate")[0] == 0
    plan_path = tmp_path / "plan.json"
    code, out, _ = run(capsys, "solve", str(out_path), "--json", "--plan-out", str(plan_path))
    assert code == 0
    # the plan replays on the original JSON graph too
    code, _, _ = run(capsys, "simulate", str(plan_path), "--graph", str(GRAPHS / "vgg16_test.json"))
    assert code == 0


def _training_chain_json(path: Path) -> Path:
    """A 3-layer training chain in Checkmate's networkx node-link JSON: f1 f2 f3 loss g3 g2 g1,
    each gradient node reading its forward node's output."""
    names = ["f1", "f2", "f3", "loss", "g3", "g2", "g1"]
    nodes = [{"id": i, "name": n, "backward": i > 3, "cost_cpu": 1 + i % 3,
              "cost_ram": (4 + i % 2) * 2**20} for i, n in enumerate(names)]
    links = [[i, i + 1] for i in range(6)] + [[2, 4], [1, 5], [0, 6]]
    path.write_text(json.dumps({"directed": True, "multigraph": False, "graph": {},
                                "nodes": nodes,
                                "links": [{"source": a, "target": b} for a, b in links]}))
    return path


def test_solve_and_sweep_read_checkmate_json_as_its_import(capsys, tmp_path):
    """`solve`, `sweep` and `check` take a Checkmate/Moccasin JSON graph as `plan` and `simulate` do:
    the same optimum as the .sched file `import` writes from it; `schedlang.load` given two
    JSON graphs says it takes one."""
    graph = str(_training_chain_json(tmp_path / "chain.json"))
    sched = tmp_path / "chain.sched"
    assert run(capsys, "import", graph, "--format", "checkmate-nx", "-o", str(sched))[0] == 0
    objectives = []
    for source in (graph, str(sched)):
        code, out, _ = run(capsys, "solve", source, "--budget", "80%", "--json")
        assert code == 0
        objectives.append(json.loads(out)["objective"])
    assert objectives[0] == pytest.approx(objectives[1])
    code, out, _ = run(capsys, "sweep", graph, "--budgets", "100%,80%")
    assert code == 0 and "80%" in out
    assert run(capsys, "check", graph)[0] == 0
    with pytest.raises(SchedError, match="one source of graph data at a time"):
        schedlang.load(graph, graph)


def test_bad_input_gives_no_traceback_through_the_script(tmp_path):
    bad = tmp_path / "bad.sched"
    bad.write_text("use checkmate\ngraph g {\n  node a time 1 size 4MiB\n  edge a -> b\n}\n")
    proc = subprocess.run([sys.executable, "-m", "schedlang.cli", "solve", str(bad)],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"{bad}:4:13: error: edge to unknown node 'b'"
    assert "Traceback" not in proc.stderr


def test_wheel_ships_grammar_and_models(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "-q", "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot build a wheel here: {proc.stderr[-300:]}")
    wheel = next(tmp_path.glob("schedlang-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "schedlang/grammar/schedlang.lark" in names
    for model in (ROOT / "models").glob("*.sched"):
        assert f"schedlang/models/{model.name}" in names
    # every subpackage of the source tree is in the wheel (the list in pyproject is explicit)
    for init in (ROOT / "schedlang").rglob("__init__.py"):
        assert init.relative_to(ROOT).as_posix() in names


@pytest.mark.parametrize("argv,needle", [
    (["--backend", "foo"], "invalid choice: 'foo'"),
    (["--time-limit", "-1"], "must not be negative"),
    (["--threads", "x"], "'x' is not a number"),
])
def test_bad_options_exit_2_with_the_flag_named(capsys, argv, needle):
    assert main(["solve", CHAIN, *argv]) == 2
    captured = capsys.readouterr()
    assert needle in captured.err and argv[0] in captured.err and captured.out == ""
    assert main(["solve", CHAIN, *argv, "--json"]) == 2  # --json: one object on stdout
    obj = json.loads(capsys.readouterr().out)
    assert obj["status"] == "error" and obj["exit_code"] == 2 and needle in obj["message"]


def test_model_without_graph_data_says_so(capsys):
    code, _, err = run(capsys, "solve", str(ROOT / "models" / "checkmate.sched"))
    assert code == 2
    assert err.startswith(f"{ROOT / 'models' / 'checkmate.sched'}:") and "no graph data was given" in err


def test_simulate_checks_the_budgets_of_the_graph_file(capsys, tmp_path):
    plan_path = tmp_path / "plan.json"
    assert run(capsys, "solve", CHAIN, "--plan-out", str(plan_path))[0] == 0
    plan = Plan.load(plan_path)
    plan.budget_peak = None  # only the graph file's `budget peak 120MiB` is left to check
    plan.save(plan_path)
    tight = tmp_path / "tight.sched"
    tight.write_text(Path(CHAIN).read_text().replace("budget peak 120MiB", "budget peak 100MiB"))
    code, out, _ = run(capsys, "simulate", str(plan_path), "--graph", str(tight))
    assert code == 3 and "budget" in out
    code, _, _ = run(capsys, "simulate", str(plan_path), "--graph", CHAIN)
    assert code == 0


def test_solve_json_stdout_is_only_json_in_a_fresh_process():
    """HiGHS prints a banner at the first `Highs()` of a process; the MIP-start completion of a
    phase model made that one outside the solve's session, on stdout before the JSON."""
    import os

    proc = subprocess.run([sys.executable, "-m", "schedlang.cli", "solve",
                           str(ROOT / "examples" / "profiled.sched"), "--json"],
                          capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["status"] == "optimal"
