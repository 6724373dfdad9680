"""`schedlang sweep --jobs N` / `--ray`: the budgets on worker processes or as Ray tasks give
the serial sweep's results; without Ray installed, a clear error (exit 2) before any work."""
from __future__ import annotations

import json
import sys

import pytest

from schedlang.cli.main import main
from schedlang.language.errors import SchedError

from .paths import ROOT

CHAIN = str(ROOT / "examples" / "chain.sched")
BUDGETS = "60%..100%/3"


KEYS = ("budget_bytes", "status", "objective", "budget_percent", "overhead")


def test_sweep_on_workers_equals_the_serial_one(capsys, tmp_path):
    out = tmp_path / "points.jsonl"
    code = main(["sweep", CHAIN, "--budgets", "60%..100%/5", "--json", "--jobs", "1"])
    serial = json.loads(capsys.readouterr().out)
    code_jobs = main(["sweep", CHAIN, "--budgets", "60%..100%/5", "--json", "--jobs", "2",
                      "--out", str(out)])
    captured = capsys.readouterr()
    on_jobs = json.loads(captured.out)
    assert code == code_jobs == 0
    assert [[p[k] for k in KEYS] for p in on_jobs] == [[p[k] for k in KEYS] for p in serial]
    assert all(p["simulated"]["valid"] for p in on_jobs)
    assert [p["plan"] is not None for p in on_jobs] == [True] * 5
    stored = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(p["budget_bytes"] for p in stored) == [p["budget_bytes"] for p in serial]
    assert captured.err.count("sweep [") == 5  # one progress line per budget as it comes back


def test_sweep_on_workers_resumes_and_reports_bad_options(capsys, tmp_path):
    out = tmp_path / "points.jsonl"
    assert main(["sweep", CHAIN, "--budgets", "60%,80%", "--json", "--jobs", "1",
                 "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["sweep", CHAIN, "--budgets", "60%..100%/5", "--json", "--jobs", "2",
                 "--out", str(out), "--resume"]) == 0
    captured = capsys.readouterr()
    assert [p["status"] for p in json.loads(captured.out)] == ["optimal"] * 5
    assert captured.err.count(f"from {out}") == 2  # 60% and 80% from the file, 3 solved
    assert len(out.read_text().splitlines()) == 5
    code = main(["sweep", CHAIN, "--budgets", "60%,80%", "--jobs", "2", "--solver", "nosuch"])
    err = capsys.readouterr().err
    assert code == 5 and "nosuch" in err and "Traceback" not in err


def test_neighbour_starts_need_a_serial_sweep():
    from schedlang.sweep import sweep

    with pytest.raises(SchedError, match="serial"):
        sweep(CHAIN, "60%,80%", neighbour=True, jobs=2)


def test_without_ray_a_clear_error(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    code = main(["sweep", CHAIN, "--budgets", BUDGETS, "--ray"])
    err = capsys.readouterr().err
    assert code == 2
    assert "--ray" in err and "pip install" in err and "schedlang[ray]" in err
    assert "Traceback" not in err


def test_the_core_does_not_import_ray():
    import subprocess

    code = ("import sys, schedlang, schedlang.sweep, schedlang.cli.main, schedlang.compile.parametric, "
            "schedlang.parallel; "
            "sys.exit('ray' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


@pytest.mark.slow  # a local Ray instance takes 10-30 s to start
def test_ray_sweep_equals_the_serial_one(capsys, tmp_path):
    pytest.importorskip("ray")
    out = tmp_path / "points.jsonl"
    code = main(["sweep", CHAIN, "--budgets", BUDGETS, "--json"])
    serial = json.loads(capsys.readouterr().out)
    code_ray = main(["sweep", CHAIN, "--budgets", BUDGETS, "--json", "--ray", "--out", str(out)])
    on_ray = json.loads(capsys.readouterr().out)
    assert code == code_ray == 0
    assert [[p[k] for k in KEYS] for p in on_ray] == [[p[k] for k in KEYS] for p in serial]
    assert all(p["simulated"]["valid"] for p in on_ray)
    stored = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(p["budget_bytes"] for p in stored) == [p["budget_bytes"] for p in serial]
