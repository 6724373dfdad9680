"""Memory and time over one training step: the plan's prediction next to what ran.

`FitModule.record_timeline()` turns recording on; after a training step,
`FitModule.timeline()` returns a `Timeline` of that step:

* **predicted**: the plan replayed by the simulator (`schedlang.plans.simulate.replay(...,
  record=True)`), one value per op of the plan: the most bytes during the op (`peak`) and the
  bytes once it is done (`after`), plus what the plan does not move (parameters, buffers, the
  step's inputs: `FitModule`'s resident bytes, and a calibration margin if one was added). At
  the loss op the loss's own memory (`loss_fn`'s, measured, or the reserve without one) is
  added to the memory after it, as `fit` predicts the peak. Without a plan (a budget at or
  above plain execution's peak) the prediction is the no-recomputation plan's.
* **measured**: the runtime calls a `Recorder` around every op it executes
  (`PlanExecutor.observer`); after each op the step's `MemoryTracker` gives the most live bytes
  since the previous op (`MemoryTracker.mark()`: CPU, the tracker of live tensor storages;
  CUDA, the allocator's `max_memory_allocated`) and the live bytes now. The plan's loss op is
  the stretch between the last forward op and the first backward op: the loss function and
  the start of autograd's backward, outside the plan. What runs before the first op (the
  tracker opens in `FitModule.forward`) counts in the first op, what runs after the last op
  (autograd returning the input gradients) in the last one, so that the largest per-op peak
  is the step's measured peak. Times: `time.perf_counter` around each op on CPU (the CPU
  tracker's dispatch mode slows every kernel: the times are relative), CUDA events on the
  compute stream and on the transfer channel's side stream on CUDA. Plain execution (no plan)
  and the hook front end (the model's own forward, its blocks wrapped) run the module as it
  is: only the step's peak is measured, not per op.

`Timeline.plot(path)` draws both series over the ops with the budget as a line (matplotlib,
PNG); `Timeline.chrome_trace()` / `write_trace(path)` give a Chrome/Perfetto trace
(``{"traceEvents": [...]}``; open it in https://ui.perfetto.dev or chrome://tracing): one
track per channel (compute, offload, prefetch) with the executed ops, and counter tracks of
the measured and predicted memory; a second process shows the plan's compute ops as the
simulator times them from the profile, to compare with the executed ones.
`schedlang run --plot/--trace` writes both.
"""
from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass, field

from ..language.errors import DataError, Loc, SchedError
from ..language.files import atomic_open, write_file
from ..language.units import format_size
from ..plans.plan import Op, Plan
from ..plans.planners.no_recompute import no_recompute_plan
from ..plans.simulate import replay
from ..plotting import figure as _figure
from ..plotting import size_unit as _size_unit

__all__ = ["CHANNEL_TRACKS", "Recorder", "Timeline", "predicted_series"]

#: trace track (thread id, name) of each op kind: transfers on their channel's track
#: where an error of `Timeline.write_trace` / `Timeline.plot` points (the CLI options)
TRACE_OPTION = Loc("--trace")
PLOT_OPTION = Loc("--plot")
CHANNEL_TRACKS = {"offload": (2, "offload (device -> host)"),
                  "prefetch": (3, "prefetch (host -> device)")}
_COMPUTE_TRACK = (1, "compute")


def op_label(op: Op) -> str:
    """A short name for an op: ``blocks.0.fwd (autograd)``, ``offload blocks.0.out``."""
    if op.op == "compute":
        return op.node if not op.option else f"{op.node} ({op.option})"
    what = op.data if op.data is not None else (f"phantom {op.layer}" if op.layer else "")
    if op.op == "wait":
        return f"wait {op.channel}" + (f" {what}" if what else "")
    frac = "" if op.fraction in (None, 1.0) else f" x{op.fraction:.3g}"
    return f"{op.op} {what}{frac}"


def predicted_series(plan: Plan, graph, offset: int = 0, loss_overhead: int = 0
                     ) -> tuple[list[int], list[int], list[tuple[float, float]]]:
    """(peak, after) bytes per op of `plan` as the simulator replays it on `graph`, plus
    `offset` (resident bytes); at the loss op, `loss_overhead` more on top of the memory after
    it (the loss function's memory, as `fit` predicts the peak). Third: the compute channel's
    (start, end) per op in the graph's time unit (the profile's seconds for a traced model)."""
    out = replay(plan, graph, record=True)
    if out.errors:
        raise SchedError(f"the plan does not replay on graph '{graph.name}': {out.errors[0]}")
    peaks, afters = [], []
    for op, step in zip(plan.ops, out.steps):
        peak = step.peak
        if op.op == "compute" and op.node == "loss":
            peak = max(peak, step.after + loss_overhead)
        peaks.append(peak + offset)
        afters.append(step.after + offset)
    return peaks, afters, [(step.start, step.end) for step in out.steps]


@dataclass
class Timeline:
    """One training step, op by op (see the module docstring). Lists are per op of the plan
    (`labels`); `measured_*` and `start`/`end` (seconds from the step's start) are None for
    plain execution, where only `measured_step_peak` is known."""

    labels: list[str]
    kinds: list[str]  # op kind per op ("compute", "delete", ..., "loss")
    predicted_peak: list[int]
    predicted_after: list[int]
    measured_peak: list[int] | None
    measured_after: list[int] | None
    start: list[float] | None
    end: list[float] | None
    budget_bytes: int | None
    measured_step_peak: int | None
    plain_peak_bytes: int | None = None
    device: str = "cpu"
    plain: bool = False
    title: str = ""
    # the plan's compute channel as the simulator times it from the profile: (start, end) s
    predicted_times: list | None = None
    meta: dict = field(default_factory=dict)

    @property
    def loss_index(self) -> int | None:
        return self.kinds.index("loss") if "loss" in self.kinds else None

    def to_json(self) -> dict:
        return dict(self.__dict__)

    # --- Chrome / Perfetto trace --------------------------------------------------------------
    def chrome_trace(self) -> dict:
        """The step as Chrome trace events (``traceEvents``, microseconds): complete events
        per executed op on the compute, offload and prefetch tracks, and counters of the
        measured and predicted memory (MiB) at each op's start (its peak) and end."""
        pid = 1
        events: list[dict] = [
            {"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
             "args": {"name": f"schedlang step ({self.device})"}}]
        tracks = [_COMPUTE_TRACK] + list(CHANNEL_TRACKS.values())
        for tid, name in tracks:
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                           "args": {"name": name}})
            events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                           "args": {"sort_index": tid}})
        if self.start is None:  # plain execution: no ops were executed by a plan
            return {"traceEvents": events, "displayTimeUnit": "ms",
                    "otherData": self._trace_meta()}
        mib = 2 ** 20
        for k, label in enumerate(self.labels):
            kind = self.kinds[k]
            tid = CHANNEL_TRACKS.get(kind, _COMPUTE_TRACK)[0]
            ts, te = 1e6 * self.start[k], 1e6 * self.end[k]
            args = {"op": k, "measured_peak_bytes": self.measured_peak[k],
                    "measured_after_bytes": self.measured_after[k],
                    "predicted_peak_bytes": self.predicted_peak[k],
                    "predicted_after_bytes": self.predicted_after[k]}
            events.append({"ph": "X", "name": label, "cat": kind, "pid": pid, "tid": tid,
                           "ts": ts, "dur": max(te - ts, 0.0), "args": args})
            for name, peak, after in (("memory measured (MiB)", self.measured_peak[k],
                                       self.measured_after[k]),
                                      ("memory predicted (MiB)", self.predicted_peak[k],
                                       self.predicted_after[k])):
                events.append({"ph": "C", "name": name, "pid": pid, "ts": ts,
                               "args": {"MiB": peak / mib}})
                events.append({"ph": "C", "name": name, "pid": pid, "ts": te,
                               "args": {"MiB": after / mib}})
        if self.predicted_times:  # the plan as profiled: a second process, compute ops
            events.append({"ph": "M", "name": "process_name", "pid": 2, "tid": 0,
                           "args": {"name": "plan as predicted (profile times, simulator)"}})
            events.append({"ph": "M", "name": "thread_name", "pid": 2, "tid": 1,
                           "args": {"name": "compute (predicted)"}})
            for k, (ps, pe) in enumerate(self.predicted_times):
                if self.kinds[k] in ("compute", "loss", "wait") and pe > ps:
                    events.append({"ph": "X", "name": self.labels[k], "cat": "predicted",
                                   "pid": 2, "tid": 1, "ts": 1e6 * ps,
                                   "dur": 1e6 * (pe - ps), "args": {"op": k}})
        if self.budget_bytes is not None:
            for ts in (0.0, 1e6 * self.end[-1]):
                events.append({"ph": "C", "name": "budget (MiB)", "pid": pid, "ts": ts,
                               "args": {"MiB": self.budget_bytes / mib}})
        return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": self._trace_meta()}

    def _trace_meta(self) -> dict:
        return {"budget_bytes": self.budget_bytes, "measured_step_peak": self.measured_step_peak,
                "predicted_peak": max(self.predicted_peak, default=None),
                "plain": self.plain, "device": self.device}

    def write_trace(self, path, loc: Loc = TRACE_OPTION) -> None:
        """Write `chrome_trace()` to `path` as JSON (atomically)."""

        try:
            write_file(path, json.dumps(self.chrome_trace()))
        except DataError as exc:
            raise DataError(exc.message.replace("cannot write ", "cannot write the trace to ",
                                                1), loc) from None

    # --- the plot -------------------------------------------------------------------------------
    def plot(self, path, title: str | None = None, loc: Loc = PLOT_OPTION) -> None:
        """Draw memory over the step's ops (predicted and measured peak per op, the budget)
        to `path` (PNG, matplotlib's Agg backend). Raises `SchedError` when matplotlib is
        missing or `path` cannot be written."""

        fig = _figure(loc)
        fig.set_size_inches(11, 5.5)
        values = list(self.predicted_peak) + [v for v in (self.budget_bytes,
                                                          self.measured_step_peak,
                                                          self.plain_peak_bytes) if v]
        if self.measured_peak:
            values += self.measured_peak
        unit, scale = _size_unit(values)
        ax = fig.subplots()
        n = len(self.labels)
        xs = list(range(n))
        self._shade_phases(ax)
        ax.step(xs, [v / scale for v in self.predicted_peak], where="mid", color="tab:blue",
                linewidth=1.6, label=f"predicted (simulator), peak "
                f"{format_size(max(self.predicted_peak))}", zorder=3)
        if self.measured_peak:
            counter = "allocator" if self.device.startswith("cuda") else "CPU tracker"
            ax.step(xs, [v / scale for v in self.measured_peak], where="mid",
                    color="tab:orange", linewidth=1.2, linestyle="--",
                    label=f"measured ({counter}), peak {format_size(max(self.measured_peak))}",
                    zorder=4)
        elif self.measured_step_peak is not None:
            ax.axhline(self.measured_step_peak / scale, color="tab:orange", linestyle="--",
                       linewidth=1.2, label="measured step peak (the model's own forward "
                       f"ran: not per op) {format_size(self.measured_step_peak)}")
        if self.budget_bytes is not None:
            ax.axhline(self.budget_bytes / scale, color="tab:red", linewidth=1.4,
                       label=f"budget {format_size(self.budget_bytes)}", zorder=2)
        if self.plain_peak_bytes and self.plain_peak_bytes != self.budget_bytes:
            ax.axhline(self.plain_peak_bytes / scale, color="gray", linestyle=":",
                       linewidth=1.2, label="plain execution's peak (predicted) "
                       f"{format_size(self.plain_peak_bytes)}")
        self._transfers(ax)
        self._ticks(ax)
        ax.set_xlim(-0.5, n - 0.5)
        ax.set_ylim(bottom=0, top=1.3 * max(values) / scale)
        ax.set_ylabel(f"memory ({unit})")
        ax.set_xlabel("op of the plan (computes labelled; shaded: forward | loss | backward)")
        ax.set_title(title if title is not None else self.title, fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, 0.93), ncol=2,
                  framealpha=0.9)
        fig.tight_layout()
        try:
            with atomic_open(path, "wb") as f:
                fig.savefig(f, format="png")
        except DataError as exc:
            raise DataError(exc.message.replace("cannot write ", "cannot write the plot to ",
                                                1), loc) from None

    def _shade_phases(self, ax) -> None:
        loss = self.loss_index
        if loss is None:
            return
        n = len(self.labels)
        ax.axvspan(-0.5, loss - 0.5, color="tab:green", alpha=0.06, lw=0)
        ax.axvspan(loss - 0.5, loss + 0.5, color="tab:purple", alpha=0.15, lw=0)
        ax.axvspan(loss + 0.5, n - 0.5, color="tab:gray", alpha=0.06, lw=0)
        import matplotlib.transforms as mtransforms

        trans = mtransforms.blended_transform_factory(ax.transData, ax.transAxes)
        for x, text in (((loss - 0.5) / 2, "forward"), (loss, "loss"),
                        ((loss + n - 0.5) / 2, "backward")):
            ax.text(x, 0.98, text, transform=trans, ha="center", va="top", fontsize=9,
                    color="dimgray")

    def _transfers(self, ax) -> None:
        """Mark the offload and prefetch ops along the bottom of the axes."""
        import matplotlib.transforms as mtransforms

        trans = mtransforms.blended_transform_factory(ax.transData, ax.transAxes)
        for kind, marker, color in (("offload", "v", "tab:brown"), ("prefetch", "^", "tab:cyan")):
            at = [k for k, kd in enumerate(self.kinds) if kd == kind]
            if at:
                ax.plot(at, [0.025] * len(at), marker, color=color, markersize=5,
                        transform=trans, linestyle="none", zorder=5,
                        label=f"{kind} op ({len(at)})")

    def _ticks(self, ax, most: int = 36) -> None:
        """Label the compute ops (layer names), at most `most` of them, evenly."""
        at = [k for k, kind in enumerate(self.kinds) if kind in ("compute", "loss")]
        if len(at) > most:
            step = -(-len(at) // most)
            at = at[::step]
        names = []
        for k in at:
            label = self.labels[k]
            names.append(label if len(label) <= 34 else label[:31] + "...")
        ax.set_xticks(at)
        ax.set_xticklabels(names, rotation=60, ha="right", fontsize=7)
        ax.tick_params(axis="x", length=3)


# --- recording ---------------------------------------------------------------------------------
class Recorder:
    """Times and measures the ops a `FitModule`'s plan executes, one training step at a time
    (the runtime's `PlanExecutor.observer`). `FitModule` calls `begin` when it opens the
    step's memory tracker and `end` before it closes it; `last` is the latest `Timeline`."""

    def __init__(self) -> None:
        self.last: Timeline | None = None
        self._cache: tuple | None = None  # (plan, offset, series) of the latest prediction
        self._fm = None
        self._tracker = None
        self._executor = None
        self._rows: list = []
        self._k = 0
        self._loss_at = -1
        self._t0 = 0.0
        self._cuda = False
        self._base = None

    # FitModule's hooks
    def begin(self, fm, tracker) -> None:
        self._fm, self._tracker = fm, tracker
        self._executor = fm.plan_executor
        self._rows, self._k = [], 0
        self._cuda = tracker.cuda
        if self._executor is not None:
            self._executor.observer = self
            self._loss_at = len(self._executor.forward_ops)
        if self._cuda:
            import torch

            self._base = torch.cuda.Event(enable_timing=True)
            self._base.record()
        self._t0 = time.perf_counter()

    def end(self, fm, tracker) -> None:
        if self._executor is not None:
            self._executor.observer = None
            if self._rows:  # after the last op: autograd hands back the input gradients
                peak, after = tracker.mark()
                row = self._rows[-1]
                row[3], row[4] = max(row[3], peak), after
        self.last = self._build(fm, tracker)
        self._fm = self._tracker = self._executor = None

    # the runtime's hook
    @contextlib.contextmanager
    def op(self, executor, op: Op):
        if self._k == self._loss_at:  # the loss ran between the forward and this op
            start = self._rows[-1][2] if self._rows else self._now(None)
            peak, after = self._tracker.mark()
            self._rows.append([self._k, start, self._now(None), peak, after])
            self._k += 1
        stream = self._stream(executor, op)
        start = self._now(stream)
        yield
        end = self._now(stream)
        peak, after = self._tracker.mark()
        self._rows.append([self._k, start, end, peak, after])
        self._k += 1

    def _stream(self, executor, op: Op):
        """CUDA: the side stream a transfer op copies on (ordered after the compute stream,
        as the runtime's copy will be), else None (the compute stream)."""
        if not self._cuda or op.op not in ("offload", "prefetch"):
            return None
        import torch

        streams = executor._side_streams()
        stream = streams[0 if op.op == "offload" else 1]
        stream.wait_stream(torch.cuda.current_stream(executor.device))
        return stream

    def _now(self, stream):
        if not self._cuda:
            return time.perf_counter() - self._t0
        import torch

        ev = torch.cuda.Event(enable_timing=True)
        ev.record(stream) if stream is not None else ev.record()
        return ev

    def _seconds(self, t) -> float:
        return t if isinstance(t, float) else self._base.elapsed_time(t) / 1e3

    def _build(self, fm, tracker) -> Timeline:
        prep = fm._prep
        plan = fm.plan
        if plan is None:

            plan = no_recompute_plan(prep.graph)
            offset = prep.resident_bytes - prep.executor_bytes  # no executor runs
        else:
            offset = prep.resident_bytes + fm._margin
        cached = self._cache
        if cached is None or cached[0] is not plan or cached[1] != offset:
            series = predicted_series(plan, prep.graph, offset, prep.loss_overhead)
            self._cache = cached = (plan, offset, series)
        peaks, afters, ptimes = cached[2]
        kinds = ["loss" if op.op == "compute" and op.node == "loss" else op.op
                 for op in plan.ops]
        labels = ["loss" if kind == "loss"
                  else op_label(op) for op, kind in zip(plan.ops, kinds)]
        measured = None
        rows = self._rows
        if fm.plan is not None and len(rows) == len(plan.ops):
            if self._cuda:
                import torch

                torch.cuda.synchronize(tracker.device)
            measured = rows
        step_peak = max(tracker.peak, max((r[3] for r in rows), default=0))
        name = type(fm.module).__name__
        title = (f"{name}: memory over one training step on {tracker.device}"
                 + (" (plain execution)" if fm.plan is None else
                    f", plan of {len(plan.ops)} ops"))
        return Timeline(
            labels=labels, kinds=kinds, predicted_peak=peaks, predicted_after=afters,
            measured_peak=None if measured is None else [r[3] for r in measured],
            measured_after=None if measured is None else [r[4] for r in measured],
            start=None if measured is None else [self._seconds(r[1]) for r in measured],
            end=None if measured is None else [self._seconds(r[2]) for r in measured],
            budget_bytes=fm._budget, measured_step_peak=step_peak,
            plain_peak_bytes=prep.plain_peak, device=str(tracker.device),
            plain=fm.plan is None, title=title, predicted_times=ptimes,
            meta={"resident_bytes": prep.resident_bytes, "margin_bytes": fm._margin,
                  "loss_bytes": prep.loss_overhead, "loss_assumed": prep.loss_assumed})
