"""`schedlang sweep --ray`: the budgets as Ray tasks give the serial sweep's results; without
Ray installed, a clear error (exit 2) before any work."""
from __future__ import annotations

import json
import sys

import pytest

from schedlang.cli import main
from .paths import ROOT

CHAIN = str(ROOT / "examples" / "chain.sched")
BUDGETS = "60%..100%/3"


def test_without_ray_a_clear_error(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    code = main(["sweep", CHAIN, "--budgets", BUDGETS, "--ray"])
    err = capsys.readouterr().err
    assert code == 2
    assert "--ray" in err and "pip install" in err and "schedlang[ray]" in err
    assert "Traceback" not in err


def test_the_core_does_not_import_ray():
    import subprocess

    code = ("import sys, schedlang, schedlang.sweep, schedlang.cli, schedlang.parametric; "
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
    keys = ("budget_bytes", "status", "objective", "budget_percent", "overhead")
    assert [[p[k] for k in keys] for p in on_ray] == [[p[k] for k in keys] for p in serial]
    assert all(p["simulated"]["valid"] for p in on_ray)
    stored = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(p["budget_bytes"] for p in stored) == [p["budget_bytes"] for p in serial]
