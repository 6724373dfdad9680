"""Language-level semantics, on small models solved end to end with both backends.

* the out-of-domain rule: a variable or expression referenced outside its declared domain is 0
  (on either side of a constraint, in the objective, through `t+1`, `next(last(...))`), while a
  param referenced outside its domain is an error;
* logic lowering (implies, or, not, iff, any, all, disjunctions of comparisons): the lowered
  rows are checked exactly against brute-force enumeration of the binaries, and the solved
  optimum against the brute-force optimum;
* sets, params, tables, `if`, `max`/`min` over constants, recursive named expressions.

Every model here is tiny; the whole file runs in a few seconds.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import schedlang
from schedlang.language.errors import SchedError

BACKENDS = ["pyomo", "cvxpy"]


def solve(text: str, backend: str) -> float:
    res = schedlang.load(text=text).solve(backend=backend, solver="highs")
    assert res.status.value == "optimal", (res.status, res.message)
    return res.objective


def brute(n: int, feasible, objective, sense: str = "max") -> float:
    """Best objective over x[1..n] in {0, 1} (x is a dict; use x.get(i, 0) outside 1..n)."""
    values = [objective(x) for bits in itertools.product((0, 1), repeat=n)
              if feasible(x := dict(enumerate(bits, 1)))]
    assert values, "the brute-force model is infeasible"
    return max(values) if sense == "max" else min(values)


def value_of(expr: str, decls: str = "") -> float:
    """The value of a constant expression, read back as the optimum of `minimize expr * z`, z = 1."""
    text = f"model value\n{decls}\nvar z__ continuous [1, 1]\nminimize o: ({expr}) * z__\n"
    return solve(text, "pyomo")


def error_of(text: str) -> SchedError:
    with pytest.raises(SchedError) as info:
        schedlang.load(text=text).solve(backend="pyomo", solver="highs")
    return info.value


# ============================================================================ out of domain is 0

@pytest.mark.parametrize("backend", BACKENDS)
def test_var_outside_domain_is_zero_on_the_left(backend):
    # x[i+1] at i = 3 is x[4], outside 1..3: 0, so x[3] may be 1 whatever happens
    text = """model t
var x[i in 1..3] binary
constraint c[i in 1..3]: x[i] + x[i+1] <= 1
maximize o: x[1] + x[2] + 3 * x[3]
"""
    want = brute(3, lambda x: all(x[i] + x.get(i + 1, 0) <= 1 for i in (1, 2, 3)),
                 lambda x: x[1] + x[2] + 3 * x[3])
    assert want == 4
    assert solve(text, backend) == pytest.approx(want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_var_outside_domain_is_zero_on_the_right(backend):
    # x[i] <= x[i+1]: at i = 3 the right side is x[4] = 0, which forces x[3] = 0, then x[2], x[1]
    text = """model t
var x[i in 1..3] binary
constraint c[i in 1..3]: x[i] <= x[i + 1]
maximize o: sum(i in 1..3) x[i]
"""
    assert solve(text, backend) == pytest.approx(0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_var_outside_domain_on_both_sides(backend):
    # x[i-1] is 0 at i = 1 (left), x[i+1] is 0 at i = 3 (right)
    text = """model t
var x[i in 1..3] binary
constraint c[i in 1..3]: x[i - 1] + x[i] <= 2 * x[i + 1] + 1
maximize o: 2 * x[1] + x[2] + x[3]
"""
    want = brute(3, lambda x: all(x.get(i - 1, 0) + x[i] <= 2 * x.get(i + 1, 0) + 1 for i in (1, 2, 3)),
                 lambda x: 2 * x[1] + x[2] + x[3])
    assert solve(text, backend) == pytest.approx(want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_var_outside_domain_in_the_objective(backend):
    text = """model t
var x[i in 1..3] binary
maximize o: sum(i in 1..3) (x[i] + 5 * x[i + 1]) + 7 * x[9]
"""
    # x[4] and x[9] are 0: 1+1+1 + 5*(x2 + x3) = 13
    assert solve(text, backend) == pytest.approx(13)


@pytest.mark.parametrize("backend", BACKENDS)
def test_expr_outside_domain_is_zero(backend):
    text = """model t
var x[i in 1..3] binary
expr e[i in 1..3] = 2 * x[i]
expr seven[i in 1..3] = 7
constraint c[i in 1..3]: e[i] + e[i + 1] <= 2
maximize o: sum(i in 1..3) (x[i] + seven[i + 1])
"""
    # e[4] = 0 and seven[4] = 0: x = (1, 0, 1) gives 2, plus seven[2] + seven[3] = 14
    want = brute(3, lambda x: all(2 * x[i] + 2 * x.get(i + 1, 0) <= 2 for i in (1, 2, 3)),
                 lambda x: x[1] + x[2] + x[3]) + 14
    assert want == 16
    assert solve(text, backend) == pytest.approx(want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_next_of_last_and_prev_of_first_are_outside(backend):
    text = """model t
set V = {"a", "b", "c"}
var x[v in V] binary
constraint after_last: x[next(last(V))] >= 0
constraint c[v in V]: x[v] + x[next(v)] <= 1
constraint d[v in V]: x[prev(v)] + x[v] <= 1
maximize o: sum(v in V) x[v] + 10 * x[next(last(V))] + 10 * x[prev(first(V))]
"""
    # a path a - b - c: at most a and c
    assert solve(text, backend) == pytest.approx(2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_shift_on_an_ordered_set_of_names(backend):
    # t+1 / t-1 move along the set's order; past either end they are outside (0)
    text = """model t
set T = {"s1", "s2", "s3", "s4"}
param gain = {"s1": 1, "s2": 2, "s3": 4, "s4": 8}
var x[t in T] binary
constraint one_of_neighbours[t in T]: x[t] + x[t + 1] <= 1
constraint back[t in T]: x[t - 1] <= 1
maximize o: sum(t in T) gain[t] * x[t]
"""
    gain = {1: 1, 2: 2, 3: 4, 4: 8}
    want = brute(4, lambda x: all(x[i] + x.get(i + 1, 0) <= 1 for i in range(1, 5)),
                 lambda x: sum(gain[i] * x[i] for i in gain))
    assert want == 10
    assert solve(text, backend) == pytest.approx(want)


def test_param_outside_domain_is_an_error():
    err = error_of("""model t
set V = 1..3
param w[v in V] = 2
var x[v in 1..4] binary
minimize o: sum(v in 1..4) w[v] * x[v]
""")
    assert str(err) == ("<input>:5:28: error: param 'w' has no value for [4] "
                        "(outside its declared domain)")
    assert err.exit_code == 2


def test_param_outside_domain_through_a_shift_names_the_key():
    err = error_of("""model t
set V = 1..3
param w[v in V] = 2
var x[v in V] binary
minimize o: sum(v in V) w[v + 1] * x[v]
""")
    assert "None" not in str(err)


# ============================================================================ logic lowering

def feasible_points(text: str, var: str = "x") -> set[tuple]:
    """The values of `var` (in key order) for which the lowered rows have a solution: every
    other column (indicators of disjuncts, ...) is enumerated too, so all must be integral."""
    ir = schedlang.load(text=text).lower()
    A, lo, hi = ir.stacked()
    lb, ub = ir.column_bounds()
    assert ir.integrality().all(), "the exact check enumerates integral columns only"
    assert np.isfinite(lb).all() and np.isfinite(ub).all()
    fam = ir.family(var)
    mine = list(fam.columns)
    others = [c for c in range(ir.n_columns) if c not in fam.columns]
    ranges = [range(int(lb[c]), int(ub[c]) + 1) for c in range(ir.n_columns)]
    out = set()
    for point in itertools.product(*(ranges[c] for c in mine)):
        for rest in itertools.product(*(ranges[c] for c in others)):
            v = np.zeros(ir.n_columns)
            v[mine] = point
            v[others] = rest
            r = A @ v
            if np.all(r >= lo - 1e-9) and np.all(r <= hi + 1e-9):
                out.add(point)
                break
    return out


def expected_points(n: int, pred) -> set[tuple]:
    return {bits for bits in itertools.product((0, 1), repeat=n) if pred(dict(enumerate(bits, 1)))}


LOGIC = {
    # name: (n, constraint body over x[1..n], predicate)
    "implies": (3, "x[1] implies x[2]", lambda x: not x[1] or x[2]),
    "and_implies_or": (4, "x[1] and x[2] implies x[3] or x[4]",
                       lambda x: not (x[1] and x[2]) or x[3] or x[4]),
    "or_of_literals": (3, "x[1] or x[2] or not x[3]", lambda x: x[1] or x[2] or not x[3]),
    "not_and": (3, "not (x[1] and x[2])", lambda x: not (x[1] and x[2])),
    "not_or": (3, "not (x[1] or x[3])", lambda x: not (x[1] or x[3])),
    "iff": (3, "x[1] iff x[2]", lambda x: x[1] == x[2]),
    "iff_and": (3, "x[1] iff (x[2] and x[3])", lambda x: x[1] == (x[2] and x[3])),
    "not_iff": (3, "not (x[1] iff x[3])", lambda x: x[1] != x[3]),
    "any": (4, "any(i in 2..4) x[i]", lambda x: x[2] or x[3] or x[4]),
    "all_implies": (4, "all(i in 1..3) x[i] implies x[4]",
                    lambda x: not (x[1] and x[2] and x[3]) or x[4]),
    "any_implies_all": (5, "any(i in 1..2) x[i] implies all(j in 3..5) x[j]",
                        lambda x: not (x[1] or x[2]) or (x[3] and x[4] and x[5])),
    "not_any": (4, "not any(i in 1..3) x[i]", lambda x: not (x[1] or x[2] or x[3])),
    "implies_comparison": (3, "x[1] implies x[2] + x[3] >= 2", lambda x: not x[1] or x[2] + x[3] >= 2),
    "comparison_implies": (3, "x[1] + x[2] >= 1 implies x[3]", lambda x: not (x[1] + x[2] >= 1) or x[3]),
    "or_of_comparisons": (4, "x[1] + x[2] >= 2 or x[3] + x[4] >= 2",
                          lambda x: x[1] + x[2] >= 2 or x[3] + x[4] >= 2),
    "or_of_comparison_and_literal": (4, "x[1] + x[2] + x[3] <= 1 or x[4]",
                                     lambda x: x[1] + x[2] + x[3] <= 1 or x[4]),
    "not_comparison": (3, "not (x[1] + x[2] >= 2)", lambda x: x[1] + x[2] <= 1),
    "strict_on_binaries": (3, "x[1] + x[2] < x[3] + 1", lambda x: x[1] + x[2] < x[3] + 1),
    "indexed_or": (6, "all((i, j) in {(1, 2), (3, 4), (5, 6)}) (x[i] or x[j])",
                   lambda x: all(x[2 * i - 1] or x[2 * i] for i in (1, 2, 3))),
    "chain_implies": (5, "all((i, j) in {(1, 2), (2, 3), (3, 4), (4, 5)}) (x[i] implies x[j])",
                        lambda x: all(not x[i] or x[i + 1] for i in (1, 2, 3, 4))),
}

# objectives that push against the constraint in different directions
WEIGHTS = [(3, -1, 2, -2, 1, 1), (-2, 3, -1, 2, -1, 2), (1, 1, 1, 1, 1, 1)]


def logic_model(n: int, body: str, weights) -> str:
    terms = " + ".join(f"({w}) * x[{i}]" for i, w in zip(range(1, n + 1), weights))
    return f"model logic\nvar x[i in 1..{n}] binary\nconstraint c: {body}\nmaximize o: {terms}\n"


@pytest.mark.parametrize("name", sorted(LOGIC))
def test_logic_lowering_is_exact(name):
    n, body, pred = LOGIC[name]
    got = feasible_points(logic_model(n, body, WEIGHTS[0]))
    assert got == expected_points(n, pred)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(LOGIC))
def test_logic_optimum_matches_brute_force(name, backend):
    n, body, pred = LOGIC[name]
    for weights in WEIGHTS[:2]:
        want = brute(n, pred, lambda x, weights=weights: sum(w * x[i] for i, w in zip(range(1, n + 1), weights)))
        assert solve(logic_model(n, body, weights), backend) == pytest.approx(want), weights


@pytest.mark.parametrize("backend", BACKENDS)
def test_or_of_comparisons_on_integers(backend):
    # y != 2 written as the checker suggests; an indicator variable per disjunct
    text = """model t
var y integer [0, 4]
var b binary
constraint not_two: y <= 1 or y >= 3
constraint link: b implies y >= 2
maximize o: 10 * b - y
"""
    # b = 1 needs y >= 2 and y != 2: y = 3, objective 7
    assert solve(text, backend) == pytest.approx(7)
    pts = feasible_points(text, "y")
    assert pts == {(0,), (1,), (3,), (4,)}


def test_logic_over_an_index_with_out_of_domain_literals():
    # FREE-like: x[i] implies not x[i+1]; x[4] is outside (0), so `not x[4]` holds
    text = """model t
var x[i in 1..3] binary
constraint c[i in 1..3]: x[i] implies not x[i + 1]
maximize o: sum(i in 1..3) x[i]
"""
    assert feasible_points(text) == expected_points(
        3, lambda x: all(not x[i] or not x.get(i + 1, 0) for i in (1, 2, 3)))


# ============================================================================ sets

VALS = 'param val = {1: 10, 2: 20, 3: 30, 4: 40, 5: 50, 6: 60}\nset A = 1..5\nset B = {2, 4, 6}'


@pytest.mark.parametrize("expr, want", [
    ("card(A)", 5),
    ("card(2..4)", 3),
    ("card(A union B)", 6),
    ("sum(i in A union B) val[i]", 210),
    ("sum(i in A diff B) val[i]", 10 + 30 + 50),
    ("sum(i in A inter B) val[i]", 20 + 40),
    ("sum(i in {i in A where val[i] > 25}) val[i]", 30 + 40 + 50),
    ("sum(i in {i in A where i not in B}) val[i]", 10 + 30 + 50),
    ("card({(i, j) for i in A, j in A where val[i] < val[j]})", 10),
    ("sum(p in {val[i] / 10 for i in B}) 1", 3),
    ("card({i in A, j in B where i == j})", 2),
    ("val[first(A)] + val[last(A)]", 60),
    ("val[next(first(A))] + val[prev(last(A))]", 20 + 40),
    ("val[next(first(B), B)] + val[prev(last(B), B)]", 40 + 40),
    ("sum(i in A where i != last(A)) val[i + 1]", 20 + 30 + 40 + 50),
    ("sum(i in A where i != first(A)) val[i - 1]", 10 + 20 + 30 + 40),
    ("ord(last(A)) + ord(first(B))", 6),
    ("max(i in A) val[i]", 50),
    ("min(i in A diff {1}) val[i]", 20),
    ("max(i in B) val[i] - min(i in B) val[i]", 40),
    ("sum(i in A) (if val[i] > 25 then 1 else 0)", 3),
    ("if card(B) == 3 then 7 else 0", 7),
])
def test_set_and_param_expressions(expr, want):
    assert value_of(expr, VALS) == pytest.approx(want)


def test_indexed_sets():
    decls = VALS + "\nset ABOVE[i in 1..3] = {j in A where val[j] > val[i]}"
    assert value_of("sum(i in 1..3) card(ABOVE[i])", decls) == pytest.approx(4 + 3 + 2)
    assert value_of("sum(i in 1..3, j in ABOVE[i]) val[j]", decls) == pytest.approx(
        (20 + 30 + 40 + 50) + (30 + 40 + 50) + (40 + 50))


def test_params_from_params_and_tables():
    decls = """param a = 3
param b = 2 * a + 1
param c[i in 1..3] = b * i_val[i]
param i_val = {1: 1, 2: 2, 3: 3}
param w = {"alpha": 1.5, "beta": 2}
param pair = {("alpha", 1): 4, ("beta", 2): 6}
param big[i in 1..3] = if c[i] > 10 then c[i] else 0
param top = max(i in 1..3) c[i]"""
    assert value_of("b", decls) == pytest.approx(7)
    assert value_of("sum(i in 1..3) c[i]", decls) == pytest.approx(7 * 6)
    assert value_of('w["alpha"] + w["beta"]', decls) == pytest.approx(3.5)
    assert value_of('pair["alpha", 1] + pair["beta", 2]', decls) == pytest.approx(10)
    assert value_of("sum(i in 1..3) big[i]", decls) == pytest.approx(14 + 21)
    assert value_of("top", decls) == pytest.approx(21)


def test_quantities_in_params():
    assert value_of("2MiB / 1KiB", "") == pytest.approx(2048)
    assert value_of("p", "param p = 3ms / 1us") == pytest.approx(3000)


@pytest.mark.parametrize("backend", BACKENDS)
def test_if_with_variables(backend):
    text = """model t
param w = {1: 3, 2: -1, 3: 2}
var x[i in 1..3] binary
maximize o: sum(i in 1..3) (if w[i] > 0 then w[i] * x[i] else 0)
"""
    assert solve(text, backend) == pytest.approx(5)


def test_table_param_keys_bare_or_quoted():
    # a bare key is an element's name: {a: 1} is {"a": 1}
    assert value_of('w["a"] + w["b"]', "param w = {a: 1, b: 2.5}") == pytest.approx(3.5)
    assert value_of('w["a"] + w["b"]', 'param w = {"a": 1, b: 2.5}') == pytest.approx(3.5)
    assert value_of('w["a", 2]', "param w = {(a, 1): 4, (a, 2): 6}") == pytest.approx(6)


# ============================================================================ named expressions

@pytest.mark.parametrize("backend", BACKENDS)
def test_recursive_expression_equals_the_sum_written_out(backend):
    head = """model t
param w = {1: 5, 2: 4, 3: 3, 4: 2, 5: 6}
var x[i in 1..5] binary
"""
    recursive = head + """expr acc[i in 1..5] = acc[i - 1] + x[i]
constraint cap[i in 1..5]: acc[i] <= 2
constraint tail: acc[5] - acc[3] >= 1
maximize o: sum(i in 1..5) w[i] * x[i] - acc[1]
"""
    written = head + """set I = 1..5
constraint cap[i in I]: sum(j in I where ord(j) <= ord(i)) x[j] <= 2
constraint tail: x[4] + x[5] >= 1
maximize o: sum(i in 1..5) w[i] * x[i] - x[1]
"""
    want = brute(5, lambda x: sum(x.values()) <= 2 and x[4] + x[5] >= 1,
                 lambda x: 5 * x[1] + 4 * x[2] + 3 * x[3] + 2 * x[4] + 6 * x[5] - x[1])
    assert want == 10
    assert solve(recursive, backend) == pytest.approx(want)
    assert solve(written, backend) == pytest.approx(want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_mutually_recursive_expressions_over_names(backend):
    text = """model t
set T = {"a", "b", "c", "d"}
var x[t in T] binary
expr even[t in T] = odd[t - 1] + x[t]
expr odd[t in T] = even[t - 1]
constraint cap: even[last(T)] + odd[last(T)] <= 1
maximize o: sum(t in T) x[t]
"""
    # even[d] + odd[d] = x[a] + x[b] + x[c] + x[d]
    assert solve(text, backend) == pytest.approx(1)


def test_ord_of_a_range_element_inside_an_indexed_constraint():
    text = """model t
var x[i in 1..3] binary
constraint c[i in 1..2]: sum(j in 1..3 where ord(j) <= ord(i)) x[j] <= 1
maximize o: sum(i in 1..3) x[i]
"""
    assert solve(text, "pyomo") == pytest.approx(2)


def test_shift_of_a_range_element_means_the_same_in_every_context():
    scalar = "model t\nvar x[i in 1..4] binary\nconstraint c: sum(j in 1..3) x[j + 1] >= 3\nmaximize o: x[1]\n"
    indexed = scalar.replace("constraint c:", "constraint c[k in 1..2]:")
    statuses = []
    for text in (scalar, indexed):
        statuses.append(schedlang.load(text=text).solve(backend="pyomo", solver="highs").status)
    assert statuses[0] == statuses[1]


def test_aggregate_in_a_param_with_an_empty_domain():
    decls = "set E = {i in 1..3 where i in {7}}\nparam p[v in E] = max(j in E) 1"
    assert value_of("1 + sum(v in E) p[v]", decls) == pytest.approx(1)


DIAMOND = """graph diamond {
  node a time 1 size 1MiB
  node b time 2 size 1MiB
  node c time 4 size 1MiB
  node d time 8 size 1MiB
  node e time 16 size 1MiB
  node f time 32 size 1MiB
  edge a -> b, c
  edge b -> d
  edge c -> d
  edge d -> e
}"""


@pytest.mark.parametrize("expr, want", [
    ("sum(v in nodes) card(ancestors(v))", 0 + 1 + 1 + 3 + 4 + 0),
    ("sum(v in nodes, u in ancestors(v)) time(u)", 1 + 1 + (1 + 2 + 4) + (1 + 2 + 4 + 8)),
    ("sum(v in nodes, w in descendants(v)) time(w)", (2 + 4 + 8 + 16) + (8 + 16) * 2 + 16),
    ("card(descendants(\"f\")) + card(ancestors(\"f\"))", 0),
])
def test_ancestors_and_descendants_follow_paths_not_just_edges(expr, want):
    assert value_of(expr, DIAMOND) == pytest.approx(want)
