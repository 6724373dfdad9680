"""The arguments of the PyTorch commands, `schedlang trace` and `schedlang run`.

They live apart from the commands themselves (`schedlang.pytorch.trace.trace_main`,
`schedlang.pytorch.run.run_main`) so that building the CLI's parser needs no torch: the
commands import it when they run.
"""
from __future__ import annotations

import argparse


def add_trace_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of `schedlang trace` (needs no torch)."""
    p.add_argument("factory", metavar="MODULE:FACTORY",
                   help="a callable returning an nn.Module, or (module, inputs[, loss_fn]); "
                        "MODULE is a dotted module name or a .py file")
    p.add_argument("--input-shape", action="append", default=[], metavar="8,3,32,32",
                   help="shape of a random sample input (repeat for several inputs); needed "
                        "when FACTORY returns no inputs")
    p.add_argument("--input-dtype", action="append", default=[], metavar="DTYPE",
                   help="dtype of the matching --input-shape (float32 default; int64 inputs "
                        "are drawn in [0, 2))")
    p.add_argument("--layers", help="comma-separated submodule names to use as layers "
                   "(default: chosen automatically)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per measure (median; 5)")
    p.add_argument("--options", default="autograd,recompute,selective",
                   help="options to profile (autograd,recompute,selective)")
    p.add_argument("--device", help="device to move the model and inputs to (cpu, cuda, "
                   "cuda:1); default: where the factory put them")
    p.add_argument("--name", help="graph name (default: the model's class name)")
    p.add_argument("--ops", action="store_true",
                   help="write the whole model's aten-level op graph as Checkmate-view graph "
                        "data (`use checkmate`) instead of layered graph data")
    p.add_argument("--op-options", action="store_true",
                   help="also generate options from each layer's op graph (ops1, ops2, ...: "
                        "solves of models/layer_options.sched, measured on the layer), written "
                        "with the segments `schedlang run --graph` rebuilds them from")
    p.add_argument("--op-model", metavar="MODEL",
                   help="with --op-options: the shipped model name or .sched path that "
                        "generates them (default layer_options)")
    p.add_argument("--budget", help="also write `budget peak` (a size, or a percent of the "
                   "no-recomputation peak)")
    p.add_argument("-o", "--output", required=True, help="the .sched file to write")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr (profiling, "
                   "option generation)")


def add_run_arguments(p) -> None:
    """Arguments of `schedlang run` on an argparse (sub)parser; imports nothing heavy."""
    p.add_argument("target", metavar="MODULE:FACTORY",
                   help="a factory returning (model, sample_inputs[, loss_fn]) or a model; "
                   "MODULE is a dotted name or a .py path")
    p.add_argument("--budget", default="100%", help="peak budget of a training step: a size "
                   "(2GiB) or a percent of plain execution's peak (60%%); default 100%%")
    p.add_argument("--input-shape", action="append", metavar="SHAPE", default=None,
                   help="shape of a random input when FACTORY returns a model only "
                   "(e.g. 8,3,32,32); repeat for several inputs")
    p.add_argument("--steps", type=int, default=5, help="training steps (default 5)")
    p.add_argument("--repeats", type=int, default=5, help="profiling runs per layer (default 5)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--solver", default="highs", help="MILP solver (default highs)")
    p.add_argument("--time-limit", type=float, default=60.0, help="solver seconds (default 60)")
    p.add_argument("--layers", default=None, help="comma list of submodules to use as layers")
    p.add_argument("--frontend", default="auto", choices=("auto", "fx", "blocks"),
                   help="how the model is cut into layers, as fit's frontend=: fx (a torch.fx "
                   "trace), blocks (its blocks found by hooks on one run, wrapped in place; no "
                   "trace) or auto (fx when the model traces, else blocks; the default)")
    p.add_argument("--op-options", action="store_true", help="also generate options from "
                   "each layer's op graph while profiling (as `schedlang trace --op-options`; "
                   "the fx front end)")
    p.add_argument("--graph", default=None, help="layered graph data of the model (.sched), "
                   "instead of profiling; its generated options are rebuilt from their "
                   "`segments`")
    p.add_argument("--plan", default=None, help="a plan (schedlang.plan/1 JSON) for --graph, "
                   "instead of solving")
    p.add_argument("--plan-out", default=None, help="write the plan used here")
    p.add_argument("--graph-out", default=None, help="write the profiled graph data here")
    p.add_argument("--bandwidth", default=None, metavar="RATE", help="the host link, as "
                   "fit's bandwidth=: a rate each way (16GB/s, inf) or auto (measured on CUDA; "
                   "none on the CPU): data may then be offloaded to host memory as well as "
                   "recomputed (default: recomputation only)")
    p.add_argument("--outputs-held", action=argparse.BooleanOptionalAction, default=True,
                   help="the training loop holds the model's output through the backward "
                   "(out = model(x); loss_fn(out).backward(), the default), or, with "
                   "--no-outputs-held, releases it once the loss is computed "
                   "(loss_fn(model(x)).backward()): the plan, its prediction and the steps "
                   "run here are for that loop (fit's outputs_held=)")
    p.add_argument("--no-plain", action="store_true", help="do not also time plain execution")
    p.add_argument("--plot", default=None, metavar="OUT.png", help="draw memory over the last "
                   "training step, predicted and measured per op, with the budget (PNG; needs "
                   "matplotlib)")
    p.add_argument("--trace", default=None, metavar="OUT.json", help="write the last training "
                   "step as a Chrome/Perfetto trace: ops on compute, offload and prefetch "
                   "tracks, memory counters")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr (profiling, "
                   "solves, bisection, probe and training steps)")
