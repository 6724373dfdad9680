"""Exact optimum of the H-Rockmate phase model by enumeration (a test oracle for tiny layered graphs).

`best_rockmate_plan(graph, peak_budget, save_budget=None) -> (time | None, Plan | None)`.

The space is the one `models/rockmate.sched` expresses (its header comments state where it
departs from the seed):

* phase t = 0..T-1 follows the H-graph order (forwards, the loss, backwards reversed). Phase t
  computes node t (its first computation) and any subset of the nodes k < t (recomputations),
  all in H-graph order, each once, each with one option: a forward with one of its layer's
  options or ``fast_forward``, a backward with one of its layer's options. The loss runs exactly
  once, in its own phase.
* memory management is a function of the compute sequence, chosen so that no management the
  model can express does better (so the optimum over this space is the model's):

  - data: after each compute, every datum it read or wrote is deleted unless its content is
    read again. Looking forward through the datum's events: a read keeps it; a creator whose
    contribution is already in it (a recomputation of its single creator, or a second
    contribution of the same creator to an accumulated gradient) means this content is never
    read, so it goes now; a creator that has not contributed yet accumulates into it and the
    look goes on. At the end, ``output`` data are kept. An input nobody reads is deleted before
    the first op. Each datum goes at the earliest point the model can delete it (`D[t, k, d]`
    right after a creator or a user of d), so memory is pointwise minimal; in particular a datum
    is never alive when its only creator runs again;
  - phantoms: the phantom saved by a forward with option o is kept until the backward of its
    layer when the next event of the layer among {its backward, a forward with an option other
    than fast_forward} is the backward run with option o (it consumes it); otherwise it is
    dropped at the end of the phase in which it was made: the model cannot drop a phantom in the
    middle of a phase (`Sp` is per phase: it is counted until the phase ends). The model's
    one-phantom rule (no phantom-saving forward of a layer while a phantom of the layer is saved
    from an earlier phase) holds by construction.

* sub-step profiles (the correction terms) count as in the simulator: the peak of an op with a
  profile is the largest of its end state and its steps, a step not counting the inputs it
  frees that are deleted right after the op; deleting as early as possible is still best.
* validity, peak, loss-phase memory and time are those of `schedlang.plans.simulate.simulate`, the
  referee: every plan returned has been replayed by it (valid, within both budgets, its time the
  returned time; an `AssertionError` otherwise). The search itself steps the simulator's rules
  (`schedlang.plans.simulate`'s module docstring) op by op; `tests/models/test_rockmate_bruteforce.py` checks
  this stepping against `simulate` (`_Evaluator.evaluate` on random sequences) and the search
  against one that replays every prefix with `simulate` itself (``engine="replay",
  prune_with="simulate"``).

The search (`_search_states`): depth first over phases, in each phase over the nodes k < t
(first "not recomputed", then the options cheapest first), then node t. The management is not
looked up in the future: after each compute each datum it touched is either kept, and then owes
a read (being re-created, deleted, or left at the end before that read kills the branch), or
deleted (a later read of it kills the branch); phantoms likewise. So each compute sequence
keeps exactly one management, the one above, and the state after a prefix is exact: live data
with their contributions, what is owed, saved phantoms, memory. Cuts, each keeping an optimal
plan of the space:

* a step over the peak budget, or (in the loss phase, and right after the first computation of
  the last forward) over the save budget, or invalid;
* time: spent time plus the cheapest remaining frontier computations reaching the best time
  found (times are non-negative);
* memo: a state (phase, next node, memory state) reached before at no greater time (what follows
  depends only on the state);
* dominance (``dominance=True``, the default): a forward run with an option other than
  fast_forward whose phantom is dropped unconsumed, when the same plan with fast_forward there
  (no phantom, the same data) is valid, no slower and never holds more memory: fast_forward's
  time is at most the option's and its transient memory (overhead, or largest step) at most
  the option's phantom plus its flat overhead (plus nothing, with a profile): the cut is not
  made otherwise; the tests check on small instances that ``dominance=False`` finds the same
  optima.

Search size: the space holds prod_t (options of t) * prod_{k < t, k != loss} (1 + options of k)
compute sequences (`SearchStats.space`): 3*12*16*32*96 ~ 1.8e6 for 2 layers of 2 options,
4*20*25*75*300 ~ 4.5e7 for 2 layers of 3 options, 3.4e15 for 3 layers of 3 options. The search
expands 1e3-1e4 states for 2 layers and 1e4-5e4 for 3 layers of 3 options (0.05-0.3 s; see
`SearchStats`).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from schedlang.graphs.graph import Graph
from schedlang.graphs.hgraph import FAST_FORWARD, build_hgraph
from schedlang.plans.plan import Op, Plan
from schedlang.plans.simulate import simulate

MAX_COMPUTE_NODES = 7  # 3 layers: 3 forwards, the loss, 3 backwards

#: relative slack on time comparisons (times are sums of floats)
_EPS = 1e-9


def _below(x: float, best: float) -> bool:
    """x is better than best by more than rounding (best may be infinite)."""
    return x < best - _EPS * max(1.0, abs(best)) if math.isfinite(best) else True


@dataclass
class SearchStats:
    space: int = 0  # compute sequences in the space
    states: int = 0  # search nodes expanded (states, or prefixes for the replay engine)
    memo: int = 0  # distinct states remembered (states engine)
    complete: int = 0  # improving complete plans found
    verified: int = 0  # plans replayed by `simulate`
    seconds: float = 0.0


@dataclass
class _Eval:
    valid: bool
    peak: int
    save_peak: int | None  # max sample of the loss phase seen so far (None: not reached)
    ops: list[Op] = field(default_factory=list)
    wasted_phantom: bool = False  # a non-fast forward whose phantom is dropped unconsumed


class _Evaluator:
    """The H-graph of a layered graph, indexed, and the replay of a compute sequence with the
    module's memory management."""

    def __init__(self, graph: Graph):
        h = build_hgraph(graph)
        self.graph = graph
        self.h = h
        self.names = [k.name for k in h.compute]
        self.T = len(self.names)
        index = {n: i for i, n in enumerate(self.names)}
        self.kind = [k.kind for k in h.compute]
        self.layers = [layer.name for layer in graph.layers]
        layer_index = {n: j for j, n in enumerate(self.layers)}
        self.layer = [layer_index[k.layer] if k.layer is not None else -1 for k in h.compute]
        self.loss = index[h.loss]
        self.opt_names = [[o.name for o in k.options] for k in h.compute]
        self.opt_time = [[float(o.time) for o in k.options] for k in h.compute]
        self.opt_over = [[int(o.overhead) for o in k.options] for k in h.compute]
        layer_opts = [[o.name for o in layer.options] for layer in graph.layers]
        self.phantom = [[int(h.phantoms[(name, o)]) for o in opts]
                        for name, opts in zip(self.layers, layer_opts)]
        # the layer option of each node option; -1 for fast_forward and the loss
        self.opt_lo = []
        for i, k in enumerate(h.compute):
            j = self.layer[i]
            self.opt_lo.append([layer_opts[j].index(o.name) if j >= 0 and o.name != FAST_FORWARD
                                else -1 for o in k.options])
        self.data = list(h.data)
        dindex = {d: n for n, d in enumerate(self.data)}
        self.size = [int(h.data[d]) for d in self.data]
        base_uses: list[list[int]] = [[] for _ in self.names]
        for k, d in h.uses:
            if dindex[d] not in base_uses[index[k]]:
                base_uses[index[k]].append(dindex[d])
        # data read by node i run with option o (its uses plus the option's needs)
        self.reads: list[list[tuple[int, ...]]] = []
        for i in range(self.T):
            per = []
            for oname in self.opt_names[i]:
                lst = list(base_uses[i])
                for k, o, d in h.option_uses:
                    if index[k] == i and o == oname and dindex[d] not in lst:
                        lst.append(dindex[d])
                per.append(tuple(lst))
            self.reads.append(per)
        self.creators: list[list[int]] = [[] for _ in self.data]
        self.writes: list[list[tuple[int, int]]] = [[] for _ in self.names]  # (datum, bit)
        for k, d in h.creates:
            i, di = index[k], dindex[d]
            if i not in self.creators[di]:
                self.creators[di].append(i)
                self.writes[i].append((di, 1 << (len(self.creators[di]) - 1)))
        self.ncre = [len(c) for c in self.creators]
        self.full = [(1 << n) - 1 for n in self.ncre]
        self.inputs = [dindex[d] for d in h.inputs]
        self.is_output = [d in h.outputs for d in self.data]
        # options of each node, cheapest first (ties: declaration order)
        self.by_time = [sorted(range(len(t)), key=lambda o, t=t: (t[o], o)) for t in self.opt_time]
        self.min_time = [min(t) for t in self.opt_time]
        # sub-step profiles (correction terms): per node and option, [(overhead, freed inputs,
        # created outputs)]; empty: the flat overhead
        self.steps = [[[(int(st.overhead), frozenset(dindex[d] for d in st.frees),
                         frozenset(dindex[d] for d in st.creates)) for st in o.steps]
                       for o in k.options] for k in h.compute]
        # a phantom-saving forward option whose phantom is dropped unconsumed is dominated by
        # fast_forward (no slower, same data, no phantom) when fast_forward's transient memory
        # is never more than the option's: fast_forward's is at most its overhead (or largest
        # step) above the memory before plus its outputs; the option's is at least its flat
        # overhead plus its phantom, or (with a profile) its phantom (the end state)
        self.ff_dominates = []
        for i, k in enumerate(h.compute):
            row = []
            for o in range(len(k.options)):
                if self.kind[i] != "fwd" or self.opt_lo[i][o] < 0:
                    row.append(False)
                    continue
                ff = self.opt_names[i].index(FAST_FORWARD)
                ff_most = max([self.opt_over[i][ff]] + [st[0] for st in self.steps[i][ff]])
                ph = self.phantom[self.layer[i]][self.opt_lo[i][o]]
                # (with a profile, the end state less what its steps may free)
                least = (ph - sum(self.size[d] for d in frozenset().union(
                    *(st[1] for st in self.steps[i][o])))
                         if self.steps[i][o] else ph + self.opt_over[i][o])
                row.append(self.opt_time[i][ff] <= self.opt_time[i][o] and ff_most <= least)
            self.ff_dominates.append(row)
        self.readers: list[set[int]] = [set() for _ in self.data]  # the computes reading each datum
        for i in range(self.T):
            for per in self.reads[i]:
                for d in per:
                    self.readers[d].add(i)

    def may_read(self, d: int, t: int, i: int) -> bool:
        """Some compute can still read datum d after node i of phase t."""
        for u in self.readers[d]:
            if u == self.loss:
                if t < self.loss or (t == self.loss and i < self.loss):
                    return True
            elif t < self.T - 1 or i < u <= t:
                return True
        return False

    def op_peak(self, i: int, o: int, mem: int, add: int, new, ph: int, freed) -> int:
        """Memory while (i, o) runs (the simulator's rule): `mem` before it, `add` bytes of the
        data copies `new` it allocates, the phantom `ph` it saves; with a sub-step profile, each
        step counts the outputs created by then and not the freed inputs in `freed` (the data
        deleted right after the op)."""
        prof = self.steps[i][o]
        if not prof:
            return mem + add + ph + self.opt_over[i][o]
        size = self.size
        # the end state: the inputs any step frees are gone (when deleted right after), and a
        # backward's phantom is consumed
        gone = frozenset().union(*(frees for _, frees, _ in prof))
        here = mem + add + ph - sum(size[d] for d in gone if d in freed)
        if self.kind[i] == "bwd" and self.opt_lo[i][o] >= 0:
            here -= self.phantom[self.layer[i]][self.opt_lo[i][o]]
        for overhead, frees, creates in prof:
            step = (mem + ph + overhead + sum(size[d] for d in new if d in creates)
                    - sum(size[d] for d in frees if d in freed))
            here = max(here, step)
        return here

    # ------------------------------------------------------------------ replay
    def evaluate(self, seq: list[tuple[int, int, int]], final: bool, want_ops: bool = False) -> _Eval:
        """Replay `seq` ((node, option, phase) in order) with the module's management.

        `final`: the sequence is a whole plan (outputs are kept at the end, end checks apply);
        else it is a prefix, managed as if nothing followed (lower bounds on memory)."""
        n_d = len(self.data)
        reads, writes, kind, layer = self.reads, self.writes, self.kind, self.layer
        opt_lo, phantom, size = self.opt_lo, self.phantom, self.size
        loss = self.loss
        # events per datum: (position, bit) with bit 0 for a read
        events: list[list[tuple[int, int]]] = [[] for _ in range(n_d)]
        # phantom events per layer: (position, layer option, is_backward)
        pevents: list[list[tuple[int, int, bool]]] = [[] for _ in self.layers]
        for p, (i, o, _t) in enumerate(seq):
            for d in reads[i][o]:
                events[d].append((p, 0))
            for d, bit in writes[i]:
                events[d].append((p, bit))
            j = layer[i]
            if kind[i] == "bwd":
                pevents[j].append((p, opt_lo[i][o], True))
            elif kind[i] == "fwd" and opt_lo[i][o] >= 0:
                pevents[j].append((p, opt_lo[i][o], False))
        # phantom decisions: keep[p] for a phantom-saving forward at p
        drop_at_phase_end: dict[int, list[int]] = {}  # phase -> layers whose phantom drops
        wasted = False
        for j, evs in enumerate(pevents):
            for n, (p, lo, is_bwd) in enumerate(evs):
                if is_bwd:
                    continue
                if n + 1 < len(evs):
                    _q, lo2, bwd2 = evs[n + 1]
                    keep = bwd2 and lo2 == lo
                    if not keep and self.ff_dominates[seq[p][0]][seq[p][1]]:
                        wasted = True
                else:
                    keep = False  # nothing consumes it (yet)
                    if final and self.ff_dominates[seq[p][0]][seq[p][1]]:
                        wasted = True
                if not keep:
                    drop_at_phase_end.setdefault(seq[p][2], []).append(j)
        ev_next = [0] * n_d  # index of the next unprocessed event of each datum

        live = bytearray(n_d)
        mask = [0] * n_d
        for d in self.inputs:
            live[d] = 1
        saved = [-1] * len(self.layers)
        ops: list[Op] = []
        mem = sum(size[d] for d in self.inputs)
        peak = mem  # the simulator starts the peak at the inputs
        for d in self.inputs:
            if not events[d]:
                live[d] = 0
                mem -= size[d]
                if want_ops:
                    ops.append(Op("delete", data=self.data[d]))
        save_peak: int | None = None
        in_window = False
        valid = True
        for p, (i, o, t) in enumerate(seq):
            ki = kind[i]
            j = layer[i]
            lo = opt_lo[i][o]
            for d in reads[i][o]:
                if not live[d] or mask[d] != self.full[d]:
                    valid = False
            if ki == "bwd" and saved[j] != lo:
                valid = False
            add = 0
            new = []
            for d, bit in writes[i]:
                if live[d] and self.ncre[d] > 1 and not (mask[d] & bit):
                    continue  # accumulated in place
                add += size[d]
                new.append(d)
            ph = phantom[j][lo] if ki == "fwd" and lo >= 0 else 0
            mem_before = mem
            for d, bit in writes[i]:
                if not live[d]:
                    live[d] = 1
                    mem += size[d]
                    mask[d] = bit
                elif mask[d] & bit:
                    if self.ncre[d] > 1:
                        valid = False  # accumulated twice
                else:
                    mask[d] |= bit
            if ki == "fwd" and lo >= 0:
                if saved[j] < 0:
                    mem += ph
                elif saved[j] != lo:
                    valid = False
                    mem += ph - phantom[j][saved[j]]
                saved[j] = lo
            elif ki == "bwd" and saved[j] >= 0:
                mem -= phantom[j][saved[j]]
                saved[j] = -1
            if want_ops:
                ops.append(Op("compute", node=self.names[i],
                              option=None if ki == "loss" else self.opt_names[i][o]))
            # deletions after this compute, in data order
            touched = sorted({d for d in reads[i][o]} | {d for d, _ in writes[i]})
            gone = []
            for d in touched:
                evs = events[d]
                e = ev_next[d]
                while e < len(evs) and evs[e][0] <= p:
                    e += 1
                ev_next[d] = e
                if not live[d]:
                    continue
                m = mask[d]
                needed = None
                for _q, bit in evs[e:]:
                    if bit == 0:
                        needed = True
                        break
                    if m & bit:
                        needed = False
                        break
                    m |= bit
                if needed is None:
                    needed = final and self.is_output[d]
                if not needed:
                    gone.append(d)
            here = self.op_peak(i, o, mem_before, add, new, ph, gone)
            if here > peak:
                peak = here
            for d in gone:
                live[d] = 0
                mask[d] = 0
                mem -= size[d]
                if want_ops:
                    ops.append(Op("delete", data=self.data[d]))
            if i == t:  # the phase's frontier: its last compute; drop what it does not keep
                for jj in drop_at_phase_end.get(t, ()):
                    if saved[jj] >= 0:
                        mem -= phantom[jj][saved[jj]]
                        saved[jj] = -1
                        if want_ops:
                            ops.append(Op("drop_phantom", layer=self.layers[jj]))
            # the save window: samples after each compute (and what follows it) from the first
            # computation of the node before the loss through the loss
            if i == t and t == loss - 1:
                in_window = True
            if in_window:
                save_peak = mem if save_peak is None else max(save_peak, mem)
            if i == loss:
                in_window = False
        if final:
            for d in range(n_d):
                if self.is_output[d] and (not live[d] or mask[d] != self.full[d]):
                    valid = False
            if any(s >= 0 for s in saved):
                valid = False
        return _Eval(valid, peak, save_peak, ops, wasted)

    def plan(self, seq: list[tuple[int, int, int]], budget: int | None,
             save_budget: int | None) -> Plan:
        ev = self.evaluate(seq, final=True, want_ops=True)
        return Plan(graph=self.graph.name, ops=ev.ops, budget_peak=budget, budget_save=save_budget,
                    meta={"planner": "bruteforce_rockmate"})

    def plan_of(self, e: _Eval, budget: int | None = None, save_budget: int | None = None) -> Plan:
        return Plan(graph=self.graph.name, ops=e.ops, budget_peak=budget, budget_save=save_budget,
                    meta={"planner": "bruteforce_rockmate"})

    def space_size(self) -> int:
        n = 1
        for t in range(self.T):
            n *= len(self.opt_names[t])
            for k in range(t):
                if k != self.loss:
                    n *= 1 + len(self.opt_names[k])
        return n



# ---------------------------------------------------------------------- the search over states
def _search_states(ev: _Evaluator, peak_budget: int, save_budget: int | None, dominance: bool,
                   st: SearchStats, bound: float) -> list[tuple[int, int, int]] | None:
    """Depth-first search over (phase, next node of the phase, memory state), memoized.

    The memory management is not looked up in the future: after each compute, each datum it
    touched is either kept, and then *owes a read* (a read of it must come before it is
    re-created, the plan ends, or it is deleted; an ``output`` is read by the end), or deleted.
    A kept datum that is re-created, deleted or left at the end without its read, and a read of
    a datum that is absent or incomplete, end the branch; so of all the managements of a compute
    sequence exactly one survives: the module's (eager) one. Phantoms likewise: kept until the
    layer's backward consumes it, or (where the dominance cut is off) dropped at the end of the
    phase; a kept phantom meets a phantom-saving forward of its layer (the one-phantom rule), a
    backward with another option or the end: the branch ends; a dropped one meets its backward
    in the same phase: the branch ends (eager keeps it). The state after a prefix is then exact (memory,
    live data and their contributions, what is owed, saved phantoms), and the cheapest time at
    which a state was reached prunes later arrivals (what follows depends on the state only:
    the peak and the save samples are checked at each step)."""
    T, loss = ev.T, ev.loss
    nd = len(ev.data)
    reads, writes, kind, layer, opt_lo = ev.reads, ev.writes, ev.kind, ev.layer, ev.opt_lo
    size, full, phantom, over, steps = ev.size, ev.full, ev.phantom, ev.opt_over, ev.steps
    is_output = ev.is_output
    readers, may_read = ev.readers, ev.may_read

    rest = [0.0] * (T + 1)  # cheapest frontier computations of phases t..T-1
    for t in range(T - 1, -1, -1):
        rest[t] = rest[t + 1] + ev.min_time[t]
    best = [bound]
    best_seq: list[list[tuple[int, int, int]] | None] = [None]
    seq: list[tuple[int, int, int]] = []
    memo: dict[tuple, float] = {}


    def apply(i: int, o: int, t: int, cont: tuple, wait: int, saved: tuple, dropend: int,
              mem: int):
        """The states after computing (i, o) in phase t and managing what it touched."""
        ki, j, lo = kind[i], layer[i], opt_lo[i][o]
        rd = reads[i][o]
        for d in rd:
            if cont[d] != full[d]:
                return  # absent (-1) or incomplete
        if ki == "bwd" and (saved[j] != lo or dropend >> j & 1):
            return
        c = list(cont)
        add = 0
        new = []
        for d, bit in writes[i]:
            cur = c[d]
            if cur >= 0:
                if cur & bit:
                    return  # re-created while kept: eager would have deleted it
                c[d] = cur | bit  # accumulated in place
            else:
                add += size[d]
                new.append(d)
                c[d] = bit
        ph = 0
        if ki == "fwd" and lo >= 0:
            if saved[j] >= 0:
                return  # one phantom per layer
            ph = phantom[j][lo]
        profiled = bool(steps[i][o])
        if not profiled and mem + add + ph + over[i][o] > peak_budget:
            return  # with a profile: `op_peak` below
        mem2 = mem + add + ph
        sv = list(saved)
        if ki == "fwd" and lo >= 0:
            sv[j] = lo
        elif ki == "bwd":
            mem2 -= phantom[j][lo]
            sv[j] = -1
        w = wait
        for d in rd:
            w &= ~(1 << d)  # the read it owed is done
        touched = sorted(set(rd) | {d for d, _ in writes[i]})
        choices = []
        for d in touched:
            if w >> d & 1:
                choices.append((True,))  # accumulated while owing a read: stays
            elif may_read(d, t, i) or is_output[d]:
                choices.append((True, False))
            else:
                choices.append((False,))
        ph_choices = (False,)
        if ki == "fwd" and lo >= 0 and not (dominance and ev.ff_dominates[i][o]):
            ph_choices = (False, True)  # True: dropped at the end of the phase
        sample = (i == t and t == loss - 1) or t == loss
        for combo in _product(choices):
            if profiled:
                freed = [d for d, keep in zip(touched, combo) if not keep]
                if ev.op_peak(i, o, mem, add, new, ph, freed) > peak_budget:
                    continue
            c2 = list(c)
            w2 = w
            m2 = mem2
            for d, keep in zip(touched, combo):
                if keep:
                    w2 |= 1 << d
                else:
                    c2[d] = -1
                    w2 &= ~(1 << d)
                    m2 -= size[d]
            for drop in ph_choices:
                de = dropend | (1 << j) if drop else dropend
                sv2 = sv
                m3 = m2
                if i == t and de:  # the frontier ends the phase: drop what is not kept
                    sv2 = list(sv)
                    for jj in range(len(sv2)):
                        if de >> jj & 1 and sv2[jj] >= 0:
                            m3 -= phantom[jj][sv2[jj]]
                            sv2[jj] = -1
                    de = 0
                if sample and save_budget is not None and m3 > save_budget:
                    continue
                yield tuple(c2), w2, tuple(sv2), de, m3

    def finished(cont: tuple, wait: int, saved: tuple) -> bool:
        for d in range(nd):
            if is_output[d]:
                if cont[d] != full[d]:
                    return False
            elif wait >> d & 1:
                return False  # kept, never read again
        return all(s < 0 for s in saved)

    def search(t: int, k: int, cont: tuple, wait: int, saved: tuple, dropend: int, mem: int,
               spent: float) -> None:
        key = (t, k, cont, wait, saved, dropend)
        prev = memo.get(key)
        if prev is not None and not _below(spent, prev):
            return
        memo[key] = spent
        st.states += 1
        if k == t:
            for o in ev.by_time[t]:
                cost = spent + ev.opt_time[t][o]
                if not _below(cost + rest[t + 1], best[0]):
                    break
                seq.append((t, o, t))
                for c2, w2, s2, d2, m2 in apply(t, o, t, cont, wait, saved, dropend, mem):
                    if t == T - 1:
                        if finished(c2, w2, s2) and _below(cost, best[0]):
                            st.complete += 1
                            best[0] = cost
                            best_seq[0] = list(seq)
                    else:
                        search(t + 1, 0, c2, w2, s2, d2, m2, cost)
                seq.pop()
            return
        nxt = k + 1 if k + 1 != loss else k + 2
        nxt = min(nxt, t)
        search(t, nxt, cont, wait, saved, dropend, mem, spent)  # k is not recomputed
        for o in ev.by_time[k]:
            cost = spent + ev.opt_time[k][o]
            if not _below(cost + rest[t], best[0]):
                break
            seq.append((k, o, t))
            for c2, w2, s2, d2, m2 in apply(k, o, t, cont, wait, saved, dropend, mem):
                search(t, nxt, c2, w2, s2, d2, m2, cost)
            seq.pop()

    cont0 = [-1] * nd
    mem0 = 0
    wait0 = 0
    for d in ev.inputs:
        mem0 += size[d]
        if readers[d]:
            cont0[d] = full[d]
            wait0 |= 1 << d
    if sum(size[d] for d in ev.inputs) <= peak_budget:
        search(0, 0, tuple(cont0), wait0, tuple([-1] * len(ev.layers)), 0,
               sum(size[d] for d in ev.inputs if readers[d]), 0.0)
    st.memo = len(memo)
    return best_seq[0]


def _product(choices: list[tuple]):
    if not choices:
        yield ()
        return
    head, tail = choices[0], choices[1:]
    for x in head:
        for rest in _product(tail):
            yield (x,) + rest


# ---------------------------------------------------------------------- the search over prefixes
def _search_replay(ev: _Evaluator, peak_budget: int, save_budget: int | None, dominance: bool,
                   prune_with: str, st: SearchStats, bound: float
                   ) -> list[tuple[int, int, int]] | None:
    """The same space, searched by replaying every prefix from scratch (no memo): with
    `prune_with="simulate"` each prefix is replayed by `schedlang.plans.simulate.simulate` itself.
    Slow; it is the cross-check of `_search_states` on small instances."""
    T, loss = ev.T, ev.loss
    rest = [0.0] * (T + 1)
    for t in range(T - 1, -1, -1):
        rest[t] = rest[t + 1] + ev.min_time[t]
    best = [bound]
    best_seq: list[list[tuple[int, int, int]] | None] = [None]
    seq: list[tuple[int, int, int]] = []
    # simulate() falls back to the graph's save budget when given None; the save samples never
    # exceed the peak, so the peak budget stands for "no save budget" (as in the model)
    sim_save = save_budget if save_budget is not None else peak_budget


    def prefix_ok(final: bool) -> bool:
        st.states += 1
        e = ev.evaluate(seq, final=final, want_ops=prune_with == "simulate")
        if dominance and e.wasted_phantom:
            return False
        if prune_with == "fast":
            if not e.valid or e.peak > peak_budget:
                return False
            return save_budget is None or e.save_peak is None or e.save_peak <= save_budget
        res = simulate(ev.plan_of(e), ev.graph, budget=peak_budget, save_budget=sim_save)
        if final:
            return res.valid and bool(res.fits_budget)
        # a prefix: op-level errors only (the end checks concern whole plans), samples so far
        if any(msg.startswith("op ") for msg in res.errors) or res.peak_bytes > peak_budget:
            return False
        return res.save_peak_bytes is None or res.save_peak_bytes <= sim_save

    def search(t: int, k: int, spent: float) -> None:
        if k == t:
            for o in ev.by_time[t]:
                cost = spent + ev.opt_time[t][o]
                if not _below(cost + rest[t + 1], best[0]):
                    break
                seq.append((t, o, t))
                final = t == T - 1
                if prefix_ok(final):
                    if final:
                        st.complete += 1
                        best[0] = cost
                        best_seq[0] = list(seq)
                    else:
                        search(t + 1, 0, cost)
                seq.pop()
            return
        nxt = k + 1 if k + 1 != loss else k + 2
        nxt = min(nxt, t)
        search(t, nxt, spent)
        for o in ev.by_time[k]:
            cost = spent + ev.opt_time[k][o]
            if not _below(cost + rest[t], best[0]):
                break
            seq.append((k, o, t))
            if prefix_ok(False):
                search(t, nxt, cost)
            seq.pop()

    if sum(ev.size[d] for d in ev.inputs) <= peak_budget:
        search(0, 0, 0.0)
    return best_seq[0]


# ---------------------------------------------------------------------- entry point
def best_rockmate_plan(graph: Graph, peak_budget: int, save_budget: int | None = None, *,
                       engine: str = "states", prune_with: str = "fast", dominance: bool = True,
                       stats: SearchStats | None = None) -> tuple[float | None, Plan | None]:
    """(least total time, a plan reaching it) over the plans of the H-Rockmate phase space (see
    the module docstring) whose simulated peak is <= `peak_budget` and, when given, whose loss
    phase memory is <= `save_budget`; (None, None) when none fits. The plan has been replayed by
    `schedlang.plans.simulate.simulate`: valid, within both budgets, of the returned time.

    `engine`: "states" (memoized search, the default) or "replay" (every prefix replayed from
    scratch; `prune_with` "fast" uses the module's evaluator, "simulate" the simulator).
    `dominance=False` keeps the plans that drop a phantom unconsumed (see the module docstring).
    """
    t0 = time.perf_counter()
    ev = _Evaluator(graph)
    if ev.T > MAX_COMPUTE_NODES:
        raise ValueError(f"brute force is for H-graphs of at most {MAX_COMPUTE_NODES} compute "
                         f"nodes, not {ev.T}")
    st = stats if stats is not None else SearchStats()
    st.space = ev.space_size()
    if engine == "states":
        best_seq = _search_states(ev, peak_budget, save_budget, dominance, st, math.inf)
    elif engine == "replay":
        if prune_with not in ("fast", "simulate"):
            raise ValueError(f"prune_with must be 'fast' or 'simulate', not {prune_with!r}")
        best_seq = _search_replay(ev, peak_budget, save_budget, dominance, prune_with, st, math.inf)
    else:
        raise ValueError(f"engine must be 'states' or 'replay', not {engine!r}")
    st.seconds = time.perf_counter() - t0
    if best_seq is None:
        return None, None
    best_time = sum(ev.opt_time[i][o] for i, o, _ in best_seq)
    plan = ev.plan(best_seq, peak_budget, save_budget)
    sim_save = save_budget if save_budget is not None else peak_budget
    res = simulate(plan, graph, budget=peak_budget, save_budget=sim_save)
    st.verified += 1
    if not res.valid or not res.fits_budget or not math.isclose(res.time, best_time, rel_tol=1e-9,
                                                                 abs_tol=1e-12):
        raise AssertionError(f"bruteforce_rockmate: the search accepted a plan the simulator "
                             f"rejects (time {best_time} vs {res.time}): {res.errors}\n"
                             + "\n".join(str(op) for op in plan.ops))
    plan.predicted_peak = res.peak_bytes
    plan.predicted_time = res.time
    return res.time, plan
