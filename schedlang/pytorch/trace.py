"""Trace a PyTorch module into layered graph data (the H-Rockmate vocabulary) for `use rockmate`.

`trace(model, sample_inputs, layers=None, ...)` = `partition` + `profile` + `to_graph`: a
`schedlang.graphs.graph.Graph` with

* `data` for every tensor the layers exchange: the model's inputs (role `input`), each layer's
  outputs, `loss` (the loss value) and the gradients `<data>.grad`; a model input's gradient
  `inputK.grad` has role `output` when the input requires grad; `<layer>.params.grad` (role
  `output`) holds the gradients of the parameters whose gradient that layer's backward creates
  (the first backward to reach a parameter: the last layer using it);
* `layer NAME (inputs) -> (outputs) { grad (output grads) -> (input grads, params grad);
  option autograd/recompute/selective ...; option fast_forward ... }` from the measured
  times, overheads and phantoms (a layer with nothing to differentiate: `fast_forward` only,
  no `grad`: it has no backward);
* `loss (model outputs) -> (loss, model outputs' grads)` with a tiny time.

Times are in seconds (written with units). Parameters and buffers are fixed memory: not in the
graph data; their bytes are in `TraceInfo.resident_bytes`, on `graph.trace_info`, and in a
comment line of the written file that `read_trace_info` reads back::

    # schedlang.pytorch resident_bytes 171904 param_bytes 171904 buffer_bytes 0 device cpu

The command's arguments are in `schedlang.cli.pytorch_args`, so that the CLI's parser is
built without torch; the CLI imports this module when `schedlang trace` runs.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .. import progress
from ..cli.pytorch_args import add_trace_arguments
from ..graphs.elements import DataNode, Layer, Loss, Option, Step
from ..graphs.graph import Graph
from ..graphs.writer import write_graph
from ..language.errors import DataError, Loc, SchedError
from ..language.files import write_file
from ..language.paths import read_text, writable_file
from ..language.program import resolve_model
from ..language.units import format_size
from ..problem import resolve_budget
from .factory import load_factory
from .frontends.fx.partition import partition
from .frontends.fx.segments import describe
from .loss_node import LOSS_TIME, LOSS_VALUE_BYTES
from .memory import storage_bytes
from .opgraph import record_ops
from .options import add_generated_options
from .profile import OPTIONS, profile
from .segmented import SegmentedLayer

__all__ = ["TraceInfo", "to_graph", "trace", "write_trace", "read_trace_info", "trace_main"]

WHERE = Loc("trace")
_INFO_RE = re.compile(r"#\s*schedlang\.pytorch\s+(.*)$")


@dataclass
class TraceInfo:
    """What the runtime needs besides the graph data: fixed memory and the layers' modules."""

    resident_bytes: int  # parameters + buffers (unique storages)
    param_bytes: int
    buffer_bytes: int
    device: str
    layer_calls: dict[str, list[str]] = field(default_factory=dict)  # layer -> submodules
    input_grads: list[str] = field(default_factory=list)  # model inputs with a gradient
    profiled: object = None  # the ProfiledGraph (None when read back from a file)

    def comment(self) -> str:
        return (f"# schedlang.pytorch resident_bytes {self.resident_bytes} param_bytes "
                f"{self.param_bytes} buffer_bytes {self.buffer_bytes} device {self.device}")


def _graph_name(text: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_]", "_", text).strip("_").lower() or "model"
    return name if not name[0].isdigit() else "m_" + name


def _round_time(t: float) -> float:
    """Seconds to 4 significant digits (measurements are not more precise than that)."""
    return float(f"{float(t):.4g}")


def to_graph(profiled, name: str | None = None, title: str | None = None,
             loss_time: float = LOSS_TIME) -> Graph:
    """The layered `Graph` of a `ProfiledGraph`; `graph.trace_info` holds a `TraceInfo`."""
    part = profiled.part
    g = Graph(name or _graph_name(type(part.root).__name__), title or "", time_unit="s")
    sizes = {d: m.nbytes for d, m in part.data.items()}
    declared: set[str] = set()

    def data(d: str, size: int, role: str = "") -> None:
        if d in declared:
            return
        declared.add(d)
        g.data.append(DataNode(d, int(size), role))

    generated = getattr(part, "op_options", None) or {}  # layer -> option -> callable
    input_grads = set(profiled.input_grads)
    for d in part.inputs:
        data(d, sizes[d], "input")
    returned = set(part.outputs)
    for lp in profiled.layers:
        for d in part.layer(lp.name).outputs:
            # what the forward returns stays alive to the step's end: the caller holds it
            data(d, sizes[d], "output" if d in returned else "")
    loss_outputs = ["loss"]
    # the loss value and the seed gradient backward() makes for it (4 B each): alive
    # through the whole backward, like the outputs the caller holds
    data("loss", LOSS_VALUE_BYTES, "output")
    for d in part.outputs:
        if part.data[d].requires_grad:
            loss_outputs.append(f"{d}.grad")
            data(f"{d}.grad", sizes[d], "output" if d in input_grads else "")
    for lp in reversed(profiled.layers):
        for d in lp.grad_outputs:
            data(f"{d}.grad", sizes[d], "output" if d in input_grads else "")
        if lp.grad_inputs and lp.param_grads:
            data(f"{lp.name}.params.grad", lp.param_grad_bytes, "output")
    for lp in profiled.layers:
        layer = part.layer(lp.name)
        grad_outputs = [f"{d}.grad" for d in lp.grad_outputs]
        if lp.grad_inputs and lp.param_grads:
            grad_outputs.append(f"{lp.name}.params.grad")
        opts = [Option(o.name, _round_time(o.fwd_time), int(o.fwd_overhead),
                       _round_time(o.bwd_time), int(o.bwd_overhead), int(o.phantom), list(o.needs),
                       segments=_segments(generated.get(lp.name, {}).get(o.name)),
                       fwd_steps=[Step(int(m), list(fr), list(cr)) for m, fr, cr in o.fwd_steps],
                       bwd_steps=[Step(int(m), list(fr), list(cr)) for m, fr, cr in o.bwd_steps])
                for o in lp.options]
        ff = lp.fast_forward
        g.layers.append(Layer(lp.name, list(layer.inputs), list(layer.outputs),
                              [f"{d}.grad" for d in lp.grad_inputs], grad_outputs, opts,
                              fast_forward=None if ff is None else Option(
                                  ff.name, _round_time(ff.fwd_time), int(ff.fwd_overhead), 0.0,
                                  0, 0)))
    g.loss = Loss(list(part.outputs), loss_outputs, float(loss_time))
    g.trace_info = TraceInfo(profiled.resident_bytes, profiled.param_bytes, profiled.buffer_bytes,
                             profiled.device, {lay.name: list(lay.calls) for lay in part.layers},
                             list(profiled.input_grads), profiled)
    return g


def _segments(callable_):
    """The `segments` of a generated option's callable (None for another callable)."""

    return describe(callable_) if isinstance(callable_, SegmentedLayer) else None


def trace(model, sample_inputs, layers=None, *, repeats: int = 5, options=None, device=None,
          name: str | None = None, op_options=False) -> Graph:
    """Partition, profile and describe `model` as layered graph data (see the module docstring).

    `op_options`: also generate options from each layer's op graph (`schedlang.pytorch.options`:
    True, or a dict of `add_generated_options` arguments, e.g. ``{"model": "my.sched"}``); each
    is written with the `segments` the runtime rebuilds it from
    (`schedlang.pytorch.frontends.fx.segments`).
    `graph.trace_info` is the `TraceInfo` (resident bytes, the profiled layers)."""
    if importlib.util.find_spec("torch") is None:
        raise SchedError("tracing a PyTorch model needs torch: pip install 'schedlang[torch]'",
                         WHERE)


    with progress.phase("tracing"):
        part = partition(model, sample_inputs, layers)
    profiled = profile(part, repeats=repeats, options=options or OPTIONS, device=device)
    if op_options:

        add_generated_options(profiled, **(op_options if isinstance(op_options, dict) else {}))
    shapes = ", ".join("x".join(str(s) for s in part.data[d].shape) for d in part.inputs)
    return to_graph(profiled, name=name, title=f"{type(model).__name__} ({shapes}) traced on "
                    f"{profiled.device}")


def graph_text(graph: Graph, info: TraceInfo | None = None, model: str = "rockmate") -> str:
    """The `.sched` text of a traced graph: comments, `use MODEL`, the graph data."""

    info = info if info is not None else getattr(graph, "trace_info", None)
    lines = []
    if info is not None:
        lines.append(f"# traced by schedlang.pytorch: {len(graph.layers)} layers; parameters and "
                     "buffers are fixed memory, not in the data below")
        lines.append(info.comment())
        for layer, calls in info.layer_calls.items():
            if calls and calls != [layer]:
                lines.append(f"# layer {layer} runs {', '.join(calls)}")
    if model:
        lines.append(f"use {model}")
    return "\n".join(lines) + ("\n" if lines else "") + write_graph(graph)


def write_trace(graph: Graph, path, info: TraceInfo | None = None, model: str = "rockmate") -> None:
    """Write a traced graph as a `.sched` file that `schedlang solve` solves."""

    write_file(path, graph_text(graph, info, model))  # atomic; OSError -> located DataError


def read_trace_info(path) -> TraceInfo | None:
    """The `TraceInfo` comment of a traced `.sched` file (None when it has none)."""

    text = read_text(path, what="graph file")
    info = None
    calls: dict[str, list[str]] = {}
    for line in text.splitlines():
        m = _INFO_RE.match(line.strip())
        if m:
            words = m.group(1).split()
            fields = dict(zip(words[::2], words[1::2]))
            try:
                info = TraceInfo(int(fields["resident_bytes"]), int(fields.get("param_bytes", 0)),
                                 int(fields.get("buffer_bytes", 0)), fields.get("device", "cpu"))
            except (KeyError, ValueError):
                raise DataError(f"malformed schedlang.pytorch comment: {line.strip()}",
                                Loc(str(path))) from None
        elif line.startswith("# layer ") and " runs " in line:
            layer, _, rest = line[len("# layer "):].partition(" runs ")
            calls[layer.strip()] = [c.strip() for c in rest.split(",")]
    if info is not None:
        info.layer_calls = calls
    return info


# --- the CLI -----------------------------------------------------------------------------------
_DTYPES = {"float32": "float32", "float": "float32", "fp32": "float32", "float16": "float16",
           "half": "float16", "fp16": "float16", "bfloat16": "bfloat16", "bf16": "bfloat16",
           "float64": "float64", "double": "float64", "int64": "int64", "long": "int64",
           "int32": "int32", "int": "int32", "bool": "bool"}


def _make_inputs(shapes: list[str], dtypes: list[str]):
    import torch

    if len(dtypes) > len(shapes):
        raise SchedError("more --input-dtype than --input-shape", Loc("--input-dtype"))
    inputs = []
    for k, text in enumerate(shapes):
        try:
            shape = tuple(int(s) for s in re.split(r"[,x]", text.strip()))
        except ValueError:
            raise SchedError(f"bad --input-shape '{text}': expected sizes like 8,3,32,32",
                             Loc("--input-shape")) from None
        if not shape or any(s <= 0 for s in shape):
            raise SchedError(f"bad --input-shape '{text}': sizes must be positive",
                             Loc("--input-shape"))
        dname = dtypes[k].lower() if k < len(dtypes) else "float32"
        if dname not in _DTYPES:
            raise SchedError(f"unknown --input-dtype '{dname}' ({', '.join(sorted(set(_DTYPES)))})",
                             Loc("--input-dtype"))
        dtype = getattr(torch, _DTYPES[dname])
        if dtype.is_floating_point:
            inputs.append(torch.randn(shape, dtype=dtype))
        else:
            inputs.append(torch.randint(0, 2, shape, dtype=dtype))
    return tuple(inputs)


def trace_main(args) -> int:
    """`schedlang trace`: trace MODULE:FACTORY and write GRAPH.sched; SchedError on bad input."""
    try:
        import torch
        from torch import nn
    except ImportError:
        raise SchedError("`schedlang trace` needs torch: pip install 'schedlang[torch]'",
                         WHERE) from None

    if args.repeats is None or args.repeats < 1:
        raise SchedError(f"--repeats must be at least 1, got {args.repeats}", Loc("--repeats"))
    op_options = getattr(args, "op_options", False)
    op_model = getattr(args, "op_model", None)
    if op_model and not op_options:
        raise SchedError("--op-model needs --op-options (the options it generates)",
                         Loc("--op-model"))
    if op_options and getattr(args, "ops", False):
        raise SchedError("--op-options generates layer options in layered graph data; --ops "
                         "writes the whole model's op graph instead: give one of them",
                         Loc("--op-options"))
    if op_model:  # an unknown model fails here, before any tracing

        resolve_model(op_model, Path.cwd(), Loc("--op-model"))
    options = [o.strip() for o in args.options.split(",") if o.strip()]

    writable_file(args.output, Loc("-o"), "graph data")  # before tracing, not after

    factory = load_factory(args.factory)
    try:
        made = factory()
    except Exception as exc:
        raise SchedError(f"{args.factory}() failed: {type(exc).__name__}: {exc}",
                         Loc(args.factory)) from None
    inputs = None
    if isinstance(made, nn.Module):
        model = made
    elif isinstance(made, (tuple, list)) and made and isinstance(made[0], nn.Module):
        model = made[0]
        if len(made) > 1:
            inputs = made[1]
            if isinstance(inputs, torch.Tensor):
                inputs = (inputs,)
    else:
        raise SchedError(f"{args.factory}() returned {type(made).__name__}; expected an "
                         "nn.Module or (module, inputs[, loss_fn])", Loc(args.factory))
    if args.input_shape:
        inputs = _make_inputs(args.input_shape, args.input_dtype)
    if inputs is None:
        raise SchedError(f"{args.factory}() returned no sample inputs: give --input-shape",
                         Loc(args.factory))
    if args.device:
        try:
            device = torch.device(args.device)
            model = model.to(device)
            inputs = tuple(x.to(device) for x in inputs)
        except (RuntimeError, AssertionError) as exc:
            raise SchedError(f"cannot use device '{args.device}': {exc}", Loc("--device")) from None
    if getattr(args, "ops", False):
        return _trace_ops_main(args, model, tuple(inputs))
    layers = [s.strip() for s in args.layers.split(",") if s.strip()] if args.layers else None
    try:
        graph = trace(model, tuple(inputs), layers, repeats=args.repeats, options=options,
                      name=args.name,
                      op_options=({"model": op_model} if op_model else True) if op_options
                      else False)
    except SchedError:
        raise
    except Exception as exc:  # the user's model failed while being profiled
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise SchedError(f"profiling {type(model).__name__} failed: {type(exc).__name__}: {first}",
                         Loc(args.factory)) from None
    if args.budget:
        graph.budgets["peak"] = resolve_budget(args.budget, graph, Loc("--budget"))
    write_trace(graph, args.output)
    info = graph.trace_info
    print(f"wrote {args.output}: graph {graph.name}, {len(graph.layers)} layers, "
          f"{len(graph.data)} data; fixed memory (parameters, buffers) "
          f"{format_size(info.resident_bytes)}")
    for layer in graph.layers:
        opts = ", ".join(o.name for o in layer.options) or "fast_forward only: no backward"
        print(f"  {layer.name}: {', '.join(layer.inputs)} -> {', '.join(layer.outputs)} [{opts}]")
    print(f"solve it with: schedlang solve {args.output} --budget 70%")
    return 0


def _trace_ops_main(args, model, inputs) -> int:
    """`schedlang trace --ops`: the whole model's op graph, Checkmate view, `use checkmate`."""

    try:
        og = record_ops(model, inputs, repeats=args.repeats)
    except SchedError:
        raise
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise SchedError(f"recording the ops of {type(model).__name__} failed: "
                         f"{type(exc).__name__}: {first}", Loc(args.factory)) from None
    graph = og.checkmate(args.name or _graph_name(type(model).__name__), loss=True,
                         param_grads=True)
    if args.budget:
        graph.budgets["peak"] = resolve_budget(args.budget, graph, Loc("--budget"))
    params = list(model.parameters())
    buffers = list(model.buffers())
    info = TraceInfo(storage_bytes(params + buffers), storage_bytes(params),
                     storage_bytes(buffers), str(inputs[0].device) if inputs else "cpu")
    write_file(args.output, f"# op graph traced by schedlang.pytorch: {og.n_ops} aten ops in "
               f"{len(og.units)} units; parameters, buffers and inputs are fixed memory\n"
               f"{info.comment()}\nuse checkmate\n" + write_graph(graph))
    print(f"wrote {args.output}: graph {graph.name}, {og.n_ops} aten ops in {len(og.units)} "
          f"units, {len(graph.nodes)} nodes, {len(graph.edges)} edges; fixed memory "
          f"{format_size(info.resident_bytes)}")
    print(f"solve it with: schedlang solve {args.output} --budget 70%")
    return 0


def main(argv=None) -> int:  # `python -m schedlang.pytorch.trace ...`, until the CLI has it
    ap = argparse.ArgumentParser(prog="schedlang trace", description="trace a PyTorch module "
                                 "into layered graph data")
    add_trace_arguments(ap)
    args = ap.parse_args(argv)
    try:
        return trace_main(args)
    except SchedError as e:
        print(str(e), file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
