"""Op-level options of the hook front end's blocks, run as selective-checkpoint policies.

The hook front end runs a `transformers` model's own forward with its blocks wrapped in
place, so a block's options must run *as the block itself runs*: its own `forward`, under
PyTorch's own machinery. For each distinct block (equal signatures and input shapes: solved
once, as `options.generate_options` caches fx layers), `add_block_op_options`

1. records the block's aten graph on its recorded inputs (`opgraph.record_ops` through
   make_fx: one block traces even where the whole model does not) with its parameters as
   parameters (`_BlockModule`);
2. solves `models/layer_options.sched` on it at the fx front end's series of budgets
   (`options.solve_spans`, one level: a selective-checkpoint policy cannot nest), the
   solutions kept on disk as the fx front end keeps them (`layer_solves.cache_path`);
3. turns each solution into an `OpPolicy`: the outputs of every op of a *kept* segment are
   saved (`CheckpointPolicy.MUST_SAVE`), the others recomputed in the block's backward
   (`PREFER_RECOMPUTE`); an op that draws random numbers is never saved, so that the
   recomputation advances the restored generator as the first run did (dropout masks, and
   so gradients, are eager PyTorch's; `profile.draws_random_numbers`). Ops are matched by
   (aten overload, its k-th call in the block): the dispatch order a selective checkpoint
   sees is the order make_fx recorded; a block whose calls differ from its graph's (checked
   on each measured forward) gets no generated option;
4. measures each as the block runs it (`torch.utils.checkpoint` with
   `create_selective_checkpoint_contexts`, RNG state preserved: `recompute.checkpoint_call`)
   with the fx front end's `options.measure`, and keeps those no other option (fixed or
   generated) dominates, at most `options.MAX_OPTIONS`, named ``ops1``, ``ops2``, ...

Where a block's tensor arguments are its input data, each once and whole, it also gets the fx
front end's generated options (`options.generate_options`: segments, nested checkpoints;
`_Segmented` runs them in place of the block's forward and rebuilds its output): those lower
the block's own backward below a whole-block recomputation, which no policy can.
`run_op_option(module, option, ...)` is what the wrappers (`hooked._BlockMixin`) call for a
block running a generated option.
"""
from __future__ import annotations

import logging
import weakref
from collections import Counter

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from .... import progress
from ....language.errors import DataError, SchedError
from ....layer_solves import cache_path, read_cached, write_cached
from ...opgraph import record_ops
from ...options import (
    DEFAULT_FRACTIONS,
    MAX_OPTIONS,
    OPS_PREFIX,
    Measured,
    dominated,
    generate_options,
    layer_inputs,
    measure,
    solve_spans,
    spread_on_front,
)
from ...profile import OptionProfile, draws_random_numbers
from ...recompute import checkpoint_call

log = logging.getLogger("schedlang.pytorch")

__all__ = ["OpPolicy", "add_block_op_options", "is_op_option", "run_op_option", "saved_calls"]

#: block module -> {option name: OpPolicy} (weak: a fitted model's blocks carry no cycle)
POLICIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: (signature, input shapes, requires, model, fractions) -> [(spans, policy, Measured)]
CACHE: dict = {}


def is_op_option(name: str) -> bool:
    return name.startswith(OPS_PREFIX) and name[len(OPS_PREFIX):].isdigit()


class _BlockModule(nn.Module):
    """A block's recorded call (`hooked._BlockFn`) as a module holding the block, so that
    make_fx sees its parameters as parameters (placeholders), not as constants."""

    def __init__(self, fn):
        super().__init__()
        self.block = fn.module
        self.__dict__["fn"] = fn  # not a submodule: the call, over the same block

    def forward(self, *xs):
        return self.fn(*xs)


#: ops make_fx records that a selective checkpoint's policy may not see (or the reverse):
#: never kept, not counted
UNCOUNTED = frozenset({"aten.detach.default", "aten.alias.default", "aten.lift_fresh.default"})


def _counted(target) -> str | None:
    """The overload's name if the policy counts its calls, else None."""
    if not isinstance(target, torch._ops.OpOverload):
        return None
    name = str(target)
    return None if name in UNCOUNTED else name


def _calls(gm) -> list[str]:
    """The aten overloads the graph calls, in order (the dispatch order of the block)."""
    return [name for n in gm.graph.nodes
            if n.op == "call_function" and (name := _counted(n.target)) is not None]


def saved_calls(og, spans) -> frozenset:
    """(overload, k-th call) of every op in a kept top-level segment of `spans`."""
    order = {u.name: k for k, u in enumerate(og.units)}
    kept_nodes = set()
    for s in spans:
        if len(s) > 3 and s[3]:  # pieces of a segment: not expressible as one policy
            continue
        if not s[2]:
            for u in og.units[order[s[0]]:order[s[1]] + 1]:
                kept_nodes.update(u.nodes)
    mutated = _mutated(og.gm)
    seen: Counter = Counter()
    out = set()
    for n in og.gm.graph.nodes:
        name = _counted(n.target) if n.op == "call_function" else None
        if name is None:
            continue
        if n.name in kept_nodes and n.name not in mutated and not _in_place(n):
            out.add((name, seen[name]))
        seen[name] += 1
    return frozenset(out)


def _mutated(gm) -> set[str]:
    """Nodes whose value (or a view of it) a later op changes in place: a selective
    checkpoint refuses to keep those (torch checks the cached tensor's version)."""
    base: dict[str, str] = {}
    out = set()
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        schema = getattr(n.target, "_schema", None)
        first = n.args[0] if n.args and hasattr(n.args[0], "name") else None
        if first is None:
            continue
        if schema is not None and schema.is_mutable:
            out.add(first.name)
            out.add(base.get(first.name, first.name))
        elif schema is not None and schema.returns and schema.returns[0].alias_info is not None:
            base[n.name] = base.get(first.name, first.name)  # a view of its first input
    return out


def _in_place(n) -> bool:
    """An op that writes into its input (CPU dropout's ``bernoulli_`` and ``div_`` on its
    noise): a selective checkpoint cannot keep its result, which it caches with the version
    the tensor had before the op bumped it, and then refuses in the backward as "mutated"
    (GPT-J's and CodeGen's blocks had no generated option). Its input is kept or recomputed
    as the policy says, and the op runs again in the recomputation."""
    schema = getattr(n.target, "_schema", None)
    return schema is not None and schema.is_mutable


class OpPolicy:
    """A selective-checkpoint policy saving exactly the calls `saved` ((overload, k)); the
    counts of the last forward it ran are kept, to check them against the graph."""

    def __init__(self, saved: frozenset, expected: Counter):
        self.saved = saved
        self.expected = expected
        self.last_forward: Counter | None = None

    def context(self):
        counts = {False: Counter(), True: Counter()}
        self.last_forward = counts[False]
        saved = self.saved

        def policy(ctx, func, *args, **kwargs):
            name = _counted(func)
            if name is None:
                return CheckpointPolicy.PREFER_RECOMPUTE
            seen = counts[bool(ctx.is_recompute)]
            k = seen[name]
            seen[name] += 1
            if (name, k) in saved and not draws_random_numbers(func, args, kwargs):
                return CheckpointPolicy.MUST_SAVE
            return CheckpointPolicy.PREFER_RECOMPUTE

        return create_selective_checkpoint_contexts(policy)

    def matches(self) -> bool:
        return self.last_forward is not None and self.last_forward == self.expected


def _checkpointed(fn, policy: OpPolicy):

    def run(*xs):
        return checkpoint_call(fn, xs, {}, policy.context)

    return run


def _solutions(og, key, model, fractions, solver, time_limit, name, cache_dir) -> list:

    disk = None if key is None else cache_path(("sac",) + key, model, (tuple(fractions), 0),
                                               solver, cache_dir)
    spans_list = read_cached(disk)
    if spans_list is None:
        spans_list = solve_spans(og, model, fractions, solver, time_limit, name, jobs=1,
                                 pieces=False)
        write_cached(disk, spans_list)
    return spans_list


def _generate(fn, values, requires, out_grads, owned, resident, fixed, key, name, *, model,
              fractions, solver, time_limit, repeats, max_options, cache_dir) -> list:
    """[(option name, OpPolicy, Measured)] of one block (module docstring, steps 1-4)."""

    cache_key = (key, model, tuple(fractions))
    if cache_key not in CACHE:
        og = record_ops(_BlockModule(fn), values, requires, repeats=repeats)
        expected = Counter(_calls(og.gm))
        measures = []
        params = list(fn.module.parameters())
        for spans in _solutions(og, key, model, fractions, solver, time_limit, name,
                                cache_dir):
            if len(spans) == 1:  # the whole block kept or recomputed: autograd, recompute
                continue
            policy = OpPolicy(saved_calls(og, spans), expected)
            try:
                m = measure(_checkpointed(fn, policy), values, requires, out_grads, params,
                            owned, resident, repeats)
            except RuntimeError as exc:  # e.g. a kept value changed in place: not an option
                log.debug("block_ops: %s: a cut not run: %s", name, str(exc).splitlines()[0])
                continue
            if not policy.matches():  # the dispatch order is not the graph's: no options
                log.info("block_ops: %s: its calls under a selective checkpoint differ from "
                         "its graph's (%s); no generated options", name,
                         dict((policy.last_forward or Counter()) - expected)
                         or dict(expected - (policy.last_forward or Counter())))
                measures = []
                break
            m.needs_in = None  # the checkpoint keeps the block's inputs
            measures.append((spans, policy, m))
        CACHE[cache_key] = measures
    measures = CACHE[cache_key]
    pool = [m for _, _, m in measures] + list(fixed)
    kept = [r for r in measures if not dominated(r[2], pool)]
    kept = spread_on_front(kept, max_options, lambda r: r[2])
    return [(f"{OPS_PREFIX}{k}", policy, m) for k, (_, policy, m) in enumerate(kept, 1)]


class _BlockParams:
    """The parameters and buffers a block's segments run with, read from the block (held
    weakly) when they run: `POLICIES` is weak by block, and a value that held its block
    would keep the block, and the model's parameters, alive for good."""

    def __init__(self, block: nn.Module):
        self.block = weakref.ref(block)

    def parameters(self):
        return self.block().parameters()

    def buffers(self):
        return self.block().buffers()


class _Segmented:
    """A block's generated option cut into segments (`options.SegmentedLayer`, nested
    checkpoints: its backward recomputes one segment at a time), run in place of the
    block's forward on the call's tensors; the block's output rebuilt as the block returns
    it (the recorded structure, its tensors from the segments' outputs). The segments read
    the block's parameters through `_BlockParams` (the order `_BlockModule`'s, whose only
    submodule is the block), not through the module they were recorded with."""

    def __init__(self, layer, block: nn.Module, spec, template: list):
        layer.module = _BlockParams(block)
        self.layer = layer
        self.spec = spec
        self.template = template  # per output leaf: ("out", k), ("in", k) or the value

    def __call__(self, args: tuple, kwargs: dict):
        from torch.utils._pytree import tree_flatten, tree_unflatten

        xs = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]
        outs = self.layer(*xs)
        leaves = [outs[t[1]] if isinstance(t, tuple) and t[0] == "out"
                  else xs[t[1]] if isinstance(t, tuple) and t[0] == "in" else t
                  for t in self.template]
        return tree_unflatten(leaves, self.spec)


def _segmentable(call) -> bool:
    """Whether each tensor argument of a block is one of its input data or a view of one:
    the segments then take the call's tensors as they come. One datum may come as several
    arguments (GPT-J hands its blocks the sine and cosine halves of one rotary table), but
    not be returned as well: which of its views came back is not recorded."""
    leaves = list(call.leaves)
    if None in leaves:
        return False
    twice = {d for d, n in Counter(leaves).items() if n > 1}
    return not twice.intersection(call.out_leaves)


def _flat_args(call):
    from torch.utils._pytree import tree_flatten

    return tree_flatten((call.args, call.kwargs))


class _LeafFn:
    """The block over its call's tensor arguments (views included) as they come:
    ``fn(*tensor leaves) -> tuple of its new outputs`` (`hooked._BlockFn` takes the data the
    leaves are views of); `raw`: the block's output as it returns it."""

    def __init__(self, call, raw: bool = False):
        self.call = call
        self.module = call.module
        self.raw = raw

    def __call__(self, *xs):
        from torch.utils._pytree import tree_flatten, tree_unflatten

        it = iter(xs)
        flat, spec = _flat_args(self.call)
        a, kw = tree_unflatten([next(it) if isinstance(x, torch.Tensor) else x for x in flat],
                               spec)
        out = self.module(*a, **kw)
        if self.raw:
            return out
        tensors = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        by_name: dict = {}
        for t, d in zip(tensors, self.call.out_leaves):
            if d in self.call.outputs:
                by_name.setdefault(d, t)
        return tuple(by_name[d] for d in self.call.outputs)


def _leaf_values(call, values) -> list:
    """The call's tensor arguments from its input data's values (views taken again)."""
    out = []
    for d, view in zip(call.leaves, call.views):
        v = values[call.inputs.index(d)]
        out.append(v if view is None else v.as_strided(*view))
    return out


def _output_template(call, leaves) -> tuple:
    """(the block's output structure, its leaves as `_Segmented.template`)."""
    from torch.utils._pytree import tree_flatten

    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        out = _LeafFn(call, raw=True)(*leaves)
    flat, spec = tree_flatten(out)
    template, k = [], 0
    for x in flat:
        if isinstance(x, torch.Tensor):
            d = call.out_leaves[k]
            k += 1
            if d in call.outputs:
                template.append(("out", call.outputs.index(d)))
            elif d in call.leaves:
                template.append(("in", call.leaves.index(d)))
            else:
                raise SchedError(f"block output {d} is neither new nor an argument")
        else:
            template.append(x)
    return spec, template


def _segmented_options(lp, layer, values, requires, out_grads, owned, resident, fixed, key,
                       **generate) -> list:
    """[(option name, _Segmented, Measured)]: `options.generate_options` on the block over
    its call's tensors (the fx front end's generated options, nested checkpoints
    included), the inputs their backward reads mapped back to the block's data."""
    import dataclasses


    call = layer.module.call
    if not _segmentable(call):
        return []
    leaves = _leaf_values(call, values)
    spec, template = _output_template(call, leaves)
    wants = [requires[call.inputs.index(d)] for d in call.leaves]
    gens = generate_options(_BlockModule(_LeafFn(call)), leaves, wants, out_grads, owned,
                            resident, fixed=fixed, key=("leaves",) + key, name=lp.name,
                            jobs=1, **generate)
    out = []
    for g in gens:
        m = g.measured
        if m.needs_in is not None:
            m = dataclasses.replace(m, needs_in=sorted({call.inputs.index(call.leaves[i])
                                                        for i in m.needs_in}))
        out.append((g.name, _Segmented(g.layer, call.module, spec, template), m))
    return out


def _recorded(name: str, kind: str, generate, *args, **kwargs) -> list:
    """`generate(*args, **kwargs)`, or none where make_fx cannot record the block's op graph
    (data-dependent control flow on its call's values: `opgraph.record_ops` says so) or
    the recorded graph cannot be replayed, measured or solved (an op or a construct the
    op-level machinery does not know, met first on a model nobody tried): the block keeps its
    fixed options, as one whose calls differ from its graph's does, and the log says why.
    Generated options are an addition to a plan's space; a block without them is still
    planned."""
    try:
        return generate(*args, **kwargs)
    except DataError as exc:
        log.info("block_ops: %s: no generated options (%s): %s", name, kind,
                 str(exc).splitlines()[0])
    except Exception as exc:  # noqa: BLE001 - see the docstring: never a failed fit
        log.warning("block_ops: %s: no generated options (%s): %s: %s", name, kind,
                    type(exc).__name__, (str(exc).splitlines() or [""])[0])
    return []


def run_op_option(module: nn.Module, option: str, fwd, args: tuple, kwargs: dict, first_run):
    """`module`'s generated option `option` on the call (args, kwargs): a policy under the
    block's checkpoint, or its segments."""

    try:
        how = POLICIES[module][option]
    except KeyError:
        raise SchedError(f"block {type(module).__name__} has no generated option '{option}'"
                         ) from None
    if isinstance(how, _Segmented):
        return how(args, kwargs)
    return checkpoint_call(first_run, args, kwargs, how.context)


def add_block_op_options(profiled, *, model: str = "layer_options",
                         fractions=DEFAULT_FRACTIONS, solver: str = "highs",
                         time_limit: float | None = 30.0, repeats: int | None = None,
                         max_options: int = MAX_OPTIONS, cache_dir=None, jobs=None,
                         ray=None) -> dict[str, list]:
    """Generated options for every block of `profiled` (the hook front end's `ProfiledGraph`,
    its sample inputs still at hand) that has a backward: added to its layer profile, their
    policies registered for its module. Returns {block: [option names]}. `jobs`, `ray`: taken
    for `fit(op_options={...})`'s sake; the sub-solves of one block run in this process."""

    part = profiled.part
    repeats = repeats or getattr(profiled, "repeats", 3)
    named = dict(part.root.named_parameters())
    resident = list(part.root.parameters()) + list(part.root.buffers())
    values_of = layer_inputs(part)
    gen = torch.Generator().manual_seed(0)
    result = {}
    todo = [lp for lp in profiled.layers if lp.grad_inputs]
    with progress.phase("generating block options", len(todo)):
        for k, lp in enumerate(todo, 1):
            progress.step(k, lp.name)
            layer = part.layer(lp.name)
            values = values_of[lp.name]
            requires = [d in lp.grad_outputs for d in layer.inputs]
            with torch.no_grad(), torch.random.fork_rng(devices=[]):
                outs = layer.module(*values)
            out_grads = [torch.randn(o.shape, generator=gen).to(o) if d in lp.grad_inputs
                         else None for d, o in zip(layer.outputs, outs)]
            fixed = [Measured(o.fwd_time, o.bwd_time, o.fwd_overhead, o.bwd_overhead,
                              o.phantom, []) for o in lp.options]
            key = (layer.signature, tuple(tuple(v.shape) for v in values), tuple(requires))
            owned = [named[p] for p in lp.param_grads]
            common = {"model": model, "fractions": fractions, "solver": solver,
                      "time_limit": time_limit, "repeats": repeats,
                      "max_options": max_options, "cache_dir": cache_dir}
            made = _recorded(lp.name, "segments", _segmented_options, lp, layer, values,
                             requires, out_grads, owned, resident, fixed, key, **common)
            made += [(f"{OPS_PREFIX}{len(made) + int(opt[len(OPS_PREFIX):])}", policy, m)
                     for opt, policy, m in _recorded(lp.name, "policies", _generate,
                                                     layer.module, values, requires, out_grads,
                                                     owned, resident, fixed, key, lp.name,
                                                     **common)]
            for opt, how, m in made:
                ins = range(len(layer.inputs)) if m.needs_in is None else m.needs_in
                needs = [layer.inputs[i] for i in ins] + (
                    list(layer.outputs) if isinstance(how, OpPolicy)
                    else [layer.outputs[i] for i in m.needs_out])
                lp.options.append(OptionProfile(opt, m.fwd_time, m.bwd_time, m.fwd_overhead,
                                                m.bwd_overhead, m.phantom, needs, m.fwd_delta))
                POLICIES.setdefault(layer.module.module, {})[opt] = how
            result[lp.name] = [opt for opt, _, _ in made]
    return result
