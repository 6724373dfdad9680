"""Extending a model without copying it (docs/language.md, "Extending a model").

* `expr NAME[...] += term` and `constraint NAME[...]: lhs/rhs += term` add the term on the
  rows of the domain written there, and nowhere else: the model is the one with the term
  written into the declaration (same rows, same optimum);
* a redefinition or a `drop` of NAME discards the terms added before it;
* `when COND` before a declaration: with COND false the declaration is absent (no columns, no
  rows; a reference to its variable or expression reads 0, its set is empty; a param is an
  error where it is read), with COND true nothing changes;
* `if c then a else b` evaluates a only where c holds and b only where it does not;
* the lint: a binding that binds no new name (`sum(t in K)` inside a scope that binds t)
  is reported as a located warning, the idiomatic `(k, o) in OPT` with k bound is not, and the
  shipped models have none.
"""
from __future__ import annotations

import pytest

import schedlang
from schedlang.cli import main as cli
from schedlang.language.errors import CheckError, DataError
from schedlang.language.program import load_program
from schedlang.language.resources import models_dir, shipped_models

BASE = """model base
set T = 1..4
var x[t in T] binary
expr load[t in T] = x[t]
constraint cap[t in T]: load[t] <= 1
constraint total: sum(t in T) x[t] <= 2
maximize o: sum(t in T) x[t]
"""


@pytest.fixture
def base(tmp_path):
    path = tmp_path / "base.sched"
    path.write_text(BASE)
    return f'use "{path}"\n'


def solved(text: str) -> float:
    res = schedlang.load(text=text).solve(backend="pyomo", solver="highs")
    assert res.status.value == "optimal", (res.status, res.message)
    return res.objective


def rows(text: str) -> dict:
    """name -> sorted rows (keys, bounds, coefficients by column name) of the lowered model."""
    ir = schedlang.load(text=text).lower()
    names = [f"{v.name}{k}" for v in ir.variables for k in v.keys]
    out = {}
    for b in ir.constraints:
        A = b.A.tocsr()
        out[b.name] = sorted(
            (b.keys[i], float(b.lo[i]), float(b.hi[i]),
             tuple(sorted((names[c], float(v)) for c, v in zip(A.indices[A.indptr[i]:A.indptr[i + 1]],
                                                              A.data[A.indptr[i]:A.indptr[i + 1]]) if v)))
            for i in range(A.shape[0]))
    return out


# ============================================================================ +=

def test_expr_term_goes_to_the_rows_of_its_domain_only(base):
    # load[3] and load[4] get +1: x[3] and x[4] must be 0; the total still allows 2
    assert solved(base + "expr load[t in T where ord(t) >= 3] += 1\n") == pytest.approx(2)
    assert solved(base + "expr load[t in T where ord(t) >= 2] += 1\n") == pytest.approx(1)


def test_extended_model_is_the_model_with_the_term_written_in(base):
    extended = base + "expr load[t in T where ord(t) >= 3] += 0.5 * x[t - 1]\n" + \
        "constraint total: lhs += x[1]\nconstraint total: rhs += 1\n"
    written = BASE.replace("expr load[t in T] = x[t]",
                           "expr load[t in T] = x[t] + (if ord(t) >= 3 then 0.5 * x[t - 1] else 0)")
    written = written.replace("constraint total: sum(t in T) x[t] <= 2",
                              "constraint total: sum(t in T) x[t] + x[1] <= 2 + 1")
    assert rows(extended) == rows(written)


def test_terms_added_to_a_constraint_side(base):
    assert solved(base + "constraint total: rhs += 1\n") == pytest.approx(3)
    assert solved(base + "constraint total: lhs += 1\n") == pytest.approx(1)
    # several terms add up, each on its own rows
    text = (base + "constraint cap[t in T where ord(t) == 1]: lhs += 1\n"
            "constraint cap[t in T where ord(t) == 2]: lhs += 1\n")
    assert solved(text) == pytest.approx(2)  # x[1] = x[2] = 0, x[3] + x[4] <= 2


def test_redefinition_or_drop_discards_added_terms(base, tmp_path):
    mid = tmp_path / "mid.sched"
    mid.write_text(base + "constraint total: rhs += -2\nexpr load[t in T] += 1\n")
    assert solved(f'use "{mid}"\n') == pytest.approx(0)
    redefined = f'use "{mid}"\nconstraint total: sum(t in T) x[t] <= 3\nexpr load[t in T] = x[t]\n'
    assert solved(redefined) == pytest.approx(3)
    assert solved(f'use "{mid}"\ndrop total\nexpr load[t in T] = x[t]\n') == pytest.approx(4)


def test_term_outside_the_declared_domain_is_a_located_error(base):
    with pytest.raises(DataError, match=r"load\[5\], which is outside the domain of 'load'") as info:
        schedlang.load(text=base + "expr load[t in 1..5] += 1\n").lower()
    assert info.value.loc.line == 2


def test_decode_roles_are_added_to_the_used_decode(tmp_path):
    base = tmp_path / "base.sched"
    base.write_text(BASE + "decode stages(compute = x, memory = load)\n")
    prog = load_program([], text=f'use "{base}"\ndecode stages += (keep = x)\n')
    assert prog.decode.roles == {"compute": "x", "memory": "load", "keep": "x"}
    with pytest.raises(CheckError, match="decode role 'memory' is already given"):
        load_program([], text=f'use "{base}"\ndecode stages += (memory = x)\n')


# ============================================================================ when

def test_when_false_removes_the_declaration(base):
    guarded = base + "param on = 0\nwhen on == 1\nvar bonus binary\n" \
        "when on == 1\nconstraint none: sum(t in T) x[t] <= 0\n" \
        "when on == 1\nset S = {1, 2}\nmaximize o += 3 * bonus + card(S)\n"
    assert solved(guarded) == pytest.approx(2)  # no bonus column, no `none` row, S empty
    ir = schedlang.load(text=guarded).lower()
    assert {v.name: v.size for v in ir.variables}["bonus"] == 0
    assert "none" not in {b.name for b in ir.constraints}
    on = guarded.replace("param on = 0", "param on = 1")
    assert solved(on) == pytest.approx(0 + 3 + 2)  # `none` holds: x = 0; bonus and S count


def test_when_false_skips_the_declarations_domain_and_added_terms(base):
    # the guard is what keeps 1 / d from being evaluated
    text = base + "param d = 0\nwhen d > 0\nconstraint scaled[t in T where 1 / d > 0]: x[t] <= 0\n" \
        "when d > 0\nexpr load[t in T] += 1 / d\n"
    assert solved(text) == pytest.approx(2)


def test_param_under_a_false_when_is_an_error_where_it_is_read(base):
    text = base + "when 1 > 2\nparam p = 3\nconstraint uses_p: x[1] <= p\n"
    with pytest.raises(DataError, match="param 'p' does not exist here") as info:
        schedlang.load(text=text).lower()
    assert info.value.loc.line == 4


# ============================================================================ if

def test_if_evaluates_only_the_branch_it_takes():
    text = "model m\nparam d = 0\nparam p = if d > 0 then 1 / d else 7\n" \
           "param n = {i0: 0, i1: 1, i2: 2, i3: 3}\n" \
           "param q = sum(i in {\"i0\", \"i1\", \"i2\", \"i3\"}) (if n[i] > 0 then 12 / n[i] else 0)\n" \
           "var z continuous [1, 1]\nminimize o: (p + q) * z\n"
    assert solved(text) == pytest.approx(7 + 12 + 6 + 4)


# ============================================================================ lint

def test_rebound_index_name_is_a_located_warning(tmp_path, capsys):
    path = tmp_path / "m.sched"
    path.write_text("model m\nset K = 1..3\nvar x[t in K] binary\n"
                    "constraint c[t in K]: sum(t in K) x[t] <= 1\n"
                    "constraint ok[t in K]: sum((t, u) in {(a, b) for a in K, b in K}) x[u] <= 2\n"
                    "maximize o: sum(t in K) x[t]\n")
    assert cli.main(["check", str(path)]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith(f"{path}:4:27: warning: 't' is already bound (at {path}:4:14)")


@pytest.mark.parametrize("model", shipped_models())
def test_shipped_models_have_no_lint_warnings(model):
    program = load_program([models_dir() / f"{model}.sched"])
    schedlang.language.check.check_program(program)
    assert program.warnings == []


@pytest.mark.parametrize("example,name", [("chain.sched", "u"), ("tiny_transformer.sched", "c")])
def test_a_users_name_never_makes_errors_in_the_shipped_model(tmp_path, capsys, example, name):
    """`u` (checkmate) and `c` (rockmate) are index names in the shipped models: a user's
    declaration of that name is the user's, and the model still means its index (issue 26:
    8 errors located in models/checkmate.sched)."""
    from ..paths import EXAMPLES

    user = tmp_path / "user.sched"
    node = "f3" if example == "chain.sched" else "block2.fwd"
    counted = "R[t, \"f3\"]" if example == "chain.sched" else "computed[t, \"block2.fwd\"]"
    user.write_text(f'use "{EXAMPLES / example}"\n'
                    f'constraint {name}[t in K where t != "{node}"]:\n    {counted} <= 1\n'
                    .replace("K where", "V where" if example == "chain.sched" else "K where"))
    assert cli.main(["check", str(user)]) == 0, capsys.readouterr().err
    assert capsys.readouterr().err == ""
    plain = schedlang.load(str(EXAMPLES / example)).solve(time_limit=60).objective
    assert schedlang.load(str(user)).solve(time_limit=60).objective == pytest.approx(plain)
