"""Size guards (issue 11): a model whose domains explode stops early, with a located error that
names the declaration, its element count and the limit; `--max-elements` / `max_elements=`
move the limit; `check --stats` shows each declaration's size."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

import schedlang
from schedlang.cli.main import main
from schedlang.compile.sizes import DEFAULT_MAX_ELEMENTS, SizeError

from ..paths import ROOT

EXPLODING = ROOT / "tests" / "errors" / "e091_domain_too_large.sched"
CHAIN = str(ROOT / "examples" / "chain.sched")

SQUARE = """set I = 1..20
set J = 1..30
var x[i in I, j in J] binary
constraint one[i in I]: sum(j in J) x[i, j] >= 1
minimize total: sum(i in I, j in J) x[i, j]
"""


def test_exploding_model_fails_fast_with_little_memory():
    """`check` of a 10^10-element model: exit 2 with a located error, in a fresh process whose
    peak RSS stays that of an import of schedlang (well under 1 GiB; a materialized domain
    would need 75 GiB)."""
    # the peak RSS of this process's own memory: /proc's VmHWM on Linux (getrusage's
    # ru_maxrss survives exec, so it would report a big parent's peak, a pytest worker's)
    code = ("import json, resource, sys\n"
            "from schedlang.cli.main import main\n"
            f"rc = main(['check', {str(EXPLODING)!r}])\n"
            "try:\n"
            "    hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')]\n"
            "    rss = int(hwm[0].split()[1])\n"
            "except (OSError, IndexError):\n"
            "    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "print(json.dumps({'rc': rc, 'rss_kib': rss}))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=False,
                          timeout=120)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["rc"] == 2
    assert "'x' would have 10,000,000,000 elements" in proc.stderr
    assert f"limit of {DEFAULT_MAX_ELEMENTS:,}" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert out["rss_kib"] < 1024 * 1024, f"peak RSS {out['rss_kib']} KiB"


def test_max_elements_moves_the_limit(tmp_path, capsys):
    f = tmp_path / "square.sched"
    f.write_text(SQUARE)
    assert main(["check", str(f), "--max-elements", "599"]) == 2
    err = capsys.readouterr().err
    assert f"{f}:3:5: error: 'x' would have 600 elements" in err and "limit of 599" in err
    assert main(["check", str(f), "--max-elements", "600"]) == 0
    capsys.readouterr()
    assert main(["solve", str(f), "--max-elements", "599", "--json"]) == 2
    refused = json.loads(capsys.readouterr().out)  # --json: the error is one object too
    assert refused["status"] == "error" and "limit of 599" in refused["message"]
    assert main(["solve", str(f), "--max-elements", "600", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["objective"] == pytest.approx(20)


def test_python_argument():
    with pytest.raises(SizeError) as exc:
        schedlang.load(text=SQUARE, max_elements=100).lower()
    assert "'x' would have 600 elements" in exc.value.message and exc.value.loc.line == 3
    assert schedlang.load(text=SQUARE, max_elements=600).solve().objective == pytest.approx(20)


def test_sweep_takes_max_elements(capsys):
    assert main(["sweep", CHAIN, "--budgets", "100%", "--max-elements", "10"]) == 2
    assert "over the limit of 10" in capsys.readouterr().err


def test_stats_match_the_lowered_model(capsys):
    assert main(["check", "--stats", CHAIN]) == 0
    out = capsys.readouterr().out
    ir = schedlang.load(CHAIN).lower()
    table = {}
    for line in out.splitlines()[2:]:
        parts = line.split()
        if parts and parts[0] != "total:" and parts[0] != "ok:":
            table[parts[0]] = [None if p == "-" else int(p.replace(",", "")) for p in parts[-3:]]
    for fam in ir.variables:
        assert table[fam.name][0] == fam.size
    rows = sum(b.A.shape[0] for b in ir.constraints)
    nnz = sum(b.A.nnz for b in ir.constraints)
    assert sum(v[1] for v in table.values() if v[1] is not None) == rows
    assert sum(v[2] for v in table.values() if v[2] is not None) == nnz
    assert f"{rows:,} rows, {nnz:,} nonzeros" in out


def test_stats_without_graph_data(capsys):
    """A model alone: domains over its own sets are counted, those over graph data are not."""
    assert main(["check", "--stats", str(ROOT / "models" / "checkmate.sched")]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines()[2:] if line.strip()}
    assert lines["R"].split()[-3:] == ["-", "-", "-"]
    assert "need graph data" in out
