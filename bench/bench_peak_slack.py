"""Where `gradient_checkpointing_enable()`'s peak is, how much memory is free at every other
moment of its step, and what the plans that would take its recomputation's time cost there
(issue 28, "at hf-gc's own peak").

    python bench/bench_peak_slack.py [--models bert llama gpt2 bart] [--steps 21]

Models and sizes: `bench_baselines.py`'s (`SIZES`, the hook front end). Per model:

1. hf-gc's step (transformers' own checkpointing, non-reentrant) under `MemoryTracker` with a
   mark at each block's forward start and end, the model's return, the loss, the gradient's
   arrival at each block's output and input (its backward) and at the head's output: the most
   bytes alive in each phase, and the slack (hf-gc's peak minus that).
2. Plans pinned as data (`plan_checkpoint_groups`; the head, `HEADS`, a block of its own so
   that it can be recomputed): every block recomputed (hf-gc's schedule), the last block kept
   (its activations alive from its forward to its backward: through the head, the loss and the
   head's backward), the same with the head recomputed, the last two blocks kept, and every
   block run with the option ``rerun`` (`recompute.rerun_call`). Each: its measured peak
   against hf-gc's, its predicted overhead, the phase of its peak, its step time against
   hf-gc's (median of `--steps`, one thread, the thread's CPU time, methods interleaved).

The last block's recomputation's share of hf-gc's step (every block recomputed against the
last one kept, both measured) is the most any plan that keeps one more block could save there.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import bench_baselines as bb
import torch

from schedlang.plans.planners.baselines import plan_checkpoint_groups
from schedlang.pytorch.fit import FitError, fit, prepare
from schedlang.pytorch.frontends.blocks.find import find_blocks
from schedlang.pytorch.frontends.blocks.rerun import RERUN
from schedlang.pytorch.memory import MemoryTracker
from schedlang.testing import hf_models

#: the head of each model (after the last block): planned as a block of its own here
HEADS = {"bert": "cls", "llama": "lm_head", "gpt2": "lm_head", "bart": "lm_head"}


def traced_step(fn, model, inputs, loss_fn, held: int, watch) -> list[tuple[str, int]]:
    """[(phase, most bytes alive in it)] of one step; `watch`: [(label, module)]."""
    rows: list[tuple[str, int]] = []
    state = {"phase": "start", "backward": False}
    tracker = MemoryTracker(resident=[model, *inputs], existing=False)

    def mark(phase):
        window, _ = tracker.mark()
        rows.append((state["phase"], window + held))
        state["phase"] = phase

    def on_grad(phase):
        return lambda g: mark(phase)

    handles = []
    for label, module in watch:
        def pre(mod, a, kw, label=label):
            mark(("rerun " if state["backward"] else "forward ") + label)

        def post(mod, a, kw, out, label=label):
            mark(("after rerun " if state["backward"] else "after forward ") + label)
            if state["backward"] or not torch.is_grad_enabled():
                return
            o = out[0] if isinstance(out, tuple) else out
            o = getattr(o, "logits", o)
            # a module's backward: from the gradient's arrival at its output to its arrival
            # at the next module's output (this one's input); the first one's input closes it
            if isinstance(o, torch.Tensor) and o.requires_grad:
                o.register_hook(on_grad("backward " + label))
            x = a[0] if a else kw.get("hidden_states")
            if label == watch[0][0] and isinstance(x, torch.Tensor) and x.requires_grad:
                x.register_hook(on_grad("backward of what runs before " + label))
        handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(module.register_forward_hook(post, with_kwargs=True))
    model.zero_grad(set_to_none=True)
    try:
        with tracker:
            out = fn()
            mark("loss")
            loss = loss_fn(out)
            mark("loss backward")
            state["backward"] = True
            loss.backward()
            mark("end")
            del out, loss
    finally:
        for h in handles:
            h.remove()
    return rows


def run_model(name: str, steps: int) -> list[str]:
    model, args, kwargs, loss_fn = hf_models.HF[name](**bb.SIZES[name])
    inputs = bb.tensors_of(args, kwargs)
    held = bb.loss_bytes_of(model, args, kwargs, loss_fn)
    found = find_blocks(model, args, kwargs)
    stack = [n for stack in bb.stacks_of(found) for n in stack]
    found.release_samples()
    head = HEADS[name]
    modules = dict(model.named_modules())
    watch = [(n.rsplit(".", 1)[-1] if n.rsplit(".", 1)[-1].isdigit() and
              ".decoder." not in n else n.split(".")[-3][:3] + n.rsplit(".", 1)[-1], modules[n])
             for n in stack] + [("head", modules[head])]

    def call(m):
        return lambda: m(*args, **kwargs)

    hf = bb.HFCheckpointing(model)
    rows = traced_step(call(hf), model, inputs, loss_fn, held, watch)
    peak = max(w for _, w in rows)
    lines = [f"\n{name} {bb.SIZES[name]}: hf-gc's step, bytes alive per phase (slack = its peak "
             f"{peak:,} B minus the phase's most)"]
    lines += [f"  {phase:<28} {w:>12,}  slack {peak - w:>11,}" for phase, w in rows]
    prep = prepare(model, args, loss_fn=loss_fn, sample_kwargs=kwargs, frontend="blocks",
                   repeats=3, layers=[b.name for b in found.blocks] + [head])
    g = prep.graph
    plans = {
        "every block recomputed": dict.fromkeys(stack, "recompute"),
        "last block kept": dict.fromkeys(stack[:-1], "recompute"),
        "last kept, head recomputed": dict.fromkeys([*stack[:-1], head], "recompute"),
        "last two kept": dict.fromkeys(stack[:-2], "recompute"),
        "every block rerun": {b: RERUN if any(o.name == RERUN for o in lay.options)
                              else "recompute" for lay in g.layers for b in [lay.name]
                              if b in stack},
    }
    fitted, peaks, notes = {}, {}, {}
    for label, choice in plans.items():
        try:
            fm = fit(model, args, prep.plain_peak, loss_fn=loss_fn, sample_kwargs=kwargs,
                     prepared=prep, measure=False, calibrate=False,
                     plan=plan_checkpoint_groups(g, [], choice))
        except FitError as exc:
            notes[label] = str(exc)[:100]
            continue
        traced = traced_step(call(fm), model, inputs, loss_fn, held, watch)
        peaks[label] = max(w for _, w in traced)
        at = max(traced, key=lambda r: r[1])[0]
        rep = fm.memory_report()
        notes[label] = (f"predicted {rep.predicted_peak_bytes:,} B, "
                        f"{100 * rep.plan_time_overhead:+.1f}%; peak in '{at}'")
        fitted[label] = fm
    # hf-gc timed on a copy of its own (the same weights): `fit` wraps the model's blocks in
    # place, and transformers' checkpointing around a wrapped block would checkpoint twice
    copy, *_ = hf_models.HF[name](**bb.SIZES[name])
    methods = {"hf-gc": (bb.HFCheckpointing(copy), copy),
               **{k: (m, model) for k, m in fitted.items()}}

    class Steps:
        warmup = 2

    Steps.steps = steps
    times = bb.timed(methods, call, loss_fn, Steps)
    lines.append(f"  {'plan':<28} {'peak B':>12} {'vs hf-gc':>10} {'step ms':>8} {'/hf-gc':>7}")
    lines.append(f"  {'hf-gc':<28} {peak:>12,} {0:>+10,} {1000 * times['hf-gc']:8.1f} {1:7.3f}")
    for label in plans:
        if label not in fitted:
            lines.append(f"  {label:<28} {notes[label]}")
            continue
        t = times[label]
        lines.append(f"  {label:<28} {peaks[label]:>12,} {peaks[label] - peak:>+10,} "
                     f"{1000 * t:8.1f} {t / times['hf-gc']:7.3f}  {notes[label]}")
    every, kept = times.get("every block recomputed"), times.get("last block kept")
    if every and kept:
        share = 100 * (every - kept) / times["hf-gc"]
        lines.append(f"  the last block's recomputation: {share:.1f}% of hf-gc's step (every "
                     "block recomputed minus the last one kept)")
    for m in fitted.values():
        m.unwrap()
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(HEADS), choices=list(HEADS))
    ap.add_argument("--steps", type=int, default=21)
    ns = ap.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread; load average {os.getloadavg()[0]:.2f}")
    for name in ns.models:
        print("\n".join(run_model(name, ns.steps)), flush=True)
    print(f"\nload average at end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
