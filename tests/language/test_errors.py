"""Golden error suite: one small bad file per kind of user error, with the exact diagnostics.

Each `tests/errors/eNNN_name.sched` has a `tests/errors/eNNN_name.expected` next to it holding
the exact stderr of `schedlang check FILE` (or of `schedlang solve FILE` when the file's first
line is `# command: solve`: errors that only show when the model is instantiated). Paths are
relative to the repository root, where the CLI is run from.

To regenerate after a deliberate change of wording (then review every diff):

    SCHEDLANG_UPDATE_GOLDEN=1 pytest tests/language/test_errors.py
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from schedlang.cli import main as cli

from ..paths import ROOT

ERRORS = ROOT / "tests" / "errors"
CASES = sorted(p.relative_to(ROOT).as_posix() for p in ERRORS.glob("e[0-9][0-9][0-9]_*.sched"))
UPDATE = os.environ.get("SCHEDLANG_UPDATE_GOLDEN") == "1"
LOCATED = re.compile(r"^(?P<path>[^:\n]+):(?P<line>\d+):(?P<col>\d+): (error|note): \S")


def command(case: str) -> str:
    first = (ROOT / case).read_text().splitlines()[:1]
    m = re.match(r"#\s*command:\s*(\w+)", first[0]) if first else None
    return m.group(1) if m else "check"


def expected_path(case: str) -> Path:
    return ROOT / Path(case).with_suffix(".expected")


@pytest.fixture
def at_root(monkeypatch):
    monkeypatch.chdir(ROOT)


def test_cases_exist():
    assert len(CASES) >= 40
    numbers = [Path(c).name[:4] for c in CASES]
    assert len(numbers) == len(set(numbers)), "two golden files share a number"
    if not UPDATE:
        orphans = sorted(p.name for p in ERRORS.glob("*.expected")
                         if not p.with_suffix(".sched").exists())
        assert not orphans, f"expected files without a .sched: {orphans}"


@pytest.mark.parametrize("case", CASES)
def test_golden(case, capsys, at_root):
    cmd = command(case)
    assert cmd in ("check", "solve")
    code = cli.main([cmd, case])
    out, err = capsys.readouterr()
    exp = expected_path(case)
    if UPDATE:
        exp.write_text(err)
    assert code == 2, f"{cmd} {case} exited {code}; stderr:\n{err}"
    assert err == exp.read_text()
    # every line is `path:line:col: error: message`, located in this case's file (or a file it uses)
    lines = err.splitlines()
    assert lines
    for line in lines:
        m = LOCATED.match(line)
        assert m, f"not a located diagnostic: {line!r}"
        assert int(m["line"]) >= 1 and int(m["col"]) >= 1
    assert LOCATED.match(lines[0])["path"] == case
    assert "Traceback" not in err


@pytest.mark.parametrize("case", [
    "tests/errors/e004_missing_closing_bracket.sched",   # syntax
    "tests/errors/e044_cycle.sched",                     # graph data
    "tests/errors/e080_missing_budget.sched",            # instantiation, via `solve`
])
def test_golden_subprocess(case):
    """The installed entry point: exit code 2, the exact diagnostic, no traceback."""
    proc = subprocess.run([sys.executable, "-m", "schedlang.cli", command(case), case], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr == expected_path(case).read_text()
    assert proc.stdout == ""
