"""One call: a module that trains within a memory budget.

    model = schedlang.pytorch.fit(model, sample_inputs, budget="60%")
    loss_fn(model(*inputs)).backward(); optimizer.step()     # as usual
    model.memory_report()

`fit` cuts the module into layers and profiles them — with a whole-model torch.fx trace
(`schedlang.pytorch.trace`, run by `schedlang.pytorch.runtime`) or, with no trace, from its
blocks found by hooks on one run (`schedlang.pytorch.blocks`, run by the in-place wrappers of
`schedlang.pytorch.hooked`; `frontend=`, see `prepare`) —, solves `models/rockmate.sched` on the
layered graph data at the budget (with the hook front end, a plan with checkpointed groups of
blocks is taken instead where faster: `hooked.group_plans`), and returns a `FitModule` whose
parameters are the original module's and whose forward/backward execute the plan.

The budget is the peak of all tensor memory on the compute device during a training step
(parameters, gradients, activations, temporaries, and the loss computed on the outputs: what
``torch.cuda.max_memory_allocated`` reports), given as a size ("2GiB", bytes) or as a
percentage ("60%") of the peak of plain execution (no recomputation, predicted from the
profile). The loss runs outside the module: with `loss_fn` its memory is measured once (with
the outputs held, as a caller that keeps them through the backward does; the fx runtime itself
keeps no reference to them once returned, `runtime.PlanExecutor.handed_over`); without
it, `fit` reserves `LOSS_RESERVE` times the bytes of the floating-point outputs for it (what a
cross-entropy on logits takes: their log-softmax and one temporary) plus `LOSS_SCALAR_BYTES`
for its scalars, and `memory_report()` says
so. After the first measured step whose peak is over the prediction (or the budget),
the module re-plans once with the excess as a margin (calibration) and logs it. What the plan does not move —
parameters and buffers, and the step's inputs, which the caller keeps alive for the whole
step — is *resident*: the graph's activation budget is the budget minus the resident bytes.
A budget at or above the plain peak gives plain execution (no solve). A budget the solver
cannot meet with the layers' fixed options (autograd, recompute, selective) makes `fit` (fx
front end, `op_options="auto"`, the default) generate more options for each layer from op-level
solves (`schedlang.pytorch.options`: segments recomputed in rounds, whose backward frees
inside the node) and plan once more, and says so in the log and in `memory_report()`; a budget
it still cannot meet raises `FitError` with the smallest feasible budget found by bisection
with the solver (with the generated options, when they were tried), or by a group plan.
"""
from __future__ import annotations

import copy
import dataclasses
import logging
import time
import weakref
import warnings
from dataclasses import dataclass, field

import torch
from torch import nn

from ..errors import SchedError
from ..graph import Graph
from ..plan import Plan
from ..planners.no_recompute import no_recompute_plan
from .. import progress
from ..progress import reporting
from ..simulate import simulate
from ..units import format_size
from .guards import check_call, guarded_fit
from .lifetimes import earliest_deletes
from .outputs import loss_moment, measure_loss_overhead, released_bytes, uncounted_outputs

__all__ = ["fit", "FitModule", "FitError", "MemoryReport", "resolve_fit_budget", "prepare",
           "LOSS_RESERVE"]

log = logging.getLogger("schedlang.pytorch")

#: without a `loss_fn`, the memory reserved for the loss, in bytes of the model's floating-point
#: outputs (beyond the outputs' gradients): cross-entropy on logits holds their log-softmax and,
#: in its backward, one more temporary of their size
LOSS_RESERVE = 2
#: ... plus this much for the loss's scalars (the value, its gradient, a reduction's partial
#: sums): BERT's masked-LM loss at 100% measured 4 B over a reserve without it
LOSS_SCALAR_BYTES = 1024


class FitError(SchedError):
    """The budget cannot be met (exit code 3, like an infeasible solve)."""

    exit_code = 3


@dataclass
class MemoryReport:
    budget_bytes: int | None
    predicted_peak_bytes: int
    measured_peak_bytes: int | None
    plain_peak_bytes: int  # predicted peak without recomputation
    resident_bytes: int
    plan_time_overhead: float  # predicted plan time / predicted plain time - 1
    plain: bool  # plain execution (no plan)
    measured_step_s: float | None = None
    solve_s: float | None = None
    extra: dict = field(default_factory=dict)
    loss_bytes: int = 0  # memory of the loss beyond the outputs' gradients (in the prediction)
    loss_assumed: bool = False  # no loss_fn: `loss_bytes` is a reserve, not a measurement
    calibrated: dict | None = None  # the re-plan after a measured step over the prediction

    def to_json(self) -> dict:
        return {k: v for k, v in self.__dict__.items()}

    def __str__(self) -> str:
        lines = [f"budget          {_fmt(self.budget_bytes)}",
                 f"predicted peak  {_fmt(self.predicted_peak_bytes)}"
                 f"  (plain execution: {_fmt(self.plain_peak_bytes)}, resident "
                 f"{_fmt(self.resident_bytes)})",
                 f"measured peak   {_fmt(self.measured_peak_bytes)}",
                 f"time overhead   {100 * self.plan_time_overhead:+.1f}% (predicted)"
                 + ("  plain execution" if self.plain else "")]
        if self.loss_assumed:
            lines.append(f"loss            {_fmt(self.loss_bytes)} reserved (no loss_fn given: "
                         f"{LOSS_RESERVE} x the outputs, as a cross-entropy takes, "
                         f"+ {_fmt(LOSS_SCALAR_BYTES)})")
        elif self.loss_bytes:
            lines.append(f"loss            {_fmt(self.loss_bytes)} (measured on loss_fn)")
        fe = self.extra.get("frontend")
        if fe == "blocks":
            probes = self.extra.get("probes") or []
            lines.append("front end       blocks (hooks; the model's own forward runs, its blocks "
                         "wrapped in place)" + (f"; probe step measured "
                                                f"{_fmt(probes[-1]['measured'])}" if probes else ""))
        elif fe == "fx":
            lines.append("front end       fx (torch.fx layers, run by the plan executor)")
        gen = self.extra.get("generated")
        if gen:
            lines.append(f"layer options   {gen['options']} generated from op-level solves in "
                         f"{gen['seconds']:.1f} s ({gen['why']})")
        link = self.extra.get("host_link")
        if link:
            lines.append("host link       " + _link_line(link))
        if self.extra.get("outputs_held") is False:
            lines.append("outputs         released once the loss is computed (the plan is for "
                         "loss_fn(model(x)).backward())")
        if self.extra.get("fallback"):
            lines.append(f"fallback        plain PyTorch: {self.extra['fallback']}")
        if self.calibrated:
            c = self.calibrated
            lines.append(f"calibrated      step measured {_fmt(c['measured'])} over the "
                         f"prediction {_fmt(c['predicted'])}: re-planned with a margin of "
                         f"{_fmt(c['margin'])}" + ("" if c["replanned"] else " (no plan fits)"))
        return "\n".join(lines)


def _link_line(link: dict) -> str:
    """The host link's line of `MemoryReport.__str__`."""
    if "offload" not in link:
        return link.get("note", "none")
    rates = (f"{link['offload'] / 1e9:.3g} GB/s out, {link['prefetch'] / 1e9:.3g} GB/s back"
             + (" (measured)" if link.get("measured") else ""))
    if "kept" not in link:
        return rates
    times = [f"{k} {link[t]:.4g} s" for k, t in (("recompute only", "recompute_only_time"),
                                                   ("with it", "with_link_time"))
             if link.get(t) is not None]
    return f"{rates}; kept the plan {link['kept']} (predicted {', '.join(times)})"


def _fmt(n) -> str:
    return "-" if n is None else f"{format_size(n)} ({n} B)"


# --- preparation: partition, trace, resident bytes ----------------------------------------------
@dataclass
class Prepared:
    partitioned: object
    graph: Graph  # the layered graph data as solved (resident data at 0 bytes)
    resident_bytes: int
    plain_peak: int  # whole step, resident included
    plain_time: float
    info: object = None
    loss_overhead: int = 0  # the loss function's memory beyond the outputs' gradients
    output_bytes: int = 0  # the model's outputs
    loss_assumed: bool = False  # no loss_fn: loss_overhead is the LOSS_RESERVE default
    frontend: str = "fx"  # how the layers were found: "fx" (torch.fx) or "blocks" (hooks)
    note: str = ""  # why `auto` chose the front end it did
    fsdp: dict | None = None  # a fully_shard-ed model: what FSDP2 adds (distributed.py)
    # generated layer options (`with_generated_options`): {"options": count, "seconds": time,
    # "why": text}; None: the fixed options only
    generated: dict | None = None
    # plain execution's peak measured in one eager step (`plain_measured_peak`); None: not yet
    plain_measured: int | None = None
    # [(graph, plan)] the plans `fit` took with this preparation (`_as_before`)
    solved: list = field(default_factory=list)
    # the hook front end's group plans, (what they were priced for, graph, [(activation bytes
    # needed, plan)]): `_group_plans_priced`
    grouped: tuple | None = None
    # fx: the plan executor's constants (`runtime.constant_bytes`), in `resident_bytes`; plain
    # execution runs no executor
    executor_bytes: int = 0

    # the caller's loop holds the model's outputs through the backward (`outputs.py`)
    outputs_held: bool = True
    # fit(bandwidth=...): the host link planned with and which plan was kept (`_solve_linked`)
    host_link: dict | None = None


def loss_tensor_bytes(model: nn.Module, args: tuple, kwargs: dict, loss_fn, known) -> int:
    """Bytes of the tensors `loss_fn` reads of its own on the model's device (targets, class
    weights: alive through every step, memory the device holds as it holds the inputs), not
    counting the model's outputs nor the `known` storages (parameters, buffers, inputs)."""
    from .blocks import preserved
    from .live import read_before

    dev = next((p.device for p in model.parameters()), torch.device("cpu"))
    with preserved(model), torch.no_grad():
        out = model(*args, **kwargs)
        outs = {t.untyped_storage().data_ptr() for t in _flat(out) if isinstance(t, torch.Tensor)}
        _, read = read_before(lambda: loss_fn(out), dev)
    return sum(s.nbytes() for key, s in read.items() if key not in known and key not in outs)


FRONTENDS = ("auto", "fx", "blocks")


def split_inputs(sample_inputs, sample_kwargs=None) -> tuple[tuple, dict]:
    """(positional, keyword) sample inputs: a tensor, a tuple of positional inputs, or a dict
    of keyword inputs (``fit(model, {"input_ids": ids, "attention_mask": mask})``)."""
    if isinstance(sample_inputs, torch.Tensor):
        return (sample_inputs,), dict(sample_kwargs or {})
    if isinstance(sample_inputs, dict):
        return (), {**sample_inputs, **(sample_kwargs or {})}
    return tuple(sample_inputs), dict(sample_kwargs or {})


def prepare(model: nn.Module, sample_inputs, layers=None, graph: Graph | None = None,
            loss_fn=None, frontend: str = "auto", sample_kwargs: dict | None = None,
            outputs_held: bool = True, block_options=False, **trace_kwargs) -> Prepared:
    """Partition and profile `model` (or take `graph`, e.g. read from a .sched file).

    `frontend`: ``"fx"`` cuts the model into layers with a whole-model `torch.fx` trace
    (`schedlang.pytorch.partition`; finer layers: the glue joins them, and the runtime replays
    any rockmate plan); ``"blocks"`` finds its blocks from the module tree and one run with
    hooks (`schedlang.pytorch.blocks`; no trace: the model's own forward runs, the blocks are
    wrapped in place); ``"auto"`` (the default) uses fx when the model traces and its inputs are
    positional tensors, else blocks.

    `outputs_held`: the plan is for a loop that holds the model's outputs through the backward
    (``out = model(x); loss_fn(out).backward()``); False: one that releases them once the
    loss is computed (``loss_fn(model(x)).backward()``; `schedlang.pytorch.outputs`).
    `block_options` (the hook front end; True or a dict of arguments): generated block
    options, segments and selective-checkpoint policies (`schedlang.pytorch.block_ops`)."""
    args, kwargs = split_inputs(sample_inputs, sample_kwargs)
    if frontend not in FRONTENDS:
        raise SchedError(f"frontend must be one of {', '.join(FRONTENDS)}, got {frontend!r}")
    note = ""
    if frontend == "auto":
        if graph is not None:
            frontend = "fx"
        elif kwargs or not all(isinstance(a, torch.Tensor) for a in args):
            frontend, note = "blocks", "keyword or non-tensor inputs: torch.fx is not tried"
        else:
            from .partition import partition

            try:
                partition(model, args, layers)
                frontend = "fx"
            except SchedError as exc:
                frontend, note = "blocks", f"torch.fx: {exc}"
                log.info("schedlang fit: %s; using the hook front end (blocks)", note)
    if frontend == "blocks":
        from .blocks import own_checkpointing
        from .hooked import BlockWrappers, trace_blocks

        with BlockWrappers.plain(model):  # a model an earlier fit wrapped: profiled plain
            tr = trace_blocks(model, args, kwargs, layers, op_options=block_options,
                              **trace_kwargs)
        graph, part = tr.graph, tr
        if own_checkpointing(model):
            log.warning("schedlang fit: the model's own gradient checkpointing is on; it is "
                        "off while the model is fitted (the plan decides what is recomputed; "
                        "unwrap() turns it back on)")
        if tr.found.cache_dropped:
            log.warning("schedlang fit: %d block(s) (%s ...) were called with a key/value "
                        "cache; in training they run without it, as transformers' gradient "
                        "checkpointing does, and the model's output carries an empty cache "
                        "(set config.use_cache=False to silence this)",
                        len(tr.found.cache_dropped), tr.found.cache_dropped[0])
    else:
        if kwargs:
            raise SchedError("frontend 'fx' takes positional tensor inputs only; use "
                             "frontend='blocks' for keyword inputs")
        part = None
        if graph is None:
            from .trace import trace

            graph = trace(model, args, layers=layers, **trace_kwargs)
            info = getattr(graph, "trace_info", None)
            part = getattr(getattr(info, "profiled", None), "part", None)
        else:  # traced from this very model: its partitioned module (with the callables of
            # any generated options) serves
            traced = getattr(getattr(getattr(graph, "trace_info", None), "profiled", None),
                             "part", None)
            if traced is not None and getattr(traced, "root", None) is model:
                part = traced
        if part is None:
            from .partition import partition

            part = partition(model, args, layers)
    if frontend == "fx":  # generated options of graph data from a file: their callables
        from .segments import register

        register(part, graph)
    info = getattr(graph, "trace_info", None)
    # a copy whose data sizes may change (not a deep copy: the trace info holds the model)
    graph = copy.copy(graph)
    graph.data = [copy.copy(d) for d in graph.data]
    graph.layers = [_consistent_times(lay) for lay in graph.layers]
    graph.layers = _with_accumulation(graph)
    params = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
              for t in list(model.parameters()) + list(model.buffers())}
    resident = sum(params.values())
    # the inputs stay alive through the step (the caller holds them): resident, whatever the
    # plan deletes; their data count 0 bytes in the graph the plan is solved on
    names = set(part.inputs)
    resident += sum(part.data[d].nbytes for d in part.inputs if d in part.data)
    executor_bytes = 0
    if frontend == "fx":  # the plan executor's scalars, alive through every step
        from .runtime import constant_bytes

        executor_bytes = constant_bytes(model)
        resident += executor_bytes
    for d in graph.data:
        if d.name in names:
            d.size = 0
    graph.budgets = {}
    if not outputs_held:  # the plan may delete them after the loss, as the loop frees them
        from .outputs import released_graph

        graph = released_graph(graph)
    loss_overhead = out_bytes = 0
    if loss_fn is not None:
        loss_overhead, out_bytes = measure_loss_overhead(model, args, loss_fn, kwargs,
                                                         outputs_held)
        # the loss's own tensors (targets) stay alive through every step, as the inputs do
        inputs = [t for t in _flat((args, kwargs)) if isinstance(t, torch.Tensor)]
        known = set(params) | {t.untyped_storage().data_ptr() for t in inputs}
        resident += loss_tensor_bytes(model, args, kwargs, loss_fn, known)
    else:  # the loss outside the module still takes memory: reserve a safe default
        out_bytes = sum(part.data[d].nbytes for d in part.outputs
                        if d in part.data and part.data[d].dtype.is_floating_point)
        loss_overhead = LOSS_RESERVE * out_bytes + LOSS_SCALAR_BYTES
    base = no_recompute_plan(graph)
    sim = simulate(base, graph)
    peak = max(sim.peak_bytes, loss_moment(base, graph) + loss_overhead)
    return Prepared(part, graph, resident, peak + resident, sim.time, info, loss_overhead,
                    out_bytes, loss_fn is None, frontend, note, executor_bytes=executor_bytes,
                    outputs_held=outputs_held)


def _with_accumulation(graph: Graph) -> list:
    """The layers, each backward overhead raised by the gradients it may add into an existing
    one. A datum read by several layers (a skip connection) gets its gradient from each of
    their backwards; the profile measured each backward creating the gradient, while at run
    time all but the first (backwards run in reverse layer order) compute a new contribution
    next to the gradient already there and then add it in place: a transient the size of the gradient that the graph data, where a
    second contribution to a live datum costs nothing, would not see."""
    sizes = {d.name: d.size for d in graph.data}
    first: dict[str, str] = {}  # gradient -> the layer whose backward makes it first
    for lay in graph.layers:  # backwards run in reverse layer order: the last maker is first
        for g in lay.grad_outputs:
            first[g] = lay.name
    out = []
    for lay in graph.layers:
        extra = sum(sizes.get(g, 0) for g in lay.grad_outputs
                    if first[g] != lay.name and not g.endswith(".params.grad"))
        if extra:
            lay = copy.copy(lay)
            lay.options = [dataclasses.replace(
                o, bwd_overhead=o.bwd_overhead + extra,
                bwd_steps=[dataclasses.replace(st, overhead=st.overhead + extra)
                           for st in o.bwd_steps]) for o in lay.options]
        out.append(lay)
    return out


def _consistent_times(layer):
    """A copy of `layer` whose option times obey what the options run: a ``recompute``
    backward runs the forward again and then the backward, so it takes at least its own
    forward plus ``autograd``'s backward; a ``selective`` backward at least ``autograd``'s.
    Profiles of small layers on a loaded CPU break these bounds (timer noise), and the solver
    then prefers recomputation because the noise made it look cheaper."""
    auto = next((o for o in layer.options if o.name == "autograd"), None)
    if auto is None:
        return layer
    fixed = []
    for o in layer.options:
        low = None
        if o.name == "recompute":
            low = o.fwd_time + auto.bwd_time
        elif o.name == "selective":
            low = auto.bwd_time
        if low is not None and o.bwd_time < low:
            o = copy.copy(o)
            o.bwd_time = low
        fixed.append(o)
    layer = copy.copy(layer)
    layer.options = fixed
    return layer


def resolve_fit_budget(budget, plain_peak: int) -> int:
    """Bytes from a size ('2GiB', 3e9, 1000000) or a percentage ('60%') of `plain_peak`
    (`schedlang.budgets`: one parser and one rounding rule for every budget)."""
    from .. import budgets
    from ..errors import Loc

    return budgets.parse(budget, plain_peak, Loc("budget"), "the plain execution peak")


# --- solving --------------------------------------------------------------------------------------
# the second solve of `solve_plan`: the least peak among the fastest plans, a .sched extension
# of the shipped formulations (models/extensions/least_peak.sched)
LEAST_PEAK = "least_peak"
#: the extension that keeps the model's outputs from their forward to the step's end (the
#: caller holds them: models/extensions/held_outputs.sched)
HELD_OUTPUTS = "held_outputs"


def solve_plan(graph: Graph, activation_budget: int, solver: str = "highs",
               time_limit: float | None = None, backend: str = "pyomo",
               loss_overhead: int = 0, output_bytes: int = 0,
               extensions: tuple = (), least_peak: bool = True,
               outputs_held: bool = True, warm_start: Plan | None = None,
               must_beat: float | None = None) -> Plan | None:
    """The rockmate plan of `graph` within `activation_budget` bytes, or None if none found.

    The model's outputs stay in memory from their forward to the step's end, as the caller
    holds them (models/extensions/held_outputs.sched; `outputs_held` False: not, for a loop
    that releases them, on a graph from `outputs.released_graph`); `extensions`: more.
    `loss_overhead`: memory the loss function adds at the loss (the graph's loss node has
    none); the save budget (memory during the loss phase) keeps room for it, and for the part
    of the model's outputs (`output_bytes`) that the graph's data read by the loss do not
    count (those are in the loss phase's memory already: counting them again refused plans
    that fit, e.g. checkpoint_sequential's own schedule at its measured peak). Released
    outputs (`outputs_held` False) are deleted after the loss, where the save budget samples
    the loss phase's memory, while the loss function's overhead is measured with them
    present: the save budget leaves room for them too. `warm_start`: a plan to start the
    solver from (`Problem.solve`; one the model cannot express is ignored). `must_beat`:
    a plan not faster than this many seconds (by more than the solver's relative gap) is not
    wanted: None, without the second (least-peak) solve. A plan whose prediction (the loss
    phase's included) is over `activation_budget` is not returned."""
    import schedlang
    from ..resources import extension_path
    from ..solution import Status
    from ..solvers import requested_gap

    g = copy.copy(graph)
    g.budgets = {"peak": int(activation_budget)}
    # with a host link, recompute or offload (models/offload.sched); else recompute only
    model = "offload" if g.bandwidths.get("offload") and g.bandwidths.get("prefetch") else "rockmate"
    if loss_overhead:
        save = int(activation_budget) - loss_overhead - uncounted_outputs(graph, output_bytes)
        if not outputs_held:
            save -= released_bytes(graph)
        if save <= 0:
            return None
        g.budgets["save"] = save
    held = (HELD_OUTPUTS,) if outputs_held else ()
    exts = [str(extension_path(e)) for e in (*held, *extensions)]
    prob = schedlang.load(model=[model, *exts], graph=g)
    res = prob.solve(backend=backend, solver=solver, time_limit=time_limit,
                     warm_start=warm_start)
    if res.plan is None or res.status not in (Status.OPTIMAL, Status.FEASIBLE):
        return None
    if must_beat is not None and \
            res.objective >= must_beat * (1 - requested_gap(solver, None)):
        return None
    # Among plans as fast as this one, the one with the smallest peak: equally fast plans
    # differ in memory, and this choice makes the peak fall as the budget falls.
    fastest = res.objective * (1 + 1e-7) + 1e-12
    second = None if not least_peak else schedlang.load(
        model=[model, *exts, extension_path(LEAST_PEAK)], graph=g,
                            params={"fastest_time": fastest})
    least = None if second is None else \
        second.solve(backend=backend, solver=solver, time_limit=time_limit)
    if least is not None and least.plan is not None \
            and least.status in (Status.OPTIMAL, Status.FEASIBLE):
        res = least
    sim = simulate(res.plan, graph, budget=int(activation_budget))
    if not sim.valid:
        return None
    res.plan.predicted_peak = max(sim.peak_bytes, loss_moment(res.plan, graph) + loss_overhead)
    if res.plan.predicted_peak > activation_budget:
        return None
    res.plan.predicted_time = sim.time
    res.plan.meta.setdefault("planner", model)
    res.plan.meta["status"] = res.status.value
    res.plan.meta["model_size"] = res.model_size
    return res.plan


def smallest_feasible(graph: Graph, low: int, high: int, solver: str, time_limit,
                      backend: str = "pyomo", rel: float = 0.03, max_solves: int = 8,
                      **kw) -> int | None:
    """Bisection with the solver between an infeasible `low` and `high` (activation bytes):
    the smallest budget found feasible (within `rel`, at most `max_solves` solves), or None
    if `high` is not. The budget, not the plan's peak: a plan also needs the save budget that
    its budget implies (the loss phase), so a budget of its peak may admit no plan."""
    from ..bisection import smallest_feasible as bisect

    return bisect(  # feasibility only after the first: no least-peak solve
        lambda b: solve_plan(graph, b, solver, time_limit, backend, least_peak=False,
                             **kw) is not None,
        low, high, rel=rel, max_steps=max_solves,
        first=lambda b: solve_plan(graph, b, solver, time_limit, backend, **kw) is not None)


# --- the module ----------------------------------------------------------------------------------
class FitModule(nn.Module):
    """`module` trained by a plan. Same call signature; the parameters are `module`'s."""

    def __init__(self, module: nn.Module, prepared: Prepared, plan: Plan | None,
                 budget: int | None, measure: bool = True, solve_s: float | None = None,
                 calibrate: bool = False, solve_args: dict | None = None):
        super().__init__()
        self.module = module
        self._prep = prepared
        self._plan = plan
        self._budget = budget
        self.measure = measure
        self._solve_s = solve_s
        self._executor = None
        self._runner: list = []  # the PlanModule (in a list: not a submodule of this one)
        self._measured: int | None = None
        self._step_s: float | None = None
        self._tracker = None
        self._t0 = 0.0
        # calibration: once, after the first measured step over the prediction
        self._calibrate = calibrate and measure and budget is not None
        self._solve_args = dict(solve_args or {})
        self._margin = 0  # bytes the measured step exceeded the prediction by (re-plans)
        self._pending: tuple[int, int] | None = None  # (measured, predicted) to re-plan with
        self._calibrated: dict | None = None
        self._recorder = None  # a `timeline.Recorder` while `record_timeline()` is on
        self._wrappers = None
        self._probes: list[dict] = []  # the probe steps `fit` ran (hook front end)
        self._fallback: str | None = None
        if prepared.frontend == "blocks":
            from .hooked import BlockWrappers

            self._wrappers = BlockWrappers(prepared.partitioned.found)
        self._set_plan(plan)

    def _set_plan(self, plan: Plan | None) -> None:
        self._plan = plan
        self._executor = None
        self._runner = []
        if self._wrappers is not None:
            from .hooked import plan_choices

            blocks = [b.name for b in self._prep.partitioned.found.blocks]
            self._wrappers.set(None if plan is None
                               else plan_choices(plan, self._prep.graph, blocks))
        elif plan is not None:
            from .runtime import PlanExecutor

            self._executor = PlanExecutor(self._prep.partitioned, plan, self._prep.graph)
            # a backward that raises (GraphChanged, a PlanError) ends the measured step: its
            # tracker must not stay on the dispatch stack counting later ops (a weak method:
            # a cycle would keep the module and its model alive after `del` until a collection)
            closing = weakref.WeakMethod(self._close_tracker)
            self._executor.on_error = lambda: (closing() or _nothing)()
            self._runner = [self._executor.module()]

    @property
    def plan(self) -> Plan | None:
        return self._plan

    @property
    def graph(self) -> Graph:
        return self._prep.graph

    @property
    def plain(self) -> bool:
        return self._plan is None

    def predicted_peak(self) -> int:
        if self._plan is None:  # measured where fit measured it (`plain_measured_peak`)
            return (self._prep.plain_measured or
                    self._prep.plain_peak - self._prep.executor_bytes) + self._margin
        return int(self._plan.predicted_peak) + self._prep.resident_bytes + self._margin

    def memory_report(self) -> MemoryReport:
        plain_time = self._prep.plain_time
        plan_time = plain_time if self._plan is None else float(self._plan.predicted_time or 0)
        overhead = plan_time / plain_time - 1 if plain_time > 0 else 0.0
        return MemoryReport(self._budget, self.predicted_peak(), self._measured,
                            self._prep.plain_peak, self._prep.resident_bytes, overhead,
                            self._plan is None, self._step_s, self._solve_s,
                            loss_bytes=self._prep.loss_overhead,
                            loss_assumed=self._prep.loss_assumed,
                            calibrated=None if self._calibrated is None
                            else dict(self._calibrated),
                            extra={"frontend": self._prep.frontend,
                                   "probes": [dict(p) for p in self._probes],
                                   **({"generated": dict(self._prep.generated)}
                                      if self._prep.generated else {}),
                                   **({"fallback": self._fallback} if self._fallback else {}),
                                   **({"host_link": dict(self._prep.host_link)}
                                      if self._prep.host_link else {}),
                                   "outputs_held": self._prep.outputs_held})

    def record_timeline(self, on: bool = True) -> None:
        """Record memory and time per op of each measured training step (`timeline()`;
        `schedlang.pytorch.timeline`)."""
        if not on:
            self._recorder = None
        elif self._recorder is None:
            from .timeline import Recorder

            self._recorder = Recorder()

    def timeline(self):
        """The latest recorded step as a `schedlang.pytorch.timeline.Timeline` (predicted
        and measured memory per op, op times; `.plot(path)`, `.write_trace(path)`), or None
        before a step was recorded (see `record_timeline`)."""
        return None if self._recorder is None else self._recorder.last

    # --- calibration ---------------------------------------------------------------------------
    #: a measured step this far over the prediction (bytes, or this fraction of it) re-plans
    CALIBRATION_SLACK = (4096, 0.002)

    def _check_calibration(self) -> None:
        if not self._calibrate or self._calibrated is not None or self._measured is None:
            return
        predicted = self.predicted_peak()
        slack = max(self.CALIBRATION_SLACK[0], int(self.CALIBRATION_SLACK[1] * predicted))
        over = self._measured > predicted + slack or self._measured > self._budget
        if over:
            self._pending = (self._measured, predicted)

    def _recalibrate(self) -> None:
        """Re-plan once: the step measured more than predicted; the excess becomes a margin
        the plan leaves free (the graph's activation budget shrinks by it)."""
        measured, predicted = self._pending
        self._pending = None
        margin = self._margin + measured - predicted
        activation = self._budget - self._prep.resident_bytes - margin
        found = None
        t0 = time.perf_counter()
        if activation > 0:
            args = self._solve_args
            found = _solve(self._prep, activation, args.get("solver", "highs"),
                           args.get("time_limit"), args.get("backend", "pyomo"),
                           solve_extra(self._prep), groups=False)
        self._calibrated = {"measured": measured, "predicted": predicted, "margin": margin,
                            "replanned": found is not None,
                            "solve_s": time.perf_counter() - t0}
        if found is None:
            msg = (f"schedlang fit: a training step measured {format_size(measured)}, over its "
                   f"prediction {format_size(predicted)}; no plan fits the budget "
                   f"{format_size(self._budget)} with that margin: the plan stays")
            log.warning(msg)
            warnings.warn(msg, RuntimeWarning, stacklevel=3)
            return
        log.info("schedlang fit: a training step measured %s, over its prediction %s: "
                 "re-planned with a margin of %s (new prediction %s, budget %s)",
                 format_size(measured), format_size(predicted), format_size(margin),
                 format_size(int(found.predicted_peak) + self._prep.resident_bytes + margin),
                 format_size(self._budget))
        self._margin = margin
        self._set_plan(found)

    # measuring one training step: forward to the end of the backward
    def _open_tracker(self, tensors) -> None:
        from .memory import MemoryTracker

        self._close_tracker(complete=False)  # a previous forward that had no backward
        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        watch = []
        if self._prep.fsdp is not None:
            from .distributed import fsdp_storages

            watch = fsdp_storages(self.module)
        self._tracker = MemoryTracker(resident=[self.module, *tensors, *grads], watch=watch)
        self._tracker.__enter__()
        if self._recorder is not None:
            self._recorder.begin(self, self._tracker)
        self._t0 = time.perf_counter()

    def _close_tracker(self, complete: bool = True) -> None:
        """End the measured step; `complete=False`: it had no backward, so its reading is not
        a step's peak and is dropped."""
        tr = self._tracker
        if tr is None:
            return
        self._tracker = None
        if self._recorder is not None:
            self._recorder.end(self, tr)
        try:
            tr.__exit__(None, None, None)
        except Exception:  # a mode entered on another thread: keep the reading only
            pass
        if not complete:
            return
        self._measured = tr.peak
        self._step_s = time.perf_counter() - self._t0
        self._check_calibration()

    @property
    def frontend(self) -> str:
        """``"fx"`` (the plan runs on the fx-partitioned module) or ``"blocks"`` (the model's
        own forward runs; its blocks are wrapped in place)."""
        return self._prep.frontend

    def unwrap(self) -> nn.Module:
        """The model with its blocks' wrappers removed (hook front end): plain PyTorch again."""
        if self._wrappers is not None:
            self._wrappers.unwrap()
            self._wrappers = None
        return self.module

    def forward(self, *args, **kwargs):
        from .memory import drop_closed_modes

        drop_closed_modes()  # the previous measured step's tracker (closed in the backward)
        if self._prep.fsdp is None and self._prep.frontend != "none":
            from .distributed import check_not_sharded_after

            check_not_sharded_after(self.module)
        check_call(self, args, kwargs)  # dtype/device as fitted; a new shape: its own plan
        tensors = [a for a in _flat((args, kwargs)) if isinstance(a, torch.Tensor)]
        training = torch.is_grad_enabled()
        if training and self._pending is not None:
            self._recalibrate()
        if not (self.measure and training):
            return self._call(*args, **kwargs)
        self._open_tracker(tensors)
        try:
            out = self._call(*args, **kwargs)
        except BaseException:
            self._close_tracker()
            raise
        # close the tracker when the backward of this step ends
        leaves = [o for o in _flat(out) if isinstance(o, torch.Tensor) and o.requires_grad]
        if not leaves:
            self._close_tracker()
            return out
        _StepEnd.attach(self, leaves)
        return out

    def _call(self, *args, **kwargs):
        if self._wrappers is not None:
            self._wrappers.ensure()  # another fit of this model may have set its own plan
            return self.module(*args, **kwargs)
        if self._executor is None:
            return self.module(*args, **kwargs)
        return self._runner[0](*args, **kwargs)


def _nothing() -> None:
    pass


def _flat(out) -> list:
    from torch.utils._pytree import tree_flatten

    return tree_flatten(out)[0]


class _StepEnd:
    """Closes a FitModule's tracker once the backward has run through the whole model: a hook
    on the gradient of the graph's first node (the dummy of the plan's Function, or the
    model's first parameter)."""

    @staticmethod
    def attach(fm: FitModule, outputs: list) -> None:
        # the end of the backward: autograd calls a callback queued on the engine at the
        # first gradient computed for one of the outputs
        guard = _StepGuard(fm)

        def on_grad(grad):
            guard.backward_started = True
            torch.autograd.Variable._execution_engine.queue_callback(fm._close_tracker)
            return grad

        hooked = False
        for o in outputs:
            if o.grad_fn is not None:
                o.register_hook(on_grad)
                hooked = True
                break
        if not hooked:
            fm._close_tracker()


class _StepGuard:
    """Lives as long as the step's autograd graph (its hook's closure holds it): a step whose
    graph is freed without a backward (a forward with gradients on whose output is dropped)
    closes its tracker then, rather than leaving a counting mode on the thread's stack."""

    def __init__(self, fm: FitModule):
        self.fm = weakref.ref(fm)
        self.tracker = fm._tracker
        self.backward_started = False

    def __del__(self):
        fm = self.fm()
        if fm is not None and not self.backward_started and fm._tracker is self.tracker:
            fm._close_tracker(complete=False)


# --- the one call ---------------------------------------------------------------------------------
def _extensions(prep: Prepared) -> tuple:
    """The .sched extensions the front end's runtime needs (beyond `solve_plan`'s held
    outputs): per-block wrappers run only the plans of models/extensions/per_block.sched."""
    from .hooked import PER_BLOCK

    return (PER_BLOCK,) if prep.frontend == "blocks" else ()


def solve_extra(prep: Prepared) -> dict:
    """`solve_plan`'s keyword arguments for plans of `prep`: the loss's memory, the outputs
    (held or not) and the front end's extensions."""
    return {"loss_overhead": prep.loss_overhead, "output_bytes": prep.output_bytes,
            "extensions": _extensions(prep), "outputs_held": prep.outputs_held}


def _fallback(model: nn.Module, exc: Exception, measure: bool) -> FitModule:
    why = str(exc) if isinstance(exc, SchedError) else f"{type(exc).__name__}: {exc}"
    msg = f"schedlang fit: the model cannot be planned ({why}); fallback=True: plain PyTorch"
    log.warning(msg)
    warnings.warn(msg, RuntimeWarning, stacklevel=3)
    prep = Prepared(None, Graph("fallback"), 0, 0, 0.0, frontend="none", note=str(exc))
    fm = FitModule(model, prep, None, None, measure)
    fm._fallback = str(exc)
    return fm


@reporting("fit")
@guarded_fit
def fit(model: nn.Module, sample_inputs, budget="100%", *, solver: str = "highs",
        time_limit: float | None = 60.0, layers=None, backend: str = "pyomo",
        graph: Graph | None = None, plan: Plan | None = None, measure: bool = True,
        loss_fn=None, prepared: Prepared | None = None, bandwidth=None,
        calibrate: bool = True, frontend: str = "auto", fallback: bool = False,
        probe: bool | None = None, sample_kwargs: dict | None = None, fsdp=False,
        op_options="auto", outputs_held: bool | None = None, **trace_kwargs) -> FitModule:
    """`model` wrapped to train within `budget` (see the module docstring).

    `sample_inputs`: a tensor, a tuple of positional inputs, or a dict of keyword inputs
    (``{"input_ids": ids, "attention_mask": mask}``); `sample_kwargs` adds keyword inputs to
    positional ones. `loss_fn(outputs) -> scalar`: the loss the training step applies to the
    model's outputs (a `ModelOutput` for `transformers` models). Optional; given, its memory
    (measured once on a sample output) is part of the prediction and of the plan's constraints
    (the save budget of the loss phase); without it `LOSS_RESERVE` times the outputs' bytes and
    `LOSS_SCALAR_BYTES` are reserved. `prepared`: the result of `prepare(...)` for this model (to fit at several
    budgets with one profile).

    `frontend`: how the model is cut into layers (`prepare`): ``"auto"`` (default: torch.fx
    when the model traces and takes positional tensors, else the hook front end),
    ``"fx"``, or ``"blocks"`` (no trace: the model's blocks are wrapped in place and its own
    forward runs; each block keeps, recomputes or keeps selectively, or consecutive blocks
    run as one checkpointed group, as `checkpoint_sequential` runs a segment). `fit` then
    runs one probe step on the samples (`probe`: default with the hook front end and with
    plans that run generated options, ``probe=True`` for every fx plan; gradients, buffers
    and RNG state restored afterwards) and, if it measures over the budget, plans again with
    the excess over the prediction as a margin until the measured peak is
    within the budget (a step measured above the prediction but within the budget raises the
    prediction to it). `fallback`: when the model cannot
    be planned (no blocks found, a block that fails under a wrapper, a failed trace), return
    the model run as plain PyTorch with a warning instead of raising; never silently.

    `graph` (layered graph data of this model, as `trace` writes it) skips profiling (its
    generated options are rebuilt from their `segments`: `schedlang.pytorch.segments`);
    `plan` (made for that graph) skips solving. `measure`: track the peak of every training
    step (CPU: a dispatch mode, which slows the step; CUDA: the allocator's counters).
    `bandwidth`: the host link, bytes per second each way (a number, or text such as
    "16GB/s" or "inf"), or "auto" (measured on CUDA; on the CPU no link: `hostlink`): data and
    phantoms may then be offloaded to host memory as well as recomputed (fx:
    `models/offload.sched`; blocks: the option ``offload``, `block_offload`). The plan that
    recomputes only is solved too, and the offloading plan kept only where it is predicted
    faster (and, on CUDA where `fit` probes, measured faster: `_faster_measured`); None:
    recomputation only. `calibrate`: after the first
    measured step, if its peak is over the prediction (or the budget), re-plan once with the
    excess as a margin (logged on the ``schedlang.pytorch`` logger; see `memory_report()`).

    A `fully_shard`-ed model (FSDP2) is planned per rank with what FSDP2 holds counted
    (`docs/distributed.md`); `fsdp=True` (or a dict of `fully_shard` keyword arguments)
    shards an unsharded `model` first, on each block found and on the root
    (`distributed.shard_blocks`).

    `outputs_held`: the training loop the plan and its prediction are for. True (the default)
    or None: the loop holds the model's outputs through the backward, ``out = model(x);
    loss_fn(out).backward()``; False: it releases them once the loss is computed,
    ``loss_fn(model(x)).backward()``, which peaks lower by up to the outputs' size
    (`schedlang.pytorch.outputs`). With `prepared`, None takes the loop it was prepared for.

    `op_options`: generated layer options (`schedlang.pytorch.options`; fx front end, without
    `bandwidth`): ``"auto"`` (default) generates them only when no plan with the fixed options
    meets the budget, then plans again once (seconds to tens of seconds for a small model: one
    op-level solve series per distinct layer, cached for the process); ``True``, or a dict of
    `add_generated_options` arguments (``{"jobs": 2}``, ``{"model": "my.sched"}``), always
    (before the first solve); ``False`` never. The hook front end generates its blocks'
    options (`schedlang.pytorch.block_ops`: segments and selective-checkpoint policies) only
    with ``True`` or a dict (``"auto"``: none).

    `progress`: what `fit` is doing (profiling block i of n, generating options, each solve,
    the bisection towards the smallest budget, probe steps) on stderr, as `schedlang.progress`
    shows it (True, the default: a live line on a terminal, plain lines otherwise, after the
    first second; False: nothing; or a mode). The same lines are INFO records of the
    ``schedlang.progress`` logger."""
    from . import distributed

    args, kwargs = split_inputs(sample_inputs, sample_kwargs)
    if fsdp and not distributed.is_fsdp(model):
        distributed.shard_blocks(model, args, layers, kwargs,
                                 **(fsdp if isinstance(fsdp, dict) else {}))
    if prepared is not None:
        prep = prepared
        if outputs_held is not None and bool(outputs_held) != prep.outputs_held:
            raise SchedError(f"fit(outputs_held={bool(outputs_held)}) with a `prepared` made "
                             f"for outputs_held={prep.outputs_held}: prepare(..., "
                             f"outputs_held={bool(outputs_held)}) for this loop")
    else:
        held = True if outputs_held is None else bool(outputs_held)
        try:
            if distributed.is_fsdp(model):  # docs/distributed.md
                if graph is not None:
                    raise distributed.DistributedPlanError(
                        "graph=... cannot plan a fully_shard-ed model: fit profiles an "
                        "unsharded copy of it to learn its layers (leave graph out)")
                prep = distributed.prepare_sharded(model, args, kwargs, layers, loss_fn,
                                                   frontend, outputs_held=held, **trace_kwargs)
            else:
                prep = prepare(model, args, layers=layers, graph=graph, loss_fn=loss_fn,
                               frontend=frontend, sample_kwargs=kwargs, outputs_held=held,
                               block_options=op_options if op_options != "auto" else False,
                               **trace_kwargs)
        except FitError:
            raise
        except Exception as exc:  # fallback=True: whatever stops planning, plain PyTorch
            if not fallback:
                raise
            return _fallback(model, exc, measure)
    if distributed.active():  # one profile and one plan on every rank (distributed.py)
        agreed, plain_time = distributed.agree_graph(prep.graph, prep.plain_time)
        prep = dataclasses.replace(prep, graph=agreed, plain_time=plain_time)
        calibrate = probe = False  # a re-plan would be one rank's alone
    base = other = None  # with a host link: the recompute-only preparation and plan
    if bandwidth is not None:
        prep, base = _with_link(model, prep, bandwidth, args, kwargs)
    extra = solve_extra(prep)
    solve_args = {"solver": solver, "time_limit": time_limit, "backend": backend}
    calib = {"calibrate": calibrate, "solve_args": solve_args}
    if plan is not None:
        sim = simulate(plan, prep.graph)
        if not sim.valid:
            raise SchedError(f"the plan does not replay on graph '{prep.graph.name}': "
                             f"{sim.errors[0]}")
        _priced(plan, prep)
        want = None if budget is None else resolve_fit_budget(budget, prep.plain_peak)
        return FitModule(model, prep, plan, want, measure, **calib)
    want = resolve_fit_budget(budget, prep.plain_peak)
    if want >= prep.plain_peak or want >= plain_measured_peak(model, prep, args, kwargs,
                                                              loss_fn):
        if want < prep.plain_peak:
            log.info("schedlang fit: plain execution measures %s, within the budget %s (its "
                     "prediction, %s, is not): no plan", format_size(prep.plain_measured),
                     format_size(want), format_size(prep.plain_peak))
        fm = FitModule(model, prep, None, want, measure, **calib)
    else:
        found = None
        can_generate = op_options and base is None and _can_generate(prep)
        if can_generate and op_options != "auto":
            prep = with_generated_options(
                model, prep, args, kwargs, loss_fn, "op_options given",
                **(op_options if isinstance(op_options, dict) else {}))
        elif can_generate:  # generated options only when the fixed ones cannot meet the budget
            t0 = time.perf_counter()
            with progress.phase("planning"):
                progress.step(None, f"budget {format_size(want)} with the fixed options")
                found = _as_before(prep, solve_plan(prep.graph, want - prep.resident_bytes,
                                                    solver, time_limit, backend, **extra),
                                   want - prep.resident_bytes, solver)
            solve_s = time.perf_counter() - t0
            if found is None:
                prep = with_generated_options(
                    model, prep, args, kwargs, loss_fn,
                    f"no plan with the fixed options meets {format_size(want)}")
        extra = solve_extra(prep)
        if found is None and base is not None:
            prep, found, solve_s, other = _solve_linked(base, prep, want, solver, time_limit,
                                                        backend)
            extra = solve_extra(prep)
        elif found is None:
            found, solve_s = _solve_or_raise(prep, want, 0, solver, time_limit, backend, extra)
        fm = FitModule(model, prep, found, want, measure, solve_s, **calib)
    if probe is None:  # default: the hook front end, whose glue the profile cannot replay,
        # and plans with generated options, whose in-node frees follow measured sub-steps
        from .options import OPS_PREFIX

        probe = prep.frontend == "blocks" or (fm.plan is not None and any(
            op.op == "compute" and (op.option or "").startswith(OPS_PREFIX)
            for op in fm.plan.ops))
    if probe and prep.frontend in ("blocks", "fx") and measure:
        try:
            _probe_until_within(fm, args, kwargs, loss_fn, want, solver, time_limit, backend,
                                extra)
            if other is not None and any(p.device.type == "cuda" for p in model.parameters()):
                fm = _faster_measured(fm, other, args, kwargs, loss_fn, want, solver=solver,
                                      time_limit=time_limit, backend=backend,
                                      extra=solve_extra(other[0]))
        except FitError:
            raise
        except Exception as exc:  # a block failing under its wrapper
            if not fallback:
                raise
            fm.unwrap()
            return _fallback(model, exc, measure)
    return fm


def plain_measured_peak(model: nn.Module, prep: Prepared, args: tuple, kwargs: dict,
                        loss_fn) -> int:
    """Plain execution's peak measured in one eager step on the samples (`probe_step`), once
    per `prep`, or its prediction where ranks must agree (distributed, FSDP). The graph frees a
    layer's internals when its backward node ends, autograd op by op, so plain execution can
    measure below its prediction (the fx U-Net: 7%): a budget it meets then gets plain
    execution, the fastest step, not a plan that recomputes and measures more."""
    from . import distributed
    from .hooked import BlockWrappers

    if prep.plain_measured is None:
        if distributed.active() or prep.fsdp is not None or prep.partitioned is None:
            return prep.plain_peak
        reserve = prep.loss_overhead if prep.loss_assumed else 0
        progress.note("measuring", "one step of plain execution")
        with BlockWrappers.plain(model):  # blocks an earlier fit wrapped: plain autograd
            measured = probe_step(model, args, kwargs, loss_fn, reserve, prep.output_bytes,
                                  outputs_held=prep.outputs_held)
        prep.plain_measured = min(prep.plain_peak, measured)
    return prep.plain_measured


def _can_generate(prep: Prepared) -> bool:
    """Whether `with_generated_options` applies: fx layers from a trace whose profile is at
    hand, without generated options yet, on one process, not FSDP-sharded."""
    from . import distributed
    from .options import OPS_PREFIX

    info = getattr(prep.graph, "trace_info", None) or prep.info
    return (prep.frontend == "fx" and prep.fsdp is None and not distributed.active()
            and getattr(info, "profiled", None) is not None
            and not any(o.name.startswith(OPS_PREFIX) for lay in prep.graph.layers
                        for o in lay.options))


def with_generated_options(model: nn.Module, prep: Prepared, args: tuple, kwargs: dict,
                           loss_fn, why: str, **generate) -> Prepared:
    """`prep` with generated layer options added to every layer
    (`options.add_generated_options` on its profile, with the arguments `generate`: op-level
    solves, cached per layer structure), logged with `why`."""
    from .options import OPS_PREFIX, add_generated_options
    from .trace import to_graph

    info = getattr(prep.graph, "trace_info", None) or prep.info
    profiled = info.profiled
    t0 = time.perf_counter()
    if not any(o.name.startswith(OPS_PREFIX) for lp in profiled.layers for o in lp.options):
        add_generated_options(profiled, **generate)
    graph = to_graph(profiled, name=prep.graph.name, title=getattr(prep.graph, "title", None))
    new = prepare(model, args, graph=graph, loss_fn=loss_fn, frontend="fx",
                  sample_kwargs=kwargs or None, outputs_held=prep.outputs_held)
    seconds = time.perf_counter() - t0
    count = sum(1 for lay in new.graph.layers for o in lay.options
                if o.name.startswith(OPS_PREFIX))
    log.info("schedlang fit: %s; generated %d layer options from op-level solves in %.1f s",
             why, count, seconds)
    return dataclasses.replace(new, generated={"options": count, "seconds": seconds,
                                               "why": why})


def _solve_or_raise(prep: Prepared, want: int, margin: int, solver, time_limit, backend,
                    extra: dict, why: str = "") -> tuple[Plan, float]:
    activation = want - prep.resident_bytes - margin
    if activation <= 0:
        raise FitError(f"budget {format_size(want)} ({want} B) is below the resident memory "
                       f"alone ({format_size(prep.resident_bytes)}: parameters, buffers and "
                       "inputs)" + (f" and the measured margin {format_size(margin)}"
                                    if margin else ""))
    t0 = time.perf_counter()
    with progress.phase("planning"):
        progress.step(None, f"budget {format_size(want)}, activations {format_size(activation)}")
        found = _solve(prep, activation, solver, time_limit, backend, extra)
    solve_s = time.perf_counter() - t0
    if found is None:
        # plain execution's activation peak admits its plan (budgets are exact to the byte);
        # a KiB above it, as a margin
        high = prep.plain_peak - prep.resident_bytes + prep.output_bytes + 1024
        best = smallest_feasible(prep.graph, activation, high, solver, time_limit, backend,
                                 **extra)
        how = f"bisection with the solver {solver}"
        grouped = min((need for need, _ in _group_plans_priced(prep)), default=None)
        if grouped is not None and (best is None or grouped < best):
            best, how = grouped, "a plan with checkpointed groups of blocks"
        fixed = prep.resident_bytes + margin
        smallest = "unknown" if best is None else \
            f"{format_size(best + fixed)} ({best + fixed} B)"
        gen = (f", with {prep.generated['options']} generated layer options"
               if prep.generated else "")
        raise FitError(f"no plan fits the budget {format_size(want)} ({want} B){why}: the "
                       f"smallest feasible budget found is {smallest} ({how}{gen}; plain "
                       f"execution needs "
                       f"{format_size(prep.plain_peak)}, of which "
                       f"{format_size(prep.resident_bytes)} resident)")
    return found, solve_s


def _solve(prep: Prepared, activation: int, solver, time_limit, backend, extra: dict,
           warm_start: Plan | None = None, groups: bool = True,
           must_beat: float | None = None) -> Plan | None:
    """The plan of `prep` within `activation` bytes (the solver's, or a faster group plan
    unless `groups` is False; rank 0's under torch.distributed; an earlier one as fast,
    `_as_before`), or None."""
    from . import distributed

    found = None
    if distributed.solves_here():
        found = solve_plan(prep.graph, activation, solver, time_limit, backend,
                           warm_start=warm_start, must_beat=must_beat, **extra)
        if groups:
            found = _or_group_plan(prep, activation, found)
        if found is not None:  # data freed where the runtime frees them (`lifetimes`)
            found = _as_runtime_frees(found, prep)
    found = distributed.agree_plan(found, prep.graph)  # rank 0's plan; a no-op on one process
    return _as_before(prep, found, activation, solver)


def _as_runtime_frees(plan: Plan, prep: Prepared) -> Plan:
    """`plan` with the deletes the runtime does itself right after their last use, repriced:
    every datum with the hook front end (the model's own code frees it), the outputs of a
    loop that releases them with fx (handed to the caller, freed once the loss is computed)."""
    if prep.frontend == "blocks":
        moved = earliest_deletes(plan, prep.graph)
    elif not prep.outputs_held and prep.graph.loss is not None:
        released = {d.name for d in prep.graph.data
                    if d.name in prep.graph.loss.inputs and d.role != "output"}
        moved = earliest_deletes(plan, prep.graph, released)
    else:
        return plan
    return plan if moved is plan else _priced(moved, prep)


def _priced(plan: Plan, prep: Prepared) -> Plan:
    """`plan` with its predicted peak (the loss's memory included) and time on `prep`'s
    graph."""
    sim = simulate(plan, prep.graph)
    plan.predicted_peak = max(sim.peak_bytes,
                              loss_moment(plan, prep.graph) + prep.loss_overhead)
    plan.predicted_time = sim.time
    if prep.frontend == "blocks":  # a group's reruns, priced as recomputations
        from .hooked import rerun_correction

        plan.predicted_time += rerun_correction(plan, prep.graph)
    return plan


def _with_link(model: nn.Module, prep: Prepared, bandwidth, args, kwargs) -> tuple:
    """(the preparation to plan with, the recompute-only one to compare it with or None) for
    `fit(bandwidth=...)` (`hostlink`: a rate, or "auto", measured on CUDA; none on the CPU)."""
    from .hostlink import linked, resolve_link

    tensors = [*model.parameters(), *_flat((args, kwargs))]
    device = next((t.device for t in tensors if isinstance(t, torch.Tensor)),
                  torch.device("cpu"))
    link, note = resolve_link(bandwidth, device)
    if link is None or not (link.offload > 0 and link.prefetch > 0):
        if note:
            log.info("schedlang fit: %s", note)
        return dataclasses.replace(prep, host_link={"note": note or "no host link (0 B/s)"}), None
    info = {**link.to_json(), "note": note}
    return linked(dataclasses.replace(prep, host_link=info), link), \
        dataclasses.replace(prep, host_link=info)


def _solve_linked(base: Prepared, linked: Prepared, want: int, solver, time_limit,
                  backend) -> tuple[Prepared, Plan, float, tuple | None]:
    """(preparation, plan, seconds, the recompute-only (preparation, plan) it was preferred
    to or None) with a host link: the recompute-only plan of `base` and the plan of `linked`,
    which may also move data to host memory, warm-started from the first (its model contains
    every plan it can express), at the same budget; the offloading plan is kept only when it
    is predicted faster by more than the solver's relative gap. Raises FitError when neither
    meets the budget."""
    from ..solvers import requested_gap

    t0 = time.perf_counter()
    activation = want - base.resident_bytes
    alone = _solve(base, activation, solver, time_limit, backend, solve_extra(base)) \
        if activation > 0 else None
    # (group plans, which move nothing, are the recompute-only solve's; a plan with the link
    # that is not faster is dropped before its least-peak solve)
    moved = _solve(linked, activation, solver, time_limit, backend, solve_extra(linked),
                   warm_start=alone, groups=False,
                   must_beat=None if alone is None else alone.predicted_time) \
        if activation > 0 else None
    solve_s = time.perf_counter() - t0
    if alone is None and moved is None:
        found, _ = _solve_or_raise(linked, want, 0, solver, time_limit, backend,
                                   solve_extra(linked))
        return linked, found, solve_s, None
    slack = 1 - requested_gap(solver, None)
    faster = moved is not None and (alone is None or
                                    moved.predicted_time < alone.predicted_time * slack)
    info = dict(linked.host_link or {}, kept="with the link" if faster else "recompute only",
                recompute_only_time=None if alone is None else alone.predicted_time,
                with_link_time=None if moved is None else moved.predicted_time)
    if not faster:
        log.info("schedlang fit: no plan with the host link is predicted faster than "
                 "recomputation alone (%.4g s) at %s: recomputation only",
                 alone.predicted_time, format_size(want))
    chosen, plan = (linked, moved) if faster else (base, alone)
    other = (dataclasses.replace(base, host_link=info), alone) if faster and alone else None
    return dataclasses.replace(chosen, host_link=info), plan, solve_s, other


#: timed steps (after one warm-up) per plan when `fit` measures an offloading plan against
#: recomputation alone (CUDA)
TIMED_STEPS = 3


def _faster_measured(fm: FitModule, other: tuple, args, kwargs, loss_fn, want: int,
                     step_seconds=None, **probe_args) -> FitModule:
    """`fm` (an offloading plan, predicted faster) or the recompute-only plan `other`
    (preparation, plan), whichever measures the faster step (`step_seconds(fitted)`, default
    the median of `TIMED_STEPS` probe steps on CUDA); the recompute-only plan is probed first,
    and out of the race if it cannot meet the budget. Both times go in the report."""
    prep, plan = other
    alt = FitModule(fm.module, prep, plan, want, fm.measure, fm._solve_s,
                    calibrate=fm._calibrate, solve_args=fm._solve_args)
    try:
        _probe_until_within(alt, args, kwargs, loss_fn, want, **probe_args)
    except FitError:
        alt.unwrap()
        if fm._wrappers is not None:
            fm._wrappers.ensure()
        return fm
    step_seconds = step_seconds or (lambda f: _cuda_step_seconds(f, args, kwargs, loss_fn))
    times = {"with the link": step_seconds(fm), "recompute only": step_seconds(alt)}
    keep, drop = (fm, alt) if times["with the link"] <= times["recompute only"] else (alt, fm)
    keep._prep.host_link.update(measured_s=times, kept=("with the link" if keep is fm
                                                        else "recompute only") + " (measured)")
    if keep is alt:
        log.info("schedlang fit: the offloading plan measured %.4g s a step, recomputation "
                 "alone %.4g s: recomputation only", times["with the link"],
                 times["recompute only"])
    drop.unwrap()
    if keep._wrappers is not None:
        keep._wrappers.ensure()
    return keep


def _cuda_step_seconds(fm: FitModule, args, kwargs, loss_fn) -> float:
    """The median time of `TIMED_STEPS` probe steps of `fm` (after a warm-up), on CUDA."""
    import statistics

    prep = fm._prep
    times = []
    for k in range(TIMED_STEPS + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        probe_step(fm.module, args, kwargs, loss_fn,
                   prep.loss_overhead if prep.loss_assumed else 0, prep.output_bytes,
                   run=fm._call, outputs_held=prep.outputs_held)
        torch.cuda.synchronize()
        if k:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _group_plans_priced(prep: Prepared) -> list[tuple[int, Plan]]:
    """Hook front end: the plans with checkpointed groups of blocks (`hooked.group_plans`),
    each with the activation budget it needs (its peak, and its loss phase with the loss
    function's memory and the outputs the graph does not count), predicted peak and time set
    as `solve_plan` sets them. Cached on `prep`. None with FSDP: a group's recomputation runs
    its first blocks when their parameters may be resharded (their backward has not begun)."""
    from . import distributed

    if prep.frontend != "blocks" or prep.fsdp is not None or distributed.active():
        return []
    key = (prep.loss_overhead, prep.output_bytes)
    if prep.grouped is None or prep.grouped[0] != key or prep.grouped[1] is not prep.graph:
        from .hooked import group_plans, rerun_correction

        blocks = [b.name for b in prep.partitioned.found.blocks]
        uncounted = uncounted_outputs(prep.graph, prep.output_bytes)
        priced = []
        for plan in group_plans(prep.graph, blocks):
            sim = simulate(plan, prep.graph)
            if not sim.valid:
                continue
            at_loss = loss_moment(plan, prep.graph) + prep.loss_overhead
            plan.predicted_peak = max(sim.peak_bytes, at_loss)
            plan.predicted_time = sim.time + rerun_correction(plan, prep.graph)
            plan.meta["status"] = "feasible"
            priced.append((max(sim.peak_bytes, at_loss + uncounted), plan))
        prep.grouped = (key, prep.graph, priced)
    return prep.grouped[2]


def _or_group_plan(prep: Prepared, activation: int, found: Plan | None) -> Plan | None:
    """`found` (the solver's per-block plan, or None), or a faster plan with checkpointed
    groups of blocks that meets `activation` (`_group_plans_priced`): the solver's space
    cannot express a group (models/extensions/per_block.sched), checkpoint_sequential's
    schedule among them."""
    fits = [plan for need, plan in _group_plans_priced(prep) if need <= activation]
    best = min(fits, key=lambda p: (p.predicted_time, p.predicted_peak), default=None)
    if best is not None and (found is None or
                             best.predicted_time < found.predicted_time * (1 - 1e-9)):
        log.info("schedlang fit: %s (predicted %.4g s) is faster than the per-block plan (%s)",
                 best.meta["planner"], best.predicted_time,
                 "none found" if found is None else f"{found.predicted_time:.4g} s")
        return best
    return found


def _as_before(prep: Prepared, found: Plan | None, activation: int, solver: str) -> Plan | None:
    """`found`, or a plan fit took earlier with `prep` (at a higher budget) that fits
    `activation` and is as fast, within the solver's relative gap (which is all `found`'s
    optimality means): plans of equal predicted time and peak can measure a few hundred bytes
    apart (ViT: which of two identical blocks recomputes, 768 B), so taking the earlier one
    keeps the measured peak from growing as the budget falls. Records the result."""
    from ..solvers import requested_gap
    from . import distributed

    if found is None or distributed.active():
        return found
    slack = 1 + requested_gap(solver, None)
    for graph, earlier in prep.solved:
        if (graph is prep.graph and earlier.predicted_peak <= activation
                and earlier.predicted_time <= found.predicted_time * slack):
            found = earlier
            break
    else:
        prep.solved.append((prep.graph, found))
    return found


#: probe steps `fit` runs at most (hook front end) before giving up on a budget
PROBES = 4


def probe_step(model: nn.Module, args: tuple, kwargs: dict, loss_fn, loss_reserve: int = 0,
               output_bytes: int = 0, run=None, outputs_held: bool = True) -> int:
    """The measured peak (bytes, resident included) of one training step of `model` (called
    through `run`, default the model itself) on the samples: forward, the loss (`loss_fn`,
    else a gradient of ones for each floating output and `loss_reserve` bytes at the loss)
    and backward, the outputs held through the backward or (`outputs_held` False, with a
    `loss_fn`) released once the loss is computed. Gradients, buffers and the RNG state are
    restored afterwards."""
    from torch.utils._pytree import tree_map

    from .blocks import preserved
    from .memory import MemoryTracker

    run = model if run is None else run
    with preserved(model) as kept:
        for p in model.parameters():
            p.grad = None
        # fresh leaves: the samples' own .grad stays as it is
        args, kwargs = tree_map(lambda t: t.detach().requires_grad_(t.requires_grad)
                                if isinstance(t, torch.Tensor) else t, (args, kwargs))
        inputs = [t for t in _flat((args, kwargs)) if isinstance(t, torch.Tensor)]
        from .distributed import fsdp_storages, is_fsdp

        watch = fsdp_storages(model) if is_fsdp(model) else ()
        # everything alive counts, as on CUDA, but for what the probe keeps to restore
        with MemoryTracker(resident=[model, *inputs], watch=watch, ignore=kept.held()) as mt:
            out = run(*args, **kwargs)
            after = mt.current
            if loss_fn is not None:
                loss = loss_fn(out)
                if not outputs_held:
                    del out
                loss.backward()
                del loss
            else:
                leaves = [t for t in _flat(out) if isinstance(t, torch.Tensor)
                          and t.requires_grad and t.is_floating_point()]
                torch.autograd.backward(leaves, [torch.ones_like(t) for t in leaves])
                del leaves
            out = None
            peak = mt.peak
    if loss_fn is None:
        peak = max(peak, after + output_bytes + loss_reserve)
    return peak


def _probe_until_within(fm: FitModule, args, kwargs, loss_fn, want: int, solver, time_limit,
                        backend, extra: dict) -> None:
    """Run probe steps; while one measures over the budget, plan again with the excess over
    the prediction as a margin (see `fit`)."""
    prep = fm._prep
    measured = None
    for _ in range(PROBES):
        measured = probe_step(fm.module, args, kwargs, loss_fn,
                              prep.loss_overhead if prep.loss_assumed else 0, prep.output_bytes,
                              run=fm._call, outputs_held=prep.outputs_held)
        predicted = fm.predicted_peak()
        fm._probes.append({"measured": measured, "predicted": predicted,
                           "plan": fm.plan is not None})
        progress.note("probe step", f"{len(fm._probes)} measured {format_size(measured)}, "
                                    f"predicted {format_size(predicted)}, budget "
                                    f"{format_size(want)}")
        if measured <= want:
            if measured > predicted and prep.frontend == "blocks":
                fm._margin += measured - predicted  # the prediction is the measurement
            return
        margin = fm._margin + measured - predicted
        log.info("schedlang fit: the probe step measured %s over the budget %s (predicted %s): "
                 "planning with a margin of %s", format_size(measured), format_size(want),
                 format_size(predicted), format_size(margin))
        found, _ = _solve_or_raise(prep, want, margin, solver, time_limit, backend, extra,
                                   f" (a probe step measured {format_size(measured)}, "
                                   f"{format_size(margin)} over the prediction)")
        fm._margin = margin
        fm._set_plan(found)
    raise FitError(f"no plan fits the budget {format_size(want)} ({want} B): after {PROBES} "
                   f"probe steps the step still measures {format_size(measured)}")
