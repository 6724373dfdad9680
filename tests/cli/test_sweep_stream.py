"""`sweep --out FILE.jsonl` streams the points as they finish; `--resume` keeps them (issue 11)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from schedlang import sweep as sweep_module
from schedlang.cli.main import main

from ..paths import ROOT

CHAIN = str(ROOT / "examples" / "chain.sched")
BUDGETS = "60%..100%/3"


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def lines_of(text):
    return [json.loads(x) for x in text.split("\n") if x]


def lines(path):
    return lines_of(path.read_text())


def without_timings(obj):
    return {k: v for k, v in obj.items() if k not in ("timings", "file")}


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    """One full sweep with --out and --json: the stream and the printed points."""
    out = tmp_path_factory.mktemp("sweep") / "points.jsonl"
    code = main(["sweep", CHAIN, "--budgets", BUDGETS, "--out", str(out), "--json"])
    assert code == 0
    return out, lines(out)


def test_out_has_one_line_per_budget(full):
    out, points = full
    assert [p["file"] for p in points] == [CHAIN] * 3
    assert [p["status"] for p in points] == ["optimal"] * 3
    budgets = [p["budget_bytes"] for p in points]
    assert budgets == sorted(budgets) and len(set(budgets)) == 3
    assert all(isinstance(p["plan"], list) and p["plan"] for p in points)
    assert out.read_text().endswith("\n")


def test_resume_after_a_kill_solves_only_the_missing_budgets(full, tmp_path, capsys, monkeypatch):
    """The file as a kill leaves it: two points and a third line cut short. --resume solves
    the third budget only, and prints the points of a full run."""
    _, points = full
    log = tmp_path / "points.jsonl"
    text = "".join(json.dumps(p) + "\n" for p in points[:2]) + json.dumps(points[2])[:40]
    log.write_text(text)
    solved = []
    real = sweep_module.solve_at

    def counting(program, budget, **kw):
        solved.append(budget)
        return real(program, budget, **kw)

    monkeypatch.setattr(sweep_module, "solve_at", counting)
    code, out, _ = run(capsys, "sweep", CHAIN, "--budgets", BUDGETS, "--out", str(log),
                       "--resume", "--json")
    assert code == 0
    assert solved == [points[2]["budget_bytes"]]
    printed = json.loads(out)
    # the resumed points are given back as they were stored; the new one as a full run has it
    assert [without_timings(p) for p in printed[:2]] == [without_timings(p) for p in points[:2]]
    assert printed[2]["objective"] == pytest.approx(points[2]["objective"])
    assert [p["status"] for p in printed] == [p["status"] for p in points]
    stored = lines(log)  # the cut line is gone, the new point appended whole
    assert len(stored) == 3 and stored[2]["budget_bytes"] == points[2]["budget_bytes"]
    # a second resume has nothing left to solve
    solved.clear()
    code, out2, _ = run(capsys, "sweep", CHAIN, "--budgets", BUDGETS, "--out", str(log),
                        "--resume", "--json")
    assert code == 0 and solved == []
    assert [without_timings(p) for p in json.loads(out2)] == [without_timings(p) for p in printed]


def test_without_resume_the_file_starts_again(full, tmp_path, capsys):
    _, points = full
    log = tmp_path / "points.jsonl"
    log.write_text(json.dumps(points[0]) + "\n")
    assert run(capsys, "sweep", CHAIN, "--budgets", "100%", "--out", str(log))[0] == 0
    assert [p["budget_bytes"] for p in lines(log)] == [points[2]["budget_bytes"]]


def test_resume_errors_are_located(full, tmp_path, capsys):
    _, points = full
    assert run(capsys, "sweep", CHAIN, "--budgets", BUDGETS, "--resume")[0] == 2
    log = tmp_path / "points.jsonl"
    log.write_text(json.dumps(points[0]) + "\nnot json\n" + json.dumps(points[1]) + "\n")
    code, _, err = run(capsys, "sweep", CHAIN, "--budgets", BUDGETS, "--out", str(log), "--resume")
    assert code == 2 and err.startswith(f"{log}:2:1: error: not a sweep point (JSON)")
    log.write_text(json.dumps({**points[0], "solver": "glpk"}) + "\n")
    code, _, err = run(capsys, "sweep", CHAIN, "--budgets", BUDGETS, "--out", str(log), "--resume")
    assert code == 2 and "resume with the same options" in err


def test_points_survive_sigkill(tmp_path):
    """A sweep killed mid-way keeps every point whose line it finished before the kill; a kill
    during a write can cut the last line (the kernel stops a write at a page boundary), and
    `--resume` drops that line, solves its budget again and leaves a log of whole lines."""
    log = tmp_path / "points.jsonl"
    budgets = "60%..100%/5"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "schedlang.cli", "sweep", CHAIN, "--budgets",
                             budgets, "--out", str(log), "--json"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if log.exists() and log.read_text().count("\n") >= 1:
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    text = log.read_text()
    whole = text[:text.rfind("\n") + 1]  # whatever follows the last newline was cut by the kill
    kept = lines_of(whole)
    assert 1 <= len(kept) <= 5
    assert all(p["status"] == "optimal" and p["plan"] for p in kept)
    code = main(["sweep", CHAIN, "--budgets", budgets, "--out", str(log), "--resume", "--json"])
    assert code == 0
    after = lines(log)
    assert log.read_text().endswith("\n") and len(after) == 5
    assert [without_timings(p) for p in after[:len(kept)]] == [without_timings(p) for p in kept]
