"""A generated layer option as a callable: `SegmentedLayer`, a layer's aten graph (its
`opgraph.OpGraph`) run segment by segment, each segment's ops as fx-generated code that frees
every value after its last reader (as eager PyTorch does), each checkpointed segment through
`torch.utils.checkpoint` (non-reentrant, RNG state preserved), recomputed in the backward one
round per segment (`options` generates and measures them)."""
from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
import torch.fx as fx
from torch.utils.checkpoint import checkpoint

from ..language.errors import Loc, SchedError
from .opgraph import OpGraph, graph_outputs, may_alias
from .tensors import placeholder

__all__ = ["SegmentedLayer", "params", "segments_of", "count_pieces"]

WHERE = Loc("options")


class SegmentedLayer:
    """`module`'s aten graph (`og.gm`) run in segments: [(call nodes, checkpointed)] or
    [(call nodes, checkpointed, pieces)], where `pieces` (a list of segments of the same form,
    covering the segment's nodes in order) cuts a segment once more: a checkpointed segment
    with pieces recomputes, in its backward round, only what its kept pieces save and the
    values crossing its pieces; each checkpointed piece is recomputed in a round of its own,
    inside that one (nested checkpoints: one more level of recomputation per level of pieces).
    `nested`: the whole layer runs inside one more checkpoint, so that the segments'
    boundaries are not kept from the forward to the backward either: the backward recomputes
    the layer once without its checkpointed segments' internals, then each of them in its own
    round (two levels of recomputation)."""

    def __init__(self, og: OpGraph, module, segments: list[tuple], nested: bool = False):
        self.og = og
        self.nested = nested
        self.module = module
        self.segments = segments
        self.placeholders = [n for n in og.gm.graph.nodes if n.op == "placeholder"]
        self.outputs = graph_outputs(og.gm)
        self.returned = {n.name for n in self.outputs}
        self.fixed = [n.name for n in self.placeholders[:og.n_params + og.n_buffers]]
        self.steps = _steps(og.gm, segments, self.returned, self.fixed)
        self.io = [(st.ins, st.outs) for st in self.steps]
        self.held: list | None = None  # set to a list: storages the checkpoints hold
        # the backward's rounds (see `release_points`): `on_round(s)`, when set, is called as
        # the recomputation round of checkpointed segment s starts, after the round has taken
        # its own references to its inputs (the runtime then drops its references to the layer
        # inputs that round is the last to read: `release_points`)
        self.on_round = None
        self.on_segment = None  # when set, called as the forward starts segment s (`measure_steps`)
        # a top-level segment without pieces also runs as boxed code (`_boxed_code`), which
        # frees each input after its last reader: kept, its forward; checkpointed, its round
        # (without outputs, as `_Step.lean`)
        self.boxed = []
        for seg, st in zip(segments, self.steps):
            if st.pieces is not None:
                self.boxed.append(None)
            else:
                self.boxed.append(_boxed_code(og.gm, seg[0], st.ins,
                                              [] if st.ckpt else st.outs, self.fixed,
                                              empty_inputs=st.ckpt))

    def spans(self) -> list[tuple]:
        return _spans_of(self.segments)

    def __call__(self, *xs):
        if self.nested:
            if self.held is not None:
                self.held += [x.untyped_storage().data_ptr() for x in xs]
            return checkpoint(self._run, *xs, use_reentrant=False)
        return self._run(*xs)

    def _run(self, *xs):
        params = list(self.module.parameters()) if hasattr(self.module, "parameters") else []
        buffers = list(self.module.buffers()) if hasattr(self.module, "buffers") else []
        env = {n.name: a for n, a in zip(self.placeholders, params + buffers + list(xs))}
        fixed_env = {f: env[f] for f in self.fixed if f in env}
        for s, st in enumerate(self.steps):
            if self.on_segment is not None:
                self.on_segment(s)
            if st.ckpt:
                # a value the layer returns is passed as a view: the runtime empties the
                # returned tensor object itself (its memory is the datum's), not the
                # checkpoint's copy
                args = [env[i].view_as(env[i]) if i in self.returned else env[i]
                        for i in st.ins]
                if self.held is not None:
                    self.held += [a.untyped_storage().data_ptr() for a in args]
                res = self._checkpointed(s, st, fixed_env, args)
            elif st.pieces is None:  # its inputs that no later segment reads are the boxed
                # code's alone: each is freed right after its last reader inside the segment
                args = [env[i] for i in st.ins]
                for i in st.ins:
                    if i not in st.stay:
                        del env[i]
                res = self.boxed[s][0].forward(*[fixed_env[f] for f in st.used], args)
            else:
                args = [env[i] for i in st.ins]
                res = self._step_fn(st, fixed_env)(*args)
            del args
            env.update(zip(st.outs, res))
            del res
            for name in [n for n in env if n not in st.stay]:  # no later segment reads it
                del env[name]
        return tuple(env[n.name] for n in self.outputs)

    def _run_steps(self, steps: list, env: dict) -> None:
        """Run `steps` (`_steps`: the pieces of a segment) in order on `env` (values by fx
        name), each checkpointed one through `torch.utils.checkpoint`; drops each value no
        later step reads."""
        fixed_env = {f: env[f] for f in self.fixed if f in env}
        for st in steps:
            fn = self._step_fn(st, fixed_env)
            if st.ckpt:
                args = [env[i].view_as(env[i]) if i in self.returned else env[i]
                        for i in st.ins]
                if self.held is not None:
                    self.held += [a.untyped_storage().data_ptr() for a in args]
                res = checkpoint(fn, *args, use_reentrant=False)
            elif st.boxed is not None:  # its inputs that no later step reads are the boxed
                # code's alone: each is freed right after its last reader inside the step
                args = [env[i] for i in st.ins]
                for i in st.ins:
                    if i not in st.stay:
                        del env[i]
                res = st.boxed.forward(*[fixed_env[f] for f in st.used], args)
            else:
                args = [env[i] for i in st.ins]
                res = fn(*args)
            del args
            env.update(zip(st.outs, res))
            del res
            for name in [n for n in env if n not in st.stay]:  # no later step reads it
                del env[name]

    def _step_fn(self, st, fixed_env: dict):
        """The step's function. Its first call runs the segment; a later call is the
        checkpoint's recomputation, whose outputs are thrown away: it runs the same ops in the
        same order (the same saved tensors, RNG restored by the checkpoint) but drops each
        value after its last reader inside, outputs included (`_Step.lean`)."""
        calls = [0]
        if st.pieces is None:
            fixed = [fixed_env[f] for f in st.used]

            def run(*v):
                calls[0] += 1
                return (st.code if calls[0] == 1 or st.lean is None else st.lean).forward(
                    *fixed, *v)
            return run

        def run_pieces(*v):
            calls[0] += 1
            sub = dict(fixed_env)
            sub.update(zip(st.ins, v))
            if calls[0] == 1 or st.lean is None:
                self._run_steps(st.pieces, sub)
                return tuple(sub[o] for o in st.outs)
            self._run_steps(st.lean, sub)
            return ()
        return run_pieces

    def _checkpointed(self, s: int, st, fixed_env: dict, args: list):
        """Top-level segment s under a non-reentrant `torch.utils.checkpoint` (RNG state
        preserved) that does not hold its inputs through its round: they are kept in `holder`
        (what the phantom holds, as a checkpoint's inputs), and the recomputation takes them
        out of it, so that each is freed inside the round right after its last reader there
        (the boxed code of the segment, `_boxed_code`; a segment with pieces: its pieces, run
        as `_run_steps` runs them), not when the layer's backward ends. The only tensor
        argument is an empty one on the inputs' device (the checkpoint's RNG device)."""
        holder = list(args)
        calls = [0]
        first = self._step_fn(st, fixed_env)

        def run(_anchor):
            calls[0] += 1
            if calls[0] == 1:  # the forward
                return first(*holder)
            box = [_alias(a) for a in holder]  # the recomputation: this round's references
            holder.clear()
            if self.on_round is not None:
                self.on_round(s)
            if st.pieces is not None:
                sub = dict(fixed_env)
                sub.update(zip(st.ins, box))
                box.clear()
                self._run_steps(st.lean, sub)
                return ()
            return self.boxed[s][0].forward(*[fixed_env[f] for f in st.used], box)

        dev = args[0].device if args else torch.device("cpu")
        return checkpoint(run, torch.empty(0, device=dev), use_reentrant=False)

    def release_points(self) -> dict[int, int]:
        """{position of a layer input: the checkpointed segment whose recomputation round is
        the last to read it (-1: none reads it; the backward reads it only through what kept
        segments saved)}. After that round starts, nothing of the layer holds the input but
        the round's own references and the saved tensors: its owner (the runtime) may drop
        its reference then, and the input is freed inside the backward as soon as its last
        reader is done. Empty for a nested option: its outer checkpoint holds its inputs."""
        if self.nested:
            return {}
        n_fixed = self.og.n_params + self.og.n_buffers
        out = {}
        for pos, ph in enumerate(self.placeholders[n_fixed:]):
            readers = [s for s, st in enumerate(self.steps) if st.ckpt and ph.name in st.ins]
            out[pos] = min(readers) if readers else -1
        return out


@dataclass
class _Step:
    """One segment of a `SegmentedLayer`, ready to run: its inputs and outputs (fx names),
    what stays after it (read later, returned, or a parameter/buffer), and either its code
    (fx-generated, with the parameters and buffers it reads, `used`) or its pieces."""
    ckpt: bool
    ins: list
    outs: list
    stay: set
    code: object = None
    used: list = None
    pieces: list | None = None
    lean: object = None  # a checkpointed step's recomputation: its code (or steps) without
    # outputs, so that each value dies after its last reader inside
    boxed: object = None  # a kept piece's code taking its inputs in a list (`_boxed_code`)


def _steps(gm: fx.GraphModule, segments: list[tuple], returned: set, fixed: list,
           box_kept: bool = False) -> list:
    """The `_Step`s of `segments` (each (nodes, ckpt) or (nodes, ckpt, pieces)), of which
    the values named in `returned` are read after the last one. `box_kept` (pieces): a kept
    step without pieces also gets its boxed code, so that `_run_steps` frees each of its
    inputs after its last reader inside it, not after the step."""
    later_reads: list[set] = []
    seen: set = set()
    for seg in reversed(segments):  # values read by a later segment or returned
        later_reads.append(set(seen) | returned)
        for n in seg[0]:
            seen.update(a.name for a in n.all_input_nodes)
    later_reads.reverse()
    out = []
    for seg, later in zip(segments, later_reads):
        nodes, ckpt = seg[0], seg[1]
        pieces = seg[2] if len(seg) > 2 else None
        inside = {n.name for n in nodes}
        ins = []
        for n in nodes:
            for a in n.all_input_nodes:
                # a tensor constant of the graph (get_attr) is read by the segment's code
                if a.name not in inside and a.name not in fixed and a.name not in ins \
                        and a.op != "get_attr":
                    ins.append(a.name)
        outs = [n.name for n in nodes if n.name in later]
        st = _Step(ckpt, ins, outs, later | set(fixed))
        if pieces:
            st.pieces = _steps(gm, pieces, set(outs), fixed, True)
            st.lean = _steps(gm, pieces, set(), fixed, True) if ckpt else None
        else:
            st.code, st.used = _segment_code(gm, nodes, ins, outs, fixed)
            if ckpt:
                st.lean = _segment_code(gm, nodes, ins, [], fixed, st.used)[0]
            elif box_kept:
                st.boxed = _boxed_code(gm, nodes, ins, outs, fixed)[0]
        out.append(st)
    return out


def _spans_of(segments: list[tuple], depth: int = 0) -> list[tuple]:
    """The spans of `segments` (`segments_of`' argument): (first, last, checkpointed) at the
    top, (first, last, checkpointed, depth) for the pieces of a segment, depth >= 1."""
    out = []
    for seg in segments:
        nodes, ckpt = seg[0], seg[1]
        out.append((nodes[0].name, nodes[-1].name, ckpt) + ((depth,) if depth else ()))
        if len(seg) > 2 and seg[2]:
            out += _spans_of(seg[2], depth + 1)
    return out


def params(module) -> list:
    return list(module.parameters()) if hasattr(module, "parameters") else []


def _alias(t: torch.Tensor) -> torch.Tensor:
    """A new tensor object on `t`'s memory, requiring a gradient as `t` does (a recomputation
    must save what the forward saved)."""
    a = t.detach()
    return a.requires_grad_(True) if t.requires_grad else a


def _boxed_code(gm: fx.GraphModule, nodes: list[fx.Node], ins: list[str], outs: list[str],
                fixed: list[str], empty_inputs: bool = False):
    """`_segment_code` taking its inputs in a list that it empties as it starts (the
    parameters and buffers it reads first, as there): the generated code then holds the only
    references to them, and drops each after its last reader. `empty_inputs` (a checkpoint's
    recomputation round, whose inputs are tensors made for it: `_alias`): right after its last
    reader, each input tensor also gives up its memory (`_empty`). The round runs under
    autograd, and the graph it records (alive until torch's checkpoint stops recomputing)
    holds each input leaf from its `AccumulateGrad` node: without this, the layer's inputs
    would stay to the end of the round, next to everything it recomputes."""
    mod, used = _segment_code(gm, nodes, ins, outs, fixed)
    g = mod.graph
    holders = [n for n in g.nodes if n.op == "placeholder"]  # `used`, then `ins`
    with (g.inserting_after(holders[-1]) if holders else
          g.inserting_before(next(iter(g.nodes)))):
        box = g.placeholder("box_")
    at = box
    taken = []
    for k, old in enumerate(holders[len(used):]):
        with g.inserting_after(at):
            at = g.call_function(operator.getitem, (box, k))
        old.replace_all_uses_with(at)
        g.erase_node(old)
        taken.append(at)
    with g.inserting_after(at):
        g.call_method("clear", (box,))
    if empty_inputs:
        order = {n: k for k, n in enumerate(g.nodes)}
        for x in taken:
            if not x.users or any(may_alias(u) for u in x.users):
                continue  # a view of it may be read later: the memory is the view's too
            last = max(x.users, key=lambda u: order[u])
            if last.op == "output":
                continue
            with g.inserting_after(last):
                g.call_function(_empty, (x,))
    mod.recompile()
    return mod, used


def _empty(t: torch.Tensor) -> None:
    """`t` (a round's own input tensor, `_alias`) no longer holds its memory: what the round
    still needs of it, its readers saved (their own references). Only a leaf the round's
    graph holds (it requires a gradient) needs this."""

    # only a tensor that requires a gradient: torch's checkpoint saves its detached copy in
    # the round, while one that does not is saved as it is (emptying it would empty that)
    if isinstance(t, torch.Tensor) and t.requires_grad and t.numel():
        t.data = placeholder(t)


def _segment_code(gm: fx.GraphModule, nodes: list[fx.Node], ins: list[str], outs: list[str],
                  fixed: list[str], used: list[str] | None = None):
    """The segment's aten ops as a GraphModule (fx generates its Python code, which drops each
    value after its last reader as eager PyTorch does): arguments the parameters and buffers
    it reads, then `ins`; returns the tuple of `outs`. Callers run its `forward` directly:
    a GraphModule's call wrapper formats a traceback for every exception that passes through
    it, and torch's checkpoint ends each early-stopped recomputation with one (about 1% of a
    BERT step with generated options, on the CPU)."""
    inside = {n.name for n in nodes}
    read = {a.name for n in nodes for a in n.all_input_nodes if a.name not in inside}
    if used is None:
        used = [f for f in fixed if f in read]
    g = fx.Graph()
    env = {name: g.placeholder(name) for name in used + ins}
    attrs = {n.name: n for n in gm.graph.nodes if n.op == "get_attr"}

    def arg(a):
        if a.name not in env and a.name in attrs:
            env[a.name] = g.get_attr(attrs[a.name].target)
        return env[a.name]

    for n in nodes:
        env[n.name] = g.node_copy(n, arg)
    g.output(tuple(env[o] for o in outs))
    return fx.GraphModule(gm, g), used


def segments_of(og: OpGraph, spans) -> list[tuple]:
    """The segments (`SegmentedLayer`) of `spans`: (first unit, last unit, checkpointed) at
    the top, (first, last, checkpointed, depth) for the pieces of a segment (depth 1: inside a
    top segment, 2: inside a piece of depth 1, ...). Each level covers its parent once."""
    order = {u.name: k for k, u in enumerate(og.units)}
    nodes = {n.name: n for n in og.gm.graph.nodes}
    by_depth: dict[int, list] = {}
    for s in spans:
        by_depth.setdefault(s[3] if len(s) > 3 else 0, []).append(s)

    def build(lo: int, hi: int, depth: int) -> list[tuple]:
        """The segments of `depth` covering units lo..hi."""
        inside = sorted((s for s in by_depth.get(depth, ())
                         if lo <= order[s[0]] and order[s[1]] <= hi), key=lambda s: order[s[0]])
        out, at = [], lo
        for s in inside:
            a, b = order[s[0]], order[s[1]]
            if a != at or b < a:
                raise SchedError("the segments of a generated option do not cover the "
                                 "layer's ops once", WHERE)
            names = [n for u in og.units[a:b + 1] for n in u.nodes]
            pieces = build(a, b, depth + 1) if any(
                a <= order[t[0]] and order[t[1]] <= b for t in by_depth.get(depth + 1, ())) \
                else None
            out.append(([nodes[n] for n in names], bool(s[2]), pieces) if pieces
                       else ([nodes[n] for n in names], bool(s[2])))
            at = b + 1
        if at != hi + 1:
            raise SchedError("the segments of a generated option do not cover the layer's "
                             "ops once", WHERE)
        return out

    out = build(0, len(og.units) - 1, 0)
    if sum(len(s) for d, s in by_depth.items() if d) != count_pieces(out):
        raise SchedError("a piece of a generated option lies across its segment's ends", WHERE)
    return out


def count_pieces(segments: list[tuple]) -> int:
    return sum(len(s[2]) + count_pieces(s[2]) for s in segments if len(s) > 2)
