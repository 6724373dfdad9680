"""Exact optimum of the offloading phase model by enumeration (a test oracle for tiny layered graphs).

`best_offload_plan(graph, peak_budget, save_budget=None, host_budget=None, halves=True)
-> (time | None, Plan | None)`.

The space is the one the header of `models/offload.sched` describes, with transfer fractions
on a grid (halves: each offload or prefetch moves 0, 1/2 or all of a tensor in a phase):

* compute sequences are H-Rockmate's (`tests/bruteforce_rockmate.py`): phase t computes node t
  last (the frontier) and any recomputations of nodes k < t before it, in H-graph order, the
  loss exactly once;
* a tensor is a datum that may be offloaded (an input, or made by a forward; not ``pinned``) or
  the phantom of a layer option (not ``pinned``, not empty). Transfers run only during the
  frontier step of a phase, and only when both bandwidths are positive:

  - offload (1/2 or 1 of the tensor) of a tensor on the device while the frontier runs (a
    datum alive and complete just before it, a phantom saved), at most the whole tensor on the
    host in all; a phantom's host copy belongs to one option. A phantom is not offloaded in
    the phase of its backward (the backward consumes it during the step);
  - prefetch rounds: a round brings back the whole tensor in one or two steps (1, or 1/2 and
    1/2 in two phases, not necessarily consecutive), never more than the host held at the start
    of the phase; the device memory of the whole tensor is held from the round's first step to
    its end, when the tensor is on the device again (a datum complete, a phantom saved with its
    host copy's option). One copy: the tensor is not on the device (nor made, nor used) while a
    round is in progress;
  - the step lasts max(compute time of t, bytes offloaded / offload bandwidth, bytes
    prefetched / prefetch bandwidth);
  - a saved phantom is dropped at the end of the phase that made it, or at the end of any
    phase once all of it is on the host; otherwise it is kept until its backward.
* memory management: data are deleted right after a compute that touches them or after the
  frontier step (an offload reads the device copy during the step); a datum is kept only to be
  used again (read by a compute, or offloaded), or as an output. Keeping a datum that is not
  used again before it is deleted, re-created or the plan ends is never better than deleting
  it at once (memory is pointwise smaller, nothing else changes), so such branches are cut
  (the datum "owes a use", as in `bruteforce_rockmate`). Prefetching or offloading a tensor
  that nothing can use afterwards is cut likewise (it only adds time, host and device memory).
  With ``dominance=True`` (the default), a phantom-saving forward whose phantom is dropped
  with no complete host copy (so never consumed) is cut when fast_forward dominates it
  (`bruteforce_rockmate._Evaluator.ff_dominates`).

Validity, peak, loss-phase memory, host memory and time are those of
`schedlang.plans.simulate.simulate`, the referee: the search steps the simulator's rules, and the plan
returned has been replayed by it (valid, within the budgets, its time the returned time; an
`AssertionError` otherwise). With ``check=True`` every transition the search takes or rejects
for validity or memory is replayed by `simulate` as well (slow; tests/models/test_offload.py runs it
on the smallest instances), so the search's stepping is held to the simulator everywhere it
goes.

The search: depth first over phases and within a phase over the nodes (not recomputed first,
then options cheapest first), then the frontier step with its transfers; memoized on the
exact state (phase, position, live data and contributions, what is owed, host copies, rounds
in progress, saved phantoms), pruned by the best time found (spent time plus the cheapest
remaining frontier computations; transfers only add time).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from itertools import product

from schedlang.graphs.graph import Graph
from schedlang.plans.plan import Op, Plan
from schedlang.plans.simulate import simulate

from .bruteforce_rockmate import _below, _Evaluator, best_rockmate_plan

MAX_COMPUTE_NODES = 5  # 2 layers: 2 forwards, the loss, 2 backwards


@dataclass
class OffloadStats:
    states: int = 0  # search nodes expanded
    memo: int = 0  # distinct states remembered
    complete: int = 0  # improving complete plans found
    checked: int = 0  # transitions replayed by `simulate` (check=True)
    seconds: float = 0.0


class _Space:
    """The instance, indexed: the rockmate evaluator's arrays plus what may move."""

    def __init__(self, graph: Graph, halves: bool):
        ev = _Evaluator(graph)
        self.ev = ev
        self.graph = graph
        self.T, self.loss = ev.T, ev.loss
        self.nd = len(ev.data)
        self.nl = len(ev.layers)
        self.steps_per_whole = 2 if halves else 1
        bw_o = float(graph.bandwidths.get("offload", 0) or 0)
        bw_p = float(graph.bandwidths.get("prefetch", 0) or 0)
        self.moves = bw_o > 0 and bw_p > 0
        self.sec_o = 0.0 if math.isinf(bw_o) or not self.moves else 1.0 / bw_o
        self.sec_p = 0.0 if math.isinf(bw_p) or not self.moves else 1.0 / bw_p
        pinned = {d.name for d in graph.data if d.pinned}
        first_creator = [min(c) if c else -1 for c in ev.creators]
        self.od = [self.moves and ev.data[d] not in pinned
                   and (d in ev.inputs or 0 <= first_creator[d] < self.loss)
                   for d in range(self.nd)]
        self.op_ok = []  # per layer and layer option: its phantom may move
        for j, layer in enumerate(graph.layers):
            self.op_ok.append([self.moves and not o.pinned and self.ev.phantom[j][lo] > 0
                               for lo, o in enumerate(layer.options)])
        self.fwd_of = [-1] * self.nl
        self.bwd_of = [-1] * self.nl
        for i in range(self.T):
            j = ev.layer[i]
            if ev.kind[i] == "fwd":
                self.fwd_of[j] = i
            elif ev.kind[i] == "bwd":
                self.bwd_of[j] = i
        self.readers, self.may_read = ev.readers, ev.may_read

    def read_later(self, d: int, t: int) -> bool:
        """Some compute of a phase after t can read d."""
        return self.may_read(d, t, t)


# ---------------------------------------------------------------------- the search
def _search(sp: _Space, peak_budget: int, save_budget: int | None, host_budget: int | None,
            dominance: bool, check: bool, st: OffloadStats, bound: float):
    ev = sp.ev
    T, loss, nd, nl = sp.T, sp.loss, sp.nd, sp.nl
    reads, writes, kind, layer, opt_lo = ev.reads, ev.writes, ev.kind, ev.layer, ev.opt_lo
    size, full, phantom = ev.size, ev.full, ev.phantom
    is_output = ev.is_output
    W = sp.steps_per_whole
    rest = [0.0] * (T + 1)
    for t in range(T - 1, -1, -1):
        rest[t] = rest[t + 1] + ev.min_time[t]
    best = [bound]
    best_trace: list[list | None] = [None]
    trace: list[tuple] = []  # the decisions so far (see `_ops`)
    memo: dict[tuple, float] = {}

    def sim_check(extra: list[tuple], ok: bool, why: str) -> None:
        """check=True: the simulator agrees with the search on trace + extra (a prefix): `ok`
        means no op error and within the peak budget (and the save and host budgets)."""
        ops = _ops(sp, trace + extra)
        res = simulate(Plan(graph=sp.graph.name, ops=ops), sp.graph, budget=peak_budget,
                       save_budget=save_budget if save_budget is not None else 2**62,
                       host_budget=host_budget)
        st.checked += 1
        op_errors = [e for e in res.errors if e.startswith("op ")]
        sim_ok = not op_errors and res.peak_bytes <= peak_budget and (
            save_budget is None or res.save_peak_bytes is None
            or res.save_peak_bytes <= save_budget)
        if sim_ok != ok:
            raise AssertionError(f"bruteforce_offload: the search says {'ok' if ok else why}, the "
                                 f"simulator {res.errors or 'ok'} (peak {res.peak_bytes}, save "
                                 f"{res.save_peak_bytes})\n" + "\n".join(str(o) for o in ops))

    def run(i: int, o: int, t: int, cont: list, owe: int, saved: list, prog: tuple,
            pprog: tuple):
        """The effects of computing (i, o) on copies of the state (`cont`, `saved` are
        changed): (add, new, ph, owe after its reads), or "invalid" (the simulator rejects
        it) or "pruned" (valid, but the model forbids it or it is never better)."""
        ki, j, lo = kind[i], layer[i], opt_lo[i][o]
        for d in reads[i][o]:
            if cont[d] != full[d]:
                return "invalid"  # absent (or in a prefetch round), or incomplete
        if ki == "bwd" and saved[j] != lo:
            return "invalid"
        add = 0
        new = []
        for d, bit in writes[i]:
            if prog[d]:
                return "invalid"  # created during a prefetch round: one copy at a time
            cur = cont[d]
            if cur >= 0:
                if cur & bit:
                    # a gradient accumulated twice; a single creator re-creating its live
                    # datum (the model forbids it; eager deletion is never worse)
                    return "invalid" if ev.ncre[d] > 1 else "pruned"
                cont[d] = cur | bit
            else:
                add += size[d]
                new.append(d)
                cont[d] = bit
        ph = 0
        if ki == "fwd" and lo >= 0:
            if pprog[j] or (saved[j] >= 0 and saved[j] != lo):
                return "invalid"
            if saved[j] >= 0:
                return "pruned"  # replaces the same phantom: the model keeps one per layer
            ph = phantom[j][lo]
        w = owe
        for d in reads[i][o]:
            w &= ~(1 << d)
        return add, new, ph, w

    def manage(i: int, o: int, t: int, cont: list, w: int, frontier: bool):
        """Keep / delete choices for the data touched by (i, o): [(datum, (choices))]."""
        touched = sorted(set(reads[i][o]) | {d for d, _ in writes[i]})
        out = []
        for d in touched:
            if cont[d] < 0:
                continue
            if w >> d & 1:
                out.append((d, (True,)))  # accumulated while owing a use: stays
            elif (sp.read_later(d, t) if frontier else sp.may_read(d, t, i)) or is_output[d]:
                out.append((d, (True, False)))
            else:
                out.append((d, (False,)))
        return out

    def search(t, k, cont, owe, host, prog, saved, made, phost, phopt, pprog, mem, spent):
        key = (t, k, cont, owe, host, prog, saved, made, phost, phopt, pprog)
        prev = memo.get(key)
        if prev is not None and not _below(spent, prev):
            return
        memo[key] = spent
        st.states += 1
        if k == t:
            frontier(t, cont, owe, host, prog, saved, made, phost, phopt, pprog, mem, spent)
            return
        nxt = k + 1 if k + 1 != loss else k + 2
        nxt = min(nxt, t)
        search(t, nxt, cont, owe, host, prog, saved, made, phost, phopt, pprog, mem, spent)
        for o in ev.by_time[k]:
            cost = spent + ev.opt_time[k][o]
            if not _below(cost + rest[t], best[0]):
                break
            c = list(cont)
            sv = list(saved)
            r = run(k, o, t, c, owe, sv, prog, pprog)
            if isinstance(r, str):
                if check and r == "invalid":
                    sim_check([("c", k, o, ())], False, r)
                continue
            add, new, ph, w = r
            j, lo = layer[k], opt_lo[k][o]
            mk = made
            m2 = mem + add + ph
            if kind[k] == "fwd" and lo >= 0:
                sv[j] = lo
                mk = made | 1 << j
            elif kind[k] == "bwd":
                m2 -= phantom[j][lo]
                sv[j] = -1
                mk = made & ~(1 << j)
            choices = manage(k, o, t, c, w, False)
            sample = t == loss
            for combo in product(*(ch for _, ch in choices)):
                freed = [d for (d, _), keep in zip(choices, combo) if not keep]
                here = ev.op_peak(k, o, mem, add, new, ph, freed)
                c2, w2, m3 = _after_frees(choices, combo, c, w, m2, size)
                ok = here <= peak_budget and not (sample and save_budget is not None
                                                  and m3 > save_budget)
                step = ("c", k, o, tuple(freed))
                if check:
                    sim_check([step], ok, "over a budget")
                if not ok:
                    continue
                trace.append(step)
                search(t, nxt, tuple(c2), w2, host, prog, tuple(sv), mk, phost, phopt, pprog,
                       m3, cost)
                trace.pop()

    def frontier(t, cont, owe, host, prog, saved, made, phost, phopt, pprog, mem, spent):
        # offload candidates: (tensor, [fractions in steps])
        ofl = []
        prf = []
        if sp.moves:
            for d in range(nd):
                if not sp.od[d]:
                    continue
                if cont[d] >= 0:
                    if cont[d] == full[d] and host[d] < W and sp.read_later(d, t):
                        ofl.append((d, range(0, W - host[d] + 1)))
                elif host[d] > 0 and sp.read_later(d, t):
                    # a round: at most what the host holds (offloads of earlier phases)
                    prf.append((d, range(0, host[d] - prog[d] + 1)))
            for j in range(nl):
                if not (sp.fwd_of[j] < t < sp.bwd_of[j]):
                    continue
                x = nd + j
                if saved[j] >= 0:
                    lo = saved[j]
                    if sp.op_ok[j][lo] and phost[j] < W and (phost[j] == 0 or phopt[j] == lo):
                        ofl.append((x, range(0, W - phost[j] + 1)))
                elif phost[j] > 0:
                    prf.append((x, range(0, phost[j] - pprog[j] + 1)))
        for fo in product(*(r for _, r in ofl)):
            for fp in product(*(r for _, r in prf)):
                frontier_with(t, cont, owe, host, prog, saved, made, phost, phopt, pprog, mem,
                              spent, [(x, f) for (x, _), f in zip(ofl, fo) if f],
                              [(x, f) for (x, _), f in zip(prf, fp) if f])

    def frontier_with(t, cont, owe, host, prog, saved, made, phost, phopt, pprog, mem, spent,
                      offl, pref):
        ki, j = kind[t], layer[t]
        # the step's time: compute, offload and prefetch channels
        ob = sum(f * (size[x] if x < nd else phantom[x - nd][saved[x - nd]]) for x, f in offl) / W
        pb = sum(f * (size[x] if x < nd else phantom[x - nd][phopt[x - nd]]) for x, f in pref) / W
        transfer = max(ob * sp.sec_o, pb * sp.sec_p)
        # host memory (checked at each offload; it only grows)
        host2 = list(host)
        phost2 = list(phost)
        phopt2 = list(phopt)
        hb = 0.0
        for x, f in offl:
            if x < nd:
                host2[x] += f
            else:
                phost2[x - nd] += f
                phopt2[x - nd] = saved[x - nd]
        for d in range(nd):
            hb += host2[d] * size[d] / W
        for jj in range(nl):
            if phost2[jj]:
                hb += phost2[jj] * phantom[jj][phopt2[jj]] / W
        host_ok = host_budget is None or hb <= host_budget + 1e-9 * max(1.0, host_budget)
        # new rounds allocate the whole tensor's buffer before the compute
        prog2 = list(prog)
        pprog2 = list(pprog)
        m0 = mem
        for x, f in pref:
            if x < nd:
                if not prog2[x]:
                    m0 += size[x]
                prog2[x] += f
            else:
                if not pprog2[x - nd]:
                    m0 += phantom[x - nd][phopt[x - nd]]
                pprog2[x - nd] += f
        pre = [("o", x, f) for x, f in offl] + [("p", x, f) for x, f in pref]
        for o in ev.by_time[t]:
            cost = spent + max(ev.opt_time[t][o], transfer)
            if not _below(cost + rest[t + 1], best[0]):
                continue  # options are cheapest first, but transfers may dominate: go on
            c = list(cont)
            sv = list(saved)
            r = run(t, o, t, c, owe, sv, tuple(prog2), tuple(pprog2)) if host_ok else "invalid"
            if isinstance(r, str):
                if check and r == "invalid":
                    sim_check([("f", t, o, tuple(pre), (), (), ())], False, r)
                continue
            add, new, ph, w = r
            lo = opt_lo[t][o]
            mk = made
            m2 = m0 + add + ph
            if ki == "fwd" and lo >= 0:
                sv[j] = lo
                mk = made | 1 << j
            elif ki == "bwd":
                m2 -= phantom[j][lo]
                sv[j] = -1
                mk = made & ~(1 << j)
            # offloads are uses; arrivals are on the device and owe a use
            for x, _f in offl:
                if x < nd:
                    w &= ~(1 << x)
            arrived = []
            for x in range(nd):
                if prog2[x] >= W:
                    prog2[x] = 0
                    c[x] = full[x]
                    w |= 1 << x
                    arrived.append(x)
            for jj in range(nl):
                if pprog2[jj] >= W:
                    pprog2[jj] = 0
                    sv[jj] = phopt2[jj]
                    arrived.append(nd + jj)
            # what stays after the step: the touched data, then every other live datum
            choices = manage(t, o, t, c, w, True)
            touched = {d for d, _ in choices}
            for d in range(nd):
                if c[d] < 0 or d in touched:
                    continue
                if w >> d & 1:
                    choices.append((d, (True,)))  # owes a use in a later phase
                elif sp.read_later(d, t) or is_output[d]:
                    choices.append((d, (True, False)))
                else:
                    choices.append((d, (False,)))
            pch = []
            for jj in range(nl):
                if sv[jj] < 0:
                    continue
                if mk >> jj & 1:  # made in this phase: may go (wasted unless all on the host)
                    if phost2[jj] >= W and phopt2[jj] == sv[jj]:
                        pch.append((jj, (True, False)))
                    elif dominance and ev.ff_dominates[sp.fwd_of[jj]][
                            ev.opt_names[sp.fwd_of[jj]].index(
                                sp.graph.layers[jj].options[sv[jj]].name)]:
                        pch.append((jj, (True,)))
                    else:
                        pch.append((jj, (True, False)))
                elif nd + jj in arrived:
                    pch.append((jj, (True,)))  # dropping what just came back is never useful
                elif phost2[jj] >= W and phopt2[jj] == sv[jj]:
                    pch.append((jj, (True, False)))
                else:
                    pch.append((jj, (True,)))
            if t == T - 1:
                pch = [(jj, tuple(x for x in ch if not x) or (None,)) for jj, ch in pch]
                if any(ch == (None,) for _, ch in pch):
                    continue  # a phantom saved at the end that may not be dropped
                choices = [(d, ch if not (is_output[d]) else (True,)) for d, ch in choices]
            sample = t == loss or t == loss - 1
            for combo in product(*(ch for _, ch in choices)):
                freed = [d for (d, _), keep in zip(choices, combo) if not keep]
                here = ev.op_peak(t, o, m0, add, new, ph, freed)
                c2, w2, m3 = _after_frees(choices, combo, c, w, m2, size)
                for pcombo in product(*(ch for _, ch in pch)):
                    sv2 = list(sv)
                    m4 = m3
                    dropped = []
                    for (jj, _), keep in zip(pch, pcombo):
                        if not keep:
                            m4 -= phantom[jj][sv2[jj]]
                            sv2[jj] = -1
                            dropped.append(jj)
                    ok = here <= peak_budget and not (
                        sample and save_budget is not None and m4 > save_budget)
                    step = ("f", t, o, tuple(pre), tuple(freed), tuple(dropped), tuple(arrived))
                    if check:
                        sim_check([step], ok, "over a budget")
                    if not ok:
                        continue
                    cost = spent + max(ev.opt_time[t][o], transfer)
                    if t == T - 1:
                        if finished(c2, w2, sv2, prog2, pprog2) and _below(cost, best[0]):
                            st.complete += 1
                            best[0] = cost
                            best_trace[0] = trace + [step]
                        continue
                    if not _below(cost + rest[t + 1], best[0]):
                        continue
                    trace.append(step)
                    search(t + 1, 0, tuple(c2), w2, tuple(host2),
                           tuple(prog2), tuple(sv2), 0, tuple(phost2), tuple(phopt2),
                           tuple(pprog2), m4, cost)
                    trace.pop()

    def finished(cont, owe, saved, prog, pprog) -> bool:
        for d in range(nd):
            if is_output[d]:
                if cont[d] != full[d]:
                    return False
            elif owe >> d & 1:
                return False
        return all(s < 0 for s in saved) and not any(prog) and not any(pprog)

    cont0 = [-1] * nd
    owe0 = 0
    for d in ev.inputs:
        if sp.readers[d]:
            cont0[d] = full[d]
            owe0 |= 1 << d
    if sum(size[d] for d in ev.inputs) <= peak_budget:
        search(0, 0, tuple(cont0), owe0, (0,) * nd, (0,) * nd, (-1,) * nl, 0, (0,) * nl,
               (-1,) * nl, (0,) * nl, sum(size[d] for d in ev.inputs if sp.readers[d]), 0.0)
    st.memo = len(memo)
    return best_trace[0]


def _ops(sp: _Space, trace: list[tuple]) -> list[Op]:
    """The plan's ops for a trace of steps, in the phases decoder's order: a recomputation and
    the deletes right after it; the frontier's offloads and prefetches, its compute, a wait per
    transfer, then the deletes and phantom drops that end the phase."""
    ev = sp.ev
    W = sp.steps_per_whole
    ops: list[Op] = [Op("delete", data=ev.data[d]) for d in ev.inputs if not sp.readers[d]]

    def target(x: int) -> dict:
        return {"data": ev.data[x]} if x < sp.nd else {"layer": ev.layers[x - sp.nd]}

    def compute(i: int, o: int) -> Op:
        return Op("compute", node=ev.names[i],
                  option=None if ev.kind[i] == "loss" else ev.opt_names[i][o])

    for step in trace:
        if step[0] == "c":
            _, k, o, freed = step
            ops.append(compute(k, o))
            ops += [Op("delete", data=ev.data[d]) for d in freed]
        else:
            _, t, o, pre, freed, dropped, _arrived = step
            for kind, x, f in pre:
                ops.append(Op("offload" if kind == "o" else "prefetch",
                              fraction=None if f == W else f / W, **target(x)))
            ops.append(compute(t, o))
            for kind, x, _f in pre:
                ops.append(Op("wait", channel="offload" if kind == "o" else "prefetch",
                              **target(x)))
            ops += [Op("delete", data=ev.data[d]) for d in freed]
            ops += [Op("drop_phantom", layer=ev.layers[j]) for j in dropped]
    return ops


# ---------------------------------------------------------------------- entry point
def best_offload_plan(graph: Graph, peak_budget: int, save_budget: int | None = None,
                      host_budget: int | None = None, *, halves: bool = True,
                      dominance: bool = True, check: bool = False, seed: bool = True,
                      stats: OffloadStats | None = None) -> tuple[float | None, Plan | None]:
    """(least total time, a plan reaching it) over the space of the module docstring, with
    the graph's bandwidths (``graph.bandwidths``), within the peak budget, the save budget
    (memory of the loss phase) and the host budget when given; (None, None) when no plan
    fits. `halves=False`: transfers move whole tensors only. `seed`: bound the search by the
    optimum without transfers (`bruteforce_rockmate`), a plan of this space; `check`: replay
    every transition with the simulator (see the module docstring)."""
    t0 = time.perf_counter()
    sp = _Space(graph, halves)
    if sp.T > MAX_COMPUTE_NODES:
        raise ValueError(f"brute force is for H-graphs of at most {MAX_COMPUTE_NODES} compute "
                         f"nodes, not {sp.T}")
    st = stats if stats is not None else OffloadStats()
    # the plans without transfers are H-Rockmate's: its optimum bounds the search, which then
    # looks for strictly better plans only (`seed=False`: no bound)
    base_time, base_plan = (best_rockmate_plan(graph, peak_budget, save_budget) if seed
                            else (None, None))
    bound = base_time if base_time is not None else math.inf
    trace = _search(sp, peak_budget, save_budget, host_budget, dominance, check, st, bound)
    st.seconds = time.perf_counter() - t0
    if trace is None:
        if base_plan is None:
            return None, None
        plan = base_plan
    else:
        plan = Plan(graph=graph.name, ops=_ops(sp, trace), budget_peak=peak_budget,
                    budget_save=save_budget, meta={"planner": "bruteforce_offload"})
    res = simulate(plan, graph, budget=peak_budget,
                   save_budget=save_budget if save_budget is not None else peak_budget,
                   host_budget=host_budget)
    if not res.valid or not res.fits_budget:
        raise AssertionError(f"bruteforce_offload: the search accepted a plan the simulator "
                             f"rejects: {res.errors}\n" + "\n".join(str(op) for op in plan.ops))
    plan.predicted_peak = res.peak_bytes
    plan.predicted_time = res.time
    return res.time, plan


def _after_frees(choices, combo, created, written, mem, size):
    """The state after an op's frees: each datum of `choices` kept (`combo` True: marked
    written) or freed (its creator forgotten, unwritten, its bytes released)."""
    created = list(created)
    for (d, _), keep in zip(choices, combo):
        if keep:
            written |= 1 << d
        else:
            created[d] = -1
            written &= ~(1 << d)
            mem -= size[d]
    return created, written, mem
