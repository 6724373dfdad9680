"""`FitModule`: a model trained by a plan — the front end's executor applied, each training
step measured (forward to the end of the backward), and the plan re-made once when a step
measures over its prediction (calibration)."""
from __future__ import annotations

import logging
import time
import warnings
import weakref

import torch
from torch import nn

from ..graphs.graph import Graph
from ..language.units import format_size
from ..plans.plan import Plan
from .distributed import check_not_sharded_after, fsdp_storages
from .guards import check_call
from .memory import MemoryTracker, drop_closed_modes
from .planning import solve_at, solve_extra
from .prepare import Prepared
from .report import MemoryReport
from .steptime import TimedOverhead, overhead_of, time_overhead
from .tensors import flat
from .timeline import Recorder

__all__ = ["FitModule"]

log = logging.getLogger("schedlang.pytorch")


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
        self._probes: list[dict] = []  # the probe steps `fit` ran (hook front end)
        self._fallback: str | None = None
        self._timed: TimedOverhead | None = None  # what `fit` measured of its plan (steptime)
        self._timing: tuple | None = None  # (loss_fn,): time each new plan (fit's time_plan)
        self._raced: dict | None = None  # the race between near plans (`faster_of_near_plans`)
        # the front end's executor of the plan (None: fallback, plain PyTorch)
        self._run = None if prepared.front is None else prepared.front.runner(prepared)
        self._set_plan(plan)

    def _set_plan(self, plan: Plan | None) -> None:
        self._plan = plan
        if self._run is None:
            return
        # a backward that raises (GraphChanged, a PlanError) ends the measured step: its
        # tracker must not stay on the dispatch stack counting later ops (a weak method:
        # a cycle would keep the module and its model alive after `del` until a collection)
        closing = weakref.WeakMethod(self._close_tracker)
        self._run.set_plan(plan, lambda: (closing() or _nothing)())

    def ensure_plan(self) -> None:
        """Make this module's plan the one its model runs (another fit of the same model, a
        probe, may have set its own)."""
        if self._run is not None:
            self._run.ensure()

    @property
    def plan_executor(self):
        """The fx front end's `PlanExecutor` of the current plan (None with the hook front
        end or without a plan)."""
        return None if self._run is None else self._run.plan_executor

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

    def modelled_overhead(self) -> float:
        """The time model's overhead of the current plan: its predicted time over plain
        execution's, less one (0 without a plan)."""
        plain_time = self._prep.plain_time
        plan_time = plain_time if self._plan is None else float(self._plan.predicted_time or 0)
        return plan_time / plain_time - 1 if plain_time > 0 else 0.0

    def memory_report(self) -> MemoryReport:
        modelled = self.modelled_overhead()
        overhead, source = overhead_of(self._plan, modelled, self._timed)
        return MemoryReport(self._budget, self.predicted_peak(), self._measured,
                            self._prep.plain_peak, self._prep.resident_bytes, overhead,
                            self._plan is None, self._step_s, self._solve_s,
                            loss_bytes=self._prep.loss_overhead,
                            loss_assumed=self._prep.loss_assumed,
                            calibrated=None if self._calibrated is None
                            else dict(self._calibrated),
                            overhead_source=source, modelled_time_overhead=modelled,
                            timed=None if self._timed is None else
                            {**self._timed.to_json(), "this_plan": self._timed.plan is self._plan},
                            extra={"frontend": self._prep.frontend,
                                   "timing": dict(self._prep.timing),
                                   "probes": [dict(p) for p in self._probes],
                                   **({"generated": dict(self._prep.generated)}
                                      if self._prep.generated else {}),
                                   **({"fallback": self._fallback} if self._fallback else {}),
                                   **({"raced": dict(self._raced)} if self._raced else {}),
                                   **({"host_link": dict(self._prep.host_link)}
                                      if self._prep.host_link else {}),
                                   "outputs_held": self._prep.outputs_held})

    def record_timeline(self, on: bool = True) -> None:
        """Record memory and time per op of each measured training step (`timeline()`;
        `schedlang.pytorch.timeline`)."""
        if not on:
            self._recorder = None
        elif self._recorder is None:

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

    def time_plan(self, args: tuple, kwargs: dict, loss_fn) -> None:
        """Time the current plan's training steps against plain execution's on these inputs
        (`steptime.time_overhead`: the overhead `memory_report()` states), and every plan
        this module takes later (a re-plan), on the inputs of the step that makes it."""
        self._timing = (loss_fn,)
        if self._plan is not None:
            self._timed = time_overhead(self, args, kwargs, loss_fn, self.modelled_overhead())

    def _recalibrate(self, args: tuple, kwargs: dict) -> None:
        """Re-plan once: the step measured more than predicted; the excess and 4 KiB (the
        fixed part of `CALIBRATION_SLACK`) become a margin the plan leaves free (the graph's
        activation budget shrinks by it). The new plan is timed on this step's inputs where
        `fit` timed its own (`time_plan`)."""
        measured, predicted = self._pending
        self._pending = None
        # 4 KiB more: the new plan may use its budget to the byte, and a next step a few KB
        # over the first one's was then over the budget. Not the relative part of the slack:
        # 27 KB on the README's model tipped its re-plan between two near plans run to run
        margin = self._margin + measured - predicted + self.CALIBRATION_SLACK[0]
        activation = self._budget - self._prep.resident_bytes - margin
        found = None
        t0 = time.perf_counter()
        if activation > 0:
            solving = self._solve_args
            found = solve_at(self._prep, activation, solving.get("solver", "highs"),
                             solving.get("time_limit"), solving.get("backend", "pyomo"),
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
        if self._timing is not None:
            self.time_plan(args, kwargs, *self._timing)

    # measuring one training step: forward to the end of the backward
    def _open_tracker(self, tensors) -> None:

        self._close_tracker(complete=False)  # a previous forward that had no backward
        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        watch = []
        if self._prep.fsdp is not None:

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
        """The front end's name: ``"fx"`` (the plan runs on the fx-partitioned module) or
        ``"blocks"`` (the model's own forward runs; its blocks are wrapped in place)."""
        return self._prep.frontend

    def unwrap(self) -> nn.Module:
        """The model with its blocks' wrappers removed (hook front end): plain PyTorch again."""
        if self._run is not None and self._run.in_place:
            self._run.unwrap()
            self._run = None
        return self.module

    def forward(self, *args, **kwargs):

        drop_closed_modes()  # the previous measured step's tracker (closed in the backward)
        if self._prep.fsdp is None and self._prep.front is not None:

            check_not_sharded_after(self.module)
        check_call(self, args, kwargs)  # dtype/device as fitted; a new shape: its own plan
        tensors = [a for a in flat((args, kwargs)) if isinstance(a, torch.Tensor)]
        training = torch.is_grad_enabled()
        if training and self._pending is not None:
            self._recalibrate(args, kwargs)
        if not (self.measure and training):
            return self._call(*args, **kwargs)
        self._open_tracker(tensors)
        try:
            out = self._call(*args, **kwargs)
        except BaseException:
            self._close_tracker()
            raise
        # close the tracker when the backward of this step ends
        leaves = [o for o in flat(out) if isinstance(o, torch.Tensor) and o.requires_grad]
        if not leaves:
            self._close_tracker()
            return out
        _StepEnd.attach(self, leaves)
        return out

    def _call(self, *args, **kwargs):
        if self._run is None:
            return self.module(*args, **kwargs)
        return self._run.call(self.module, args, kwargs)


def _nothing() -> None:
    pass


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
