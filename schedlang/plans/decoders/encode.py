"""Encoders: a Plan -> values for a model's variables (the reverse of a decoder), e.g. a MIP start.

An encoder reads the same decode declaration as its decoder (`decode stages(compute = R, ...)`),
so it knows which variable plays which role, and returns one value per column of the lowered
model (`IRModel` column order). Columns of variables that play no role are set to 0, clipped to
their bounds. A plan the model cannot express raises `NotEncodable` with the reason.

Whether the vector satisfies the model (rows, bounds, integrality) is checked by the caller
(`check_point`): a plan over the budget, or a formulation whose extra rows the plan breaks,
gives an infeasible vector, not an error.

Stage models (Checkmate, `encode_stages`). The plan must be in Checkmate's stage space: the
first computations of the nodes come in node order, and stage t is the ops up to and including
the first computation of node t (after the previous stage). Then

* compute[t, v] = 1 when v is computed in stage t (a node computed twice within one stage is
  one compute there; the model runs a stage's computes in node order);
* keep[t, u] = 1 when u's output is live when stage t starts and the stage still needs that
  copy: it is an input of a compute of stage t before u is recomputed there, or it is carried
  on into stage t+1 without being recomputed (a copy live at the boundary that nothing needs
  is left out: the plan could have deleted it, and the model would count it until the stage
  ends);
* free[t, u, v] follows from compute and keep as the model forces it: 1 when v is computed in
  stage t, u is not kept into stage t+1 and no later user of u is computed in stage t;
* memory[t, v] (optional) follows the model's recurrence, in units of `memory_unit`: what is
  kept into the stage, plus each output computed, minus what is freed after each compute;
* variables that play no role are 0, or, when that breaks a row (an extension's own
  variables), completed by HiGHS with the roles fixed.

Phase models (H-Rockmate, `encode_phases`; offload.sched too, with zero transfers). The plan
must be in the phase space: phase t ends with the first computation of compute node t, and a
phase computes nodes in the H-graph's order, each at most once. The plan fixes compute[t, k, o],
keep[t, d] (live when phase t starts) and phantom[t, j, o] (saved when phase t starts); the
transfer roles are 0; HiGHS completes the other columns (creates, deletes, memory, the offload
model's bookkeeping) on the model with those columns fixed, or says there is no completion.
"""
from __future__ import annotations

import numpy as np

from ...graphs.hgraph import FAST_FORWARD
from ...language.units import UNITS
from ...solve.relaxation import highs_solve
from ...solve.status import is_feasible
from ..plan import Plan


class NotEncodable(Exception):
    """The plan cannot be written in the model's variables; the message says why."""


def role_family(decl, ir, role: str, required: bool = True):
    """The variable family that plays `role`, or None when the role is optional and absent."""
    name = decl.roles.get(role)
    if name is None:
        if required:
            raise NotEncodable(f"the decoder '{decl.decoder}' declaration has no '{role}' role")
        return None
    if not isinstance(name, str):
        raise NotEncodable(f"role '{role}' is not a variable name")
    if name in ir.observed:
        raise NotEncodable(f"role '{role}' is played by the expression '{name}', not a "
                           f"variable; it cannot be set")
    try:
        return ir.family(name)
    except KeyError:
        raise NotEncodable(f"role '{role}': the model has no variable '{name}'") from None


def memory_scale(decl) -> float:
    """Bytes per unit of the memory role (the declaration's `memory_unit`, else 1 byte)."""
    unit = decl.roles.get("memory_unit")
    if unit is not None and hasattr(unit, "value"):
        return float(unit.value) * float(UNITS.get(unit.unit, 1.0))
    return 1.0


# --------------------------------------------------------------------------- stages

def stage_schedule(plan: Plan, graph) -> tuple[list[list[tuple[str, str, object]]], list[str]]:
    """Split a Checkmate plan into stages.

    Returns (stages, order): stages[t] is the list of events of stage t in plan order, each
    ``("compute", node, k)`` or ``("delete", data, k)`` with k the op's index; a delete
    belongs to the stage of the next compute (or the last stage).
    Raises `NotEncodable` for a plan outside the stage space.
    """
    order = [n.name for n in graph.nodes]
    index = {name: i for i, name in enumerate(order)}
    if graph.is_layered:
        raise NotEncodable(f"graph '{graph.name}' is layered data; the stage encoder works on "
                           f"node/edge graphs")
    stages: list[list[tuple[str, str, object]]] = [[] for _ in order]
    nxt = 0  # the node whose first computation ends the current stage
    seen: set[str] = set()
    for k, op in enumerate(plan.ops):
        if op.op == "compute":
            v = op.node
            if v is None or v not in index:
                raise NotEncodable(f"op {k}: compute of unknown node '{v}'")
            if op.option is not None:
                raise NotEncodable(f"op {k}: compute '{v}' with option '{op.option}'; "
                                   f"Checkmate nodes have no options")
            if v not in seen:
                if nxt >= len(order) or v != order[nxt]:
                    want = order[nxt] if nxt < len(order) else "(none left)"
                    raise NotEncodable(
                        f"op {k}: node '{v}' is computed for the first time before node "
                        f"'{want}'; the stage model needs first computations in node order")
                seen.add(v)
                stages[nxt].append(("compute", v, k))
                nxt += 1
                continue
            if nxt >= len(order):
                raise NotEncodable(f"op {k}: compute '{v}' after the last stage (after the "
                                   f"first computation of '{order[-1]}')")
            stages[nxt].append(("compute", v, k))
        elif op.op == "delete":
            if op.data is None or op.data not in index:
                raise NotEncodable(f"op {k}: delete of unknown data '{op.data}'")
            # before the first compute of stage nxt: only liveness matters, so either side
            # of the boundary is the same to the encoding
            stages[min(nxt, len(order) - 1)].append(("delete", op.data, k))
        else:
            raise NotEncodable(f"op {k}: a '{op.op}' op has no counterpart in the stage model")
    if nxt < len(order):
        raise NotEncodable(f"node '{order[nxt]}' is never computed")
    return stages, order


def encode_stages(decl, ir, plan: Plan, graph) -> np.ndarray:
    fR = role_family(decl, ir, "compute")
    fS = role_family(decl, ir, "keep")
    fF = role_family(decl, ir, "free")
    fU = role_family(decl, ir, "memory", required=False)
    stages, order = stage_schedule(plan, graph)
    n = len(order)
    index = {name: i for i, name in enumerate(order)}
    users: list[list[int]] = [[] for _ in order]
    preds: list[list[int]] = [[] for _ in order]
    for u, v in graph.edges:
        users[index[u]].append(index[v])
        preds[index[v]].append(index[u])

    # compute[t][v], and the live set at each stage boundary (before[t]: when stage t starts)
    R = np.zeros((n, n), dtype=bool)
    live: set[int] = set()
    before: list[set[int]] = []
    needed_from_boundary = np.zeros((n, n), dtype=bool)  # input u read before recomputed
    for t in range(n):
        before.append(set(live))
        fresh: set[int] = set()  # outputs (re)computed in this stage so far
        for kind, name, _ in stages[t]:
            i = index[name]
            if kind == "compute":
                for u in preds[i]:
                    if u not in fresh:
                        needed_from_boundary[t, u] = True
                R[t, i] = True
                fresh.add(i)
                live.add(i)
            else:
                live.discard(i)
    # keep[t][u]: the copy live at the start of stage t is read in t before u is recomputed
    # there, or carried on into t+1 (an input read but not live there is an invalid plan: it
    # is kept anyway, and the rows tell the caller that the point is infeasible)
    S = np.zeros((n, n), dtype=bool)
    for t in range(n - 1, 0, -1):
        for u in range(t):
            carried = (u in before[t] and t + 1 < n and S[t + 1, u]
                       and not R[t, u])
            S[t, u] = needed_from_boundary[t, u] or carried

    x = np.zeros(ir.n_columns)
    filled = {fR.name, fS.name, fF.name}
    _fill(x, fR, lambda key: float(R[index[key[0]], index[key[1]]]))
    _fill(x, fS, lambda key: float(S[index[key[0]], index[key[1]]]))

    def later_user_computed(t: int, u: int, v: int) -> bool:
        return any(w > v and R[t, w] for w in users[u])

    def free(t: int, u: int, v: int) -> bool:
        kept_on = t + 1 < n and S[t + 1, u]
        return bool(R[t, v]) and not kept_on and not later_user_computed(t, u, v)

    _fill(x, fF, lambda key: float(free(index[key[0]], index[key[1]], index[key[2]])))

    if fU is not None:
        scale = memory_scale(decl)
        mem = np.array([float(node.size) / scale for node in graph.nodes])
        # freed[t, v] = sum over (u, v) in FE of mem[u] * FREE[t, u, v]
        freed = np.zeros((n, n))
        for t in range(n):
            for v in range(t + 1):
                if not R[t, v]:
                    continue
                for u in set(preds[v]) | {v}:
                    if free(t, u, v):
                        freed[t, v] += mem[u]
        U = np.zeros((n, n))
        for t in range(n):
            used = float(mem[:t] @ S[t, :t]) + mem[0] * R[t, 0]
            U[t, 0] = used
            for v in range(1, t + 1):
                used = used + mem[v] * R[t, v] - freed[t, v - 1]
                U[t, v] = used
        _fill(x, fU, lambda key: float(U[index[key[0]], index[key[1]]]))
        filled.add(fU.name)

    # variables that play no role: 0, inside their bounds; where that breaks a row (an
    # extension's own variables, e.g. the excess of models/extensions/soft_budget.sched),
    # HiGHS completes them with the role columns fixed
    others = [fam for fam in ir.variables if fam.name not in filled]
    for fam in others:
        x[fam.offset: fam.offset + fam.size] = np.clip(0.0, fam.lb, fam.ub)
    if others and not check_point(ir, x)[0]:
        x = complete_point(ir, x, [fam for fam in ir.variables if fam.name in filled])
    return x


def complete_point(ir, x: np.ndarray, fixed, time_limit: float = 30.0) -> np.ndarray:
    """`x` with the columns of the `fixed` families kept and the others completed by HiGHS
    (`relaxation.highs_solve`); `NotEncodable` when no completion exists."""
    lb, ub = (v.copy() for v in ir.column_bounds())
    for fam in fixed:
        cols = slice(fam.offset, fam.offset + fam.size)
        lb[cols] = ub[cols] = x[cols]
    out = highs_solve(ir, lb, ub, time_limit=time_limit)
    if out.x is None:
        raise NotEncodable("the plan's stages satisfy no point of the model: no values of its "
                           "other variables complete them")
    return out.x


def _fill(x: np.ndarray, fam, value) -> None:
    for j, key in enumerate(fam.keys):
        if len(key) < 2:
            raise NotEncodable(f"variable '{fam.name}' has index {key!r}; the stage encoder "
                               f"expects [stage, node, ...] indices")
        try:
            x[fam.offset + j] = value(key)
        except KeyError as exc:
            raise NotEncodable(f"variable '{fam.name}[{', '.join(map(str, key))}]' names "
                               f"{exc} which is not a node of the graph") from None


# --------------------------------------------------------------------------- phases

def phase_schedule(plan: Plan, h) -> tuple[dict, dict, dict]:
    """Split a layered plan into H-Rockmate phases (phase t ends with the first computation
    of compute node t, in the H-graph's order; a phase runs its computes in that order, each
    at most once).

    Returns (runs, live, phantoms): runs[(t, k)] = the option k runs with in phase t;
    live[t] / phantoms[t] = the data in memory / {layer: option} of the phantoms saved when
    phase t starts (just before its first compute). Raises `NotEncodable` for a plan outside
    the phase space or with transfers."""
    order = [k.name for k in h.compute]
    index = {k: i for i, k in enumerate(order)}
    node = {k.name: k for k in h.compute}
    outputs_of: dict[str, list[str]] = {}
    for c, d in h.creates:
        outputs_of.setdefault(c, []).append(d)
    runs: dict[tuple, str] = {}
    live_at: dict[str, frozenset] = {}
    phantoms_at: dict[str, dict] = {}
    live = set(h.inputs)
    phantoms: dict[str | None, str] = {}  # layer -> the option whose phantom it holds
    nxt, last = 0, -1  # the phase open now; the index of its last compute
    for k_op, op in enumerate(plan.ops):
        if op.op == "compute":
            k = op.node
            if k is None or k not in index:
                raise NotEncodable(f"op {k_op}: compute of unknown node '{k}'")
            if nxt >= len(order):
                raise NotEncodable(f"op {k_op}: compute '{k}' after the last phase")
            t = order[nxt]
            if t not in live_at:
                live_at[t], phantoms_at[t] = frozenset(live), dict(phantoms)
            if index[k] > nxt:
                raise NotEncodable(f"op {k_op}: node '{k}' is computed for the first time before "
                                   f"node '{t}'; phases need first computations in H-graph order")
            if index[k] <= last:
                raise NotEncodable(f"op {k_op}: phase '{t}' computes '{k}' after a later node "
                                   f"(or twice); a phase runs its computes in H-graph order")
            options = [o.name for o in node[k].options]
            o = op.option if op.option is not None else (options[0] if len(options) == 1 else None)
            if o is None or o not in options:
                raise NotEncodable(f"op {k_op}: node '{k}' has no option '{op.option}'")
            runs[(t, k)] = o
            live.update(outputs_of.get(k, ()))
            if node[k].kind == "fwd" and o != FAST_FORWARD:
                phantoms[node[k].layer] = o
            elif node[k].kind == "bwd":
                phantoms.pop(node[k].layer, None)
            last = index[k]
            if index[k] == nxt:
                nxt, last = nxt + 1, -1
        elif op.op == "delete":
            live.discard(op.data)
        elif op.op == "drop_phantom":
            phantoms.pop(op.layer, None)
        else:
            raise NotEncodable(f"op {k_op}: a '{op.op}' op; the phase encoder writes plans "
                               f"without transfers (offload/prefetch) only")
    if nxt < len(order):
        raise NotEncodable(f"node '{order[nxt]}' is never computed")
    return runs, live_at, phantoms_at


# the roles of transfers (offload*.sched): zero in an encoded plan
TRANSFER_ROLES = tuple(f"{scope}{role}" for scope in ("", "phantom_", "window_", "phantom_window_")
                       for role in ("offload", "prefetch", "arrive"))


def encode_phases(decl, ir, plan: Plan, graph, time_limit: float = 30.0) -> np.ndarray:
    """The plan's decisions fixed -- compute[t, k, o], keep[t, d] and phantom[t, j, o] from
    the replay, every transfer role 0 -- and the rest of the columns (creates, deletes,
    contributions, memory, the offload model's bookkeeping) completed by HiGHS on the model
    with those columns fixed (`relaxation.highs_solve`)."""
    if not graph.layers:
        raise NotEncodable(f"graph '{graph.name}' is node/edge data; the phase encoder works on "
                           f"layered graphs")
    h = graph.hgraph()
    runs, live_at, phantoms_at = phase_schedule(plan, h)
    lb, ub = (v.copy() for v in ir.column_bounds())

    def fix(fam, value) -> None:
        for j, key in enumerate(fam.keys):
            v = float(value(key))
            if not fam.lb[j] - 1e-9 <= v <= fam.ub[j] + 1e-9:
                raise NotEncodable(f"the plan sets {fam.name}[{', '.join(map(str, key))}] to "
                                   f"{v:g}, outside the variable's bounds")
            lb[fam.offset + j] = ub[fam.offset + j] = v

    fix(role_family(decl, ir, "compute"), lambda key: runs.get((key[0], key[1])) == key[2])
    fix(role_family(decl, ir, "keep"), lambda key: key[1] in live_at.get(key[0], ()))
    fix(role_family(decl, ir, "phantom"),
        lambda key: phantoms_at.get(key[0], {}).get(key[1]) == key[2])
    for role in TRANSFER_ROLES:
        fam = role_family(decl, ir, role, required=False)
        if fam is not None:
            fix(fam, lambda key: 0.0)
    out = highs_solve(ir, lb, ub, time_limit=time_limit)
    if out.x is None:
        why = ("no completion exists" if out.status == "infeasible"
               else f"no completion found in {time_limit:g} s")
        raise NotEncodable(f"the plan's computes, keeps and phantoms satisfy no point of the "
                           f"model ({why}): over the budget, or outside the model's space")
    return out.x


ENCODERS = {"stages": encode_stages, "phases": encode_phases}


# --------------------------------------------------------------------------- checking

def check_point(ir, x: np.ndarray) -> tuple[bool, str]:
    """Does `x` satisfy `ir`'s rows, bounds and integrality (the backends' tolerances)?"""
    import re


    ok, why = is_feasible(ir, np.asarray(x, dtype=float))
    why = re.sub(r"column (\d+)", lambda m: column_name(ir, int(m.group(1))), why)
    why = re.sub(r"row (\d+)", lambda m: row_name(ir, int(m.group(1))), why)
    return ok, why


def column_name(ir, j: int) -> str:
    """`U[f6, f1]` for a global column index."""
    for fam in ir.variables:
        if fam.offset <= j < fam.offset + fam.size:
            key = fam.keys[j - fam.offset]
            return f"{fam.name}[{', '.join(map(str, key))}]" if key else fam.name
    return f"column {j}"


def row_name(ir, i: int) -> str:
    """`memory_next[f6, f1]` for a row index of `ir.stacked()`."""
    start = 0
    for block in ir.constraints:
        if i < start + block.size:
            key = block.keys[i - start]
            return f"{block.name}[{', '.join(map(str, key))}]" if key else block.name
        start += block.size
    return f"row {i}"


def objective_value(ir, x: np.ndarray) -> float | None:
    if ir.objective is None:
        return None
    return float(ir.objective.c @ x + ir.objective.constant)
