"""fit on `transformers` models against what their users already have, side by side in one run.

    python bench/bench_baselines.py [--models llama gpt2 bert bart vit] [--steps 11]
        [--warmup 2] [--between 3] [--repeats 5] [--op-options] [--json OUT]
        [--device cpu|cuda] [--batch B --seq S --layers L --dim D]

Models (random weights, dropout on), each taking the hook front end as every `transformers`
model does:

* `schedlang/testing/hf_models.py`'s Llama, GPT-2, BERT, BART and ViT at bench sizes where
  activations outweigh parameters (`SIZES`), the default;
* any architecture of `schedlang/testing/hf_architectures.py` by its name (`opt`, `t5`,
  `mistral`, `deberta_v2`, `swin`, ...: models the bench was not tuned on) at `ARCH_SIZE`;
* on CUDA (`--device cuda`), `gpt2-124m` (GPT-2 small: 12 x 768, its 50,257-token vocabulary,
  8 x 1024 tokens) and `llama-12l` (a Llama-style 12 x 1024 model, 32,000 tokens, 4 x 1024:
  `../shared/tools/gpu-check`'s), and `llama`/`gpt2` at their bench sizes; the others build
  on the CPU only (their losses hold CPU targets).

`--batch`, `--seq`, `--layers` and `--dim` override the size of every model that has that
dimension. Methods, each on a copy of the model with the same weights (fit wraps the model's
own blocks in place):

* `plain`: the model as it is;
* `hf-gc`: transformers' own `gradient_checkpointing_enable()` (non-reentrant);
* `ckpt-block`: every block of the model's stack under `torch.utils.checkpoint`;
* `ckpt-seq(s)`: `checkpoint_sequential`'s schedule over the stack in s segments (each segment
  but the last one checkpointed as a whole; s = 2 and round(sqrt(blocks))), run on the model's
  own forward by the hook front end's group wrappers (`groups.Group`: the model calls its
  blocks one by one, so `checkpoint_sequential` itself cannot take it), each group under
  torch's non-reentrant checkpoint as `checkpoint_sequential` runs it (`rerun_groups=False`;
  `fit`'s groups run the ``rerun`` way where they can);
* `sac-op`: a uniform selective activation checkpoint per block that keeps matmul, convolution
  and attention outputs and recomputes the rest, as torchtitan's `op` mode does
  (`profile.selective_policy`, the one home of that policy);
* `fit @B`: `fit` with the budget set to baseline B's measured peak (bytes);
* `fit k/n`: `fit` at budgets between `hf-gc`'s measured peak and plain's (`--between` points);
* `fit min`: `fit` at the smallest feasible budget its `FitError` names (a 1-byte budget asked);
* `fit seq(2)`: `fit` given `ckpt-seq(2)`'s schedule (pinned), its groups run the ``rerun``
  way where every member offers it: its peak and step against the baseline's;
* `fit every-block`: `fit` given the plan that recomputes every block (pinned:
  `plan_checkpoint_groups` with every block ``recompute``), `ckpt-block`'s schedule run by a
  fitted module: its peak against `hf-gc`'s, its step against `hf-gc`'s and `ckpt-block`'s.

Peak: one training step (forward, loss, backward, the output held through the backward:
`out = model(**batch); loss_fn(out).backward()`) under `MemoryTracker`: what the step adds
(on the CPU every tensor storage it creates, on CUDA the caching allocator's peak over what
was allocated before the step, the other methods' copies included there and so taken off)
plus the parameters, buffers, inputs and the loss's own tensors (its targets), resident, as
`fit` counts its budget; gradients set to None first. Step time: the median of `--steps`
steps after `--warmup` per method, methods interleaved round by round (the order rotating);
on the CPU one intra-op thread (`torch.set_num_threads(1)`), timed by the thread's CPU time
(`time.thread_time`, the clock `fit` profiles with: a loaded machine's waits left out); on
CUDA the wall clock between two synchronizations.
Gradients: each method's step from the same RNG seed against eager PyTorch's (the plain
model's), the largest absolute difference over all parameters relative to the largest eager
gradient (dropout on: equal only when every recomputation replays the RNG).

The physical floor: what any schedule of a step holds at its worst moment, from the profile
`fit` solves on (`floor_bytes`): the resident bytes (parameters, buffers, inputs, the loss's
targets) and the model's outputs (held through the backward), plus the largest, over the
layers of the graph (blocks and glue), of a layer's backward working set: its inputs, the
gradients it reads and writes, the parameter gradients that exist by then (its own and the
later layers'), and its least (phantom + backward overhead) over its options — a layer
recomputed from its inputs in its own backward, nothing else alive. (Until 2026-11-29 every
parameter gradient was counted at every layer's backward, and a layer's own twice: the floors
in bench/README.md before that date are that much high, and OPT's was 0.13 MiB above
per-block checkpointing's measured peak.)
On a model without transformers' checkpointing (`supports_gradient_checkpointing` false) `hf-gc`
is left out and (b), (c) and `fit every-block` are against `ckpt-block`.

Targets (issue 28), printed per model: (a) `fit min` measures at most `ckpt-block`'s peak;
(b) at `hf-gc`'s measured peak, fit's step is at most 0.95x the baseline's; (c) at each budget
between that and plain (the `fit k/n` points, and each baseline's own peak above hf-gc's: `fit
@sac-op`, `fit @ckpt-seq(2)`), fit is faster than every baseline that fits it.
`--device cuda` runs the same table on a GPU (the issue's CUDA rows: `--models gpt2-124m
llama-12l`); a run without CUDA says so and exits 2.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch
from torch import nn

from schedlang.plans.planners.baselines import plan_checkpoint_groups
from schedlang.pytorch.fit import FitError, fit, prepare
from schedlang.pytorch.frontends.blocks.find import find_blocks
from schedlang.pytorch.frontends.blocks.hooked import BlockWrappers
from schedlang.pytorch.frontends.blocks.plan_reading import GROUP, block_chains
from schedlang.pytorch.memory import MemoryTracker, storage_bytes, storage_key
from schedlang.pytorch.prepare import loss_tensor_bytes
from schedlang.testing import hf_architectures, hf_models
from schedlang.testing.leaks import host_copy

#: bench sizes: batch x sequence (or images), 64-wide, activations well above parameters
SIZES = {
    "llama": {"batch": 8, "seq": 128, "layers": 4, "dim": 64},
    "gpt2": {"batch": 8, "seq": 128, "layers": 4, "dim": 64},
    "bert": {"batch": 8, "seq": 64, "layers": 4, "dim": 64},
    "bart": {"batch": 8, "seq": 64, "layers": 3, "dim": 64},
    "vit": {"batch": 16, "size": 64, "layers": 4, "dim": 64},
}
#: hf_architectures' models at the bench: 64 wide, 4 blocks, 8 x 64 tokens (or images of 64)
ARCH_SIZE = {"batch": 8, "seq": 64, "layers": 4, "dim": 64}
#: the factories that build on CUDA: real sizes (the issue's GPT-2 124M and a Llama-style
#: model) and the bench's Llama and GPT-2
CUDA_MODELS = ("gpt2-124m", "llama-12l", "llama", "gpt2")
MiB = 2 ** 20
DEVICE = torch.device("cpu")  # --device
#: `--op-options`: the generated block options' budget series (fractions of what a block
#: saves; 10 s a sub-solve). Down to 0.05: the least-memory cuts are what the smallest budget
#: is made of. GPT-2 with the series stopping at 0.2: `fit min` 14.4-17.8 MiB over seven
#: profiles; with 0.1 and 0.05, 11.58 MiB, on the physical floor (bench/README.md)
BLOCK_OPTIONS = {"fractions": (0.8, 0.6, 0.4, 0.2, 0.1, 0.05), "time_limit": 10}


def gpt2_124m(batch=8, seq=1024, layers=12, dim=768, seed=0, device="cpu"):
    """GPT-2 small (124M parameters) as `GPT2LMHeadModel`, random weights, dropout on."""
    tf = hf_models._tf()
    hf_models._seed(seed)
    cfg = tf.GPT2Config(n_layer=layers, n_embd=dim, n_head=dim // 64, vocab_size=50257,
                        n_positions=max(1024, seq), use_cache=False)
    model = tf.GPT2LMHeadModel(cfg).train().to(device)
    ids = hf_models._tokens(batch, seq, cfg.vocab_size).to(device)
    return model, (ids,), {}, hf_models._ce(ids)


def llama_12l(batch=4, seq=1024, layers=12, dim=1024, seed=0, device="cpu"):
    """A Llama-style model: 12 blocks of 1024, 16 heads, SwiGLU of 2816, 32,000 tokens."""
    tf = hf_models._tf()
    hf_models._seed(seed)
    cfg = tf.LlamaConfig(vocab_size=32000, hidden_size=dim, intermediate_size=2816,
                         num_hidden_layers=layers, num_attention_heads=dim // 64,
                         num_key_value_heads=dim // 64, max_position_embeddings=max(2048, seq),
                         use_cache=False, attention_dropout=0.1)
    model = tf.LlamaForCausalLM(cfg).train().to(device)
    ids = hf_models._tokens(batch, seq, cfg.vocab_size).to(device)
    mask = torch.ones(batch, seq, dtype=torch.long, device=device)
    return model, (), {"input_ids": ids, "attention_mask": mask}, hf_models._ce(ids)


GPU_SIZES = {"gpt2-124m": {"batch": 8, "seq": 1024, "layers": 12, "dim": 768},
             "llama-12l": {"batch": 4, "seq": 1024, "layers": 12, "dim": 1024}}
FACTORIES = {**{k: hf_models.HF[k] for k in SIZES}, **hf_architectures.ARCHITECTURES,
             "gpt2-124m": gpt2_124m, "llama-12l": llama_12l}


def size_of(name: str, overrides: dict) -> dict:
    """The size `name` runs at: its bench size, each dimension it has overridden."""
    size = dict(SIZES.get(name) or GPU_SIZES.get(name) or ARCH_SIZE)
    size.update({k: v for k, v in overrides.items() if v is not None and k in size})
    return size


def maker(name: str, size: dict):
    """A call that builds `name` afresh at `size` on the bench's device, same weights each
    time (the factories seed): (model, args, kwargs, loss_fn)."""
    factory = FACTORIES[name]
    if DEVICE.type == "cpu":
        return lambda: factory(**size)
    return lambda: factory(**size, device=DEVICE)


def sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)


# --- the training step, measured ------------------------------------------------------------
def step(fn, model, loss_fn):
    model.zero_grad(set_to_none=True)
    out = fn()
    loss_fn(out).backward()
    del out


def tensors_of(args, kwargs) -> list[torch.Tensor]:
    return [x for x in (*args, *kwargs.values()) if isinstance(x, torch.Tensor)]


def peak_of(fn, model, inputs, loss_fn, loss_bytes: int) -> int:
    """The step's peak: what it adds, plus the model, the inputs and the loss's own tensors
    (`loss_bytes`: its targets, alive through every step) resident, as `fit` counts them and
    CUDA's allocator would; every other live tensor of the process (the other methods'
    copies) left out (CUDA's allocator counts them in its baseline, taken off)."""
    model.zero_grad(set_to_none=True)
    gc.collect()
    with MemoryTracker(resident=[model, *inputs], device=DEVICE, existing=False) as mt:
        step(fn, model, loss_fn)
    return mt.peak - mt.baseline + storage_bytes([model, *inputs]) + loss_bytes


def loss_bytes_of(model, args, kwargs, loss_fn) -> int:
    """Bytes of what `loss_fn` reads of its own (the targets), beyond the model and inputs:
    `fit`'s resident bytes count them (`prepare.loss_tensor_bytes`), so every method's peak
    does too (left out, each baseline read 4,096 B low on BERT: its labels, 8 x 64 int64)."""
    known = {storage_key(t) for t in (*model.parameters(), *model.buffers(),
                                      *tensors_of(args, kwargs))}
    return loss_tensor_bytes(model, args, kwargs, loss_fn, known)


def grads_of(fn, model, loss_fn, seed=123) -> dict:
    """The parameters' gradients after one step, as host (NumPy) copies: kept through the
    run, they must not be tensor memory that `fit`'s probe steps count, as CUDA's allocator
    would (`leaks.host_copy`)."""
    torch.manual_seed(seed)
    step(fn, model, loss_fn)
    return host_copy({n: p.grad for n, p in model.named_parameters() if p.grad is not None})


def grad_error(got: dict, want: dict) -> float:
    """Largest |got - want| over every parameter, over the largest |want| (inf: a gradient
    missing or extra)."""
    if set(got) != set(want):
        return math.inf
    scale = max(float(abs(g).max()) for g in want.values())
    return max(float(abs(got[n] - want[n]).max()) for n in want) / scale


# --- the baselines ---------------------------------------------------------------------------
class HFCheckpointing(nn.Module):
    """transformers' own gradient checkpointing, on for the duration of each call."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, *args, **kwargs):
        m = self.model
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        try:
            return m(*args, **kwargs)
        finally:
            m.gradient_checkpointing_disable()


class Wrapped(nn.Module):
    """A copy of the model with its stack's blocks wrapped in place (the hook front end's
    wrappers), each running `choices`: per-block checkpoint, SAC, or checkpointed groups."""

    def __init__(self, model, found, choices: dict[str, str]):
        super().__init__()
        self.model = model
        self.wrappers = BlockWrappers(found, rerun_groups=False)  # torch's checkpoint, as users run it
        self.wrappers.set(choices)

    def forward(self, *args, **kwargs):
        self.wrappers.ensure()
        return self.model(*args, **kwargs)


def stacks_of(found) -> list[list[str]]:
    """The model's repeated stacks: the blocks of each class in one container, called more
    than once, in call order (BART: its encoder's layers, then its decoder's; T5, whose
    encoder and decoder blocks share a class: each its own stack)."""
    by_stack: dict[tuple, list[str]] = {}
    for b in found.blocks:
        by_stack.setdefault((type(b.module), b.name.rpartition(".")[0]), []).append(b.name)
    return [names for names in by_stack.values() if len(names) > 1]


def sequential_choices(stacks: list[list[str]], segments: int) -> dict[str, str]:
    """checkpoint_sequential(segments) on each stack: every segment but the last one
    checkpointed whole (a one-block segment: that block checkpointed)."""
    out = {}
    for stack in stacks:
        size = math.ceil(len(stack) / segments)
        for i in range(0, len(stack) - size, size):
            members = stack[i:i + size]
            for m in members:
                out[m] = "recompute" if len(members) == 1 else GROUP + "|".join(members)
    return out


def _is_run_of(members: list[str], chain: list[str]) -> bool:
    """Are `members` consecutive blocks of `chain`?"""
    return members[0] in chain and \
        chain[chain.index(members[0]):chain.index(members[0]) + len(members)] == members


def sequential_plan_parts(stacks: list[list[str]], segments: int):
    """`sequential_choices` as `plan_checkpoint_groups` takes it: (groups, per-block options)."""
    groups: dict[str, list[str]] = {}
    options = {}
    for block, choice in sequential_choices(stacks, segments).items():
        if choice.startswith(GROUP):
            groups.setdefault(choice, choice[len(GROUP):].split("|"))
        else:
            options[block] = choice
    return list(groups.values()), options


def baselines(make, args, kwargs) -> dict:
    """{method: (module to call, the model whose parameters it trains)}, each on its copy
    (`make()`: a fresh model, the same weights). A model without transformers' checkpointing
    has no `hf-gc`, one without a repeated stack of blocks no per-block baselines."""
    out = {}
    for label in ("plain", "hf-gc", "ckpt-block", "sac-op", "seq"):
        model, *_ = make()
        if label == "plain":
            out[label] = (model, model)
        elif label == "hf-gc":
            if getattr(model, "supports_gradient_checkpointing", False):
                out[label] = (HFCheckpointing(model), model)
        else:
            found = find_blocks(model, args, kwargs)
            found.release_samples()
            stacks = stacks_of(found)
            blocks = [b for stack in stacks for b in stack]
            if not blocks:
                continue
            if label == "ckpt-block":
                out[label] = (Wrapped(model, found, dict.fromkeys(blocks, "recompute")), model)
            elif label == "sac-op":
                out[label] = (Wrapped(model, found, dict.fromkeys(blocks, "selective")), model)
            else:
                longest = max(len(stack) for stack in stacks)
                for s in sorted({2, max(2, round(math.sqrt(longest)))}):
                    m = model if s == 2 else make()[0]
                    f = found if s == 2 else find_blocks(m, args, kwargs)
                    out[f"ckpt-seq({s})"] = (Wrapped(m, f, sequential_choices(stacks, s)), m)
    return out


# --- the floor ---------------------------------------------------------------------------------
def floor_bytes(prep, model) -> tuple[int, str]:
    """(floor, where its working set is): see the module docstring."""
    g = prep.graph
    size = {d.name: int(d.size) for d in g.data}
    layers = list(g.layers)
    worst, where = 0, ""
    for i, lay in enumerate(layers):
        # the parameters' gradients alive at its backward: its own and those of the layers
        # after it (their backward has run; the earlier layers' gradients do not exist yet)
        grads = sum(size.get(f"{later.name}.params.grad", 0) for later in layers[i:])
        io = sum(size.get(x, 0) for x in {*lay.inputs, *lay.grad_inputs, *lay.grad_outputs}
                 if not x.endswith(".params.grad"))
        least = min(o.phantom + max(o.bwd_overhead, 0) for o in lay.options)
        if grads + io + least > worst:
            worst, where = grads + io + least, lay.name
    return prep.resident_bytes + prep.output_bytes + worst, where


# --- the bench -----------------------------------------------------------------------------------
def _probed_note(probes: list | None) -> str:
    """Whether `fit` re-planned after a probe step measured its plan over the budget (more
    than one probe of its own plans; the race's probe of a rival is not one)."""
    own = [p for p in probes or [] if not p.get("rival")]
    return f", {len(own)} probe steps (re-planned)" if len(own) > 1 else ""


def _raced_note(raced: dict | None) -> str:
    """`fit`'s race between near plans, if it ran (`probing.faster_of_near_plans`)."""
    if not raced:
        return ""
    if raced["rival_measured"] is None:
        return f", raced {raced['rival']!r}: out (" + (
            "over the budget)" if raced["over_budget"] else "not timed)")
    return (f", raced {raced['rival']!r} {100 * raced['rival_measured']:+.1f}% vs "
            f"{100 * raced['plan_measured']:+.1f}%: " + ("taken" if raced["taken"] else "not taken"))


def run_model(name: str, args_ns) -> dict:
    size = size_of(name, {"batch": args_ns.batch, "seq": args_ns.seq, "layers": args_ns.layers,
                          "dim": args_ns.dim})
    make = maker(name, size)
    model, args, kwargs, loss_fn = make()
    inputs = tensors_of(args, kwargs)
    t0 = time.perf_counter()
    block_options = BLOCK_OPTIONS if args_ns.op_options else False
    prep = prepare(model, args, loss_fn=loss_fn, sample_kwargs=kwargs, frontend="blocks",
                   repeats=args_ns.repeats, block_options=block_options)
    profile_s = time.perf_counter() - t0
    def call(m):
        return lambda: m(*args, **kwargs)
    # eager PyTorch's gradients, and each baseline's peak and gradients with no other copy of
    # the model alive (fit's probe step counts every tensor alive, as CUDA does)
    want = grads_of(call(model), model, loss_fn)
    held = loss_bytes_of(model, args, kwargs, loss_fn)
    model.zero_grad(set_to_none=True)
    peaks: dict[str, int] = {}
    errors: dict[str, float] = {}
    for k, (m, owner) in baselines(make, args, kwargs).items():
        peaks[k] = peak_of(call(m), owner, inputs, loss_fn, held)
        errors[k] = grad_error(grads_of(call(m), owner, loss_fn), want)
        del m, owner
    gc.collect()
    notes: dict[str, str] = {}
    predicted: dict[str, int] = {}
    fits: dict[str, nn.Module] = {}

    def add_fit(label, budget, plan=None):
        t1 = time.perf_counter()
        # no gradient left by the steps before (a user fits before training): the probe step
        # counts every tensor alive, as CUDA's allocator does
        model.zero_grad(set_to_none=True)
        gc.collect()
        try:
            # as a user's fit runs: its probe steps check the plan's peak and re-plan where one
            # is over the budget; the steps measured here are then run without the tracker
            fm = fit(model, args, budget, loss_fn=loss_fn, sample_kwargs=kwargs, prepared=prep,
                     calibrate=False, plan=plan)
        except FitError as exc:
            notes[label] = "infeasible: " + str(exc).split(": ", 1)[-1][:120]
            return
        fm.measure = False
        fits[label] = fm
        peaks[label] = peak_of(call(fm), model, inputs, loss_fn, held)
        errors[label] = grad_error(grads_of(call(fm), model, loss_fn), want)
        rep = fm.memory_report()
        predicted[label] = rep.predicted_peak_bytes
        notes[label] = (f"budget {int(rep.budget_bytes or 0) / MiB:.2f}, predicted "
                        f"{rep.predicted_peak_bytes / MiB:.2f} MiB "
                        f"{100 * rep.plan_time_overhead:+.1f}%, solve "
                        f"{time.perf_counter() - t1:.1f}s" + (" (plain)" if fm.plain else "")
                        + _probed_note(rep.extra.get("probes")) + _raced_note(rep.extra.get("raced")))

    for b in [k for k in peaks if k != "plain"]:
        add_fit(f"fit @{b}", peaks[b])
    # fit running ckpt-block's schedule (its plan pinned): hf-gc's peak, and our wrappers'
    # cost against transformers' checkpointing
    # (the reference baseline: transformers' checkpointing, else per-block checkpointing)
    ref = next((b for b in ("hf-gc", "ckpt-block") if b in peaks), None)
    every = [b for stack in stacks_of(prep.partitioned.found) for b in stack]
    if every and ref is not None:
        add_fit("fit every-block", peaks[ref],
                plan_checkpoint_groups(prep.graph, [], dict.fromkeys(every, "recompute")))
    # fit running checkpoint_sequential(2)'s schedule (pinned): its groups the ``rerun`` way
    # where they can, against the baseline's torch checkpoint, same peak
    # (where its groups are chains in the graph data: T5's decoder blocks share the position
    # bias, and fit groups none of them)
    if "ckpt-seq(2)" in peaks:
        groups, options = sequential_plan_parts(stacks_of(prep.partitioned.found), 2)
        chains = block_chains(prep.graph, [b.name for b in prep.partitioned.found.blocks])
        if all(any(_is_run_of(g, c) for c in chains) for g in groups):
            add_fit("fit seq(2)", peaks["ckpt-seq(2)"],
                    plan_checkpoint_groups(prep.graph, groups, options))
    if ref is not None:
        low, high = peaks[ref], peaks["plain"]
        n = args_ns.between
        for k in range(1, n + 1):
            add_fit(f"fit {k}/{n + 1}", int(low + (high - low) * k / (n + 1)))
    smallest = None
    try:  # the least budget fit accepts: the resident bytes and one more
        fit(model, args, prep.resident_bytes + 1, loss_fn=loss_fn, sample_kwargs=kwargs,
            prepared=prep, measure=False, calibrate=False)
    except FitError as exc:
        found = re.search(r"smallest feasible budget found is [^(]*\((\d+) B\)", str(exc))
        smallest = int(found.group(1)) if found else None
        if smallest is None:
            notes["fit min"] = "not found: " + str(exc)[:160]
    if smallest is not None:
        add_fit("fit min", smallest)
    methods = {k: (m, model) for k, m in fits.items()}
    methods.update(baselines(make, args, kwargs))
    times = timed(methods, call, loss_fn, args_ns)
    floor, where = floor_bytes(prep, model)
    return {"model": name, "size": size, "device": str(DEVICE), "reference": ref,
            "profile_s": profile_s, "peaks": peaks, "median_s": times, "grad_error": errors,
            "notes": notes, "floor": floor, "floor_layer": where,
            "resident": prep.resident_bytes, "predicted": predicted, "smallest": smallest,
            "params": sum(p.numel() * p.element_size() for p in model.parameters())}


def timed(methods, call, loss_fn, args_ns) -> dict[str, float]:
    for m, owner in methods.values():
        for _ in range(args_ns.warmup):
            step(call(m), owner, loss_fn)
    times: dict[str, list[float]] = {k: [] for k in methods}
    # one intra-op thread on the CPU: the thread's CPU time (what a step costs, not how long
    # the loaded machine kept it waiting), as fit profiles; on CUDA the wall clock between
    # synchronizations; the order rotates round by round
    cpu_time = DEVICE.type == "cpu" and torch.get_num_threads() == 1
    clock = time.thread_time if cpu_time else time.perf_counter
    order = list(methods)
    for r in range(args_ns.steps):
        for k in order[r % len(order):] + order[:r % len(order)]:
            m, owner = methods[k]
            sync()
            t0 = clock()
            step(call(m), owner, loss_fn)
            sync()
            times[k].append(clock() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def targets(res) -> list[str]:
    p, t = res["peaks"], res["median_s"]
    base = [k for k in p if not k.startswith(("fit", "plain"))]
    ref = res["reference"]  # hf-gc, else ckpt-block, else None (no baseline but plain)
    out = []
    if "fit min" in p and "ckpt-block" in p:
        ok = p["fit min"] <= p["ckpt-block"]
        out.append(f"  (a) smallest feasible {p['fit min'] / MiB:.2f} MiB vs ckpt-block "
                   f"{p['ckpt-block'] / MiB:.2f} MiB, floor {res['floor'] / MiB:.2f} MiB "
                   f"(fit min / floor {p['fit min'] / res['floor']:.2f}): "
                   + ("met" if ok else "NOT met"))
    elif "fit min" in p:
        out.append(f"  (a) smallest feasible {p['fit min'] / MiB:.2f} MiB, floor "
                   f"{res['floor'] / MiB:.2f} MiB; no per-block checkpointing to compare "
                   "(no repeated stack of blocks)")
    else:
        out.append("  (a) smallest feasible: not found")
    f = f"fit @{ref}"
    if ref is not None and f in t:
        r = t[f] / t[ref]
        out.append(f"  (b) at {ref}'s peak: fit {1000 * t[f]:.1f} ms vs {1000 * t[ref]:.1f} "
                   f"ms = {r:.2f}x (peak {p[f] / MiB:.2f} vs {p[ref] / MiB:.2f} MiB): "
                   + ("met" if r <= 0.95 and p[f] <= p[ref] else "NOT met"))
    elif ref is not None:
        out.append(f"  (b) at {ref}'s peak: no fit ({res['notes'].get(f, 'not run')})")
    if ref != "hf-gc":
        out.append("  (no transformers checkpointing on this model: (b) is against "
                   f"{ref or 'nothing'})")
    e = "fit every-block"
    if e in t:
        out.append(f"  every block recomputed by fit: peak {p[e]:,} B vs {ref} {p[ref]:,} B "
                   f"(predicted {res['predicted'][e]:,} B); step {t[e] / t[ref]:.2f}x "
                   f"{ref}'s, {t[e] / t['ckpt-block']:.2f}x ckpt-block's")
    q = "fit seq(2)"
    if q in t:
        out.append(f"  checkpoint_sequential(2)'s schedule run by fit (its groups the rerun way"
                   f" where they can): peak {p[q]:,} B vs {p['ckpt-seq(2)']:,} B (predicted "
                   f"{res['predicted'][q]:,} B); step {t[q] / t['ckpt-seq(2)']:.3f}x "
                   "ckpt-seq(2)'s (torch's checkpoint)")
    # (c) at the points between and at every baseline's own peak above the reference's (a
    # budget between it and plain too: fit there against the baselines that fit it)
    above = [x for x in p if x.startswith("fit @") and ref is not None
             and x[len("fit @"):] in base and p[x[len("fit @"):]] > p[ref]]
    for k in sorted(x for x in p if x.startswith("fit ") and "/" in x) + above:
        budget = p[k[len("fit @"):]] if k in above else p[k]
        fitting = [b for b in base if p[b] <= budget]
        faster = all(t[k] < t[b] for b in fitting)
        out.append(f"  (c) {k} ({p[k] / MiB:.2f} MiB, {1000 * t[k]:.1f} ms) vs fitting "
                   f"baselines {', '.join(f'{b} {1000 * t[b]:.1f}' for b in fitting) or 'none'}"
                   f": " + ("met" if faster else "NOT met"))
    return out


def report(res) -> list[str]:
    p, t, e = res["peaks"], res["median_s"], res["grad_error"]
    plain_p, plain_t = p["plain"], t["plain"]
    lines = [(f"\n{res['model']} {res['size']}: parameters {res['params'] / MiB:.2f} MiB, "
             f"resident {res['resident'] / MiB:.2f} MiB, physical floor "
             f"{res['floor'] / MiB:.2f} MiB (largest backward: {res['floor_layer']}), "
             f"profile {res['profile_s']:.1f} s"),
             (f"{'method':<18} {'peak MiB':>9} {'/plain':>7} {'/floor':>7} {'step ms':>8} "
             f"{'/plain':>7} {'grad err':>9}  notes")]
    order = [k for k in p if not k.startswith("fit")] + sorted(
        (k for k in set(p) | set(res["notes"]) if k.startswith("fit")),
        key=lambda k: -p.get(k, 0))
    for k in order:
        if k not in p:
            lines.append(f"{k:<18} {'-':>9}  {res['notes'][k]}")
            continue
        lines.append(f"{k:<18} {p[k] / MiB:9.2f} {p[k] / plain_p:7.3f} {p[k] / res['floor']:7.2f} "
                     f"{1000 * t[k]:8.1f} {t[k] / plain_t:7.3f} {e[k]:9.1e}  "
                     f"{res['notes'].get(k, '')}")
    return lines + targets(res)


def main() -> int:
    global DEVICE
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(SIZES), choices=list(FACTORIES),
                    metavar="MODEL", help=f"any of {', '.join(FACTORIES)}")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    for dim in ("batch", "seq", "layers", "dim"):
        ap.add_argument(f"--{dim}", type=int, help=f"override every model's {dim}")
    ap.add_argument("--steps", type=int, default=11, help="timed steps per method (median)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--between", type=int, default=3,
                    help="budgets between hf-gc's peak and plain's")
    ap.add_argument("--repeats", type=int, default=5, help="profiling runs per block")
    ap.add_argument("--op-options", action="store_true", help="fit with generated block "
                    "options too (schedlang.pytorch.frontends.blocks.block_ops: selective-checkpoint policies)")
    ap.add_argument("--json", help="write the results here")
    args_ns = ap.parse_args()
    if args_ns.device == "cuda":
        if not torch.cuda.is_available():
            print("bench_baselines: --device cuda, but torch sees no CUDA device",
                  file=sys.stderr)
            return 2
        off = [m for m in args_ns.models if m not in CUDA_MODELS]
        if off:
            print(f"bench_baselines: {', '.join(off)} build on the CPU only; on CUDA: "
                  f"{', '.join(CUDA_MODELS)}", file=sys.stderr)
            return 2
        DEVICE = torch.device("cuda")
    else:
        torch.set_num_threads(1)
    load = os.getloadavg()
    where = (torch.cuda.get_device_name(DEVICE) if DEVICE.type == "cuda" else
             f"cpu, {torch.get_num_threads()} thread")
    print(f"device {where}, torch {torch.__version__}, median of {args_ns.steps} steps "
          f"after {args_ns.warmup} warm-up, methods interleaved; load average {load[0]:.2f}")
    results, failed = [], []
    for name in args_ns.models:
        try:
            res = run_model(name, args_ns)
        except Exception as exc:  # noqa: BLE001 - one model's failure must not lose the others'
            first = (str(exc).strip().splitlines() or [""])[0]
            print(f"\n{name}: not benched: {type(exc).__name__}: {first}", flush=True)
            failed.append(name)
            continue
        results.append(res)
        print("\n".join(report(res)), flush=True)
        if args_ns.json:  # each model's rows kept as soon as it is done
            from schedlang.language.files import write_file

            write_file(args_ns.json, json.dumps(results, indent=1, default=str))
    load = os.getloadavg()
    print(f"\nload average at end {load[0]:.2f}" + ("" if DEVICE.type == "cuda" else
                                                   "; CUDA rows: not measured (CPU run)"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
