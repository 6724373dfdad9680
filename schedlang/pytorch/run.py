"""`schedlang run MODULE:FACTORY --budget 60%`: train a few steps within a memory budget.

MODULE is a dotted module name (importable from the current directory) or a path to a .py
file; FACTORY a callable in it returning ``(model, sample_inputs, loss_fn)``,
``(model, sample_inputs)`` or a model (then ``--input-shape`` makes random float inputs; a
shape is ``8,3,32,32``, repeat the option for several inputs). Without a loss function the
loss is the mean of squares of the outputs. The command fits the model (profile, solve, or
``--graph``/``--plan`` given), trains ``--steps`` steps with SGD, and reports the predicted
and measured peak and the step time, of the plan and of plain execution (on the CPU, whose
memory tracker slows every op, the fitted module is timed in as many steps again untracked).
``--plot OUT.png`` and ``--trace OUT.json`` record the last training step op by op
(`schedlang.pytorch.timeline`): memory predicted by the simulator and measured per executed op,
with the budget; a
Chrome/Perfetto trace of the executed ops.

The command's arguments are `schedlang.cli.pytorch_args.add_run_arguments` (no torch needed
to build the CLI's parser); `schedlang.cli.main` imports this module when the command runs.

Exit codes: 0 ok, 2 bad input, 3 the budget cannot be met (no plan, or the measured peak
went over it).
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path

from .. import progress
from ..cli.output import print_json
from ..language.errors import Loc, SchedError
from ..language.paths import writable_file
from ..language.program import load_program
from ..language.units import format_size
from ..plans.plan import Plan
from ..plotting import check_plot_target
from .factory import load_factory
from .fit import fit  # torch: loaded when the command runs, not when the CLI parses
from .report import link_line
from .trace import write_trace


class RunError(SchedError):
    """Bad `schedlang run` input (module, factory, shapes)."""


def _parse_shape(text: str) -> tuple:
    try:
        shape = tuple(int(s) for s in text.replace("x", ",").split(",") if s.strip())
    except ValueError:
        raise RunError(f"--input-shape '{text}' is not a shape like 8,3,32,32") from None
    if not shape or any(s <= 0 for s in shape):
        raise RunError(f"--input-shape '{text}' must list positive sizes")
    return shape


def _build(args):
    import torch

    factory = load_factory(args.target, RunError)
    try:
        made = factory()
    except Exception as exc:
        raise RunError(f"{args.target}() failed: {type(exc).__name__}: {exc}") from None
    loss_fn = None
    if isinstance(made, torch.nn.Module):
        model, inputs = made, None
    elif isinstance(made, tuple) and made and isinstance(made[0], torch.nn.Module):
        model = made[0]
        inputs = made[1] if len(made) > 1 else None
        loss_fn = made[2] if len(made) > 2 else None
    else:
        raise RunError(f"{args.target}() returned {type(made).__name__}; expected a model or "
                       "(model, sample_inputs[, loss_fn])")
    if args.input_shape:
        inputs = tuple(torch.randn(_parse_shape(s)) for s in args.input_shape)
    if inputs is None:
        raise RunError(f"{args.target}() returned no sample inputs: give --input-shape")
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    if loss_fn is None:
        def loss_fn(out):
            from torch.utils._pytree import tree_flatten

            leaves = [t for t in tree_flatten(out)[0]
                      if isinstance(t, torch.Tensor) and t.is_floating_point()]
            return sum(t.float().pow(2).mean() for t in leaves)
    return model, tuple(inputs), loss_fn


def _train(module, inputs, loss_fn, steps: int, device, outputs_held: bool = True):
    """`steps` SGD steps: (step times, measured peaks). The output is held through the
    backward, or released once the loss is computed (`outputs_held` False)."""
    import torch


    opt = torch.optim.SGD([p for p in module.parameters() if p.requires_grad], lr=1e-3)
    times, peaks = [], []
    for _ in progress.counted("training step", range(steps)):
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        if outputs_held:
            out = module(*inputs)
            loss = loss_fn(out)
        else:
            out, loss = None, loss_fn(module(*inputs))
        loss.backward()
        del out, loss
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
        report = getattr(module, "memory_report", None)
        if report is not None:
            peaks.append(report().measured_peak_bytes)
        opt.step()
    return times, peaks


def run_main(args) -> int:
    """`schedlang run`: returns the exit code; user errors raise SchedError (the CLI prints
    them)."""
    try:
        import torch
    except ImportError:
        raise SchedError("schedlang run needs torch: pip install 'schedlang[torch]'") from None

    frontend = _checked_frontend(args)
    _check_outputs(args)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RunError("--device cuda: CUDA is not available")
    model, inputs, loss_fn = _build(args)
    model = model.to(device)
    inputs = tuple(x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs)
    graph = plan = None
    if args.graph:
        graph = _read_graph(args.graph)
    if args.plan:
        plan = Plan.load(args.plan)
    layers = args.layers.split(",") if args.layers else None
    t0 = time.perf_counter()
    kwargs = {} if graph is not None else {"repeats": max(1, args.repeats)}
    if getattr(args, "op_options", False):
        kwargs["op_options"] = True
    held = getattr(args, "outputs_held", True)
    fm = fit(model, inputs, args.budget, solver=args.solver, time_limit=args.time_limit,
             layers=layers, graph=graph, plan=plan, loss_fn=loss_fn, frontend=frontend,
             bandwidth=getattr(args, "bandwidth", None), outputs_held=held, **kwargs)
    fit_s = time.perf_counter() - t0
    if args.plan_out and fm.plan is not None:
        fm.plan.save(args.plan_out)
    if args.graph_out:

        write_trace(fm.graph, args.graph_out, None, "rockmate")
    if args.plot or args.trace:
        fm.record_timeline()
    times, peaks = _train(fm, inputs, loss_fn, args.steps, device, held)
    timeline = fm.timeline()
    if timeline is not None:
        if args.plot:
            timeline.plot(args.plot, title=f"{args.target}: memory over one training step "
                          f"on {device}" + (" (plain execution)" if fm.plain else
                                            f", plan of {len(fm.plan.ops)} ops"))
        if args.trace:
            timeline.write_trace(args.trace)
    rep = fm.memory_report()
    if rep.calibrated is not None and len(peaks) > 1:
        peaks = peaks[1:]  # the first step measured over its prediction: the module re-planned
    measured = max(p for p in peaks if p is not None) if any(p is not None for p in peaks) \
        else None
    if device.type != "cuda":
        # the CPU tracker intercepts every op and slows the measured steps: time as many
        # steps again without it (plain execution below is timed without it too)
        fm.measure = False
        fm.record_timeline(False)
        times, _ = _train(fm, inputs, loss_fn, args.steps, device, held)
    plain_times = None
    if not args.no_plain:
        plain_times, _ = _train(model, inputs, loss_fn, args.steps, device, held)
    step = statistics.median(times[1:] or times)
    plain_step = statistics.median(plain_times[1:] or plain_times) if plain_times else None
    pred = rep.predicted_peak_bytes
    err = None if measured is None else (measured - pred) / pred
    out = {
        "target": args.target, "device": str(device), "steps": args.steps,
        "budget_bytes": rep.budget_bytes, "plain": rep.plain,
        "predicted_peak_bytes": rep.predicted_peak_bytes, "measured_peak_bytes": measured,
        "prediction_error": err, "plain_peak_bytes": rep.plain_peak_bytes,
        "resident_bytes": rep.resident_bytes,
        "predicted_time_overhead": rep.plan_time_overhead,
        "time_overhead_source": rep.overhead_source,
        "modelled_time_overhead": rep.modelled_time_overhead,
        "step_s": step, "plain_step_s": plain_step,
        "measured_time_overhead": None if not plain_step else step / plain_step - 1,
        "fit_s": fit_s, "plan_ops": None if fm.plan is None else len(fm.plan.ops),
        "frontend": fm.frontend,
        "fits_budget": None if measured is None or rep.budget_bytes is None
        else measured <= rep.budget_bytes,
        "calibrated": rep.calibrated, "outputs_held": held,
        "host_link": rep.extra.get("host_link"),
        "plot": args.plot, "trace": args.trace,
    }
    if args.json:

        print_json(out)
    else:
        _print_report(out, rep, args, held, fit_s)
    if out["fits_budget"] is False:
        return 3
    return 0


def _check_outputs(args) -> None:
    """Fail before profiling and training when an output cannot be written."""

    if args.plot and args.trace and Path(args.plot).resolve() == Path(args.trace).resolve():
        raise RunError("--plot and --trace name the same file", Loc("--trace"))
    if args.plot is not None:

        check_plot_target(args.plot, Loc("--plot"))
    for flag, path, what in (("--trace", args.trace, "trace"),
                             ("--plan-out", args.plan_out, "plan"),
                             ("--graph-out", args.graph_out, "graph data")):
        if path is not None:
            writable_file(path, Loc(flag), what)


def _read_graph(path: str):

    program = load_program([Path(path)], None)
    if program.graph is None or not program.graph.layers:
        raise RunError(f"{path}: no layered graph data (data, layer, loss declarations)")
    return program.graph


def _checked_frontend(args) -> str:
    """The front end `schedlang run` fits with, its arguments checked against it."""
    if args.steps < 1:
        raise RunError("--steps must be at least 1")
    if args.plan and not args.graph:
        raise RunError("--plan needs --graph (the graph data the plan was made for)")
    frontend = getattr(args, "frontend", "auto")
    if args.graph and frontend == "blocks":
        raise RunError("--graph is layered graph data of the fx front end: it does not go "
                       "with --frontend blocks")
    if getattr(args, "op_options", False):
        if args.graph:
            raise RunError("--op-options generates options while profiling; --graph is "
                           "profiled already (trace it with `schedlang trace --op-options`)")
        if frontend == "blocks":
            raise RunError("--op-options needs the fx front end (the layers' aten graphs): "
                           "it does not go with --frontend blocks")
        frontend = "fx"
    return frontend


def _print_report(out: dict, rep, args, held: bool, fit_s: float) -> None:
    """`schedlang run`'s text report of `out` (what --json prints)."""

    step, plain_step, measured = out["step_s"], out["plain_step_s"], out["measured_peak_bytes"]
    err, device = out["prediction_error"], out["device"]

    def fmt(n):
        return "-" if n is None else f"{format_size(n)} ({n} B)"
    print(f"model      {args.target} on {device}, {args.steps} steps, front end "
          f"{out['frontend']}"
          + (" (plain execution: the budget covers it)" if rep.plain else
             f", plan of {out['plan_ops']} ops"))
    print(f"budget     {fmt(rep.budget_bytes)}   plain peak {fmt(rep.plain_peak_bytes)}")
    print(f"predicted  {fmt(rep.predicted_peak_bytes)}")
    line = f"measured   {fmt(measured)}"
    if err is not None:
        line += f"   ({100 * err:+.2f}% vs predicted)"
    print(line)
    line = f"step time  {1000 * step:.2f} ms"
    if plain_step:
        line += f"   plain {1000 * plain_step:.2f} ms ({100 * (step / plain_step - 1):+.1f}%)"
    line += f"   predicted overhead {100 * rep.plan_time_overhead:+.1f}%"
    if rep.overhead_source != "modelled" and rep.modelled_time_overhead is not None:
        line += (f" ({rep.overhead_source} by fit; the time model "
                 f"{100 * rep.modelled_time_overhead:+.1f}%)")
    print(line)
    print(f"fit        {fit_s:.2f} s (profile and solve)")
    if out["host_link"]:
        print(f"host link  {link_line(out['host_link'])}")
    if not held:
        print("outputs    released once the loss is computed: loss_fn(model(x)).backward()")
    if rep.calibrated is not None:
        c = rep.calibrated
        print(f"calibrated the first step measured {fmt(c['measured'])}, over its prediction "
              f"{fmt(c['predicted'])}: " + ("re-planned with that margin (the measured peak "
                                           "above is of the later steps)"
                                           if c["replanned"] else "no plan fits with it"))
    for what, path in (("plot", args.plot), ("trace", args.trace)):
        if path:
            print(f"{what:<10} {path}")
