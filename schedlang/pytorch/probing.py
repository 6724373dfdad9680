"""Probing and calibration: measured steps that check a plan before `fit` returns it
(`probe_step`, `probe_until_within`), plain execution's measured peak, generated options
where the fixed ones cannot meet a budget, and on CUDA the faster of two measured plans."""
from __future__ import annotations

import dataclasses
import logging
import time

import torch
from torch import nn

from .. import progress
from ..language.units import format_size
from . import distributed
from .distributed import fsdp_storages, is_fsdp
from .fitmodule import FitModule
from .frontends.blocks.hooked import BlockWrappers
from .memory import MemoryTracker
from .model_state import preserved
from .options import OPS_PREFIX, add_generated_options
from .planning import FitError, fastest_group_plan, groups_run, solve_or_raise
from .prepare import Prepared, prepare
from .tensors import backward_with_ones, flat, fresh_leaves
from .trace import to_graph

__all__ = ["probe_step", "probe_until_within", "plain_measured_peak", "with_generated_options",
           "can_generate", "faster_measured", "faster_of_near_plans", "PROBES", "TIMED_STEPS"]

log = logging.getLogger("schedlang.pytorch")


def plain_measured_peak(model: nn.Module, prep: Prepared, args: tuple, kwargs: dict,
                        loss_fn) -> int:
    """Plain execution's peak measured in one eager step on the samples (`probe_step`), once
    per `prep`, or its prediction where ranks must agree (distributed, FSDP). The graph frees a
    layer's internals when its backward node ends, autograd op by op, so plain execution can
    measure below its prediction (the fx U-Net: 7%): a budget it meets then gets plain
    execution, the fastest step, not a plan that recomputes and measures more."""

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


def can_generate(prep: Prepared) -> bool:
    """Whether `with_generated_options` applies: fx layers from a trace whose profile is at
    hand, without generated options yet, on one process, not FSDP-sharded."""

    info = getattr(prep.graph, "trace_info", None) or prep.info
    return (prep.front is not None and prep.front.generated_options and prep.fsdp is None
            and not distributed.active() and getattr(info, "profiled", None) is not None
            and not any(o.name.startswith(OPS_PREFIX) for lay in prep.graph.layers
                        for o in lay.options))


def with_generated_options(model: nn.Module, prep: Prepared, args: tuple, kwargs: dict,
                           loss_fn, why: str, **generate) -> Prepared:
    """`prep` with generated layer options added to every layer
    (`options.add_generated_options` on its profile, with the arguments `generate`: op-level
    solves, cached per layer structure), logged with `why`."""

    info = getattr(prep.graph, "trace_info", None) or prep.info
    profiled = info.profiled
    t0 = time.perf_counter()
    if not any(o.name.startswith(OPS_PREFIX) for lp in profiled.layers for o in lp.options):
        add_generated_options(profiled, **generate)
    graph = to_graph(profiled, name=prep.graph.name, title=getattr(prep.graph, "title", None))
    new = prepare(model, args, graph=graph, loss_fn=loss_fn, frontend=prep.frontend,
                  sample_kwargs=kwargs or None, outputs_held=prep.outputs_held)
    seconds = time.perf_counter() - t0
    count = sum(1 for lay in new.graph.layers for o in lay.options
                if o.name.startswith(OPS_PREFIX))
    log.info("schedlang fit: %s; generated %d layer options from op-level solves in %.1f s",
             why, count, seconds)
    return dataclasses.replace(new, generated={"options": count, "seconds": seconds,
                                               "why": why})


#: timed steps (after one warm-up) per plan when `fit` measures an offloading plan against
#: recomputation alone (CUDA)
TIMED_STEPS = 3


def faster_measured(fm: FitModule, other: tuple, args, kwargs, loss_fn, want: int,
                     step_seconds=None, **probe_args) -> FitModule:
    """`fm` (an offloading plan, predicted faster) or the recompute-only plan `other`
    (preparation, plan), whichever measures the faster step (`step_seconds(fitted)`, default
    the median of `TIMED_STEPS` probe steps on CUDA); the recompute-only plan is probed first,
    and out of the race if it cannot meet the budget. Both times go in the report."""
    prep, plan = other
    alt = FitModule(fm.module, prep, plan, want, fm.measure, fm._solve_s,
                    calibrate=fm._calibrate, solve_args=fm._solve_args)
    try:
        probe_until_within(alt, args, kwargs, loss_fn, want, **probe_args)
    except FitError:
        alt.unwrap()
        fm.ensure_plan()
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
    keep.ensure_plan()
    return keep


def _cuda_step_seconds(fm: FitModule, args, kwargs, loss_fn) -> float:
    """The median time of `TIMED_STEPS` probe steps of `fm` (after a warm-up), on CUDA."""
    import statistics

    times = []
    for k in range(TIMED_STEPS + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        _probe(fm, args, kwargs, loss_fn)
        torch.cuda.synchronize()
        if k:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


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
    run = model if run is None else run
    with preserved(model) as kept:
        for p in model.parameters():
            p.grad = None
        args, kwargs = fresh_leaves((args, kwargs))  # the samples' own .grad stays as it is
        inputs = [t for t in flat((args, kwargs)) if isinstance(t, torch.Tensor)]

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
                backward_with_ones(out)
            out = None
            peak = mt.peak
    if loss_fn is None:
        peak = max(peak, after + output_bytes + loss_reserve)
    return peak


def _probe(fm: FitModule, args, kwargs, loss_fn) -> int:
    """One probe step of `fm`'s plan (`probe_step`): its measured peak."""
    prep = fm._prep
    return probe_step(fm.module, args, kwargs, loss_fn,
                      prep.loss_overhead if prep.loss_assumed else 0, prep.output_bytes,
                      run=fm._call, outputs_held=prep.outputs_held)


def probe_until_within(fm: FitModule, args, kwargs, loss_fn, want: int, solver, time_limit,
                        backend, extra: dict) -> None:
    """Run probe steps; while one measures over the budget, plan again with the excess over
    the prediction as a margin (see `fit`)."""
    prep = fm._prep
    measured = None
    for _ in range(PROBES):
        measured = _probe(fm, args, kwargs, loss_fn)
        predicted = fm.predicted_peak()
        fm._probes.append({"measured": measured, "predicted": predicted,
                           "plan": fm.plan is not None})
        progress.note("probe step", f"{len(fm._probes)} measured {format_size(measured)}, "
                                    f"predicted {format_size(predicted)}, budget "
                                    f"{format_size(want)}")
        if measured <= want:
            if measured > predicted and prep.front.replans_on_probe_excess:
                fm._margin += measured - predicted  # the prediction is the measurement
            return
        margin = fm._margin + measured - predicted
        log.info("schedlang fit: the probe step measured %s over the budget %s (predicted %s): "
                 "planning with a margin of %s", format_size(measured), format_size(want),
                 format_size(predicted), format_size(margin))
        found, _ = solve_or_raise(prep, want, margin, solver, time_limit, backend, extra,
                                   f" (a probe step measured {format_size(measured)}, "
                                   f"{format_size(margin)} over the prediction; it counts "
                                   "every tensor alive on the device, as CUDA does: another "
                                   "model or tensors kept beside this one count too)")
        fm._margin = margin
        fm._set_plan(found)
    raise FitError(f"no plan fits the budget {format_size(want)} ({want} B): after {PROBES} "
                   f"probe steps the step still measures {format_size(measured)}")


#: a plan of the group family whose predicted step is within this share of `fit`'s plan's is
#: timed too, and the faster as measured is kept: the time model ranks plans this close by
#: less than its error (ELECTRA at checkpoint_sequential(2)'s measured peak: the solver's plan
#: predicted 20 us faster than that schedule, both +35.0%, measured +41.8% against +35%;
#: bench/README.md)
NEAR_SHARE = 0.05
#: ... kept only when it measures faster by this share of a plain step at least, and by twice
#: the two medians' standard errors (plans that are truly equal must not flip from run to run)
NEAR_MIN_GAIN = 0.01


def faster_of_near_plans(fm: FitModule, args, kwargs, loss_fn, want: int, probe: bool,
                         time_plan) -> FitModule:
    """`fm` with the plan of the group family (`planning.fastest_group_plan`) that fits its
    activation budget, when that plan's predicted step is within `NEAR_SHARE` of fm's plan's
    and it measures faster, or no slower within the noise at a lower predicted peak
    (`time_plan(fm)`: a `steptime.TimedOverhead` of fm's current plan;
    a probe step first where `probe`: over the budget, out of the race); else `fm` as it
    was. `fm`'s plan must have been timed (`fm._timed`)."""
    prep, plan, timed = fm._prep, fm.plan, fm._timed
    if plan is None or timed is None or not timed.usable or not groups_run(prep):
        return fm
    rival = fastest_group_plan(prep, want - prep.resident_bytes - fm._margin)
    if rival is None or rival is plan or rival.ops == plan.ops or \
            rival.predicted_time > plan.predicted_time * (1 + NEAR_SHARE):
        return fm
    margin = fm._margin
    fm._set_plan(rival)
    if probe:
        measured = _probe(fm, args, kwargs, loss_fn)
        predicted = int(rival.predicted_peak) + prep.resident_bytes
        fm._probes.append({"measured": measured, "predicted": predicted, "plan": True,
                           "rival": True})
        if measured > want:
            fm._raced = _race(rival, None, timed, False, over_budget=True)
            fm._set_plan(plan)
            return fm
        fm._margin = max(0, measured - predicted)  # as `probe_until_within` keeps it
    other = time_plan(fm)
    noise = 2 * (timed.error ** 2 + other.error ** 2) ** 0.5 if other is not None else 0.0
    usable = other is not None and other.usable
    faster = usable and other.measured <= timed.measured - max(noise, NEAR_MIN_GAIN)
    # of two plans the measurement cannot tell apart, the one with the lower peak: the same
    # step in less memory (GPT-2 and ViT at a budget above checkpoint_sequential(2)'s peak:
    # fit's plan, 1.5-4.9 MiB higher, measured as that schedule, within 0.4-1.3% of a step)
    peaks = (rival.predicted_peak, plan.predicted_peak)
    leaner = usable and None not in peaks and peaks[0] < peaks[1] and \
        other.measured <= timed.measured + noise
    taken = faster or leaner
    fm._raced = _race(rival, other, timed, taken, leaner=leaner and not faster)
    if not taken:
        log.info("schedlang fit: %s measured %s a step, the plan %+.1f%%: the plan stays",
                 rival.meta.get("planner"), "nothing" if other is None else
                 f"{100 * other.measured:+.1f}%", 100 * timed.measured)
        fm._set_plan(plan)
        fm._margin = margin
        return fm
    assert other is not None
    log.info("schedlang fit: %s measured %+.1f%% a step, the solver's plan %+.1f%% (both "
             "predicted within %.0f%%): %s is kept", rival.meta.get("planner"),
             100 * other.measured, 100 * timed.measured, 100 * NEAR_SHARE,
             "the faster" if faster else "the one with the lower peak")
    fm._timed = other
    return fm


def _race(rival, other, timed, taken: bool, over_budget: bool = False,
          leaner: bool = False) -> dict:
    """What `memory_report()` says of a race between near plans (`leaner`: taken as no
    slower within the noise, at a lower peak)."""
    return {"rival": rival.meta.get("planner", "a group plan"), "near": NEAR_SHARE,
            "rival_measured": None if other is None else other.measured,
            "plan_measured": timed.measured, "taken": taken, "over_budget": over_budget,
            "leaner": leaner}
