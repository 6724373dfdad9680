"""`schedlang plan`: output, JSON fields, exit codes, --plan-out, --list."""
from __future__ import annotations

import json

import pytest

import schedlang.plans.planners as registry
from schedlang.cli.main import main
from schedlang.plans.planners import Planner
from schedlang.plans.planners.no_recompute import no_recompute_plan

from ..paths import ROOT

CHAIN = str(ROOT / "examples" / "chain.sched")
TINY = str(ROOT / "examples" / "tiny_transformer.sched")
VGG16 = ROOT.parent / "shared" / "graphs" / "vgg16_train.json"


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_list(capsys):
    code, out, _ = run(capsys, "plan", "--list")
    assert code == 0
    for name in ("no_recompute", "checkpoint_all", "chen_sqrt", "chen_greedy",
                 "checkpoint_sequential", "knapsack"):
        assert name in out
    assert "checkmate, layered" in out


def test_list_json(capsys):
    code, out, _ = run(capsys, "plan", "--list", "--json")
    assert code == 0
    rows = json.loads(out)
    by_name = {r["name"]: r for r in rows}
    assert by_name["chen_sqrt"]["views"] == ["checkmate", "layered"]
    assert all(r["description"] for r in rows)


def test_fits_file_budget_exit_0(capsys):
    code, out, err = run(capsys, "plan", CHAIN, "--planner", "chen_sqrt")
    assert code == 0, err
    assert "chen_sqrt" in out and "simulated valid" in out and "overhead" in out
    assert "fits      yes" in out


def test_json_fields(capsys, tmp_path):
    plan_path = tmp_path / "plan.json"
    code, out, _ = run(capsys, "plan", CHAIN, "--planner", "checkpoint_sequential", "--json",
                       "--plan-out", str(plan_path))
    assert code == 0
    res = json.loads(out)
    for key in ("status", "objective", "budget_bytes", "timings", "predicted", "simulated",
                "plan", "planner", "overhead", "fits_budget", "reference"):
        assert key in res
    assert res["status"] == "feasible" and res["fits_budget"] is True
    assert res["budget_bytes"] == 120 * 2**20
    assert res["simulated"]["valid"] and res["simulated"]["peak_bytes"] <= 120 * 2**20
    assert res["objective"] == pytest.approx(res["simulated"]["time"])
    assert res["reference"]["time"] == pytest.approx(45)
    assert res["overhead"] == pytest.approx(res["objective"] / 45 - 1)
    for stage in ("parse", "plan", "simulate"):
        assert stage in res["timings"]
    assert res["plan"] == str(plan_path)
    written = json.loads(plan_path.read_text())
    assert written["schema"] == "schedlang.plan/1" and written["graph"] == "chain"
    assert written["budget"]["peak_bytes"] == 120 * 2**20
    assert written["meta"]["planner"] == "checkpoint_sequential"
    # the written plan replays with `schedlang simulate` against the file's budget
    code, out, _ = run(capsys, "simulate", str(plan_path), "--graph", CHAIN, "--json")
    assert code == 0 and json.loads(out)["valid"]


def test_json_without_plan_out_holds_the_ops(capsys):
    code, out, _ = run(capsys, "plan", CHAIN, "--planner", "no_recompute", "--budget", "100%",
                       "--json")
    res = json.loads(out)
    assert code == 0 and res["overhead"] == 0
    assert isinstance(res["plan"], list) and res["plan"][0]["op"] == "compute"


def test_over_budget_exit_3(capsys):
    code, out, _ = run(capsys, "plan", CHAIN, "--planner", "knapsack", "--budget", "20MiB",
                       "--json")
    assert code == 3
    res = json.loads(out)
    assert res["status"] == "infeasible" and res["fits_budget"] is False
    assert res["simulated"]["valid"] is True  # a plan is still returned, and it replays
    assert any("exceeds the peak budget" in e for e in res["simulated"]["errors"])


def test_over_budget_human_output_exit_3(capsys):
    code, out, _ = run(capsys, "plan", CHAIN, "--planner", "no_recompute")
    assert code == 3 and "fits      NO" in out


def test_unknown_planner_exit_2_with_suggestion(capsys):
    code, _, err = run(capsys, "plan", CHAIN, "--planner", "chen_sqr")
    assert code == 2
    assert "unknown planner 'chen_sqr'" in err and "did you mean 'chen_sqrt'" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("argv", [["plan"], ["plan", CHAIN]])
def test_missing_arguments_exit_2(capsys, argv):
    code, _, err = run(capsys, *argv)
    assert code == 2 and err


def test_bad_file_and_bad_budget_exit_2(capsys, tmp_path):
    code, _, _ = run(capsys, "plan", str(tmp_path / "missing.sched"), "--planner", "chen_sqrt")
    assert code == 2
    code, _, err = run(capsys, "plan", CHAIN, "--planner", "chen_sqrt", "--budget", "lots")
    assert code == 2 and err


def test_not_applicable_exit_2(capsys, monkeypatch):
    only_checkmate = Planner("only_checkmate", "test planner", lambda g, b: no_recompute_plan(g),
                             views=("checkmate",))
    real = registry.planners

    def fake():
        table = dict(real())
        table["only_checkmate"] = only_checkmate
        return table

    monkeypatch.setattr(registry, "planners", fake)
    code, _, err = run(capsys, "plan", TINY, "--planner", "only_checkmate")
    assert code == 2 and "layered" in err
    code, _, _ = run(capsys, "plan", CHAIN, "--planner", "only_checkmate", "--budget", "100%")
    assert code == 0


def test_layered_file_uses_peak_and_save_budgets(capsys):
    code, out, _ = run(capsys, "plan", TINY, "--planner", "knapsack", "--json")
    res = json.loads(out)
    assert code == 0 and res["view"] == "layered"
    assert res["budget_bytes"] == 200 * 2**20 and res["save_budget_bytes"] == 120 * 2**20
    assert res["simulated"]["save_peak_bytes"] <= 120 * 2**20


def test_checkmate_json_graph(capsys):
    if not VGG16.exists():
        pytest.skip(f"{VGG16} not present")
    code, out, _ = run(capsys, "plan", str(VGG16), "--planner", "chen_greedy", "--budget", "90%",
                       "--json")
    res = json.loads(out)
    assert code == 0 and res["status"] == "feasible"
    assert res["budget_bytes"] == 14242598093
    assert 0 <= res["overhead"] < 0.5
