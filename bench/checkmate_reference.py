"""Hand-written reference implementations of the Checkmate MILP (Jain et al., MLSys 2020).

Two independent front ends for the *same* model, used as yardsticks by the benchmarks:

* ``build_highspy(graph, budget)`` -- a ``highspy.Highs`` model whose whole constraint matrix
  is passed in one ``passModel`` call (column-wise CSC arrays); one thread, output off.
* ``build_pyomo(graph, budget)`` -- plain Pyomo as a competent user would write it: indexed
  ``Var``s over sparse index sets and ``Constraint`` rules, nothing clever.

plus ``solve_highspy`` / ``solve_pyomo`` (HiGHS; Pyomo through ``appsi_highs``) returning
``(status, objective, seconds)``, and ``brute_force`` / ``simulate_plan``: an exhaustive search
and a plan checker that implement the model's semantics imperatively, used by ``self_test()`` to
show on tiny graphs that both MILPs are correct.

The model (node order 0..n-1 is the graph's topological order; stage t = node index t):

* binaries R[t,i] (i <= t): node i computed in stage t;
  S[t,i] (i < t, t >= 1): i's output kept from stage t-1 into stage t;
  FREE[t,i,k] (k <= t, i in preds(k) | {k}): i's output freed right after computing k in stage t;
* continuous U[t,k] in [0, B] (k <= t): memory in use after computing k in stage t.
* R[t,t] = 1
* S[t,i] <= R[t-1,i] + S[t-1,i]                  (a term outside its index set is 0)
* R[t,k] <= R[t,i] + S[t,i]                      for each edge (i,k), k <= t
* U[t,0] = sum_{i<t} mem_i S[t,i] + mem_0 R[t,0]
* U[t,k+1] = U[t,k] + mem_{k+1} R[t,k+1] - sum_{i in preds(k)|{k}} mem_i FREE[t,i,k]   (k < t)
* hazards h(t,i,k) = (1 - R[t,k]) + S[t+1,i] + sum_{j in succs(i), k < j <= t} R[t,j]
  (S[n,.] = 0), linearized as  1 - FREE <= h  and  M_{i,k} (1 - FREE) >= h,
  M_{i,k} = 2 + |{j in succs(i): j > k}|.
* minimize sum_t sum_{i<=t} time_i R[t,i].

Memory (sizes and budget) is in MiB (bytes / 2**20) for numerical stability.

Variable (column) and constraint (row) order is the same in both builders: families in the
order R, S, FREE, U and diag, keep, deps, mem0, mem, free_lo, free_hi, each family in
lexicographic index order -- MIP times depend strongly on order, so comparisons need it fixed.

Run ``python bench/checkmate_reference.py`` to self-test against brute force (a few seconds).
"""
from __future__ import annotations

import functools
import itertools
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

MIB = float(2**20)


# --------------------------------------------------------------------------------------------
# Index structure shared by both builders (pure data, no solver objects)
# --------------------------------------------------------------------------------------------
@dataclass
class Structure:
    n: int
    names: list[str]
    time: list[float]
    mem: list[float]  # MiB
    budget: float  # MiB
    preds: list[list[int]]  # sorted
    succs: list[list[int]]  # sorted
    edges: list[tuple[int, int]]  # (i, k), sorted, i < k

    def free_sources(self, k: int) -> list[int]:
        """i in preds(k) | {k}, sorted."""
        return self.preds[k] + [k]

    def later_users(self, i: int, k: int, t: int) -> list[int]:
        """j in succs(i) with k < j <= t (the R[t,j] that exist in the hazard)."""
        return [j for j in self.succs[i] if k < j <= t]

    def big_m(self, i: int, k: int) -> int:
        return 2 + sum(1 for j in self.succs[i] if j > k)


def structure(graph, budget: float) -> Structure:
    """Index the graph in node order. `budget` is in bytes."""
    names = [nd.name for nd in graph.nodes]
    pos = {name: p for p, name in enumerate(names)}
    n = len(names)
    preds: list[set[int]] = [set() for _ in range(n)]
    succs: list[set[int]] = [set() for _ in range(n)]
    for u, v in graph.edges:
        i, k = pos[u], pos[v]
        if i >= k:
            raise ValueError(f"edge {u} -> {v} goes against the node order (not topological)")
        preds[k].add(i)
        succs[i].add(k)
    edges = sorted((i, k) for k in range(n) for i in preds[k])
    return Structure(
        n=n,
        names=names,
        time=[float(nd.time) for nd in graph.nodes],
        mem=[nd.size / MIB for nd in graph.nodes],
        budget=budget / MIB,
        preds=[sorted(p) for p in preds],
        succs=[sorted(s) for s in succs],
        edges=edges,
    )


def index_sets(st: Structure):
    """The four variable index sets, in column order."""
    n = st.n
    r_idx = [(t, i) for t in range(n) for i in range(t + 1)]
    s_idx = [(t, i) for t in range(1, n) for i in range(t)]
    f_idx = [(t, i, k) for t in range(n) for k in range(t + 1) for i in st.free_sources(k)]
    u_idx = [(t, k) for t in range(n) for k in range(t + 1)]
    return r_idx, s_idx, f_idx, u_idx


# --------------------------------------------------------------------------------------------
# highspy: whole matrix in one passModel call
# --------------------------------------------------------------------------------------------
def build_highspy(graph, budget: float, threads: int = 1, output: bool = False):
    """Build the Checkmate MILP as a highspy.Highs object. `budget` in bytes.

    Returns (h, colmap) with colmap = {"R": {(t,i): col}, "S": {...}, "FREE": {(t,i,k): col},
    "U": {(t,k): col}}.
    """
    import highspy
    import numpy as np
    import scipy.sparse as sp

    st = structure(graph, budget)
    n, mem, B = st.n, st.mem, st.budget
    r_idx, s_idx, f_idx, u_idx = index_sets(st)

    # columns
    R = {key: c for c, key in enumerate(r_idx)}
    off = len(r_idx)
    S = {key: off + c for c, key in enumerate(s_idx)}
    off += len(s_idx)
    F = {key: off + c for c, key in enumerate(f_idx)}
    off += len(f_idx)
    U = {key: off + c for c, key in enumerate(u_idx)}
    ncol = off + len(u_idx)

    cost = np.zeros(ncol)
    for (_, i), c in R.items():
        cost[c] = st.time[i]
    col_lo = np.zeros(ncol)
    col_hi = np.ones(ncol)
    col_hi[off:] = B
    integrality = [highspy.HighsVarType.kInteger] * off + [highspy.HighsVarType.kContinuous] * len(u_idx)

    # rows, as COO triplets
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    row_lo: list[float] = []
    row_hi: list[float] = []
    inf = highspy.kHighsInf

    def add_row(entries, lo, hi):
        r = len(row_lo)
        for c, v in entries:
            rows.append(r)
            cols.append(c)
            vals.append(v)
        row_lo.append(lo)
        row_hi.append(hi)

    # R[t,t] = 1
    for t in range(n):
        add_row([(R[t, t], 1.0)], 1.0, 1.0)
    # S[t,i] - R[t-1,i] - S[t-1,i] <= 0
    for t, i in s_idx:
        e = [(S[t, i], 1.0), (R[t - 1, i], -1.0)]
        if (t - 1, i) in S:
            e.append((S[t - 1, i], -1.0))
        add_row(e, -inf, 0.0)
    # R[t,k] - R[t,i] - S[t,i] <= 0 for edges (i,k), k <= t
    for t in range(n):
        for i, k in st.edges:
            if k <= t:
                add_row([(R[t, k], 1.0), (R[t, i], -1.0), (S[t, i], -1.0)], -inf, 0.0)
    # U[t,0] - sum mem_i S[t,i] - mem_0 R[t,0] = 0
    for t in range(n):
        e = [(U[t, 0], 1.0)] + [(S[t, i], -mem[i]) for i in range(t)] + [(R[t, 0], -mem[0])]
        add_row(e, 0.0, 0.0)
    # U[t,k+1] - U[t,k] - mem_{k+1} R[t,k+1] + sum mem_i FREE[t,i,k] = 0
    for t in range(n):
        for k in range(t):
            e = [(U[t, k + 1], 1.0), (U[t, k], -1.0), (R[t, k + 1], -mem[k + 1])]
            e += [(F[t, i, k], mem[i]) for i in st.free_sources(k)]
            add_row(e, 0.0, 0.0)
    # free_lo: h + FREE >= 1  <=>  -R[t,k] + S[t+1,i] + sum R[t,j] + FREE >= 0
    for t, i, k in f_idx:
        e = [(R[t, k], -1.0)]
        if t + 1 < n:
            e.append((S[t + 1, i], 1.0))
        e += [(R[t, j], 1.0) for j in st.later_users(i, k, t)]
        e.append((F[t, i, k], 1.0))
        add_row(e, 0.0, inf)
    # free_hi: M(1 - FREE) >= h  <=>  R[t,k] - S[t+1,i] - sum R[t,j] - M FREE >= 1 - M
    for t, i, k in f_idx:
        m_ik = st.big_m(i, k)
        e = [(R[t, k], 1.0)]
        if t + 1 < n:
            e.append((S[t + 1, i], -1.0))
        e += [(R[t, j], -1.0) for j in st.later_users(i, k, t)]
        e.append((F[t, i, k], -float(m_ik)))
        add_row(e, 1.0 - m_ik, inf)

    nrow = len(row_lo)
    a = sp.csc_matrix((np.asarray(vals), (np.asarray(rows), np.asarray(cols))), shape=(nrow, ncol))
    a.sort_indices()

    lp = highspy.HighsLp()
    lp.num_col_ = ncol
    lp.num_row_ = nrow
    lp.col_cost_ = cost
    lp.col_lower_ = col_lo
    lp.col_upper_ = col_hi
    lp.row_lower_ = np.asarray(row_lo)
    lp.row_upper_ = np.asarray(row_hi)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.num_col_ = ncol
    lp.a_matrix_.num_row_ = nrow
    lp.a_matrix_.start_ = a.indptr
    lp.a_matrix_.index_ = a.indices
    lp.a_matrix_.value_ = a.data
    lp.integrality_ = integrality

    h = highspy.Highs()
    h.setOptionValue("output_flag", bool(output))
    h.setOptionValue("threads", int(threads))
    status = h.passModel(lp)
    if status != highspy.HighsStatus.kOk:
        raise RuntimeError(f"highspy passModel failed: {status}")
    return h, {"R": R, "S": S, "FREE": F, "U": U}


def _highs_status(h) -> str:
    import highspy

    ms = h.getModelStatus()
    S = highspy.HighsModelStatus
    if ms == S.kOptimal:
        return "optimal"
    if ms == S.kInfeasible:
        return "infeasible"
    if ms in (S.kTimeLimit, S.kIterationLimit, S.kSolutionLimit, S.kInterrupt):
        has_sol = h.getInfo().primal_solution_status == 2  # kSolutionStatusFeasible
        return "time_limit_feasible" if has_sol else "time_limit"
    return h.modelStatusToString(ms)


def solve_highspy(graph, budget: float, time_limit: float | None = None, threads: int = 1,
                  mip_rel_gap: float | None = None, timings: dict | None = None,
                  plan: dict | None = None):
    """Build + solve with highspy. Returns (status, objective or None, seconds build+solve).

    `timings` (a dict) receives "build" and "solve" seconds; `plan` receives "R" and "S" as
    sets of (t, i) when a solution exists.
    """
    t0 = time.perf_counter()
    h, cmap = build_highspy(graph, budget, threads=threads)
    t1 = time.perf_counter()
    if time_limit is not None:
        h.setOptionValue("time_limit", float(time_limit))
    if mip_rel_gap is not None:
        h.setOptionValue("mip_rel_gap", float(mip_rel_gap))
    h.run()
    t2 = time.perf_counter()
    status = _highs_status(h)
    obj = None
    if h.getInfo().primal_solution_status == 2:
        obj = h.getInfo().objective_function_value
        if plan is not None:
            x = h.getSolution().col_value
            plan["R"] = {key for key, c in cmap["R"].items() if x[c] > 0.5}
            plan["S"] = {key for key, c in cmap["S"].items() if x[c] > 0.5}
    if timings is not None:
        timings["build"] = t1 - t0
        timings["solve"] = t2 - t1
    return status, obj, t2 - t0


# --------------------------------------------------------------------------------------------
# Pyomo: plain indexed Vars over sparse sets, Constraint rules
# --------------------------------------------------------------------------------------------
def build_pyomo(graph, budget: float):
    """Build the Checkmate MILP as a Pyomo ConcreteModel. `budget` in bytes."""
    import pyomo.environ as pyo

    st = structure(graph, budget)
    n, mem, B = st.n, st.mem, st.budget
    r_idx, s_idx, f_idx, u_idx = index_sets(st)

    m = pyo.ConcreteModel(name="checkmate")
    m.T = pyo.RangeSet(0, n - 1)
    m.RI = pyo.Set(dimen=2, initialize=r_idx, ordered=True)
    m.SI = pyo.Set(dimen=2, initialize=s_idx, ordered=True)
    m.FI = pyo.Set(dimen=3, initialize=f_idx, ordered=True)
    m.UI = pyo.Set(dimen=2, initialize=u_idx, ordered=True)
    m.DI = pyo.Set(dimen=3, ordered=True,
                   initialize=[(t, i, k) for t in range(n) for i, k in st.edges if k <= t])
    m.UN = pyo.Set(dimen=2, ordered=True, initialize=[(t, k) for t in range(n) for k in range(t)])

    m.R = pyo.Var(m.RI, domain=pyo.Binary)
    m.S = pyo.Var(m.SI, domain=pyo.Binary)
    m.FREE = pyo.Var(m.FI, domain=pyo.Binary)
    m.U = pyo.Var(m.UI, bounds=(0, B))

    def diag(m, t):
        return m.R[t, t] == 1

    def keep(m, t, i):
        prev_s = m.S[t - 1, i] if (t - 1, i) in m.SI else 0
        return m.S[t, i] <= m.R[t - 1, i] + prev_s

    def deps(m, t, i, k):
        return m.R[t, k] <= m.R[t, i] + m.S[t, i]

    def mem0(m, t):
        return m.U[t, 0] == pyo.quicksum(mem[i] * m.S[t, i] for i in range(t)) + mem[0] * m.R[t, 0]

    def mem_step(m, t, k):
        freed = pyo.quicksum(mem[i] * m.FREE[t, i, k] for i in st.free_sources(k))
        return m.U[t, k + 1] == m.U[t, k] + mem[k + 1] * m.R[t, k + 1] - freed

    def hazards(m, t, i, k):
        h = 1 - m.R[t, k]
        if t + 1 < n:
            h = h + m.S[t + 1, i]
        return h + pyo.quicksum(m.R[t, j] for j in st.later_users(i, k, t))

    def free_lo(m, t, i, k):
        return 1 - m.FREE[t, i, k] <= hazards(m, t, i, k)

    def free_hi(m, t, i, k):
        return st.big_m(i, k) * (1 - m.FREE[t, i, k]) >= hazards(m, t, i, k)

    m.c_diag = pyo.Constraint(m.T, rule=diag)
    m.c_keep = pyo.Constraint(m.SI, rule=keep)
    m.c_deps = pyo.Constraint(m.DI, rule=deps)
    m.c_mem0 = pyo.Constraint(m.T, rule=mem0)
    m.c_mem = pyo.Constraint(m.UN, rule=mem_step)
    m.c_free_lo = pyo.Constraint(m.FI, rule=free_lo)
    m.c_free_hi = pyo.Constraint(m.FI, rule=free_hi)

    m.obj = pyo.Objective(expr=pyo.quicksum(st.time[i] * m.R[t, i] for t, i in m.RI),
                          sense=pyo.minimize)
    return m


def solve_pyomo(graph, budget: float, time_limit: float | None = None, threads: int = 1,
                mip_rel_gap: float | None = None, timings: dict | None = None,
                plan: dict | None = None):
    """Build + solve the Pyomo model with appsi_highs. Returns (status, objective, seconds).

    `timings` receives "build" (model construction) and "solve" (appsi translation + HiGHS).
    """
    from pyomo.contrib.appsi.base import TerminationCondition as TC
    from pyomo.contrib.appsi.solvers import Highs

    t0 = time.perf_counter()
    m = build_pyomo(graph, budget)
    t1 = time.perf_counter()
    opt = Highs()  # == SolverFactory("appsi_highs"), without the legacy wrapper
    opt.config.stream_solver = False
    opt.config.load_solution = False
    if time_limit is not None:
        opt.config.time_limit = float(time_limit)
    if mip_rel_gap is not None:
        opt.config.mip_gap = float(mip_rel_gap)
    opt.highs_options = {"threads": int(threads)}
    res = opt.solve(m)
    t2 = time.perf_counter()
    tc = res.termination_condition
    obj = res.best_feasible_objective
    if tc == TC.optimal:
        status = "optimal"
    elif tc == TC.infeasible:
        status = "infeasible"
    elif tc == TC.maxTimeLimit:
        status = "time_limit_feasible" if obj is not None else "time_limit"
    else:
        status = str(tc.name)
    if plan is not None and obj is not None:
        res.solution_loader.load_vars()
        plan["R"] = {key for key in m.RI if m.R[key].value > 0.5}
        plan["S"] = {key for key in m.SI if m.S[key].value > 0.5}
    if timings is not None:
        timings["build"] = t1 - t0
        timings["solve"] = t2 - t1
    return status, obj, t2 - t0


# --------------------------------------------------------------------------------------------
# Semantics, imperatively: plan checker and exhaustive search (for tiny graphs)
# --------------------------------------------------------------------------------------------
def _stage_peak(st: Structure, t: int, r_t: set[int], s_t: set[int], s_next: set[int]) -> float:
    """Peak memory (MiB) of stage t under the model's accounting: start with the kept outputs;
    after computing k, free each i in preds(k)|{k} whose output is not kept into t+1 and that
    no later node of this stage uses."""
    mem = st.mem
    cur = sum(mem[i] for i in s_t)
    peak = cur
    for k in range(t + 1):
        if k not in r_t:
            continue
        cur += mem[k]
        peak = max(peak, cur)
        for i in st.free_sources(k):
            if i in s_next:
                continue
            if any(j in r_t for j in st.later_users(i, k, t)):
                continue
            cur -= mem[i]
    return peak


def simulate_plan(graph, budget: float, plan: dict, tol: float = 1e-6):
    """Check a plan {"R": {(t,i)}, "S": {(t,i)}} independently of any solver.

    Returns (valid, cost, peak_mib, problems)."""
    st = structure(graph, budget)
    n = st.n
    r = [{i for (tt, i) in plan["R"] if tt == t} for t in range(n)]
    s = [{i for (tt, i) in plan["S"] if tt == t} for t in range(n)] + [set()]
    problems = []
    for t in range(n):
        if t not in r[t]:
            problems.append(f"stage {t} does not compute {t}")
        if any(i > t for i in r[t]) or any(i >= t for i in s[t]):
            problems.append(f"stage {t} touches a node outside its index range")
        for i in s[t]:
            if t == 0 or not (i in r[t - 1] or i in s[t - 1]):
                problems.append(f"stage {t} keeps {i}, which stage {t - 1} did not hold")
        for k in r[t]:
            for i in st.preds[k]:
                if i not in r[t] and i not in s[t]:
                    problems.append(f"stage {t} computes {k} without input {i}")
    peak = max(_stage_peak(st, t, r[t], s[t], s[t + 1]) for t in range(n))
    if peak > st.budget + tol:
        problems.append(f"peak {peak:.6f} MiB over budget {st.budget:.6f} MiB")
    cost = sum(st.time[i] for t in range(n) for i in r[t])
    return (not problems), cost, peak, problems


def _subsets(items):
    items = list(items)
    for r in range(len(items) + 1):
        yield from itertools.combinations(items, r)


def brute_force(graph, budget: float, tol: float = 1e-9):
    """Exhaustive optimum of the model (tiny graphs only, n <= 7 or so).

    Dynamic programming over stages: what stages t+1.. can do depends only on (t, R[t,.],
    S[t,.]), so best(t, r_t, s_t) = min over every S[t+1,.] within what stage t holds (with
    stage t's memory in budget) and every dependency-closed R[t+1,.] of cost + best(t+1, ...).
    Every subset is tried; nothing is pruned by a bound. Returns (objective, plan) or
    (None, None) when infeasible."""

    st = structure(graph, budget)
    n = st.n
    inf = float("inf")

    def r_choices(t, s_t):
        # stage t computes t plus any subset of 0..t-1 whose inputs are all present
        for extra in _subsets(range(t)):
            r_t = frozenset(extra) | {t}
            if all(i in r_t or i in s_t for k in r_t for i in st.preds[k]):
                yield r_t

    @functools.cache
    def best(t, r_t, s_t):
        """(cost of stages t+1.., choice) with stage t fixed; choice = (r_next, s_next)."""
        if t == n - 1:
            ok = _stage_peak(st, t, r_t, s_t, frozenset()) <= st.budget + tol
            return (0.0, None) if ok else (inf, None)
        out = (inf, None)
        held = sorted((r_t | s_t) & set(range(t + 1)))
        for s_next in map(frozenset, _subsets(held)):
            if _stage_peak(st, t, r_t, s_t, s_next) > st.budget + tol:
                continue
            for r_next in r_choices(t + 1, s_next):
                c = sum(st.time[i] for i in r_next) + best(t + 1, r_next, s_next)[0]
                if c < out[0]:
                    out = (c, (r_next, s_next))
        return out

    start = (frozenset({0}), frozenset())
    cost, _ = best(0, *start)
    if cost == inf:
        return None, None
    plan = {"R": set(), "S": set()}
    state = start
    for t in range(n):
        plan["R"] |= {(t, i) for i in state[0]}
        plan["S"] |= {(t, i) for i in state[1]}
        nxt = best(t, *state)[1]
        if nxt is not None:
            state = nxt
    return st.time[0] + cost, plan


def same_matrix(graph, budget: float) -> tuple[bool, str]:
    """Whether build_highspy and build_pyomo (as appsi_highs hands it to HiGHS) give the same
    model: same costs, bounds, integrality and rows (in the same row order), columns matched
    by name. appsi numbers columns by first appearance in the constraints, so the column
    order differs; a row may be negated (Pyomo's normal form). Uses appsi's private
    var -> column map (bench code only)."""
    import highspy
    import numpy as np
    import pyomo.environ as pyo
    import scipy.sparse as sp
    from pyomo.contrib.appsi.solvers import Highs

    def csr(lp):
        a = lp.a_matrix_
        arrs = (np.asarray(a.value_), np.asarray(a.index_), np.asarray(a.start_))
        if a.format_ == highspy.MatrixFormat.kColwise:
            return sp.csc_matrix(arrs, shape=(lp.num_row_, lp.num_col_)).tocsr()
        return sp.csr_matrix(arrs, shape=(lp.num_row_, lp.num_col_))

    def rows(lp, names):
        a, out = csr(lp), []
        for r in range(lp.num_row_):
            lo_, hi_ = a.indptr[r], a.indptr[r + 1]
            terms = sorted((names[c], round(float(v), 9)) for c, v in
                           zip(a.indices[lo_:hi_], a.data[lo_:hi_]))
            lo = None if lp.row_lower_[r] <= -1e20 else round(lp.row_lower_[r], 9)
            hi = None if lp.row_upper_[r] >= 1e20 else round(lp.row_upper_[r], 9)
            if terms and terms[0][1] < 0:  # normalize the sign
                terms = [(nm, -v) for nm, v in terms]
                lo, hi = (None if hi is None else -hi), (None if lo is None else -lo)
            out.append((tuple(terms), lo, hi))
        return out

    def cols(lp, names):
        return {names[c]: (round(lp.col_cost_[c], 9), lp.col_lower_[c], lp.col_upper_[c],
                           int(lp.integrality_[c])) for c in range(lp.num_col_)}

    h, cmap = build_highspy(graph, budget)
    lp1 = h.getLp()
    names1 = [""] * lp1.num_col_
    for fam, d in cmap.items():
        for key, c in d.items():
            names1[c] = f"{fam}[{','.join(map(str, key))}]"
    m = build_pyomo(graph, budget)
    opt = Highs()
    opt.set_instance(m)
    lp2 = opt._solver_model.getLp()
    by_id = {id(v): v.name.replace(" ", "") for v in m.component_data_objects(pyo.Var)}
    names2 = [""] * lp2.num_col_
    for vid, c in opt._pyomo_var_to_solver_var_map.items():
        names2[c] = by_id[vid]
    if (lp1.num_row_, lp1.num_col_) != (lp2.num_row_, lp2.num_col_):
        return False, (f"sizes differ: {lp1.num_row_}x{lp1.num_col_} vs "
                       f"{lp2.num_row_}x{lp2.num_col_}")
    if cols(lp1, names1) != cols(lp2, names2):
        return False, "columns (cost, bounds, integrality) differ"
    r1, r2 = rows(lp1, names1), rows(lp2, names2)
    if r1 != r2:
        first = next(i for i, (a, b) in enumerate(zip(r1, r2)) if a != b)
        return False, f"row {first} differs: {r1[first]} vs {r2[first]}"
    return True, f"identical: {lp1.num_row_} rows, {lp1.num_col_} cols, {h.getNumNz()} nnz"


# --------------------------------------------------------------------------------------------
# Self-test on tiny graphs
# --------------------------------------------------------------------------------------------
def _tiny_graph(n: int, rng: random.Random, p_edge: float = 0.4):
    from schedlang.graphs.graph import Graph, Node

    nodes = [Node(name=f"v{i}", time=float(rng.randint(1, 5)), size=rng.randint(1, 4) * 2**20)
             for i in range(n)]
    edges = []
    for k in range(1, n):
        ps = [i for i in range(k) if rng.random() < p_edge]
        if not ps:
            ps = [rng.randrange(k)]  # connected-ish: every non-source node has an input
        edges += [(f"v{i}", f"v{k}") for i in ps]
    return Graph(name=f"tiny{n}", nodes=nodes, edges=edges)


def self_test(n_random: int = 30, seed: int = 1, verbose: bool = True) -> int:
    """Compare brute force, highspy and Pyomo on random tiny DAGs (3..7 nodes) and small
    chains. Budgets are whole MiB (no tolerance questions): for each graph the brute force
    sweeps every budget from the largest output to the no-recomputation peak; the MILPs are
    checked at the smallest feasible budget, the one below it (infeasible), the peak and one
    or two in between. Every plan found is replayed by `simulate_plan`. Returns #failures."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from graphs import chain_graph, no_recompute_peak

    rng = random.Random(seed)
    graphs = [_tiny_graph(rng.randint(3, 7), rng) for _ in range(n_random)]
    graphs += [chain_graph(2), chain_graph(3)]
    cases = []
    for g in graphs:
        peak_mib = no_recompute_peak(g) // 2**20
        sweep = {}
        for b in range(max(nd.size for nd in g.nodes) // 2**20, peak_mib + 1):
            sweep[b] = brute_force(g, b * 2**20)[0]
        assert sweep[peak_mib] == sum(nd.time for nd in g.nodes), "peak must allow no recompute"
        feasible = [b for b, v in sweep.items() if v is not None]
        picks = {feasible[0], peak_mib, feasible[0] - 1}
        picks |= set(rng.sample(feasible, min(2, len(feasible))))
        for b in sorted(picks):
            if b in sweep:
                cases.append((g, b * 2**20, sweep[b]))

    failures = 0
    n_recompute = 0
    for idx, (g, budget, swept) in enumerate(cases):
        bf_obj, bf_plan = brute_force(g, budget)
        hplan, pplan = {}, {}
        hs, ho, _ = solve_highspy(g, budget, mip_rel_gap=0.0, plan=hplan)
        ps, po, _ = solve_pyomo(g, budget, mip_rel_gap=0.0, plan=pplan)
        if bf_obj is None:
            ok = hs == "infeasible" and ps == "infeasible"
        else:
            n_recompute += bf_obj > sum(nd.time for nd in g.nodes)
            ok = (hs == "optimal" and ps == "optimal"
                  and abs(ho - bf_obj) < 1e-6 and abs(po - bf_obj) < 1e-6)
            for name, plan, obj in (("brute", bf_plan, bf_obj), ("highspy", hplan, ho),
                                    ("pyomo", pplan, po)):
                if plan:
                    valid, cost, _, probs = simulate_plan(g, budget, plan)
                    if not valid or abs(cost - obj) > 1e-6:
                        ok = False
                        print(f"  {name} plan fails the checker: {probs} cost={cost} obj={obj}")
        ok = ok and swept == bf_obj
        failures += not ok
        if verbose or not ok:
            print(f"[{'ok' if ok else 'FAIL'}] case {idx:3d} {g.name:7s} n={len(g.nodes)} "
                  f"|E|={len(g.edges):2d} budget={budget // 2**20:3d} MiB  brute={bf_obj}  "
                  f"highspy={hs}/{ho}  pyomo={ps}/{po}")
    print(f"{len(cases) - failures}/{len(cases)} cases agree "
          f"({n_recompute} feasible cases need recomputation)")

    # the two builders must hand HiGHS the same matrix, also on graphs too big to enumerate
    from graphs import load_shared

    bigger = [graphs[0], chain_graph(8), chain_graph(16)]
    try:
        bigger.append(load_shared("vgg16_train"))
    except OSError:
        pass
    for g in bigger:
        same, msg = same_matrix(g, int(0.9 * no_recompute_peak(g)))
        failures += not same
        print(f"[{'ok' if same else 'FAIL'}] highspy vs Pyomo matrix, {g.name}: {msg}")
    return failures


if __name__ == "__main__":
    sys.exit(1 if self_test() else 0)
