"""Hypothesis strategies for the fuzz tests (issue 11): `.sched` programs built from the
grammar's pieces (sets, params, variables, expressions, constraints, objectives, graph data),
valid and nearly valid; plan JSON for `simulate`; networkx node-link graph JSON for `import`.

"Nearly valid" comes from the same pieces: names drawn from a pool larger than what is
declared, arities drawn independently of declarations, numbers drawn from their edges (0,
huge, 2^63, 1e400), and one token-level mutation (`fuzzing.mutate`) on some programs.
"""
from __future__ import annotations

import random

from hypothesis import strategies as st

from .fuzzing import mutate

NUMBERS = st.sampled_from(["0", "1", "2", "3", "5", "0.5", "1e308", "1e400", "9223372036854775807",
                           "9223372036854775808", "1e-9", "100000", "4", "7"])
SMALL = st.integers(0, 6).map(str)
# mostly valid values, sometimes at or past an edge
SIZES = st.sampled_from(["1MiB", "16MiB", "3GiB", "1.5KiB", "8MiB", "2MiB"] * 12
                        + ["0", "1", "0B", "1e400", "1e30TiB", "9223372036854775807",
                           "4611686018427387904", "2ms", "7", "1e308"])
TIMES = st.sampled_from(["1", "2", "3.5", "10", "4", "0"] * 10 + ["1e-9", "1e308", "1e400", "1ms", "1MiB"])
SET_NAMES = ["I", "J", "K", "V", "E", "S"]
PARAM_NAMES = ["p", "q", "r"]
VAR_NAMES = ["x", "y", "z"]
EXPR_NAMES = ["e", "f"]
INDEX_VARS = ["i", "j", "k"]


@st.composite
def set_expr(draw, depth=0):
    leaves = [
        st.builds(lambda a, b: f"{a}..{b}", SMALL, st.sampled_from(["0", "3", "5", "100000", "1e9"])),
        st.lists(SMALL, max_size=4).map(lambda xs: "{" + ", ".join(xs) + "}"),
        st.lists(st.sampled_from(['"a"', '"b"', '"c"']), max_size=3).map(lambda xs: "{" + ", ".join(xs) + "}"),
        st.sampled_from(["nodes", "edges", "layers", "forward_nodes", "backward_nodes"] + SET_NAMES),
    ]
    if depth < 2:
        sub = set_expr(depth=depth + 1)
        leaves += [
            st.builds(lambda a, op, b: f"({a}) {op} ({b})", sub, st.sampled_from(["union", "diff", "inter"]), sub),
            st.builds(lambda v, s, c: f"{{{v} for {v} in {s} where {v} > {c}}}",
                      st.sampled_from(INDEX_VARS), sub, SMALL),
            st.builds(lambda s, t: f"{{(i, j) for i in {s}, j in {t}}}", sub, sub),
        ]
    return draw(st.one_of(leaves))


@st.composite
def index(draw):
    """An index domain: `[i in S, j in T where cond]`."""
    n = draw(st.integers(1, 2))
    names = draw(st.permutations(INDEX_VARS))[:n]
    parts = [f"{v} in {draw(st.sampled_from(SET_NAMES))}" for v in names]
    if draw(st.booleans()):
        parts[-1] = f"({names[0]}, {draw(st.sampled_from(INDEX_VARS))}) in {draw(st.sampled_from(SET_NAMES))}"
    where = ""
    if draw(st.integers(0, 3)) == 0:
        op = draw(st.sampled_from(['<', '>', '!=', '<=']))
        where = f" where {names[0]} {op} {draw(st.sampled_from(INDEX_VARS + ['1']))}"
    return "[" + ", ".join(parts) + where + "]", names


@st.composite
def num_expr(draw, scope, with_vars, depth=0):
    """A numeric expression over the index variables in `scope`."""
    iv = st.sampled_from(scope or ["1"])
    leaves = [
        NUMBERS,
        iv,
        st.builds(lambda p, i: f"{p}[{i}]", st.sampled_from(PARAM_NAMES), iv),
        st.sampled_from(PARAM_NAMES + ["budget.peak", "inf", "card(I)"]),
        st.builds(lambda f, i: f"{f}({i})",
                  st.sampled_from(["size", "time", "abs", "floor", "first", "next", "card"]), iv),
    ]
    if with_vars:
        leaves.append(st.builds(lambda x, i: f"{x}[{i}]", st.sampled_from(VAR_NAMES + EXPR_NAMES), iv))
        leaves.append(st.builds(lambda x, i, j: f"{x}[{i}, {j}]", st.sampled_from(VAR_NAMES), iv, iv))
    if depth < 2:
        sub = num_expr(scope, with_vars, depth + 1)
        v = draw(st.sampled_from(INDEX_VARS))
        inner = num_expr(scope + [v], with_vars, depth + 1)
        leaves += [
            st.builds(lambda a, op, b: f"{a} {op} {b}", sub, st.sampled_from(["+", "-", "*", "/"]), sub),
            st.builds(lambda a: f"({a})", sub),
            st.builds(lambda a: f"-{a}", sub),
            st.builds(lambda agg, s, b, c: f"{agg}({v} in {s}{c}) {b}",
                      st.sampled_from(["sum", "max", "min"]), st.sampled_from(SET_NAMES), inner,
                      st.sampled_from(["", f" where {v} > 1"])),
            st.builds(lambda c, a, b: f"if {c} then {a} else {b}", st.sampled_from(
                [f"{scope[0] if scope else 1} > 1", "1 == 1", "card(I) > 2"]), sub, NUMBERS),
        ]
    return draw(st.one_of(leaves))


@st.composite
def declaration(draw):
    kind = draw(st.sampled_from(["set", "set", "param", "param", "var", "var", "expr", "constraint",
                                 "constraint", "objective"]))
    if kind == "set":
        name = draw(st.sampled_from(["V", "E", "S", "T"]))
        return name, f"set {name} = {draw(set_expr())}"
    idx, scope = draw(index()) if draw(st.booleans()) else ("", [])
    if kind == "param":
        value = draw(num_expr(scope, False))
        op = draw(st.sampled_from(["=", "default"]))
        name = draw(st.sampled_from(PARAM_NAMES))
        return name, f"param {name}{idx} {op} {value}"
    if kind == "var":
        vt = draw(st.sampled_from(["binary", "integer [0, 5]", "continuous [0, 1e308]",
                                   "in [0, 1]", "integer [3, 1]", "continuous [0, inf]",
                                   "in [-1e400, 1e400]"]))
        name = draw(st.sampled_from(VAR_NAMES))
        return name, f"var {name}{idx or '[i in I]'} {vt}"
    if kind == "expr":
        name = draw(st.sampled_from(EXPR_NAMES))
        return name, f"expr {name}{idx} = {draw(num_expr(scope, True))}"
    if kind == "constraint":
        lhs, rhs = draw(num_expr(scope, True)), draw(num_expr(scope, True))
        op = draw(st.sampled_from(["<=", ">=", "==", "<", "!="]))
        name = f"c{draw(st.integers(0, 3))}"
        return name, f"constraint {name}{idx}: {lhs} {op} {rhs}"
    sense = draw(st.sampled_from(["minimize", "maximize"]))
    return "obj", f"{sense} obj: sum(i in I) {draw(num_expr(['i'], True))}"


@st.composite
def graph_data(draw):
    """Checkmate-view graph data: nodes with times and sizes, edges, a budget."""
    n = draw(st.integers(1, 6))
    names = [f"n{k}" for k in range(n)]
    title = draw(st.sampled_from(["", ' "title"']))
    lines = [f"graph g{title} {{"]
    for name in names:
        kind = draw(st.sampled_from(["", "", " backward", " forward"]))
        lines.append(f"  node {name}{kind} time {draw(TIMES)} size {draw(SIZES)}")
    for _ in range(draw(st.integers(0, 2 * n))):
        a, b = sorted((draw(st.integers(0, n - 1)), draw(st.integers(0, n))))
        if draw(st.integers(0, 9)) == 0:  # nearly valid: backwards, to itself, unknown
            a, b = draw(st.sampled_from([(b, a), (a, a), (a, n)]))
        elif a == b or b == n:
            continue
        u = names[a] if a < n else "missing"
        v = names[b] if b < n else "missing"
        lines.append(f"  edge {u} -> {v}")
    lines.append("}")
    if draw(st.integers(0, 4)):
        lines.append(f"budget {draw(st.sampled_from(['peak', 'peak', 'save', 'host', 'heap']))} {draw(SIZES)}")
    return "\n".join(lines)


@st.composite
def sched_program(draw):
    """A .sched text: a generated formulation, or a shipped one on generated data, with
    graph data or without, sometimes mutated by one token edit (returned with a label)."""
    parts = []
    shape = draw(st.sampled_from(["formulation", "formulation+data", "checkmate+data", "data"]))
    if shape == "checkmate+data":
        parts.append("use checkmate")
    if shape.startswith("formulation"):
        parts.append("set I = 1..3")
        if draw(st.integers(0, 3)):
            parts += ["set J = {1, 2}", "set K = {(1, 2), (2, 3)}"]
        decls = draw(st.lists(declaration(), min_size=1, max_size=8,
                              unique_by=(lambda d: d[0]) if draw(st.integers(0, 5)) else None))
        names = {name for name, _ in decls}
        parts += [text for _, text in decls]
        if "obj" not in names and draw(st.integers(0, 3)):
            parts.append("minimize obj: sum(i in I) x[i]")
        if "x" not in names:
            parts.append("var x[i in I] binary")
    if shape != "formulation":
        parts.append(draw(graph_data()))
    text = "\n".join(parts) + "\n"
    if draw(st.integers(0, 4)) == 0:
        text = mutate(text, random.Random(draw(st.integers(0, 2**32))))
    return text


# --------------------------------------------------------------------------- plan JSON

CHAIN_NODES = ["f1", "f2", "f3", "f4", "f5", "f6", "loss", "b6", "b5", "b4", "b3", "b2", "b1"]
LAYERED_NAMES = ["block1", "block2", "block1.fwd", "block1.bwd", "block2.fwd", "block2.bwd",
                 "loss", "x", "h1", "h2", "h1.grad", "h2.grad", "x.grad", "nope"]
FIELD_VALUES = st.one_of(st.sampled_from(CHAIN_NODES + LAYERED_NAMES), st.none(), st.booleans(),
                         st.integers(-2, 3), st.sampled_from([0.5, 1e308, float("inf"), float("nan"), 2**63]),
                         st.just([]), st.just({}))


@st.composite
def plan_op(draw):
    op = draw(st.sampled_from(["compute", "compute", "compute", "delete", "delete", "drop_phantom",
                               "offload", "prefetch", "wait", "jump", 3]))
    d = {"op": op}
    for key in draw(st.lists(st.sampled_from(["node", "data", "layer", "option", "fraction",
                                              "channel", "extra"]), max_size=3, unique=True)):
        if key == "channel":
            d[key] = draw(st.sampled_from(["offload", "prefetch", "compute", 1]))
        elif key == "option":
            d[key] = draw(st.sampled_from(["autograd", "recompute", "fast_forward", "none", 0]))
        elif key == "fraction":
            d[key] = draw(st.sampled_from([0.5, 1, 0, -1, 2, float("nan"), float("inf"), "half"]))
        else:
            d[key] = draw(FIELD_VALUES)
    if op == "compute" and "node" not in d and draw(st.booleans()):
        d["node"] = draw(st.sampled_from(CHAIN_NODES + LAYERED_NAMES))
    if op == "delete" and "data" not in d and draw(st.booleans()):
        d["data"] = draw(st.sampled_from(CHAIN_NODES + LAYERED_NAMES))
    return d


@st.composite
def plan_json(draw):
    """A plan document: mostly the schema's shape, with any of its parts wrong."""
    doc = {}
    if draw(st.integers(0, 9)):
        doc["schema"] = draw(st.sampled_from(["schedlang.plan/1", "schedlang.plan/1",
                                              "schedlang.plan/2", 1]))
    if draw(st.booleans()):
        doc["graph"] = draw(st.sampled_from(["chain", "tiny_transformer", "other", None, 7]))
    if draw(st.booleans()):
        doc["budget"] = draw(st.sampled_from([{"peak_bytes": 125829120, "save_bytes": None},
                                              {"peak_bytes": -1}, {"peak_bytes": 2**64},
                                              {"peak_bytes": "1GiB"}, None, [], 5]))
    if draw(st.integers(0, 9)):
        doc["ops"] = draw(st.lists(plan_op(), max_size=30))
    else:
        doc["ops"] = draw(st.sampled_from([None, {}, "ops", 3]))
    if draw(st.booleans()):
        doc["predicted"] = draw(st.sampled_from([{"peak_bytes": None, "time": None},
                                                 {"peak_bytes": 1e400, "time": float("nan")}, 0]))
    if draw(st.integers(0, 20)) == 0:
        return draw(st.sampled_from([[], None, "plan", 3, [doc]]))
    return doc


# --------------------------------------------------------------------------- graph JSON

@st.composite
def node_link_json(draw):
    """A networkx node-link document in either convention of `importers.checkmate_nx`."""
    n = draw(st.integers(0, 6))
    convention = draw(st.sampled_from(["checkmate", "checkmate", "random_layered", "mixed"]))
    nodes = []
    num = st.one_of(st.integers(-1, 2**20), st.sampled_from([0, 2**63, 2**64, 1e308, 0.5, -0.5,
                                                            float("inf"), float("nan"), "12", None, True]))
    for k in range(n):
        node = {}
        if convention in ("checkmate", "mixed"):
            node.update({"id": draw(st.sampled_from([k, k, k, 0, "a", None])),
                         "name": draw(st.sampled_from([f"n{k}", f"n{k}", "dup", 3])),
                         "backward": draw(st.sampled_from([False, False, True, "yes", None])),
                         "cost_cpu": draw(num), "cost_ram": draw(num)})
        if convention in ("random_layered", "mixed"):
            node.update({"name": draw(st.sampled_from([k, k, k, f"n{k}", None])),
                         "out_cost": draw(num), "duration": draw(num), "param_cost": 0})
        for key in draw(st.lists(st.sampled_from(list(node)), max_size=1)):
            del node[key]
        nodes.append(node)
    links = []
    for _ in range(draw(st.integers(0, 2 * n + 1))):
        a = draw(st.integers(0, n))
        b = draw(st.integers(0, n))
        if convention == "random_layered":
            links.append({"0": a, "1": b})
        else:
            links.append({"source": a, "target": draw(st.sampled_from([b, b, "zz", None]))})
    doc = {"directed": draw(st.sampled_from([True, True, False])), "multigraph": False,
           "graph": draw(st.sampled_from([{}, {"name": "g"}, {"order": list(range(n))},
                                          {"order": [0, 0]}, {"order": "x"}, []])),
           "nodes": nodes, "links": links}
    for key in draw(st.lists(st.sampled_from(["nodes", "links", "graph", "directed"]), max_size=1)):
        del doc[key]
    if draw(st.integers(0, 20)) == 0:
        return draw(st.sampled_from([[], None, "graph", 3, [doc]]))
    return doc
