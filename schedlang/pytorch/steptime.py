"""The plan's time overhead as `fit` measures it before returning: training steps of the
fitted module and of plain execution, in pairs, on the sample inputs.

The time model prices each block's options from timings taken in whole steps
(`frontends/blocks/in_context.py`) or layer by layer (`profile.py`); it chooses the plan well,
but what one process measures for the whole plan can differ from the sum of its parts by more
than the noise (a run whose recomputation costs a fifth less than its profile said). So the
overhead `memory_report()` states is measured, not summed:

* a *round* runs one training step of each (forward, the loss, backward: the loop `fit`
  plans for), plain execution with every block unwrapped (`BlockWrappers.plain`) and the plan,
  next to each other, in alternating order: load that slows a round slows both;
* the sample is the ratio of the two steps of a round; rounds go on until the median's
  standard error (`median_error`) is within `PRECISION` of a step (`MIN_ROUNDS` ..
  `MAX_ROUNDS`, `MAX_SECONDS` at most past the first), after `WARM_ROUNDS` dropped;
* steps are timed with the profile's clock (`profile.host_clock`: the thread's CPU time with
  one intra-op thread), on CUDA wall time once the device is done;
* gradients, buffers and the RNG state are restored afterwards (`model_state.preserved`), the
  peak tracker is off (it is a dispatch mode: it would slow the plan's steps).

A plan the module takes later (the re-plan after a step measured over its prediction, as the
optimizer's state appears) is timed the same way when it is made, on that step's inputs
(`FitModule._recalibrate`): the time model's error differs from plan to plan, and one process
from another, so a figure measured for one plan says little of another.
"""
from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from ..plans.plan import Plan
from .frontends.blocks.hooked import BlockWrappers
from .model_state import preserved
from .profile import host_clock
from .tensors import backward_with_ones, fresh_leaves

__all__ = ["TimedOverhead", "time_overhead", "overhead_of", "median_error",
           "time_until_precise", "MIN_ROUNDS", "MAX_ROUNDS", "MAX_SECONDS", "WARM_ROUNDS",
           "PRECISION"]

log = logging.getLogger("schedlang.pytorch")

#: paired rounds timed at least, and at most while the median is not yet precise
MIN_ROUNDS = 7
MAX_ROUNDS = 81
#: ... and seconds of timing at most (a large model's steps: the rounds taken by then)
MAX_SECONDS = 20.0
#: rounds run first and dropped (caches, the allocator, lazy initialisation)
WARM_ROUNDS = 2
#: rounds go on until the median ratio's standard error is within this share of a step (half
#: a percent: on a +25% overhead, 2% of it, well within the +-15% a prediction is held to)
PRECISION = 0.005


def median_error(samples: list[float]) -> float:
    """The standard error of the median of `samples`, estimated from their median absolute
    deviation (robust to the outliers a loaded machine makes): 1.2533 sigma / sqrt(n), sigma
    taken as 1.4826 MAD; infinite below three samples."""
    if len(samples) < 3:
        return math.inf
    mid = statistics.median(samples)
    mad = statistics.median(abs(s - mid) for s in samples)
    return 1.2533 * 1.4826 * mad / math.sqrt(len(samples))


@dataclass(frozen=True)
class TimedOverhead:
    """What `fit` measured of one plan: the median over `rounds` of (the plan's step / plain
    execution's step) - 1, and what the time model predicted for the same plan."""

    plan: Plan
    measured: float
    modelled: float
    rounds: int
    error: float  # the median's standard error (`median_error`)

    @property
    def settled(self) -> bool:
        """The median is as precise as `fit` asks (`PRECISION`)."""
        return self.error <= PRECISION

    @property
    def usable(self) -> bool:
        """The measurement says something: a plan that recomputes measured no faster than plain
        execution (below that, the noise is all the measurement resolved)."""
        return self.measured > 0 or self.modelled <= 0

    def to_json(self) -> dict:
        return {"measured": self.measured, "modelled": self.modelled, "rounds": self.rounds,
                "error": self.error, "settled": self.settled}


def overhead_of(plan: Plan | None, modelled: float,
                timed: TimedOverhead | None) -> tuple[float, str]:
    """(the overhead to state for `plan`, whose time model predicts `modelled`, how it was
    found: "timed" or "modelled") given what `fit` timed (`timed`, or None)."""
    if plan is not None and timed is not None and timed.plan is plan and timed.usable:
        return timed.measured, "timed"
    return modelled, "modelled"


def time_overhead(fm, args: tuple, kwargs: dict, loss_fn, modelled: float,
                  min_rounds: int = MIN_ROUNDS, max_rounds: int = MAX_ROUNDS,
                  precision: float = PRECISION,
                  max_seconds: float = MAX_SECONDS) -> TimedOverhead | None:
    """Time `fm`'s plan against plain execution of its model (see the module docstring);
    `modelled`: the time model's overhead of that plan. None when no step could be timed (a
    clock that did not move, plain execution out of the device's memory)."""
    model: nn.Module = fm.module
    prep = fm._prep
    cuda = any(p.device.type == "cuda" for p in model.parameters())
    clock = time.perf_counter if cuda else host_clock()
    held = prep.outputs_held
    ratios: list[float] = []
    order = [0]  # rounds run: even ones run the plan first, odd ones plain execution

    def step(run) -> float:
        for p in model.parameters():
            p.grad = None
        ins_args, ins_kwargs = fresh_leaves((args, kwargs))
        if cuda:
            torch.cuda.synchronize()
        t0 = clock()
        _train_step(run, ins_args, ins_kwargs, loss_fn, held)
        if cuda:
            torch.cuda.synchronize()
        return clock() - t0

    def plain_step() -> float:
        with BlockWrappers.plain(model):
            return step(model)

    def one_round(keep: bool = True) -> None:
        fm.ensure_plan()
        order[0] += 1
        if order[0] % 2:
            plain, planned = plain_step(), step(fm._call)
        else:
            planned, plain = step(fm._call), plain_step()
        if keep and plain > 0:
            ratios.append(planned / plain)

    try:
        with preserved(model):
            for _ in range(WARM_ROUNDS):
                one_round(keep=False)
            time_until_precise(one_round, ratios, min_rounds, max_rounds, precision,
                               deadline=time.perf_counter() + max_seconds)
            for p in model.parameters():
                p.grad = None
    except torch.OutOfMemoryError:  # plain execution does not fit the device: the plan's reason
        log.info("schedlang fit: plain execution runs out of device memory: the plan's "
                 "overhead is the time model's")
        ratios.clear()
        if cuda:
            torch.cuda.empty_cache()
    if not ratios:
        return None
    return TimedOverhead(fm.plan, statistics.median(ratios) - 1, modelled, len(ratios),
                         median_error(ratios))


def time_until_precise(take_round: Callable[[], None], samples: list[float], min_rounds: int,
                       max_rounds: int, precision: float, deadline: float = math.inf) -> None:
    """Call `take_round()` (one more sample appended to `samples`) until `samples` holds at
    least `min_rounds` and its median's standard error is within `precision`, or it holds
    `max_rounds`, or (past `min_rounds`) `time.perf_counter()` is past `deadline`. A loaded
    machine's outliers widen the spread, and more rounds are taken."""
    while len(samples) < max_rounds and (len(samples) < min_rounds or (
            median_error(samples) > precision and time.perf_counter() < deadline)):
        taken = len(samples)
        take_round()
        if len(samples) == taken:  # a round that gave no sample (a step too short to time)
            break


def _train_step(run, args: tuple, kwargs: dict, loss_fn, outputs_held: bool) -> None:
    """One training step through `run`: forward, the loss (`loss_fn`, else a gradient of ones
    for each floating output), backward; the outputs held through it unless `outputs_held`
    is False (the loop `fit` planned for)."""
    out = run(*args, **kwargs)
    if loss_fn is not None:
        loss = loss_fn(out)
        if not outputs_held:
            out = None
        loss.backward()
        return
    backward_with_ones(out)
