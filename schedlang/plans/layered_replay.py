"""The layered view's replay (`LayeredReplay`, the rules in `simulate.py`'s docstring): live
data with their contributions, saved phantoms, host copies and transfers on their channels,
the peak and the loss phase's memory."""
from __future__ import annotations

import math

from ..graphs.hgraph import HIndex
from ..language.errors import did_you_mean
from .plan import CHANNELS, Op, Plan, _a
from .replay import Errors, Replay, Replayed, resolve

#: tolerance on sums of transfer fractions
_FRACTION_EPS = 1e-9



class LayeredReplay(Replay):
    """The layered view's replay (module docstring): live data with their contributions, saved
    phantoms, host copies and transfers, the peak and the loss phase's memory.

    A tensor t is a datum (t < nd) or the phantom of layer t - nd.
    """

    SAMPLED = frozenset(("compute", "offload", "prefetch"))

    def __init__(self, plan: Plan, ha: HIndex, errors: Errors, host_budget: int | None = None):
        super().__init__(plan, errors, ha.names, ha.data_index, ha.size)
        self.ha = ha
        self.host_budget = host_budget
        nd, nl = len(ha.data), len(ha.layers)
        self.nd = nd
        self.ncre = [len(c) for c in ha.creators]
        self.mask = [0] * nd  # contributions received since the datum was last absent
        for d in ha.inputs:
            self.live[d] = 1
        self.saved = [-1] * nl  # layer option of the saved phantom, -1: none
        self.saved_by = [-1] * nl  # op that saved it
        self.gone = [""] * nl  # how the last phantom went away, for messages
        self.first_at = [-1] * len(ha.names)
        self.mem = sum(ha.size[d] for d in ha.inputs)
        self.peak = self.mem

        # transfers
        self.host_frac = [0.0] * (nd + nl)  # fraction of t offloaded (its host copy)
        self.host_opt = [-1] * nl  # the layer option of a phantom's host copy
        self.host_mask = [0] * nd  # the contributions a datum's host copy holds
        self.offloads: dict[int, list[tuple[float, float]]] = {}  # t -> [(end, fraction)]
        # per channel: unwaited transfers, t -> [(op, end)]; every tensor ever transferred
        self.pending: dict[str, dict[int, list[tuple[int, float]]]] = {c: {} for c in CHANNELS}
        self.offloading = self.pending["offload"]  # the unwaited offloads, by tensor
        self.issued: dict[str, set] = {c: set() for c in CHANNELS}
        self.free_at = {c: 0.0 for c in CHANNELS}  # when each transfer channel becomes free
        self.round_frac = [-1.0] * (nd + nl)  # fraction prefetched in the round in progress; -1: none
        self.round_at = [-1] * (nd + nl)  # the op that started it
        self.round_bytes = [0] * (nd + nl)  # the device buffer it allocated
        self.host_used = 0.0
        self.host_peak = 0.0
        self.host_over = False
        self.wait_time = 0.0

        # The loss phase: memory is sampled after each compute together with the deletes and
        # drops that follow it (the H-Rockmate ILP's U[t, k]), i.e. just before the next compute
        # or the transfers issued for it (a prefetch buffer belongs to the step it is issued
        # for); the window restarts at each first computation of a node before the loss, and
        # closes at the first compute or transfer after the loss's (or at the end of the plan).
        self.window_max, self.window_at = self.mem, -1
        self.save_peak: int | None = None
        self.save_at = -1
        self.loss_done = False
        self.last_compute = -1
        self.sampled = False  # the state after the last compute and its frees is already sampled

        # compute op -> data deleted right after it (what the sub-step profiles need)
        self.freed_after: dict[int, set] = {}
        if any(steps for node_steps in ha.opt_steps for steps in node_steps):
            last = -1
            for k, op in enumerate(plan.ops):
                if op.op == "compute":
                    last = k
                elif op.op == "delete" and last >= 0 and op.data in ha.data_index:
                    self.freed_after.setdefault(last, set()).add(ha.data_index[op.data])

    # --- messages ---------------------------------------------------------------------------
    def datum_state(self, d: int) -> str:
        if self.round_frac[d] >= 0:
            return self.round_state(d)
        if self.deleted_at[d] >= 0:
            return f"deleted by op {self.deleted_at[d]}{self.on_host(d)}"
        if not self.ha.creators[d]:
            return "nothing creates it and it is not an input"
        return "never created before"

    def phantom_state(self, j: int) -> str:
        if self.round_frac[self.nd + j] >= 0:
            return self.round_state(self.nd + j)
        return (self.gone[j] or "its forward never saved one") + self.on_host(self.nd + j)

    def on_host(self, t: int) -> str:
        frac = self.host_frac[t]
        if frac >= 1.0 - _FRACTION_EPS:
            return "; a copy is on the host: prefetch it back"
        return f"; {frac:g} of it is on the host" if frac > 0 else ""

    def round_state(self, t: int) -> str:
        return (f"its prefetch started by op {self.round_at[t]} has not completed: "
                f"{self.round_frac[t]:g} of it prefetched, and a wait on channel 'prefetch' "
                "completes it once the fractions sum to 1")

    def label(self, t: int) -> str:
        if t < self.nd:
            return repr(self.ha.data[t])
        return f"the phantom of layer {self.ha.layers[t - self.nd]!r}"

    def missing(self, d: int) -> str:
        ha, got = self.ha, self.mask[d]
        missing = [ha.names[c] for b, c in enumerate(ha.creators[d]) if not got >> b & 1]
        total = len(ha.creators[d])
        return (f"the contribution of {', '.join(repr(c) for c in missing)} is missing "
                f"({total - len(missing)} of {total} received)")

    def not_here(self, d: int) -> str:
        return "used before its prefetch completed" if self.round_frac[d] >= 0 else "not in memory"

    # --- shared effects ---------------------------------------------------------------------
    def keep_for_offload(self, k: int, t: int, action: str) -> None:
        """`action` at op k frees t's device copy: an error while an offload of t is unwaited."""
        waiting = self.offloading.pop(t, None)  # reported once
        if waiting:
            self.errors.add(f"op {k}: {action}, but the offload of {self.label(t)} (op "
                            f"{waiting[0][0]}) is not waited: the transfer still reads it (wait "
                            "on channel 'offload' first)")

    def cancel_round(self, k: int, t: int, action: str) -> None:
        """`action` at op k creates t on the device: an error during a prefetch round of t."""
        if self.round_frac[t] >= 0:
            self.errors.add(f"op {k}: {action} while a prefetch of {self.label(t)} is in progress "
                            f"(started by op {self.round_at[t]}): one copy at a time")
            self.mem -= self.round_bytes[t]
            self.round_frac[t] = -1.0

    def free_phantom(self, j: int, how: str) -> None:
        self.mem -= self.ha.phantom[j][self.saved[j]]
        self.saved[j] = -1
        self.gone[j] = how

    def sample(self) -> None:
        """Sample the loss phase's memory before a compute or a transfer (see __init__)."""
        if not self.sampled and self.save_peak is None:
            if self.mem > self.window_max:  # after the previous compute and what followed it
                self.window_max, self.window_at = self.mem, self.last_compute
            if self.loss_done:
                self.save_peak, self.save_at = self.window_max, self.window_at
            self.sampled = True

    # --- the ops ----------------------------------------------------------------------------
    def option_error(self, k: int, i: int, oname: str | None) -> None:
        """Record why a compute of node i cannot run with option `oname`."""
        ha, name = self.ha, self.ha.names[i]
        opts = ha.opt_names[i]
        if oname is None:
            self.errors.add(f"op {k}: compute {name!r} needs an option, one of "
                            f"{', '.join(repr(o) for o in opts)}")
        elif ha.kind[i] == "loss":
            self.errors.add(f"op {k}: compute 'loss' with option {oname!r}: the loss has a "
                            "single way to run (omit 'option', or use 'loss')")
        else:
            self.errors.add(f"op {k}: compute {name!r} with unknown option {oname!r}"
                            f"{did_you_mean(oname, opts)} (options: "
                            f"{', '.join(repr(x) for x in opts)})")

    def check_reads(self, k: int, i: int, o: int) -> None:
        """Every datum node i reads with option o is live and complete; a backward's phantom is
        saved with option o."""
        ha, live, mask, full, errors = self.ha, self.live, self.mask, self.ha.full, self.errors
        name, data = ha.names[i], ha.data
        for d in ha.uses[i]:
            if not live[d]:
                errors.add(f"op {k}: compute {name!r} needs {data[d]!r}, which is "
                           f"{self.not_here(d)} ({self.datum_state(d)})")
            elif mask[d] != full[d]:
                errors.add(f"op {k}: compute {name!r} needs {data[d]!r}, which is "
                           f"incomplete: {self.missing(d)}")
        if ha.kind[i] != "bwd":
            return
        oname = ha.opt_names[i][o]
        for d in ha.opt_uses[i][o]:
            if not live[d]:
                errors.add(f"op {k}: compute {name!r} with option {oname!r} needs "
                           f"{data[d]!r}, which is {self.not_here(d)} "
                           f"({self.datum_state(d)})")
            elif mask[d] != full[d]:
                errors.add(f"op {k}: compute {name!r} with option {oname!r} needs "
                           f"{data[d]!r}, which is incomplete: {self.missing(d)}")
        j, saved = ha.layer[i], self.saved
        layer = ha.layers[j]
        if saved[j] < 0 and self.round_frac[self.nd + j] >= 0:
            errors.add(f"op {k}: backward {name!r} with option {oname!r} needs "
                       f"the phantom of layer {layer!r}, which is used before its "
                       f"prefetch completed ({self.phantom_state(j)})")
        elif saved[j] < 0:
            errors.add(f"op {k}: backward {name!r} with option {oname!r} needs "
                       f"the phantom of layer {layer!r}, but no phantom of "
                       f"{layer!r} is saved ({self.phantom_state(j)})")
        elif saved[j] != ha.opt_layer_opt[i][o]:
            errors.add(f"op {k}: backward {name!r} runs with option {oname!r}, "
                       f"but the phantom of layer {layer!r} is saved with option "
                       f"{ha.layer_opts[j][saved[j]]!r} (by op {self.saved_by[j]})")

    def compute_peak(self, k: int, i: int, o: int) -> int:
        """Memory at the compute op k of node i with option o: inputs, new data copies, the
        phantom saved, the transient overhead (or the sub-step profile)."""
        ha, live, mask, ncre, size, mem = self.ha, self.live, self.mask, self.ncre, self.ha.size, self.mem
        new = []  # the data copies it creates (a contribution to a live gradient is accumulated in place)
        add = 0
        for d, bit in ha.creates[i]:
            if not (live[d] and ncre[d] > 1 and not (mask[d] & bit)):
                new.append(d)
                add += size[d]
        lo = ha.opt_layer_opt[i][o]
        ph = ha.phantom[ha.layer[i]][lo] if ha.kind[i] == "fwd" and lo >= 0 else 0
        profile = ha.opt_steps[i][o]
        if not profile:
            return mem + add + ph + ha.opt_overhead[i][o]
        # a sub-step profile: the end state (no overhead) and each step, where outputs not
        # created yet do not count and freed inputs that the plan deletes right after this
        # node are gone (the H-Rockmate correction terms). At the end state every input a
        # step frees is gone (when deleted right after), and a backward's phantom is consumed
        deleted_next = self.freed_after.get(k, set())
        freed = set().union(*(frees_s for _, frees_s, _ in profile))
        here = (mem + add + ph - sum(size[d] for d in freed if d in deleted_next and live[d])
                - (ha.phantom[ha.layer[i]][lo] if ha.kind[i] == "bwd" and lo >= 0 else 0))
        for overhead_s, frees_s, creates_s in profile:
            step = (mem + ph + overhead_s + sum(size[d] for d in new if d in creates_s)
                    - sum(size[d] for d in frees_s if d in deleted_next and live[d]))
            here = max(here, step)
        return here

    def on_compute(self, op: Op) -> None:
        k = self.index
        self.last_compute = k
        self.sampled = False
        ha, errors = self.ha, self.errors
        name = op.node
        if name is None or (i := ha.index.get(name)) is None:
            resolve(k, "compute", name, ha.index, "node", errors)  # records why
            return
        oname = op.option
        if oname is not None:
            o = ha.opt_index[i].get(oname)
        else:
            o = 0 if len(ha.opt_names[i]) == 1 else None
        if o is None:
            self.option_error(k, i, oname)
            return
        ki = ha.kind[i]
        if ki == "loss" and self.computed[i]:
            errors.add(f"op {k}: the loss is computed a second time (first by op "
                       f"{self.first_at[i]}); it must be computed exactly once")
        self.check_reads(k, i, o)
        here = self.compute_peak(k, i, o)
        if here > self.peak:
            self.peak = here
        self.create_outputs(k, i)
        j, lo = ha.layer[i], ha.opt_layer_opt[i][o]
        if ki == "fwd" and lo >= 0:
            self.save_phantom(k, i, o, j, lo)
        elif ki == "bwd" and self.saved[j] >= 0:
            if self.nd + j in self.offloading:
                self.keep_for_offload(k, self.nd + j, f"backward {name!r} consumes the phantom of "
                                      f"layer {ha.layers[j]!r}")
            self.free_phantom(j, f"consumed by the backward at op {k}")
        self.time += ha.opt_time[i][o]
        self.computes += 1
        first = not self.computed[i]
        self.computed[i] += 1
        if first:
            self.first_at[i] = k
        if self.save_peak is None:
            if i == ha.loss:
                self.loss_done = True
            elif first and i < ha.loss:
                self.window_max, self.window_at = -1, k  # a new phase: sampled before the next compute

    def create_outputs(self, k: int, i: int) -> None:
        """Node i's contribution to each datum it creates (compute op k)."""
        ha, live, mask, errors = self.ha, self.live, self.mask, self.errors
        name, data = ha.names[i], ha.data
        for d, bit in ha.creates[i]:
            if not live[d]:
                if self.round_frac[d] >= 0:
                    self.cancel_round(k, d, f"compute {name!r} creates {data[d]!r}")
                live[d] = 1
                self.mem += ha.size[d]
                mask[d] = bit
            elif mask[d] & bit:
                if self.ncre[d] > 1:
                    errors.add(f"op {k}: {name!r} adds its contribution to {data[d]!r} a second "
                               f"time (the gradient would be accumulated twice; delete "
                               f"{data[d]!r} first)")
                elif d in self.offloading:  # a single creator: the new copy replaces the old one
                    self.keep_for_offload(k, d, f"compute {name!r} replaces {data[d]!r}")
            else:
                if d in self.offloading:  # accumulated in place: the transfer reads d
                    self.keep_for_offload(k, d, f"compute {name!r} adds its contribution to "
                                                f"{data[d]!r}")
                mask[d] |= bit

    def save_phantom(self, k: int, i: int, o: int, j: int, lo: int) -> None:
        """The forward i (compute op k, option o) saves the phantom of layer j with layer
        option lo."""
        ha, nd = self.ha, self.nd
        name, layer = ha.names[i], ha.layers[j]
        cur = self.saved[j]
        ph = ha.phantom[j][lo]
        if cur < 0:
            if self.round_frac[nd + j] >= 0:
                self.cancel_round(k, nd + j, f"forward {name!r} saves a phantom of layer {layer!r}")
            self.mem += ph
        elif nd + j in self.offloading:
            self.keep_for_offload(k, nd + j, f"forward {name!r} replaces the phantom of layer "
                                  f"{layer!r}")
        if cur >= 0 and cur != lo:
            self.errors.add(f"op {k}: forward {name!r} with option {ha.opt_names[i][o]!r} saves a "
                            f"phantom of layer {layer!r}, which already has one saved with "
                            f"option {ha.layer_opts[j][cur]!r} (by op {self.saved_by[j]}): only "
                            f"one phantom option per layer (drop it first)")
            self.mem += ph - ha.phantom[j][cur]
        # cur == lo: the new phantom replaces the old one
        self.saved[j] = lo
        self.saved_by[j] = k

    def release(self, k: int, d: int, name: str) -> None:
        if d in self.offloading:
            self.keep_for_offload(k, d, f"delete {name!r}")
        self.mask[d] = 0

    def on_drop_phantom(self, op: Op) -> None:
        k = self.index
        name = op.layer
        j = resolve(k, "drop_phantom", name, self.ha.layer_index, "layer", self.errors)
        if j is None:
            return
        if self.saved[j] < 0:
            self.errors.add(f"op {k}: drop_phantom {name!r}, but no phantom of layer {name!r} is "
                            f"saved ({self.phantom_state(j)})")
            return
        if self.nd + j in self.offloading:
            self.keep_for_offload(k, self.nd + j, f"drop_phantom {name!r}")
        self.free_phantom(j, f"dropped by op {k}")

    # --- transfers --------------------------------------------------------------------------
    def transfer_target(self, k: int, op: Op) -> int | None:
        if (op.data is None) == (op.layer is None):
            self.errors.add(f"op {k}: {_a(op.op)} op names exactly one of 'data' (a data node) "
                            f"or 'layer' (that layer's saved phantom), not "
                            f"{'neither' if op.data is None else 'both'}")
            return None
        if op.data is not None:
            return resolve(k, op.op, op.data, self.ha.data_index, "data", self.errors)
        j = resolve(k, op.op, op.layer, self.ha.layer_index, "layer", self.errors)
        return None if j is None else self.nd + j

    def transfer_fraction(self, k: int, op: Op) -> float | None:
        f = 1.0 if op.fraction is None else op.fraction
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0.0 < f <= 1.0:
            self.errors.add(f"op {k}: the fraction of {_a(op.op)} op must be between 0 (excluded) "
                            f"and 1, not {f!r}")
            return None
        return float(f)

    def bandwidth(self, k: int, op: Op, t: int) -> float | None:
        chan = op.op
        bw = self.ha.bandwidth.get(chan, 0)
        if isinstance(bw, bool) or not isinstance(bw, (int, float)) or math.isnan(bw) or bw < 0:
            self.errors.add(f"op {k}: {chan} of {self.label(t)}: the graph's {chan} bandwidth is "
                            f"{bw!r}, not a number of bytes per second")
            return None
        if bw == 0:
            self.errors.add(f"op {k}: {chan} of {self.label(t)}, but the {chan} bandwidth is 0 "
                            f"(the graph gives none: declare `bandwidth {chan} ...`), so no "
                            "transfer is possible")
            return None
        return float(bw)

    def issue(self, k: int, chan: str, t: int, nbytes: float, bw: float) -> float:
        """Start a transfer of `nbytes` on `chan` at op k; returns its end time."""
        start = max(self.time, self.free_at[chan])
        end = start + (nbytes / bw if nbytes else 0.0)
        self.free_at[chan] = end
        self.pending[chan].setdefault(t, []).append((k, end))
        self.issued[chan].add(t)
        return end

    def offloadable_bytes(self, k: int, t: int) -> int | None:
        """The bytes of t's device copy, or None after recording why t cannot be offloaded."""
        ha, errors, label = self.ha, self.errors, self.label(t)
        if t < self.nd:
            if ha.data_pinned[t]:
                errors.add(f"op {k}: offload of {label}, which is pinned: it may never be "
                           "offloaded")
            elif not self.live[t]:
                errors.add(f"op {k}: offload of {label}, which is not on the device "
                           f"({self.datum_state(t)})")
            elif self.mask[t] != ha.full[t] and self.ncre[t] < 2:
                errors.add(f"op {k}: offload of {label}, which is incomplete: {self.missing(t)}")
            elif self.host_frac[t] > 0 and self.host_mask[t] != self.mask[t]:
                errors.add(f"op {k}: offload of {label}, whose host copy holds other "
                           f"contributions: a host copy holds those of one device copy")
            else:
                return ha.size[t]
            return None
        j = t - self.nd
        lo = self.saved[j]
        if lo < 0:
            errors.add(f"op {k}: offload of {label}, but no phantom of "
                       f"{ha.layers[j]!r} is saved ({self.phantom_state(j)})")
        elif ha.opt_pinned[j][lo]:
            errors.add(f"op {k}: offload of {label}, saved with option "
                       f"{ha.layer_opts[j][lo]!r}, which is pinned: its phantom may never be "
                       "offloaded")
        elif self.host_frac[t] > 0 and self.host_opt[j] != lo:
            errors.add(f"op {k}: offload of {label}, saved with option "
                       f"{ha.layer_opts[j][lo]!r}, but the host holds its phantom of option "
                       f"{ha.layer_opts[j][self.host_opt[j]]!r}: a host copy holds one option")
        else:
            return ha.phantom[j][lo]
        return None

    def on_offload(self, op: Op) -> None:
        k = self.index
        t = self.transfer_target(k, op)
        f = self.transfer_fraction(k, op)
        if t is None or f is None:
            return
        nbytes = self.offloadable_bytes(k, t)
        if nbytes is None:
            return
        if self.host_frac[t] + f > 1.0 + _FRACTION_EPS:
            self.errors.add(f"op {k}: offload of {self.label(t)} offloads more than the whole "
                            f"tensor ({self.host_frac[t]:g} already offloaded, plus {f:g})")
            return
        bw = self.bandwidth(k, op, t)
        if bw is None:
            return
        if t >= self.nd:
            self.host_opt[t - self.nd] = self.saved[t - self.nd]
        else:
            self.host_mask[t] = self.mask[t]
        self.host_frac[t] += f
        self.host_used += f * nbytes
        self.host_peak = max(self.host_peak, self.host_used)
        host_budget, used = self.host_budget, self.host_used
        if host_budget is not None and used > host_budget + 1e-9 * max(1.0, host_budget):
            self.host_over = True
            self.errors.add(f"op {k}: offload of {self.label(t)} brings host memory to "
                            f"{round(used)} B, over the host budget {host_budget} B by "
                            f"{round(used - host_budget)} B")
        self.offloads.setdefault(t, []).append((self.issue(k, "offload", t, f * nbytes, bw), f))

    def on_prefetch(self, op: Op) -> None:
        k = self.index
        t = self.transfer_target(k, op)
        f = self.transfer_fraction(k, op)
        if t is None or f is None:
            return
        nd = self.nd
        new_round = self.round_frac[t] < 0
        if new_round:
            on_device = self.live[t] if t < nd else self.saved[t - nd] >= 0
            if on_device:
                where = "still in memory" if t < nd else f"saved by op {self.saved_by[t - nd]}"
                self.errors.add(f"op {k}: prefetch of {self.label(t)}, which is on the device "
                                f"({where}): one copy at a time")
                return
            if self.host_frac[t] <= 0:
                self.errors.add(f"op {k}: prefetch of {self.label(t)}, which was never offloaded")
                return
        bw = self.bandwidth(k, op, t)
        if bw is None:
            return
        if new_round:
            self.round_frac[t] = 0.0
            self.round_at[t] = k
            self.round_bytes[t] = (self.ha.size[t] if t < nd
                                   else self.ha.phantom[t - nd][self.host_opt[t - nd]])
            self.mem += self.round_bytes[t]  # the whole tensor's buffer, from the round's first op
            if self.mem > self.peak:
                self.peak = self.mem
        done = sum(fr for end, fr in self.offloads.get(t, ()) if end <= self.time)
        got = self.round_frac[t] + f
        if got > done + _FRACTION_EPS:
            self.errors.add(f"op {k}: prefetch of {self.label(t)} brings back {got:g} of it in "
                            f"this round, more than has been offloaded by then ({done:g}; an "
                            "offload counts once it has ended: wait on channel 'offload' first)")
        self.round_frac[t] = got
        self.issue(k, "prefetch", t, f * self.round_bytes[t], bw)

    def on_wait(self, op: Op) -> None:
        k = self.index
        chan = op.channel
        if chan not in CHANNELS:
            self.errors.add(f"op {k}: wait on channel {chan!r}: a channel is 'offload' or "
                            f"'prefetch'{did_you_mean(str(chan), CHANNELS)}")
            return
        if op.data is not None and op.layer is not None:
            self.errors.add(f"op {k}: a wait op names at most one of 'data' or 'layer', not both")
            return
        pending = self.pending[chan]
        if op.data is None and op.layer is None:
            waited = list(pending.items())
            pending.clear()
        else:
            t = self.transfer_target(k, op)
            if t is None:
                return
            if t not in self.issued[chan]:
                self.errors.add(f"op {k}: wait for {self.label(t)} on channel {chan!r}, but no "
                                f"{chan} of {self.label(t)} was issued before")
                return
            waited = [(t, pending.pop(t, []))]
        latest = max((end for _, lst in waited for _, end in lst), default=self.time)
        if latest > self.time:
            self.wait_time += latest - self.time
            self.time = latest
        if chan == "prefetch":
            for t, _ in waited:
                if self.round_frac[t] >= 0 and abs(self.round_frac[t] - 1.0) <= _FRACTION_EPS:
                    self.round_frac[t] = -1.0  # complete: the tensor is on the device again
                    if t < self.nd:
                        self.live[t] = 1
                        self.mask[t] = self.host_mask[t]
                    else:
                        self.saved[t - self.nd] = self.host_opt[t - self.nd]
                        self.saved_by[t - self.nd] = k

    def finish(self) -> None:
        if self.save_peak is None and self.loss_done:  # the plan ends in the loss phase
            if self.mem > self.window_max:
                self.window_max, self.window_at = self.mem, self.last_compute
            self.save_peak, self.save_at = self.window_max, self.window_at
        super().finish()
        ha, errors = self.ha, self.errors
        for d in ha.outputs:
            if not self.live[d]:
                errors.add(f"output {ha.data[d]!r} is not in memory at the end "
                           f"({self.datum_state(d)})", always=True)
            elif self.mask[d] != ha.full[d]:
                errors.add(f"output {ha.data[d]!r} is incomplete at the end: {self.missing(d)}",
                           always=True)
        for j, lo in enumerate(self.saved):
            if lo >= 0:
                errors.add(f"phantom of layer {ha.layers[j]!r} still saved at the end (option "
                           f"{ha.layer_opts[j][lo]!r}, saved by op {self.saved_by[j]})",
                           always=True)
        for chan in CHANNELS:
            for t, lst in sorted(self.pending[chan].items()):
                ops = ", ".join(str(kk) for kk, _ in lst)
                errors.add(f"transfer of {self.label(t)} on channel {chan!r} "
                           f"(op{'s' if len(lst) > 1 else ''} {ops}) never waited", always=True)
        for t, frac in enumerate(self.round_frac):
            if frac >= 0 and t not in self.pending["prefetch"]:
                errors.add(f"the prefetch of {self.label(t)} started by op {self.round_at[t]} "
                           f"never completed ({frac:g} of it prefetched; a wait on channel "
                           "'prefetch' completes it once the fractions sum to 1)", always=True)

    def result(self) -> Replayed:
        return Replayed(peak=self.peak, time=self.time, computes=self.computes,
                        save_peak=self.save_peak, save_at=self.save_at,
                        host_peak=round(self.host_peak), host_over=self.host_over,
                        wait_time=self.wait_time)
