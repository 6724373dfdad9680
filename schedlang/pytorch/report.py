"""What `FitModule.memory_report()` returns: the budget, the predicted and measured peaks,
the plan's time overhead, and how the plan was made (front end, probes, host link...)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..language.units import format_size
from .prepare import LOSS_RESERVE, LOSS_SCALAR_BYTES

__all__ = ["MemoryReport", "link_line", "timing_line"]


@dataclass
class MemoryReport:
    budget_bytes: int | None
    predicted_peak_bytes: int
    measured_peak_bytes: int | None
    plain_peak_bytes: int  # predicted peak without recomputation
    resident_bytes: int
    plan_time_overhead: float  # the step's time over plain execution's, less one: see below
    plain: bool  # plain execution (no plan)
    measured_step_s: float | None = None
    solve_s: float | None = None
    extra: dict = field(default_factory=dict)
    loss_bytes: int = 0  # memory of the loss beyond the outputs' gradients (in the prediction)
    loss_assumed: bool = False  # no loss_fn: `loss_bytes` is a reserve, not a measurement
    calibrated: dict | None = None  # the re-plan after a measured step over the prediction
    #: how `plan_time_overhead` was found: "timed" (fit timed this plan against plain
    #: execution: `timed`) or "modelled" (the time model alone)
    overhead_source: str = "modelled"
    modelled_time_overhead: float | None = None  # the time model's overhead of this plan
    timed: dict | None = None  # what fit timed (`steptime.TimedOverhead.to_json`)

    def to_json(self) -> dict:
        return {k: v for k, v in self.__dict__.items()}

    def __str__(self) -> str:
        lines = [f"budget          {_fmt(self.budget_bytes)}",
                 f"predicted peak  {_fmt(self.predicted_peak_bytes)}"
                 f"  (plain execution: {_fmt(self.plain_peak_bytes)}, resident "
                 f"{_fmt(self.resident_bytes)})",
                 f"measured peak   {_fmt(self.measured_peak_bytes)}",
                 f"time overhead   {100 * self.plan_time_overhead:+.1f}% "
                 + ("plain execution" if self.plain else f"({self._overhead_how()})")]
        if self.loss_assumed:
            lines.append(f"loss            {_fmt(self.loss_bytes)} reserved (no loss_fn given: "
                         f"{LOSS_RESERVE} x the outputs, as a cross-entropy takes, "
                         f"+ {_fmt(LOSS_SCALAR_BYTES)})")
        elif self.loss_bytes:
            lines.append(f"loss            {_fmt(self.loss_bytes)} (measured on loss_fn)")
        fe = self.extra.get("frontend")
        if fe == "blocks":
            probes = self.extra.get("probes") or []
            probed = f"; probe step measured {_fmt(probes[-1]['measured'])}" if probes else ""
            lines.append("front end       blocks (hooks; the model's own forward runs, its blocks "
                         "wrapped in place)" + probed)
        elif fe == "fx":
            lines.append("front end       fx (torch.fx layers, run by the plan executor)")
        timing = self.extra.get("timing")
        if timing:
            lines.append("timing          " + timing_line(timing))
        gen = self.extra.get("generated")
        if gen:
            lines.append(f"layer options   {gen['options']} generated from op-level solves in "
                         f"{gen['seconds']:.1f} s ({gen['why']})")
        link = self.extra.get("host_link")
        if link:
            lines.append("host link       " + link_line(link))
        if self.extra.get("outputs_held") is False:
            lines.append("outputs         released once the loss is computed (the plan is for "
                         "loss_fn(model(x)).backward())")
        raced = self.extra.get("raced")
        if raced:
            if raced["over_budget"]:
                how = "measured over the budget in its probe step"
            elif raced["rival_measured"] is None:
                how = "could not be timed"
            else:
                how = (f"measured {100 * raced['rival_measured']:+.1f}% against the plan's "
                       f"{100 * raced['plan_measured']:+.1f}%")
            lines.append(f"raced           {raced['rival']} (predicted within "
                         f"{100 * raced['near']:.0f}% of the plan) {how}: "
                         + ("taken" if raced["taken"] else "not taken")
                         + (" (as fast within the noise, at a lower peak)"
                            if raced.get("leaner") else ""))
        if self.extra.get("fallback"):
            lines.append(f"fallback        plain PyTorch: {self.extra['fallback']}")
        if self.calibrated:
            c = self.calibrated
            lines.append(f"calibrated      step measured {_fmt(c['measured'])} over the "
                         f"prediction {_fmt(c['predicted'])}: re-planned with a margin of "
                         f"{_fmt(c['margin'])}" + ("" if c["replanned"] else " (no plan fits)"))
        return "\n".join(lines)

    def _overhead_how(self) -> str:
        """Where the time overhead comes from, for `__str__`."""
        t, model = self.timed, self.modelled_time_overhead
        model_s = "" if model is None else f"{100 * model:+.1f}%"
        if self.overhead_source == "timed" and t:
            return (f"timed by fit: median of {t['rounds']} steps paired with plain "
                    f"execution's, +-{100 * t['error']:.1f}% of a step; the time model "
                    f"predicted {model_s}")
        if t and t.get("this_plan"):
            return (f"predicted by the time model; fit timed the plan at "
                    f"{100 * t['measured']:+.1f}%, which the noise of its steps cannot tell "
                    f"from plain execution")
        if t:
            return (f"predicted by the time model; fit timed an earlier plan at "
                    f"{100 * t['measured']:+.1f}% (predicted {100 * t['modelled']:+.1f}%)")
        return "predicted by the time model"


def timing_line(timing: dict) -> str:
    """The timing line of `MemoryReport.__str__`: the intra-op threads the times were taken
    with (times hold for that count), and how."""
    n = timing.get("threads")
    threads = f"{n} intra-op thread{'' if n == 1 else 's'}" if n else "threads unknown"
    if timing.get("in_context"):
        how = (f"blocks timed in whole steps as the plan runs them (medians of "
               f"{timing.get('rounds')} steps per option)")
    else:
        how = "layers timed alone (medians of repeats)"
    if timing.get("malloc_held"):  # schedlang.pytorch.host_malloc
        how += "; glibc's malloc keeps freed memory for the next step"
    return f"{threads}; {how}"


def link_line(link: dict) -> str:
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
