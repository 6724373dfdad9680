"""One call: a module that trains within a memory budget.

    model = schedlang.pytorch.fit(model, sample_inputs, budget="60%")
    loss_fn(model(*inputs)).backward(); optimizer.step()     # as usual
    model.memory_report()

`fit` cuts the module into layers and profiles them — with a whole-model torch.fx trace
(`schedlang.pytorch.trace`, run by `schedlang.pytorch.frontends.fx.runtime`) or, with no trace,
from its
blocks found by hooks on one run (`schedlang.pytorch.frontends.blocks.find`, run by the in-place
wrappers of
`schedlang.pytorch.frontends.blocks.hooked`; `frontend=`, see `prepare`) —, solves
`models/rockmate.sched` on the
layered graph data at the budget (with the hook front end, a plan with checkpointed groups of
blocks is taken instead where faster: `families.group_plans`), and returns a `FitModule` whose
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
the module re-plans once with the excess as a margin (calibration) and logs it. What the plan does
not move —
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

import dataclasses
import logging
import os
import time
import warnings
from dataclasses import dataclass

from torch import nn

from .. import progress
from ..graphs.graph import Graph
from ..language.errors import SchedError
from ..language.units import format_size
from ..plans.plan import Plan
from ..plans.simulate import simulate
from ..progress import reporting
from . import distributed
from .fitmodule import FitModule
from .guards import guarded_fit
from .inputs import split_inputs
from .options import OPS_PREFIX
from .planning import (
    FitError,
    as_before,
    priced,
    resolve_fit_budget,
    solve_extra,
    solve_linked,
    solve_or_raise,
    solve_plan,
    with_link,
)
from .prepare import FRONTENDS, LOSS_RESERVE, Prepared, prepare
from .probing import (
    can_generate,
    faster_measured,
    faster_of_near_plans,
    plain_measured_peak,
    probe_until_within,
    with_generated_options,
)
from .report import MemoryReport
from .steptime import time_overhead

__all__ = ["fit", "FitModule", "FitError", "MemoryReport", "resolve_fit_budget", "prepare",
           "LOSS_RESERVE"]

log = logging.getLogger("schedlang.pytorch")

#: the environment variable that turns `fit`'s timing of its plan off (`time_plan="auto"`)
TIME_PLAN_ENV = "SCHEDLANG_TIME_PLAN"
OFF = ("off", "0", "false", "no")


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
        op_options="auto", outputs_held: bool | None = None, time_plan="auto",
        **trace_kwargs) -> FitModule:
    """`model` wrapped to train within `budget` (see the module docstring).

    `sample_inputs`: a tensor, a tuple of positional inputs, or a dict of keyword inputs
    (``{"input_ids": ids, "attention_mask": mask}``); `sample_kwargs` adds keyword inputs to
    positional ones. `loss_fn(outputs) -> scalar`: the loss the training step applies to the
    model's outputs (a `ModelOutput` for `transformers` models). Optional; given, its memory
    (measured once on a sample output) is part of the prediction and of the plan's constraints
    (the save budget of the loss phase); without it `LOSS_RESERVE` times the outputs' bytes and
    `LOSS_SCALAR_BYTES` are reserved. `prepared`: the result of `prepare(...)` for this model (to
    fit at several
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
    generated options are rebuilt from their `segments`: `schedlang.pytorch.frontends.fx.segments`);
    `plan` (made for that graph) skips solving. `measure`: track the peak of every training
    step (CPU: a dispatch mode, which slows the step; CUDA: the allocator's counters).
    `bandwidth`: the host link, bytes per second each way (a number, or text such as
    "16GB/s" or "inf"), or "auto" (measured on CUDA; on the CPU no link: `hostlink`): data and
    phantoms may then be offloaded to host memory as well as recomputed (fx:
    `models/offload.sched`; blocks: the option ``offload``, `block_offload`). The plan that
    recomputes only is solved too, and the offloading plan kept only where it is predicted
    faster (and, on CUDA where `fit` probes, measured faster: `faster_measured`); None:
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
    (before the first solve); ``False`` never.

    `time_plan`: before returning, time the plan's training steps against plain execution's,
    in pairs on the samples, until their median ratio is precise (`schedlang.pytorch.steptime`:
    7 to 81 pairs, 20 s at most); `memory_report()` then states that measured
    overhead (the time model's beside it). A re-plan is timed likewise when it is made.
    ``"auto"`` (default): on unless ``$SCHEDLANG_TIME_PLAN`` is ``off``; True; False.

    `progress`: what `fit` is doing (profiling block i of n, generating options, each solve,
    the bisection towards the smallest budget, probe steps) on stderr, as `schedlang.progress`
    shows it (True, the default: a live line on a terminal, plain lines otherwise, after the
    first second; False: nothing; or a mode). The same lines are INFO records of the
    ``schedlang.progress`` logger."""

    opts = FitOptions(solver=solver, time_limit=time_limit, layers=layers, backend=backend,
                      measure=measure, loss_fn=loss_fn, bandwidth=bandwidth,
                      calibrate=calibrate, frontend=frontend, fallback=fallback, probe=probe,
                      fsdp=fsdp, op_options=op_options, outputs_held=outputs_held,
                      time_plan=time_plan)
    args, kwargs = split_inputs(sample_inputs, sample_kwargs)
    if fsdp and not distributed.is_fsdp(model):
        distributed.shard_blocks(model, args, layers, kwargs,
                                 **(fsdp if isinstance(fsdp, dict) else {}))
    try:
        prep = prepared if prepared is not None else \
            _prepare(model, args, kwargs, graph, opts, trace_kwargs)
    except FitError:
        raise
    except Exception as exc:  # fallback=True: whatever stops planning, plain PyTorch
        if not fallback:
            raise
        return _fallback(model, exc, measure)
    opts.check_prepared(prep)
    if distributed.active():  # one profile and one plan on every rank (distributed.py)
        agreed, plain_time = distributed.agree_graph(prep.graph, prep.plain_time)
        prep = dataclasses.replace(prep, graph=agreed, plain_time=plain_time)
        opts.calibrate = opts.probe = False  # a re-plan would be one rank's alone
    base = None  # with a host link: the recompute-only preparation
    if bandwidth is not None:
        prep, base = with_link(model, prep, bandwidth, args, kwargs)
    if plan is not None:
        return _timed(_with_plan(model, prep, plan, budget, opts), args, kwargs, opts)
    fm, other = _planned(model, prep, base, resolve_fit_budget(budget, prep.plain_peak),
                         args, kwargs, opts)
    fm = _timed(_probed(fm, other, args, kwargs, opts), args, kwargs, opts)
    return _raced(fm, args, kwargs, opts)





@dataclass
class FitOptions:
    """`fit`'s keyword arguments that steer planning (see `fit`), declared and checked in
    one place; the helpers of `fit` read them from here."""

    solver: str = "highs"
    time_limit: float | None = 60.0
    layers: object = None
    backend: str = "pyomo"
    measure: bool = True
    loss_fn: object = None
    bandwidth: object = None
    calibrate: bool = True
    frontend: str = "auto"
    fallback: bool = False
    probe: bool | None = None
    fsdp: object = False
    op_options: object = "auto"
    outputs_held: bool | None = None
    time_plan: object = "auto"

    def __post_init__(self):
        if self.frontend not in FRONTENDS:
            raise SchedError(f"frontend must be one of {', '.join(FRONTENDS)}, got "
                             f"{self.frontend!r}")
        if not (isinstance(self.op_options, (bool, dict)) or self.op_options == "auto"):
            raise SchedError(f"op_options must be 'auto', True, False or a dict of "
                             f"add_generated_options arguments, got {self.op_options!r}")
        if not (isinstance(self.time_plan, bool) or self.time_plan == "auto"):
            raise SchedError(f"time_plan must be 'auto', True or False, got "
                             f"{self.time_plan!r}")

    @property
    def times_plan(self) -> bool:
        """Whether `fit` times its plan (`time_plan`; "auto": unless $SCHEDLANG_TIME_PLAN
        says off)."""
        if self.time_plan == "auto":
            return os.environ.get(TIME_PLAN_ENV, "").strip().lower() not in OFF
        return bool(self.time_plan)

    @property
    def held(self) -> bool:
        """The loop holds the outputs through the backward (None: the default, True)."""
        return True if self.outputs_held is None else bool(self.outputs_held)

    @property
    def solve_args(self) -> dict:
        return {"solver": self.solver, "time_limit": self.time_limit, "backend": self.backend}

    @property
    def calibration(self) -> dict:
        """`FitModule`'s calibration arguments."""
        return {"calibrate": self.calibrate, "solve_args": self.solve_args}

    def check_prepared(self, prep: Prepared) -> None:
        if self.outputs_held is not None and bool(self.outputs_held) != prep.outputs_held:
            raise SchedError(f"fit(outputs_held={bool(self.outputs_held)}) with a `prepared` "
                             f"made for outputs_held={prep.outputs_held}: prepare(..., "
                             f"outputs_held={bool(self.outputs_held)}) for this loop")


def _prepare(model: nn.Module, args: tuple, kwargs: dict, graph, opts: FitOptions,
             trace_kwargs: dict) -> Prepared:
    """The preparation `fit` plans with (`prepare`; a `fully_shard`-ed model: its unsharded
    copy's, `distributed.prepare_sharded`)."""
    if distributed.is_fsdp(model):  # docs/distributed.md
        if graph is not None:
            raise distributed.DistributedPlanError(
                "graph=... cannot plan a fully_shard-ed model: fit profiles an "
                "unsharded copy of it to learn its layers (leave graph out)")
        return distributed.prepare_sharded(model, args, kwargs, opts.layers, opts.loss_fn,
                                           opts.frontend, outputs_held=opts.held,
                                           **trace_kwargs)
    return prepare(model, args, layers=opts.layers, graph=graph, loss_fn=opts.loss_fn,
                   frontend=opts.frontend, sample_kwargs=kwargs, outputs_held=opts.held,
                   offload=opts.bandwidth is not None,
                   block_options=opts.op_options if opts.op_options != "auto" else False,
                   **trace_kwargs)


def _with_plan(model: nn.Module, prep: Prepared, plan: Plan, budget, opts: FitOptions):
    """`fit(plan=...)`: the given plan, checked on the graph and priced."""
    sim = simulate(plan, prep.graph)
    if not sim.valid:
        raise SchedError(f"the plan does not replay on graph '{prep.graph.name}': "
                         f"{sim.errors[0]}")
    priced(plan, prep)
    want = None if budget is None else resolve_fit_budget(budget, prep.plain_peak)
    return FitModule(model, prep, plan, want, opts.measure, **opts.calibration)


def _planned(model: nn.Module, prep: Prepared, base: Prepared | None, want: int, args, kwargs,
             opts: FitOptions) -> tuple:
    """(the `FitModule` of the plan `fit` solves for `want`, the recompute-only (preparation,
    plan) an offloading plan was preferred to, or None): plain execution where it fits,
    generated options where the fixed ones cannot meet the budget (or where asked), the
    offloading plan where faster (`base`: the recompute-only preparation)."""
    solver, time_limit, backend = opts.solver, opts.time_limit, opts.backend
    loss_fn, op_options = opts.loss_fn, opts.op_options
    if want >= prep.plain_peak or want >= plain_measured_peak(model, prep, args, kwargs,
                                                              loss_fn):
        if want < prep.plain_peak:
            log.info("schedlang fit: plain execution measures %s, within the budget %s (its "
                     "prediction, %s, is not): no plan", format_size(prep.plain_measured),
                     format_size(want), format_size(prep.plain_peak))
        return FitModule(model, prep, None, want, opts.measure, **opts.calibration), None
    found = other = None
    generate = op_options and base is None and can_generate(prep)
    if generate and op_options != "auto":
        prep = with_generated_options(
            model, prep, args, kwargs, loss_fn, "op_options given",
            **(op_options if isinstance(op_options, dict) else {}))
    elif generate:  # generated options only when the fixed ones cannot meet the budget
        t0 = time.perf_counter()
        with progress.phase("planning"):
            progress.step(None, f"budget {format_size(want)} with the fixed options")
            found = as_before(prep, solve_plan(prep.graph, want - prep.resident_bytes,
                                               solver, time_limit, backend,
                                               **solve_extra(prep)),
                              want - prep.resident_bytes, solver)
        solve_s = time.perf_counter() - t0
        if found is None:
            prep = with_generated_options(
                model, prep, args, kwargs, loss_fn,
                f"no plan with the fixed options meets {format_size(want)}")
    if found is None and base is not None:
        prep, found, solve_s, other = solve_linked(base, prep, want, solver, time_limit,
                                                   backend)
    elif found is None:
        found, solve_s = solve_or_raise(prep, want, 0, solver, time_limit, backend,
                                        solve_extra(prep))
    fm = FitModule(model, prep, found, want, opts.measure, solve_s, **opts.calibration)
    return fm, other


def _timed(fm: FitModule, args, kwargs, opts: FitOptions) -> FitModule:
    """`fm`, its plan timed against plain execution (`steptime.time_overhead`) where
    `opts.time_plan` asks and a plan runs on one process (ranks would each time their own)."""
    prep = fm._prep
    if not (opts.times_plan and prep.front is not None and prep.fsdp is None
            and not distributed.active()):
        return fm
    if fm.plan is not None:
        progress.note("timing", "the plan's training steps against plain execution's")
    fm.time_plan(args, kwargs, opts.loss_fn)
    return fm


def _raced(fm: FitModule, args, kwargs, opts: FitOptions) -> FitModule:
    """`fm`, or `fm` with a plan of the group family that the time model cannot tell from its
    plan and that measures faster (`probing.faster_of_near_plans`), where `fit` timed it."""
    if fm._timed is None or fm._budget is None:
        return fm
    return faster_of_near_plans(
        fm, args, kwargs, opts.loss_fn, fm._budget, probe=opts.measure and opts.probe is not False,
        time_plan=lambda f: time_overhead(f, args, kwargs, opts.loss_fn, f.modelled_overhead()))


def _probed(fm: FitModule, other, args, kwargs, opts: FitOptions) -> FitModule:
    """`fm` after its probe steps (`probing.probe_until_within`), where `opts.probe` asks
    (default: where the front end's profile cannot replay all of the model's code, and plans
    with generated options, whose in-node frees follow measured sub-steps); on CUDA, the
    faster of `fm` and the recompute-only plan `other` as measured."""
    prep, model, want = fm._prep, fm.module, fm._budget
    probe = opts.probe
    if probe is None:
        probe = prep.front.probes_by_default or (fm.plan is not None and any(
            op.op == "compute" and (op.option or "").startswith(OPS_PREFIX)
            for op in fm.plan.ops))
    if not (probe and prep.front is not None and opts.measure):
        return fm
    solve_args = opts.solve_args
    try:
        probe_until_within(fm, args, kwargs, opts.loss_fn, want, *solve_args.values(),
                           solve_extra(prep))
        if other is not None and any(p.device.type == "cuda" for p in model.parameters()):
            fm = faster_measured(fm, other, args, kwargs, opts.loss_fn, want, **solve_args,
                                 extra=solve_extra(other[0]))
    except FitError:
        raise
    except Exception as exc:  # a block failing under its wrapper
        if not opts.fallback:
            raise
        fm.unwrap()
        return _fallback(model, exc, opts.measure)
    return fm
