"""The hook front end's times measured *in context*: whole training steps of the model, its
blocks wrapped as a plan runs them, each block's forward and backward timed by module hooks.

The layer profile (`schedlang.pytorch.profile`) times each block alone, on detached inputs,
a few runs each: it misses what the wrappers add (`torch.utils.checkpoint`'s machinery, the
RNG state saved and restored, the policy's dispatch), what the glue costs in a real step (the
recording run timed it once, cold, under hooks, and guessed its backward as twice its
forward), and it is noisy on a loaded CPU. Here:

* a *round* runs one training step per configuration: every block under its option number
  ``k`` (its ``autograd``, ``recompute``, ``selective``, then its generated options; a block
  with fewer options runs ``autograd``). Configurations interleave, so that load hits every
  option alike; the first round warms up and is dropped.
* per step, module hooks stamp each block's forward (pre-hook to hook) and backward (torch's
  full backward pre-hook: its outputs' gradients are ready; full backward hook: its inputs'
  gradients are computed) with the profile's clock (`profile.host_clock`: the thread's CPU
  time with one intra-op thread; on CUDA, wall time once the device is done). A
  recomputation runs inside the backward: it is part of the block's backward, as the solver
  prices it. The glue is the rest of the step: forward and backward totals, less the blocks.
* each sample is kept as a share of the same round's plain step (configuration 0, run first
  in each round), and scaled back by that step's median at the end: load that slows a whole
  round cancels out.
* rounds go on (`min_rounds` .. `max_rounds`) until every median is *settled*
  (`settled`): its samples' median absolute deviation within `tol` of the median, so an
  outlier (a step the machine's load slowed) is timed again rather than averaged in.
* blocks that the profile measured as one (same signature, `LayerProfile.measured_as`) pool
  their samples: identical blocks get identical times, and the solver's choice among them
  does not depend on noise.

A block none of whose positional tensor arguments needs a gradient (the first block fed the
input, a block called with keyword arguments only) has no full backward hook call at its end:
its backward ends with the last gradient accumulated into its parameters. `time_in_context`
returns the medians (`ContextTimes`), or None when a step cannot be timed so (such a block
without parameters; a model that changes a block's output in place), and the profile's times
stand.
"""
from __future__ import annotations

import logging
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from .... import progress
from ...model_state import gradients_set_aside, preserved
from ...profile import host_clock
from ...tensors import flat, model_device
from .find import FoundBlocks
from .offload import OFFLOAD
from .rerun import RERUN

__all__ = ["ContextTimes", "settled", "sample_until_settled", "all_settled", "time_in_context",
           "configurations", "timed_in_context", "apply_times", "glue_times", "DEFAULT_TOL"]

log = logging.getLogger("schedlang.pytorch")

#: a median is settled when its samples' median absolute deviation is within this share of it
DEFAULT_TOL = 0.05
#: the samples' key of the whole step with every block plain
STEP_KEY = (0, "step", "")
#: ... and of the glue's forward and backward
GLUE_KEYS = ((0, "glue", "fwd"), (0, "glue", "bwd"))


def settled(samples: list[float], tol: float = DEFAULT_TOL) -> bool:
    """Whether the median of `samples` is one to trust: at least three samples, and their
    median absolute deviation at most `tol` times the median (a few outliers do not move a
    median; a spread that does is timed again)."""
    if len(samples) < 3:
        return False
    mid = statistics.median(samples)
    mad = statistics.median(abs(s - mid) for s in samples)
    return mad <= tol * abs(mid)


class _Untimeable(Exception):
    """A step whose blocks the hooks cannot time (`_record`)."""


def sample_until_settled(take_round: Callable[[], None], samples: dict, *, min_rounds: int,
                         max_rounds: int, tol: float = DEFAULT_TOL, of_step=()) -> int:
    """Call `take_round()` (one more sample appended to each list of `samples`) at least
    `min_rounds` and at most `max_rounds` times, until `all_settled(samples, tol, of_step)`.
    Returns the rounds taken. An outlier (a step the machine's load slowed) does not move a
    median: a spread that does is timed again rather than averaged in."""
    rounds = 0
    while rounds < max_rounds:
        take_round()
        rounds += 1
        if rounds >= min_rounds and all_settled(samples, tol, of_step):
            break
    return rounds


def all_settled(samples: dict, tol: float = DEFAULT_TOL, of_step=()) -> bool:
    """Every list of `samples` `settled`; those whose keys are in `of_step` (shares of the
    whole step, small beside it: the glue, a difference of totals) when their median absolute
    deviation is within `tol` of the step."""
    for key, v in samples.items():
        if key in of_step:
            mid = statistics.median(v)
            if len(v) < 3 or statistics.median(abs(s - mid) for s in v) > tol:
                return False
        elif not settled(v, tol):
            return False
    return True


@dataclass
class ContextTimes:
    """Medians of what whole steps measured: per block and option, (forward, backward)
    seconds; the glue's forward and backward totals; how they were taken."""

    blocks: dict[str, dict[str, tuple[float, float]]]
    glue_fwd: float
    glue_bwd: float
    threads: int
    rounds: int
    plain_step: float  # the median step with every block plain (autograd)
    unsettled: list[str] = field(default_factory=list)  # times still spread at max_rounds

    def summary(self) -> dict:
        """What `memory_report()` states of the timing."""
        return {"threads": self.threads, "in_context": True, "rounds": self.rounds,
                "unsettled": len(self.unsettled)}


def configurations(options: dict[str, list[str]]) -> list[dict[str, str]]:
    """The steps of one round: configuration ``k`` runs every block with its option ``k``
    (``autograd`` where it has fewer). `options`: block -> its option names, ``autograd``
    first."""
    width = max((len(v) for v in options.values()), default=1)
    return [{b: (opts[k] if k < len(opts) else "autograd") for b, opts in options.items()}
            for k in range(max(width, 1))]


#: torch's warning when a module with full backward hooks returns something other than tensors
BACKWARD_HOOK_OUTPUT = "For backward hooks to be called"


class _Stamps:
    """Per step: each block's forward and backward seconds (hooks), summed over its calls.

    A block none of whose positional tensor arguments needs a gradient (the first block of a
    model fed its input directly) gets no full backward hook call at its end: its backward
    ends with the last gradient accumulated into its parameters (`close_blind`)."""

    def __init__(self, modules: dict[str, nn.Module], clock):
        self.clock = clock
        self.fwd: dict[str, float] = {}
        self.bwd: dict[str, float] = {}
        self._fwd_open: dict[str, list[float]] = {}
        self._bwd_open: dict[str, list[float]] = {}
        self.blind: set[str] = set()
        self._param_end: dict[str, float] = {}
        self.handles = []
        for name, m in modules.items():
            self.handles += [
                m.register_forward_pre_hook(self._opener(name, self._fwd_open, check=True)),
                m.register_forward_hook(self._closer(name, self._fwd_open, self.fwd)),
                m.register_full_backward_pre_hook(self._opener(name, self._bwd_open)),
                m.register_full_backward_hook(self._closer(name, self._bwd_open, self.bwd)),
            ]
            self.handles += [p.register_post_accumulate_grad_hook(self._param_done(name))
                             for p in m.parameters() if p.requires_grad]

    def _opener(self, name, open_, check=False):
        def hook(_module, args=()):
            if check and not any(isinstance(a, torch.Tensor) and a.requires_grad
                                 for a in args):
                self.blind.add(name)
            open_.setdefault(name, []).append(self.clock())
        return hook

    def _closer(self, name, open_, into):
        def hook(*_):
            starts = open_.get(name)
            if starts and not (open_ is self._bwd_open and name in self.blind):
                into[name] = into.get(name, 0.0) + self.clock() - starts.pop()
        return hook

    def _param_done(self, name):
        def hook(_param):
            self._param_end[name] = self.clock()
        return hook

    def close_blind(self) -> None:
        """After the backward: each blind block's backward, from its outputs' gradients to
        the last of its parameters' gradients."""
        for name in self.blind:
            starts, end = self._bwd_open.get(name), self._param_end.get(name)
            if starts and end is not None:
                self.bwd[name] = self.bwd.get(name, 0.0) + end - starts[0]

    def reset(self) -> None:
        for d in (self.fwd, self.bwd, self._fwd_open, self._bwd_open, self._param_end):
            d.clear()  # in place: the hooks hold these dicts
        self.blind.clear()

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def _step(model, args, kwargs, params, stamps: _Stamps, clock) -> tuple[float, float]:
    """One training step (parameter gradients set to None first, as `zero_grad` does; the
    outputs' gradients random, made before the clock runs): (forward, backward) seconds."""
    for p in params:
        p.grad = None
    stamps.reset()
    with warnings.catch_warnings():
        # a block returning a `ModelOutput` gets no backward stamp: the step is not recorded
        # (`_record`), which torch's warning about it would tell the user at every step
        warnings.filterwarnings("ignore", message=BACKWARD_HOOK_OUTPUT)
        t0 = clock()
        out = model(*args, **kwargs)
        t1 = clock()
    outs = [t for t in flat(out) if isinstance(t, torch.Tensor) and t.requires_grad]
    grads = [torch.ones_like(t) for t in outs]
    t2 = clock()
    with warnings.catch_warnings():  # a blind block's hook (`_Stamps`) fires early: known
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        torch.autograd.backward(outs, grads)
    t3 = clock()
    stamps.close_blind()
    del out, outs, grads
    return t1 - t0, t3 - t2


def _ranks() -> int:
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _clock(model: nn.Module):
    """The profile's clock on the CPU (`host_clock`); on CUDA, wall time after the device
    has finished what was queued (a hook runs when its kernels are launched, not done)."""
    dev = model_device(model)
    if dev.type != "cuda":
        return host_clock()

    def clock() -> float:
        torch.cuda.synchronize(dev)
        return time.perf_counter()
    return clock


def time_in_context(found: FoundBlocks, wrappers, options: dict[str, list[str]],
                    args: tuple, kwargs: dict, *, pooled: dict[str, str] | None = None,
                    min_rounds: int = 4, max_rounds: int = 9,
                    tol: float = DEFAULT_TOL) -> ContextTimes | None:
    """Time `options` (block -> option names, ``autograd`` first) in whole steps of
    `found.model` on (`args`, `kwargs`), its blocks run by `wrappers` (a
    `hooked.BlockWrappers`, whose choices are set per configuration and cleared after);
    `pooled`: block -> the block whose samples it shares (same profile). See the module
    docstring; None when a step cannot be timed so."""
    model = found.model
    pooled = pooled or {}
    clock = _clock(model)
    if _ranks() > 1:  # a DDP model's steps are collectives: as many on every rank
        min_rounds = max_rounds
    configs = configurations(options)
    stamps = _Stamps({b.name: b.module for b in found.blocks}, clock)
    # samples: (config, block, "fwd"/"bwd") -> seconds; (config, "glue", side) -> seconds
    samples: dict[tuple, list[float]] = {}

    params: list[torch.Tensor] = []  # their gradients, cleared before each step

    def one_round(warm_up: bool = False) -> None:
        for k, config in enumerate(configs):
            wrappers.set(config)
            fwd, bwd = _step(model, args, kwargs, params, stamps, clock)
            if not warm_up and not _record(samples, k, config, stamps, fwd, bwd, pooled,
                                           options):
                raise _Untimeable
        progress.step(None, "a round of steps")

    try:
        with gradients_set_aside(model, args, kwargs) as cleared, preserved(model), \
                torch.random.fork_rng(devices=[]), progress.phase("timing blocks in context"):
            params += cleared
            one_round(warm_up=True)
            rounds = sample_until_settled(one_round, samples, min_rounds=min_rounds,
                                          max_rounds=max_rounds, tol=tol, of_step=GLUE_KEYS)
    except _Untimeable:
        log.info("schedlang fit: a block's backward could not be timed in context (no "
                 "positional input and no parameter of it gets a gradient); the layer "
                 "profile's times stand")
        return None
    except (RuntimeError, TypeError, ValueError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        log.info("schedlang fit: the blocks could not be timed in context (%s); the layer "
                 "profile's times stand", first)
        return None
    finally:
        wrappers.set(None)
        stamps.remove()
    return _medians(samples, configs, options, pooled, rounds, tol)


def _record(samples, k, config, stamps: _Stamps, fwd: float, bwd: float, pooled,
            options) -> bool:
    """Add one step's stamps to `samples`, each as a share of the plain step of the same
    round (configuration 0 runs first in each): the load that slows a whole round cancels
    out. False when a block with a backward got no backward stamp (`_Stamps`)."""
    for name in config:
        with_bwd = len(options.get(name, ())) > 0
        if name not in stamps.fwd or (with_bwd and stamps.bwd.get(name, 0.0) <= 0.0):
            return False
    if k == 0:  # every block plain: the step, and the glue's times
        samples.setdefault(STEP_KEY, []).append(fwd + bwd)
    step = samples[STEP_KEY][-1]
    if k == 0:
        glue_fwd, glue_bwd = GLUE_KEYS
        samples.setdefault(glue_fwd, []).append(max(0.0, fwd - sum(stamps.fwd.values())) / step)
        samples.setdefault(glue_bwd, []).append(max(0.0, bwd - sum(stamps.bwd.values())) / step)
    for name, option in config.items():
        key = pooled.get(name, name)
        samples.setdefault((option, key, "fwd"), []).append(stamps.fwd[name] / step)
        samples.setdefault((option, key, "bwd"), []).append(stamps.bwd.get(name, 0.0) / step)
    return True


def _medians(samples, configs, options, pooled, rounds: int, tol: float) -> ContextTimes:
    step = statistics.median(samples[STEP_KEY])

    def seconds(key) -> float:
        return step * statistics.median(samples[key])

    blocks: dict[str, dict[str, tuple[float, float]]] = {}
    for name, opts in options.items():
        key = pooled.get(name, name)
        blocks[name] = {o: (seconds((o, key, "fwd")), seconds((o, key, "bwd")))
                        for o in dict.fromkeys(opts) if (o, key, "fwd") in samples}
    unsettled = sorted({f"{k[1]}:{k[0]}" for k, v in samples.items()
                        if k[1] not in ("glue", "step") and not settled(v, tol)})
    return ContextTimes(blocks, seconds(GLUE_KEYS[0]), seconds(GLUE_KEYS[1]),
                        torch.get_num_threads(), rounds, step, unsettled)


def timed_in_context(found: FoundBlocks, profiled, wrappers, args: tuple,
                     kwargs: dict, **rounds) -> ContextTimes | None:
    """`time_in_context` of every option of `profiled`'s blocks (the hook front end's
    `ProfiledGraph`; ``offload`` aside: it is priced with the host link), run by `wrappers`
    (unwrapped after); their times replaced by the medians (`apply_times`)."""
    options = {lp.name: [o.name for o in lp.options if o.name != OFFLOAD]
               for lp in profiled.layers}
    pooled = {lp.name: lp.measured_as or lp.name for lp in profiled.layers}
    try:
        times = time_in_context(found, wrappers, options, args, kwargs, pooled=pooled,
                                **rounds)
    finally:
        wrappers.unwrap()
    if times is not None:
        apply_times(profiled, times)
    return times


def apply_times(profiled, times: ContextTimes) -> None:
    """Each block option's forward and backward seconds set to what `times` measured in
    context; a block's ``fast_forward`` (a forward that saves nothing, as a checkpointed
    group's blocks run) to its ``rerun`` forward (no autograd: a group of such blocks runs
    so, `groups.Group`), else to its ``recompute`` forward (a checkpoint's forward, which
    saves nothing either)."""
    for lp in profiled.layers:
        got = times.blocks.get(lp.name) or {}
        for o in lp.options:
            if o.name in got:
                o.fwd_time, o.bwd_time = got[o.name]
        first = got.get(RERUN) or got.get("recompute")
        if lp.fast_forward is not None and first is not None:
            lp.fast_forward.fwd_time = first[0]


def glue_times(segments: dict[str, tuple[float, bool]],
               times: ContextTimes | None) -> dict[str, tuple[float, float]]:
    """glue layer -> (forward, backward) seconds. `segments`: glue layer -> (the seconds the
    recording run measured, whether it has a backward). Without `times`, the recorded
    forward and twice it backward; with them, the glue totals measured in context, shared out
    in proportion to the recorded forwards (each glue layer is in every plan alike: only the
    total matters)."""
    if times is None:
        return {n: (t, 2 * t if back else 0.0) for n, (t, back) in segments.items()}

    def share(total: float, names: list[str]) -> dict[str, float]:
        weights = {n: max(segments[n][0], 0.0) for n in names}
        whole = sum(weights.values())
        return {n: total * (w / whole if whole > 0 else 1 / len(names))
                for n, w in weights.items()}

    fwd = share(times.glue_fwd, list(segments)) if segments else {}
    back = [n for n, (_, b) in segments.items() if b]
    bwd = share(times.glue_bwd, back) if back else {}
    return {n: (fwd[n], bwd.get(n, 0.0)) for n in segments}
