"""Lowering: sizes that follow the model, join-based index generation, recursion, presolve."""
from __future__ import annotations

import time

import numpy as np
import pytest

import schedlang
from schedlang.compile.presolve import presolve

from ..paths import ROOT


def _ir(text: str):
    return schedlang.load(text=text).lower()


def test_equality_filters_are_joins_not_filtered_products():
    # A product of the ranges would have 10^10 rows; the join generates 10^5.
    n = 100_000
    t0 = time.perf_counter()
    ir = _ir(f"""
        set I = 1..{n}
        var x[i in I, j in I where j == i] binary
        var y[i in I, j in I where j == i - 1] binary
        minimize total: sum(i in I, j in I where j == i) x[i, j] + sum(i in I, j in I where j == i - 1) y[i, j]
    """)
    assert ir.family("x").size == n
    assert ir.family("y").size == n - 1
    assert time.perf_counter() - t0 < 60  # would not finish (nor fit in memory) as a product


def test_bound_names_in_a_pattern_are_matched():
    ir = _ir("""
        set E = {(1, 2), (1, 3), (2, 3)}
        set V = 1..3
        var f[(u, v) in E] binary
        expr out[u in V] = sum((u, w) in E) f[u, w]
        constraint c[u in V]: out[u] <= 1
        minimize z: 0
    """)
    block = ir.constraints[0]
    # row u has one term per edge leaving u: 2, 1, 0 (an empty row is dropped by presolve later)
    counts = np.diff(block.A.indptr)
    assert dict(zip([k[0] for k in block.keys], counts.tolist())) == {1: 2, 2: 1, 3: 0} or \
        dict(zip([k[0] for k in block.keys], counts.tolist())) == {1: 2, 2: 1}


def test_recursive_expression_becomes_auxiliary_variables():
    text = """
        set I = 1..{n}
        var x[i in I] in [0, 1]
        expr acc[i in I] = acc[i - 1] + x[i]
        constraint cap[i in I]: acc[i] <= 3.5
        maximize total: sum(i in I) x[i]
    """
    ir = _ir(text.format(n=200))
    aux = ir.family("acc")
    assert aux.size == 200 and aux.kind == "continuous"
    # linear size: each definition row has at most 3 nonzeros (acc[i], acc[i-1], x[i])
    definition = next(b for b in ir.constraints if b.name == "acc.definition")
    assert definition.A.nnz <= 3 * 200
    for backend in ("pyomo", "cvxpy"):
        res = schedlang.load(text=text.format(n=6)).solve(backend=backend)
        assert res.objective == pytest.approx(3.5)


def test_checkmate_family_sizes_follow_the_formulas():
    prob = schedlang.load(ROOT / "examples" / "chain.sched")
    ir = prob.lower()
    g = prob.graph
    n = len(g.nodes)
    assert ir.family("R").size == n * (n + 1) // 2
    assert ir.family("S").size == n * (n - 1) // 2
    assert ir.family("U").size == n * (n + 1) // 2
    pos = {node.name: i for i, node in enumerate(g.nodes)}
    pairs = [(pos[u], pos[v]) for u, v in g.edges] + [(i, i) for i in range(n)]
    assert ir.family("FREE").size == sum(n - v for _, v in pairs)


def test_presolve_fixes_what_the_domain_forces():
    ir = schedlang.load(ROOT / "examples" / "chain.sched").lower()
    reduced, post = presolve(ir)
    # R[t, t] == 1 are singleton rows: at least those columns and rows go
    n = 13
    assert reduced.n_columns <= ir.n_columns - n
    assert reduced.n_rows <= ir.n_rows - n


def test_out_of_domain_terms_are_absent_from_rows():
    ir = schedlang.load(ROOT / "examples" / "chain.sched").lower()
    block = next(b for b in ir.constraints if b.name == "keep_only_computed")
    S = ir.family("S")
    R = ir.family("R")
    first_row = block.keys.index(("f2", "f1"))  # S[f2, f1] <= R[f1, f1] + S[f1, f1] (absent: 0)
    row = block.A.getrow(first_row)
    cols = set(row.indices.tolist())
    assert cols == {S.offset + S.keys.index(("f2", "f1")), R.offset + R.keys.index(("f1", "f1"))}


PARAM_BASE = """
set I = {"a", "b", "c"}
param w[i in I] default 1
var x[i in I] binary
constraint pick: sum(i in I) x[i] <= 2
maximize total: sum(i in I) w[i] * x[i]
"""


def test_param_data_replaces_declared_values_key_by_key():
    assert schedlang.load(text=PARAM_BASE).solve().objective == pytest.approx(2)
    assert schedlang.load(text=PARAM_BASE + "param w = {a: 5, c: 3}").solve().objective == pytest.approx(8)


def test_param_data_outside_the_declared_domain_is_a_located_error():
    with pytest.raises(schedlang.SchedError) as err:
        schedlang.load(text=PARAM_BASE + "param w = {a: 5, d: 3}").solve()
    assert str(err.value) == "<input>:7:18: error: param 'w': [d] is outside its declared domain " \
                             "(declared at <input>:3:1)"
    assert err.value.exit_code == 2


def test_layered_graph_builtins_index_the_h_graph():
    graph_only = (ROOT / "examples" / "tiny_transformer.sched").read_text().replace("use rockmate\n", "")
    text = graph_only + """
        var R[(k, o) in options] binary
        constraint one_option[k in compute_nodes]: sum((k, o) in options) R[k, o] == 1
        # a toy budget: the phantoms chosen by the forwards must fit in 100 MiB
        constraint phantoms_fit: sum((j, o) in phantom_options) phantom(j, o) * R[fwd(j), o] <= 100MiB
        constraint same_option[(j, o) in phantom_options]: R[fwd(j), o] >= R[bwd(j), o]
        minimize total: sum((k, o) in options) time(k, o) * R[k, o]
    """
    for backend in ("pyomo", "cvxpy"):
        res = schedlang.load(text=text).solve(backend=backend)
        assert res.status.value == "optimal"
        # phantoms within 100 MiB: autograd (96 MiB) + keep_attn (40 MiB) does not fit, so one
        # backward uses autograd (3.8 ms) and the other recomputes (5.7 ms)
        fwd = 2 * 1.9e-3
        assert res.objective == pytest.approx(fwd + 0.1e-3 + 3.8e-3 + 5.7e-3)
    ir = schedlang.load(text=text).lower()
    assert ("block1.fwd", "fast_forward") in ir.family("R").keys
    assert ("block1.bwd", "fast_forward") not in ir.family("R").keys
