"""The hierarchy: layer options generated from op-level solves (models/layer_options.sched).

    python bench/bench_hierarchy.py [--parts lowest flat scale] [--repeats 2] [--json OUT]

* lowest: the smallest feasible budget `fit` finds with the three fixed options (autograd,
  recompute, selective) and with the generated options added, for a U-Net-like CNN and a
  GPT-like transformer (schedlang/testing/torch_models.py), side by side with the physical floor:
  resident memory (parameters, buffers, inputs) + parameter gradients + the largest single
  op's backward working set (its output's gradient, its inputs' gradients, what autograd saved
  for it); also with only the parameter gradients that exist when that op's backward runs
  (`floor_at_op`: the honest least memory at that moment; the first counts them all). At the
  generated options' smallest budget, one training step runs: gradients against eager
  PyTorch, measured peak (CPU tracker) against the budget.
* flat: a small model (`--flat-model`, default a 2-block GPT of width 128, context 64: ops
  dominate the executor's overheads; `unet`: the U-Net-like CNN of `lowest`) planned flat at
  op level (its whole op graph, solved as `schedlang solve` does by default,
  `schedlang.solve.strategy`: `checkmate_tight` with CP-SAT and HiGHS; `--flat-time-limit` a
  budget: the incumbent and the proven bound) against the hierarchical plan (layered graph with generated options,
  `rockmate.sched`). Each plan gets the same bytes below its own graph's plain peak (the
  graphs count the step differently: the loss's memory and measured workspaces only in the
  layered one; both hold the parameter gradients from their creation on); times on the same
  clock: the hierarchical plan is
  also solved with every option priced from the op profile (`op_clock`), as the flat graph
  is, next to its times as measured. Then each one's lowest feasible budget (bisection).
* scale: end-to-end planning time of a 12-block transformer by phase (trace and profile, op
  graphs, option sub-solves — on `--scale-jobs` worker processes, `schedlang.parallel` —,
  measuring the options, the top-level solve at 40%), and its op counts: aten ops of one
  eager training step (forward + backward: the count of the issue's "2,500 ops"), forward
  aten ops under make_fx, units, and the nodes of `trace --ops`'s Checkmate view.
  `--scale-model gpt-rms-gelu` (default): GPT blocks with Llama's RMSNorm and GPT-2's tanh
  GELU written out as in their reference code (2,646 ops); `gpt`: the plain test GPT (1,914).

Budgets are bisected to 0.2% (`--bisect-rel`). Times on a shared CPU are noisy (quote `uptime`).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from schedlang.language.units import format_size  # noqa: E402
from schedlang.pytorch.fit import fit, prepare, solve_plan  # noqa: E402
from schedlang.testing.torch_models import ALL  # noqa: E402

MODELS = {
    # 3 encoder and 2 decoder conv blocks, 64x64 inputs
    "unet": ("unet", dict(batch=4, size=64, base=8)),
    "gpt": ("gpt", dict(batch=4, context=64, dim=64, heads=4, layers=4, vocab=128)),
}


def lowest(prep, rel: float = 0.01, time_limit: float = 60.0) -> int | None:
    """Smallest total budget (bytes) with a plan, by bisection on the activation budget."""
    kw = {"loss_overhead": prep.loss_overhead, "output_bytes": prep.output_bytes}
    high = prep.plain_peak - prep.resident_bytes + prep.output_bytes + 1024
    plan = solve_plan(prep.graph, high, "highs", time_limit, **kw)
    if plan is None:
        return None
    best, low = plan.predicted_peak, 0
    while best - low > max(rel * best, 1024):
        mid = (low + best) // 2
        plan = solve_plan(prep.graph, mid, "highs", time_limit, **kw)
        if plan is None:
            low = mid
        else:
            best = plan.predicted_peak
    return best + prep.resident_bytes


def floor(model, prep) -> dict:
    """Resident + parameter gradients + the largest single op's backward working set (its
    output's gradient, its inputs' gradients, what autograd saved for it). `floor` counts
    every parameter gradient (an upper bound: the step's end holds them all); `floor_at_op`
    only those that exist when that op's backward runs (the layers from its own to the last:
    the backward runs in reverse), the least memory any plan needs at that moment."""
    from schedlang.pytorch.options import CACHE

    pgrads = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    sizes = {d.name: d.size for d in prep.graph.data}
    layers = [lay.name for lay in prep.graph.layers]
    later = {name: sum(sizes.get(f"{m}.params.grad", 0) for m in layers[k:])
             for k, name in enumerate(layers)}
    graphs = {key[0][0]: og for key, (og, _, _) in CACHE.items()}  # layer signature -> graph
    ws, where, at_op = 0, "", 0
    for lay in prep.partitioned.layers:
        og = graphs.get(lay.signature)
        if og is None:
            continue
        owned = {u.name: u.created for u in og.units}
        for u in og.units:
            if not u.has_backward:
                continue
            w = u.created + u.grad_bytes + sum(owned.get(s, 0) for s in u.saved_from)
            if w > ws:
                ws, where = w, f"{lay.name}: " + "+".join(u.ops[:3])
            at_op = max(at_op, prep.resident_bytes + later.get(lay.name, 0) + w)
    return {"resident": prep.resident_bytes, "param_grads": pgrads, "op_working_set": ws,
            "op": where, "floor": prep.resident_bytes + pgrads + ws, "floor_at_op": at_op}


def check_step(model, inputs, loss_fn, prep, budget) -> dict:
    import re

    from schedlang.pytorch.fit import FitError
    from schedlang.testing.steps import assert_same, eager_grads, fit_step

    ref = eager_grads(model, inputs, loss_fn)
    asked = budget
    try:
        fm = fit(model, inputs, budget, loss_fn=loss_fn, prepared=prep, calibrate=False)
    except FitError as exc:  # fit's probe step measured over the solver's prediction: fit
        # names the smallest budget its measured plans meet; the step runs there
        budget = int(re.search(r"smallest feasible budget found is .*?\((\d+) B\)",
                               str(exc)).group(1))
        fm = fit(model, inputs, budget, loss_fn=loss_fn, prepared=prep, calibrate=False)
    got = fit_step(fm, model, inputs, loss_fn)
    try:
        assert_same(ref, got, exact=False)
        equal = True
    except AssertionError:
        equal = False
    rep = fm.memory_report()
    used = sorted({op.option for op in fm.plan.ops if op.op == "compute" and op.option
                   and op.option.startswith("ops")}) if fm.plan else []
    return {"budget": budget, "asked": asked, "measured": rep.measured_peak_bytes,
            "predicted": rep.predicted_peak_bytes, "grads_equal": equal,
            "within": rep.measured_peak_bytes <= budget, "generated_used": used}


def part_lowest(args) -> list[dict]:
    rows = []
    for key, (factory, sizes) in MODELS.items():
        if args.models and key not in args.models:
            continue
        from schedlang.pytorch.options import CACHE

        CACHE.clear()  # the floor reads this model's op graphs
        model, inputs, loss_fn = ALL[factory](**sizes)
        fixed = prepare(model, inputs, loss_fn=loss_fn, repeats=args.repeats)
        t0 = time.perf_counter()
        gen = prepare(model, inputs, loss_fn=loss_fn, repeats=args.repeats,
                      op_options={"repeats": args.repeats})
        gen_s = time.perf_counter() - t0
        n_gen = sum(1 for lay in gen.graph.layers for o in lay.options if o.name.startswith("ops"))
        lo_fixed = lowest(fixed, args.bisect_rel)
        lo_gen = lowest(gen, args.bisect_rel)
        fl = floor(model, gen)
        # the step runs at the smallest budget found plus 1 KiB (the bisection's plan is
        # predicted at most at that budget; the CPU tracker sees a few bytes more: the loss)
        step = check_step(model, inputs, loss_fn, gen, lo_gen + 1024) if lo_gen else None
        row = {"model": key, "plain_peak": gen.plain_peak, "fixed": lo_fixed, "generated": lo_gen,
               "reduction": None if not (lo_fixed and lo_gen) else 1 - lo_gen / lo_fixed,
               "floor": fl, "gen_options": n_gen, "prepare_with_options_s": gen_s, "step": step}
        rows.append(row)
        print(f"{key:5s} plain {format_size(gen.plain_peak):>10s}  fixed options "
              f"{_fmt(lo_fixed)}  generated ({n_gen} options) {_fmt(lo_gen)}  "
              f"-{100 * (row['reduction'] or 0):.1f}%  floor {format_size(fl['floor'])} "
              f"(resident {format_size(fl['resident'])}, param grads "
              f"{format_size(fl['param_grads'])}, op {format_size(fl['op_working_set'])} "
              f"{fl['op']}); generated/floor {(lo_gen or 0) / fl['floor']:.3f}; floor with "
              f"the parameter gradients alive at that op {format_size(fl['floor_at_op'])}",
              flush=True)
        if step:
            raised = "" if step["budget"] == step["asked"] else \
                f" (fit's probe step measured {format_size(step['asked'])} over its prediction)"
            print(f"      step at {format_size(step['budget'])}{raised}: measured "
                  f"{format_size(step['measured'])} predicted {format_size(step['predicted'])} "
                  f"within budget {step['within']} gradients equal eager {step['grads_equal']} "
                  f"generated options used {step['generated_used']}", flush=True)
    return rows


def _fmt(b) -> str:
    return f"{format_size(b):>10s}" if b else "      none"


#: the model of `flat` (`--flat-model`): "gpt2" (default) a 2-block GPT whose ops dominate
#: the executor's overheads; "tiny" the 1-block GPT of earlier stops (dim 32, context 16)
FLAT_MODELS = {
    "gpt2": dict(batch=4, context=64, dim=128, heads=4, layers=2, vocab=128),
    "gpt4": dict(batch=4, context=64, dim=64, heads=4, layers=4, vocab=128),
    "tiny": dict(batch=2, context=16, dim=32, heads=2, layers=1, vocab=32),
}


def op_clock(prep, repeats: int):
    """The layered graph with every option's times from the op profile (`record_ops`: each
    aten unit's least time over the repeats, as the flat graph has them), memory as measured:
    the hierarchical plan priced on the flat plan's clock. Per layer F, B: its units' forward
    and backward times; autograd F, B; recompute F, F + B; selective F, B + the units without
    a matmul or convolution (`profile.SAVE_OPS`); a generated option F, B + its checkpointed
    segments' units that run again (`_rounds`; + F when nested: the outer checkpoint reruns
    the whole forward)."""
    import copy

    from schedlang.pytorch.opgraph import record_ops
    from schedlang.pytorch.options import layer_inputs
    from schedlang.pytorch.profile import SAVE_OPS

    save_names = {getattr(op, "__name__", str(op)).split(".")[0] for op in SAVE_OPS}
    part = prep.partitioned
    generated = getattr(part, "op_options", {}) or {}
    values = layer_inputs(part)
    g = copy.deepcopy(prep.graph)
    ogs: dict = {}
    for lay in g.layers:
        gens = generated.get(lay.name, {})
        lp = part.layer(lay.name)
        # recorded here, `repeats` times, whether or not the layer has generated options (the
        # generation's own recording may have run with fewer repeats)
        key = (lp.signature, tuple(tuple(v.shape) for v in values[lay.name]))
        if key not in ogs:
            requires = [f"{d}.grad" in lay.grad_outputs for d in lp.inputs]
            ogs[key] = record_ops(lp.module, values[lay.name], requires, repeats=repeats)
        og = ogs[key]
        fwd = {u.name: u.fwd_time for u in og.units}
        F, B = sum(fwd.values()), sum(u.bwd_time for u in og.units)
        for o in lay.options:
            o.fwd_time = F
            if o.name == "autograd":
                o.bwd_time = B
            elif o.name == "recompute":
                o.bwd_time = F + B
            elif o.name == "selective":
                o.bwd_time = B + sum(u.fwd_time for u in og.units
                                     if not save_names.intersection(u.ops))
            elif o.name in gens:
                o.bwd_time = B + _rounds(og, gens[o.name]) + (F if gens[o.name].nested else 0.0)
            else:
                raise ValueError(f"op_clock: no op-level price for option {o.name!r}")
            o.fwd_steps, o.bwd_steps = [], []
        lay.fast_forward = None
    return g


def _rounds(og, sl) -> float:
    """Op-clock time of a generated option's recomputation rounds (`_round` per checkpointed
    segment; nested: each runs all its units, the layer's own checkpoint kept none)."""
    unit_of = {n: u.name for u in og.units for n in u.nodes}
    units = {u.name: u for u in og.units}
    return sum(_round(seg, unit_of, units, sl.nested) for seg in sl.segments if seg[1])


def _round(seg, unit_of, units, whole: bool) -> float:
    """One checkpointed segment's round: its units up to the last one owning a value the round
    must leave behind (torch's checkpoint stops recomputing once it has them all) — what
    autograd saves inside its kept pieces (the whole segment when it has none), the input of
    each checkpointed piece —, plus each checkpointed piece's own round, one level down."""
    order = list(dict.fromkeys(unit_of[n.name] for n in seg[0]))
    pieces = seg[2] if len(seg) > 2 and seg[2] else [(seg[0], False)]
    needed: set = set()
    inner = 0.0
    for piece in pieces:
        mine = list(dict.fromkeys(unit_of[n.name] for n in piece[0]))
        if piece[1]:
            at = order.index(mine[0])
            if at:
                needed.add(order[at - 1])
            inner += _round(piece, unit_of, units, False)
        else:
            needed |= {s for w in mine for s in units[w].saved_from}
    last = max((k for k, v in enumerate(order) if v in needed), default=-1)
    return inner + sum(units[v].fwd_time for k, v in enumerate(order) if k <= last or whole)


def part_flat(args) -> dict:
    """Flat op-level Checkmate vs the hierarchical plan on a small model, at the same
    absolute saving below the plain step's peak, times on the same clock (module docstring)."""
    import schedlang
    from schedlang.plans.planners.no_recompute import no_recompute_plan
    from schedlang.plans.simulate import simulate
    from schedlang.pytorch.opgraph import record_ops
    from schedlang.solve import strategy

    kind, sizes = (("unet", MODELS["unet"][1]) if args.flat_model == "unet"
                   else ("gpt", FLAT_MODELS[args.flat_model]))
    model, inputs, loss_fn = ALL[kind](**sizes)
    og = record_ops(model, inputs, repeats=args.op_repeats)
    flat = og.checkmate("flat", loss=True, param_grads=True)
    base = simulate(no_recompute_plan(flat), flat)
    prep = prepare(model, inputs, loss_fn=loss_fn, repeats=args.repeats,
                   op_options={"repeats": args.repeats})
    hbase = simulate(no_recompute_plan(prep.graph), prep.graph)
    opg = op_clock(prep, args.op_repeats)
    obase = simulate(no_recompute_plan(opg), opg)
    kw = {"loss_overhead": prep.loss_overhead, "output_bytes": prep.output_bytes}
    out = {"model": {kind: sizes}, "ops": og.n_ops, "units": len(og.units),
           "flat_nodes": len(flat.nodes), "layers": len(prep.graph.layers),
           "flat_plain_peak": base.peak_bytes, "hier_plain_peak": hbase.peak_bytes,
           "flat_time": base.time, "hier_time_measured": hbase.time, "hier_time_op": obase.time,
           "rows": [], "load": [os.getloadavg()[0]]}
    print(f"flat: {og.n_ops} aten ops, {len(og.units)} units, {len(flat.nodes)} nodes, plain "
          f"peak {format_size(base.peak_bytes)} (activations), time {1e3 * base.time:.2f} ms; "
          f"hierarchical: {len(prep.graph.layers)} layers, plain peak "
          f"{format_size(hbase.peak_bytes)}, time {1e3 * hbase.time:.2f} ms as measured, "
          f"{1e3 * obase.time:.2f} ms on the op clock", flush=True)
    for frac in args.flat_budgets:
        # the same bytes below each graph's plain peak: the graphs count the same physical
        # step (the loss's memory and measured workspaces only in the layered graph: constant
        # offsets of the accounting, not of the plan)
        cut = int(base.peak_bytes * (1 - frac))
        fb, hb = base.peak_bytes - cut, hbase.peak_bytes - cut
        flat.budgets = {"peak": fb}
        t0 = time.perf_counter()
        res = strategy.solve(schedlang.load(model="checkmate", graph=flat),
                             time_limit=args.flat_time_limit)  # the default solve
        fs = time.perf_counter() - t0
        f_oh = res.objective / base.time - 1 if res.objective else None
        # the solver's proven lower bound on the flat optimum (its time over the plain one)
        b_oh = res.bound / base.time - 1 if res.bound is not None else None
        t0 = time.perf_counter()
        plan = solve_plan(prep.graph, hb, "highs", args.time_limit, **kw)
        hs = time.perf_counter() - t0
        oplan = solve_plan(opg, hb, "highs", args.time_limit, **kw)
        h_oh = plan.predicted_time / hbase.time - 1 if plan else None
        o_oh = oplan.predicted_time / obase.time - 1 if oplan else None
        used = sorted({f"{op.node}:{op.option}" for op in oplan.ops
                       if op.op == "compute" and op.option}) if oplan else []
        row = {"fraction": frac, "saved_bytes": cut, "flat_budget": fb, "hier_budget": hb,
               "flat_status": res.status.value, "flat_gap": res.gap, "flat_bound_overhead": b_oh,
               "flat_overhead": f_oh, "flat_s": fs, "hier_overhead_measured": h_oh,
               "hier_overhead_op": o_oh, "hier_s": hs, "options_used": used,
               "gap_op": None if o_oh is None or f_oh is None else (1 + o_oh) / (1 + f_oh) - 1,
               "gap_op_bound": None if o_oh is None or b_oh is None else (1 + o_oh) / (1 + b_oh) - 1}
        out["rows"].append(row)
        print(f"  {100 * frac:.0f}% of the flat plain peak ({format_size(cut)} below each "
              f"plain peak: flat {format_size(fb)}, layered {format_size(hb)}): flat "
              f"{res.status.value} {_pct(f_oh)} (bound {_pct(b_oh)}, gap {_pct(res.gap)}, {fs:.1f} s); "
              f"hierarchical {_pct(o_oh)} on the op clock, {_pct(h_oh)} as measured "
              f"({hs:.1f} s); hierarchical/flat time {_pct(row['gap_op'])} (op clock; over the flat "
              f"bound {_pct(row['gap_op_bound'])}); "
              f"options {' '.join(used)}", flush=True)
    # lowest feasible budget of each, as bytes below its own plain peak
    lo, hi = 0.0, 1.0
    for _ in range(args.flat_bisect):
        mid = (lo + hi) / 2
        flat.budgets = {"peak": int(base.peak_bytes * mid)}
        res = strategy.solve(schedlang.load(model="checkmate", graph=flat),
                             time_limit=args.flat_bisect_time_limit)
        if res.status.has_solution:
            hi = mid
        else:
            lo = mid
    h_lo = lowest(prep) - prep.resident_bytes  # activation bytes, layered accounting
    f_lo = int(base.peak_bytes * hi)
    out.update({"flat_lowest": f_lo, "flat_lowest_within": int(base.peak_bytes * (hi - lo)),
                "hier_lowest": h_lo,
                "flat_lowest_fraction": hi, "hier_lowest_fraction": h_lo / hbase.peak_bytes,
                "hier_lowest_same_cut": base.peak_bytes - (hbase.peak_bytes - h_lo)})
    out["load"].append(os.getloadavg()[0])
    print(f"  lowest feasible: flat {format_size(f_lo)} = {hi:.3f} of its plain peak "
          f"(bisection, {args.flat_bisect} solves: -{format_size(out['flat_lowest_within'])}); "
          f"hierarchical {format_size(h_lo)} = {out['hier_lowest_fraction']:.3f} of its plain "
          f"peak, {format_size(out['hier_lowest_same_cut'])} at the same cut below the plain "
          f"peak ({out['hier_lowest_same_cut'] / f_lo - 1:+.1%} vs flat); load "
          f"{out['load'][0]:.1f} -> {out['load'][1]:.1f}", flush=True)
    return out


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:+.2f}%"


class NewGELU(torch.nn.Module):
    """GPT-2's tanh GELU (`gelu_new`), written out as in its reference code."""

    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi)
                                           * (x + 0.044715 * torch.pow(x, 3.0))))


class RMSNorm(torch.nn.Module):
    """Llama's RMSNorm, written out as in its reference code."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        var = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.eps)).to(x.dtype)


def scale_model(name: str):
    """The 12-block transformers of `scale`: "gpt", schedlang/testing/torch_models.py's GPT (fused
    LayerNorm and GELU: 904 forward aten ops), and "gpt-rms-gelu" (default), the same GPT
    with its norms and activation written out as Llama's RMSNorm and GPT-2's tanh GELU are
    in their reference code: 2,646 aten ops in a training step."""
    model, inputs, loss_fn = ALL["gpt"](batch=4, context=64, dim=64, heads=4, layers=12,
                                        vocab=128)
    if name == "gpt-rms-gelu":
        for block in model.blocks:
            block.mlp[1] = NewGELU()
            block.ln1, block.ln2 = RMSNorm(64), RMSNorm(64)
    return model, inputs, loss_fn


def step_ops(model, inputs, loss_fn) -> tuple[int, int]:
    """(forward, backward) aten ops dispatched by one eager training step."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n += 1
            return func(*args, **(kwargs or {}))

    fwd, bwd = Count(), Count()
    with torch.random.fork_rng():
        with fwd:
            loss = loss_fn(model(*inputs))
        with bwd:
            loss.backward()
    model.zero_grad(set_to_none=True)
    return fwd.n, bwd.n


def part_scale(args) -> dict:
    """End-to-end planning of a 12-block transformer, by phase; its op counts."""
    from schedlang.pytorch import opgraph, options
    from schedlang.pytorch.opgraph import record_ops

    model, inputs, loss_fn = scale_model(args.scale_model)
    fwd_ops, bwd_ops = step_ops(model, inputs, loss_fn)
    og = record_ops(model, inputs, repeats=1)
    n_bwd = sum(1 for u in og.units if u.has_backward)
    counts = {"blocks": 12, "model": args.scale_model, "step_aten_ops": fwd_ops + bwd_ops,
              "step_aten_ops_forward": fwd_ops, "step_aten_ops_backward": bwd_ops,
              "make_fx_aten_ops_forward": og.n_ops, "units": len(og.units),
              "checkmate_nodes": len(og.checkmate("x").nodes), "units_with_backward": n_bwd}
    print(f"12-block transformer ({args.scale_model}): {fwd_ops + bwd_ops} aten ops in a "
          f"training step ({fwd_ops} forward + {bwd_ops} backward, eager dispatch); "
          f"{og.n_ops} forward aten ops under make_fx in {len(og.units)} units; "
          f"`trace --ops` Checkmate view: {counts['checkmate_nodes']} nodes", flush=True)
    runs = []
    for jobs in args.scale_jobs:
        options.CACHE.clear()
        spent = {"record_ops": 0.0, "sub_solves": 0.0, "op_options": 0.0}
        calls = {"record_ops": 0, "sub_solves": 0, "op_options": 0}

        def timed(fn, key):
            def wrapper(*a, **k):
                calls[key] += 1
                t = time.perf_counter()
                try:
                    return fn(*a, **k)
                finally:
                    spent[key] += time.perf_counter() - t
            return wrapper

        saved = (options.record_ops, options.solve_spans, options.add_generated_options)
        options.record_ops = timed(opgraph.record_ops, "record_ops")
        options.solve_spans = timed(saved[1], "sub_solves")
        options.add_generated_options = timed(saved[2], "op_options")
        try:
            load0 = os.getloadavg()[0]
            t0 = time.perf_counter()
            prep = prepare(model, inputs, loss_fn=loss_fn, repeats=args.repeats,
                           op_options={"repeats": args.repeats, "jobs": jobs})
            t_prep = time.perf_counter() - t0
        finally:
            options.record_ops, options.solve_spans, options.add_generated_options = saved
        budget = int(0.4 * prep.plain_peak)
        t1 = time.perf_counter()
        fm = fit(model, inputs, budget, loss_fn=loss_fn, prepared=prep, calibrate=False)
        t_solve = time.perf_counter() - t1
        n_gen = sum(1 for lay in prep.graph.layers for o in lay.options
                    if o.name.startswith("ops"))
        run = {"jobs": jobs or "cores", "trace_profile_s": t_prep - spent["op_options"],
               "op_graphs_s": spent["record_ops"], "sub_solves_s": spent["sub_solves"],
               "measure_s": spent["op_options"] - spent["record_ops"] - spent["sub_solves"],
               "top_solve_s": t_solve, "total_s": t_prep + t_solve,
               "layers_solved": calls["sub_solves"],
               "generated_options": n_gen, "plan_found": fm.plan is not None,
               "load": [load0, os.getloadavg()[0]]}
        runs.append(run)
        print(f"  jobs {run['jobs']}: trace + profile {run['trace_profile_s']:.1f} s, op graphs "
              f"{run['op_graphs_s']:.1f} s, sub-solves {run['sub_solves_s']:.1f} s, measuring "
              f"the options {run['measure_s']:.1f} s, top-level solve at 40% "
              f"{t_solve:.1f} s: total {run['total_s']:.1f} s (target <= 300 s); "
              f"{calls['sub_solves']} layer structures solved, "
              f"{n_gen} generated options, plan {'found' if fm.plan else 'NOT found'}; "
              f"load {load0:.1f} -> {os.getloadavg()[0]:.1f}", flush=True)
    return {**counts, "runs": runs}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", nargs="+", default=["lowest", "flat", "scale"])
    ap.add_argument("--models", nargs="+", default=None)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--time-limit", type=float, default=120.0)
    ap.add_argument("--flat-budgets", type=float, nargs="+", default=[0.8, 0.7, 0.6])
    ap.add_argument("--flat-bisect", type=int, default=4)
    ap.add_argument("--op-repeats", type=int, default=5, help="repeats of the op profiles "
                    "of `flat` (the flat graph and the op clock; each op's least time)")
    ap.add_argument("--flat-model", default="gpt2", choices=sorted([*FLAT_MODELS, "unet"]))
    ap.add_argument("--flat-time-limit", type=float, default=600.0,
                    help="time limit of each flat Checkmate solve (s)")
    ap.add_argument("--flat-bisect-time-limit", type=float, default=120.0,
                    help="time limit of the flat bisection's solves (s): no plan found in it "
                    "counts as infeasible")
    ap.add_argument("--scale-model", default="gpt-rms-gelu", choices=["gpt-rms-gelu", "gpt"])
    ap.add_argument("--scale-jobs", type=int, nargs="+", default=[0], help="sub-solve workers "
                    "of `scale`, one run each (0: as many as cores allow; 1: serial)")
    ap.add_argument("--bisect-rel", type=float, default=0.002, help="`lowest`: bisect each "
                    "smallest feasible budget to this fraction of it (default 0.2%%)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    print(f"load: {os.getloadavg()}", flush=True)
    out = {}
    if "lowest" in args.parts:
        out["lowest"] = part_lowest(args)
    if "flat" in args.parts:
        out["flat"] = part_flat(args)
    if "scale" in args.parts:
        out["scale"] = part_scale(args)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
