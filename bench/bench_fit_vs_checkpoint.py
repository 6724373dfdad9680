"""schedlang.pytorch.fit against what users do today: no checkpointing, per-block
torch.utils.checkpoint, checkpoint_sequential; at equal or lower measured peak.

    python bench/bench_fit_vs_checkpoint.py [--models gpt unet gpt2 gpt2-hf]
        [--budgets 90 75 60 50 40] [--steps 31] [--warmup 2] [--threads 1] [--repeats 3]
        [--retime] [--json OUT]

Models: the GPT-like transformer with dropout and the U-Net-like CNN with skip connections of
`schedlang/testing/torch_models.py` (at bench sizes), and `transformers`' GPT2LMHeadModel from a small
config (random weights), twice: `gpt2-hf` is the model itself, fitted as a user would (the
hook front end: its blocks wrapped in place, its own forward kept), with transformers' own
`gradient_checkpointing_enable()` as the per-block baseline; `gpt2` fits the same modules
called from a small wrapper (`schedlang.testing.hf_models.GPT2Logits`), which the fx front end traces
into finer layers (embedding, blocks, final norm and head apart).

Methods, each measured on the same model (parameters shared; on `gpt2-hf` the baselines run on
a copy of it, same weights: fit wraps the model's own blocks in place):

* `none`: the model as it is;
* `ckpt-block`: every block under `torch.utils.checkpoint` (non-reentrant, RNG preserved):
  what `gradient_checkpointing_enable()` does in transformers (GPT blocks; the U-Net's
  double convolutions; on `gpt2-hf`, that call itself);
* `ckpt-seq(s)`: `checkpoint_sequential` over the stack of blocks in s segments (s = 2, 3 and
  round(sqrt(blocks))); not for the U-Net (its skip connections are not a sequence). On
  `gpt2-hf` it runs on the copy's modules called from `GPT2Logits` (checkpoint_sequential
  needs a sequence of modules; the model's own forward calls its blocks one by one), whose
  glue is leaner than the model's own forward: `none, wrapper` is that wrapper's plain step. On the
  fx front end its notes price the baseline's own schedule as a plan on fit's graph
  (`sequential_schedule`): the predicted peak against the measured one, and the predicted
  time over plain execution (the profile's), beside the step time measured;
* `fit P%`: `fit(model, inputs, "P%", loss_fn=...)` at each `--budgets` percent of plain
  execution's predicted peak;
* `fit runtime, keep all`: the no-recomputation plan run by fit's runtime (what the plan
  executor itself costs next to `none`);
* `fit @B`: fit with the budget set to baseline B's measured peak (bytes): the comparison the
  target is about — at every peak where a baseline fits, fit's step time <= the baseline's.

Peak: one training step (forward, loss, backward; the output held through the backward, as
`out = model(x); loss_fn(out).backward()` holds it: the loop fit's budget covers, run alike
by every method) under `MemoryTracker` (CPU: live tensor storages; CUDA:
max_memory_allocated), the parameters and inputs resident, gradients set to None before.
Time: median of `--steps` steps after `--warmup` per method, without the tracker,
the methods interleaved round by round (load on a shared machine hits every method alike),
`torch.set_num_threads(--threads)`: wall time (`step ms`, `time/none`) and the thread's CPU
time (`cpu/none`; with one thread on CPU every kernel runs on it, and other processes on a
loaded machine do not count). The profile `fit` solves on is taken once per model
(`--repeats` runs per layer, medians; on CPU with one thread the profiler times layers by the
thread's CPU time too, `schedlang.pytorch.profile.host_clock`).

`--retime` (an option of this bench, not of `fit`; fx front end only): after each fit, run
the plan a few steps with a timing observer on the runtime (`PlanExecutor.observer`), take
the median time of
every executed compute op, and when one differs from the profile by more than 25%, replace
the profiled times (executed options by their measurement; the layer's other options scaled
by the same ratio) and solve again (at most twice). The re-solved plan is the one measured.

Figures taken on a loaded machine are noisy: quote the load average printed with them, and
re-run on an idle machine before reading much into ratios near 1.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from bench_pytorch import peak_of, step, time_of  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.checkpoint import checkpoint, checkpoint_sequential  # noqa: E402

from schedlang.pytorch.fit import (  # noqa: E402
    FitError,
    fit,
    prepare,  # noqa: E402
)
from schedlang.testing.hf_models import GPT2Logits  # noqa: E402
from schedlang.testing.torch_models import make_gpt, make_unet  # noqa: E402


# --- models ---------------------------------------------------------------------------------------
def _gpt_embed(model, idx):
    pos = torch.arange(idx.size(1), device=idx.device)
    return model.drop(model.tok_emb(idx) + model.pos_emb(pos))


def bench_gpt():
    model, inputs, loss_fn = make_gpt(batch=8, context=128, vocab=512, dim=128, heads=4,
                                      layers=6, dropout=0.1)
    return model, inputs, loss_fn, lambda idx: _gpt_embed(model, idx)


def bench_unet():
    model, inputs, loss_fn = make_unet(batch=4, size=64, base=16)
    return model, inputs, loss_fn, None


def _gpt2_lm():
    """A small `GPT2LMHeadModel` (random weights, dropout on), its batch and its LM loss."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=6, n_embd=128, n_head=4, vocab_size=512,
                                  n_positions=128, bos_token_id=0, eos_token_id=0)
    lm = transformers.GPT2LMHeadModel(cfg)
    lm.train()
    idx = torch.randint(0, 512, (8, 128))

    def loss_fn(logits):
        return F.cross_entropy(logits[:, :-1].reshape(-1, 512), idx[:, 1:].reshape(-1))

    return lm, idx, loss_fn


def bench_gpt2():
    lm, idx, loss_fn = _gpt2_lm()
    model = GPT2Logits(lm)
    return model, (idx,), loss_fn, model.embed


def bench_gpt2_hf():
    """`GPT2LMHeadModel` itself (same config, weights and batch as `gpt2`), fitted through the
    hook front end as a user would; its baselines run on a copy of it (fit wraps the blocks
    in place: a baseline on the same modules would run the last fit's plan): `none`,
    transformers' own `gradient_checkpointing_enable()` per block, and checkpoint_sequential
    over its blocks."""
    lm, idx, loss_fn = _gpt2_lm()
    twin = copy.deepcopy(lm)
    stack = GPT2Logits(twin)  # the copy's modules, for checkpoint_sequential

    def lm_loss(out):
        return loss_fn(out.logits if hasattr(out, "logits") else out)

    return lm, (idx,), lm_loss, (twin, stack, stack.embed)


MODELS = {"gpt": bench_gpt, "unet": bench_unet, "gpt2": bench_gpt2, "gpt2-hf": bench_gpt2_hf}


# --- baselines --------------------------------------------------------------------------------------
class Checkpointed(nn.Module):
    """`inner` under torch.utils.checkpoint (non-reentrant; RNG state preserved)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, *args):
        return checkpoint(self.inner, *args, use_reentrant=False)


def _blocks(model) -> list[tuple[object, str]]:
    """(parent, attribute) of each block: the stack's entries, or the U-Net's double convs."""
    if hasattr(model, "blocks"):
        return [(model.blocks, str(i)) for i in range(len(model.blocks))]
    return [(model, n) for n in ("enc1", "enc2", "bottleneck", "dec2", "dec1")]


class PerBlock(nn.Module):
    """`model` with each block checkpointed, for the duration of a call (the model's own
    modules, parameters shared; the blocks are put back after the call)."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.sites = _blocks(model)

    def forward(self, *args):
        saved = []
        for parent, name in self.sites:
            inner = getattr(parent, name) if not isinstance(parent, nn.ModuleList) \
                else parent[int(name)]
            saved.append(inner)
            wrapped = Checkpointed(inner)
            if isinstance(parent, nn.ModuleList):
                parent[int(name)] = wrapped
            else:
                setattr(parent, name, wrapped)
        try:
            return self.model(*args)
        finally:
            for (parent, name), inner in zip(self.sites, saved):
                if isinstance(parent, nn.ModuleList):
                    parent[int(name)] = inner
                else:
                    setattr(parent, name, inner)


class HFCheckpointing(nn.Module):
    """A `transformers` model with its own gradient checkpointing on (non-reentrant) for the
    duration of a call: what `gradient_checkpointing_enable()` does to a user's model. The
    backward's recomputation needs no flag: the checkpoint keeps the block's forward."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, *args):
        m = self.model  # transformers 5 renamed gradient_checkpointing_* activation_...
        enable = getattr(m, "activation_checkpointing_enable", m.gradient_checkpointing_enable)
        disable = getattr(m, "activation_checkpointing_disable", m.gradient_checkpointing_disable)
        enable({"use_reentrant": False})
        try:
            return m(*args)
        finally:
            disable()


class Sequential(nn.Module):
    """The GPT stack run by checkpoint_sequential in `segments` segments."""

    def __init__(self, model, embed, segments: int):
        super().__init__()
        self.model = model
        self.embed = embed
        self.stack = nn.Sequential(*model.blocks)
        self.segments = segments

    def forward(self, idx):
        h = checkpoint_sequential(self.stack, self.segments, self.embed(idx),
                                  use_reentrant=False)
        return self.model.head(self.model.ln_f(h))


# --- a baseline's schedule in fit's plan space ------------------------------------------------------
def sequential_schedule(graph, blocks: list[str], segments: int):
    """checkpoint_sequential(`segments`) over the layers `blocks` of fit's layered graph as a
    plan (`planners.baselines.plan_checkpoint_groups`): the layers before and after the stack,
    and the last segment, run plainly; every other segment is a checkpointed group. None when
    the graph has not these layers."""
    from schedlang.plans.planners.baselines import plan_checkpoint_groups

    names = {lay.name for lay in graph.layers}
    if not all(b in names for b in blocks):
        return None
    size = len(blocks) // segments
    groups = [blocks[i * size:(i + 1) * size] for i in range(segments - 1)]
    return plan_checkpoint_groups(graph, groups, name=f"checkpoint_sequential({segments})")


def priced(prep, plan) -> tuple[int, float]:
    """(predicted peak in bytes, predicted time / plain - 1) of `plan` on fit's graph, as fit
    predicts its own plans (the loss function's memory at the loss, the resident bytes but
    fit's plan executor's own constants: a baseline runs without it)."""
    from schedlang.plans.simulate import simulate
    from schedlang.pytorch.outputs import loss_moment

    sim = simulate(plan, prep.graph)
    if not sim.valid:
        raise ValueError(sim.errors[0])
    peak = max(sim.peak_bytes, loss_moment(plan, prep.graph) + prep.loss_overhead)
    return peak + prep.resident_bytes - prep.executor_bytes, sim.time / prep.plain_time - 1


# --- re-timing -------------------------------------------------------------------------------------
class OpTimer:
    """A runtime observer (`PlanExecutor.observer`): seconds per executed compute op."""

    def __init__(self):
        self.times: dict[tuple[str, str], list[float]] = {}

    def op(self, executor, op):
        import contextlib

        @contextlib.contextmanager
        def timed():
            t0 = time.perf_counter()
            yield
            if op.op == "compute" and op.node != "loss":
                self.times.setdefault((op.node, op.option), []).append(time.perf_counter() - t0)

        return timed()


def measured_op_times(fm, model, inputs, loss_fn, steps: int) -> dict:
    timer = OpTimer()
    ex = fm.plan_executor
    ex.observer = timer
    try:
        for _ in range(steps):
            step(lambda: fm(*inputs), model, loss_fn)
    finally:
        ex.observer = None
    return {k: statistics.median(v) for k, v in timer.times.items()}


def retimed(prep, measured: dict, tolerance: float = 0.25):
    """(prep with the graph's times replaced by the measured ones, disagreement): per layer and
    side, executed options take their measurement, the others the profile scaled by the
    executed ones' ratio (the whole graph's ratio where no option of that side ran)."""
    graph = prep.graph
    prof = {}
    for lay in graph.layers:
        for o in lay.options:
            prof[(f"{lay.name}.fwd", o.name)] = o.fwd_time
            prof[(f"{lay.name}.bwd", o.name)] = o.bwd_time
    pairs = [(measured[k], prof[k]) for k in measured if k in prof and prof[k] > 0]
    worst = max((abs(m / p - 1) for m, p in pairs), default=0.0)
    total = sum(m for m, _ in pairs) / max(sum(p for _, p in pairs), 1e-12)
    g = copy.copy(graph)
    g.layers = []
    for lay in graph.layers:
        ratio = {}
        for side in ("fwd", "bwd"):
            got = [(measured[(f"{lay.name}.{side}", o.name)], prof[(f"{lay.name}.{side}", o.name)])
                   for o in lay.options if (f"{lay.name}.{side}", o.name) in measured]
            ratio[side] = (sum(m for m, _ in got) / max(sum(p for _, p in got), 1e-12)) \
                if got else total
        opts = []
        for o in lay.options:
            fwd = measured.get((f"{lay.name}.fwd", o.name), o.fwd_time * ratio["fwd"])
            bwd = measured.get((f"{lay.name}.bwd", o.name), o.bwd_time * ratio["bwd"])
            opts.append(dataclasses.replace(o, fwd_time=fwd, bwd_time=bwd))
        lay = copy.copy(lay)
        lay.options = opts
        g.layers.append(lay)
    return dataclasses.replace(prep, graph=g), worst > tolerance, worst


def fit_retimed(model, inputs, loss_fn, budget, prep, args):
    fm = fit(model, inputs, budget, loss_fn=loss_fn, prepared=prep, measure=False,
             time_limit=args.time_limit, calibrate=False)
    if fm.plan_executor is None and fm.plan is not None:  # the hook front end: no op observer
        return fm, "not re-timed (hook front end: its blocks run as the model calls them)"
    notes = []
    for _ in range(2):
        if fm.plan is None:
            break
        measured = measured_op_times(fm, model, inputs, loss_fn, 3)
        new_prep, disagree, worst = retimed(fm._prep, measured)
        notes.append(f"{100 * worst:.0f}%")
        if not disagree:
            break
        fm = fit(model, inputs, budget, loss_fn=loss_fn, prepared=new_prep, measure=False,
                 time_limit=args.time_limit, calibrate=False)
    return fm, "retimed (worst op off by " + ", ".join(notes) + ")"


# --- the bench ----------------------------------------------------------------------------------------
def run_model(name, args, device):
    model, inputs, loss_fn, embed = MODELS[name]()
    model = model.to(device)
    inputs = tuple(x.to(device) for x in inputs)
    t0 = time.perf_counter()
    prep = prepare(model, inputs, loss_fn=loss_fn, repeats=args.repeats)
    prof_s = time.perf_counter() - t0
    if isinstance(embed, tuple):  # a transformers model; baselines on a copy (bench_gpt2_hf)
        base, stack, embed = embed
        # the stack's own wrapper, plain: checkpoint_sequential runs on it (a model's own
        # forward cannot take it), and its glue is leaner than the model's
        methods: dict[str, nn.Module] = {"none": base, "ckpt-block": HFCheckpointing(base),
                                         "none, wrapper": stack}
    else:
        base = stack = model
        methods = {"none": model, "ckpt-block": PerBlock(model)}
    schedules = {}
    if embed is not None:
        n = len(stack.blocks)
        for s in sorted({2, max(2, round(math.sqrt(n))), 3}):
            methods[f"ckpt-seq({s})"] = Sequential(stack, embed, s)
            schedules[f"ckpt-seq({s})"] = sequential_schedule(
                prep.graph, [f"blocks.{i}" for i in range(n)], s)
    baselines = list(methods)
    owner = {k: base for k in baselines}
    peaks = {k: peak_of(lambda m=m: m(*inputs), owner[k], inputs, loss_fn)
             for k, m in methods.items()}
    notes = {}
    for k, plan in schedules.items():  # the baseline's own schedule, priced by fit's model
        if plan is not None:
            peak, over = priced(prep, plan)
            notes[k] = (f"its schedule on fit's graph: predicted {peak / 2**20:.2f} MiB "
                        f"({peak - peaks[k]:+d} B against measured) {100 * over:+.1f}%")

    def one_fit(budget):
        if args.retime:
            return fit_retimed(model, inputs, loss_fn, budget, prep, args)
        return fit(model, inputs, budget, loss_fn=loss_fn, prepared=prep, measure=False,
                   time_limit=args.time_limit, calibrate=False), ""

    def add_fit(label, budget):
        t0 = time.perf_counter()
        try:
            fm, note = one_fit(budget)
            peak = peak_of(lambda: fm(*inputs), model, inputs, loss_fn)
            want = fm.memory_report().budget_bytes
            if want is not None and peak > want:  # calibration by hand: once, the excess off
                note = (note + ", " if note else "") + \
                    f"re-fit {(peak - want) / 2**10:.1f} KiB lower after a step over"
                fm, _ = one_fit(want - (peak - want))
                peak = peak_of(lambda: fm(*inputs), model, inputs, loss_fn)
        except FitError as exc:
            notes[label] = "infeasible: " + str(exc).split("found is ")[-1].split(" (")[0]
            return
        methods[label] = fm
        peaks[label] = peak
        rep = fm.memory_report()
        notes[label] = (f"solve {time.perf_counter() - t0:.1f}s, predicted "
                        f"{rep.predicted_peak_bytes / 2**20:.2f} MiB "
                        f"{100 * rep.plan_time_overhead:+.1f}%" + (f", {note}" if note else "")
                        + (" (plain)" if fm.plain else ""))

    # the runtime's own cost: the plan that keeps everything, run by the plan executor
    from schedlang.plans.planners.no_recompute import no_recompute_plan

    keep = fit(model, inputs, None, loss_fn=loss_fn, prepared=prep, measure=False,
               plan=no_recompute_plan(prep.graph), calibrate=False)
    methods["fit runtime, keep all"] = keep
    peaks["fit runtime, keep all"] = peak_of(lambda: keep(*inputs), model, inputs, loss_fn)
    notes["fit runtime, keep all"] = "the no-recomputation plan through the runtime"
    for pct in args.budgets:
        add_fit(f"fit {pct:g}%", f"{pct}%")
    for b in baselines:
        if not b.startswith("none"):  # the plain steps
            add_fit(f"fit @{b}", peaks[b])
    for k, m in methods.items():
        for _ in range(args.warmup):
            step(lambda m=m: m(*inputs), owner.get(k, model), loss_fn)
    times = {k: [] for k in methods}
    cpu = {k: [] for k in methods}
    for _ in range(args.steps):
        for k, m in methods.items():
            c0 = time.thread_time()
            times[k].append(time_of(lambda m=m: m(*inputs), owner.get(k, model), loss_fn,
                                    device))
            cpu[k].append(time.thread_time() - c0)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"model": name, "plain_pred": prep.plain_peak, "resident": prep.resident_bytes,
            "profile_s": prof_s, "peaks": peaks, "median_s": med,
            "cpu_s": {k: statistics.median(v) for k, v in cpu.items()}, "notes": notes,
            "baselines": baselines, "layers": len(prep.graph.layers)}


def report(res) -> list[str]:
    lines = []
    base_t, base_p = res["median_s"]["none"], res["peaks"]["none"]
    lines.append(f"\n{res['model']}: {res['layers']} layers, plain peak "
                 f"{base_p / 2**20:.2f} MiB measured ({res['plain_pred'] / 2**20:.2f} "
                 f"predicted, resident {res['resident'] / 2**20:.2f}), profile "
                 f"{res['profile_s']:.1f} s")
    cpu_t = res["cpu_s"]["none"]
    lines.append(f"{'method':<22} {'peak MiB':>9} {'peak/none':>9} {'step ms':>8} "
                 f"{'time/none':>9} {'cpu/none':>8}  notes")
    order = list(res["baselines"]) + sorted(
        (k for k in set(res["peaks"]) | set(res["notes"]) if k not in res["baselines"]),
        key=lambda k: (not k.startswith("fit r"), not k.startswith("fit @"),
                       -res["peaks"].get(k, 0)))
    for k in order:
        if k not in res["peaks"]:
            lines.append(f"{k:<22} {'-':>9} {'-':>9} {'-':>8} {'-':>9}  {res['notes'][k]}")
            continue
        p, t = res["peaks"][k], res["median_s"][k]
        lines.append(f"{k:<22} {p / 2**20:9.2f} {p / base_p:9.2f} {1000 * t:8.1f} "
                     f"{t / base_t:9.2f} {res['cpu_s'][k] / cpu_t:8.2f}  "
                     f"{res['notes'].get(k, '')}")
    lines.append("target: fit at a baseline's measured peak is no slower than the baseline")
    for b in res["baselines"]:
        if b.startswith("none"):
            continue
        f = f"fit @{b}"
        if f not in res["peaks"]:
            lines.append(f"  {b:<14} fit: {res['notes'].get(f, 'not run')}")
            continue
        pf, pb = res["peaks"][f], res["peaks"][b]
        tf, tb = res["median_s"][f], res["median_s"][b]
        cf, cb = res["cpu_s"][f], res["cpu_s"][b]
        ok = pf <= pb and tf <= tb
        lines.append(f"  {b:<14} peak {pf / 2**20:.2f} vs {pb / 2**20:.2f} MiB, step "
                     f"{1000 * tf:.1f} vs {1000 * tb:.1f} ms (fit/baseline {tf / tb:.2f}; CPU "
                     f"time {cf / cb:.2f}): "
                     + ("met" if ok else "NOT met" + ("" if pf <= pb else " (peak over)")))
        if b.startswith("ckpt-seq") and "none, wrapper" in res["median_s"]:
            # the baseline ran the wrapper's glue, fit the model's own: scaled to the same glue
            glue = res["median_s"]["none"] / res["median_s"]["none, wrapper"]
            lines.append(f"  {'':<14} with the baseline's step scaled by the model's own plain "
                         f"step over the wrapper's ({glue:.3f}): fit/baseline "
                         f"{tf / (tb * glue):.2f}")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--budgets", nargs="+", type=float, default=[90, 75, 60, 50, 40],
                    help="percent of plain execution's predicted peak")
    ap.add_argument("--steps", type=int, default=31, help="timed steps per method (median; "
                    "ratios near 1 need this many)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per method first")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    ap.add_argument("--repeats", type=int, default=3, help="profiling runs per layer")
    ap.add_argument("--time-limit", type=float, default=60.0, help="solver seconds per solve")
    ap.add_argument("--retime", action="store_true", help="re-time each plan's ops as executed "
                    "and re-solve where they disagree with the profile")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    load0 = os.getloadavg()
    print(f"device {device}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"median of {args.steps} steps after {args.warmup} warm-up, methods interleaved; "
          f"load average at start {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}"
          + ("; --retime" if args.retime else ""))
    results = []
    for name in args.models:
        try:
            res = run_model(name, args, device)
        except ImportError as exc:
            print(f"\n{name}: skipped ({exc})")
            continue
        results.append(res)
        print("\n".join(report(res)), flush=True)
    load1 = os.getloadavg()
    print(f"\nload average at end {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}: ratios taken "
          "under load need an idle re-run")
    if args.json:
        from schedlang.language.files import write_file

        write_file(args.json, json.dumps({"load": [load0, load1], "results": results},
                                         indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
